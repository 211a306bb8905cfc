//! The command line's arguments (clap derive), shared by the commands.

use std::path::PathBuf;

use clap::Args;
use kazeia_ipc::TurnOptions;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Socket path (default: [daemon] socket in the config, else $XDG_RUNTIME_DIR/kazeia/engine.sock).
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ClientArgs {
    /// The daemon's socket.
    #[arg(long, env = "KAZEIA_SOCKET")]
    pub socket: Option<PathBuf>,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AskArgs {
    /// The user's text.
    pub text: String,
    #[arg(long, default_value = "chat")]
    pub pipeline: String,
    /// Continue this conversation (the daemon keeps its earlier turns).
    #[arg(long)]
    pub session: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// Per-turn overrides of a role's configured sampling.
#[derive(Debug, Args)]
pub struct SamplingArgs {
    /// Sampling temperature (0 = greedy).
    #[arg(long)]
    pub temperature: Option<f32>,
    #[arg(long)]
    pub seed: Option<u32>,
    #[arg(long)]
    pub max_tokens: Option<u32>,
}

impl SamplingArgs {
    pub fn turn_options(&self) -> TurnOptions {
        TurnOptions { temperature: self.temperature, seed: self.seed, max_tokens: self.max_tokens }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Pipeline name (`chat`, …) or a built-in/--pipelines file.
    pub pipeline: String,
    /// The user's text for this turn.
    #[arg(long, required_unless_present = "audio")]
    pub text: Option<String>,
    /// A WAV file (any rate and channels) for the speech pipelines (`transcribe`).
    #[arg(long)]
    pub audio: Option<PathBuf>,
    /// Spoken language (`fr`, `en`, …); default `[speech] language` (`auto` detects).
    #[arg(long)]
    pub language: Option<String>,
    /// Where `speak` and `voice` write the spoken reply (WAV).
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
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
