//! The command line: one file per command, typed exit codes.
//!
//! `run` works in this process through a supervisor of its own (the budget, the ledger and
//! admission apply as in the daemon); `serve` is the daemon; `ask`, `status`, `cancel`, `load`,
//! `unload` and `soak` talk to it over its socket; `plan` loads nothing.

mod args;
mod ask;
mod client;
mod plan;
mod print;
mod request;
mod run;
mod serve;

use clap::{Parser, Subcommand};

pub use args::*;
use print::Printer;

/// How `kazeia` exits: scripts tell a refusal from a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    /// The work failed (a model, the engine, the daemon said no).
    Failed = 1,
    /// The command was wrong: arguments, config, pipeline, input.
    Usage = 2,
    /// `plan`: the models do not fit the budget.
    DoesNotFit = 3,
}

#[derive(Debug, Parser)]
#[command(name = "kazeia", version, about = "Kazeia Engine: a local guarded LLM + speech cascade")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a pipeline once, in this process, and stream its output.
    Run(RunArgs),
    /// Start the supervisor daemon on a Unix socket.
    Serve(ServeArgs),
    /// Ask the running daemon: one turn, streamed.
    Ask(AskArgs),
    /// Show the daemon's models, where they run, and its load.
    Status(ClientArgs),
    /// Cancel a running request by its id (as printed by `ask`).
    Cancel {
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Load a model role in the daemon.
    Load {
        role: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Unload a model role from the daemon.
    Unload {
        role: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Hold the running daemon under mixed traffic and faults; judge its memory, FDs, threads.
    Soak(crate::soak::SoakArgs),
    /// What the configured models will cost and where they will run; loads nothing.
    Plan {
        #[command(flatten)]
        common: CommonArgs,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// Entry point of the binary; returns the process exit code.
pub async fn main(cli: Cli) -> i32 {
    let exit = match cli.command {
        Command::Run(args) => run::run(args).await,
        Command::Serve(args) => serve::serve(args).await,
        Command::Ask(args) => ask::ask(args).await,
        Command::Status(c) => request::simple(c, |id| kazeia_ipc::Request::Status { id }).await,
        Command::Cancel { id, client } => request::cancel(client, id).await,
        Command::Load { role, client } => request::simple(client, |id| kazeia_ipc::Request::Load { id, role }).await,
        Command::Unload { role, client } => {
            request::simple(client, |id| kazeia_ipc::Request::Unload { id, role }).await
        }
        Command::Plan { common, json } => plan::plan(&common, json),
        Command::Soak(args) => request::soak(args).await,
    };
    exit as i32
}
