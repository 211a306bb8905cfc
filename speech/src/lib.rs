//! Speech through ONNX Runtime: VAD (Silero), end of turn (Smart Turn), STT (Whisper base), voices (Piper, espeak-ng),
//! audio helpers. One module per concept; `runtime` owns the process's ONNX Runtime
//! environment. Settings come as plain parameters: this crate reads no config file.

pub mod audio;
pub mod mel;
pub mod runtime;
pub mod tts;
pub mod turn;
pub mod vad;
pub mod wer;
pub mod whisper;

use std::time::Duration;

pub use runtime::{placement, Placement, SpeechError, Stop};
pub use tts::{Espeak, Piper, Voice, FIRST_PIECE_FRAMES};
pub use turn::EndOfTurn;
pub use vad::{Segment, Vad, VadEvent, VadParams};
use whisper::FULL_WINDOW_MARGIN;
pub use whisper::{Transcript, Whisper};

use std::path::PathBuf;

pub use kazeia_memory_budget::Backend;

/// Speech to text: VAD to find the utterances, Whisper on windows of at most 30 s cut at
/// pauses, the language detected on the first window and kept for the rest.
pub struct Transcriber {
    pub vad: Vad,
    pub whisper: Whisper,
    /// Languages detection chooses among (`[speech] languages`).
    pub candidates: Vec<String>,
    /// Frames of silence after the audio in a partial transcript's window
    /// ([`Transcriber::transcribe_partial_until`]).
    pub partial_margin: usize,
    /// Languages whose turn transcripts run on a cut window ([`SttParams`]).
    pub cut_languages: Vec<String>,
    /// Frames of silence after the audio in that window ([`whisper::TURN_MARGIN`]).
    pub turn_margin: usize,
}

/// Where the STT models are and how they run.
#[derive(Debug, Clone)]
pub struct SttParams {
    /// Whisper directory (encoder.onnx, decoder.onnx, whisper.json, vocabulary.txt).
    pub whisper_dir: PathBuf,
    /// Silero VAD .onnx.
    pub vad: PathBuf,
    pub backend: Backend,
    pub threads: usize,
    /// Silence that ends an utterance.
    pub vad_silence: Duration,
    /// See `VadParams::quiet`.
    pub vad_quiet: f32,
    /// Silence after the audio in a partial transcript's Whisper window (see
    /// [`whisper::PARTIAL_MARGIN`]).
    pub partial_margin: Duration,
    /// Languages whose turn transcripts ([`Transcriber::transcribe`],
    /// [`Transcriber::transcribe_until`]) run on a window cut to the audio and `turn_margin`,
    /// when the language is given or is the one detected last; the others run the whole 30 s
    /// window.
    pub cut_languages: Vec<String>,
    /// See [`whisper::TURN_MARGIN`].
    pub turn_margin: Duration,
    /// Languages detection chooses among (empty: any of Whisper's).
    pub languages: Vec<String>,
}

impl Transcriber {
    pub fn load(p: &SttParams) -> Result<Transcriber, SpeechError> {
        let params = VadParams { min_silence: p.vad_silence, quiet: p.vad_quiet, ..VadParams::default() };
        let vad = Vad::load(&p.vad, p.backend, params)?;
        let whisper = Whisper::load(&p.whisper_dir, p.threads, p.backend)?;
        // Frames of 10 ms (the log-mel's hop).
        let partial_margin = (p.partial_margin.as_millis() / 10) as usize;
        Ok(Transcriber {
            vad,
            whisper,
            candidates: p.languages.clone(),
            partial_margin,
            cut_languages: p.cut_languages.clone(),
            turn_margin: (p.turn_margin.as_millis() / 10) as usize,
        })
    }

    /// Windows of at most 30 s, cut between the VAD's utterances (one utterance longer than
    /// 30 s is cut at 30 s). Short audio is one window as it is.
    pub fn windows(&mut self, audio: &[f32]) -> Result<Vec<Segment>, SpeechError> {
        const MAX: usize = mel::WINDOW_SAMPLES;
        if audio.len() <= MAX {
            return Ok(vec![Segment { start: 0, end: audio.len() }]);
        }
        Ok(pack(self.vad.segments(audio)?, MAX))
    }

    /// A turn's transcript, on the window [`Transcriber::turn_window_margin`] says.
    /// `hint`: the token ids of an earlier transcript of the same speech ([`Transcript::ids`]),
    /// or none: the decoder's guess, which gives the same text in fewer calls (see
    /// [`Whisper::transcribe_window`]).
    pub fn transcribe(
        &mut self,
        audio: &[f32],
        language: Option<&str>,
        hint: &[u32],
        cancel: &dyn Fn() -> bool,
    ) -> Result<Transcript, SpeechError> {
        self.run(audio, language, hint, true, cancel, None)
    }

    /// As [`Transcriber::transcribe`], stopped by `stop` (inside the encoder too).
    pub fn transcribe_until(
        &mut self,
        audio: &[f32],
        language: Option<&str>,
        hint: &[u32],
        stop: &Stop,
    ) -> Result<Transcript, SpeechError> {
        self.run(audio, language, hint, true, &|| stop.is_stopped(), Some(stop))
    }

    /// The margin of a turn's transcript: `turn_margin` if the language (`language`, else the
    /// one Whisper detected last: its guess, a user mostly speaks on in one language) is in
    /// `cut_languages`, else the whole window. A guess the detection proves wrong runs the
    /// window again whole ([`Transcriber::run`]).
    pub fn turn_window_margin(&self, language: Option<&str>) -> usize {
        match language.or_else(|| self.whisper.last_language()) {
            Some(l) if self.cut_languages.iter().any(|c| c == l) => self.turn_margin,
            _ => FULL_WINDOW_MARGIN,
        }
    }

    /// As [`Transcriber::transcribe_until`], for a partial transcript (the words so far while
    /// the user speaks, never the turn's own): Whisper's window is the audio and
    /// `partial_margin`, not 30 s, whatever the language ([`whisper::PARTIAL_MARGIN`] says why
    /// a turn's transcript is cut only in `cut_languages`).
    pub fn transcribe_partial_until(
        &mut self,
        audio: &[f32],
        language: Option<&str>,
        hint: &[u32],
        stop: &Stop,
    ) -> Result<Transcript, SpeechError> {
        self.run(audio, language, hint, false, &|| stop.is_stopped(), Some(stop))
    }

    /// `turn`: the transcript a turn answers (its window: [`Transcriber::turn_window_margin`]), else a
    /// partial (`partial_margin`).
    fn run(
        &mut self,
        audio: &[f32],
        language: Option<&str>,
        hint: &[u32],
        turn: bool,
        cancel: &dyn Fn() -> bool,
        stop: Option<&Stop>,
    ) -> Result<Transcript, SpeechError> {
        let mut lang = language.map(str::to_string);
        let mut all = Transcript {
            text: String::new(),
            language: String::new(),
            tokens: 0,
            encoder_ms: 0.0,
            decoder_ms: 0.0,
            no_speech_prob: 1.0,
            avg_logprob: 0.0,
            ids: Vec::new(),
            decoder_calls: 0,
            ties: 0,
            frames: 0,
        };
        let (mut logprob_sum, mut scored) = (0.0, 0usize);
        for (i, w) in self.windows(audio)?.into_iter().enumerate() {
            if cancel() {
                break;
            }
            // The hint starts where the audio does: later windows would only guess its start.
            let hint = if i == 0 { hint } else { &[] };
            let margin = if turn { self.turn_window_margin(lang.as_deref()) } else { self.partial_margin };
            let mut t = self.whisper.transcribe_window(
                &audio[w.start..w.end],
                lang.as_deref(),
                &self.candidates,
                hint,
                margin,
                cancel,
                stop.map(Stop::options),
            )?;
            // A turn's window cut on the language detected last, which this audio proved wrong
            // (the user went on in French): again on the whole window, in the language found,
            // so no turn in another language is answered from a cut window. A switch pays one
            // cut run more. (A window the cut margin left whole, 10 s of audio and more, stands.)
            let whole = self.whisper.window_frames(w.end - w.start, FULL_WINDOW_MARGIN);
            if turn && lang.is_none() && t.frames < whole && !self.cut_languages.contains(&t.language) {
                if cancel() {
                    break;
                }
                let cut = t;
                // The cut run's words, as a guess, unless the caller gave a hint.
                let hint = if hint.is_empty() { &cut.ids[..] } else { hint };
                t = self.whisper.transcribe_window(
                    &audio[w.start..w.end],
                    Some(&cut.language),
                    &self.candidates,
                    hint,
                    FULL_WINDOW_MARGIN,
                    cancel,
                    stop.map(Stop::options),
                )?;
                t.encoder_ms += cut.encoder_ms;
                t.decoder_ms += cut.decoder_ms;
                t.decoder_calls += cut.decoder_calls;
                t.ties += cut.ties;
            }
            lang.get_or_insert(t.language.clone());
            if !all.text.is_empty() && !t.text.is_empty() {
                all.text.push(' ');
            }
            all.text.push_str(&t.text);
            all.language = t.language;
            all.tokens += t.tokens;
            all.ids.extend(&t.ids);
            all.decoder_calls += t.decoder_calls;
            all.ties += t.ties;
            all.frames += t.frames;
            all.encoder_ms += t.encoder_ms;
            all.decoder_ms += t.decoder_ms;
            all.no_speech_prob = all.no_speech_prob.min(t.no_speech_prob);
            // Each window's mean covers its tokens and its end token.
            logprob_sum += t.avg_logprob * (t.tokens + 1) as f32;
            scored += t.tokens + 1;
            all.avg_logprob = logprob_sum / scored as f32;
        }
        Ok(all)
    }
}

/// A voice: `espeak:<voice>` (espeak-ng) or a Piper .onnx with its .onnx.json beside it.
#[derive(Debug, Clone, PartialEq)]
pub enum VoiceSpec {
    Espeak(String),
    Piper(PathBuf),
}

/// Load the voice `spec` names; `noise` false: a Piper voice without its sampled noise
/// ([`Piper::without_noise`]; espeak-ng samples none).
pub fn voice(spec: &VoiceSpec, threads: usize, backend: Backend, noise: bool) -> Result<Box<dyn Voice>, SpeechError> {
    match spec {
        VoiceSpec::Espeak(v) => Ok(Box::new(Espeak { voice: v.clone() })),
        VoiceSpec::Piper(path) => {
            let piper = Piper::load(path, threads, backend)?;
            Ok(Box::new(if noise { piper } else { piper.without_noise() }))
        }
    }
}

/// The VAD's silence default, for config.
pub fn default_vad_silence() -> Duration {
    VadParams::default().min_silence
}

/// The VAD's utterances (in order, apart) packed into windows of at most `max` samples: an
/// utterance joins the window before it when the two fit in `max` together (the silence
/// between them too), one longer than `max` is cut every `max` samples.
fn pack(segments: impl IntoIterator<Item = Segment>, max: usize) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    for mut s in segments {
        while s.end - s.start > max {
            out.push(Segment { start: s.start, end: s.start + max });
            s.start += max;
        }
        match out.last_mut() {
            Some(w) if s.end - w.start <= max => w.end = s.end,
            _ => out.push(s),
        }
    }
    out
}

#[cfg(test)]
mod pack_tests {
    use super::{pack, Segment};

    fn seg(start: usize, end: usize) -> Segment {
        Segment { start, end }
    }

    #[test]
    fn utterances_share_a_window_while_they_fit() {
        assert_eq!(pack([seg(0, 10), seg(20, 30), seg(35, 45)], 40), [seg(0, 30), seg(35, 45)]);
        assert_eq!(pack([seg(0, 10), seg(20, 40)], 40), [seg(0, 40)], "exactly the window");
        assert_eq!(pack([seg(5, 100)], 40), [seg(5, 45), seg(45, 85), seg(85, 100)]);
        assert_eq!(pack([seg(0, 80)], 40), [seg(0, 40), seg(40, 80)], "no empty tail");
        // A long utterance's tail does not join the window it was cut from, but the next one.
        assert_eq!(pack([seg(0, 50), seg(55, 60)], 40), [seg(0, 40), seg(40, 60)]);
        assert!(pack([], 40).is_empty());
    }

    /// Every utterance's audio is in exactly one window, windows are in order, apart, at most
    /// `max` long, and each starts and ends at an utterance's sample (or a cut of one).
    #[test]
    fn windows_cover_every_utterance_once() {
        let mut rng = 0x2545_f491_u64;
        let mut next = |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n as u64) as usize
        };
        for _ in 0..2000 {
            let max = 1 + next(60);
            let (mut at, mut segs) = (0, Vec::new());
            for _ in 0..next(8) {
                let start = at + next(30);
                let end = start + 1 + next(150);
                segs.push(seg(start, end));
                at = end + 1;
            }
            let windows = pack(segs.clone(), max);
            assert!(windows.iter().all(|w| w.start < w.end && w.end - w.start <= max), "{max} {windows:?}");
            assert!(windows.windows(2).all(|p| p[0].end <= p[1].start), "{windows:?}");
            for s in &segs {
                let covered: usize =
                    windows.iter().map(|w| w.end.min(s.end).saturating_sub(w.start.max(s.start))).sum();
                assert_eq!(covered, s.end - s.start, "{s:?} in {windows:?} (max {max})");
            }
        }
    }
}
