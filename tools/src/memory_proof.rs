//! The memory plan against a real load at target scale: the full-size zero-weight Qwen3.5-9B
//! Thinker and the Qwen3-4B-shaped Guard of `models.target.toml`, loaded together in the real
//! engine on this machine (CPU: the HTP split is planned but there is no NPU here), each given
//! a full-ubatch prefill and a few generated tokens, as the estimate assumes; then the speech
//! stack in the same process (Whisper + Silero through ONNX Runtime, with a transcription; each
//! Piper voice, with a synthesis), as the daemon holds them all at once.
//!
//! Measured: growth of the process's peak RSS (VmHWM) over what it held before the row's
//! load. RSS, not Pss: nothing else maps these pages, and the anonymous weight copies are what
//! Android's low-memory killer counts. Last line: `plan/measured=<ratio>` (goal 1.00–1.10).
//! `--smoke`: the same on the default set (`models.toml`, seconds), for test.sh.

use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use kazeia_daemon::config::Config;
use kazeia_engine::Engine;
use kazeia_pipelines::{ChatMessage, GenEvent, GenerateOptions, GenerateRequest, Llm};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(about = "Planned vs measured peak memory at target scale (slow: loads ~8.5 GB)")]
struct Args {
    /// The device model set (synthetic full-size files).
    #[arg(long, default_value = "models.target.toml")]
    config: PathBuf,
    /// The default set (models.toml) and one token each: seconds, for test.sh.
    #[arg(long)]
    smoke: bool,
    /// CPU threads on this machine (the target's 8 would oversubscribe 2 cores).
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Tokens to generate on each model.
    #[arg(long, default_value_t = 4)]
    tokens: u32,
}

fn status_bytes(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.config = PathBuf::from("models.toml");
        args.tokens = 1;
    }
    let mut config = Config::load(&args.config).map_err(|e| anyhow!("{e}"))?;
    // The device set asks for the NPU (`backend = "htp"`); this machine has none, and a speech
    // model refuses an explicit `htp` it cannot have: here it runs where `auto` puts it (CPU).
    config.speech.backend = kazeia_daemon::config::Backend::Auto;
    config.speech.threads = args.threads as usize;
    let plan = kazeia_daemon::plan::plan(&config).map_err(|e| anyhow!(e))?;
    let engine = Engine::new();
    let base = status_bytes("VmRSS");
    println!("{:<8} {:>12} {:>14} {:>8}", "role", "plan MiB", "measured MiB", "ratio");
    // (planned, measured) over the rows so far.
    let mut totals = (0u64, 0u64);
    let mut whole_peak = 0u64;
    // The language models first, then the speech rows (ONNX: `stt`, `tts`).
    for m in plan.models.iter().filter(|m| config.model(&m.role).is_ok()) {
        let mut cfg = config.model(&m.role).map_err(|e| anyhow!("{e}"))?.clone();
        cfg.threads = args.threads;
        let before = status_bytes("VmRSS");
        let t = std::time::Instant::now();
        engine
            .load(&cfg.role_params(), config.model_path(&cfg), Box::new(|_| {}))
            .with_context(|| format!("loading {}", m.role))?;
        let load_s = t.elapsed().as_secs_f64();
        // A full ubatch of prompt, whatever the tokenizer, then a few tokens.
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(cfg.n_ubatch as usize / 8);
        let opts = GenerateOptions {
            max_tokens: Some(args.tokens),
            ignore_eos: true,
            temperature: Some(0.0),
            ..Default::default()
        };
        let mut rx = engine.generate(
            GenerateRequest::new(&m.role, vec![ChatMessage::new("user", text)], opts),
            CancellationToken::new(),
        )?;
        let summary = loop {
            match rx.recv().await {
                Some(GenEvent::Finished(r)) => break r.map_err(|e| anyhow!("{}: {e}", m.role))?,
                Some(_) => {}
                None => return Err(anyhow!("{}: the engine stopped", m.role)),
            }
        };
        let measured = status_bytes("VmHWM").saturating_sub(before);
        eprintln!(
            "{}: loaded in {load_s:.1} s, prompt {} tokens, {} generated; RSS now {:.0} MiB",
            m.role,
            summary.metrics.prompt_tokens,
            summary.metrics.generated_tokens,
            mib(status_bytes("VmRSS"))
        );
        row(&mut totals, m, measured);
    }
    for m in plan.models.iter().filter(|m| config.model(&m.role).is_err()) {
        // This row's own peak: the high-water mark restarts at the current RSS ("5" to
        // clear_refs). The whole run's peak (last line) is kept apart, before the reset.
        whole_peak = whole_peak.max(status_bytes("VmHWM"));
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let before = status_bytes("VmRSS");
        let what = speech_row(&config, &m.role, &m.file)?;
        let measured = status_bytes("VmHWM").saturating_sub(before);
        eprintln!("{}: {what}; RSS now {:.0} MiB", m.role, mib(status_bytes("VmRSS")));
        row(&mut totals, m, measured);
    }
    let peak = whole_peak.max(status_bytes("VmHWM")).saturating_sub(base);
    println!(
        "{:<8} {:>12.1} {:>14.1} {:>8.3}   (peak of the whole run: {:.1} MiB)",
        "total",
        mib(totals.0),
        mib(totals.1),
        totals.0 as f64 / totals.1 as f64,
        mib(peak)
    );
    println!("plan/measured={:.3}", totals.0 as f64 / peak as f64);
    Ok(())
}

/// One row of the table (planned, measured, their ratio), added to `totals`.
fn row(totals: &mut (u64, u64), m: &kazeia_daemon::plan::ModelPlan, measured: u64) {
    println!(
        "{:<8} {:>12.1} {:>14.1} {:>8.3}",
        m.role,
        mib(m.total_bytes),
        mib(measured),
        m.total_bytes as f64 / measured as f64
    );
    totals.0 += m.total_bytes;
    totals.1 += measured;
}

/// Load a speech row of the plan and run it once, as the daemon would; the models stay loaded
/// (leaked) to the end, as they stay resident in the daemon.
fn speech_row(config: &Config, role: &str, file: &str) -> Result<String> {
    use kazeia_daemon::speech;
    match role {
        "stt" => {
            let mut stt = speech::transcriber(config).map_err(|e| anyhow!("stt: {e}"))?;
            // Two seconds of a tone: the encoder's whole window and a few decoder steps run.
            let tone: Vec<f32> = (0..32_000).map(|i| 0.1 * (i as f32 * 0.05).sin()).collect();
            let heard = stt.transcribe(&tone, Some("en"), &[], &|| false).map_err(|e| anyhow!("stt: {e}"))?;
            std::mem::forget(stt);
            Ok(format!("Whisper + VAD loaded, a 2 s clip transcribed ({:?})", heard.text))
        }
        "tts" => {
            let mut said = Vec::new();
            // The Piper voice of this row (the plan has one `tts` row per Piper voice; espeak
            // voices have none: espeak-ng's data is a shared library, not a model).
            let of_row = |v: &String| config.cache_path(std::path::Path::new(v)).display().to_string() == file;
            for (lang, spec) in config.speech.voices.iter().filter(|(_, v)| of_row(v)) {
                let mut v = speech::voice_for(config, lang).map_err(|e| anyhow!("tts {spec}: {e}"))?;
                let pcm = v.synthesize("The weather is nice today.").map_err(|e| anyhow!("tts {spec}: {e}"))?;
                said.push(format!("{lang}: {:.1} s spoken", pcm.len() as f64 / f64::from(v.sample_rate())));
                std::mem::forget(v);
            }
            if said.is_empty() {
                return Err(anyhow!("no Piper voice of the set is {file}"));
            }
            Ok(said.join(", "))
        }
        other => Err(anyhow!("no way to load the plan's row {other:?}")),
    }
}
