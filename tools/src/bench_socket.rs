//! bench-socket: time to first token and decode speed, seen by a client, through our daemon's
//! socket against llama.cpp's `llama-server` over HTTP with streaming. Same model, same prompt,
//! same threads, context and batch sizes, flash attention and load mode (printed); greedy with
//! no repeat penalty on both sides (our daemon runs a copy of the config with the penalty off).
//! Each request starts with a new request number, so neither side can reuse the previous prompt
//! beyond the chat template's fixed opening (both reuse that: llama-server's `cache_prompt`, our
//! context's prefix cache). Both are warmed by one request.
//! Alternated, medians.
//!
//! Run it through `tools/bench-socket`, which builds llama-server from the same llama.cpp tree.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use kazeia_daemon::config::Config;
use kazeia_ipc::{Client, Event, Incoming, TurnOptions};
use kazeia_tools::{median, Kill};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "models.toml")]
    config: PathBuf,
    #[arg(long, default_value = "thinker")]
    role: String,
    /// The kazeia binary.
    #[arg(long)]
    kazeia: PathBuf,
    #[arg(long)]
    llama_server: PathBuf,
    #[arg(long, default_value = "")]
    reference: String,
    #[arg(long, default_value_t = 7, value_parser = kazeia_tools::at_least_one())]
    reps: usize,
    #[arg(long, default_value_t = 128)]
    max_tokens: u32,
    /// One rep on tiny inputs (seconds): test.sh runs this so the tool cannot break unseen.
    #[arg(long)]
    smoke: bool,
}

const PROMPT: &str = "You are helping a traveller plan a week in France. They like museums, long walks, \
bakeries and trains, and they dislike crowds and driving. They will arrive in Paris on a Monday morning \
and leave from Marseille the following Sunday evening. Describe, day by day, a calm itinerary with one \
main visit per day, the train legs between cities, and one bakery worth a detour in each city.";

/// What the client saw: (ttft ms, decode tok/s, tokens).
#[derive(Debug, Clone, Copy)]
struct Seen {
    ttft_ms: f64,
    decode_tok_s: f64,
    tokens: usize,
}

fn seen(start: Instant, stamps: &[Instant]) -> Result<Seen> {
    if stamps.len() < 2 {
        bail!("only {} tokens streamed", stamps.len());
    }
    let ttft_ms = (stamps[0] - start).as_secs_f64() * 1e3;
    let span = (*stamps.last().unwrap() - stamps[0]).as_secs_f64();
    Ok(Seen { ttft_ms, decode_tok_s: (stamps.len() - 1) as f64 / span, tokens: stamps.len() })
}

fn prompt(n: usize) -> String {
    format!("Request {n}. {PROMPT}")
}

async fn ours(client: &Client, n: usize, max_tokens: u32) -> Result<Seen> {
    let id = client.new_id();
    let start = Instant::now();
    let mut rx = client
        .turn(
            &id,
            "chat",
            &prompt(n),
            TurnOptions { temperature: Some(0.0), seed: Some(1), max_tokens: Some(max_tokens), ..Default::default() },
        )
        .await?;
    let mut stamps = Vec::new();
    while let Some(item) = rx.recv().await {
        match item {
            Incoming::Event(Event::Token { .. }) => stamps.push(Instant::now()),
            Incoming::Event(Event::Done { .. }) => return seen(start, &stamps),
            Incoming::Event(Event::Error { message, .. }) => bail!("{message}"),
            _ => {}
        }
    }
    bail!("daemon closed the connection")
}

fn theirs(port: u16, n: usize, max_tokens: u32) -> Result<Seen> {
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": prompt(n)}],
        "stream": true, "temperature": 0.0, "repeat_penalty": 1.0, "seed": 1, "max_tokens": max_tokens,
        "cache_prompt": true,
    });
    let start = Instant::now();
    let resp = ureq::post(&format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .context("llama-server request")?;
    let reader = BufReader::new(resp.into_body().into_reader());
    let mut stamps = Vec::new();
    for line in reader.lines() {
        let line = line?;
        let Some(data) = line.strip_prefix("data: ") else { continue };
        if data.trim() == "[DONE]" {
            break;
        }
        let v: serde_json::Value = serde_json::from_str(data)?;
        if v["choices"][0]["delta"]["content"].as_str().is_some_and(|s| !s.is_empty()) {
            stamps.push(Instant::now());
        }
    }
    seen(start, &stamps)
}

/// The config file with `role`'s repeat penalty set to 1.0 (none), as llama-server samples.
fn without_penalty(config: &Path, role: &str) -> Result<String> {
    let text = std::fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    let mut doc: toml::Table = toml::from_str(&text).with_context(|| format!("parsing {}", config.display()))?;
    let models = doc.get_mut("model").and_then(|m| m.as_array_mut()).context("no [[model]] in the config")?;
    let m = models
        .iter_mut()
        .filter_map(|m| m.as_table_mut())
        .find(|m| m.get("role").and_then(|r| r.as_str()) == Some(role))
        .with_context(|| format!("no model with role {role:?}"))?;
    let sampling = m.entry("sampling").or_insert_with(|| toml::Value::Table(Default::default()));
    sampling
        .as_table_mut()
        .context("`sampling` is not a table")?
        .insert("repeat_penalty".into(), toml::Value::Float(1.0));
    Ok(toml::to_string(&doc)?)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        (args.reps, args.max_tokens) = (1, 8);
    }
    let config = Config::load(&args.config)?;
    let m = config.model(&args.role)?.clone();
    let model = config.model_path(&m);

    // Our daemon, from the same config with the role sampling as llama-server does by default
    // (no repeat penalty; greedy by the request), on a private socket.
    let dir = tempfile::tempdir()?;
    let bench_config = dir.path().join("bench.toml");
    std::fs::write(&bench_config, without_penalty(&args.config, &args.role)?)?;
    // In a directory the daemon creates (0700): it refuses one other users can enter, and a
    // temporary directory is 0755.
    let socket = dir.path().join("run").join("engine.sock");
    let _daemon = Kill::spawn(
        Command::new(&args.kazeia)
            .args(["serve", "--config", &bench_config.display().to_string(), "--socket", &socket.display().to_string()])
            // The server's info lines: the speech preload says when it is done.
            .env("RUST_LOG", kazeia_tools::daemon_log_filter())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("kazeia.log"))?),
    )
    .context("start kazeia serve")?;
    // llama-server with the same model and settings, on a loopback port.
    let port = free_port();
    let server_args: Vec<String> = [
        "-m",
        &model.display().to_string(),
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "-t",
        &m.threads.to_string(),
        "-tb",
        &m.threads.to_string(),
        "-c",
        &m.n_ctx.to_string(),
        "-b",
        &m.n_batch.to_string(),
        "-ub",
        &m.n_ubatch.to_string(),
        "-fa",
        m.flash_attn.as_str(),
        "--load-mode",
        if m.mmap { "mmap" } else { "none" },
        "-np",
        "1",
        // The prompt as our engine renders it: the GGUF's Jinja template adds a system message.
        "--no-jinja",
        "-ngl",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _server =
        Kill::spawn(Command::new(&args.llama_server).args(&server_args).stdout(Stdio::null()).stderr(Stdio::null()))
            .context("start llama-server")?;

    // Wait for both to be ready (and the daemon's model loaded).
    let t = Instant::now();
    let client = loop {
        if let Ok(c) = Client::connect(&socket, "bench").await {
            if c.status()
                .await
                .map(|s| s.models.iter().any(|x| x.role == args.role && x.state == kazeia_ipc::ModelState::Loaded))
                .unwrap_or(false)
                // Not timed against the speech models' loads (`[speech] preload`) on the same cores.
                && kazeia_tools::speech_preload_done(&config, &dir.path().join("kazeia.log"))
            {
                break c;
            }
        }
        if t.elapsed() > Duration::from_secs(60) {
            let log = std::fs::read_to_string(dir.path().join("kazeia.log")).unwrap_or_default();
            bail!("kazeia serve did not become ready; its log:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    loop {
        if ureq::get(&format!("http://127.0.0.1:{port}/health")).call().is_ok() {
            break;
        }
        if t.elapsed() > Duration::from_secs(60) {
            bail!("llama-server did not become ready");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Warm-up on both.
    ours(&client, 1000, 8).await?;
    tokio::task::block_in_place(|| theirs(port, 1001, 8))?;

    println!(
        "model: {} ({} threads, n_ctx {}, n_batch {}, n_ubatch {}, flash_attn {:?}, mmap {}), greedy, no repeat penalty on either side, {} tokens max",
        model.display(),
        m.threads,
        m.n_ctx,
        m.n_batch,
        m.n_ubatch,
        m.flash_attn,
        m.mmap,
        args.max_tokens
    );
    println!("reference: {} {}", args.llama_server.display(), args.reference);
    println!("reference command: llama-server {}", server_args.join(" "));
    println!(
        "{:>4} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8}",
        "rep", "ours ttft", "ref ttft", "ours tok/s", "ref tok/s", "ours n", "ref n"
    );
    let (mut ot, mut rt, mut od, mut rd) = (vec![], vec![], vec![], vec![]);
    for rep in 0..args.reps {
        // Both sides get the same prompts (2·rep and 2·rep+1), in alternating order.
        let (a, b) = (2 * rep, 2 * rep + 1);
        let (o, r) = if rep % 2 == 0 {
            let o = ours(&client, a, args.max_tokens).await?;
            (o, tokio::task::block_in_place(|| theirs(port, a, args.max_tokens))?)
        } else {
            let r = tokio::task::block_in_place(|| theirs(port, b, args.max_tokens))?;
            (ours(&client, b, args.max_tokens).await?, r)
        };
        println!(
            "{rep:>4} {:>10.1}ms {:>10.1}ms {:>12.1} {:>12.1} {:>8} {:>8}",
            o.ttft_ms, r.ttft_ms, o.decode_tok_s, r.decode_tok_s, o.tokens, r.tokens
        );
        ot.push(o.ttft_ms);
        rt.push(r.ttft_ms);
        od.push(o.decode_tok_s);
        rd.push(r.decode_tok_s);
    }
    let (mot, mrt, mod_, mrd) = (median(ot), median(rt), median(od), median(rd));
    println!("median over {} reps: ttft ours {mot:.1} ms vs llama-server {mrt:.1} ms; decode ours {mod_:.1} vs llama-server {mrd:.1} tok/s", args.reps);
    println!("socket/llama-server ttft={:.3} decode={:.3}", mot / mrt, mod_ / mrd);
    Ok(())
}
