//! Helpers for the cross-crate tests: real models from the cache, real engine, /proc figures.

use std::path::{Path, PathBuf};

use kazeia_daemon::config::{default_cache_dir, Config};

/// SmolLM2-135M-Instruct, the default Thinker/Guard (fetched by tools/fetch-models).
pub fn smollm2() -> PathBuf {
    model_file("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Gemma 3 270M base: a second, different architecture.
pub fn gemma3() -> PathBuf {
    model_file("gemma3/gemma-3-270m-q4_k_m.gguf")
}

fn model_file(rel: &str) -> PathBuf {
    let p = default_cache_dir().join(rel);
    assert!(p.is_file(), "{} is missing: run tools/fetch-models first", p.display());
    p
}

/// How long a test waits for something that should happen before it calls it a hang. Not a
/// speed check: only far above what a loaded 2-core machine ever needs.
pub const HANG: std::time::Duration = std::time::Duration::from_secs(120);

/// Wait until `role` has no request queued or running; a hang (past [`HANG`] from `since`)
/// fails the test.
pub async fn wait_idle(engine: &kazeia_engine::Engine, role: &str, since: std::time::Instant) {
    while engine.pending(role) != Some(0) {
        assert!(since.elapsed() < HANG, "{role} never went idle");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A config from TOML text (model files given as absolute paths).
pub fn config(text: &str) -> Config {
    Config::parse(Path::new("test-models.toml"), text).unwrap_or_else(|e| panic!("{e}"))
}

/// One `[[model]]` table for `role` on `file`, greedy, 2 threads.
pub fn model_toml(role: &str, file: &Path, extra: &str) -> String {
    format!(
        "[[model]]\nrole = \"{role}\"\nfile = \"{}\"\nthreads = 2\nbackend = \"cpu\"\n{extra}\n[model.sampling]\ntemperature = 0.0\nmax_tokens = 64\n",
        file.display()
    )
}

/// Fields of /proc/self/status in bytes (`VmRSS`, `RssAnon`, `RssFile`, …).
pub fn proc_status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Reset this process's peak RSS (VmHWM) to its current RSS (`/proc/self/clear_refs`, "5"), so
/// that the next VmHWM read is the peak of what runs after this call alone.
pub fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").expect("/proc/self/clear_refs");
}

/// The growth of this process's peak RSS while `load` loads a voice and it speaks twelve rounds
/// of sentences, one of them a clause over the voice's cap of phoneme ids a run
/// (kazeia_speech::tts::MAX_IDS_PER_RUN), so runs at the cap: what tests/tests/speech_memory_tts
/// and speech_memory_tts_whole check the plan against. Twelve rounds: alone in its process, the
/// peak still varied with which ONNX Runtime thread freed what, when.
pub fn voice_peak_rss(load: impl FnOnce() -> Box<dyn kazeia_daemon::speech::Voice>) -> u64 {
    reset_peak_rss();
    let before = proc_status_bytes("VmRSS");
    let mut voice = load();
    for _ in 0..12 {
        for text in [
            "The weather is nice today and we will go to the park.",
            "Paris is the capital of France.",
            "Take the second road on the left after the old stone bridge and keep walking along the river until you reach the small bakery with the green door",
        ] {
            voice.synthesize(text).unwrap();
        }
    }
    proc_status_bytes("VmHWM").saturating_sub(before)
}

/// Proportional set size of this process (/proc/self/smaps_rollup), in bytes.
pub fn pss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/smaps_rollup").expect("smaps_rollup");
    s.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .expect("Pss in smaps_rollup")
}

/// Load `file` as one role in a fresh engine, prefill a full `n_ubatch` batch and generate a few
/// tokens at `n_ctx`; returns the estimate and the growth of this process's peak RSS (VmHWM).
/// Call it once per test process: the peak is the process's.
pub async fn estimate_and_peak(file: &Path, n_ctx: u64, n_ubatch: u64) -> (kazeia_memory_budget::Estimate, u64) {
    use kazeia_engine::Engine;
    use kazeia_memory_budget::{estimate, gguf, ContextParams};
    use kazeia_pipelines::{ChatMessage, GenEvent, GenerateOptions, GenerateRequest, Llm};
    let c = config(&model_toml("m", file, &format!("n_ctx = {n_ctx}\nn_batch = {n_ubatch}\nn_ubatch = {n_ubatch}")));
    let m = c.model("m").unwrap();
    let est =
        estimate(&gguf::read_header(file).unwrap(), &ContextParams { n_ctx, n_ubatch, ..Default::default() }).unwrap();
    let before = proc_status_bytes("VmRSS");
    let engine = Engine::new();
    engine.load(&m.role_params(), c.model_path(m), Box::new(|_| {})).unwrap();
    // Enough text for a full ubatch whatever the tokenizer.
    let text = "The quick brown fox jumps over the lazy dog. ".repeat((n_ubatch / 8) as usize);
    let req = GenerateRequest::new(
        "m",
        vec![ChatMessage::new("user", text)],
        GenerateOptions { max_tokens: Some(8), ..Default::default() },
    );
    let mut rx = engine.generate(req, tokio_util::sync::CancellationToken::new()).unwrap();
    let prompt = loop {
        match rx.recv().await {
            Some(GenEvent::Finished(r)) => break r.unwrap().metrics.prompt_tokens,
            Some(_) => {}
            None => panic!("engine stopped"),
        }
    };
    assert!(u64::from(prompt) >= n_ubatch, "the prompt ({prompt}) should fill an ubatch ({n_ubatch})");
    (est, proc_status_bytes("VmHWM").saturating_sub(before))
}

/// The tiny random-weight qwen35 model (tools/make-synthetic-models): the target architecture
/// (Gated DeltaNet + full attention) at CI size. Output is noise by design.
pub fn qwen35_tiny() -> PathBuf {
    let p = default_cache_dir().join("synthetic/qwen35-tiny-random.gguf");
    assert!(p.is_file(), "{} is missing: run tools/make-synthetic-models first", p.display());
    p
}

pub use kazeia_daemon::speech::wer::{wer, word_errors};

/// Check a speech model's plan estimate against `peak`, the growth of this process's peak RSS
/// over its load and runs: never below it, and at most `above` times it. Prints the measured
/// factor (peak over file bytes), the figure memory-budget/src/onnx.rs is set from.
pub fn assert_within_estimate(
    name: &str,
    file_bytes: u64,
    peak: u64,
    kind: kazeia_memory_budget::onnx::OnnxKind,
    above: f64,
) {
    let est = kazeia_memory_budget::onnx::estimate_onnx(file_bytes, kind);
    eprintln!("{name}: files {file_bytes} B, measured {peak} B (factor {:.2})", peak as f64 / file_bytes as f64);
    eprintln!(
        "{name}: estimate {est} B (factor {}) vs measured {peak} B: ratio {:.3}",
        kind.factor(),
        est as f64 / peak as f64
    );
    assert!(est >= peak, "{name}: the estimate {est} is below the measured {peak}");
    assert!(est as f64 <= peak as f64 * above, "{name}: the estimate {est} is far above the measured {peak}");
}
