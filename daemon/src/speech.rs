//! The speech crate with the daemon's settings: `[speech]` of models.toml turned into the
//! speech crate's parameters (paths resolved against the model cache).

pub use kazeia_speech::*;

use crate::config::Config;

/// The STT stack (`[speech] stt`, `vad`, …) as configured.
pub fn transcriber(config: &Config) -> Result<Transcriber, SpeechError> {
    Transcriber::load(&stt_params(config))
}

pub fn stt_params(config: &Config) -> SttParams {
    let s = &config.speech;
    SttParams {
        whisper_dir: config.cache_path(&s.stt),
        vad: config.cache_path(&s.vad),
        backend: s.backend,
        threads: s.threads,
        vad_silence: s.vad_silence,
        vad_quiet: s.vad_quiet,
        partial_margin: s.partial_margin,
        cut_languages: s.cut_languages(),
        turn_margin: s.turn_margin,
        languages: s.languages.clone(),
    }
}

/// The voice for `language`: `[speech] voices` maps a language to a Piper .onnx (relative to
/// the cache) or to `espeak:<voice>`; languages it does not name fall back to espeak-ng.
pub fn voice_for(config: &Config, language: &str) -> Result<Box<dyn Voice>, SpeechError> {
    let s = &config.speech;
    let spec = s.voices.get(language).cloned().unwrap_or_else(|| format!("espeak:{language}"));
    let spec = match spec.strip_prefix("espeak:") {
        Some(v) => VoiceSpec::Espeak(v.to_string()),
        None => VoiceSpec::Piper(config.cache_path(std::path::Path::new(&spec))),
    };
    voice(&spec, s.threads, s.backend, s.voice_noise)
}
