//! Speech-to-text speed: our Whisper (ONNX Runtime, our log-mel and decoder) against
//! faster-whisper (CTranslate2) on the same Whisper-base weights (ours: the encoder int8 and the
//! decoder 8-bit, see tools/whisper-to-onnx; the reference fp32), greedy, 2 threads, on
//! the same clips (the Piper voice: ~5 s and ~20 s). Each side runs in one process that loads
//! its model once (the reference: `tools/reference-stt --serve`), is warmed by one untimed run of
//! the clip, then the two alternate, each going first every other rep; medians. Model loading is
//! excluded on both. Last line: `stt rtf=<x> reference_rtf=<y> ratio=<x/y>`.
//! Before (our side warmed and first, the reference cold in a new process each rep): 0.609.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
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

/// faster-whisper in one long-lived process: the model loads once, like ours.
struct Reference {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Reference {
    fn start(threads: usize) -> Result<Reference> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("reference-stt");
        let mut child = Command::new("python3")
            .arg(script)
            .args(["--serve", "--threads", &threads.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("python3 tools/reference-stt --serve")?;
        let stdin = child.stdin.take().context("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        let mut r = Reference { child, stdin, stdout };
        let ready = r.line()?;
        anyhow::ensure!(ready["ready"] == true, "reference-stt --serve said {ready}");
        Ok(r)
    }

    fn line(&mut self) -> Result<serde_json::Value> {
        let mut l = String::new();
        anyhow::ensure!(self.stdout.read_line(&mut l)? > 0, "reference-stt --serve exited");
        Ok(serde_json::from_str(&l)?)
    }

    /// One transcription: (seconds, text), timed inside the reference's process.
    fn transcribe(&mut self, path: &Path) -> Result<(f64, String)> {
        writeln!(self.stdin, "{}", serde_json::json!({"file": path, "language": "en"}))?;
        self.stdin.flush()?;
        let v = self.line()?;
        Ok((v["seconds"].as_f64().context("no seconds")?, v["text"].as_str().unwrap_or_default().to_string()))
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
    let mut reference = Reference::start(args.threads)?;
    println!(
        "{:<6} {:>7} {:>10} {:>10} {:>8}  transcripts (ours | reference)",
        "clip", "audio s", "ours rtf", "ref rtf", "ratio"
    );
    let (mut ours_total, mut ref_total, mut audio_total) = (0.0, 0.0, 0.0);
    for (path, samples, _said) in &clips {
        let secs = samples.len() as f64 / 16_000.0;
        let (mut ours, mut refs) = (Vec::new(), Vec::new());
        let (mut ours_text, mut ref_text) = (String::new(), String::new());
        let mut ours_once = || -> Result<(f64, String)> {
            let t = Instant::now();
            let samples = audio::read_wav(path).map_err(|e| anyhow!("{e}"))?;
            let text = stt.transcribe(&samples, Some("en"), &[], &|| false).map_err(|e| anyhow!("{e}"))?.text;
            Ok((t.elapsed().as_secs_f64(), text))
        };
        // Both warmed alike: one untimed run of this clip each.
        ours_once()?;
        reference.transcribe(path)?;
        for rep in 0..args.reps {
            let (o, r) = if rep % 2 == 0 {
                let o = ours_once()?;
                (o, reference.transcribe(path)?)
            } else {
                let r = reference.transcribe(path)?;
                (ours_once()?, r)
            };
            (ours_text, ref_text) = (o.1, r.1);
            ours.push(o.0);
            refs.push(r.0);
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
