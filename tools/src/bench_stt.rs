//! Speech-to-text speed: our Whisper (ONNX Runtime, our log-mel and decoder) against
//! faster-whisper (CTranslate2) on the same Whisper-base weights, fp32, greedy, 2 threads, on
//! the same clips (the Piper voice: ~5 s and ~20 s). Runs alternate between the two sides;
//! model loading is excluded on both. Last line: `stt rtf=<x> reference_rtf=<y> ratio=<x/y>`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use kazeia_daemon::config::Config;
use kazeia_daemon::speech::{audio, voice_for};
use kazeia_tools::median;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "models.toml")]
    config: PathBuf,
    #[arg(long, default_value_t = 5)]
    reps: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// One rep on tiny inputs (seconds): test.sh runs this so the tool cannot break unseen.
    #[arg(long)]
    smoke: bool,
}

const SENTENCES: &[&str] = &[
    "The weather is nice today and we will go to the park.",
    "Please send me the report before Friday afternoon.",
    "I would like a cup of coffee with a little milk.",
    "The train to the city leaves in ten minutes.",
    "She opened the window because the room was too warm.",
    "We should plan the meeting for next week on Tuesday.",
    "My brother lives in a small house near the river.",
    "Turn left at the second light and park behind the bakery.",
];

fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.reps = 1;
    }
    let mut config = Config::load(&args.config).map_err(|e| anyhow!("{e}"))?;
    config.speech.threads = args.threads;
    let dir = tempfile::tempdir()?;
    let mut voice = voice_for(&config, "en").map_err(|e| anyhow!("{e}"))?;
    let mut clip = |texts: &[&str], name: &str| -> Result<(PathBuf, Vec<f32>, String)> {
        let mut samples = Vec::new();
        for t in texts {
            let s = voice.synthesize(t).map_err(|e| anyhow!("{e}"))?;
            samples.extend(audio::resample(&s, voice.sample_rate(), 16_000));
            samples.extend(std::iter::repeat_n(0.0, 4_000));
        }
        let path = dir.path().join(name);
        audio::write_wav(&path, &samples, 16_000).map_err(|e| anyhow!("{e}"))?;
        Ok((path, samples, texts.join(" ")))
    };
    let clips = if args.smoke {
        vec![clip(&SENTENCES[..1], "short.wav")?]
    } else {
        vec![clip(&SENTENCES[..2], "short.wav")?, clip(SENTENCES, "long.wav")?]
    };
    let mut stt = kazeia_daemon::speech::transcriber(&config).map_err(|e| anyhow!("{e}"))?;
    let reference = Path::new(env!("CARGO_MANIFEST_DIR")).join("reference-stt");
    println!(
        "{:<6} {:>7} {:>10} {:>10} {:>8}  transcripts (ours | reference)",
        "clip", "audio s", "ours rtf", "ref rtf", "ratio"
    );
    let (mut ours_total, mut ref_total, mut audio_total) = (0.0, 0.0, 0.0);
    for (path, samples, _said) in &clips {
        let secs = samples.len() as f64 / 16_000.0;
        let (mut ours, mut refs) = (Vec::new(), Vec::new());
        let (mut ours_text, mut ref_text) = (String::new(), String::new());
        // Warm-up of our side (the reference warms up inside its own process).
        stt.transcribe(samples, Some("en"), &|| false).map_err(|e| anyhow!("{e}"))?;
        for _ in 0..args.reps {
            let t = Instant::now();
            let samples = audio::read_wav(path).map_err(|e| anyhow!("{e}"))?;
            ours_text = stt.transcribe(&samples, Some("en"), &|| false).map_err(|e| anyhow!("{e}"))?.text;
            ours.push(t.elapsed().as_secs_f64());
            let out = Command::new("python3")
                .arg(&reference)
                .args(["--language", "en", "--repeat", "2", "--threads", &args.threads.to_string()])
                .arg(path)
                .output()
                .context("python3 tools/reference-stt")?;
            anyhow::ensure!(out.status.success(), "reference-stt: {}", String::from_utf8_lossy(&out.stderr));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
            refs.push(v["seconds"].as_f64().unwrap_or(f64::NAN));
            ref_text = v["text"].as_str().unwrap_or_default().to_string();
        }
        let (o, r) = (median(ours), median(refs));
        println!(
            "{:<6} {:>7.1} {:>10.3} {:>10.3} {:>8.3}  {ours_text:?} | {ref_text:?}",
            path.file_stem().unwrap().to_string_lossy(),
            secs,
            o / secs,
            r / secs,
            o / r
        );
        ours_total += o;
        ref_total += r;
        audio_total += secs;
    }
    println!("reference: faster-whisper 1.2.1 (CTranslate2), fp32, beam 1, temperature 0, {} threads; ours: ONNX Runtime 1.31.1 CPU, same weights", args.threads);
    let (x, y) = (ours_total / audio_total, ref_total / audio_total);
    println!("stt rtf={x:.3} reference_rtf={y:.3} ratio={:.3}", x / y);
    Ok(())
}
