//! bench-cascade: time to first sentence (ttfs) of a turn, unguarded (`chat`), guarded
//! sequentially (input guard, then the Thinker; no prefix cache) and guarded with overlap and
//! prefix cache (`guarded-chat` as shipped), on one warm engine; then a guarded turn in a freshly
//! started process (`kazeia run`, prefix files on disk) against the same question in the warm
//! engine.
//!
//! Every turn asks a question no turn of the run asked before (`questions::shuffled`): a repeated
//! question would sit whole in the prefix cache and measure caching, not traffic. The variants
//! are strictly alternated, their order rotated each round; each is warmed by one question of
//! its own. A turn a guard blocks ends at the verdict: it is counted and left out of the medians.
//! Before: `guarded/unguarded ttfs=1.290` with each question asked nine times in a row.

use std::io::{BufRead, BufReader, Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use kazeia_daemon::config::Config;
use kazeia_engine::Engine;
use kazeia_ipc::{Event, StopReason};
use kazeia_pipelines::split::first_sentence;
use kazeia_pipelines::{run_turn, Engines, GenerateOptions, Pipeline, Registry, TurnInput};
use kazeia_tools::{median, questions};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "models.toml")]
    config: PathBuf,
    /// The kazeia binary, for the turns in a freshly started process.
    #[arg(long)]
    kazeia: PathBuf,
    /// Rounds of the three variants (one new question each per round).
    #[arg(long, default_value_t = 14, value_parser = kazeia_tools::at_least_one())]
    rounds: usize,
    /// Questions asked both in a fresh process and in the warm engine.
    #[arg(long, default_value_t = 5, value_parser = kazeia_tools::at_least_one())]
    cold: usize,
    /// Order of the questions.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 48)]
    max_tokens: u32,
    /// One round, one cold turn (seconds): test.sh runs this so the tool cannot break unseen.
    #[arg(long)]
    smoke: bool,
}

/// One turn as the client saw it.
struct Seen {
    /// First sentence as the client sees it: the first `sentence` event, or for an unguarded
    /// pipeline the moment the streamed tokens first hold a complete sentence (or the end).
    ttfs_ms: f64,
    /// The pipeline's own ttfs (guarded pipelines), measured from the turn's start.
    engine_ttfs_ms: Option<f64>,
    /// The input check's time and the first output check's (guarded pipelines).
    input_check_ms: Option<f64>,
    first_output_check_ms: Option<f64>,
    blocked: bool,
}

async fn turn(engine: &Engine, config: &Config, pipeline: &Pipeline, prompt: &str, max_tokens: u32) -> Result<Seen> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let input = TurnInput {
        text: prompt.into(),
        options: GenerateOptions { temperature: Some(0.0), max_tokens: Some(max_tokens), ..Default::default() },
        ..Default::default()
    };
    let t0 = Instant::now();
    let engines = Engines { llm: engine, policy: &config.guard, sessions: None };
    let run = run_turn(pipeline, input, engines, CancellationToken::new(), tx);
    let watch = async {
        let mut text = String::new();
        let mut first = None;
        let (mut input_check_ms, mut first_output_check_ms) = (None, None);
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Verdict { stage, ms, .. } if stage == "input" => input_check_ms = Some(ms),
                Event::Verdict { stage, ms, .. } if stage == "output" => {
                    first_output_check_ms.get_or_insert(ms);
                }
                Event::Sentence { .. } => {
                    first.get_or_insert(t0.elapsed());
                }
                Event::Token { text: t, .. } => {
                    text.push_str(&t);
                    if first_sentence(&text).is_some() {
                        first.get_or_insert(t0.elapsed());
                    }
                }
                Event::Done { stop, metrics, .. } => {
                    let at = first.get_or_insert(t0.elapsed());
                    return Ok(Seen {
                        ttfs_ms: at.as_secs_f64() * 1e3,
                        engine_ttfs_ms: metrics.ttfs_ms,
                        input_check_ms,
                        first_output_check_ms,
                        blocked: stop == StopReason::Blocked,
                    });
                }
                Event::Error { message, .. } => bail!("{message}"),
                _ => {}
            }
        }
        bail!("the turn ended without done")
    };
    let ((), seen) = tokio::join!(run, watch);
    seen
}

/// A guarded turn in a new `kazeia run` process: (the turn's ttfs as the pipeline measured it,
/// the process's wall time from start to its first sentence, model loading included). None if
/// a guard blocked it.
fn cold_turn(kazeia: &Path, config: &Path, prompt: &str, max_tokens: u32) -> Result<Option<(f64, f64)>> {
    // Its log goes to a file: a pipe read only after stdout closes blocked the process once it
    // held 64 KiB (a verbose RUST_LOG inherited).
    let log = tempfile::tempfile().context("a temporary file for kazeia run's log")?;
    let t0 = Instant::now();
    let mut child = Command::new(kazeia)
        .args(["run", "guarded-chat", "--json", "--temperature", "0", "--max-tokens", &max_tokens.to_string()])
        .arg("--config")
        .arg(config)
        // `--text=` keeps a question that starts with '-' a value, never an option.
        .arg(format!("--text={prompt}"))
        .stdout(Stdio::piped())
        .stderr(log.try_clone().context("kazeia run's log")?)
        .spawn()
        .context("kazeia run")?;
    let stdout = BufReader::new(child.stdout.take().context("kazeia run: no stdout")?);
    let (mut first, mut done) = (None, None);
    for line in stdout.lines() {
        match serde_json::from_str::<Event>(&line?) {
            Ok(Event::Sentence { .. }) => {
                first.get_or_insert(t0.elapsed().as_secs_f64() * 1e3);
            }
            Ok(Event::Done { stop, metrics, .. }) => done = Some((stop, metrics)),
            _ => {}
        }
    }
    let status = child.wait().context("kazeia run")?;
    if !status.success() {
        let mut err = String::new();
        let mut log = log;
        let _ = log.seek(std::io::SeekFrom::Start(0)).and_then(|_| log.read_to_string(&mut err));
        bail!("kazeia run failed ({status}): {err}");
    }
    match done {
        None => bail!("kazeia run printed no done event"),
        Some((StopReason::Blocked, _)) => Ok(None),
        Some((_, metrics)) => {
            let ttfs = metrics.ttfs_ms.context("kazeia run: done without ttfs_ms")?;
            Ok(Some((ttfs, first.context("kazeia run: no sentence")?)))
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        (args.rounds, args.cold, args.max_tokens) = (1, 1, 16);
    }
    let mut qs = questions::shuffled(args.seed).into_iter();
    let needed = 3 + 3 * args.rounds + args.cold;
    if needed > questions::QUESTIONS.len() {
        bail!("{needed} questions needed, {} available: fewer --rounds or --cold", questions::QUESTIONS.len());
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

    // Each variant warmed alike: one question of its own, untimed (and the guard's prefix cache,
    // which is the point of the overlapped variant).
    for (_, p) in &variants {
        turn(&engine, &config, p, qs.next().unwrap(), args.max_tokens).await?;
    }
    let thinker = config.model("thinker")?;
    println!(
        "ttfs in ms; greedy, repeat_penalty {} (models.toml, the same for every variant), {} tokens max; {} rounds; exclusive compute: {}",
        thinker.sampling.repeat_penalty, args.max_tokens, args.rounds, config.daemon.exclusive_compute
    );
    println!("{:>5} {:<10} {:>9}  question", "round", "variant", "ttfs ms");
    let mut times: [Vec<f64>; 3] = Default::default();
    let mut checks: [(Vec<f64>, Vec<f64>); 3] = Default::default();
    let mut blocked = [0usize; 3];
    for round in 0..args.rounds {
        for k in 0..3 {
            // Rotate the order so that no variant always runs first.
            let i = (k + round) % 3;
            let q = qs.next().unwrap();
            let seen = turn(&engine, &config, variants[i].1, q, args.max_tokens).await?;
            let shown = if seen.blocked { "blocked".to_string() } else { format!("{:.0}", seen.ttfs_ms) };
            println!("{round:>5} {:<10} {shown:>9}  {q}", variants[i].0);
            if seen.blocked {
                blocked[i] += 1;
            } else {
                times[i].push(seen.ttfs_ms);
                checks[i].0.extend(seen.input_check_ms);
                checks[i].1.extend(seen.first_output_check_ms);
            }
        }
    }
    if times.iter().any(Vec::is_empty) {
        bail!("a variant has no unblocked turn (blocked: {blocked:?})");
    }
    let [u, s, o] = times.map(median);
    // Where a guarded turn's extra time goes: the guard's two checks before the first sentence.
    for (name, (input, output)) in [("sequential", &checks[1]), ("overlapped", &checks[2])] {
        if !input.is_empty() && !output.is_empty() {
            println!(
                "{name}: median input check {:.0} ms, first output check {:.0} ms",
                median(input.clone()),
                median(output.clone())
            );
        }
    }

    // Cold: a fresh process per question (its prefix files on disk from the warm-up run), then
    // the same question in this warm engine; both ttfs measured by the pipeline from the turn's
    // start, model loading excluded (the process's wall time is shown beside).
    cold_turn(&args.kazeia, &args.config, "Say hello.", args.max_tokens)?;
    println!("{:<10} {:>9} {:>9} {:>12}  question", "", "cold ms", "warm ms", "cold wall ms");
    let (mut cold, mut warm, mut wall, mut cold_blocked) = (vec![], vec![], vec![], 0);
    for n in 0..args.cold {
        let q = qs.next().unwrap();
        let c = cold_turn(&args.kazeia, &args.config, q, args.max_tokens)?;
        let w = turn(&engine, &config, &overlapped, q, args.max_tokens).await?;
        match (c, w.engine_ttfs_ms) {
            (Some((c, total)), Some(w)) if !w.is_nan() => {
                println!("{:<10} {c:>9.0} {w:>9.0} {total:>12.0}  {q}", format!("cold {n}"));
                cold.push(c);
                warm.push(w);
                wall.push(total);
            }
            _ => {
                println!("{:<10} {:>9}  {q}", format!("cold {n}"), "blocked");
                cold_blocked += 1;
            }
        }
    }
    if cold.is_empty() {
        bail!("every cold turn was blocked");
    }
    let (c, w) = (median(cold), median(warm));
    println!(
        "median ttfs: unguarded {u:.0} ms, guarded sequential {s:.0} ms, guarded overlapped+cached {o:.0} ms; \
         blocked and left out: {} / {} / {}; fresh process {c:.0} ms ({:.0} ms from its start), warm {w:.0} ms, {cold_blocked} blocked",
        blocked[0],
        blocked[1],
        blocked[2],
        median(wall)
    );
    println!("guarded/unguarded ttfs={:.3} sequential/overlapped ttfs={:.3} cold/warm ttfs={:.3}", o / u, s / o, c / w);
    Ok(())
}
