//! The command line: one file per command, typed exit codes.
//!
//! `run` works in this process through a supervisor of its own (the budget, the ledger and
//! admission apply as in the daemon); `serve` is the daemon; `ask`, `status`, `cancel`, `load`,
//! `unload` and `soak` talk to it over its socket; `plan` loads nothing.

mod args;
mod ask;
mod cancel;
mod client;
mod load;
mod plan;
pub(crate) mod print;
mod run;
mod serve;
mod soak;
mod status;
mod unload;

use clap::{Parser, Subcommand};
use kazeia_ipc::ErrorCode;

pub use args::*;
use print::Printer;

/// How `kazeia` exits: scripts tell a refusal from a failure. The same error gives the same
/// code in every command (`run` in-process and `ask` through the daemon alike): see
/// [`Exit::for_code`]. Also 141: stdout closed early (see `print`). The README lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    /// The work failed (a model, the engine, the budget, the daemon said no).
    Failed = 1,
    /// The command was wrong: arguments, config, pipeline, input (clap's own code for bad flags).
    Usage = 2,
    /// `plan`: the models do not fit the budget.
    DoesNotFit = 3,
    /// Ctrl-C (SIGINT) stopped it: 128 + 2, the shell's convention.
    Interrupted = 130,
}

impl Exit {
    /// The exit code for an error the daemon (or `run`'s own supervisor) answered.
    pub fn for_code(code: ErrorCode) -> Exit {
        use ErrorCode::*;
        match code {
            BadConfig | Pipeline | BadRequest | BadJson | UnknownType | BadFrame => Exit::Usage,
            _ => Exit::Failed,
        }
    }
}

/// Arguments clap refused (exit 2): with `--json` among them, the error is also one JSON event
/// line on stdout (`bad_request`), as every other error of a `--json` command is; clap's text
/// still goes to stderr. Help and version are not errors.
pub fn refused_arguments(e: clap::Error) -> ! {
    let json = std::env::args_os().skip(1).take_while(|a| a != "--").any(|a| a == "--json");
    if json && e.use_stderr() {
        let text = e.render().to_string();
        let first = text.lines().next().unwrap_or_default();
        Printer::new(true).error(ErrorCode::BadRequest, first.trim_start_matches("error: ").to_string());
    }
    e.exit()
}

/// A text argument: `-` reads standard input (a trailing newline dropped).
fn read_text(arg: String) -> Result<String, String> {
    if arg != "-" {
        return Ok(arg);
    }
    let mut s = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| format!("reading stdin: {e}"))?;
    Ok(s.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&s).to_string())
}

/// Fail before any work when `path` cannot be written (a turn wasted on an unwritable `--out`).
pub fn check_writable(path: &std::path::Path, what: &str) -> Result<(), String> {
    crate::output::check_writable(path).map_err(|e| format!("cannot write {what} to {}: {e}", path.display()))
}

/// `--out`, the spoken reply's file, before any work: writable, and given only to a pipeline
/// that speaks (`speaks`: None for a pipeline only the daemon knows). One that does not speak
/// left an empty WAV there, an existing file lost.
pub fn check_out(out: Option<&std::path::Path>, pipeline: &str, speaks: Option<bool>) -> Result<(), String> {
    let Some(out) = out else { return Ok(()) };
    if speaks == Some(false) {
        return Err(format!("{pipeline} does not speak: --out would get no audio (speaking pipelines: voice, speak)"));
    }
    check_writable(out, "the spoken reply")
}

/// Set once Ctrl-C was seen: the command then exits 130 after the daemon has ended its turn.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// From now on, Ctrl-C is noted and runs `then` (cancel the turn). The handler is in place
/// when this returns (a signal between the turn's start and a task's first poll would otherwise
/// kill the process with the turn still running in the daemon).
fn on_ctrl_c(then: impl FnOnce() + Send + 'static) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut sigint) = signal(SignalKind::interrupt()) else { return };
    tokio::spawn(async move {
        if sigint.recv().await.is_some() {
            INTERRUPTED.store(true, std::sync::atomic::Ordering::Relaxed);
            then();
        }
        // A second Ctrl-C does not wait for the daemon's answer.
        if sigint.recv().await.is_some() {
            std::process::exit(Exit::Interrupted as i32);
        }
    });
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
        /// The request's id (`ask` prints it as `[request ID]`; `--json`: the `id` field).
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Load a model role in the daemon.
    Load {
        /// A role `status` lists: `thinker`, `guard`, `stt` (Whisper and the VAD), `tts-<lang>`.
        role: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Unload a model role from the daemon.
    Unload {
        /// A role `status` lists (as for `load`).
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
        /// One JSON object (`"type": "plan"`), as the other commands' `--json`.
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
        Command::Status(c) => status::status(c).await,
        Command::Cancel { id, client } => cancel::cancel(client, id).await,
        Command::Load { role, client } => load::load(client, role).await,
        Command::Unload { role, client } => unload::unload(client, role).await,
        Command::Plan { common, json } => plan::plan(&common, json),
        Command::Soak(args) => soak::soak(args).await,
    };
    // The turn was cancelled cleanly (its `done` came), but the person stopped it.
    if interrupted() {
        return Exit::Interrupted as i32;
    }
    exit as i32
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// `kazeia <command> --help` is the reference: no flag or argument goes without a line.
    #[test]
    fn every_flag_has_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "kazeia", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:?}");
        Cli::command().debug_assert();
    }

    /// Every `$K …` line of the README's usage section parses with these arguments: the README
    /// and the help texts name the same flags.
    #[test]
    fn readme_usage_parses() {
        // Read when the test runs: a file outside the package, built in, is tracked at the
        // first clone's path by the shared build cache.
        let dir = std::env::var_os("CARGO_MANIFEST_DIR").expect("run by cargo test");
        let readme = std::fs::read_to_string(std::path::Path::new(&dir).join("../README.md")).unwrap();
        let mut n = 0;
        for line in readme.lines() {
            let line = line.split("  #").next().unwrap_or_default();
            for cmd in line.split(';').map(|c| c.trim().trim_end_matches('&').trim()) {
                let Some(rest) = cmd.strip_prefix("$K ") else { continue };
                let words = shlex::split(rest).unwrap_or_else(|| panic!("cannot split {cmd:?}"));
                let argv = std::iter::once("kazeia".to_string()).chain(words);
                if let Err(e) = Cli::try_parse_from(argv) {
                    panic!("README: {cmd:?} does not parse:\n{e}");
                }
                n += 1;
            }
        }
        assert!(n >= 20, "only {n} commands found in the README");
    }

    #[test]
    fn the_same_error_gives_the_same_exit_code() {
        assert_eq!(Exit::for_code(ErrorCode::Pipeline), Exit::Usage);
        assert_eq!(Exit::for_code(ErrorCode::BadRequest), Exit::Usage);
        assert_eq!(Exit::for_code(ErrorCode::OverBudget), Exit::Failed);
        assert_eq!(Exit::for_code(ErrorCode::ModelFile), Exit::Failed);
    }
}
