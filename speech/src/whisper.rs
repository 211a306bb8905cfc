//! Whisper speech-to-text on ONNX Runtime: the encoder once per 30 s window, then greedy
//! decoding with the self-attention KV cache carried between calls (the graphs come from
//! tools/whisper-to-onnx). A call takes several tokens: the prompt at once, then the last
//! choice with a guess of what follows (from an earlier transcript of the same speech), kept
//! as far as the greedy choice confirms it. One call of 12 tokens costs 11.0 ms here against
//! 3.9-4.7 ms for one (the 8-bit decoder). Language forced or detected from the first decoder
//! step; timestamps off; audio longer than 30 s is cut at pauses the VAD finds.

use std::path::Path;

use ndarray::{Array1, Array2, Array3, ArrayD, Axis, IxDyn, Slice};
use ort::session::Session;
use ort::value::TensorRef;

use crate::mel::{Mel, HOP, N_FRAMES, N_MELS};
use crate::runtime::{session, Placement, Shapes, SpeechError};
use kazeia_memory_budget::Backend;

#[derive(Debug, Clone, serde::Deserialize)]
pub struct Meta {
    pub heads: usize,
    pub head_dim: usize,
    pub decoder_layers: usize,
    pub vocab_size: usize,
    pub max_positions: usize,
    pub suppress_ids: Vec<u32>,
    pub suppress_ids_begin: Vec<u32>,
    pub lang_ids: Vec<u32>,
    pub languages: Vec<String>,
}

const EOT: u32 = 50257;
const SOT: u32 = 50258;
const TRANSCRIBE: u32 = 50359;
const NO_TIMESTAMPS: u32 = 50363;
/// `<|nocaptions|>`: its probability right after `<|startoftranscript|>` is Whisper's own
/// "no speech here".
const NO_SPEECH: u32 = 50362;
/// Ids from here up are special (tasks, timestamps): never part of a transcript.
const FIRST_SPECIAL: u32 = 50358;
/// Most tokens decoded per 30 s window (Whisper's own limit is 448 positions).
const MAX_TOKENS: usize = 220;
/// Most guessed tokens checked in one decoder call. Measured here (whisper base, 8-bit decoder,
/// 2 threads, a 30 s window's cross-attention): a call of 1 token takes 3.9-4.7 ms, of 4
/// tokens 6.5-6.7, of 12 11.0, of 24 18.3-18.8; a wrong guess costs ~0.6 ms a token, a right
/// one saves ~4. (Float32: 9.1-9.5, 10.7-11.6, 14.0-14.9, 20.7-20.8.)
const MAX_GUESS: usize = 24;

/// A choice read from a call that held guesses is made again without them when its two best
/// logits are closer than this. The 8-bit decoder's kernels for one row and for several differ
/// a little (tools/whisper-to-onnx: 0.008 on a Xeon, 0.125 on an AVX2-only EPYC on its smoke
/// input, a real window; up to 0.44 on random features), so a near tie could go the other way
/// than in the one-token call a transcription without a hint makes: on an AVX-512 Xeon a French
/// clip came out "biopadés" with its whole transcript as the hint, "biopali" without. At 0.5,
/// espeak-ng French (near noise for Whisper base) had so many ties that a whole hint cost more
/// calls than none (15 against 11).
const TIE: f32 = 0.2;

/// A partial transcript's encoder window: the audio and 15 s of the silence Whisper pads with
/// (in steps of 1 s, at most 30 s). A 3 s utterance runs an 18 s window, its encoder 96-104 ms
/// instead of 214-249 for the whole 30 s window here (int8, 2 threads), and the decoder's
/// cross-attention shrinks alike. The graph slices its positional embedding to the input's
/// length, as whisper.cpp's `audio_ctx` does. Partials only (drafts while the user speaks, shown
/// and prefilled ahead): a turn's own transcript is cut to [`TURN_MARGIN`] in `[speech]
/// cut_languages` (English), else whole ([`FULL_WINDOW_MARGIN`]). Word errors at 30 / 20 / 15 / 12 s of margin
/// (`tools/bench-stt --margins`: 37 English sentences by the Piper voice and by espeak-ng, 16
/// French by espeak-ng, each clean and under noise, the language detected as partials have
/// it): English 0.127 / 0.115 / 0.110 / 0.120, French 0.935 / 1.050 / 1.080 / 0.947, encoder
/// 39.4 / 25.8 / 18.1 / 14.4 s in all; with the language given and a quarter of the noise,
/// English 0.084 / 0.081 / 0.081 / 0.074, French 0.901 / 0.851 / 0.844 / 0.824. 26-38% of the
/// transcripts change either way, as near-ties do. French cannot be judged on these clips
/// (Whisper base mishears espeak-ng's French whatever the window); English partials are as
/// good cut. But on the speech tests' sentences (5 English by the Piper voice without its
/// noise and by espeak-ng, clean and noisy) 15 s made 0.125 against 0.070 ("but trained to the
/// city", "I cut up on coffee"), 20 s 0.100, 12 s 0.110 on a Xeon: over +0.02 of our whole
/// window (the reference was not measured there), so not for the transcript the Thinker
/// answers. #12's bar is the reference (faster-whisper) +0.02: on an AVX2-only EPYC, the same
/// sentences gave 0.085 at 15 s, 0.105 whole and 0.120 for the reference (180 clips: 0.108 /
/// 0.127 / 0.119), which would pass in English; but the speech tests' French gate (espeak-ng's
/// 5 sentences, ours within +0.02 of faster-whisper's 0.897) failed with the turn's transcript
/// cut: 0.974 at 15 s, 0.949 at 20 s and even at 25 s (a 28 s window for a 3 s clip): on speech
/// Whisper base barely follows, any change of window changes the words. So whole windows for
/// French; English turn transcripts run cut (`[speech] cut_languages`, session 20: bench-voice
/// on that EPYC, STT after the end of the turn 508 -> 205 ms, p50 1864 -> 1423 ms with every
/// language cut). Under 12 s errors rise everywhere (10 s: French
/// +0.06 on 84 clips; 0.7-2 s turned the voice test's "capital of France" to "friends").
pub const PARTIAL_MARGIN: usize = 1500;
/// A turn transcript's encoder window in `[speech] cut_languages` (English): the audio and 20 s
/// of Whisper's padding, not a partial's 15 s. At 15 s the voice test's Piper clip "What is the
/// capital of France?" was heard "... capital of friends?" (twice, and the Thinker answered "New
/// York City"); at 20 s, "France" (twice). On a Xeon the speech tests' sentences gave 0.100 at
/// 20 s against 0.125 at 15 s (0.070 whole), 180 clips 0.115 against 0.127 whole.
pub const TURN_MARGIN: usize = 2000;
/// A margin that always gives the whole 30 s window: the default.
pub const FULL_WINDOW_MARGIN: usize = N_FRAMES;

pub struct Whisper {
    encoder: Session,
    decoder: Session,
    pub meta: Meta,
    vocab: Vec<Vec<u8>>,
    mel: Mel,
    pub placement: Placement,
    /// The encoder takes any number of frames (tools/whisper-to-onnx since the length-dynamic
    /// graph); else exactly 3000.
    dynamic: bool,
    /// Whether the encoder has run a whole 30 s window since it loaded. Until it has, every
    /// window is whole: ONNX Runtime's arena then holds the largest window's activations in
    /// one region, which every shorter window fits in. Windows that grew run after run left
    /// the arena in pieces that each new size outgrew: 16 s to 30 s in steps of 1 s peaked
    /// 82 MB over the whole window's peak (469 MB against 387), largest first added 3.
    whole_seen: bool,
    /// The decoder takes several tokens per call (tools/whisper-to-onnx since the causal
    /// mask); else exactly one, and guesses are not tried.
    batched: bool,
    /// The language the last detection found: the next detection's guess.
    last_language: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Transcript {
    pub text: String,
    pub language: String,
    pub tokens: usize,
    pub encoder_ms: f64,
    pub decoder_ms: f64,
    /// The probability of `<|nocaptions|>` after `<|startoftranscript|>` (the lowest over
    /// the windows: speech in any window is speech).
    pub no_speech_prob: f32,
    /// The mean log-probability of the decoded tokens and the end token.
    pub avg_logprob: f32,
    /// The decoded token ids: the next transcription of the same speech takes them as its
    /// guess ([`Whisper::transcribe_window`]'s `hint`).
    #[serde(skip)]
    pub ids: Vec<u32>,
    /// The encoder's windows, in frames of 10 ms (summed over the windows of audio over 30 s; a
    /// window transcribed again whole counts its whole window, while `encoder_ms` has both runs).
    #[serde(skip)]
    pub frames: usize,
    /// Decoder runs made: one for a given or rightly guessed language's prompt (two when the
    /// language is detected without a guess, or guessed wrong), then one per token, fewer
    /// where the hint's guesses held. One per token fed with a decoder graph that takes one.
    pub decoder_calls: usize,
    /// Of those, calls made again without the hint's guesses, for a near tie ([`TIE`]).
    #[serde(skip)]
    pub ties: usize,
}

impl Transcript {
    /// Whisper's own rule for a window it heard nothing in (openai-whisper and faster-whisper
    /// skip such a window): `<|nocaptions|>` over `threshold` (their default 0.6) and the text
    /// decoded with little confidence (mean log-probability under -1). The confidence clause
    /// keeps clear speech that merely starts oddly. No text is no speech too: over 30 s, only
    /// the VAD's utterances are transcribed, and a click then 35 s of silence had none (an
    /// empty transcript was answered as a question). So is a figure that is not a number.
    pub fn is_no_speech(&self, threshold: f32) -> bool {
        self.text.trim().is_empty()
            || self.no_speech_prob.is_nan()
            || self.avg_logprob.is_nan()
            || (self.no_speech_prob > threshold && self.avg_logprob < -1.0)
    }
}

/// `ln(softmax(logits)[i])`, over the entries that are not -inf.
fn log_prob(logits: &[f32], i: usize) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    logits[i] - max - sum.ln()
}

/// GPT-2's byte-level alphabet: the printable stand-in character of every byte, reversed.
fn byte_decoder() -> std::collections::HashMap<char, u8> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    bs.into_iter().zip(cs).map(|(b, c)| (char::from_u32(c).expect("valid"), b as u8)).collect()
}

impl Whisper {
    /// Load `dir` (encoder.onnx, decoder.onnx, whisper.json, vocabulary.txt).
    pub fn load(dir: &Path, threads: usize, backend: Backend) -> Result<Whisper, SpeechError> {
        let meta_path = dir.join("whisper.json");
        let meta: Meta = serde_json::from_str(
            &std::fs::read_to_string(&meta_path).map_err(|_| SpeechError::Missing(meta_path.clone()))?,
        )
        .map_err(|e| SpeechError::BadModel { path: meta_path.clone(), message: e.to_string() })?;
        let vocab_path = dir.join("vocabulary.txt");
        let text = std::fs::read_to_string(&vocab_path).map_err(|_| SpeechError::Missing(vocab_path.clone()))?;
        let bytes = byte_decoder();
        let vocab: Vec<Vec<u8>> =
            text.lines().map(|t| t.chars().map(|c| bytes.get(&c).copied().unwrap_or(b'?')).collect()).collect();
        if vocab.len() != meta.vocab_size {
            return Err(SpeechError::BadModel {
                path: vocab_path,
                message: format!("{} tokens, the model has {}", vocab.len(), meta.vocab_size),
            });
        }
        let (encoder, placement) = session(&dir.join("encoder.onnx"), threads, backend, Shapes::Fixed)?;
        let (decoder, _) = session(&dir.join("decoder.onnx"), threads, backend, Shapes::Varying)?;
        // Encoders converted before the length-dynamic graph take exactly 3000 frames.
        let dynamic = encoder
            .inputs()
            .first()
            .and_then(|i| i.dtype().tensor_shape().map(|s| s.get(2).is_some_and(|&d| d < 0)))
            .unwrap_or(false);
        let batched = decoder
            .inputs()
            .first()
            .and_then(|i| i.dtype().tensor_shape().map(|s| s.get(1).is_some_and(|&d| d < 0)))
            .unwrap_or(false);
        Ok(Whisper {
            encoder,
            decoder,
            meta,
            vocab,
            mel: Mel::new(),
            placement,
            dynamic,
            whole_seen: false,
            batched,
            last_language: None,
        })
    }

    /// The language the last detection found (Whisper's code), if any.
    pub fn last_language(&self) -> Option<&str> {
        self.last_language.map(|l| self.meta.languages[l].as_str())
    }

    /// Frames the encoder runs on for `samples`: the audio's and `margin` (frames of silence
    /// after it: [`FULL_WINDOW_MARGIN`], [`TURN_MARGIN`] or [`PARTIAL_MARGIN`]), in
    /// steps of 1 s, at most 30 s; always 30 s for an encoder converted with a fixed input, and
    /// until a whole window has run (`whole_seen`).
    pub fn window_frames(&self, samples: usize, margin: usize) -> usize {
        if !self.dynamic || !self.whole_seen {
            return N_FRAMES;
        }
        let frames = samples.div_ceil(HOP).saturating_add(margin);
        frames.div_ceil(100).saturating_mul(100).min(N_FRAMES)
    }

    fn encode(
        &mut self,
        samples: &[f32],
        frames: usize,
        options: Option<&ort::session::RunOptions>,
    ) -> Result<Vec<ArrayD<f32>>, SpeechError> {
        let mel = Array3::from_shape_vec((1, N_MELS, frames), self.mel.compute_frames(samples, frames))
            .map_err(|e| SpeechError::Run(e.to_string()))?;
        let inputs = ort::inputs!["mel" => TensorRef::from_array_view(&mel)?];
        let out = match options {
            Some(o) => self.encoder.run_with_options(inputs, o)?,
            None => self.encoder.run(inputs)?,
        };
        self.whole_seen |= frames == N_FRAMES;
        let mut cross = Vec::with_capacity(2 * self.meta.decoder_layers);
        for i in 0..self.meta.decoder_layers {
            for kv in ["k", "v"] {
                cross.push(out[format!("cross_{kv}_{i}").as_str()].try_extract_array::<f32>()?.to_owned());
            }
        }
        Ok(cross)
    }

    /// The logits after each of `tokens`, fed at `position` on: one row per token, the cache
    /// grown by as many. One call when the decoder takes several tokens, else one per token.
    fn decode(
        &mut self,
        tokens: &[u32],
        position: usize,
        past: &mut Vec<ArrayD<f32>>,
        cross: &[ArrayD<f32>],
    ) -> Result<Vec<Vec<f32>>, SpeechError> {
        // The graph's causal mask takes the cache to hold exactly positions 0..position.
        debug_assert!(past.first().is_none_or(|p| p.shape()[2] == position));
        if !self.batched && tokens.len() > 1 {
            let mut rows = Vec::with_capacity(tokens.len());
            for (i, &t) in tokens.iter().enumerate() {
                rows.extend(self.decode(&[t], position + i, past, cross)?);
            }
            return Ok(rows);
        }
        let tok = Array2::from_shape_vec((1, tokens.len()), tokens.iter().map(|&t| i64::from(t)).collect())
            .map_err(|e| SpeechError::Run(e.to_string()))?;
        let pos: Array1<i64> = (position..position + tokens.len()).map(|p| p as i64).collect();
        let mut inputs =
            ort::inputs!["token" => TensorRef::from_array_view(&tok)?, "position" => TensorRef::from_array_view(&pos)?];
        for i in 0..self.meta.decoder_layers {
            inputs.push((format!("past_k_{i}").into(), TensorRef::from_array_view(&past[2 * i])?.into()));
            inputs.push((format!("past_v_{i}").into(), TensorRef::from_array_view(&past[2 * i + 1])?.into()));
            inputs.push((format!("cross_k_{i}").into(), TensorRef::from_array_view(&cross[2 * i])?.into()));
            inputs.push((format!("cross_v_{i}").into(), TensorRef::from_array_view(&cross[2 * i + 1])?.into()));
        }
        let out = self.decoder.run(inputs)?;
        let logits = out["logits"].try_extract_array::<f32>()?;
        let rows = logits.rows().into_iter().map(|r| r.to_vec()).collect();
        let mut next = Vec::with_capacity(past.len());
        for i in 0..self.meta.decoder_layers {
            next.push(out[format!("present_k_{i}").as_str()].try_extract_array::<f32>()?.to_owned());
            next.push(out[format!("present_v_{i}").as_str()].try_extract_array::<f32>()?.to_owned());
        }
        *past = next;
        Ok(rows)
    }

    /// The decoder's prompt for language `l` (an index into `meta.languages`).
    fn prompt(&self, l: usize) -> Vec<u32> {
        vec![SOT, self.meta.lang_ids[l], TRANSCRIBE, NO_TIMESTAMPS]
    }

    /// The greedy choice from one row of logits (special and suppressed tokens masked, as
    /// Whisper does), with its log-probability.
    fn pick(&self, logits: &mut [f32], first: bool) -> (u32, f32) {
        for &s in &self.meta.suppress_ids {
            logits[s as usize] = f32::NEG_INFINITY;
        }
        if first {
            for &s in &self.meta.suppress_ids_begin {
                logits[s as usize] = f32::NEG_INFINITY;
            }
        }
        for l in logits.iter_mut().skip(FIRST_SPECIAL as usize) {
            *l = f32::NEG_INFINITY;
        }
        let tok = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap_or(EOT as usize);
        (tok as u32, log_prob(logits, tok))
    }

    fn empty_cache(&self) -> Vec<ArrayD<f32>> {
        let shape = IxDyn(&[1, self.meta.heads, 0, self.meta.head_dim]);
        (0..2 * self.meta.decoder_layers).map(|_| ArrayD::zeros(shape.clone())).collect()
    }

    /// Transcribe up to 30 s of 16 kHz mono audio. `language`: a Whisper code (`fr`, `en`, …)
    /// or None to detect it among `candidates` (all of Whisper's when empty: a French-first app
    /// says `["fr", "en"]`, so that robotic or accented French is not heard as Thai).
    /// `hint`: token ids that likely come out (an earlier transcript of the same speech, its
    /// [`Transcript::ids`]), or none. `margin`: frames of silence after the audio in the
    /// encoder's window ([`Whisper::window_frames`]). Each call feeds the next token with what
    /// the hint says follows it, and keeps those the greedy choice confirms: the transcript is
    /// the one without a hint (each token is still the model's own choice), in fewer calls.
    /// `cancel` is checked between calls (cancelled before the first, the transcript is empty
    /// and its language and no-speech probability unknown: 1.0); `encoder_options` (a
    /// [`crate::Stop`]'s) can stop the encoder's run. Detection guesses the language it found
    /// last (a user mostly speaks on in one language): right, the prompt is one call.
    #[allow(clippy::too_many_arguments)]
    pub fn transcribe_window(
        &mut self,
        samples: &[f32],
        language: Option<&str>,
        candidates: &[String],
        hint: &[u32],
        margin: usize,
        cancel: &dyn Fn() -> bool,
        encoder_options: Option<&ort::session::RunOptions>,
    ) -> Result<Transcript, SpeechError> {
        let t0 = std::time::Instant::now();
        let frames = self.window_frames(samples.len(), margin);
        let cross = self.encode(samples, frames, encoder_options)?;
        let encoder_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = std::time::Instant::now();
        let mut past = self.empty_cache();
        let mut calls = 0;
        // <|startoftranscript|>: its logits give the no-speech probability and, unless the
        // language is given, detect it; then the task's tokens. A given language makes the
        // whole prompt one call.
        let allowed: Vec<bool> =
            self.meta.languages.iter().map(|l| candidates.is_empty() || candidates.contains(l)).collect();
        // `unsure`: the language in `feed` is the one detected last time, to be confirmed by
        // the first call's row for <|startoftranscript|> (one call instead of two when right;
        // a user mostly speaks on in the language they spoke).
        let (mut lang_idx, mut feed, mut position, mut unsure) = match language {
            Some(code) => {
                let l = self
                    .meta
                    .languages
                    .iter()
                    .position(|l| l == code)
                    .ok_or_else(|| SpeechError::Audio(format!("unknown language {code:?}")))?;
                (l, self.prompt(l), 0, false)
            }
            // A one-token decoder graph would pay a wrong guess token by token: no guess.
            None => match self.last_language.filter(|&l| self.batched && allowed[l]) {
                Some(l) => (l, self.prompt(l), 0, true),
                None => (0, vec![SOT], 0, true),
            },
        };
        let mut no_speech_prob = None;
        let max_guess = if self.batched { MAX_GUESS } else { 0 };
        let mut out: Vec<u32> = Vec::new();
        // Each token's log-probability, `out`'s and then the end's (a loop cut takes its
        // repeats' out of the average as well).
        let mut lps: Vec<f32> = Vec::new();
        // The next call makes no guess (a near tie is decided again as without a hint).
        let (mut exact, mut ties) = (false, 0);
        // Each call: `feed` (tokens surely in the transcript: the prompt, or the last choice)
        // and a guess of what follows; the choices are read from the rows while they agree
        // with the guess, and the cache is cut back to what was kept. (The last row may give a
        // token at the last position, where the one-token loop stopped before; MAX_TOKENS
        // keeps a transcript far from Whisper's 448 positions.)
        while position + feed.len() <= self.meta.max_positions && !cancel() {
            let room = self.meta.max_positions - position - feed.len();
            // No guess past the token cap: the token that reaches it ends the decoding.
            let cap = max_guess.min(room).min(MAX_TOKENS - out.len() - 1);
            let guess = if feed == [SOT] || std::mem::take(&mut exact) { &[] } else { guess(hint, &out, cap) };
            let tokens: Vec<u32> = feed.iter().chain(guess).copied().collect();
            let at = position;
            calls += if self.batched { 1 } else { tokens.len() };
            let mut rows = self.decode(&tokens, position, &mut past, &cross)?;
            if position == 0 {
                // The row of <|startoftranscript|>: no speech, and the language.
                no_speech_prob = Some(log_prob(&rows[0], NO_SPEECH as usize).exp());
                if std::mem::take(&mut unsure) {
                    let sot = &rows[0];
                    let ids = &self.meta.lang_ids;
                    let l = (0..ids.len())
                        .filter(|&i| allowed[i])
                        .max_by(|&a, &b| sot[ids[a] as usize].total_cmp(&sot[ids[b] as usize]))
                        .unwrap_or(0);
                    self.last_language = Some(l);
                    if feed.len() == 1 || l != lang_idx {
                        // Guessed wrong (or did not guess): the prompt again from position 1.
                        lang_idx = l;
                        cut(&mut past, 1);
                        feed = self.prompt(l)[1..].to_vec();
                        position = 1;
                        continue;
                    }
                }
            }
            position += feed.len();
            let mut row = feed.len() - 1;
            let mut next = None;
            // A near tie in a call that held guesses: the row whose choice is made again.
            let mut tie = None;
            loop {
                let (tok, lp) = self.pick(&mut rows[row], out.is_empty());
                if !guess.is_empty() && lead(&rows[row], tok) < TIE {
                    tie = Some(row);
                    break;
                }
                lps.push(lp);
                if tok == EOT {
                    break;
                }
                out.push(tok);
                if cut_loop(&mut out, &mut lps) || out.len() >= MAX_TOKENS {
                    break;
                }
                match guess.get(row + 1 - feed.len()) {
                    // Guessed right: the token is in the cache and its row is computed.
                    Some(&g) if g == tok => {
                        row += 1;
                        position += 1;
                    }
                    _ => {
                        next = Some(tok);
                        break;
                    }
                }
            }
            if let Some(r) = tie {
                // The cache back to before the tied row's input, which is fed again alone
                // (the call's own tokens when it is the first row: the prompt, or the last
                // choice; else a guess already kept).
                exact = true;
                ties += 1;
                if r >= feed.len() {
                    feed = vec![tokens[r]];
                }
                position = at + r + 1 - feed.len();
                cut(&mut past, position);
                continue;
            }
            let Some(t) = next else { break };
            if tokens.len() > row + 1 {
                // Guessed wrong: the cache drops the guesses past the last one kept.
                cut(&mut past, position);
            }
            feed = vec![t];
        }
        let bytes: Vec<u8> =
            out.iter().filter(|&&t| t < EOT).flat_map(|&t| self.vocab[t as usize].iter().copied()).collect();
        Ok(Transcript {
            text: String::from_utf8_lossy(&bytes).trim().to_string(),
            language: self.meta.languages[lang_idx].clone(),
            tokens: out.len(),
            encoder_ms,
            decoder_ms: t1.elapsed().as_secs_f64() * 1e3,
            no_speech_prob: no_speech_prob.unwrap_or(1.0),
            avg_logprob: lps.iter().sum::<f32>() / (out.len() + 1) as f32,
            ids: out,
            decoder_calls: calls,
            ties,
            frames,
        })
    }
}

/// How far `tok`'s logit is above the best other one.
fn lead(logits: &[f32], tok: u32) -> f32 {
    let other = logits.iter().enumerate().filter(|&(i, _)| i != tok as usize).map(|(_, &l)| l);
    logits[tok as usize] - other.fold(f32::NEG_INFINITY, f32::max)
}

/// The self-attention cache cut back to its first `keep` positions.
fn cut(past: &mut [ArrayD<f32>], keep: usize) {
    for p in past.iter_mut() {
        *p = p.slice_axis(Axis(2), Slice::from(..keep)).to_owned();
    }
}

/// What `hint` says follows `out`, at most `max` tokens: the rest of the hint while `out` is
/// its beginning, else what follows the hint's last occurrence of `out`'s last two tokens (a
/// transcript that changed a word mid-way and then goes on as the hint did). Empty when the
/// hint says nothing.
fn guess<'h>(hint: &'h [u32], out: &[u32], max: usize) -> &'h [u32] {
    let from = if hint.starts_with(out) {
        Some(out.len())
    } else if out.len() >= 2 {
        let tail = &out[out.len() - 2..];
        hint.windows(2).rposition(|w| w == tail).map(|i| i + 2)
    } else {
        None
    };
    match from {
        Some(i) if i < hint.len() => &hint[i..hint.len().min(i + max)],
        _ => &[],
    }
}

/// A hallucination loop: the output ends with a run of 1 to 8 tokens repeated four times
/// ("oume-oume-oume-…", three tokens a turn, ran to the 220-token cap on an espeak-ng clip
/// before; the old check caught only runs of 1, 2 or 4 tokens). Speech says a word four
/// times over more rarely than a decoder loops.
fn looping(out: &[u32]) -> Option<usize> {
    (1..=8).find(|&p| {
        out.len() >= 4 * p && {
            let last = &out[out.len() - p..];
            (2..=4).all(|k| &out[out.len() - k * p..out.len() - (k - 1) * p] == last)
        }
    })
}

/// A loop at the end of `out` ends the decoding with one turn of it kept: the repeats are the
/// decoder's, not speech (they went to the Thinker as "oume-oume-oume-oume").
fn cut_loop(out: &mut Vec<u32>, lps: &mut Vec<f32>) -> bool {
    let Some(p) = looping(out) else { return false };
    out.truncate(out.len() - 3 * p);
    lps.truncate(out.len());
    true
}

#[cfg(test)]
mod tests {
    use super::{cut_loop, guess, looping};

    /// The hint's rest while the output follows it; after a changed word, what follows the
    /// hint's last occurrence of the output's last two tokens; nothing past its end.
    #[test]
    fn the_hint_guesses_what_follows() {
        let hint = [1, 2, 3, 4, 5, 6];
        assert_eq!(guess(&hint, &[], 3), [1, 2, 3]);
        assert_eq!(guess(&hint, &[1, 2], 8), [3, 4, 5, 6]);
        assert_eq!(guess(&hint, &[1, 2, 3, 4, 5, 6], 8), [] as [u32; 0], "the hint said all it knew");
        assert_eq!(guess(&hint, &[1, 2, 3, 4, 5, 6, 7], 8), [] as [u32; 0]);
        // "one two three" heard "one too three": back on the hint after the changed word.
        assert_eq!(guess(&hint, &[1, 9, 3, 4], 2), [5, 6]);
        assert_eq!(guess(&[7, 8, 1, 7, 8, 2], &[5, 7, 8], 4), [2], "its last occurrence");
        assert_eq!(guess(&hint, &[9], 4), [] as [u32; 0], "one changed token says nothing");
        assert_eq!(guess(&hint, &[9, 8], 4), [] as [u32; 0]);
        assert_eq!(guess(&[], &[1, 2], 4), [] as [u32; 0]);
        assert_eq!(guess(&hint, &[1], 0), [] as [u32; 0]);
    }

    #[test]
    fn a_loop_keeps_one_turn() {
        let mut out = vec![9, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3];
        let mut lps: Vec<f32> = (0..13).map(|i| -(i as f32)).collect();
        assert!(cut_loop(&mut out, &mut lps));
        assert_eq!(out, [9, 1, 2, 3]);
        assert_eq!(lps, [0.0, -1.0, -2.0, -3.0], "the repeats' log-probabilities go with them");
        let mut out = vec![9, 1, 2, 3, 1, 2, 3];
        assert!(!cut_loop(&mut out, &mut lps));
        assert_eq!(out.len(), 7);
    }

    #[test]
    fn loops_of_any_short_period_are_caught() {
        assert_eq!(looping(&[9, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]), Some(3));
        assert_eq!(looping(&[5, 5, 5, 5]), Some(1));
        assert_eq!(looping(&[1, 2, 3, 4, 5, 6, 7, 8].repeat(4)), Some(8));
        // Three times is not a loop yet; nor is a longer period, or a changed turn.
        assert_eq!(looping(&[1, 2, 3, 1, 2, 3, 1, 2, 3]), None);
        assert_eq!(looping(&(1..=9).collect::<Vec<u32>>().repeat(4)), None);
        assert_eq!(looping(&[1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2, 3]), None);
        assert_eq!(looping(&[]), None);
    }
}
