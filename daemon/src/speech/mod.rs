//! Speech through ONNX Runtime: VAD (Silero), STT (Whisper base), audio helpers. One module per
//! concept; `runtime` owns the process's ONNX Runtime environment.

pub mod audio;
pub mod mel;
pub mod runtime;
pub mod tts;
pub mod vad;
pub mod wer;
pub mod whisper;

use std::time::Duration;

pub use runtime::{Placement, SpeechError};
pub use vad::{Segment, Vad, VadEvent, VadParams};
pub use tts::{Espeak, Piper, Voice};
pub use whisper::{Transcript, Whisper};

use crate::config::Config;

/// Speech to text: VAD to find the utterances, Whisper on windows of at most 30 s cut at
/// pauses, the language detected on the first window and kept for the rest.
pub struct Transcriber {
    pub vad: Vad,
    pub whisper: Whisper,
    /// Languages detection chooses among (`[speech] languages`).
    pub candidates: Vec<String>,
}

impl Transcriber {
    pub fn load(config: &Config) -> Result<Transcriber, SpeechError> {
        let s = &config.speech;
        let params = VadParams { min_silence: s.vad_silence, ..VadParams::default() };
        let vad = Vad::load(&config.cache_path(&s.vad), s.backend, params)?;
        let whisper = Whisper::load(&config.cache_path(&s.stt), s.threads, s.backend)?;
        Ok(Transcriber { vad, whisper, candidates: s.languages.clone() })
    }

    /// Windows of at most 30 s, cut between the VAD's utterances (one utterance longer than
    /// 30 s is cut at 30 s). Short audio is one window as it is.
    pub fn windows(&mut self, audio: &[f32]) -> Result<Vec<Segment>, SpeechError> {
        const MAX: usize = mel::WINDOW_SAMPLES;
        if audio.len() <= MAX {
            return Ok(vec![Segment { start: 0, end: audio.len() }]);
        }
        let mut out: Vec<Segment> = Vec::new();
        for seg in self.vad.segments(audio)? {
            let mut s = seg;
            while s.end - s.start > MAX {
                out.push(Segment { start: s.start, end: s.start + MAX });
                s.start += MAX;
            }
            match out.last_mut() {
                Some(w) if s.end - w.start <= MAX => w.end = s.end,
                _ => out.push(s),
            }
        }
        Ok(out)
    }

    pub fn transcribe(&mut self, audio: &[f32], language: Option<&str>, cancel: &dyn Fn() -> bool) -> Result<Transcript, SpeechError> {
        let mut lang = language.map(str::to_string);
        let mut all = Transcript { text: String::new(), language: String::new(), tokens: 0, encoder_ms: 0.0, decoder_ms: 0.0 };
        for w in self.windows(audio)? {
            if cancel() {
                break;
            }
            let t = self.whisper.transcribe_window(&audio[w.start..w.end], lang.as_deref(), &self.candidates, cancel)?;
            lang.get_or_insert(t.language.clone());
            if !all.text.is_empty() && !t.text.is_empty() {
                all.text.push(' ');
            }
            all.text.push_str(&t.text);
            all.language = t.language;
            all.tokens += t.tokens;
            all.encoder_ms += t.encoder_ms;
            all.decoder_ms += t.decoder_ms;
        }
        Ok(all)
    }
}

/// The voice for `language`: `[speech] voices` maps a language to a Piper .onnx (relative to
/// the cache) or to `espeak:<voice>`; languages it does not name fall back to espeak-ng.
pub fn voice_for(config: &Config, language: &str) -> Result<Box<dyn Voice>, SpeechError> {
    let s = &config.speech;
    let spec = s.voices.get(language).cloned().unwrap_or_else(|| format!("espeak:{language}"));
    match spec.strip_prefix("espeak:") {
        Some(v) => Ok(Box::new(Espeak { voice: v.to_string() })),
        None => Ok(Box::new(Piper::load(&config.cache_path(std::path::Path::new(&spec)), s.threads, s.backend)?)),
    }
}

/// The VAD's silence default, for config.
pub fn default_vad_silence() -> Duration {
    VadParams::default().min_silence
}
