//! Silero VAD over 16 kHz mono, streaming: 512-sample chunks (32 ms) with the previous 64
//! samples as context and a [2, 1, 128] recurrent state carried between calls. An utterance
//! starts when the speech probability crosses `threshold` and ends after `min_silence` of
//! probability below `threshold - 0.15` (hysteresis, as Silero's own iterator does). With
//! `quiet` the silence counts from the end of the sound: the model's probability lags the last
//! word by 0-119 ms on clean audio (by where the chunks fall), so near-silent chunks just before
//! its verdict count as silence (off by default: see `QUIET`).

use std::path::Path;
use std::time::Duration;

use ndarray::{Array0, Array2, Array3};
use ort::session::Session;
use ort::value::TensorRef;

use crate::runtime::{session, Placement, Shapes, SpeechError};
use kazeia_memory_budget::Backend;

pub const CHUNK: usize = 512;
const CONTEXT: usize = 64;

#[derive(Debug, Clone, Copy)]
pub struct VadParams {
    pub threshold: f32,
    /// Silence that ends an utterance.
    pub min_silence: Duration,
    /// Speech shorter than this is a click, not an utterance.
    pub min_speech: Duration,
    /// Kept around each utterance (Whisper wants the word onsets whole).
    pub pad: Duration,
    /// Up to `QUIET_BACK` chunks just before the model calls silence count as silence too when
    /// their RMS is under this fraction of the utterance's loudest chunk (0: off). Silero's
    /// probability stays high for 0-4 chunks of
    /// digital silence after the last word (18-119 ms, 67 on average, on five espeak-ng
    /// questions starting at sample 0; it moves with where the chunks fall), so a pause counted
    /// from its verdict alone ends the turn that much later.
    pub quiet: f32,
}

impl Default for VadParams {
    fn default() -> Self {
        VadParams {
            threshold: 0.5,
            min_silence: Duration::from_millis(500),
            min_speech: Duration::from_millis(250),
            pad: Duration::from_millis(100),
            // Off: see `QUIET`.
            quiet: 0.0,
        }
    }
}

/// An utterance, in samples from the start of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Segment {
    pub start: usize,
    pub end: usize,
}

/// What a chunk changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VadEvent {
    /// Speech began at this sample (barge-in: a reply being spoken must stop).
    SpeechStart(usize),
    /// The utterance ended (end of turn).
    SpeechEnd(Segment),
}

pub struct Vad {
    session: Session,
    state: Array3<f32>,
    context: [f32; CONTEXT],
    params: VadParams,
    /// Samples seen.
    pos: usize,
    speech_start: Option<usize>,
    /// Where the silence going on began: the end of the sound, up to `QUIET_BACK` chunks before
    /// `off_at`, the chunk the model called silence. Speech is long enough to be an utterance
    /// (`min_speech`) by the model's verdict, as before the back-dating: a short word must not
    /// become a click.
    silence_since: Option<usize>,
    off_at: Option<usize>,
    /// Where the last chunk that was not silence (probability ≥ threshold − 0.15) ended.
    heard_until: usize,
    /// The utterance's loudest chunk (RMS), and the last chunks' RMS, newest last.
    peak: f32,
    levels: [f32; QUIET_BACK],
    /// Samples of the chunks at or over the threshold, and with sound in them (RMS at least
    /// `QUIET` of the loudest), since the utterance began.
    voiced: usize,
    pub placement: Placement,
}

const SR: usize = 16_000;

/// The `quiet` level measured for `[speech] vad_quiet`: −34 dB under the loudest chunk, below
/// most final consonants (a weak /f/ may be near it) and above a noisy room. Off by default: it
/// made the 200 ms pause 200 ms of silence after the sound, shorter than the same pause counted
/// by Silero alone (Pipecat's stop, which Smart Turn's pause is tuned with), and a spoken
/// "Good morning. The kitchen window is open." then ended its turn at the sentence's pause (the
/// JVM client's round-trip test in CI, with Piper's sampled durations); bench-voice gained
/// nothing (p50 991 with it, 966 without, alternated), as Whisper's draft is what the turn
/// then waits for.
pub const QUIET: f32 = 0.02;
/// How far back a silence may start before the model's verdict (96 ms: the lag measured, less
/// the rare 119 ms).
const QUIET_BACK: usize = 3;

fn rms(chunk: &[f32]) -> f32 {
    (chunk.iter().map(|x| x * x).sum::<f32>() / chunk.len() as f32).sqrt()
}

/// Samples of 16 kHz audio in `d`.
pub fn samples(d: Duration) -> usize {
    (d.as_secs_f64() * SR as f64) as usize
}

impl Vad {
    pub fn load(path: &Path, backend: Backend, params: VadParams) -> Result<Vad, SpeechError> {
        // One thread: a 32 ms chunk takes ~0.2 ms; more threads only cost wake-ups.
        let (session, placement) = session(path, 1, backend, Shapes::Fixed)?;
        Ok(Vad {
            session,
            state: Array3::zeros((2, 1, 128)),
            context: [0.0; CONTEXT],
            params,
            pos: 0,
            speech_start: None,
            silence_since: None,
            off_at: None,
            heard_until: 0,
            peak: 0.0,
            levels: [0.0; QUIET_BACK],
            voiced: 0,
            placement,
        })
    }

    pub fn reset(&mut self) {
        self.state.fill(0.0);
        self.context = [0.0; CONTEXT];
        self.pos = 0;
        self.speech_start = None;
        self.silence_since = None;
        self.off_at = None;
        self.heard_until = 0;
        self.peak = 0.0;
        self.levels = [0.0; QUIET_BACK];
        self.voiced = 0;
    }

    /// Samples of speech in the utterance going on (chunks at or over the threshold with sound
    /// in them: Silero's probability stays high for up to 4 chunks of silence after a sound,
    /// which are not counted); 0 when none is. A cough or a click is a chunk or three.
    pub fn voiced(&self) -> usize {
        self.voiced
    }

    /// Inside an utterance (speech began and its silence has not yet ended it).
    pub fn in_speech(&self) -> bool {
        self.speech_start.is_some()
    }

    /// Inside an utterance long enough to be one (not a click), the sample where the silence
    /// going on now began (None: speech is on, or no such utterance). A pause ends the
    /// utterance `min_silence` after it.
    pub fn silence(&self) -> Option<usize> {
        let (start, since, off) = (self.speech_start?, self.silence_since?, self.off_at?);
        (off - start >= samples(self.params.min_speech)).then_some(since)
    }

    /// The end of the last chunk that was not silence: audio after it is below threshold −
    /// 0.15 (a chunk between that and the threshold is quiet speech, not silence).
    pub fn heard_until(&self) -> usize {
        self.heard_until
    }

    /// The sample where the silence that ended `segment` began (its end, without the pad).
    pub fn silence_start(&self, segment: &Segment) -> usize {
        segment.end.saturating_sub(samples(self.params.pad))
    }

    /// Speech probability of one 512-sample chunk.
    pub fn probability(&mut self, chunk: &[f32]) -> Result<f32, SpeechError> {
        assert_eq!(chunk.len(), CHUNK, "the VAD takes 512-sample chunks");
        let mut input = Array2::zeros((1, CONTEXT + CHUNK));
        for (i, v) in self.context.iter().chain(chunk).enumerate() {
            input[[0, i]] = *v;
        }
        self.context.copy_from_slice(&chunk[CHUNK - CONTEXT..]);
        let sr = Array0::from_elem((), SR as i64);
        let out = self.session.run(ort::inputs![
            "input" => TensorRef::from_array_view(&input)?,
            "state" => TensorRef::from_array_view(&self.state)?,
            "sr" => TensorRef::from_array_view(&sr)?,
        ])?;
        let p = out["output"].try_extract_array::<f32>()?.iter().next().copied().unwrap_or(0.0);
        let s = out["stateN"].try_extract_array::<f32>()?;
        self.state = s.to_owned().into_shape_with_order((2, 1, 128)).map_err(|e| SpeechError::Run(e.to_string()))?;
        Ok(p)
    }

    /// Feed one chunk; what it changed.
    pub fn push(&mut self, chunk: &[f32]) -> Result<Option<VadEvent>, SpeechError> {
        let p = self.probability(chunk)?;
        let at = self.pos;
        self.pos += CHUNK;
        let level = rms(chunk);
        let before = self.levels;
        self.levels.rotate_left(1);
        self.levels[QUIET_BACK - 1] = level;
        let on = p >= self.params.threshold;
        let off = p < self.params.threshold - 0.15;
        if !off {
            self.heard_until = self.pos;
        }
        match self.speech_start {
            None if on => {
                self.speech_start = Some(at);
                self.silence_since = None;
                self.off_at = None;
                self.peak = level;
                self.voiced = CHUNK;
                Ok(Some(VadEvent::SpeechStart(at)))
            }
            None => Ok(None),
            Some(start) => {
                self.peak = self.peak.max(level);
                if on {
                    self.silence_since = None;
                    self.off_at = None;
                    if level >= QUIET * self.peak {
                        self.voiced += CHUNK;
                    }
                } else if off && self.silence_since.is_none() {
                    // The silence began with the quiet chunks just before this one, if any.
                    let quiet = self.params.quiet * self.peak;
                    let back = before.iter().rev().take_while(|&&l| l < quiet).count();
                    let back = back.min((at - start) / CHUNK);
                    self.silence_since = Some(at - back * CHUNK);
                    self.off_at = Some(at);
                }
                match (self.silence_since, self.off_at) {
                    (Some(since), Some(off_at)) if self.pos - since >= samples(self.params.min_silence) => {
                        self.speech_start = None;
                        self.silence_since = None;
                        self.off_at = None;
                        self.voiced = 0;
                        if off_at - start < samples(self.params.min_speech) {
                            return Ok(None);
                        }
                        let pad = samples(self.params.pad);
                        Ok(Some(VadEvent::SpeechEnd(Segment { start: start.saturating_sub(pad), end: since + pad })))
                    }
                    _ => Ok(None),
                }
            }
        }
    }

    /// Utterances of a whole recording (an utterance still open at the end closes there).
    pub fn segments(&mut self, audio: &[f32]) -> Result<Vec<Segment>, SpeechError> {
        self.reset();
        let mut out = Vec::new();
        for chunk in audio.chunks_exact(CHUNK) {
            if let Some(VadEvent::SpeechEnd(s)) = self.push(chunk)? {
                out.push(Segment { start: s.start, end: s.end.min(audio.len()) });
            }
        }
        if let Some(start) = self.speech_start {
            let end = self.silence_since.unwrap_or(audio.len());
            if self.off_at.unwrap_or(audio.len()) - start >= samples(self.params.min_speech) {
                out.push(Segment {
                    start: start.saturating_sub(samples(self.params.pad)),
                    end: (end + samples(self.params.pad)).min(audio.len()),
                });
            }
        }
        self.reset();
        Ok(out)
    }
}
