//! Text to speech, sentence by sentence: the Piper voice (VITS on ONNX Runtime) fed with
//! espeak-ng's IPA phonemes, and espeak-ng itself for the languages no neural voice in the
//! registries speaks (French). Both behind [`Voice`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use ndarray::{s, Array1, Array2, Ix3};
use ort::session::Session;
use ort::value::TensorRef;

use crate::runtime::{session, Placement, Shapes, SpeechError};
use kazeia_memory_budget::Backend;

/// A voice: text in, mono samples at `sample_rate()` out.
pub trait Voice: Send {
    fn synthesize(&mut self, text: &str) -> Result<Vec<f32>, SpeechError>;
    /// The same audio, handed to `each` piece by piece as soon as each exists (Piper: clause by
    /// clause, and a split Piper voice in pieces of a clause), so that the first clause is heard
    /// while the next is synthesised. `each` returns false to stop (a cancelled reply).
    fn synthesize_each(&mut self, text: &str, each: &mut dyn FnMut(Vec<f32>) -> bool) -> Result<(), SpeechError> {
        each(self.synthesize(text)?);
        Ok(())
    }
    fn sample_rate(&self) -> u32;
    fn name(&self) -> String;
}

#[derive(serde::Deserialize)]
struct PiperConfig {
    audio: PiperAudio,
    espeak: PiperEspeak,
    inference: PiperInference,
    phoneme_id_map: HashMap<String, Vec<i64>>,
}

#[derive(serde::Deserialize)]
struct PiperAudio {
    sample_rate: u32,
}

#[derive(serde::Deserialize)]
struct PiperEspeak {
    voice: String,
}

#[derive(serde::Deserialize)]
struct PiperInference {
    noise_scale: f32,
    length_scale: f32,
    noise_w: f32,
}

/// Run espeak-ng on `text`. The text goes through stdin, never the command line: a reply or a
/// client's text starting with `-` would otherwise be read as an option.
///
/// A process, not libespeak-ng in ours: its `espeak_TextToPhonemes` gave the same IPA on 516
/// of 520 clauses (the rest: a lone "and" or "the" unstressed) in 0.05 ms against 6.6-6.9 ms
/// a run, but espeak-ng has had memory-safety bugs reachable from text (CVE-2023-49990..49994,
/// found by fuzzing; Debian patched its 1.51 in 2023), and the text is a model's output: a
/// crash there would take the daemon down with it, here it is one failed sentence.
fn espeak(args: &[&str], text: &str) -> Result<std::process::Output, SpeechError> {
    run_espeak(std::ffi::OsStr::new("espeak-ng"), args, text, ESPEAK_DEADLINE)
}

/// The longest one espeak-ng run may take (a run takes ~7 ms a clause here). It runs while the
/// speaker holds its voice and the decodes wait for speech: a run that never ended (the
/// component the fuzzers found bugs in) held that voice for good, and the turn, which no cancel
/// ended, with it.
const ESPEAK_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

fn run_espeak(
    program: &std::ffi::OsStr,
    args: &[&str],
    text: &str,
    deadline: std::time::Duration,
) -> Result<std::process::Output, SpeechError> {
    use std::io::{Read, Write};
    use std::process::Stdio;
    let run = |e: std::io::Error| SpeechError::Run(format!("espeak-ng: {e} (Debian: apt install espeak-ng)"));
    let mut child = Command::new(program)
        .args(args)
        .arg("--stdin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(run)?;
    // Written from another thread: espeak-ng may fill its stdout before it has read all of stdin.
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = speakable(text);
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    // Its output read on threads until it closes them (it exits), waited for up to `deadline`.
    let (done, ended) = std::sync::mpsc::channel();
    let read = |mut pipe: Box<dyn Read + Send>, done: std::sync::mpsc::Sender<()>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            let _ = done.send(());
            buf
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("piped stdout")), done.clone());
    let stderr = read(Box::new(child.stderr.take().expect("piped stderr")), done);
    let start = std::time::Instant::now();
    for _ in 0..2 {
        let left = deadline.saturating_sub(start.elapsed());
        if ended.recv_timeout(left).is_err() {
            // Not reaped yet: the pid is still this child's.
            let _ = child.kill();
            let _ = child.wait();
            return Err(SpeechError::Run(format!("espeak-ng: no answer in {} s: stopped", deadline.as_secs_f64())));
        }
    }
    let status = child.wait().map_err(run)?;
    let _ = writer.join();
    let out = std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    if !out.status.success() {
        return Err(SpeechError::Run(format!("espeak-ng: {}", String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(out)
}

/// `text` as espeak-ng must get it: NUL ends its input, a control character starts an
/// embedded command (`\u{1}80S` doubled the rate of what followed, `\u{1}200A` the volume to
/// near clipping: text the output guard reads with its controls left out), and `[[` starts
/// phoneme input (on by default on its command line: `[[h@l'oU]]` was said "hello", so the voice
/// said what the output guard had read as gibberish). Controls become spaces; brackets are kept
/// apart, read as the characters they are.
fn speakable(text: &str) -> String {
    let mut s: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    while s.contains("[[") || s.contains("]]") {
        s = s.replace("[[", "[ [").replace("]]", "] ]");
    }
    s
}

/// IPA phonemes of `text` as Piper was trained on them: one clause at a time, the clause's
/// punctuation kept (espeak-ng drops it, the voice uses it for prosody).
pub fn phonemize(text: &str, voice: &str) -> Result<String, SpeechError> {
    Ok(phonemize_clauses(text, voice)?.join(" "))
}

/// [`phonemize`], clause by clause (each with its punctuation).
pub fn phonemize_clauses(text: &str, voice: &str) -> Result<Vec<String>, SpeechError> {
    let mut out = Vec::new();
    each_clause(text, voice, &mut |ipa| {
        out.push(ipa);
        Ok(true)
    })?;
    Ok(out)
}

/// Each clause's phonemes handed to `each` as soon as they exist, so that a clause can be
/// synthesised before the next one is phonemized (each clause is one espeak-ng run, 7-50 ms
/// here: a first unit of three clauses waited for all three before its first audio). `each`
/// returns false to stop.
fn each_clause(
    text: &str,
    voice: &str,
    each: &mut dyn FnMut(String) -> Result<bool, SpeechError>,
) -> Result<(), SpeechError> {
    let mut clause = String::new();
    // Phonemes of the clause and its punctuation (espeak-ng drops it, the voice uses it for
    // prosody); true to go on.
    let mut flush = |clause: &mut String, punct: Option<char>| -> Result<bool, SpeechError> {
        let c = clause.trim();
        let mut ipa = String::new();
        if !c.is_empty() {
            let o = espeak(&["-q", "--ipa", "-v", voice], c)?;
            let out = without_language_marks(&String::from_utf8_lossy(&o.stdout));
            ipa = out.split_whitespace().collect::<Vec<_>>().join(" ");
        }
        clause.clear();
        // Nothing to say ("Yes. . .", a lone dash or emoji espeak-ng writes nothing for): the
        // punctuation alone was a vocoder run of its own, a breath of noise between clauses.
        if ipa.is_empty() {
            return Ok(true);
        }
        if let Some(p) = punct {
            ipa.push(p);
        }
        each(ipa)
    };
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        if ",.;:!?".contains(ch) && ends_clause(chars.peek().copied()) {
            if !flush(&mut clause, Some(ch))? {
                return Ok(());
            }
        } else {
            clause.push(ch);
        }
    }
    flush(&mut clause, None)?;
    Ok(())
}

/// Punctuation ends a clause where a space, a closing quote or bracket, or the end of the text
/// follows it; inside a number or a name it is part of the word. Cut at every `.` and `,`,
/// "3.14" was said "three. fourteen" and "1,000" "one, zero zero zero" (espeak-ng read each
/// piece alone): the voice said another number than the output guard had read.
fn ends_clause(next: Option<char>) -> bool {
    next.is_none_or(|c| c.is_whitespace() || "\"'”’»)]".contains(c))
}

/// espeak-ng's IPA with its language switches left out: a voice given a word of another
/// language writes `(en)njˈuː(de) jˈɔɾk`, and a Piper voice, whose symbols hold `(`, `)` and
/// the letters, said "en" and "de" inside the words (Piper's own phonemizer drops them too).
fn without_language_marks(ipa: &str) -> String {
    let mut out = String::with_capacity(ipa.len());
    let mut rest = ipa;
    while let Some(open) = rest.find('(') {
        let after = &rest[open + 1..];
        let close = after.find(')').filter(|&n| (1..=12).contains(&n));
        match close.filter(|&n| after[..n].chars().all(|c| c.is_ascii_alphabetic() || c == '-')) {
            Some(n) => {
                out.push_str(&rest[..open]);
                rest = &after[n + 1..];
            }
            None => {
                out.push_str(&rest[..open + 1]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Most phoneme ids Piper is given in one run (about 1.7 s of speech). Its working memory grows
/// with the audio of a run, faster than linearly (measured, arena off: 128 ids 49 MiB over the
/// loaded model, 256 ids 102 MiB, 512 ids 256 MiB; a 16-word sentence in one run peaked at
/// 203 MB), so longer text
/// is spoken in runs of one clause (or of words, for a clause over the cap) joined end to end,
/// as Piper's own phonemizer splits by sentence. The plan's TTS factor is measured at this cap.
pub const MAX_IDS_PER_RUN: usize = 128;

/// One run per clause, an oversized clause split at its spaces into runs of at most `max`
/// symbols (`cost` of each), a word over the cap cut between its characters. A clause per run,
/// not clauses packed up to the cap: each clause's audio can leave as soon as it exists ("Yes,"
/// is heard while the rest of the sentence is synthesised). A word alone went whole: 80
/// syllables joined by hyphens (479 bytes, one unit for the output guard) made one run of ~3200
/// ids, 25 times the cap the plan's TTS factor is measured at.
fn runs(clauses: &[String], max: usize, cost: impl Fn(&str) -> usize) -> Vec<String> {
    let mut pieces: Vec<String> = Vec::new();
    for c in clauses {
        if cost(c) <= max {
            pieces.push(c.clone());
            continue;
        }
        let mut cur = String::new();
        let words: Vec<String> = c.split(' ').flat_map(|w| cut_word(w, max, &cost)).collect();
        for w in &words {
            let candidate = if cur.is_empty() { w.to_string() } else { format!("{cur} {w}") };
            if !cur.is_empty() && cost(&candidate) > max {
                pieces.push(std::mem::replace(&mut cur, w.to_string()));
            } else {
                cur = candidate;
            }
        }
        if !cur.is_empty() {
            pieces.push(cur);
        }
    }
    pieces
}

/// `word` whole if it fits `max`, else in pieces that do (as many characters as fit each; a
/// character alone always goes).
fn cut_word(word: &str, max: usize, cost: &impl Fn(&str) -> usize) -> Vec<String> {
    if cost(word) <= max {
        return vec![word.to_string()];
    }
    let mut out = Vec::new();
    let mut cur = String::new();
    for ch in word.chars() {
        cur.push(ch);
        if cost(&cur) > max && cur.chars().nth(1).is_some() {
            cur.pop();
            out.push(std::mem::replace(&mut cur, ch.to_string()));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The voice's graph: whole, or split by `tools/piper-split` into the front (text encoder,
/// durations, flow: phoneme ids -> latent frames) and the vocoder (latent frames -> samples),
/// which is convolutions only, so pieces of the frames with `context` frames either side give
/// the whole graph's samples. The split's first piece of audio leaves after the front and a
/// short vocoder run: on a 2.6 s clause (2 threads, here) the whole graph took 168 ms, the front
/// 54, the vocoder 96 and its first 24 frames (0.28 s) with their context 19.
enum Graph {
    Whole(Session),
    Split { front: Session, decoder: Session, context: usize },
}

/// What `tools/piper-split` writes beside its graphs.
#[derive(serde::Deserialize)]
struct SplitMeta {
    /// The voice file's size and modification time (ns since the epoch) when it was split:
    /// another file, or the same one written again, means a stale split (Piper voices of one
    /// quality are often the same size, so the size alone would not tell).
    source_bytes: u64,
    source_mtime_ns: u128,
    /// The vocoder's reach, measured by the splitter (16 frames for the joe voice).
    context_frames: usize,
}

/// The vocoder's first piece, in latent frames (~0.28 s at the joe voice's 256 samples a frame
/// and 22,050 Hz); each next piece twice the last, a short tail joined to the piece before it.
/// Each piece decodes its context too (16 frames either side for the joe voice): a run of 86
/// frames (1 s) decodes 40 + 78 frames, 1.37 × its own, a run of 168 (2 s) 40 + 80 + 128, 1.48 ×.
pub const FIRST_PIECE_FRAMES: usize = 24;

/// The pieces of `frames` latent frames: (start, end) of each, covering all of them in order.
/// The first is [`FIRST_PIECE_FRAMES`] (or all of them, when fewer); each next twice the last,
/// but a piece after the first takes the rest with it when the rest is shorter than itself (a
/// short tail would pay its context for little audio).
fn pieces(frames: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let (mut pos, mut size) = (0, FIRST_PIECE_FRAMES);
    while pos < frames {
        let mut end = frames.min(pos + size);
        if pos > 0 && frames - end < size {
            end = frames;
        }
        out.push((pos, end));
        pos = end;
        size *= 2;
    }
    out
}

pub struct Piper {
    graph: Graph,
    config: PiperConfig,
    path: PathBuf,
    pub placement: Placement,
    vocoder_runs: usize,
}

impl Piper {
    /// `path` is the .onnx; its `.onnx.json` sits beside it, and `tools/piper-split`'s graphs
    /// in `<path>.split/` when it was split (then its audio leaves in pieces).
    pub fn load(path: &Path, threads: usize, backend: Backend) -> Result<Piper, SpeechError> {
        Piper::open(path, threads, backend, true)
    }

    /// The voice's whole graph, its split ignored (to compare the two).
    pub fn load_whole(path: &Path, threads: usize, backend: Backend) -> Result<Piper, SpeechError> {
        Piper::open(path, threads, backend, false)
    }

    fn open(path: &Path, threads: usize, backend: Backend, split: bool) -> Result<Piper, SpeechError> {
        let json = PathBuf::from(format!("{}.json", path.display()));
        let text = std::fs::read_to_string(&json).map_err(|_| SpeechError::Missing(json.clone()))?;
        let config: PiperConfig =
            serde_json::from_str(&text).map_err(|e| SpeechError::BadModel { path: json, message: e.to_string() })?;
        let dir = split_dir(path);
        let split_graphs = || -> Option<(Graph, Placement)> {
            let meta = split_meta(path, &dir)?;
            let load = || -> Result<(Graph, Placement), SpeechError> {
                let (front, placement) = session(&dir.join("front.onnx"), threads, backend, Shapes::Fixed)?;
                let (decoder, _) = session(&dir.join("decoder.onnx"), threads, backend, Shapes::Fixed)?;
                Ok((Graph::Split { front, decoder, context: meta.context_frames }, placement))
            };
            load()
                .map_err(|e| tracing::warn!(dir = %dir.display(), "the voice split does not load, the voice runs whole: {e}"))
                .ok()
        };
        let (graph, placement) = match split.then(split_graphs).flatten() {
            Some(g) => g,
            None => {
                let (session, placement) = session(path, threads, backend, Shapes::Fixed)?;
                (Graph::Whole(session), placement)
            }
        };
        Ok(Piper { graph, config, path: path.into(), placement, vocoder_runs: 0 })
    }

    /// Whether the voice's audio leaves in pieces (its split graphs were found, current, and
    /// loaded).
    pub fn split(&self) -> bool {
        matches!(self.graph, Graph::Split { .. })
    }

    /// Vocoder runs of the split graph so far (one per piece): a test's proof that no piece is
    /// decoded after its caller said stop.
    pub fn vocoder_runs(&self) -> usize {
        self.vocoder_runs
    }

    /// The same audio for the same text every time: the voice's sampled noise (prosody and
    /// durations) turned off. For tests, where a question Whisper once misheard ("the capital of
    /// friends") must be misheard every run or never.
    pub fn without_noise(mut self) -> Piper {
        self.config.inference.noise_scale = 0.0;
        self.config.inference.noise_w = 0.0;
        self
    }

    /// Phoneme ids: `^ _ p1 _ p2 _ … $` (BOS, pad after each symbol, EOS), unknown symbols
    /// skipped.
    pub fn ids(&self, phonemes: &str) -> Vec<i64> {
        let map = &self.config.phoneme_id_map;
        let id = |s: &str| map.get(s).and_then(|v| v.first()).copied();
        let pad = id("_").unwrap_or(0);
        let mut ids = vec![id("^").unwrap_or(1), pad];
        let mut buf = [0u8; 4];
        for ch in phonemes.chars() {
            if let Some(i) = id(ch.encode_utf8(&mut buf)) {
                ids.push(i);
                ids.push(pad);
            }
        }
        ids.push(id("$").unwrap_or(2));
        ids
    }

    /// A clause's phonemes spoken, each run (or piece of one) handed to `each` (false: stop).
    fn speak_clause(&mut self, ipa: String, each: &mut dyn FnMut(Vec<f32>) -> bool) -> Result<bool, SpeechError> {
        for run in runs(&[ipa], MAX_IDS_PER_RUN, |p| self.ids(p).len()) {
            if !self.run(&self.ids(&run), each)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// One run of the voice on `ids` (at most [`MAX_IDS_PER_RUN`] of them, but for one word),
    /// its audio handed to `each`: whole, or piece by piece with the split graph. False: stop.
    fn run(&mut self, ids: &[i64], each: &mut dyn FnMut(Vec<f32>) -> bool) -> Result<bool, SpeechError> {
        if ids.len() <= 3 {
            return Ok(true);
        }
        let input =
            Array2::from_shape_vec((1, ids.len()), ids.to_vec()).map_err(|e| SpeechError::Run(e.to_string()))?;
        let lengths = Array1::from_elem(1, ids.len() as i64);
        let inf = &self.config.inference;
        let scales = Array1::from_vec(vec![inf.noise_scale, inf.length_scale, inf.noise_w]);
        let inputs = ort::inputs![
            "input" => TensorRef::from_array_view(&input)?,
            "input_lengths" => TensorRef::from_array_view(&lengths)?,
            "scales" => TensorRef::from_array_view(&scales)?,
        ];
        match &mut self.graph {
            Graph::Whole(session) => {
                let out = session.run(inputs)?;
                Ok(each(out["output"].try_extract_array::<f32>()?.iter().copied().collect()))
            }
            Graph::Split { front, decoder, context } => {
                let out = front.run(inputs)?;
                let latent =
                    out["latent"].try_extract_array::<f32>()?.into_dimensionality::<Ix3>().map_err(bad_latent)?;
                let frames = latent.shape()[2];
                for (start, end) in pieces(frames) {
                    let (lo, hi) = (start.saturating_sub(*context), frames.min(end + *context));
                    // A copy: the frames are the last axis, so a stretch of them is not contiguous.
                    let piece = latent.slice(s![.., .., lo..hi]).as_standard_layout().into_owned();
                    let y = decoder.run(ort::inputs!["latent" => TensorRef::from_array_view(&piece)?])?;
                    self.vocoder_runs += 1;
                    let y = y["output"].try_extract_array::<f32>()?;
                    let samples =
                        y.as_slice().ok_or_else(|| SpeechError::Run("vocoder output not contiguous".into()))?;
                    if samples.len() % (hi - lo) != 0 {
                        return Err(SpeechError::Run(format!(
                            "vocoder gave {} samples for {} frames",
                            samples.len(),
                            hi - lo
                        )));
                    }
                    let hop = samples.len() / (hi - lo);
                    if !each(samples[(start - lo) * hop..(end - lo) * hop].to_vec()) {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
        }
    }
}

fn bad_latent(e: ndarray::ShapeError) -> SpeechError {
    SpeechError::Run(format!("the voice's front gave latent frames of another shape: {e}"))
}

/// Whether the voice at `path` runs split ([`Piper::load`] finds its split current), for the
/// plan: a split voice's working memory is smaller.
pub fn split_in_use(path: &Path) -> bool {
    split_meta(path, &split_dir(path)).is_some()
}

/// Where `tools/piper-split` puts the voice's two graphs: `<voice>.onnx.split/`.
fn split_dir(path: &Path) -> PathBuf {
    PathBuf::from(format!("{}.split", path.display()))
}

/// The split `tools/piper-split` left in `dir` for the voice at `path`, if it is there and was made
/// from that file (its size and modification time); else the whole graph runs (said in the log when
/// a split is there but stale or unreadable).
fn split_meta(path: &Path, dir: &Path) -> Option<SplitMeta> {
    let text = std::fs::read_to_string(dir.join("split.json")).ok()?;
    let meta: SplitMeta = match serde_json::from_str(&text) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "unreadable voice split, the voice runs whole: {e}");
            return None;
        }
    };
    let stat = std::fs::metadata(path).ok();
    let bytes = stat.as_ref().map_or(0, |m| m.len());
    let mtime = stat
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    if meta.source_bytes != bytes || meta.source_mtime_ns != mtime || meta.context_frames == 0 {
        tracing::warn!(
            dir = %dir.display(),
            split_from = meta.source_bytes,
            voice = bytes,
            "the voice split was made from another file (run tools/fetch-models), the voice runs whole"
        );
        return None;
    }
    Some(meta)
}

impl Voice for Piper {
    fn synthesize(&mut self, text: &str) -> Result<Vec<f32>, SpeechError> {
        let mut audio = Vec::new();
        self.synthesize_each(text, &mut |piece| {
            audio.extend(piece);
            true
        })?;
        Ok(audio)
    }

    fn synthesize_each(&mut self, text: &str, each: &mut dyn FnMut(Vec<f32>) -> bool) -> Result<(), SpeechError> {
        // Clause by clause: the first clause's audio does not wait for the others' phonemes.
        let voice = self.config.espeak.voice.clone();
        each_clause(text, &voice, &mut |ipa| self.speak_clause(ipa, each))
    }

    fn sample_rate(&self) -> u32 {
        self.config.audio.sample_rate
    }

    fn name(&self) -> String {
        let file = self.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if self.split() {
            format!("piper {file} (split: audio in pieces)")
        } else {
            format!("piper {file}")
        }
    }
}

/// The rate of espeak-ng's formant voices, which its voices are given at.
const ESPEAK_RATE: u32 = 22_050;

/// The samples of the WAV espeak-ng streams (s16le, mono), at `rate`. Its header says "unknown
/// length", which WAV readers refuse: the samples follow the `data` chunk header, at the rate
/// its `fmt ` chunk gives. An mbrola voice (`espeak:mb-de1`) writes 16 kHz: read as 22,050 Hz,
/// it played too fast and too high.
fn streamed_wav(wav: &[u8], rate: u32) -> Result<Vec<f32>, SpeechError> {
    let chunk = |id: &[u8]| wav.windows(4).position(|w| w == id).filter(|_| wav.starts_with(b"RIFF"));
    let no_wav = || SpeechError::Run("espeak-ng gave no WAV".into());
    let (fmt, data) = (chunk(b"fmt ").ok_or_else(no_wav)?, chunk(b"data").ok_or_else(no_wav)?);
    let at = wav.get(fmt + 12..fmt + 16).ok_or_else(no_wav)?;
    let from = u32::from_le_bytes(at.try_into().expect("4 bytes"));
    let pcm = crate::audio::from_s16le(wav.get(data + 8..).ok_or_else(no_wav)?);
    Ok(match from {
        0 => return Err(no_wav()),
        r if r == rate => pcm,
        r => crate::audio::resample(&pcm, r, rate),
    })
}

/// espeak-ng's own formant voice (`-v fr`): the French voice, since no neural French voice
/// ships in the package registries. Robotic but intelligible; same interface.
pub struct Espeak {
    pub voice: String,
}

impl Voice for Espeak {
    fn synthesize(&mut self, text: &str) -> Result<Vec<f32>, SpeechError> {
        let out = espeak(&["--stdout", "-v", &self.voice], text)?;
        streamed_wav(&out.stdout, ESPEAK_RATE)
    }

    fn sample_rate(&self) -> u32 {
        ESPEAK_RATE
    }

    fn name(&self) -> String {
        format!("espeak-ng {}", self.voice)
    }
}

#[cfg(test)]
mod tests {
    /// A streamed WAV at 16 kHz (an mbrola voice) is resampled to the voice's rate; at that
    /// rate it is read as it is; anything else is no WAV.
    #[test]
    fn a_streamed_wav_is_read_at_its_own_rate() {
        let wav = |rate: u32, samples: usize| {
            let mut b = b"RIFF\xff\xff\xff\xffWAVEfmt \x10\0\0\0\x01\0\x01\0".to_vec();
            b.extend_from_slice(&rate.to_le_bytes());
            b.extend_from_slice(&(rate * 2).to_le_bytes());
            b.extend_from_slice(b"\x02\0\x10\0data\xff\xff\xff\xff");
            b.extend(std::iter::repeat_n([0x10u8, 0x00], samples).flatten());
            b
        };
        assert_eq!(super::streamed_wav(&wav(22_050, 2_205), 22_050).unwrap().len(), 2_205);
        let n = super::streamed_wav(&wav(16_000, 1_600), 22_050).unwrap().len();
        assert!((2_195..=2_215).contains(&n), "{n}");
        assert!(super::streamed_wav(b"RIFFnot a wav", 22_050).is_err());
        assert!(super::streamed_wav(&wav(0, 10), 22_050).is_err());
    }

    /// An espeak-ng run that never ends is stopped at its deadline; one that ends is read
    /// whole, and one that fails says why. (`sh -c` stands for espeak-ng: `--stdin` is its $1.)
    #[test]
    fn an_espeak_run_that_never_ends_is_stopped() {
        let sh = std::ffi::OsStr::new("sh");
        let deadline = std::time::Duration::from_millis(300);
        let t = std::time::Instant::now();
        let e = super::run_espeak(sh, &["-c", "exec sleep 60", "sh"], "hi", deadline).unwrap_err();
        assert!(e.to_string().contains("no answer") && t.elapsed().as_secs() < 30, "{e}");
        // Runs that end: the whole deadline (a loaded machine may be slow to start them).
        let deadline = super::ESPEAK_DEADLINE;
        let out = super::run_espeak(sh, &["-c", "cat", "sh"], "- hello\u{1}", deadline).unwrap();
        assert_eq!(out.stdout, b"- hello ");
        let e = super::run_espeak(sh, &["-c", "echo broken >&2; exit 3", "sh"], "hi", deadline).unwrap_err();
        assert!(e.to_string().contains("broken"), "{e}");
    }

    /// A run per clause; runs never pass the cap but for a lone word; clauses stay whole when
    /// they fit; nothing is lost or reordered.
    #[test]
    fn runs_are_capped_whole_clauses() {
        let clauses: Vec<String> = ["aaaa bb,", "cc.", "dddddd eeeeee ffffff gg", "h"].map(String::from).to_vec();
        let r = super::runs(&clauses, 10, str::len);
        assert_eq!(r, ["aaaa bb,", "cc.", "dddddd", "eeeeee", "ffffff gg", "h"]);
        assert!(r.iter().all(|p| p.len() <= 10));
        assert_eq!(r.join(" "), clauses.join(" "));
        let r = super::runs(&["a,".to_string(), "b,".into(), "c".into()], 10, str::len);
        assert_eq!(r, ["a,", "b,", "c"]);
        // A word over the cap is cut between its characters, nothing lost.
        assert_eq!(super::runs(&["toolongword".to_string()], 4, str::len), ["tool", "ongw", "ord"]);
        assert_eq!(super::runs(&["ab toolongword c".to_string()], 4, str::len), ["ab", "tool", "ongw", "ord", "c"]);
        let ipa = super::phonemize(&"bcdfg-".repeat(80), "en-us").unwrap();
        let ids = |p: &str| 3 + 2 * p.chars().count();
        let r = super::runs(std::slice::from_ref(&ipa), super::MAX_IDS_PER_RUN, ids);
        assert!(r.len() > 10 && r.iter().all(|p| ids(p) <= super::MAX_IDS_PER_RUN), "{r:?}");
        assert_eq!(r.concat().replace(' ', ""), ipa.replace(' ', ""));
    }

    /// Numbers, names and abbreviations are said whole: punctuation cuts a clause only before a
    /// space, a closing mark or the end (cut at every `.` and `,`, "3.14" was "three. fourteen").
    #[test]
    fn punctuation_inside_a_word_is_no_clause() {
        let pi = super::phonemize_clauses("Pi is 3.14 today.", "en-us").unwrap();
        assert_eq!(pi.len(), 1, "{pi:?}");
        assert_eq!(pi[0], super::phonemize_clauses("Pi is 3.14 today", "en-us").unwrap()[0].clone() + ".");
        let thousand = super::phonemize("1,000 people", "en-us").unwrap();
        assert!(!thousand.contains(','), "{thousand:?}");
        assert_eq!(thousand, super::phonemize("1000 people", "en-us").unwrap());
        let quoted = super::phonemize_clauses("He said \"yes.\" Then left", "en-us").unwrap();
        assert_eq!(quoted.len(), 2, "{quoted:?}");
        for end in [None, Some(' '), Some('"'), Some(')')] {
            assert!(super::ends_clause(end), "{end:?}");
        }
        assert!(!super::ends_clause(Some('1')) && !super::ends_clause(Some('c')));
    }

    /// espeak-ng's language switches are not phonemes for the voice.
    #[test]
    fn language_switches_are_left_out() {
        assert_eq!(super::without_language_marks("(en)njˈuː(de) jˈɔɾk"), "njˈuː jˈɔɾk");
        assert_eq!(super::without_language_marks("a (b c) (x1) ("), "a (b c) (x1) (");
        let ipa = super::phonemize("Ich liebe New York und das Wetter", "de").unwrap();
        assert!(!ipa.contains("(en)") && !ipa.contains("(de)") && !ipa.is_empty(), "{ipa:?}");
    }

    /// The vocoder's pieces cover every frame once, in order, the first short, each next twice
    /// the last, a short tail joined to the piece before it.
    #[test]
    fn pieces_cover_the_frames() {
        use super::{pieces, FIRST_PIECE_FRAMES as F};
        assert!(pieces(0).is_empty());
        assert_eq!(pieces(5), [(0, 5)]);
        assert_eq!(pieces(F), [(0, F)]);
        assert_eq!(pieces(F + 1), [(0, F), (F, F + 1)]);
        assert_eq!(pieces(F * 3 + 1), [(0, F), (F, F * 3 + 1)]);
        assert_eq!(pieces(F * 7 + 1), [(0, F), (F, F * 3), (F * 3, F * 7 + 1)]);
        for frames in 1..400 {
            let p = pieces(frames);
            assert_eq!(p[0], (0, frames.min(F)));
            assert_eq!(p.last().unwrap().1, frames);
            assert!(p.windows(2).all(|w| w[0].1 == w[1].0), "{p:?}");
            // After the first, no piece is shorter than the one before it, nor more than three
            // times as long (twice, and a tail shorter than that).
            assert!(p[1..].windows(2).all(|w| w[1].1 - w[1].0 >= w[0].1 - w[0].0), "{p:?}");
            assert!(p.windows(2).all(|w| w[1].1 - w[1].0 < 4 * (w[0].1 - w[0].0)), "{p:?}");
        }
    }

    /// Clauses come in order, each with its punctuation, and none after `each` says stop.
    #[test]
    fn clauses_one_at_a_time() {
        let text = "Yes, the capital is Paris. Rome is next!";
        let all = super::phonemize_clauses(text, "en-us").unwrap();
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(all[0].ends_with(',') && all[1].ends_with('.') && all[2].ends_with('!'), "{all:?}");
        let mut seen = Vec::new();
        super::each_clause(text, "en-us", &mut |ipa| {
            seen.push(ipa);
            Ok(seen.len() < 2)
        })
        .unwrap();
        assert_eq!(seen, all[..2]);
    }

    /// A clause with nothing to say is not a run of its own: "Yes. . ." gave the vocoder a "."
    /// and a "." alone, each a breath of noise.
    #[test]
    fn punctuation_alone_is_no_clause() {
        let all = super::phonemize_clauses("Yes. . . Paris , — is it?", "en-us").unwrap();
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(all.iter().all(|c| c.chars().any(|ch| ch.is_alphabetic())), "{all:?}");
    }

    /// Text in espeak-ng's phoneme brackets is read as the characters it is, not as phonemes:
    /// the words the guard read are the words said.
    #[test]
    fn phoneme_brackets_are_text() {
        let hello = super::phonemize("hello world", "en-us").unwrap();
        for text in ["[[h@l'oU]] world", "[[[h@l'oU]]] world", "x]][[h@l'oU]] world"] {
            let ipa = super::phonemize(text, "en-us").unwrap();
            assert_ne!(ipa, hello, "{text:?} was read as phonemes");
            assert!(ipa.len() > hello.len(), "{text:?}: {ipa:?}");
        }
        assert_eq!(super::speakable("a [[b]] c\0"), "a [ [b] ] c ");
    }

    /// Control characters are not espeak-ng's embedded commands: said as spaces (`\u{1}80S`
    /// doubled the rate of what followed, so the audio of a sentence was half as long).
    #[test]
    fn control_characters_are_no_commands() {
        use super::Voice;
        assert_eq!(super::speakable("a\u{1}80S b\u{7}\u{1b}c"), "a 80S b  c");
        let mut voice = super::Espeak { voice: "en-us".into() };
        let text = "hello, this sentence is spoken at its usual pace";
        let plain = voice.synthesize(&format!("{text} 80S")).unwrap().len() as f64;
        let fast = voice.synthesize(&format!("\u{1}80S {text}")).unwrap().len() as f64;
        assert!((fast / plain - 1.0).abs() < 0.15, "{fast} samples against {plain}");
    }

    /// Text that looks like options is spoken, not obeyed.
    #[test]
    fn text_is_never_an_option() {
        let ipa = super::phonemize("-v --help me", "en-us").unwrap();
        assert!(ipa.contains('h'), "{ipa:?}");
        assert!(super::phonemize("", "en-us").unwrap().is_empty());
    }
}
