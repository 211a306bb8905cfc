//! Speech-to-text speed: our Whisper (ONNX Runtime, our log-mel and decoder) against
//! faster-whisper (CTranslate2) on the same Whisper-base weights (ours: the encoder int8 and the
//! decoder 8-bit, see tools/whisper-to-onnx; the reference int8 too, as faster-whisper advises
//! on a CPU: it was fp32 before session 38, which flattered our ratio), greedy, 2 threads, on
//! the same clips (the Piper voice: ~5 s and ~20 s). Each side runs in one process that loads
//! its model once (the reference: `tools/reference-stt --serve`), is warmed by one untimed run of
//! the clip, then the two alternate, each going first every other rep; medians. Model loading is
//! excluded on both. Last line: `stt rtf=<x> reference_rtf=<y> ratio=<x/y>`.
//! Before (our side warmed and first, the reference cold in a new process each rep): 0.609.
//!
//! `--margins 30,15,12`: word errors of our Whisper at each encoder window margin (the
//! silence after the audio in the window: `[speech] partial_margin` for partial transcripts),
//! on 180 clips: 37 English sentences by the Piper voice (its sampled noise off: the same audio
//! every run) and by espeak-ng, 16 French by espeak-ng, each clean and under seeded noise
//! (−39 dBFS RMS), the language detected among `[speech] languages` as the daemon's partials
//! have it (French WER 0.84-1.08 at every margin: Whisper base hears espeak-ng's French
//! poorly, so English carries the comparison). Beside them the reference, faster-whisper on the
//! same clips with whole windows and the language given (#12's bar: WER within +0.02 of it; our
//! 30 s row is the like-for-like one, as our side detects the language), and each side's WER on
//! the speech tests' own sentences alone (`tests_en`, `tests_fr`). How
//! the partials' 15 s was chosen (`kazeia_speech::whisper::PARTIAL_MARGIN`). Last line:
//! `stt margins reference: en=<wer> fr=<wer> tests_en=<wer> tests_fr=<wer>; <s>s: en=<wer> fr=<wer>
//! tests_en=<wer> tests_fr=<wer> changed=<n>/<clips> encoder_ms=<sum>; ...`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use kazeia_daemon::config::Config;
use kazeia_daemon::speech::wer::word_errors;
use kazeia_daemon::speech::{audio, voice, voice_for, Backend, Piper, Voice, VoiceSpec};
use kazeia_tools::median;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "models.toml")]
    config: PathBuf,
    #[arg(long, default_value_t = 5, value_parser = kazeia_tools::at_least_one())]
    reps: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// One rep on tiny inputs (seconds): test.sh runs this so the tool cannot break unseen.
    #[arg(long)]
    smoke: bool,
    /// Word errors at each of these margins (seconds, 1 to 30) instead of the speed run.
    #[arg(long, value_delimiter = ',')]
    margins: Vec<u64>,
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
        // From the checkout the wrapper runs in (tools/bench-stt cds to its root), not the one
        // this binary was built from: the build cache is shared by every clone, and a binary
        // built in a clone since deleted named a script that no longer existed.
        let mut child = Command::new("python3")
            .arg("tools/reference-stt")
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

    /// One transcription in `language`: (seconds, text), timed inside the reference's process.
    fn transcribe(&mut self, path: &Path, language: &str) -> Result<(f64, String)> {
        writeln!(self.stdin, "{}", serde_json::json!({"file": path, "language": language}))?;
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

/// The English sentences of `--margins` after [`SENTENCES`]: questions and requests as the
/// app hears them.
const MORE_ENGLISH: &[&str] = &[
    "What is the capital of France?",
    "How far is the moon from the earth?",
    "Can you give me a simple recipe for pancakes?",
    "Why is the sky blue during the day?",
    "What time does the sun set in winter?",
    "Tell me a fun fact about octopuses.",
    "Hello, how are you today?",
    "Good morning. The kitchen window is open.",
    "Fake bread is not the same as real bread.",
    "Could you remind me to call my mother tomorrow morning?",
    "The children played in the garden until it got dark.",
    "How many minutes should I boil an egg?",
    "Please turn off the lights in the living room.",
    "What is the difference between a virus and a bacterium?",
    "My flight to London was delayed by three hours.",
    "Can you recommend a good book about history?",
    "The museum is closed on Mondays and public holidays.",
    "I need to buy bread, cheese and a bottle of water.",
    "How do I reset the password on my phone?",
    "The concert starts at eight o'clock in the evening.",
    "Is it going to rain this weekend in Lyon?",
    "Write a short poem about the sea.",
    "The doctor told me to drink more water every day.",
    "What are the main ingredients of a Caesar salad?",
    "Set a timer for twenty five minutes.",
    "Our neighbours adopted a small black dog last month.",
    "Explain how a rainbow is formed.",
    "I left my keys on the kitchen table this morning.",
    "Which planet is the largest in our solar system?",
];

const FRENCH: &[&str] = &[
    "Bonjour, je voudrais réserver une table pour deux personnes.",
    "Il fait très beau aujourd'hui à Paris.",
    "Le chat dort sur le canapé depuis ce matin.",
    "Nous allons au marché acheter des légumes.",
    "Pouvez-vous m'aider à trouver la gare ?",
    "Quelle est la capitale de l'Italie ?",
    "Peux-tu me donner une idée de dîner rapide ?",
    "Combien de jours y a-t-il dans une année bissextile ?",
    "Quelle heure est-il à Montréal en ce moment ?",
    "J'aimerais écouter de la musique douce ce soir.",
    "Combien coûte un billet de train pour Lyon ?",
    "Peux-tu m'expliquer comment fonctionne un moteur électrique ?",
    "Rappelle-moi d'acheter du pain demain matin.",
    "Le musée ouvre ses portes à dix heures.",
    "Quel temps fera-t-il demain à Marseille ?",
    "Ma sœur habite dans une petite maison à la campagne.",
];

/// `--margins`: word errors per margin; the first margin's transcripts are the ones the others
/// are compared with.
fn margins(config: &Config, margins: &[u64], smoke: bool) -> Result<()> {
    anyhow::ensure!(margins.iter().all(|m| (1..=30).contains(m)), "--margins: seconds from 1 to 30");
    let e = |e: kazeia_daemon::speech::SpeechError| anyhow!("{e}");
    let piper_path = config.cache_path(Path::new(config.speech.voices.get("en").context("no English voice")?));
    let mut piper = Piper::load(&piper_path, 2, Backend::Cpu).map_err(e)?.without_noise();
    let mut espeak_en = voice(&VoiceSpec::Espeak("en".into()), 2, Backend::Cpu, false).map_err(e)?;
    let mut espeak_fr = voice(&VoiceSpec::Espeak("fr".into()), 2, Backend::Cpu, false).map_err(e)?;
    let take = |v: &'static [&'static str]| if smoke { &v[..1] } else { v };
    let mut clean: Vec<(&str, &str, Vec<f32>)> = Vec::new();
    for text in take(SENTENCES).iter().chain(take(MORE_ENGLISH)) {
        for v in [&mut piper as &mut dyn Voice, espeak_en.as_mut()] {
            let s = v.synthesize(text).map_err(e)?;
            clean.push(("en", text, audio::resample(&s, v.sample_rate(), 16_000)));
        }
    }
    for text in take(FRENCH) {
        let s = espeak_fr.synthesize(text).map_err(e)?;
        clean.push(("fr", text, audio::resample(&s, espeak_fr.sample_rate(), 16_000)));
    }
    // Each clip clean, then with 0.2 s before and 0.4 s after, under uniform noise of ±0.02
    // (−39 dBFS RMS; seeded).
    let mut seed = 7u64;
    let mut clips = Vec::new();
    for (lang, text, a) in clean {
        let padded = [vec![0.0; 3_200], a.clone(), vec![0.0; 6_400]].concat();
        let noisy = padded
            .iter()
            .map(|x| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                x + ((seed >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 0.04
            })
            .collect();
        clips.push((lang, text, a));
        clips.push((lang, text, noisy));
    }
    // The reference (faster-whisper, whole windows) on the same clips, the language given: the
    // bar #12 sets is WER within +0.02 of it.
    let dir = tempfile::tempdir()?;
    let mut reference = Reference::start(config.speech.threads)?;
    let mut theirs = Wer::default();
    for (i, (lang, text, clip)) in clips.iter().enumerate() {
        let path = dir.path().join(format!("{i}.wav"));
        audio::write_wav(&path, clip, 16_000).map_err(e)?;
        theirs.add(lang, text, &reference.transcribe(&path, lang)?.1);
    }
    drop(reference);
    let mut stt = kazeia_daemon::speech::transcriber(config).map_err(e)?;
    // The first run after a load is a whole window whatever the margin (the arena): untimed.
    stt.transcribe(&clips[0].2, None, &[], &|| false).map_err(e)?;
    let stop = kazeia_daemon::speech::Stop::new().map_err(e)?;
    println!(
        "{:>9} {:>7} {:>7} {:>9} {:>9} {:>9} {:>11}",
        "margin s", "en WER", "fr WER", "tests en", "tests fr", "changed", "encoder ms"
    );
    println!("{:>9} {}", "reference", theirs.columns());
    let mut first: Vec<String> = Vec::new();
    let mut last = Vec::new();
    for &m in margins {
        stt.partial_margin = m as usize * 100;
        let (mut ours, mut changed, mut encoder) = (Wer::default(), 0, 0.0);
        for (i, (lang, text, clip)) in clips.iter().enumerate() {
            let t = stt.transcribe_partial_until(clip, None, &[], &stop).map_err(e)?;
            ours.add(lang, text, &t.text);
            encoder += t.encoder_ms;
            match first.get(i) {
                None => first.push(t.text),
                Some(f) if *f != t.text => changed += 1,
                Some(_) => {}
            }
        }
        println!("{m:>9} {} {:>5}/{:<3} {encoder:>11.0}", ours.columns(), changed, clips.len());
        last.push(format!("{m}s: {} changed={changed}/{} encoder_ms={encoder:.0}", ours.pairs(), clips.len()));
    }
    println!("stt margins reference: {}; {}", theirs.pairs(), last.join("; "));
    Ok(())
}

/// Word errors and words, English and French, over all clips and over the speech tests' own
/// sentences (tests/tests/it/speech.rs: the first five of [`SENTENCES`] and of [`FRENCH`], here
/// by both English voices, clean and noisy).
#[derive(Default)]
struct Wer {
    all: [(usize, usize); 2],
    tests: [(usize, usize); 2],
}

impl Wer {
    fn add(&mut self, lang: &str, text: &str, heard: &str) {
        let (e, n) = word_errors(text, heard);
        let k = usize::from(lang == "fr");
        let add = |c: &mut (usize, usize)| *c = (c.0 + e, c.1 + n);
        add(&mut self.all[k]);
        if SENTENCES[..5].contains(&text) || FRENCH[..5].contains(&text) {
            add(&mut self.tests[k]);
        }
    }

    fn rates(&self) -> [f64; 4] {
        let r = |c: (usize, usize)| c.0 as f64 / c.1.max(1) as f64;
        [r(self.all[0]), r(self.all[1]), r(self.tests[0]), r(self.tests[1])]
    }

    fn columns(&self) -> String {
        let [en, fr, ten, tfr] = self.rates();
        format!("{en:>7.3} {fr:>7.3} {ten:>9.3} {tfr:>9.3}")
    }

    fn pairs(&self) -> String {
        let [en, fr, ten, tfr] = self.rates();
        format!("en={en:.3} fr={fr:.3} tests_en={ten:.3} tests_fr={tfr:.3}")
    }
}

fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.smoke {
        args.reps = 1;
    }
    let mut config = Config::load(&args.config).map_err(|e| anyhow!("{e}"))?;
    config.speech.threads = args.threads;
    if !args.margins.is_empty() {
        return margins(&config, &args.margins, args.smoke);
    }
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
    // Whole windows, as the reference runs them: not the daemon's English turn window
    // (`[speech] cut_languages`), so the ratio stays like for like with the earlier ones.
    stt.cut_languages.clear();
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
        reference.transcribe(path, "en")?;
        for rep in 0..args.reps {
            let (o, r) = if rep % 2 == 0 {
                let o = ours_once()?;
                (o, reference.transcribe(path, "en")?)
            } else {
                let r = reference.transcribe(path, "en")?;
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
    println!("reference: faster-whisper 1.2.1 (CTranslate2), int8, beam 1, temperature 0, {} threads; ours: ONNX Runtime 1.31.1 CPU, same weights (encoder int8, decoder 8-bit)", args.threads);
    let (x, y) = (ours_total / audio_total, ref_total / audio_total);
    println!("stt rtf={x:.3} reference_rtf={y:.3} ratio={:.3}", x / y);
    Ok(())
}
