//! The speech models, loaded by the first audio turn and kept for the daemon's life, entered in
//! the ledger as `speech`.

use std::sync::{Arc, Mutex};

use kazeia_ipc::{ModelState, ModelStatus};

use crate::speech::{Placement, SpeechError, Transcriber, Voice};

use super::load::rss_bytes;
use super::Supervisor;

/// The speech models, shared by audio turns (one transcription at a time: ONNX sessions run
/// with `&mut`). Voices load on first use, per language.
pub struct SpeechStack {
    pub stt: Mutex<Transcriber>,
    stt_placement: Placement,
    vad_placement: Placement,
    voices: Mutex<std::collections::HashMap<String, Box<dyn Voice>>>,
}

impl SpeechStack {
    pub fn load(sup: &Supervisor) -> Result<SpeechStack, SpeechError> {
        let stt = crate::speech::transcriber(&sup.config)?;
        let (stt_placement, vad_placement) = (stt.whisper.placement.clone(), stt.vad.placement.clone());
        Ok(SpeechStack { stt: Mutex::new(stt), stt_placement, vad_placement, voices: Mutex::new(Default::default()) })
    }

    /// Synthesise with the voice of `language` (loaded on first use).
    pub fn say(&self, sup: &Supervisor, language: &str, text: &str) -> Result<(Vec<f32>, u32), SpeechError> {
        let mut voices = self.voices.lock().expect("voices");
        if !voices.contains_key(language) {
            voices.insert(language.to_string(), crate::speech::voice_for(&sup.config, language)?);
        }
        let v = voices.get_mut(language).expect("inserted");
        Ok((v.synthesize(text)?, v.sample_rate()))
    }
}

impl Supervisor {
    /// The speech stack, loaded on first use and entered in the ledger as role `speech`
    /// (estimate: ONNX file size × the measured factor; then the measured RSS growth). It never
    /// evicts a language model: if it does not fit, the audio turn is refused.
    pub fn speech(&self) -> Result<Arc<SpeechStack>, SpeechError> {
        if let Some(s) = self.speech.lock().expect("speech").clone() {
            return Ok(s);
        }
        // One load at a time, without holding `speech`: status reads it meanwhile.
        let _loading = self.speech_loading.lock().expect("speech loading");
        if let Some(s) = self.speech.lock().expect("speech").clone() {
            return Ok(s);
        }
        // The STT row of the plan (file sizes only: no GGUF header is read here).
        let need: u64 =
            crate::plan::speech_plans(&self.config).iter().filter(|m| m.role == "stt").map(|m| m.total_bytes).sum();
        let refused = self.ledger.lock().expect("ledger").admit("speech", need, 95, |_| true);
        match refused {
            Ok(v) if v.is_empty() => {}
            Ok(_) => {
                return Err(SpeechError::Run(format!(
                    "over budget: speech needs {need} B and would have to evict a language model"
                )))
            }
            Err(r) => return Err(SpeechError::Run(format!("over budget: {r}"))),
        }
        let before = rss_bytes();
        let stack = Arc::new(SpeechStack::load(self)?);
        let measured = before.zip(rss_bytes()).map(|(a, b)| b as i64 - a as i64);
        let file = self.config.cache_path(&self.config.speech.stt).display().to_string();
        self.ledger.lock().expect("ledger").insert("speech", &file, 95, 0, need, measured);
        let _ = self.changes.send(());
        *self.speech.lock().expect("speech") = Some(stack.clone());
        Ok(stack)
    }

    /// Status rows of the speech models (`stt`, `vad`, `tts`): where they run and why.
    pub(super) fn speech_status(&self, ledger: &kazeia_memory_budget::Ledger) -> Vec<ModelStatus> {
        let loaded = self.speech.lock().expect("speech").clone();
        let entry = ledger.get("speech");
        let sp = &self.config.speech;
        let row =
            |role: &str, file: String, device: Option<String>, placement: Option<String>, first: bool| ModelStatus {
                role: role.into(),
                state: if loaded.is_some() { ModelState::Loaded } else { ModelState::Unloaded },
                file,
                architecture: Some("onnx".into()),
                file_bytes: None,
                device,
                placement: placement.or_else(|| Some("loaded by the first audio turn".into())),
                shares_model_with: vec![],
                busy: 0,
                turns: 0,
                generated_tokens: 0,
                reserved_bytes: if first { entry.map(|e| e.reserved) } else { None },
                measured_bytes: if first { entry.and_then(|e| e.measured) } else { None },
                progress: None,
                error: None,
            };
        // Placements were copied at load: `stt` itself is locked for whole transcriptions.
        let (stt_dev, stt_why, vad_dev) = match &loaded {
            Some(s) => (
                Some(s.stt_placement.device.clone()),
                Some(s.stt_placement.reason.clone()),
                Some(s.vad_placement.device.clone()),
            ),
            None => (None, None, None),
        };
        let mut rows = vec![
            row("stt", self.config.cache_path(&sp.stt).display().to_string(), stt_dev, stt_why.clone(), true),
            row("vad", self.config.cache_path(&sp.vad).display().to_string(), vad_dev, stt_why, false),
        ];
        for (lang, v) in &sp.voices {
            rows.push(row(
                &format!("tts-{lang}"),
                v.clone(),
                None,
                Some(if v.starts_with("espeak:") {
                    "espeak-ng (CPU), loaded on first use".into()
                } else {
                    "ONNX, loaded on first use".into()
                }),
                false,
            ));
        }
        rows
    }
}
