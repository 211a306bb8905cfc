//! Speech on real models through ONNX Runtime, on speech the tests make: English spoken by the
//! Piper voice, French spoken by espeak-ng. Whisper base through our ONNX graphs and decoder;
//! for French the reference implementation (faster-whisper, same weights) runs on the same
//! clips and sets the bar.

use std::path::{Path, PathBuf};
use std::process::Command;

use kazeia_daemon::config::Config;
use kazeia_daemon::speech::{audio, voice_for, SpeechError, Voice};
use kazeia_tests::{config, word_errors};

/// Speech tests share the two cores: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn cfg() -> Config {
    config("")
}

const ENGLISH: &[&str] = &[
    "The weather is nice today and we will go to the park.",
    "Please send me the report before Friday afternoon.",
    "I would like a cup of coffee with a little milk.",
    "The train to the city leaves in ten minutes.",
    "She opened the window because the room was too warm.",
];

const FRENCH: &[&str] = &[
    "Bonjour, je voudrais réserver une table pour deux personnes.",
    "Il fait très beau aujourd'hui à Paris.",
    "Le chat dort sur le canapé depuis ce matin.",
    "Nous allons au marché acheter des légumes.",
    "Pouvez-vous m'aider à trouver la gare ?",
];

/// `text` spoken by `voice`, at 16 kHz mono.
fn speak(voice: &mut dyn Voice, text: &str) -> Vec<f32> {
    let s = voice.synthesize(text).unwrap_or_else(|e| panic!("{}: {e}", voice.name()));
    audio::resample(&s, voice.sample_rate(), 16_000)
}

fn silence(seconds: f32) -> Vec<f32> {
    vec![0.0; (seconds * 16_000.0) as usize]
}

#[test]
fn english_from_the_piper_voice_transcribes_within_10_percent_wer() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg();
    let mut voice = voice_for(&c, "en").unwrap();
    assert!(voice.name().starts_with("piper"), "{}", voice.name());
    let mut stt = kazeia_daemon::speech::transcriber(&c).unwrap();
    let (mut errors, mut words) = (0, 0);
    for text in ENGLISH {
        let clip = speak(voice.as_mut(), text);
        let t = stt.transcribe(&clip, Some("en"), &[], &|| false).unwrap();
        let (e, n) = word_errors(text, &t.text);
        eprintln!("{e}/{n}  {text:?} -> {:?}", t.text);
        errors += e;
        words += n;
    }
    let wer = errors as f64 / words as f64;
    eprintln!("English (Piper) WER {wer:.3}");
    assert!(wer <= 0.10, "WER {wer:.3}");
}

#[test]
fn language_is_detected_among_the_configured_ones() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg();
    let mut stt = kazeia_daemon::speech::transcriber(&c).unwrap();
    // Every window whole first (`cut_languages` is below).
    stt.cut_languages.clear();
    let en = speak(voice_for(&c, "en").unwrap().as_mut(), ENGLISH[0]);
    let fr = speak(voice_for(&c, "fr").unwrap().as_mut(), FRENCH[2]);
    // Detection guesses the language it found last: first no guess, then a wrong one, then a
    // right one. Each gives the same transcript as the language given outright.
    let first = stt.transcribe(&en, None, &[], &|| false).unwrap();
    assert_eq!(first.language, "en");
    let wrong = stt.transcribe(&fr, None, &[], &|| false).unwrap();
    assert_eq!(wrong.language, "fr");
    let right = stt.transcribe(&fr, None, &[], &|| false).unwrap();
    let given = stt.transcribe(&fr, Some("fr"), &[], &|| false).unwrap();
    assert_eq!((&wrong.text, &right.text), (&given.text, &given.text));
    // Given: the prompt in one call. Guessed right: the same. Guessed wrong, or nothing to
    // guess: a second call for the prompt.
    assert_eq!(right.decoder_calls, given.decoder_calls, "{right:?}");
    assert_eq!(wrong.decoder_calls, given.decoder_calls + 1, "{wrong:?}");
    let again = stt.transcribe(&en, Some("en"), &[], &|| false).unwrap();
    assert_eq!(first.decoder_calls, again.decoder_calls + 1, "{first:?}");
    assert_eq!(first.text, again.text);

    // English cut (the default): French after English is guessed English, so its window is
    // cut; the detection finds French and the window runs again whole, in French.
    stt.cut_languages = vec!["en".into()];
    let guessed_french = stt.transcribe(&en, None, &[], &|| false).unwrap();
    assert_eq!((guessed_french.language.as_str(), guessed_french.frames), ("en", 3000));
    let english = stt.transcribe(&en, None, &[], &|| false).unwrap();
    assert!(english.frames < 3000, "{english:?}");
    let switched = stt.transcribe(&fr, None, &[], &|| false).unwrap();
    assert_eq!((switched.language.as_str(), switched.frames, &switched.text), ("fr", 3000, &given.text));
    assert!(switched.decoder_calls > given.decoder_calls, "{switched:?}");
}

#[test]
fn french_from_espeak_matches_the_reference_implementation() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg();
    let mut voice = voice_for(&c, "fr").unwrap();
    assert_eq!(voice.name(), "espeak-ng fr");
    let mut stt = kazeia_daemon::speech::transcriber(&c).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut files: Vec<PathBuf> = Vec::new();
    let mut ours = Vec::new();
    for (i, text) in FRENCH.iter().enumerate() {
        let clip = speak(voice.as_mut(), text);
        let f = dir.path().join(format!("fr{i}.wav"));
        audio::write_wav(&f, &clip, 16_000).unwrap();
        // Read back from the file, as the reference reads it.
        let t = stt.transcribe(&audio::read_wav(&f).unwrap(), Some("fr"), &[], &|| false).unwrap();
        ours.push(t.text);
        files.push(f);
    }
    let reference = reference_stt("fr", &files);
    let (mut ours_e, mut ref_e, mut words) = (0, 0, 0);
    for ((text, o), r) in FRENCH.iter().zip(&ours).zip(&reference) {
        let (e, n) = word_errors(text, o);
        let (re, _) = word_errors(text, r);
        eprintln!("ours {e}/{n} ref {re}/{n}  {text:?}\n   ours {o:?}\n   ref  {r:?}");
        ours_e += e;
        ref_e += re;
        words += n;
    }
    let (ours_wer, ref_wer) = (ours_e as f64 / words as f64, ref_e as f64 / words as f64);
    eprintln!("French (espeak-ng) WER ours {ours_wer:.3} reference {ref_wer:.3}");
    assert!(ours_wer <= ref_wer + 0.02, "ours {ours_wer:.3} vs reference {ref_wer:.3}");
}

/// Transcripts by tools/reference-stt (faster-whisper on the same CTranslate2 weights).
fn reference_stt(language: &str, files: &[PathBuf]) -> Vec<String> {
    let script = crate::repo().join("tools/reference-stt");
    let out =
        Command::new("python3").arg(&script).args(["--language", language]).args(files).output().expect("python3");
    assert!(out.status.success(), "reference-stt: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["text"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn vad_finds_the_utterance_bounds() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg();
    let mut voice = voice_for(&c, "en").unwrap();
    let (a, b) = (speak(voice.as_mut(), ENGLISH[0]), speak(voice.as_mut(), ENGLISH[1]));
    let mut rec = silence(1.0);
    let a_start = rec.len();
    rec.extend(&a);
    let a_end = rec.len();
    rec.extend(silence(1.5));
    let b_start = rec.len();
    rec.extend(&b);
    let b_end = rec.len();
    rec.extend(silence(1.0));
    let mut stt = kazeia_daemon::speech::transcriber(&c).unwrap();
    let segs = stt.vad.segments(&rec).unwrap();
    eprintln!("truth {a_start}..{a_end} {b_start}..{b_end}; VAD {segs:?}");
    assert_eq!(segs.len(), 2, "{segs:?}");
    // The voice's own lead-in and tail are quiet: within 300 ms of the clip bounds.
    let near = |x: usize, y: usize| (x as i64 - y as i64).abs() < 4_800;
    assert!(near(segs[0].start, a_start) && near(segs[0].end, a_end), "{segs:?}");
    assert!(near(segs[1].start, b_start) && near(segs[1].end, b_end), "{segs:?}");
}

/// With `quiet` (`[speech] vad_quiet`), a pause counts from the end of the sound: Silero's
/// probability stays high for a few chunks of silence after the last word (up to 119 ms here,
/// by where the chunks fall). Under a noise floor louder than `quiet`, the model's verdict
/// stands.
#[test]
fn a_pause_starts_where_the_sound_ends() {
    use kazeia_daemon::speech::vad::{Vad, VadParams, CHUNK};
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg();
    let mut voice = voice_for(&c, "fr").unwrap();
    let path = c.cache_path(&c.speech.vad);
    let silence_start = |audio: &[f32], quiet: f32| {
        let params = VadParams { quiet, ..VadParams::default() };
        let mut vad = Vad::load(&path, kazeia_memory_budget::Backend::Cpu, params).unwrap();
        let segs = vad.segments(audio).unwrap();
        assert_eq!(segs.len(), 1, "{segs:?}");
        vad.silence_start(&segs[0])
    };
    let quiet = kazeia_daemon::speech::vad::QUIET;
    let mut lagged = 0;
    let mut noisy = Vec::new();
    for text in ["Quelle est la capitale de l'Italie ?", "Peux-tu me donner une idée de dîner rapide ?"] {
        let said = speak(voice.as_mut(), text);
        let tail = said.iter().rposition(|x| x.abs() > 0.01).unwrap() + 1;
        // Where the chunks fall changes the model's lag: four offsets within one chunk.
        for lead in [0, 128, 256, 384] {
            let mut rec = vec![0.0; CHUNK + lead];
            rec.extend(&said[..tail]);
            let end = rec.len();
            rec.extend(silence(1.0));
            let (sound, model) = (silence_start(&rec, quiet), silence_start(&rec, 0.0));
            eprintln!("{text:?} +{lead}: silence from {sound}, the model alone {model}, the sound ends at {end}");
            assert!(sound + CHUNK > end && sound < end + CHUNK, "{sound} for a sound ending at {end}");
            assert!(sound <= model);
            lagged += usize::from(model >= end + CHUNK);
            noisy = rec;
        }
    }
    assert!(lagged >= 4, "the model alone lagged over a chunk {lagged} times in 8");
    // Noise at 5% of the speech's loudest chunk (-26 dB), over everything: no chunk is quiet.
    let rms = |c: &[f32]| (c.iter().map(|x| x * x).sum::<f32>() / c.len() as f32).sqrt();
    let loudest = noisy.chunks_exact(CHUNK).map(rms).fold(0.0, f32::max);
    let mut seed = 1u32;
    for x in &mut noisy {
        seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        // Uniform in ±a has an RMS of a/√3.
        *x += 0.05 * loudest * 3f32.sqrt() * ((seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0);
    }
    assert_eq!(silence_start(&noisy, quiet), silence_start(&noisy, 0.0));
    // A short word is an utterance or a click (`min_speech`) by the model's verdict, as without
    // the back-dating: "Bonjour" cut every 16 ms from 160 to 480 ms, at four places in a chunk,
    // each with the same outcome both ways.
    let word = speak(voice.as_mut(), "Bonjour.");
    let segments = |audio: &[f32], quiet: f32| {
        let params = VadParams { quiet, ..VadParams::default() };
        Vad::load(&path, kazeia_memory_budget::Backend::Cpu, params).unwrap().segments(audio).unwrap().len()
    };
    let onset = word.iter().position(|x| x.abs() > 0.01).unwrap();
    let mut found = Vec::new();
    for lead in [0, 128, 256, 384] {
        for ms in (160..=480).step_by(16) {
            let mut rec = vec![0.0; CHUNK * 8 + lead];
            rec.extend(&word[onset..(onset + ms * 16).min(word.len())]);
            rec.extend(silence(1.0));
            let n = segments(&rec, quiet);
            assert_eq!(n, segments(&rec, 0.0), "\"Bonjour\" cut at {ms} ms, +{lead}");
            found.push(n);
        }
    }
    assert!(found.contains(&0) && found.contains(&1), "the cuts straddle min_speech: {found:?}");
}

/// Barge-in counts speech with sound in it (`Vad::voiced`): the chunks of silence after a word
/// that Silero still calls speech are not counted, so a short sound stays short. Two French
/// questions at four offsets within a chunk: what is counted never passes the chunks the sound
/// spans, though the model calls speech after it (at least once here; else this proves nothing).
#[test]
fn voiced_speech_is_the_sound_not_the_models_lag() {
    use kazeia_daemon::speech::vad::{Vad, VadParams, CHUNK};
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg();
    let mut voice = voice_for(&c, "fr").unwrap();
    let path = c.cache_path(&c.speech.vad);
    let load = || Vad::load(&path, kazeia_memory_budget::Backend::Cpu, VadParams::default()).unwrap();
    let mut lagged = 0;
    for text in ["Quelle est la capitale de l'Italie ?", "Peux-tu me donner une idée de dîner rapide ?"] {
        let said = speak(voice.as_mut(), text);
        let onset = said.iter().position(|x| x.abs() > 0.01).unwrap();
        let tail = said.iter().rposition(|x| x.abs() > 0.01).unwrap() + 1;
        for lead in [0, 128, 256, 384] {
            let mut rec = vec![0.0; CHUNK + lead];
            rec.extend(&said[onset..tail]);
            let (first, last) = ((CHUNK + lead) / CHUNK, (rec.len() - 1) / CHUNK);
            rec.extend(silence(1.0));
            // The same model beside it, for its probability of each chunk.
            let (mut vad, mut model) = (load(), load());
            let mut most = 0;
            for (i, chunk) in rec.chunks_exact(CHUNK).enumerate() {
                vad.push(chunk).unwrap();
                most = most.max(vad.voiced());
                let p = model.probability(chunk).unwrap();
                lagged += usize::from(i > last && p >= VadParams::default().threshold);
            }
            let spans = (last - first + 1) * CHUNK;
            assert!(most > 0 && most <= spans, "{text:?} +{lead}: {most} voiced samples, the sound spans {spans}");
        }
    }
    assert!(lagged > 0, "the model never called a chunk of silence speech: nothing was tested");
}

#[test]
fn audio_over_30_seconds_is_cut_at_pauses() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg();
    let mut voice = voice_for(&c, "en").unwrap();
    let mut rec = Vec::new();
    let mut said = String::new();
    while rec.len() < 40 * 16_000 {
        for text in ENGLISH {
            rec.extend(speak(voice.as_mut(), text));
            rec.extend(silence(1.2));
            said.push_str(text);
            said.push(' ');
        }
    }
    let mut stt = kazeia_daemon::speech::transcriber(&c).unwrap();
    let windows = stt.windows(&rec).unwrap();
    assert!(windows.len() >= 2 && windows.iter().all(|w| w.end - w.start <= 30 * 16_000), "{windows:?}");
    let t = stt.transcribe(&rec, Some("en"), &[], &|| false).unwrap();
    let (e, n) = word_errors(&said, &t.text);
    eprintln!("{:.0} s in {} windows: WER {}/{n}", rec.len() as f64 / 16_000.0, windows.len(), e);
    assert!((e as f64 / n as f64) <= 0.10, "{:?}", t.text);
}

#[test]
fn a_corrupt_onnx_file_is_a_clear_error_and_text_keeps_working() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let good = cfg();
    let dir = tempfile::tempdir().unwrap();
    let stt = dir.path().join("whisper-broken");
    std::fs::create_dir(&stt).unwrap();
    for f in ["whisper.json", "vocabulary.txt", "decoder.onnx"] {
        std::os::unix::fs::symlink(good.cache_path(Path::new("whisper-base")).join(f), stt.join(f)).unwrap();
    }
    std::fs::write(stt.join("encoder.onnx"), b"\x08\x07 this is not a protobuf").unwrap();
    let mut c = good.clone();
    c.speech.stt = stt.clone();
    match kazeia_daemon::speech::transcriber(&c) {
        Err(SpeechError::BadModel { path, message }) => {
            assert_eq!(path, stt.join("encoder.onnx"));
            assert!(!message.is_empty());
        }
        Err(e) => panic!("expected BadModel, got {e}"),
        Ok(_) => panic!("a corrupt encoder loaded"),
    }
    c.speech.stt = dir.path().join("nowhere");
    assert!(matches!(kazeia_daemon::speech::transcriber(&c), Err(SpeechError::Missing(_))));
    // The text side is untouched: the LLM engine loads and answers in the same process.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use kazeia_pipelines::{ChatMessage, GenEvent, GenerateOptions, GenerateRequest, Llm};
        let c = config(&kazeia_tests::model_toml("thinker", &kazeia_tests::smollm2(), "n_ctx = 512"));
        let engine = kazeia_engine::Engine::new();
        let m = c.model("thinker").unwrap().clone();
        engine.load(&m.role_params(), c.model_path(&m), Box::new(|_| {})).unwrap();
        let req = GenerateRequest::new(
            "thinker",
            vec![ChatMessage::new("user", "What is the capital of France?")],
            GenerateOptions { max_tokens: Some(12), temperature: Some(0.0), ..Default::default() },
        );
        let mut rx = engine.generate(req, tokio_util::sync::CancellationToken::new()).unwrap();
        let mut text = String::new();
        while let Some(ev) = rx.recv().await {
            match ev {
                GenEvent::Token { text: t, .. } => text.push_str(&t),
                GenEvent::Finished(r) => {
                    r.unwrap();
                    break;
                }
                _ => {}
            }
        }
        assert!(text.contains("Paris"), "{text:?}");
    });
}

#[test]
fn log_mel_matches_the_reference_extractor() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg();
    let clip = speak(voice_for(&c, "en").unwrap().as_mut(), ENGLISH[2]);
    let dir = tempfile::tempdir().unwrap();
    let (wav, ours) = (dir.path().join("c.wav"), dir.path().join("mel.f32"));
    audio::write_wav(&wav, &clip, 16_000).unwrap();
    let mel = kazeia_daemon::speech::mel::Mel::new().compute(&audio::read_wav(&wav).unwrap());
    std::fs::write(&ours, mel.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
    // faster-whisper's extractor, then its pad_or_trim of all but the last frame.
    let py = "import sys, numpy as np\n\
from faster_whisper.feature_extractor import FeatureExtractor\n\
from faster_whisper.audio import decode_audio, pad_or_trim\n\
f = FeatureExtractor(feature_size=80)(decode_audio(sys.argv[1]))\n\
ref = pad_or_trim(f[:, : f.shape[-1] - 1])\n\
ours = np.fromfile(sys.argv[2], dtype=np.float32).reshape(80, 3000)\n\
print(float(np.abs(ref - ours).max()))";
    let out = Command::new("python3").args(["-c", py]).arg(&wav).arg(&ours).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let diff: f64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(diff < 1e-3, "largest difference {diff}");
}

/// The English Piper voice without its sampled noise: the same text gives the same audio.
fn english_piper(c: &Config) -> kazeia_daemon::speech::Piper {
    let piper = c.cache_path(Path::new(&c.speech.voices["en"]));
    kazeia_daemon::speech::Piper::load(&piper, 2, kazeia_daemon::speech::Backend::Cpu).unwrap().without_noise()
}

/// Text that starts like a command-line option (a markdown list item, a dash) is spoken whole:
/// the voices get their text on stdin, never as arguments. Before, `speak --text="- Paris is
/// the capital of France."` gave 0.3 s of audio. Each is as long as the same text without its
/// dash; the English ones are heard back by Whisper (espeak-ng's French is poor for Whisper
/// base whatever the text: its length is the check there).
#[test]
fn text_starting_with_a_dash_is_spoken_whole() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg();
    let mut stt = kazeia_daemon::speech::transcriber(&c).unwrap();
    let mut en = english_piper(&c);
    let mut fr = voice_for(&c, "fr").unwrap();
    let cases: [(&str, &str, &str); 3] = [
        ("en", "- Paris is the capital of France.", "Paris is the capital of France."),
        ("en", "--help me find the train station, please.", "help me find the train station, please."),
        ("fr", "- Paris est la capitale de la France.", "Paris est la capitale de la France."),
    ];
    for (lang, text, plain) in cases {
        let voice: &mut dyn Voice = if lang == "en" { &mut en } else { fr.as_mut() };
        let (clip, whole) = (speak(voice, text), speak(voice, plain));
        eprintln!("{text:?}: {} samples, {plain:?}: {}", clip.len(), whole.len());
        assert!(clip.len() * 5 >= whole.len() * 4, "{text:?}: {} samples against {}", clip.len(), whole.len());
        if lang == "en" {
            let heard = stt.transcribe(&clip, Some(lang), &[], &|| false).unwrap().text;
            let (e, n) = word_errors(plain, &heard);
            eprintln!("{text:?} -> {heard:?} ({e}/{n})");
            assert!(e * 4 <= n, "{text:?} was heard as {heard:?}");
        }
    }
}

/// Piper speaks a sentence clause by clause, and each clause in pieces: the whole graph hands
/// over one piece per clause, the split one (tools/piper-split) its vocoder's pieces, the first
/// of at most `FIRST_PIECE_FRAMES` latent frames, before the rest is decoded (the speaker sends
/// each piece's frames at once). The pieces joined are the sentence's audio, the split's the
/// whole graph's within 1e-4 of its peak, heard back whole.
#[test]
fn piper_hands_each_clause_over_as_soon_as_it_exists() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg();
    let mut stt = kazeia_daemon::speech::transcriber(&c).unwrap();
    let mut en = english_piper(&c);
    assert!(en.split(), "tools/fetch-models splits the voice: {}", en.name());
    let mut whole = whole_english_piper(&c);
    let text = "Yes, Paris is the capital of France; it sits on the Seine.";
    let pieces = |v: &mut kazeia_daemon::speech::Piper| {
        let mut lens: Vec<usize> = Vec::new();
        let mut joined = Vec::new();
        v.synthesize_each(text, &mut |piece| {
            lens.push(piece.len());
            joined.extend(piece);
            true
        })
        .unwrap();
        (lens, joined)
    };
    let (clauses, audio_whole) = pieces(&mut whole);
    eprintln!("{text:?}: whole graph, pieces of {clauses:?} samples");
    assert_eq!(clauses.len(), 3, "one piece per clause: {clauses:?}");
    assert!(clauses.iter().all(|&n| n > 2_000), "every clause is spoken: {clauses:?}");
    assert_eq!(audio_whole, whole.synthesize(text).unwrap(), "the pieces are the sentence's audio");
    let (lens, joined) = pieces(&mut en);
    eprintln!("{text:?}: split graph, pieces of {lens:?} samples");
    assert!(lens.len() > clauses.len(), "the vocoder's pieces: {lens:?}");
    assert!(lens[0] <= kazeia_daemon::speech::FIRST_PIECE_FRAMES * 256, "a short first piece: {lens:?}");
    assert_eq!(joined, en.synthesize(text).unwrap(), "the pieces are the sentence's audio");
    assert_same_audio(&joined, &audio_whole);
    let heard =
        stt.transcribe(&audio::resample(&joined, en.sample_rate(), 16_000), Some("en"), &[], &|| false).unwrap().text;
    let (e, n) = word_errors(text, &heard);
    eprintln!("heard {heard:?} ({e}/{n})");
    assert!(e * 4 <= n, "{text:?} was heard as {heard:?}");
    // Stopping after the first piece synthesises nothing more: the split voice's vocoder ran
    // once, so that piece left before the next was decoded.
    for v in [&mut en, &mut whole] {
        let (mut calls, runs) = (0, v.vocoder_runs());
        v.synthesize_each(text, &mut |_| {
            calls += 1;
            false
        })
        .unwrap();
        assert_eq!(calls, 1);
        assert_eq!(v.vocoder_runs() - runs, usize::from(v.split()), "{}", v.name());
    }
}

/// The English voice's whole graph, its split ignored, without noise.
fn whole_english_piper(c: &Config) -> kazeia_daemon::speech::Piper {
    let piper = c.cache_path(Path::new(&c.speech.voices["en"]));
    kazeia_daemon::speech::Piper::load_whole(&piper, 2, kazeia_daemon::speech::Backend::Cpu).unwrap().without_noise()
}

/// The split voice's audio is the whole graph's: same length, within 1e-4 of its peak.
fn assert_same_audio(split: &[f32], whole: &[f32]) {
    assert_eq!(split.len(), whole.len(), "the split voice's audio is as long as the whole graph's");
    let peak = whole.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = split.iter().zip(whole).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(peak > 0.01 && diff <= 1e-4 * peak, "largest difference {diff}, peak {peak}");
}

/// A long clause (over the cap of phoneme ids a run, so several runs, each in pieces) from the
/// split voice is the whole graph's audio; a split made from another file (of another size, or
/// of the same size written at another time), or whose split.json is unreadable, is not used:
/// the voice runs whole and speaks the same.
#[test]
fn a_voice_split_is_used_only_when_it_matches_its_voice() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg();
    let text = "The quick brown fox jumps over the lazy dog near the river bank while the children watch \
                from the old stone bridge in the warm light of the late summer evening.";
    let mut split = english_piper(&c);
    let mut whole = whole_english_piper(&c);
    assert!(split.split() && !whole.split());
    let want = whole.synthesize(text).unwrap();
    assert_same_audio(&split.synthesize(text).unwrap(), &want);

    let voice = c.cache_path(Path::new(&c.speech.voices["en"]));
    let real = PathBuf::from(format!("{}.split", voice.display()));
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("voice.onnx");
    std::os::unix::fs::symlink(&voice, &copy).unwrap();
    std::fs::copy(format!("{}.json", voice.display()), dir.path().join("voice.onnx.json")).unwrap();
    let split_dir = dir.path().join("voice.onnx.split");
    std::fs::create_dir(&split_dir).unwrap();
    for g in ["front.onnx", "decoder.onnx"] {
        std::os::unix::fs::symlink(real.join(g), split_dir.join(g)).unwrap();
    }
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(real.join("split.json")).unwrap()).unwrap();
    let (size, mtime) = (&meta["source_bytes"], &meta["source_mtime_ns"]);
    let split = |bytes: &serde_json::Value, ns: &serde_json::Value, context: &serde_json::Value| {
        serde_json::json!({"source_bytes": bytes, "source_mtime_ns": ns, "context_frames": context}).to_string()
    };
    let other_size = serde_json::json!(size.as_u64().unwrap() + 1);
    let other_time = serde_json::json!(mtime.as_u64().unwrap() - 1_000_000_000);
    let cases = [
        ("current", split(size, mtime, &meta["context_frames"]), true),
        ("from a file of another size", split(&other_size, mtime, &serde_json::json!(16)), false),
        // A voice of the same size (Piper voices of one quality often are), written later.
        ("from a file of the same size", split(size, &other_time, &serde_json::json!(16)), false),
        ("unreadable", "{\"source_bytes\": ".to_string(), false),
        ("no context", split(size, mtime, &serde_json::json!(0)), false),
    ];
    for (case, json, used) in cases {
        std::fs::write(split_dir.join("split.json"), json).unwrap();
        let mut v =
            kazeia_daemon::speech::Piper::load(&copy, 2, kazeia_daemon::speech::Backend::Cpu).unwrap().without_noise();
        assert_eq!(v.split(), used, "{case}");
        assert_same_audio(&v.synthesize(text).unwrap(), &want);
    }
    // A current split whose vocoder graph is not ONNX: the voice runs whole.
    std::fs::write(split_dir.join("split.json"), split(size, mtime, &meta["context_frames"])).unwrap();
    std::fs::remove_file(split_dir.join("decoder.onnx")).unwrap();
    std::fs::write(split_dir.join("decoder.onnx"), b"not a graph").unwrap();
    let mut v =
        kazeia_daemon::speech::Piper::load(&copy, 2, kazeia_daemon::speech::Backend::Cpu).unwrap().without_noise();
    assert!(!v.split(), "a vocoder that does not load");
    assert_same_audio(&v.synthesize(text).unwrap(), &want);
}

/// Whisper's own no-speech rule (`<|nocaptions|>` over 0.6 after the start token, the text
/// decoded with little confidence): silence and low noise fed straight to Whisper, past the
/// VAD (which alone judged them so far), are no speech, whatever text it invents for them
/// (base hears 2 s of silence as "you"); each of the English sentences, spoken, is speech.
#[test]
fn whisper_says_when_it_heard_no_speech() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg();
    let th = c.speech.no_speech_threshold;
    let mut stt = kazeia_daemon::speech::transcriber(&c).unwrap();
    // A fixed pseudo-random hiss at -40 dBFS (xorshift: the same every run).
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let hiss: Vec<f32> = (0..32_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02
        })
        .collect();
    // Past 30 s only the VAD's utterances are transcribed: none, no text, no speech.
    for (name, clip) in [("silence", silence(2.0)), ("hiss", hiss), ("31 s of silence", silence(31.0))] {
        let t = stt.transcribe(&clip, Some("en"), &[], &|| false).unwrap();
        eprintln!("{name}: {:?} no_speech {:.3} logprob {:.2}", t.text, t.no_speech_prob, t.avg_logprob);
        assert!(t.is_no_speech(th), "{name}: {t:?}");
    }
    let mut voice = voice_for(&c, "en").unwrap();
    for text in ENGLISH {
        let t = stt.transcribe(&speak(voice.as_mut(), text), Some("en"), &[], &|| false).unwrap();
        eprintln!("{text:?}: no_speech {:.3} logprob {:.2}", t.no_speech_prob, t.avg_logprob);
        assert!(!t.is_no_speech(th), "{text:?}: {t:?}");
    }
}

/// A hint (an earlier transcript's token ids, as the daemon's drafts pass on) changes the
/// number of decoder calls, never the transcript: each token is still the greedy choice, and a
/// wrong guess is cut from the cache. Whole, half, one token changed, another sentence's,
/// the draft of the first 60% of the speech: the same ids as no hint.
#[test]
fn a_hint_saves_decoder_calls_and_never_changes_the_transcript() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg();
    let mut en = voice_for(&c, "en").unwrap();
    let mut fr = voice_for(&c, "fr").unwrap();
    let mut stt = kazeia_daemon::speech::transcriber(&c).unwrap();
    let clips: Vec<(Vec<f32>, Option<&str>)> = ENGLISH
        .iter()
        .map(|t| (speak(en.as_mut(), t), Some("en")))
        .chain(FRENCH[..2].iter().map(|t| (speak(fr.as_mut(), t), None)))
        .collect();
    let other = stt.transcribe(&clips[1].0, Some("en"), &[], &|| false).unwrap().ids;
    let (mut plain_calls, mut whole_calls) = (0, 0);
    for (clip, lang) in &clips {
        // The draft first: detection then guesses the whole clip's language in every run below
        // (the draft's might differ).
        let draft = stt.transcribe(&clip[..clip.len() * 6 / 10], *lang, &[], &|| false).unwrap().ids;
        let plain = stt.transcribe(clip, *lang, &[], &|| false).unwrap();
        assert!(plain.ids.len() > 5, "{plain:?}");
        // A given language: the prompt is one call, then one per token (the last picks the end).
        if lang.is_some() {
            assert_eq!(plain.decoder_calls, plain.ids.len() + 1, "{plain:?}");
        }
        let mut changed = plain.ids.clone();
        let mid = changed.len() / 2;
        changed[mid] = changed[mid - 1];
        let hints = [
            ("whole", plain.ids.clone()),
            ("half", plain.ids[..mid].to_vec()),
            ("one token changed", changed),
            ("another sentence", other.clone()),
            ("draft of 60%", draft),
        ];
        for (name, hint) in hints {
            let t = stt.transcribe(clip, *lang, &hint, &|| false).unwrap();
            eprintln!(
                "{name}: {} calls ({} again for a near tie), decoder {:.0} ms, against {} calls, {:.0} ms: {:?}",
                t.decoder_calls, t.ties, t.decoder_ms, plain.decoder_calls, plain.decoder_ms, t.text
            );
            assert_eq!((&t.ids, &t.text), (&plain.ids, &plain.text), "hint {name}");
            // The same choices from the same rows, up to how the 8-bit decoder's calls of one
            // and of several tokens differ (tools/whisper-to-onnx): 0.003 seen on a French clip.
            assert!((t.avg_logprob - plain.avg_logprob).abs() < 0.02, "hint {name}: {t:?} against {plain:?}");
            assert!((t.no_speech_prob - plain.no_speech_prob).abs() < 1e-3, "hint {name}: {t:?}");
            // A near tie read from a call of guesses costs that call again without them.
            assert!(t.decoder_calls <= plain.decoder_calls + t.ties, "hint {name}: {t:?}");
            if name == "whole" {
                whole_calls += t.decoder_calls;
                plain_calls += plain.decoder_calls;
            }
        }
    }
    // The right guess: a sentence in one or two calls, not one per token.
    assert!(whole_calls * 4 <= plain_calls, "{whole_calls} calls with the whole hint, {plain_calls} without");
}

/// A partial transcript (the words so far, while the user speaks) runs Whisper on the audio and
/// `[speech] partial_margin` (15 s) of padding; the turn's own transcript runs on the audio and
/// `[speech] turn_margin` (20 s) in `[speech] cut_languages` (English), on the whole 30 s window
/// in the others (French: cut, it failed the French word-error gate:
/// `kazeia_speech::whisper::PARTIAL_MARGIN`). The first run
/// after a load is whole whatever it is (ONNX Runtime's arena: tests/speech_memory_stt.rs).
#[test]
fn partial_transcripts_run_a_window_cut_to_the_audio() {
    use kazeia_daemon::speech::whisper::{PARTIAL_MARGIN, TURN_MARGIN};
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = cfg();
    let mut stt = kazeia_daemon::speech::transcriber(&c).unwrap();
    assert_eq!(stt.partial_margin, PARTIAL_MARGIN);
    let stop = kazeia_daemon::speech::Stop::new().unwrap();
    let clip = speak(&mut english_piper(&c), ENGLISH[1]);
    assert!(clip.len() >= 2 * 16_000, "{} samples", clip.len());
    let first = stt.transcribe_partial_until(&clip, Some("en"), &[], &stop).unwrap();
    assert_eq!(first.frames, 3000, "the first run after a load is whole");
    let partial = stt.transcribe_partial_until(&clip, Some("en"), &[], &stop).unwrap();
    // Frames of 10 ms: the audio's and the margin, rounded up to a whole second.
    let cut = (clip.len().div_ceil(160) + PARTIAL_MARGIN).div_ceil(100) * 100;
    assert!(cut < 3000, "{} s of audio", clip.len() / 16_000);
    assert_eq!(partial.frames, cut);
    let (e, n) = word_errors(ENGLISH[1], &partial.text);
    assert!(e * 5 <= n, "{e}/{n}: {:?}", partial.text);

    // The turn's transcript: cut in English (to the audio and 20 s), given or guessed from the
    // last detection.
    assert_eq!((stt.cut_languages.as_slice(), stt.turn_margin), (["en".to_string()].as_slice(), TURN_MARGIN));
    let cut = (clip.len().div_ceil(160) + TURN_MARGIN).div_ceil(100) * 100;
    assert!(cut < 3000, "{} s of audio", clip.len() / 16_000);
    let turn = stt.transcribe_until(&clip, Some("en"), &[], &stop).unwrap();
    assert_eq!(turn.frames, cut, "an English turn's transcript is cut");
    let (e, n) = word_errors(ENGLISH[1], &turn.text);
    assert!(e * 5 <= n, "{e}/{n}: {:?}", turn.text);
    assert_eq!(stt.transcribe(&clip, Some("en"), &[], &|| false).unwrap().frames, cut);
    let first_detection = stt.transcribe_until(&clip, None, &[], &stop).unwrap();
    assert_eq!((first_detection.frames, first_detection.language.as_str()), (3000, "en"), "nothing detected yet");
    assert_eq!(stt.transcribe_until(&clip, None, &[], &stop).unwrap().frames, cut, "English detected last");
    // French: whole.
    let french = speak(voice_for(&c, "fr").unwrap().as_mut(), FRENCH[0]);
    assert_eq!(stt.transcribe_until(&french, Some("fr"), &[], &stop).unwrap().frames, 3000);
    assert_eq!(stt.transcribe(&french, Some("fr"), &[], &|| false).unwrap().frames, 3000);
    // `cut_languages = []`: every turn transcript whole.
    stt.cut_languages.clear();
    assert_eq!(stt.transcribe_until(&clip, Some("en"), &[], &stop).unwrap().frames, 3000);
    // Audio of 15 s and more: the whole window for partials too.
    let long: Vec<f32> = [clip.clone(), silence(13.0)].concat();
    assert_eq!(stt.transcribe_partial_until(&long, Some("en"), &[], &stop).unwrap().frames, 3000);
}
