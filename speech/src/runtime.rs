//! ONNX Runtime for the speech models: one environment per process, loaded at run time from
//! the onnxruntime wheel's library (`ORT_DYLIB_PATH`, else `$KAZEIA_MODELS/onnxruntime/`), and
//! a session per model with its execution provider chosen by `backend`.
//!
//! `htp` asks for QNN with the HTP backend; `auto` tries it and falls back to the CPU; `cpu` is
//! plain CPU. ORT builds without QNN (the wheel here) refuse the provider: the fallback is
//! logged once per model and status says where the model really runs and why.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::session::Session;

use kazeia_memory_budget::Backend;

#[derive(Debug, thiserror::Error)]
pub enum SpeechError {
    #[error("ONNX Runtime library not found at {0} (run tools/fetch-models, or set ORT_DYLIB_PATH)")]
    NoRuntime(PathBuf),
    #[error("ONNX Runtime at {path}: {message}")]
    Runtime { path: PathBuf, message: String },
    #[error("model file {0} is missing (tools/fetch-models fetches the default models)")]
    Missing(PathBuf),
    #[error("{path}: not a usable ONNX model: {message}")]
    BadModel { path: PathBuf, message: String },
    #[error("{path}: backend = \"htp\" but QNN is not available: {message}")]
    NoQnn { path: PathBuf, message: String },
    #[error("{0}")]
    Run(String),
    #[error("audio: {0}")]
    Audio(String),
    /// The speech models do not fit the memory budget.
    #[error("over budget: {0}")]
    OverBudget(String),
}

impl SpeechError {
    /// The protocol's code for this failure.
    pub fn code(&self) -> kazeia_ipc::ErrorCode {
        use kazeia_ipc::ErrorCode;
        match self {
            SpeechError::Missing(_)
            | SpeechError::BadModel { .. }
            | SpeechError::NoRuntime(_)
            | SpeechError::NoQnn { .. } => ErrorCode::ModelFile,
            SpeechError::Audio(_) => ErrorCode::BadRequest,
            SpeechError::OverBudget(_) => ErrorCode::OverBudget,
            _ => ErrorCode::Engine,
        }
    }
}

impl From<ort::Error> for SpeechError {
    fn from(e: ort::Error) -> Self {
        SpeechError::Run(e.to_string())
    }
}

/// Where a speech model runs, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    pub device: String,
    pub reason: String,
}

static ENV: OnceLock<Result<ort::environment::Environment, String>> = OnceLock::new();

/// The runtime library this process uses.
pub fn library_path() -> PathBuf {
    std::env::var_os("ORT_DYLIB_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| kazeia_memory_budget::model_cache_dir().join("onnxruntime/libonnxruntime.so.1.31.1"))
}

fn environment() -> Result<&'static ort::environment::Environment, SpeechError> {
    let path = library_path();
    let env = ENV.get_or_init(|| {
        if !path.is_file() {
            return Err(format!("missing:{}", path.display()));
        }
        // `ort::init()` would panic on a missing library; `init_from` returns the error.
        ort::init_from(&path).map_err(|e| e.to_string())?.with_name("kazeia").build().map_err(|e| e.to_string())
    });
    match env {
        Ok(e) => Ok(e),
        Err(m) if m.starts_with("missing:") => Err(SpeechError::NoRuntime(path)),
        Err(m) => Err(SpeechError::Runtime { path, message: m.clone() }),
    }
}

/// The name ONNX Runtime's own threads carry (Linux threads inherit their creator's name).
pub const ORT_THREAD: &str = "ort-speech";

/// While it lives, the calling thread is named [`ORT_THREAD`]; its old name comes back after.
/// ONNX Runtime starts a session's intra-op threads while the session is created, from the
/// caller's thread: a caller in tokio's blocking pool made them "tokio-blocking", which a soak
/// leaves out of its thread count as an elastic pool. Named here, they count.
struct NamedForOrt([u8; 16]);

impl NamedForOrt {
    fn enter() -> NamedForOrt {
        let mut old = [0u8; 16];
        // SAFETY: PR_GET_NAME writes at most 16 bytes (NUL included) into `old`; PR_SET_NAME
        // reads a NUL-terminated string of at most 16 bytes.
        unsafe {
            libc::prctl(libc::PR_GET_NAME, old.as_mut_ptr());
            libc::prctl(libc::PR_SET_NAME, c"ort-speech".as_ptr());
        }
        NamedForOrt(old)
    }
}

impl Drop for NamedForOrt {
    fn drop(&mut self) {
        // SAFETY: `self.0` holds the NUL-terminated name PR_GET_NAME gave.
        unsafe { libc::prctl(libc::PR_SET_NAME, self.0.as_ptr()) };
    }
}

/// Stops a speech run from another thread: Whisper's decoder between tokens, and a run inside
/// ONNX Runtime through its terminate flag, checked between the graph's nodes. A draft
/// transcript of speech the user went on with is dropped this way mid-encoder, so that the
/// transcription of the whole utterance does not wait ~0.7 s behind it.
pub struct Stop {
    stopped: std::sync::atomic::AtomicBool,
    run: ort::session::RunOptions,
}

impl Stop {
    pub fn new() -> Result<Stop, SpeechError> {
        Ok(Stop { stopped: false.into(), run: ort::session::RunOptions::new()? })
    }

    pub fn stop(&self) {
        self.stopped.store(true, std::sync::atomic::Ordering::Release);
        if let Err(e) = self.run.terminate() {
            tracing::warn!("could not stop a speech run: {e}");
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The options a stoppable run passes to ONNX Runtime.
    pub fn options(&self) -> &ort::session::RunOptions {
        &self.run
    }
}

/// Whether a model's tensors have the same shapes at every run, which decides its allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shapes {
    /// Same shapes every run, or shapes with a small cap (Whisper's encoder: at most a 30 s
    /// window, and its first run after a load is one, see `Whisper::whole_seen`;
    /// Smart Turn's 8 s, the VAD's chunk, Piper's runs of at most `tts::MAX_IDS_PER_RUN`
    /// phoneme ids): ONNX Runtime's CPU arena. It grows to the largest run's working set and
    /// is reused, where the system allocator gave every run's big tensors back and faulted them
    /// in again: Whisper-base's encoder took 955–1046 ms a run without the arena, 634–689 ms
    /// with it, and peaked lower (316 against 510 MB over the process; onnxruntime 1.32, 2
    /// threads, here); Piper's first audio in the voice bench fell from 188–227 to 144–163 ms
    /// and its peak from 3.55–4.13 to 2.99–3.05 × its file.
    Fixed,
    /// Shapes that grow without a small cap (Whisper's decoder over its cache): no arena, since
    /// it keeps the largest run's size for good.
    Varying,
}

/// Open `path` with `threads` intra-op threads on the execution provider `backend` asks for.
pub fn session(
    path: &Path,
    threads: usize,
    backend: Backend,
    shapes: Shapes,
) -> Result<(Session, Placement), SpeechError> {
    if !path.is_file() {
        return Err(SpeechError::Missing(path.into()));
    }
    let _named = NamedForOrt::enter();
    let env = environment()?;
    let bad = |e: String| SpeechError::BadModel { path: path.into(), message: e };
    // Session-builder errors carry the builder and are not Send + Sync: keep only the message.
    let builder = || -> Result<ort::session::builder::SessionBuilder, SpeechError> {
        Session::builder(env)
            .map_err(|e| bad(e.to_string()))?
            .with_intra_threads(threads.max(1))
            .map_err(|e| bad(e.to_string()))?
            .with_inter_threads(1)
            .map_err(|e| bad(e.to_string()))?
            // Spin-waiting within a run, never after it. By default ONNX Runtime's pool
            // threads also spin after every run, on the cores llama.cpp's decodes need
            // (tools/bench-voice --reps 1, runs alternated, spinning against not: input guard
            // 202, 240 against 181, 183 ms; end of speech to first audio p50 1784, 1868
            // against 1694, 1700 ms). With no spinning at all, each of a run's ops wakes the
            // other thread from sleep: a Whisper decoder call of one token took 5.3-5.7 ms
            // against 3.8-4.0 spinning (2 threads, here), and a transcript makes 8-18 calls.
            // `force_spinning_stop` puts the threads to sleep when the run ends: between calls
            // 20 ms apart the process used 0.49 of a core against 0.39 not spinning and 1.23
            // spinning after runs.
            .with_intra_op_spinning(true)
            .map_err(|e| bad(e.to_string()))?
            .with_config_entry("session.force_spinning_stop", "1")
            .map_err(|e| bad(e.to_string()))
    };
    if backend != Backend::Cpu {
        let qnn = ort::ep::QNN::default()
            .with_backend_path("libQnnHtp.so")
            .with_performance_mode(ort::ep::qnn::PerformanceMode::Burst)
            .build()
            .error_on_failure();
        let attempt = builder()?.with_execution_providers([qnn]).map_err(|e| e.to_string());
        match attempt.and_then(|mut b| b.commit_from_file(path).map_err(|e| e.to_string())) {
            Ok(s) => {
                let placement =
                    Placement { device: "htp".into(), reason: "QNN execution provider, HTP backend".into() };
                *LAST.lock().expect("placement") = Some(placement.clone());
                return Ok((s, placement));
            }
            Err(message) if backend == Backend::Htp => return Err(SpeechError::NoQnn { path: path.into(), message }),
            Err(message) => {
                // Expected on every CPU-only machine: one line per process, not one per model
                // (a voice turn opens four sessions); the details per model at debug.
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| tracing::info!("speech runs on the CPU: QNN (HTP) is not available here"));
                tracing::debug!(model = %path.display(), "QNN (HTP) unavailable, running on the CPU: {message}");
            }
        }
    }
    // No memory pattern, and no CPU arena for varying shapes: the arena grows by doubling to the
    // largest shapes any run has seen and never gives back; with every session on it (and
    // Piper's runs not yet capped), a voice daemon's RSS crept ~550 MB over its loaded size
    // within a few turns (1,350 MiB peak for a 776 MiB stack). Freed tensors of varying shapes
    // go back to the system instead. Fixed or capped shapes keep it: see [`Shapes::Fixed`].
    let cpu = ort::ep::CPU::default().with_arena_allocator(shapes == Shapes::Fixed).build();
    let s = builder()?
        .with_execution_providers([cpu])
        .map_err(|e| bad(e.to_string()))?
        .with_memory_pattern(false)
        .map_err(|e| bad(e.to_string()))?
        .commit_from_file(path)
        .map_err(|e| bad(e.to_string()))?;
    let reason = match backend {
        Backend::Cpu => "backend = \"cpu\"".to_string(),
        _ => {
            "backend = \"auto\": this ONNX Runtime has no QNN execution provider (CPU-only build or no NPU)".to_string()
        }
    };
    let placement = Placement { device: "cpu".into(), reason };
    *LAST.lock().expect("placement") = Some(placement.clone());
    Ok((s, placement))
}

static LAST: std::sync::Mutex<Option<Placement>> = std::sync::Mutex::new(None);

/// Where this process's speech models run (the session opened last) and why: the one line a
/// CLI run prints about speech.
pub fn placement() -> Option<Placement> {
    LAST.lock().expect("placement").clone()
}
