//! `kazeia soak`: hold a running daemon under mixed traffic and faults for N turns, sample its
//! process, and judge: never over budget, no RSS drift, no FD or thread growth. Writes a CSV
//! and a PNG plot of memory over time.

mod report;
mod sample;
mod workload;

pub use report::{judge, plot, write_csv, Verdict};
pub use sample::{sample, Sample};

use std::path::PathBuf;
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
    /// Fraction of the samples treated as warm-up and left out of the drift checks.
    #[arg(long, default_value_t = 0.1)]
    pub warmup: f64,
    /// Largest RSS drift allowed between the first and the last tenth after warm-up.
    #[arg(long, default_value_t = 0.02)]
    pub max_drift: f64,
    /// Seed of the traffic (the same seed replays the same choices).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the plot of memory over time here (PNG).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write the samples here (CSV).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Run the soak; Ok(verdict) whether it passed or not (the caller sets the exit code).
pub async fn run(args: SoakArgs, socket: PathBuf) -> Result<Verdict> {
    let probe =
        Client::connect(&socket, "kazeia-soak").await.map_err(|e| anyhow!("connect {}: {e}", socket.display()))?;
    let status = probe.status().await.map_err(|e| anyhow!("status: {e}"))?;
    let pid = status.pid;
    let budget = status.budget_bytes;
    // Language-model roles only: the speech models load with audio turns, not by request.
    let roles: Vec<String> =
        status.models.iter().filter(|m| m.architecture.as_deref() != Some("onnx")).map(|m| m.role.clone()).collect();
    drop(probe);
    tracing::info!(pid, budget, ?roles, "soaking the daemon: {} turns, {} clients", args.turns, args.clients);

    let plan = Arc::new(workload::Plan {
        socket: socket.clone(),
        turns: args.turns,
        max_tokens: args.max_tokens,
        roles,
        pipelines: status.pipelines.clone(),
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
                    progress.set_message(format!("RSS {:.0} MiB  fds {}  threads {}", s.rss_bytes as f64 / 1048576.0, s.fds, s.threads));
                }
            }
        }
    }
    progress.finish_and_clear();
    // A last sample after the traffic, then stop the sampler.
    tokio::time::sleep(Duration::from_millis(args.interval_ms)).await;
    stop.cancel();
    sampler.await?.map_err(|e: sample::SampleError| anyhow!("{e}"))?;

    let samples = std::mem::take(&mut *samples.lock().expect("samples"));
    let mut verdict = judge(&samples, budget, args.warmup, args.max_drift);
    for e in client_errors {
        verdict.failures.push(format!("a client stopped: {e}"));
    }
    if let Some(p) = &args.csv {
        write_csv(p, &samples, budget).map_err(|e| anyhow!("{}: {e}", p.display()))?;
    }
    if let Some(p) = &args.plot {
        let title = format!("kazeia soak: {} turns, {} clients — daemon pid {pid}", args.turns, args.clients);
        plot(p, &samples, budget, &title).map_err(|e| anyhow!(e))?;
    }
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
        "peak_rss_bytes": verdict.peak_rss_bytes,
        "budget_bytes": verdict.budget_bytes,
        "rss_drift": verdict.rss_drift,
        "anon_drift": verdict.anon_drift,
        "fds_first_max": verdict.fds.0, "fds_last_min": verdict.fds.1,
        "threads_first_max": verdict.threads.0, "threads_last_min": verdict.threads.1,
        "failures": verdict.failures,
    });
    if args.json {
        println!("{summary}");
    } else {
        let mib = |b: u64| b as f64 / 1048576.0;
        println!(
            "{} turns in {:.0} s: {} done, {} cancelled, {} vanished, {} busy, {} reloads, {} errors",
            args.turns,
            start.elapsed().as_secs_f64(),
            get(&c.done),
            get(&c.cancelled),
            get(&c.vanished),
            get(&c.busy),
            get(&c.reloads),
            get(&c.errors)
        );
        println!(
            "peak RSS {:.1} MiB of a {:.1} MiB budget; RSS drift {:+.2}% (anon {:+.2}%); fds {} -> {}; threads {} -> {}",
            mib(verdict.peak_rss_bytes),
            mib(budget),
            verdict.rss_drift * 100.0,
            verdict.anon_drift * 100.0,
            verdict.fds.0,
            verdict.fds.1,
            verdict.threads.0,
            verdict.threads.1
        );
        for f in &verdict.failures {
            println!("FAIL: {f}");
        }
        println!("soak {}", if verdict.passed() { "passed" } else { "FAILED" });
    }
    Ok(verdict)
}
