//! bench-cascade: time to first sentence (ttfs) for the same prompts unguarded (`chat`), guarded
//! sequentially (input guard, then the Thinker; no prefix cache), and guarded with overlap and
//! prefix cache (`guarded-chat` as shipped). Alternated, medians.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Parser;
use kazeia_daemon::config::Config;
use kazeia_engine::Engine;
use kazeia_ipc::Event;
use kazeia_pipelines::split::first_sentence;
use kazeia_pipelines::{run_turn, Engines, GenerateOptions, Pipeline, Registry, TurnInput};
use kazeia_tools::median;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "models.toml")]
    config: PathBuf,
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// One rep on tiny inputs (seconds): test.sh runs this so the tool cannot break unseen.
    #[arg(long)]
    smoke: bool,
}

const PROMPTS: &[&str] = &[
    "What is the capital of France? Answer in one short sentence.",
    "Give me one tip for sleeping better.",
    "Explain in two sentences why the sky is blue.",
    "Quelle est la capitale de l'Italie ?",
    "Name a healthy breakfast.",
];

/// ttfs in ms as the client sees it: the first `sentence` event, or for an unguarded pipeline
/// the moment the streamed tokens first hold a complete sentence (or the end of the reply).
async fn ttfs(engine: &Engine, config: &Config, pipeline: &Pipeline, prompt: &str) -> Result<f64> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let input = TurnInput {
        text: prompt.into(),
        options: GenerateOptions { temperature: Some(0.0), max_tokens: Some(64), ..Default::default() },
        ..Default::default()
    };
    let t0 = Instant::now();
    let engines = Engines { llm: engine, policy: &config.guard, sessions: None };
    let run = run_turn(pipeline, input, engines, CancellationToken::new(), tx);
    let watch = async {
        let mut text = String::new();
        let mut first = None;
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Sentence { .. } => {
                    first.get_or_insert(t0.elapsed());
                }
                Event::Token { text: t, .. } => {
                    text.push_str(&t);
                    if first_sentence(&text).is_some() {
                        first.get_or_insert(t0.elapsed());
                    }
                }
                Event::Done { .. } => {
                    first.get_or_insert(t0.elapsed());
                }
                Event::Error { message, .. } => return Err(anyhow::anyhow!(message)),
                _ => {}
            }
        }
        first.ok_or_else(|| anyhow::anyhow!("no output"))
    };
    let ((), r) = tokio::join!(run, watch);
    Ok(r?.as_secs_f64() * 1e3)
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    let prompts = if args.smoke { &PROMPTS[..2] } else { PROMPTS };
    if args.smoke {
        args.reps = 1;
    }
    let config = Config::load(&args.config)?;
    let engine = Engine::new().with_exclusive_compute(config.daemon.exclusive_compute);
    for role in ["thinker", "guard"] {
        let m = config.model(role)?;
        engine.load(&m.role_params(), config.model_path(m), Box::new(|_| {}))?;
    }
    let reg = Registry::builtin();
    let chat = reg.get("chat")?.clone();
    let overlapped = reg.get("guarded-chat")?.clone();
    let mut sequential = overlapped.clone();
    sequential.overlap = false;
    sequential.prefix_cache = false;
    let variants = [("unguarded", &chat), ("sequential", &sequential), ("overlapped", &overlapped)];

    // Warm-up (and the guard's prefix cache, which is the point of the overlapped variant).
    for (_, p) in &variants {
        ttfs(&engine, &config, p, PROMPTS[0]).await?;
    }
    println!("ttfs in ms, greedy, {} reps; exclusive compute: {}", args.reps, config.daemon.exclusive_compute);
    println!("{:<64} {:>10} {:>10} {:>10}", "prompt", "unguarded", "sequential", "overlapped");
    let mut all: [Vec<f64>; 3] = Default::default();
    for prompt in prompts {
        let mut per: [Vec<f64>; 3] = Default::default();
        for rep in 0..args.reps {
            for k in 0..3 {
                // Rotate the order so that no variant always runs first.
                let i = (k + rep) % 3;
                let v = ttfs(&engine, &config, variants[i].1, prompt).await?;
                per[i].push(v);
                all[i].push(v);
            }
        }
        let m: Vec<f64> = per.into_iter().map(median).collect();
        let short: String = prompt.chars().take(62).collect();
        println!("{short:<64} {:>10.0} {:>10.0} {:>10.0}", m[0], m[1], m[2]);
    }
    let [u, s, o] = all.map(median);
    if u <= 0.0 || o <= 0.0 {
        bail!("no measurement");
    }
    println!("median ttfs: unguarded {u:.0} ms, guarded sequential {s:.0} ms, guarded overlapped+cached {o:.0} ms");
    println!("guarded/unguarded ttfs={:.3} sequential/overlapped ttfs={:.3}", o / u, s / o);
    Ok(())
}
