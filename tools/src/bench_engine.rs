//! bench-engine: prefill and decode speed through our engine against llama.cpp's own
//! `llama-bench`, same GGUF, same threads, batch sizes and context size, alternated in one run;
//! medians. llama-bench sizes its context to each test, so each of our tests runs on a context
//! of that size (the role's own n_ctx of 4096 decoded 4% slower here at the same depth).
//!
//! Run it through `tools/bench-engine`, which builds llama-bench from the same llama.cpp tree.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use kazeia_daemon::config::{Config, ModelConfig};
use kazeia_engine::Engine;
use kazeia_pipelines::{ChatMessage, GenEvent, GenSummary, GenerateOptions, GenerateRequest, Llm};
use kazeia_tools::median;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "models.toml")]
    config: PathBuf,
    #[arg(long, default_value = "thinker")]
    role: String,
    /// Path of the llama-bench binary.
    #[arg(long)]
    llama_bench: PathBuf,
    /// Where llama-bench's sources came from, printed with the results.
    #[arg(long, default_value = "")]
    reference: String,
    #[arg(long, default_value_t = 5, value_parser = kazeia_tools::at_least_one())]
    reps: usize,
    /// Prompt tokens for the prefill test.
    #[arg(long, default_value_t = 512)]
    pp: u32,
    /// Generated tokens for the decode test.
    #[arg(long, default_value_t = 128)]
    tg: u32,
    /// One rep on tiny inputs (seconds): test.sh runs this so the tool cannot break unseen.
    #[arg(long)]
    smoke: bool,
}

fn generate(engine: &Engine, role: &str, text: &str, opts: GenerateOptions) -> Result<GenSummary> {
    let req = GenerateRequest::new(role, vec![ChatMessage::new("user", text)], opts);
    let mut rx = engine.generate(req, CancellationToken::new()).map_err(|e| anyhow::anyhow!("{e}"))?;
    loop {
        match rx.blocking_recv() {
            Some(GenEvent::Finished(r)) => return r.map_err(|e| anyhow::anyhow!("{e}")),
            Some(_) => {}
            None => bail!("engine stopped"),
        }
    }
}

/// llama-bench's command line for our role's settings: the same threads, batch sizes, flash
/// attention policy, KV cache types and load mode (mmap or a plain read), CPU only.
fn llama_bench_args(model: &Path, cfg: &ModelConfig, pp: u32, tg: u32) -> Vec<String> {
    let load = if cfg.mmap { "mmap" } else { "none" };
    let mut a: Vec<String> = vec!["-m".into(), model.display().to_string()];
    for (k, v) in [
        ("-t", cfg.threads.to_string()),
        ("-p", pp.to_string()),
        ("-n", tg.to_string()),
        ("-b", cfg.n_batch.to_string()),
        ("-ub", cfg.n_ubatch.to_string()),
        ("-fa", cfg.flash_attn.as_str().to_string()),
        ("-lm", load.to_string()),
        ("-ngl", "0".into()),
        ("-r", "1".into()),
        ("-o", "json".into()),
        // The role's KV cache types: llama-bench stays on f16 unless told.
        ("-ctk", cfg.type_k.name().into()),
        ("-ctv", cfg.type_v.name().into()),
    ] {
        a.push(k.into());
        a.push(v);
    }
    a
}

/// One llama-bench run: (prefill tok/s, decode tok/s).
fn llama_bench(bin: &Path, args: &[String], pp: u32, tg: u32) -> Result<(f64, f64)> {
    let out = Command::new(bin).args(args).output().with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!("llama-bench failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("llama-bench JSON")?;
    let mut pp_ts = None;
    let mut tg_ts = None;
    for t in v.as_array().context("llama-bench output is not an array")? {
        let ts = t["avg_ts"].as_f64().context("avg_ts")?;
        if t["n_prompt"].as_u64() == Some(u64::from(pp)) && t["n_gen"].as_u64() == Some(0) {
            pp_ts = Some(ts);
        } else if t["n_gen"].as_u64() == Some(u64::from(tg)) && t["n_prompt"].as_u64() == Some(0) {
            tg_ts = Some(ts);
        }
    }
    Ok((pp_ts.context("no pp result")?, tg_ts.context("no tg result")?))
}

fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        (args.reps, args.pp, args.tg) = (1, 64, 8);
    }
    let config = Config::load(&args.config)?;
    let mut cfg = config.model(&args.role)?.clone();
    // llama-bench decodes without sampling: ours samples greedily with no penalty, the least a
    // generated token costs.
    cfg.sampling.repeat_penalty = 1.0;
    let path = config.model_path(&cfg);
    let engine = Engine::new().with_exclusive_compute(config.daemon.exclusive_compute);
    // llama-bench sizes its context to each test (n_prompt + n_gen, which llama.cpp pads to
    // 256 cells), and a bigger context decodes slower at the same depth: with the role's n_ctx
    // of 4096 this bench gave decode 0.952 and 0.954 of llama-bench, with 256 0.988 and 0.994
    // (alternated, --pp 64). So each of our tests runs on a context of llama-bench's size for
    // it (the same model, loaded once): the ratios measure the engine, not the context size.
    let pad = |n: u32| n.div_ceil(256) * 256;
    let sized = |test: &str, n_ctx: u32| -> Result<String> {
        let mut p = cfg.role_params();
        p.role = format!("{}-{test}", args.role);
        p.n_ctx = n_ctx;
        p.prefix_dir = None;
        engine.load(&p, path.clone(), Box::new(|_| {}))?;
        Ok(p.role)
    };
    // The prompts are sized on a context just big enough for them: the role's own n_ctx would
    // allocate its whole KV cache only to count tokens (the 9B's, on the device).
    let sizing = sized("sizing", pad(args.pp).max(512))?;

    // Size a chat prompt to just under `pp` tokens (templating adds a few).
    let unit = "The quick brown fox jumps over the lazy dog. ";
    let one = |k: usize| -> Result<u32> {
        Ok(generate(
            &engine,
            &sizing,
            &unit.repeat(k),
            GenerateOptions { max_tokens: Some(1), temperature: Some(0.0), ..Default::default() },
        )?
        .metrics
        .prompt_tokens)
    };
    let (p10, p20) = (one(10)?, one(20)?);
    let per = f64::from(p20 - p10) / 10.0;
    let base = f64::from(p10) - 10.0 * per;
    let k = ((f64::from(args.pp) - base) / per).floor().max(1.0) as usize - 1;
    // A different first sentence each run: the engine's prefix cache must not make the prefill
    // shorter than llama-bench's (only the chat template's fixed opening can be reused).
    let prompt = |n: usize| format!("Run number {n}. {}", unit.repeat(k));

    let prefill_opts = GenerateOptions { max_tokens: Some(1), temperature: Some(0.0), ..Default::default() };
    let decode_opts =
        GenerateOptions { max_tokens: Some(args.tg), temperature: Some(0.0), ignore_eos: true, ..Default::default() };
    let hi_tokens = generate(&engine, &sizing, "Hi", prefill_opts.clone())?.metrics.prompt_tokens;

    let pp_role = sized("pp", pad(args.pp))?;
    let tg_role = sized("tg", pad(hi_tokens + args.tg))?;
    engine.unload(&sizing);
    // Warm-up, as llama-bench does before it measures.
    // Both sides prefill exactly this many tokens: what our engine decodes (not reused).
    let warm = generate(&engine, &pp_role, &prompt(1_000_000), prefill_opts.clone())?.metrics;
    let prompt_tokens = warm.prompt_tokens;
    let warm = generate(&engine, &pp_role, &prompt(1_000_001), prefill_opts.clone())?.metrics;
    let prefill_tokens = warm.prompt_tokens - warm.cached_tokens;
    generate(&engine, &tg_role, "Hi", GenerateOptions { max_tokens: Some(8), ..decode_opts.clone() })?;

    let ref_args = llama_bench_args(&path, &cfg, prefill_tokens, args.tg);
    println!(
        "model: {} ({} threads, n_batch {}, n_ubatch {}, flash_attn {:?}, mmap {}); greedy, no penalty",
        path.display(),
        cfg.threads,
        cfg.n_batch,
        cfg.n_ubatch,
        cfg.flash_attn,
        cfg.mmap
    );
    println!(
        "contexts as llama-bench's: ours {} cells for the prefill test ({}), {} for the decode test ({}); the role's n_ctx is {}",
        pad(args.pp),
        pad(prefill_tokens),
        pad(hi_tokens + args.tg),
        pad(args.tg),
        cfg.n_ctx
    );
    println!("reference: {} {}", args.llama_bench.display(), args.reference);
    println!("reference command: llama-bench {}", ref_args.join(" "));
    println!(
        "{:>4} {:>12} {:>12} {:>12} {:>12} {:>10}",
        "rep", "ours pp t/s", "ref pp t/s", "ours tg t/s", "ref tg t/s", "ours ttft"
    );
    let (mut opp, mut rpp, mut otg, mut rtg, mut ttft) = (vec![], vec![], vec![], vec![], vec![]);
    let started = Instant::now();
    for rep in 0..args.reps {
        // Alternate who goes first, so drift on a shared machine hits both sides alike.
        let ours = |opp: &mut Vec<f64>, otg: &mut Vec<f64>, ttft: &mut Vec<f64>| -> Result<()> {
            let p = generate(&engine, &pp_role, &prompt(rep), prefill_opts.clone())?;
            opp.push(p.metrics.prefill_tok_s);
            ttft.push(p.metrics.ttft_ms);
            let d = generate(&engine, &tg_role, "Hi", decode_opts.clone())?;
            otg.push(d.metrics.decode_tok_s);
            Ok(())
        };
        if rep % 2 == 0 {
            ours(&mut opp, &mut otg, &mut ttft)?;
        }
        let (p, t) = llama_bench(&args.llama_bench, &ref_args, prefill_tokens, args.tg)?;
        rpp.push(p);
        rtg.push(t);
        if rep % 2 == 1 {
            ours(&mut opp, &mut otg, &mut ttft)?;
        }
        println!(
            "{rep:>4} {:>12.1} {:>12.1} {:>12.1} {:>12.1} {:>8.0}ms",
            opp[rep], rpp[rep], otg[rep], rtg[rep], ttft[rep]
        );
    }
    let (mopp, mrpp, motg, mrtg) = (median(opp), median(rpp), median(otg), median(rtg));
    println!(
        "median over {} reps ({:.0} s): prefill {prefill_tokens} tokens (of a {prompt_tokens}-token prompt) ours {mopp:.1} vs llama-bench {mrpp:.1} tok/s; decode {} tokens ours {motg:.1} vs llama-bench {mrtg:.1} tok/s; ours ttft {:.0} ms",
        args.reps,
        started.elapsed().as_secs_f64(),
        args.tg,
        median(ttft)
    );
    println!("engine/llama-bench decode={:.3} prefill={:.3}", motg / mrtg, mopp / mrpp);
    Ok(())
}
