//! The command line: `kazeia run <pipeline>` and friends.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use kazeia_ipc::{ErrorCode, Event, StopReason};
use kazeia_pipelines::{run_turn, Engines, GenerateOptions, LlmError, Registry, TurnInput};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::engine::Engine;

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
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Pipeline name (`chat`, …) or a built-in/--pipelines file.
    pub pipeline: String,
    /// The user's text for this turn.
    #[arg(long)]
    pub text: String,
    #[command(flatten)]
    pub common: CommonArgs,
    /// Override the role's sampling temperature (0 = greedy).
    #[arg(long)]
    pub temperature: Option<f32>,
    #[arg(long)]
    pub seed: Option<u32>,
    #[arg(long)]
    pub max_tokens: Option<u32>,
    /// Print one JSON event object per line instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CommonArgs {
    /// Model set.
    #[arg(long, env = "KAZEIA_CONFIG", default_value = "models.toml")]
    pub config: PathBuf,
    /// Extra pipeline files (`NAME.toml`), added to and overriding the built-in ones.
    #[arg(long, env = "KAZEIA_PIPELINES")]
    pub pipelines: Option<PathBuf>,
}

/// Print events: text mode writes the reply to stdout and the rest to stderr; JSON mode writes
/// one object per line to stdout.
struct Printer {
    json: bool,
}

impl Printer {
    fn event(&self, ev: &Event) {
        let mut out = std::io::stdout().lock();
        if self.json {
            let _ = writeln!(out, "{}", serde_json::to_string(ev).expect("events serialize"));
            let _ = out.flush();
            return;
        }
        match ev {
            Event::Token { text, .. } => {
                let _ = write!(out, "{text}");
                let _ = out.flush();
            }
            Event::Done { stop, metrics, .. } => {
                let _ = writeln!(out);
                let note = if *stop == StopReason::Eos { String::new() } else { format!(" (stopped: {stop:?})") };
                eprintln!(
                    "[{} prompt + {} generated tokens, ttft {:.0} ms, prefill {:.1} tok/s, decode {:.1} tok/s]{note}",
                    metrics.prompt_tokens, metrics.generated_tokens, metrics.ttft_ms, metrics.prefill_tok_s, metrics.decode_tok_s
                );
            }
            Event::Error { code, message, .. } => {
                let _ = out.flush();
                eprintln!("error [{code}]: {message}");
            }
        }
    }

    fn error(&self, code: ErrorCode, message: String) {
        self.event(&Event::Error { id: None, code, message });
    }
}

/// Entry point of the binary; returns the process exit code.
pub async fn main(cli: Cli) -> i32 {
    match cli.command {
        Command::Run(args) => run(args).await,
    }
}

async fn run(args: RunArgs) -> i32 {
    let printer = Printer { json: args.json };
    let config = match Config::load(&args.common.config) {
        Ok(c) => c,
        Err(e) => {
            printer.error(ErrorCode::BadConfig, e.to_string());
            return 2;
        }
    };
    let registry = match &args.common.pipelines {
        Some(dir) => Registry::with_dir(dir),
        None => Ok(Registry::builtin()),
    };
    let pipeline = match registry.as_ref().map_err(|e| e.to_string()).and_then(|r| r.get(&args.pipeline).map_err(|e| e.to_string())) {
        Ok(p) => p.clone(),
        Err(e) => {
            printer.error(ErrorCode::Pipeline, e);
            return 2;
        }
    };

    let engine = Engine::new();
    for role in pipeline.roles() {
        if let Err(e) = load_role(&engine, &config, &role, !args.json).await {
            printer.error(e.code, e.message);
            return 1;
        }
    }

    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_signal.cancel();
        }
    });

    let input = TurnInput {
        id: None,
        text: args.text,
        options: GenerateOptions { temperature: args.temperature, seed: args.seed, max_tokens: args.max_tokens, ignore_eos: false },
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let turn_engine = engine.clone();
    let turn = tokio::spawn(async move { run_turn(&pipeline, input, Engines { llm: &turn_engine }, cancel, tx).await });
    let mut code = 0;
    while let Some(ev) = rx.recv().await {
        if matches!(ev, Event::Error { .. }) {
            code = 1;
        }
        printer.event(&ev);
    }
    let _ = turn.await;
    // Unloading joins the engine threads: do it off the async workers.
    let _ = tokio::task::spawn_blocking(move || drop(engine)).await;
    code
}

/// Load one role of the config, with a progress bar on an interactive stderr.
pub async fn load_role(engine: &Engine, config: &Config, role: &str, show_progress: bool) -> Result<(), LlmError> {
    let cfg = config.model(role).map_err(|e| LlmError::new(ErrorCode::NoModel, e.to_string()))?.clone();
    let path = config.model_path(&cfg);
    let bar = if show_progress && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(100);
        bar.set_style(ProgressStyle::with_template("{msg} [{bar:30}] {percent:>3}%").expect("valid template").progress_chars("=> "));
        bar.set_message(format!("loading {role}"));
        bar.enable_steady_tick(Duration::from_millis(200));
        Some(bar)
    } else {
        None
    };
    let progress_bar = bar.clone();
    let progress: Box<dyn FnMut(f32) + Send> = Box::new(move |p| {
        if let Some(b) = &progress_bar {
            b.set_position((p * 100.0) as u64);
        }
    });
    let engine = engine.clone();
    let result = tokio::task::spawn_blocking(move || engine.load(&cfg, path, progress))
        .await
        .map_err(|e| LlmError::new(ErrorCode::Engine, format!("load task failed: {e}")))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    result.map(|_| ()).map_err(LlmError::from)
}
