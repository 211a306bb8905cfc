//! The command line's arguments (clap derive), shared by the commands. Every flag has a help
//! text: `kazeia <command> --help` is the reference the README's usage section follows.

use std::path::PathBuf;

use clap::Args;
use kazeia_ipc::TurnOptions;

/// Said once for every `--socket`: where the daemon listens when nothing says otherwise.
const SOCKET_HELP: &str = "The daemon's socket [default: $XDG_RUNTIME_DIR/kazeia/engine.sock, \
     or ~/.cache/kazeia/run/engine.sock when XDG_RUNTIME_DIR is unset]";

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Socket path (overrides `[daemon] socket`) [default: $XDG_RUNTIME_DIR/kazeia/engine.sock, or
    /// ~/.cache/kazeia/run/engine.sock when XDG_RUNTIME_DIR is unset]. A directory the daemon
    /// creates is made 0700; an existing one is used as it is and refused when other users can
    /// enter it (unless `[daemon] shared_socket_dir = true`).
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ClientArgs {
    #[arg(long, env = "KAZEIA_SOCKET", help = SOCKET_HELP)]
    pub socket: Option<PathBuf>,
    /// Print one JSON object per line (the protocol's events) instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AskArgs {
    /// The user's text; `-` reads it from standard input. Text that starts with `-` ("-5 °C,
    /// what should I wear?", a list item) after `--` (`kazeia ask -- "-5 °C?"`) or with --text
    /// (a mistyped option alone must stay an error, not become the question).
    #[arg(conflicts_with_all = ["text_flag", "audio"])]
    pub text: Option<String>,
    /// The user's text (same as the positional TEXT); text that starts with `-` is text.
    #[arg(long = "text", value_name = "TEXT", conflicts_with = "audio", allow_hyphen_values = true)]
    pub text_flag: Option<String>,
    /// Pipeline [default: guarded-chat; with --audio: voice]. `chat` is the unguarded one.
    #[arg(long)]
    pub pipeline: Option<String>,
    /// A WAV file (any rate, mono or stereo) streamed to the daemon for an audio pipeline
    /// (`voice`: transcript, verdicts, reply; `transcribe`: the transcript).
    #[arg(long, value_name = "FILE")]
    pub audio: Option<PathBuf>,
    /// Stream --audio at the pace it was recorded (as a microphone would: the turn ends at a
    /// pause), not as fast as the socket takes it (at most 19 s: the daemon holds 20 s in flight).
    #[arg(long, requires = "audio")]
    pub realtime: bool,
    /// Write the spoken reply here (WAV): `voice`, `speak`.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Continue this conversation (the daemon keeps its earlier turns).
    #[arg(long)]
    pub session: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
}

/// A temperature the daemon takes: 0 to 5.
fn temperature(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(t) if kazeia_engine::params::TEMPERATURES.contains(&t) => Ok(t),
        _ => Err("a number from 0 to 5".into()),
    }
}

/// Per-turn overrides of a role's configured sampling.
#[derive(Debug, Args)]
pub struct SamplingArgs {
    /// Sampling temperature, 0 to 5 (0 = greedy) [default: the role's, models.toml].
    #[arg(long, value_parser = temperature)]
    pub temperature: Option<f32>,
    /// Sampling seed: the same seed, prompt and model give the same answer.
    #[arg(long)]
    pub seed: Option<u32>,
    /// Most tokens the Thinker generates for this turn (at least 1) [default: the role's].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: Option<u32>,
    /// Most tokens a reasoning Thinker may think before the engine closes its think block (0:
    /// none) [default: the pipeline's, else the role's `thinking_budget`, else --max-tokens].
    #[arg(long)]
    pub thinking_budget: Option<u32>,
    /// Print the Thinker's reasoning (stderr; `--json`: `thinking` events), guarded like the reply.
    #[arg(long)]
    pub show_thinking: bool,
}

impl SamplingArgs {
    pub fn turn_options(&self) -> TurnOptions {
        TurnOptions {
            temperature: self.temperature,
            seed: self.seed,
            max_tokens: self.max_tokens,
            thinking_budget: self.thinking_budget,
            show_thinking: self.show_thinking,
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Pipeline name (`guarded-chat`, `chat`, `guard`, `transcribe`, `speak`, `voice`) or a
    /// --pipelines file's name.
    #[arg(default_value = kazeia_ipc::DEFAULT_PIPELINE)]
    pub pipeline: String,
    /// The user's text for this turn; `-` reads it from standard input. Text that starts with
    /// `-` is text, not an option.
    #[arg(long, required_unless_present = "audio", allow_hyphen_values = true)]
    pub text: Option<String>,
    /// A WAV file (any rate and channels) for the speech pipelines (`transcribe`, `voice`).
    #[arg(long, value_name = "FILE")]
    pub audio: Option<PathBuf>,
    /// Spoken language (`fr`, `en`, …) [default: `[speech] language`; `auto` detects].
    #[arg(long)]
    pub language: Option<String>,
    /// Where `speak` and `voice` write the spoken reply (WAV).
    #[arg(long, value_name = "FILE")]
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
    /// Model set (see models.toml; the device set is models.target.toml).
    #[arg(long, env = "KAZEIA_CONFIG", default_value = "models.toml")]
    pub config: PathBuf,
    /// Extra pipeline files (`NAME.toml`), added to and overriding the built-in ones.
    #[arg(long, env = "KAZEIA_PIPELINES")]
    pub pipelines: Option<PathBuf>,
}
