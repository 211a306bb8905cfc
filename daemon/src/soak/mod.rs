//! `kazeia soak`: hold a running daemon under mixed traffic and faults for N turns, sample its
//! process, and judge: never over budget, no RSS drift, no FD or thread growth. Writes a CSV
//! and a PNG plot of memory, threads and FDs over time.
//!
//! A soak takes minutes to hours, so what can fail at its end is checked at its start: the
//! output paths must take a file before any traffic. And a write that still fails at the end
//! (disk full) does not hide the verdict: it is one more failure in the printed summary.

mod plot;
mod report;
mod sample;
mod workload;

pub use plot::plot;
pub use report::{judge, mib, write_csv, Levels, Verdict};
pub use sample::{sample, Sample, POOL_THREAD};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use clap::Args;
use kazeia_ipc::Client;

#[derive(Debug, Args)]
pub struct SoakArgs {
    /// The daemon's socket.
    #[arg(long, env = "KAZEIA_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Turns to run in all (every step counts: turns, cancels, vanishing clients, reloads, status).
    #[arg(long, default_value_t = 100)]
    pub turns: u64,
    /// Clients running side by side, each on its own connection.
    #[arg(long, default_value_t = 2)]
    pub clients: u32,
    /// Most tokens per answer (short answers keep a CI soak short).
    #[arg(long, default_value_t = 48)]
    pub max_tokens: u32,
    /// Sampling interval of the daemon's process, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub interval_ms: u64,
    /// Fraction of the samples treated as warm-up and left out of the drift checks (0 to 0.9).
    #[arg(long, default_value_t = 0.1, value_parser = fraction(0.9))]
    pub warmup: f64,
    /// Largest RSS drift allowed between the early and the late window after warm-up (0 to 1).
    #[arg(long, default_value_t = 0.02, value_parser = fraction(1.0))]
    pub max_drift: f64,
    /// Seed of the traffic (the same seed replays the same choices).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the plot of memory, threads and FDs over time here (PNG).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write the samples here (CSV).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Percentage of steps that are spoken questions on `voice` (0: none). The questions are
    /// spoken here, by the English voice of `--config`, before the traffic starts.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub voice: u32,
    /// The daemon's budget has no room for the speech models: every voice turn must be refused
    /// with `over_budget` while text turns go on (any other end of a voice turn fails the soak).
    #[arg(long)]
    pub speech_refused: bool,
    /// The model set whose voice speaks the questions of `--voice`.
    #[arg(long, env = "KAZEIA_CONFIG", default_value = "models.toml")]
    pub config: PathBuf,
}

/// Questions for the voice steps, spoken by the English voice.
const SPOKEN: &[&str] = &[
    "What is the capital of France?",
    "How do I boil an egg?",
    "Give me one tip to sleep better.",
    "Write a short poem about the sea.",
];

/// The voice steps' questions as audio, made before the traffic (seconds, not in the timings).
fn clips(config_path: &Path) -> Result<Vec<workload::Clip>> {
    let config = crate::config::Config::load(config_path).map_err(|e| anyhow!("{e}"))?;
    let mut voice = crate::speech::voice_for(&config, "en").map_err(|e| anyhow!("the soak's voice: {e}"))?;
    SPOKEN
        .iter()
        .map(|text| {
            let mut samples = voice.synthesize(text).map_err(|e| anyhow!("speaking {text:?}: {e}"))?;
            // Half a second of silence after the question, as a speaker leaves.
            samples.extend(std::iter::repeat_n(0.0, voice.sample_rate() as usize / 2));
            let pcm = crate::speech::audio::to_s16le(&samples);
            Ok(workload::Clip { text: text.to_string(), rate: voice.sample_rate(), pcm })
        })
        .collect()
}

/// Run the soak; Ok(verdict) whether it passed or not (the caller sets the exit code).
pub async fn run(args: SoakArgs, socket: PathBuf) -> Result<Verdict> {
    check_outputs(&args)?;
    let probe =
        Client::connect(&socket, "kazeia-soak").await.map_err(|e| anyhow!("connect {}: {e}", socket.display()))?;
    let status = probe.status().await.map_err(|e| anyhow!("status: {e}"))?;
    let pid = status.pid;
    let budget = status.budget_bytes;
    // Language-model roles only: the speech models load with audio turns (or at start with
    // `[speech] preload`), not by the soak's load requests.
    let roles: Vec<String> =
        status.models.iter().filter(|m| m.architecture.as_deref() != Some("onnx")).map(|m| m.role.clone()).collect();
    drop(probe);
    let (turns, clients, budget_mib) = (args.turns, args.clients, mib(budget));
    tracing::info!(pid, ?roles, "soaking the daemon: {turns} turns, {clients} clients, a {budget_mib:.1} MiB budget");

    let clips = if args.voice > 0 { clips(&args.config)? } else { Vec::new() };
    let plan = Arc::new(workload::Plan {
        socket: socket.clone(),
        turns: args.turns,
        max_tokens: args.max_tokens,
        roles,
        pipelines: status.pipelines.clone(),
        voice: args.voice,
        clips,
        speech_refused: args.speech_refused,
    });
    let next = Arc::new(AtomicU64::new(0));
    let counts = Arc::new(workload::Counts::default());
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let start = Instant::now();

    // The sampler runs until the clients are done; a daemon that dies ends the soak.
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = {
        let (samples, counts, stop) = (samples.clone(), counts.clone(), stop.clone());
        let interval = Duration::from_millis(args.interval_ms.max(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.cancelled() => return Ok(()),
                }
                let s = sample(pid, start.elapsed().as_secs_f64(), counts.finished())?;
                samples.lock().expect("samples").push(s);
            }
        })
    };
    let progress = indicatif::ProgressBar::new(args.turns).with_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} turns  {elapsed}  {msg}").expect("template"),
    );
    if args.json {
        progress.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..args.clients.max(1) {
        clients.spawn(workload::client(
            plan.clone(),
            next.clone(),
            counts.clone(),
            args.seed.wrapping_mul(1000).wrapping_add(u64::from(i)),
        ));
    }
    let mut client_errors = Vec::new();
    loop {
        tokio::select! {
            r = clients.join_next() => match r {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => client_errors.push(e),
                Some(Err(e)) => client_errors.push(format!("client task: {e}")),
            },
            _ = tokio::time::sleep(Duration::from_millis(250)) => {
                progress.set_position(counts.finished().min(args.turns));
                if let Some(s) = samples.lock().expect("samples").last() {
                    let (rss, fds, threads) = (mib(s.rss_bytes), s.fds, s.threads);
                    progress.set_message(format!("RSS {rss:.1} MiB  fds {fds}  threads {threads}"));
                }
            }
        }
    }
    progress.finish_and_clear();
    // A last sample after the traffic, then stop the sampler.
    tokio::time::sleep(Duration::from_millis(args.interval_ms)).await;
    stop.cancel();
    // A daemon that died mid-soak fails it, with what was sampled until then judged and written
    // (the CSV and plot are the evidence).
    let sampled = match sampler.await {
        Ok(r) => r.map_err(|e: sample::SampleError| e.to_string()),
        Err(e) => Err(format!("the sampler stopped: {e}")),
    };

    let samples = std::mem::take(&mut *samples.lock().expect("samples"));
    let mut verdict = judge(&samples, budget, args.warmup, args.max_drift);
    if let Err(e) = sampled {
        verdict.failures.push(format!("sampling the daemon failed: {e}"));
    }
    for e in client_errors {
        verdict.failures.push(format!("a client stopped: {e}"));
    }
    // Every turn ends with an answer or an expected refusal (busy, cancelled, and over_budget
    // for speech under --speech-refused); anything else is logged by the client and fails here.
    let errors = counts.errors.load(Ordering::Relaxed);
    if errors > 0 {
        verdict.failures.push(format!("{errors} steps ended with an unexpected error or answer (see the log)"));
    }
    let title = format!("kazeia soak: {} turns, {} clients — daemon pid {pid}", args.turns, args.clients);
    verdict.failures.extend(write_outputs(&args, &samples, budget, &title));
    let c = &counts;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let summary = serde_json::json!({
        "type": "soak",
        "passed": verdict.passed(),
        "turns": args.turns,
        "clients": args.clients,
        "seconds": start.elapsed().as_secs_f64(),
        "samples": verdict.samples,
        "done": get(&c.done), "cancelled": get(&c.cancelled), "vanished": get(&c.vanished),
        "busy": get(&c.busy), "reloads": get(&c.reloads), "errors": get(&c.errors),
        "voice": get(&c.voice), "refused": get(&c.refused), "speech_refused": args.speech_refused,
        "peak_rss_bytes": verdict.peak_rss_bytes,
        "budget_bytes": verdict.budget_bytes,
        "rss_drift": verdict.rss_drift,
        "anon_drift": verdict.anon_drift,
        "window_samples": verdict.window,
        "fds_early": verdict.fds.early, "fds_late": verdict.fds.late,
        "fds_early_p75": verdict.fds.early_high, "fds_late_p25": verdict.fds.late_low,
        "threads_early": verdict.threads.early, "threads_late": verdict.threads.late,
        "threads_early_p75": verdict.threads.early_high, "threads_late_p25": verdict.threads.late_low,
        "failures": verdict.failures,
    });
    if args.json {
        crate::cli::print::json_line(summary);
    } else {
        crate::cli::print::outln!(
            "{} turns in {:.0} s: {} done ({} voice), {} cancelled, {} vanished, {} busy, {} refused over budget, {} reloads, {} errors",
            args.turns,
            start.elapsed().as_secs_f64(),
            get(&c.done),
            get(&c.voice),
            get(&c.cancelled),
            get(&c.vanished),
            get(&c.busy),
            get(&c.refused),
            get(&c.reloads),
            get(&c.errors)
        );
        crate::cli::print::outln!(
            "peak RSS {:.1} MiB of a {:.1} MiB budget; RSS drift {:+.2}% (anon {:+.2}%); \
             fds {} -> {}; threads {} -> {} (medians of the early and the late {} samples)",
            mib(verdict.peak_rss_bytes),
            mib(budget),
            verdict.rss_drift * 100.0,
            verdict.anon_drift * 100.0,
            verdict.fds.early,
            verdict.fds.late,
            verdict.threads.early,
            verdict.threads.late,
            verdict.window
        );
        for f in &verdict.failures {
            crate::cli::print::outln!("FAIL: {f}");
        }
        crate::cli::print::outln!("soak {}", if verdict.passed() { "passed" } else { "FAILED" });
    }
    Ok(verdict)
}

/// A file the soak writes at its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    Plot,
    Csv,
}

impl Output {
    fn name(self) -> &'static str {
        match self {
            Output::Plot => "the plot",
            Output::Csv => "the CSV",
        }
    }
}

/// The outputs asked for, with their paths.
fn outputs(args: &SoakArgs) -> impl Iterator<Item = (Output, &Path)> {
    [(Output::Plot, &args.plot), (Output::Csv, &args.csv)].into_iter().filter_map(|(o, p)| Some((o, p.as_deref()?)))
}

/// Before any traffic: every output path takes a file, and the plot's name a format.
/// A number from 0 to `max`: `--warmup 1` left no sample to judge (the soak failed at its end
/// whatever happened), `--max-drift nan` turned the drift check off.
fn fraction(max: f64) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |s: &str| match s.parse::<f64>() {
        Ok(v) if (0.0..=max).contains(&v) => Ok(v),
        _ => Err(format!("a number from 0 to {max}")),
    }
}

/// The outputs can be written (a soak of an hour must not fail at its end on a path).
pub fn check_outputs(args: &SoakArgs) -> Result<()> {
    for (output, path) in outputs(args) {
        let format = if output == Output::Plot { image_format(path) } else { Ok(()) };
        format
            .and_then(|()| crate::output::check_writable(path))
            .map_err(|e| anyhow!("cannot write {} to {}: {e}", output.name(), path.display()))?;
    }
    Ok(())
}

/// The plot's encoder picks the format from the extension, and only when it saves, at the end.
fn image_format(path: &Path) -> Result<(), String> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    match ["png", "jpg", "jpeg", "bmp"].contains(&ext.as_str()) {
        true => Ok(()),
        false => Err("name it *.png (the format goes by the extension)".into()),
    }
}

/// Write the CSV and the plot; what failed, as failures of the verdict.
fn write_outputs(args: &SoakArgs, samples: &[Sample], budget: u64, title: &str) -> Vec<String> {
    outputs(args)
        .filter_map(|(output, path)| {
            let written = match output {
                Output::Plot => plot(path, samples, budget, title),
                Output::Csv => write_csv(path, samples, budget).map_err(|e| e.to_string()),
            };
            written.err().map(|e| format!("cannot write {} to {}: {e}", output.name(), path.display()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        soak: SoakArgs,
    }

    fn args(extra: &[&str]) -> SoakArgs {
        Cli::parse_from(["kazeia-soak"].iter().chain(extra)).soak
    }

    #[tokio::test]
    async fn an_unwritable_output_fails_before_any_traffic() {
        let dir = tempfile::tempdir().unwrap();
        // No daemon at this socket: the output check must come first, or this would say "connect".
        let socket = dir.path().join("no-daemon.sock");
        let plot = dir.path().join("missing/m.png");
        let e = run(args(&["--plot", plot.to_str().unwrap()]), socket.clone()).await.unwrap_err().to_string();
        assert!(e.starts_with(&format!("cannot write the plot to {}: directory ", plot.display())), "{e}");
        let csv = dir.path().join("m.csv");
        std::fs::create_dir(&csv).unwrap();
        let e = run(args(&["--csv", csv.to_str().unwrap()]), socket.clone()).await.unwrap_err().to_string();
        assert_eq!(e, format!("cannot write the CSV to {}: it is a directory", csv.display()));
        let e = run(args(&["--plot", dir.path().join("m").to_str().unwrap()]), socket).await.unwrap_err().to_string();
        assert!(e.contains("name it *.png"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "only the CSV's directory of this test is left");
    }

    /// `--warmup 1` left no sample to judge, `--max-drift nan` no drift check.
    #[test]
    fn fractions_out_of_range_are_refused() {
        for bad in [["--warmup", "1"], ["--warmup", "-0.1"], ["--max-drift", "nan"], ["--max-drift", "2"]] {
            assert!(Cli::try_parse_from(["kazeia-soak"].iter().chain(&bad)).is_err(), "{bad:?}");
        }
        let a = args(&["--warmup", "0.9", "--max-drift", "0"]);
        assert_eq!((a.warmup, a.max_drift), (0.9, 0.0));
    }

    #[test]
    fn a_write_that_fails_at_the_end_is_a_failure_of_the_verdict() {
        let dir = tempfile::tempdir().unwrap();
        let (plot, csv) = (dir.path().join("gone/m.png"), dir.path().join("m.csv"));
        let a = args(&["--plot", plot.to_str().unwrap(), "--csv", csv.to_str().unwrap()]);
        let samples = [Sample { t_s: 0.0, rss_bytes: 1 << 20, anon_bytes: 1 << 19, fds: 9, threads: 3, turns: 0 }];
        let failures = write_outputs(&a, &samples, 1 << 30, "test");
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].starts_with(&format!("cannot write the plot to {}: ", plot.display())), "{failures:?}");
        assert!(csv.is_file(), "the CSV is still written");
    }
}
