//! bench-voice: what a voice user waits, from the end of their question to the first sound of
//! the answer. Our daemon's `voice` pipeline (end-of-turn model, Whisper, both guards, the
//! Thinker, TTS) against a reference cascade of the usual peers with no guard at all
//! (tools/reference-voice: Silero VAD ending the turn after 0.8 s of silence, faster-whisper on
//! the same Whisper weights, llama-server on the same GGUF until the first sentence ends, then
//! piper-tts with the same voice, espeak-ng for French as ours). Same clips for both, streamed as
//! a microphone does: 100 ms frames at wall-clock pace, no `last` flag. Measured from the wall
//! time the frame holding the last speech sample was sent to the first reply audio (ours: the
//! first audio frame received on the socket; the reference: its first synthesised chunk).
//!
//! Clips: questions spoken by the Piper voice (English, without its sampled noise) and by
//! espeak-ng (English, French), 1-6 s of speech then 2 s of silence. Each side gets one warm-up
//! turn; reps alternate which side goes first. Our `done` metrics give the per-stage table, and
//! the daemon's CPU time in each wait (/proc, all threads) the work behind it: on 2 cores a
//! stage is made faster only by taking the cores from another one unless that work shrinks
//! (session 22: a median 1640-1970 core-ms per wait, so at least 820-985 ms on 2 cores).
//! Last line: `voice p50_ms=<x> p95_ms=<y> reference_p50_ms=<z> ratio=<x/z>`.
//!
//! Run it through `tools/bench-voice`, which builds both sides.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use kazeia_daemon::config::Config;
use kazeia_daemon::speech::{audio, Backend, Piper, Voice};
use kazeia_ipc::{AudioFrame, AudioSpec, Client, Event, Frame, Incoming, Metrics, Request, StopReason, TurnOptions};
use kazeia_tools::{median, Kill};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "models.toml")]
    config: PathBuf,
    /// The kazeia binary.
    #[arg(long)]
    kazeia: PathBuf,
    #[arg(long)]
    llama_server: PathBuf,
    #[arg(long, default_value_t = 3, value_parser = kazeia_tools::at_least_one())]
    reps: usize,
    /// Three clips (a voice and language each), one rep (about a minute): test.sh runs this so
    /// the tool cannot break unseen.
    #[arg(long)]
    smoke: bool,
}

/// (voice, language, question): `piper` is the English neural voice, `espeak` espeak-ng.
const CLIPS: &[(&str, &str, &str)] = &[
    ("piper", "en", "What is the capital of France?"),
    ("piper", "en", "How far is the moon from the earth?"),
    ("piper", "en", "Can you give me a simple recipe for pancakes?"),
    ("piper", "en", "Why is the sky blue during the day?"),
    ("espeak", "en", "What time does the sun set in winter?"),
    ("espeak", "en", "Tell me a fun fact about octopuses."),
    ("espeak", "fr", "Quelle est la capitale de l'Italie ?"),
    ("espeak", "fr", "Peux-tu me donner une idée de dîner rapide ?"),
    ("espeak", "fr", "Combien de jours y a-t-il dans une année bissextile ?"),
];
const WARM_UP: (&str, &str, &str) = ("piper", "en", "Hello, how are you today?");
/// The reply's length on both sides (tools/reference-voice asks llama-server for 128): the rest
/// of the reply is generated while its first sentence is spoken, on both sides.
const MAX_TOKENS: u32 = 128;

/// A clip: 16 kHz mono, where its speech ends, and the WAV the reference reads.
struct Clip {
    language: &'static str,
    text: &'static str,
    samples: Vec<f32>,
    speech_end: usize,
    wav: PathBuf,
}

fn make_clip(
    config: &Config,
    dir: &Path,
    n: usize,
    (voice, language, text): (&str, &'static str, &'static str),
) -> Result<Clip> {
    let mut v: Box<dyn Voice> = match voice {
        "piper" => {
            let path = config.cache_path(Path::new(&config.speech.voices["en"]));
            Box::new(Piper::load(&path, 2, Backend::Cpu)?.without_noise())
        }
        _ => Box::new(kazeia_daemon::speech::Espeak { voice: language.to_string() }),
    };
    let mut samples = audio::resample(&v.synthesize(text)?, v.sample_rate(), 16_000);
    // The voice's own quiet tail is not speech.
    let speech_end = samples.iter().rposition(|x| x.abs() > 0.01).map_or(samples.len(), |i| i + 1);
    samples.truncate(speech_end);
    samples.extend(vec![0.0; 32_000]);
    let wav = dir.join(format!("clip{n}.wav"));
    audio::write_wav(&wav, &samples, 16_000)?;
    Ok(Clip { language, text, samples, speech_end, wav })
}

/// What one turn gave: the wait, our daemon's stage metrics, and the CPU time the daemon used
/// during the wait (all its threads, ms; None where /proc cannot tell).
struct Heard {
    wait_ms: f64,
    metrics: Option<Metrics>,
    cpu_ms: Option<f64>,
}

/// Our side: stream `clip` into a `voice` turn at microphone pace, then microphone silence
/// until the turn ends. None when no reply audio came (the guard blocked it). `daemon`: the
/// daemon's pid, whose CPU time is read when the last speech frame leaves and when the first
/// audio frame comes.
async fn ours(client: &Client, clip: &Clip, daemon: u32) -> Result<Option<Heard>> {
    let id = client.new_id();
    let req = Request::Turn {
        id: id.clone(),
        pipeline: "voice".into(),
        text: None,
        audio: Some(AudioSpec { sample_rate: 16_000, channels: 1 }),
        session: None,
        options: TurnOptions {
            temperature: Some(0.0),
            seed: Some(1),
            max_tokens: Some(MAX_TOKENS),
            ..Default::default()
        },
    };
    let mut rx = client.send(req).await?;
    let silence = vec![0.0f32; 1_600];
    let t0 = tokio::time::Instant::now();
    let (mut k, mut last_speech_sent, mut first_audio) = (0usize, None, None);
    let (mut cpu_at_speech_end, mut cpu_at_audio) = (None, None);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(t0 + Duration::from_millis(100 * k as u64)) => {
                let chunk = clip.samples.get(k * 1_600..((k + 1) * 1_600).min(clip.samples.len())).unwrap_or(&silence);
                let chunk = if chunk.is_empty() { &silence[..] } else { chunk };
                let frame = AudioFrame { id: id.clone(), sample_rate: 16_000, channels: 1, last: false, pcm: audio::to_s16le(chunk).into() };
                client.send_frame(Frame::Audio(frame)).await?;
                k += 1;
                if last_speech_sent.is_none() && k * 1_600 >= clip.speech_end {
                    last_speech_sent = Some(Instant::now());
                    cpu_at_speech_end = kazeia_tools::process_cpu_ms(daemon);
                }
                if k > 600 {
                    bail!("no end of turn after 60 s of audio");
                }
            }
            item = rx.recv() => match item.context("the connection closed")? {
                Incoming::Audio(a) if !a.pcm.is_empty() && first_audio.is_none() => {
                    first_audio = Some(Instant::now());
                    cpu_at_audio = kazeia_tools::process_cpu_ms(daemon);
                }
                Incoming::Event(Event::Done { metrics, stop, .. }) => {
                    let (Some(start), Some(at)) = (last_speech_sent, first_audio) else {
                        // No audio: the guard's refusal is a turn the bench leaves out (both
                        // sides'); anything else (an empty transcript, a voice that said
                        // nothing) is a failure, not a turn to drop from the medians.
                        if stop == StopReason::Blocked {
                            return Ok(None);
                        }
                        bail!("{}: the turn ended ({stop:?}) with no reply audio", clip.text);
                    };
                    let wait_ms = at.duration_since(start).as_secs_f64() * 1e3;
                    let cpu_ms = cpu_at_speech_end.zip(cpu_at_audio).map(|(a, b)| b - a);
                    return Ok(Some(Heard { wait_ms, metrics: Some(metrics), cpu_ms }));
                }
                Incoming::Event(Event::Error { message, is_final: true, .. }) => bail!("{}: {message}", clip.text),
                _ => {}
            }
        }
    }
}

/// The reference cascade, one process for the whole run.
struct Reference {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Reference {
    fn start(args: &Args, config: &Config) -> Result<(Reference, String)> {
        let m = config.model("thinker")?;
        // llama-server as bench-socket runs it: our role's batch sizes, flash attention and load
        // mode, one slot, on the CPU; the prompt as our engine renders it (`--no-jinja`: the
        // GGUF's Jinja template adds a system message that ours does not, so the two sides
        // answered different prompts, and the first sentences differed).
        let server_args = [
            "-np 1".to_string(),
            "--no-jinja".to_string(),
            format!("-tb {}", m.threads),
            format!("-b {} -ub {}", m.n_batch, m.n_ubatch),
            format!("-fa {}", m.flash_attn.as_str()),
            format!("--load-mode {}", if m.mmap { "mmap" } else { "none" }),
            "-ngl 0".to_string(),
        ]
        .join(" ");
        let mut child = kazeia_tools::dies_with_us(&mut Command::new("python3"))
            .arg("tools/reference-voice")
            .arg("--serve")
            .arg("--gguf")
            .arg(config.model_path(m))
            .arg("--llama-server")
            .arg(&args.llama_server)
            .args(["--threads", &m.threads.to_string(), "--ctx", &m.n_ctx.to_string(), "--server-args", &server_args])
            // Greedy on both sides, and the same penalty (llama-server's default is none).
            .args(["--repeat-penalty", &m.sampling.repeat_penalty.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("start tools/reference-voice")?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("stdout")?);
        // Owned from here: a failed start stops the child (Drop), not leaves it running.
        let mut reference = Reference { child, stdin: Some(stdin), stdout };
        let mut line = String::new();
        reference.stdout.read_line(&mut line)?;
        let ready: serde_json::Value = serde_json::from_str(&line).with_context(|| format!("reference: {line:?}"))?;
        let command = ready["llama_server"].as_str().unwrap_or_default().to_string();
        Ok((reference, command))
    }

    fn turn(&mut self, clip: &Clip) -> Result<serde_json::Value> {
        let req = serde_json::json!({
            "file": clip.wav, "language": clip.language, "speech_end_s": clip.speech_end as f64 / 16_000.0,
        });
        let stdin = self.stdin.as_mut().context("the reference was stopped")?;
        writeln!(stdin, "{req}")?;
        stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        let v: serde_json::Value = serde_json::from_str(&line).with_context(|| format!("reference: {line:?}"))?;
        if let Some(e) = v["error"].as_str() {
            bail!("reference on {:?}: {e}", clip.text);
        }
        Ok(v)
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        // EOF on its stdin stops it and its llama-server; killed only if it does not go.
        drop(self.stdin.take());
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Nearest-rank percentile.
fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    // The smoke: one clip of each voice and language (Piper English, espeak-ng English and
    // French), so that no side's path for any of them breaks unseen.
    let smoke_clips = [CLIPS[0], CLIPS[4], CLIPS[6]];
    let clips_wanted: &[_] = if args.smoke { &smoke_clips } else { CLIPS };
    if args.smoke {
        args.reps = 1;
    }
    let config = Config::load(&args.config)?;
    let dir = tempfile::tempdir()?;
    let warm = make_clip(&config, dir.path(), 99, WARM_UP)?;
    let clips: Vec<Clip> =
        clips_wanted.iter().enumerate().map(|(n, c)| make_clip(&config, dir.path(), n, *c)).collect::<Result<_>>()?;

    // Our daemon on the config as shipped, on a private socket (in a directory it creates 0700).
    let socket = dir.path().join("run").join("engine.sock");
    let daemon = Kill::spawn(
        Command::new(&args.kazeia)
            .args(["serve", "--config", &args.config.display().to_string(), "--socket", &socket.display().to_string()])
            // The server's info lines: the speech preload says when it is done.
            .env("RUST_LOG", kazeia_tools::daemon_log_filter())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("kazeia.log"))?),
    )
    .context("start kazeia serve")?;
    let t = Instant::now();
    let client = loop {
        if let Ok(c) = Client::connect(&socket, "bench-voice").await {
            break c;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let log = std::fs::read_to_string(dir.path().join("kazeia.log")).unwrap_or_default();
            bail!("kazeia serve did not start; its log:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (mut reference, command) = Reference::start(&args, &config)?;
    println!(
        "bench-voice: {} clips x {} reps, 100 ms frames at wall-clock pace, no `last` flag",
        clips.len(),
        args.reps
    );
    println!("ours: kazeia serve --config {} (pipeline voice: end-of-turn model, both guards)", args.config.display());
    println!("reference: tools/reference-voice (Silero VAD 0.8 s, faster-whisper, no guard, piper-tts / espeak-ng); {command}");

    // Warm-up: our first turn after start, as a user waits after the service was restarted
    // (Android stops idle ones), once the daemon's preloads are done (as the reference warms all
    // its parts before it says it is ready). Reported, not in the medians.
    let log = dir.path().join("kazeia.log");
    while !kazeia_tools::speech_preload_done(&config, &log) {
        if t.elapsed() > Duration::from_secs(120) {
            bail!("the speech preload did not end in 120 s; the daemon's log:\n{}", std::fs::read_to_string(&log)?);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let preloaded =
        client.status().await?.models.iter().any(|m| m.role == "stt" && m.state == kazeia_ipc::ModelState::Loaded);
    if let Some(ms) = kazeia_tools::speech_preload_ms(&log) {
        println!(
            "ours: speech models preloaded and warmed in {ms} ms after the language models, {:.1} s after start",
            t.elapsed().as_secs_f64()
        );
    }
    let pid = daemon.0.id();
    let cold = ours(&client, &warm, pid).await.context("our warm-up turn")?;
    let preloaded =
        if preloaded { "once the speech models were preloaded" } else { "the speech models loading with it" };
    let cold_metrics = cold.as_ref().and_then(|h| h.metrics.clone());
    let stage = |f: &dyn Fn(&Metrics) -> Option<f64>| {
        cold_metrics.as_ref().and_then(f).map_or("-".into(), |v| format!("{v:.0}"))
    };
    println!(
        "ours, first turn after start ({preloaded}): {} ms (end of turn {}, STT {}, input guard {}, first sentence {}, TTS {})",
        cold.as_ref().map_or("blocked".into(), |h| format!("{:.0}", h.wait_ms)),
        stage(&|m| m.end_of_turn_ms),
        stage(&|m| m.stt_ms),
        stage(&|m| m.guard_in_ms),
        stage(&|m| m.ttfs_ms),
        stage(&|m| m.tts_first_ms),
    );
    reference.turn(&warm).context("the reference's warm-up turn")?;

    let (mut our_waits, mut their_waits, mut blocked) = (Vec::new(), Vec::new(), 0);
    let mut stages: Vec<Metrics> = Vec::new();
    // Per turn: (the wait, the daemon's CPU time during it), ms.
    let mut work: Vec<(f64, f64)> = Vec::new();
    let mut their_stages: Vec<serde_json::Value> = Vec::new();
    // `daemon ms`: the daemon's own estimate (speech_end_to_audio_ms), from where its VAD put
    // the end of speech (up to ~120 ms after the sound) and with the 100 ms frames' timing.
    // `cpu ms`: the daemon's CPU time during our wait, all threads.
    println!(
        "{:>3} {:<7} {:<3} {:>9} {:>9} {:>9} {:>9}  question",
        "rep", "voice", "", "ours ms", "daemon ms", "cpu ms", "ref ms"
    );
    for rep in 0..args.reps {
        for (n, clip) in clips.iter().enumerate() {
            let run_ours = || ours(&client, clip, pid);
            let (mine, theirs) = if (rep + n) % 2 == 0 {
                let a = run_ours().await?;
                (a, reference.turn(clip)?)
            } else {
                let b = reference.turn(clip)?;
                (run_ours().await?, b)
            };
            let their_ms = theirs["latency_ms"].as_f64().context("reference latency_ms")?;
            let (mine_ms, daemon_ms, cpu_ms) = match mine {
                Some(h) => {
                    // Paired: a clip our guard blocked leaves the reference's medians too.
                    their_waits.push(their_ms);
                    their_stages.push(theirs);
                    our_waits.push(h.wait_ms);
                    let daemon = h.metrics.as_ref().and_then(|m| m.speech_end_to_audio_ms);
                    stages.extend(h.metrics);
                    work.extend(h.cpu_ms.map(|c| (h.wait_ms, c)));
                    let ms = |v: Option<f64>| v.map_or("-".into(), |d| format!("{d:.0}"));
                    (format!("{:.0}", h.wait_ms), ms(daemon), ms(h.cpu_ms))
                }
                None => {
                    blocked += 1;
                    ("blocked".into(), "-".into(), "-".into())
                }
            };
            let voice = clips_wanted[n].0;
            println!(
                "{rep:>3} {voice:<7} {:<3} {mine_ms:>9} {daemon_ms:>9} {cpu_ms:>9} {their_ms:>9.0}  {}",
                clip.language, clip.text
            );
        }
    }
    if our_waits.is_empty() {
        bail!("every turn of ours was blocked by the guard ({blocked})");
    }
    let med = |f: &dyn Fn(&Metrics) -> Option<f64>| {
        let v: Vec<f64> = stages.iter().filter_map(f).collect();
        if v.is_empty() {
            "-".to_string()
        } else {
            format!("{:.0}", median(v))
        }
    };
    let their = |k: &str| {
        let v: Vec<f64> = their_stages.iter().filter_map(|s| s[k].as_f64()).collect();
        if v.is_empty() {
            "-".to_string()
        } else {
            format!("{:.0}", median(v))
        }
    };
    println!("stages, medians (ms)        ours    reference");
    println!("  end of turn               {:>6}    {:>6}", med(&|m| m.end_of_turn_ms), their("end_of_turn_ms"));
    println!(
        "   of which the verdict     {:>6}         -  (the end-of-turn model)",
        med(&|m| m.turn_check_ms.map(f64::from))
    );
    println!("  STT                       {:>6}    {:>6}", med(&|m| m.stt_ms), their("stt_ms"));
    println!("  input guard               {:>6}         -", med(&|m| m.guard_in_ms));
    println!("  first sentence (released) {:>6}    {:>6}", med(&|m| m.ttfs_ms), their("llm_first_sentence_ms"));
    println!("  TTS first audio           {:>6}    {:>6}", med(&|m| m.tts_first_ms), their("tts_first_ms"));
    println!(
        "  speech end -> audio       {:>6}         -  (the daemon's own estimate)",
        med(&|m| m.speech_end_to_audio_ms)
    );
    // The work behind the wait: on `cores` cores the daemon cannot do it in less than
    // cpu / cores, whatever the order; `busy` says how much of the wait the cores were used.
    if !work.is_empty() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let cpu = median(work.iter().map(|w| w.1).collect());
        let busy = median(work.iter().map(|w| w.1 / (w.0 * cores)).collect());
        println!(
            "  daemon CPU in the wait     {cpu:>6.0} ms  (all threads; on {cores} cores at least {:.0} ms of wait; cores busy {:.0}% of it)",
            cpu / cores,
            busy * 1e2
        );
    }
    println!("blocked by our guard and left out: {blocked}");
    let (p50, p95, ref_p50) = (median(our_waits.clone()), percentile(our_waits, 95.0), median(their_waits));
    if let Some(keep) = std::env::var_os("BENCH_VOICE_DAEMON_LOG") {
        std::fs::copy(dir.path().join("kazeia.log"), keep)?;
    }
    println!("voice p50_ms={p50:.0} p95_ms={p95:.0} reference_p50_ms={ref_p50:.0} ratio={:.3}", p50 / ref_p50);
    Ok(())
}
