//! The command line: `kazeia run <pipeline>` and friends.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use kazeia_ipc::{Client, ClientError, ErrorCode, Event, Incoming, Request, StopReason, TurnOptions};
use kazeia_pipelines::{run_turn, Engines, GenerateOptions, LlmError, Registry, TurnInput};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use kazeia_engine::Engine;

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
    fn turn_options(&self) -> TurnOptions {
        TurnOptions { temperature: self.temperature, seed: self.seed, max_tokens: self.max_tokens }
    }

    fn generate_options(&self) -> GenerateOptions {
        GenerateOptions {
            temperature: self.temperature,
            seed: self.seed,
            max_tokens: self.max_tokens,
            ignore_eos: false,
        }
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
                    metrics.prompt_tokens,
                    metrics.generated_tokens,
                    metrics.ttft_ms,
                    metrics.prefill_tok_s,
                    metrics.decode_tok_s
                );
            }
            Event::Error { code, message, .. } => {
                let _ = out.flush();
                eprintln!("error [{code}]: {message}");
            }
            Event::Accepted { id, .. } => eprintln!("[request {id}]"),
            Event::Verdict { stage, label, ms, .. } => eprintln!("[{stage} guard: {label}, {ms:.0} ms]"),
            Event::Transcript { text, .. } => eprintln!("[heard: {text}]"),
            Event::Sentence { .. } | Event::LoadProgress { .. } | Event::Welcome { .. } => {}
            Event::Loaded { role, .. } => eprintln!("loaded {role}"),
            Event::Unloaded { role, .. } => eprintln!("unloaded {role}"),
            Event::Status { status, .. } => print_status(status),
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
        Command::Serve(args) => serve(args).await,
        Command::Ask(args) => ask(args).await,
        Command::Status(c) => simple(c, |id| Request::Status { id }).await,
        Command::Cancel { id, client } => cancel(client, id).await,
        Command::Load { role, client } => simple(client, |id| Request::Load { id, role }).await,
        Command::Unload { role, client } => simple(client, |id| Request::Unload { id, role }).await,
        Command::Plan { common, json } => plan(&common, json),
        Command::Soak(args) => soak(args).await,
    }
}

async fn soak(args: crate::soak::SoakArgs) -> i32 {
    let printer = Printer { json: args.json };
    let socket = args.socket.clone().unwrap_or_else(crate::server::default_path);
    match crate::soak::run(args, socket).await {
        Ok(v) if v.passed() => 0,
        Ok(_) => 1,
        Err(e) => {
            printer.error(ErrorCode::Engine, format!("soak: {e:#}"));
            2
        }
    }
}

fn plan(common: &CommonArgs, json: bool) -> i32 {
    let printer = Printer { json };
    let config = match Config::load(&common.config) {
        Ok(c) => c,
        Err(e) => {
            printer.error(ErrorCode::BadConfig, e.to_string());
            return 2;
        }
    };
    match crate::plan::plan(&config) {
        Ok(p) => {
            if json {
                println!("{}", serde_json::to_string(&p).expect("plan serializes"));
            } else {
                crate::plan::print(&p);
            }
            if p.fits {
                0
            } else {
                3
            }
        }
        Err(e) => {
            printer.error(ErrorCode::ModelFile, e);
            1
        }
    }
}

async fn serve(args: ServeArgs) -> i32 {
    let config = match Config::load(&args.common.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kazeia serve: {e}");
            return 2;
        }
    };
    let registry = match &args.common.pipelines {
        Some(dir) => Registry::with_dir(dir),
        None => Ok(Registry::builtin()),
    };
    let registry = match registry {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kazeia serve: {e}");
            return 2;
        }
    };
    match crate::server::serve(config, registry, args.socket).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("kazeia serve: {e}");
            1
        }
    }
}

async fn connect(args: &ClientArgs, printer: &Printer) -> Option<Client> {
    let path = args.socket.clone().unwrap_or_else(crate::server::default_path);
    match Client::connect(&path, "cli").await {
        Ok(c) => Some(c),
        Err(e) => {
            let code = match &e {
                ClientError::Refused { code, .. } => *code,
                _ => ErrorCode::Engine,
            };
            printer.error(code, e.to_string());
            None
        }
    }
}

/// Print a request's events until its final one. Returns the exit code.
async fn follow(
    printer: &Printer,
    mut rx: mpsc::UnboundedReceiver<Incoming>,
    is_final: impl Fn(&Event) -> bool,
) -> i32 {
    while let Some(item) = rx.recv().await {
        if let Incoming::Event(ev) = item {
            printer.event(&ev);
            if let Event::Error { .. } = ev {
                return 1;
            }
            if is_final(&ev) {
                return 0;
            }
        }
    }
    printer.error(ErrorCode::Engine, "the daemon closed the connection".into());
    1
}

async fn ask(args: AskArgs) -> i32 {
    let printer = Printer { json: args.client.json };
    let Some(client) = connect(&args.client, &printer).await else { return 1 };
    let id = client.new_id();
    let options = args.sampling.turn_options();
    let req = Request::Turn {
        id: id.clone(),
        pipeline: args.pipeline.clone(),
        text: Some(args.text.clone()),
        audio: None,
        session: args.session.clone(),
        options,
    };
    let rx = match client.send(req).await {
        Ok(rx) => rx,
        Err(e) => {
            printer.error(ErrorCode::Engine, e.to_string());
            return 1;
        }
    };
    // Ctrl-C cancels the turn in the daemon, then we wait for its `done`.
    let client = std::sync::Arc::new(client);
    let c2 = client.clone();
    let id2 = id.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = c2.cancel(&id2).await;
        }
    });
    follow(&printer, rx, |ev| matches!(ev, Event::Done { .. })).await
}

async fn simple(args: ClientArgs, make: impl FnOnce(String) -> Request) -> i32 {
    let printer = Printer { json: args.json };
    let Some(client) = connect(&args, &printer).await else { return 1 };
    let rx = match client.send(make(client.new_id())).await {
        Ok(rx) => rx,
        Err(e) => {
            printer.error(ErrorCode::Engine, e.to_string());
            return 1;
        }
    };
    follow(&printer, rx, |ev| matches!(ev, Event::Status { .. } | Event::Loaded { .. } | Event::Unloaded { .. })).await
}

async fn cancel(args: ClientArgs, id: String) -> i32 {
    let printer = Printer { json: args.json };
    let Some(client) = connect(&args, &printer).await else { return 1 };
    let mut rx = match client.send(Request::Cancel { id: id.clone() }).await {
        Ok(rx) => rx,
        Err(e) => {
            printer.error(ErrorCode::Engine, e.to_string());
            return 1;
        }
    };
    // A cancel has no answer of its own unless it fails: wait briefly for an error.
    match tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
        Ok(Some(Incoming::Event(ev @ Event::Error { .. }))) => {
            printer.event(&ev);
            1
        }
        _ => {
            if !printer.json {
                eprintln!("cancelled {id}");
            }
            0
        }
    }
}

fn print_status(s: &kazeia_ipc::StatusReport) {
    println!(
        "{} (protocol {}), pid {}, up {:.0} s, {} connection(s), {} turn(s) running",
        s.server, s.protocol, s.pid, s.uptime_s, s.connections, s.turns_running
    );
    println!("pipelines: {}", s.pipelines.join(", "));
    let to_mib = |b: u64| b as f64 / 1048576.0;
    println!("memory: {:.1} MiB reserved of a {:.1} MiB budget", to_mib(s.reserved_bytes), to_mib(s.budget_bytes));
    println!("{:<10} {:<9} {:<6} {:>9} {:>5}  file / placement", "role", "state", "device", "MiB", "busy");
    for m in &s.models {
        let mib = m.file_bytes.map(|b| format!("{:.1}", b as f64 / 1048576.0)).unwrap_or_else(|| "-".into());
        let state = format!("{:?}", m.state).to_lowercase();
        println!(
            "{:<10} {:<9} {:<6} {:>9} {:>5}  {}",
            m.role,
            state,
            m.device.as_deref().unwrap_or("-"),
            mib,
            m.busy,
            m.file
        );
        if let Some(r) = m.reserved_bytes {
            let measured = m
                .measured_bytes
                .map(|b| format!(", measured at load {:.1} MiB", b as f64 / 1048576.0))
                .unwrap_or_default();
            println!("{:<10} {:<9} {:<6} {:>9} {:>5}  reserves {:.1} MiB{measured}", "", "", "", "", "", to_mib(r));
        }
        if let Some(p) = &m.placement {
            println!("{:<10} {:<9} {:<6} {:>9} {:>5}  {}", "", "", "", "", "", p);
        }
        if !m.shares_model_with.is_empty() {
            println!(
                "{:<10} {:<9} {:<6} {:>9} {:>5}  shares its model with {}",
                "",
                "",
                "",
                "",
                "",
                m.shares_model_with.join(", ")
            );
        }
        if let Some(e) = &m.error {
            println!("{:<10} {:<9} {:<6} {:>9} {:>5}  error: {e}", "", "", "", "", "");
        }
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
    if args.pipeline == "transcribe" {
        return transcribe(args, config, printer).await;
    }
    if args.pipeline == "speak" {
        return speak(args, config, printer).await;
    }
    // `voice`: speech in, the guarded cascade, speech out.
    let mut args = args;
    let mut voice_out = None;
    if args.pipeline == "voice" {
        let (Some(audio_path), Some(out)) = (args.audio.clone(), args.out.clone()) else {
            printer.error(ErrorCode::BadRequest, "voice takes --audio IN.wav --out REPLY.wav".into());
            return 2;
        };
        let t = match hear(&config, audio_path, args.language.clone()).await {
            Ok((t, _)) => t,
            Err((code, message)) => {
                printer.error(code, message);
                return 1;
            }
        };
        printer.event(&Event::Transcript { id: None, text: t.text.clone(), language: Some(t.language.clone()) });
        let lang = config.speech.reply_language(&t.language);
        let voice = match crate::speech::voice_for(&config, &lang) {
            Ok(v) => v,
            Err(e) => {
                printer.error(e.code(), e.to_string());
                return 1;
            }
        };
        voice_out = Some((out, SpeakerThread::start(voice)));
        args.text = Some(t.text);
        args.pipeline = "guarded-chat".into();
    }
    let Some(text) = args.text.clone() else {
        printer.error(ErrorCode::BadRequest, format!("pipeline {:?} takes --text", args.pipeline));
        return 2;
    };
    let registry = match &args.common.pipelines {
        Some(dir) => Registry::with_dir(dir),
        None => Ok(Registry::builtin()),
    };
    let pipeline = match registry
        .as_ref()
        .map_err(|e| e.to_string())
        .and_then(|r| r.get(&args.pipeline).map_err(|e| e.to_string()))
    {
        Ok(p) => p.clone(),
        Err(e) => {
            printer.error(ErrorCode::Pipeline, e);
            return 2;
        }
    };

    let engine = Engine::new().with_exclusive_compute(config.daemon.exclusive_compute);
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

    let input = TurnInput { id: None, text, options: args.sampling.generate_options(), session: None };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let turn_engine = engine.clone();
    let policy = config.guard.clone();
    let turn = tokio::spawn(async move {
        run_turn(&pipeline, input, Engines { llm: &turn_engine, policy: &policy, sessions: None }, cancel, tx).await
    });
    let mut code = 0;
    while let Some(ev) = rx.recv().await {
        if matches!(ev, Event::Error { .. }) {
            code = 1;
        }
        if let (Event::Sentence { text, .. }, Some((_, speaker))) = (&ev, &voice_out) {
            speaker.say(text.clone());
        }
        printer.event(&ev);
    }
    let _ = turn.await;
    if let Some((out, speaker)) = voice_out {
        match tokio::task::spawn_blocking(move || speaker.finish()).await.expect("speaker thread") {
            Ok((samples, rate, first_audio_ms)) => {
                if let Err(e) = crate::speech::audio::write_wav(&out, &samples, rate) {
                    printer.error(ErrorCode::BadRequest, e.to_string());
                    code = 1;
                } else if !printer.json {
                    eprintln!(
                        "[reply: {:.1} s of audio in {}; first audio after {first_audio_ms:.0} ms]",
                        samples.len() as f64 / f64::from(rate),
                        out.display()
                    );
                }
            }
            Err(e) => {
                printer.error(e.code(), e.to_string());
                code = 1;
            }
        }
    }
    // Unloading joins the engine threads: do it off the async workers.
    let _ = tokio::task::spawn_blocking(move || drop(engine)).await;
    code
}

/// Speaks sentences on its own thread as they arrive, so that synthesis of sentence n overlaps
/// generation of sentence n+1; the first audio exists as soon as the first sentence does.
struct SpeakerThread {
    tx: std::sync::mpsc::Sender<String>,
    handle: std::thread::JoinHandle<Result<Spoken, crate::speech::SpeechError>>,
}

/// All the samples, their rate, and when the first sentence's audio was ready (ms).
type Spoken = (Vec<f32>, u32, f64);

impl SpeakerThread {
    fn start(mut voice: Box<dyn crate::speech::Voice>) -> SpeakerThread {
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let t0 = std::time::Instant::now();
        let handle = std::thread::spawn(move || {
            let mut all = Vec::new();
            let mut first = None;
            for sentence in rx {
                let mut s = voice.synthesize(&sentence)?;
                first.get_or_insert(t0.elapsed().as_secs_f64() * 1e3);
                // A short pause between sentences.
                s.extend(std::iter::repeat_n(0.0, voice.sample_rate() as usize / 5));
                all.extend(s);
            }
            Ok((all, voice.sample_rate(), first.unwrap_or(0.0)))
        });
        SpeakerThread { tx, handle }
    }

    fn say(&self, sentence: String) {
        let _ = self.tx.send(sentence);
    }

    fn finish(self) -> Result<(Vec<f32>, u32, f64), crate::speech::SpeechError> {
        drop(self.tx);
        self.handle
            .join()
            .unwrap_or_else(|_| Err(crate::speech::SpeechError::Run("the speaker thread panicked".into())))
    }
}

/// `kazeia run speak --text "…" --out out.wav [--language en]`: sentence by sentence.
async fn speak(args: RunArgs, config: Config, printer: Printer) -> i32 {
    let (Some(text), Some(out)) = (args.text.clone(), args.out.clone()) else {
        printer.error(ErrorCode::BadRequest, "speak takes --text \"…\" --out FILE.wav".into());
        return 2;
    };
    let language = args
        .language
        .clone()
        .unwrap_or_else(|| config.speech.reply_language(kazeia_pipelines::guard::detect_language(&text)));
    let result = tokio::task::spawn_blocking(move || -> Result<_, crate::speech::SpeechError> {
        let voice = crate::speech::voice_for(&config, &language)?;
        let name = voice.name();
        let speaker = SpeakerThread::start(voice);
        for sentence in kazeia_pipelines::split::sentences(&text) {
            speaker.say(sentence.to_string());
        }
        let (samples, rate, first) = speaker.finish()?;
        crate::speech::audio::write_wav(&out, &samples, rate)?;
        Ok((name, samples.len() as f64 / f64::from(rate), first, out))
    })
    .await;
    match result {
        Ok(Ok((name, seconds, first, out))) => {
            if !printer.json {
                eprintln!("[{name}: {seconds:.1} s of audio in {}; first sentence after {first:.0} ms]", out.display());
            }
            0
        }
        Ok(Err(e)) => {
            printer.error(e.code(), e.to_string());
            1
        }
        Err(e) => {
            printer.error(ErrorCode::Engine, e.to_string());
            1
        }
    }
}

/// Transcribe a WAV file in this process (VAD + Whisper): the transcript and the real-time
/// factor. `language`: the flag, else `[speech] language` (`auto` detects).
async fn hear(
    config: &Config,
    path: PathBuf,
    language: Option<String>,
) -> Result<(crate::speech::Transcript, f64), (ErrorCode, String)> {
    let language = language.unwrap_or_else(|| config.speech.language.clone());
    let language = (language != "auto").then_some(language);
    let config = config.clone();
    let result = tokio::task::spawn_blocking(move || -> Result<_, crate::speech::SpeechError> {
        let samples = crate::speech::audio::read_wav(&path)?;
        let mut t = crate::speech::transcriber(&config)?;
        tracing::info!(device = %t.whisper.placement.device, reason = %t.whisper.placement.reason, "whisper placement");
        let start = std::time::Instant::now();
        let out = t.transcribe(&samples, language.as_deref(), &|| false)?;
        Ok((out, start.elapsed().as_secs_f64() / (samples.len() as f64 / 16_000.0)))
    })
    .await;
    match result {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err((e.code(), e.to_string())),
        Err(e) => Err((ErrorCode::Engine, e.to_string())),
    }
}

/// `kazeia run transcribe --audio in.wav [--language fr]`: VAD + Whisper in this process.
async fn transcribe(args: RunArgs, config: Config, printer: Printer) -> i32 {
    let Some(path) = args.audio.clone() else {
        printer.error(ErrorCode::BadRequest, "transcribe takes --audio FILE.wav".into());
        return 2;
    };
    let result = hear(&config, path, args.language.clone()).await;
    match result {
        Ok((t, rtf)) => {
            if printer.json {
                printer.event(&Event::Transcript { id: None, text: t.text, language: Some(t.language) });
            } else {
                println!("{}", t.text);
                eprintln!(
                    "[{}; {} tokens; encoder {:.0} ms, decoder {:.0} ms; rtf {rtf:.3}]",
                    t.language, t.tokens, t.encoder_ms, t.decoder_ms
                );
            }
            0
        }
        Err((code, message)) => {
            printer.error(code, message);
            1
        }
    }
}

/// Load one role of the config, with a progress bar on an interactive stderr.
pub async fn load_role(engine: &Engine, config: &Config, role: &str, show_progress: bool) -> Result<(), LlmError> {
    let cfg = config.model(role).map_err(|e| LlmError::new(ErrorCode::NoModel, e.to_string()))?.clone();
    let path = config.model_path(&cfg);
    let bar = if show_progress && std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(100);
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {percent:>3}%")
                .expect("valid template")
                .progress_chars("=> "),
        );
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
    let result = tokio::task::spawn_blocking(move || engine.load(&cfg.role_params(), path, progress))
        .await
        .map_err(|e| LlmError::new(ErrorCode::Engine, format!("load task failed: {e}")))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    result.map(|_| ()).map_err(LlmError::from)
}
