//! The memory plan against a real load at target scale: the full-size zero-weight Qwen3.5-9B
//! Thinker and the Qwen3-4B-shaped Guard of `models.target.toml`, loaded together in the real
//! engine on this machine (CPU: the HTP split is planned but there is no NPU here), each given
//! a full-ubatch prefill and a few generated tokens, as the estimate assumes.
//!
//! Measured: growth of the process's peak RSS (VmHWM) over what it held before the model's
//! load. RSS, not Pss: nothing else maps these pages, and the anonymous weight copies are what
//! Android's low-memory killer counts. Last line: `plan/measured=<ratio>` (goal 1.00–1.10).

use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use kazeia_daemon::config::Config;
use kazeia_engine::Engine;
use kazeia_pipelines::{ChatMessage, GenEvent, GenerateOptions, GenerateRequest, Llm};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(about = "Planned vs measured peak memory at target scale (slow: loads ~7.7 GB)")]
struct Args {
    /// The device model set (synthetic full-size files).
    #[arg(long, default_value = "models.target.toml")]
    config: PathBuf,
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
    let args = Args::parse();
    let config = Config::load(&args.config).map_err(|e| anyhow!("{e}"))?;
    let plan = kazeia_daemon::plan::plan(&config).map_err(|e| anyhow!(e))?;
    let engine = Engine::new();
    let base = status_bytes("VmRSS");
    println!("{:<8} {:>12} {:>14} {:>8}", "role", "plan MiB", "measured MiB", "ratio");
    let (mut planned_total, mut measured_total) = (0u64, 0u64);
    // The language models only: the plan's speech rows (ONNX, `stt`/`tts`) are not llama.cpp
    // roles, and their own estimate is checked by tests/tests/speech_memory.rs.
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
        println!(
            "{:<8} {:>12.1} {:>14.1} {:>8.3}",
            m.role,
            mib(m.total_bytes),
            mib(measured),
            m.total_bytes as f64 / measured as f64
        );
        planned_total += m.total_bytes;
        measured_total += measured;
    }
    let peak = status_bytes("VmHWM").saturating_sub(base);
    println!(
        "{:<8} {:>12.1} {:>14.1} {:>8.3}   (peak of the whole run: {:.1} MiB)",
        "total",
        mib(planned_total),
        mib(measured_total),
        planned_total as f64 / measured_total as f64,
        mib(peak)
    );
    println!("plan/measured={:.3}", planned_total as f64 / peak as f64);
    Ok(())
}
