//! The speech models, loaded by the first audio turn (or `load stt`, or at start with
//! `[speech] preload`) and kept until `unload` or memory pressure (idle a minute), entered in
//! the ledger as `speech`. `status` lists them as roles `stt`, `vad`, `turn` (the end-of-turn
//! model, when configured; one stack: they load and unload together) and `tts-<lang>` (a voice
//! each); `load`/`unload` take those names.

use std::sync::{Arc, Mutex};

use kazeia_ipc::{ModelState, ModelStatus};

use crate::speech::{EndOfTurn, Placement, SpeechError, Transcriber, Voice};

use super::Supervisor;

/// The speech models, shared by audio turns (one transcription at a time: ONNX sessions run
/// with `&mut`). The voices of the languages a reply may be in load with the stack; any other
/// on first use.
pub struct SpeechStack {
    pub stt: Mutex<Transcriber>,
    /// The end-of-turn model (`[speech] turn`), asked by the listener at each pause; its own
    /// lock, so a turn's listener never waits on another turn's transcription.
    pub turn: Option<Mutex<EndOfTurn>>,
    stt_placement: Placement,
    vad_placement: Placement,
    turn_placement: Option<Placement>,
    /// Each voice has its own lock (a synthesis holds it); the map's lock is held only to look
    /// up or insert, so `status` never waits on a synthesis.
    voices: Mutex<std::collections::HashMap<String, SharedVoice>>,
}

/// An audio turn's claim on the speech models, for its whole life (it drops and takes the stack
/// between stages, so the stack's own reference count says nothing): `unload stt` answers
/// `busy` while one is held.
pub struct SpeechUse(Arc<Supervisor>);

impl Drop for SpeechUse {
    fn drop(&mut self) {
        *self.0.speech_released.lock().expect("speech released") = std::time::Instant::now();
        self.0.speech_users.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Memory pressure sheds the speech models only after this long without an audio turn (as it
/// sheds sessions idle for a minute): shed within a second of each turn, every voice turn under
/// lasting pressure would load them again (5-6.6 s here).
pub const SPEECH_IDLE_BEFORE_SHED: std::time::Duration = std::time::Duration::from_secs(60);

/// A loaded voice, locked while it synthesises.
type SharedVoice = Arc<Mutex<Box<dyn Voice>>>;

/// A speech role as `status` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpeechRole {
    /// `stt` or `vad`: Whisper and Silero, loaded together.
    Stack,
    /// `tts-<lang>`: the voice of a language in `[speech.voices]`.
    Voice(String),
}

impl SpeechStack {
    pub fn load(sup: &Supervisor) -> Result<SpeechStack, SpeechError> {
        let stt = crate::speech::transcriber(&sup.config)?;
        let (stt_placement, vad_placement) = (stt.whisper.placement.clone(), stt.vad.placement.clone());
        let c = &sup.config;
        let turn = match c.speech.turn_model() {
            Some(t) => Some(EndOfTurn::load(&c.cache_path(t), c.speech.backend)?),
            None => None,
        };
        let turn_placement = turn.as_ref().map(|t| t.placement.clone());
        let stack = SpeechStack {
            stt: Mutex::new(stt),
            turn: turn.map(Mutex::new),
            stt_placement,
            vad_placement,
            turn_placement,
            voices: Mutex::new(Default::default()),
        };
        // The voices of the languages a reply may be in load with the stack, while the user is
        // still speaking: loaded on first use, a Piper voice's load (~1.5 s here) fell between
        // the end of their question and the first sound of the answer.
        // Within the stack's own measurement (a voice's would make it another load beside it).
        for lang in preloaded_voices(&c.speech) {
            stack.voice_with(sup, &lang, false)?;
        }
        Ok(stack)
    }

    /// Run each model once on a second of silence (the voices loaded with the stack on a word),
    /// results dropped: ONNX Runtime's first run of a session allocates what later runs reuse,
    /// and Whisper runs its whole window first whatever the audio (`Whisper::window_frames`).
    /// Measured on the first voice turn after a start: see `[speech] preload`. Each model on its
    /// own: one that fails is named in the log and the others still run. `stop`: the daemon is
    /// stopping (checked between models and between Whisper's decoder calls). What ran, for the
    /// log.
    pub fn warm(&self, sup: &Supervisor, stop: &dyn Fn() -> bool) -> Vec<String> {
        let quiet = vec![0f32; 16_000];
        let sp = &sup.config.speech;
        // A language given, not detected: detection's guess for the next turn stays unset.
        let language = match sp.language.as_str() {
            "auto" => sp.languages.first().map_or("en", String::as_str),
            l => l,
        };
        let mut ran = Vec::new();
        let mut each = |name: String, run: &mut dyn FnMut() -> Result<(), SpeechError>| {
            if stop() {
                return;
            }
            let t = std::time::Instant::now();
            match run() {
                Ok(()) => ran.push(format!("{name} {} ms", t.elapsed().as_millis())),
                Err(_) if stop() => {}
                Err(e) => tracing::warn!(model = %name, "speech warm-up failed: {e}"),
            }
        };
        each("stt".into(), &mut || {
            let mut stt = self.stt.lock().expect("stt");
            stt.vad.segments(&quiet)?;
            stt.transcribe(&quiet, Some(language), &[], stop).map(|_| ())
        });
        if let Some(turn) = &self.turn {
            each("turn".into(), &mut || turn.lock().expect("turn").probability(&quiet).map(|_| ()));
        }
        // Only the voices loaded now: one unloaded meanwhile (`unload tts-<lang>`) stays so.
        let voices: Vec<(String, SharedVoice)> =
            self.voices.lock().expect("voices").iter().map(|(l, v)| (l.clone(), v.clone())).collect();
        for (lang, voice) in voices {
            each(format!("tts-{lang}"), &mut || voice.lock().expect("voice").synthesize("OK.").map(|_| ()));
        }
        ran
    }

    /// Synthesise with the voice of `language` (loaded on first use).
    pub fn say(&self, sup: &Supervisor, language: &str, text: &str) -> Result<(Vec<f32>, u32), SpeechError> {
        let voice = self.voice(sup, language)?;
        let mut v = voice.lock().expect("voice");
        Ok((v.synthesize(text)?, v.sample_rate()))
    }

    /// [`say`](Self::say), the audio handed to `each` (with its rate) clause by clause as soon
    /// as each is synthesised (a split Piper voice: in pieces of a clause, as each exists);
    /// `each` returns false to stop.
    pub fn say_each(
        &self,
        sup: &Supervisor,
        language: &str,
        text: &str,
        each: &mut dyn FnMut(Vec<f32>, u32) -> bool,
    ) -> Result<(), SpeechError> {
        let voice = self.voice(sup, language)?;
        let mut v = voice.lock().expect("voice");
        let rate = v.sample_rate();
        v.synthesize_each(text, &mut |piece| each(piece, rate))
    }

    /// The voice of `language`, loaded on first use (outside the map's lock: two first uses may
    /// both load, the first insert wins). One the stack did not load with (a `load tts-<lang>`,
    /// a reply in another language) is reserved in the ledger on its own first ([`voice_entry`]):
    /// loaded uncounted, a Piper voice (its file x 3.6) sat in bytes the ledger let a language
    /// model take.
    fn voice(&self, sup: &Supervisor, language: &str) -> Result<SharedVoice, SpeechError> {
        self.voice_with(sup, language, true)
    }

    /// [`SpeechStack::voice`]; `metered`: the load counts as a change of the process's memory
    /// for the load meter (not while the stack loads: it measures its voices with it).
    fn voice_with(&self, sup: &Supervisor, language: &str, metered: bool) -> Result<SharedVoice, SpeechError> {
        if let Some(v) = self.voices.lock().expect("voices").get(language) {
            return Ok(v.clone());
        }
        let own = !preloaded_voices(&sup.config.speech).iter().any(|l| l == language);
        let reserved = own && sup.reserve_voice(language)?;
        // Not measured (the stack's figure is), but a load beside it must not count it.
        let loading = metered.then(|| sup.meter.begin());
        let loaded = match crate::speech::voice_for(&sup.config, language) {
            Ok(v) => Arc::new(Mutex::new(v)),
            Err(e) => {
                if reserved && !self.has_voice(language) {
                    sup.ledger.lock().expect("ledger").remove(&voice_entry(language));
                }
                return Err(e);
            }
        };
        drop(loading);
        Ok(self.voices.lock().expect("voices").entry(language.to_string()).or_insert(loaded).clone())
    }

    fn has_voice(&self, language: &str) -> bool {
        self.voices.lock().expect("voices").contains_key(language)
    }
}

/// The ledger entry of a voice loaded apart from the stack (the stack's own, with its voices,
/// is `speech`).
pub fn voice_entry(language: &str) -> String {
    format!("speech:tts-{language}")
}

/// The languages whose voices load with the stack: the fixed `language`, or the `languages`
/// detection chooses among (every configured voice when that list is empty).
pub fn preloaded_voices(s: &crate::config::SpeechConfig) -> Vec<String> {
    let wanted: Vec<String> = match s.language.as_str() {
        "auto" if s.languages.is_empty() => s.voices.keys().cloned().collect(),
        "auto" => s.languages.iter().map(|l| s.reply_language(l)).collect(),
        fixed => vec![s.reply_language(fixed)],
    };
    let mut out: Vec<String> = Vec::new();
    for l in wanted {
        if s.voices.contains_key(&l) && !out.contains(&l) {
            out.push(l);
        }
    }
    out
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
        // The STT row of the plan and the rows of the voices loaded with it (file sizes only: no
        // GGUF header is read here).
        let sp = &self.config.speech;
        let voice_files: Vec<String> = preloaded_voices(sp)
            .iter()
            .filter_map(|l| sp.voices.get(l))
            .map(|v| self.config.cache_path(std::path::Path::new(v)).display().to_string())
            .collect();
        let need: u64 = crate::plan::speech_plans(&self.config)
            .iter()
            .filter(|m| m.role == "stt" || (m.role == "tts" && voice_files.contains(&m.file)))
            .map(|m| m.total_bytes)
            .sum();
        let file = self.config.cache_path(&self.config.speech.stt).display().to_string();
        // Admitted and reserved under one lock, before the load: a language model loading
        // meanwhile sees these bytes as taken (the ledger never holds more than the budget).
        {
            let mut ledger = self.ledger.lock().expect("ledger");
            match ledger.admit("speech", need, 95, |_| true) {
                Ok(v) if v.is_empty() => ledger.insert("speech", &file, 95, 0, need, None),
                Ok(_) => {
                    return Err(SpeechError::OverBudget(format!(
                        "speech needs {} and would have to evict a language model",
                        kazeia_memory_budget::human_bytes(need)
                    )))
                }
                Err(r) => return Err(SpeechError::OverBudget(r.to_string())),
            }
        }
        let _ = self.changes.send(());
        let measuring = self.meter.begin();
        let stack = match SpeechStack::load(self) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                self.ledger.lock().expect("ledger").remove("speech");
                let _ = self.changes.send(());
                return Err(e);
            }
        };
        self.ledger.lock().expect("ledger").set_measured("speech", measuring.growth());
        drop(measuring);
        *self.speech.lock().expect("speech") = Some(stack.clone());
        let _ = self.changes.send(());
        Ok(stack)
    }

    /// Reserve the voice of `language` in the ledger as [`voice_entry`], as the stack is
    /// reserved (never evicting a language model). Whether this call reserved it (not when
    /// it needs no ONNX model, an espeak-ng voice, or when another load reserved it).
    fn reserve_voice(&self, language: &str) -> Result<bool, SpeechError> {
        let sp = &self.config.speech;
        let Some(file) = sp.voices.get(language).filter(|v| !v.starts_with("espeak:")) else { return Ok(false) };
        let file = self.config.cache_path(std::path::Path::new(file)).display().to_string();
        let Some(need) = crate::plan::speech_plans(&self.config)
            .into_iter()
            .find(|m| m.role == "tts" && m.file == file)
            .map(|m| m.total_bytes)
        else {
            return Ok(false);
        };
        let entry = voice_entry(language);
        let mut ledger = self.ledger.lock().expect("ledger");
        if ledger.get(&entry).is_some() {
            return Ok(false);
        }
        match ledger.admit(&entry, need, 95, |_| true) {
            Ok(v) if v.is_empty() => ledger.insert(&entry, &file, 95, 0, need, None),
            Ok(_) => {
                return Err(SpeechError::OverBudget(format!(
                    "the {language} voice needs {} and would have to evict a language model",
                    kazeia_memory_budget::human_bytes(need)
                )))
            }
            Err(r) => return Err(SpeechError::OverBudget(r.to_string())),
        }
        drop(ledger);
        let _ = self.changes.send(());
        Ok(true)
    }

    /// `[speech] preload`: the speech models loaded and warmed ([`SpeechStack::warm`]) before
    /// any audio turn asks for them; what was warmed. A turn arriving meanwhile waits for the
    /// same load (one at a time), then for the transcriber behind the warm-up. The warm-up
    /// holds a claim on the stack as an audio turn does: `unload stt` meanwhile is `busy`, not
    /// a second copy loaded by the next turn while the first is still running.
    pub fn preload_speech(self: &Arc<Self>) -> Result<Vec<String>, SpeechError> {
        let _use = self.speech_use();
        let stack = self.speech()?;
        Ok(stack.warm(self, &|| self.stopping.is_cancelled()))
    }

    /// Claim the speech models for an audio turn (see [`SpeechUse`]).
    pub fn speech_use(self: &Arc<Self>) -> SpeechUse {
        self.speech_users.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        SpeechUse(self.clone())
    }

    /// The speech roles `status` lists, by name.
    pub fn speech_roles(&self) -> Vec<String> {
        let voices = self.config.speech.voices.keys().map(|l| format!("tts-{l}"));
        let turn = self.config.speech.turn_model().map(|_| "turn".to_string());
        ["stt".to_string(), "vad".to_string()].into_iter().chain(turn).chain(voices).collect()
    }

    /// The speech role `role` names, if any.
    pub fn speech_role(&self, role: &str) -> Option<SpeechRole> {
        match role {
            "stt" | "vad" => Some(SpeechRole::Stack),
            "turn" if self.config.speech.turn_model().is_some() => Some(SpeechRole::Stack),
            r => r
                .strip_prefix("tts-")
                .filter(|lang| self.config.speech.voices.contains_key(*lang))
                .map(|lang| SpeechRole::Voice(lang.to_string())),
        }
    }

    /// `load stt|vad|tts-<lang>`. Blocking (a model load): call it off the async workers. Holds
    /// a claim meanwhile, so that memory pressure does not shed the stack a voice is loaded into.
    pub fn load_speech(self: &Arc<Self>, role: &SpeechRole) -> Result<(), SpeechError> {
        let _use = self.speech_use();
        let stack = self.speech()?;
        if let SpeechRole::Voice(lang) = role {
            stack.voice(self, lang)?;
            let _ = self.changes.send(());
        }
        Ok(())
    }

    /// `unload stt|vad|tts-<lang>`: Ok(false) if it was not loaded; Err while an audio turn
    /// holds the stack (its memory would not be freed).
    pub fn unload_speech(&self, role: &SpeechRole) -> Result<bool, String> {
        // Loads wait meanwhile: the ledger entry goes with the stack, never after a reload.
        let loading = self.speech_loading.lock().expect("speech loading");
        let taken = {
            let mut slot = self.speech.lock().expect("speech");
            match (role, slot.as_ref()) {
                (_, None) => return Ok(false),
                (SpeechRole::Voice(lang), Some(stack)) => {
                    let _freeing = self.meter.begin();
                    let gone = stack.voices.lock().expect("voices").remove(lang).is_some();
                    if gone {
                        self.ledger.lock().expect("ledger").remove(&voice_entry(lang));
                        let _ = self.changes.send(());
                    }
                    return Ok(gone);
                }
                (SpeechRole::Stack, Some(_)) if self.speech_users.load(std::sync::atomic::Ordering::SeqCst) > 0 => {
                    return Err("the speech models are in use by an audio turn (or their warm-up at start)".into())
                }
                (SpeechRole::Stack, Some(_)) => {
                    self.speech_freeing.store(true, std::sync::atomic::Ordering::SeqCst);
                    slot.take()
                }
            }
        };
        self.free_speech(taken);
        // Heard of once the lock is let go: a subscriber reading status at once saw it held
        // with no stack, `loading`, and nothing after said otherwise.
        drop(loading);
        let _ = self.changes.send(());
        Ok(true)
    }

    /// The end of an unload or a shed, `speech_loading` held by the caller: the stack taken from
    /// its slot is freed (ONNX sessions, here, outside the status lock; the heap trimmed) before
    /// the ledger lets its bytes go. The caller tells subscribers once it lets the lock go.
    fn free_speech(&self, taken: Option<Arc<SpeechStack>>) {
        let changing = self.meter.begin();
        drop(taken);
        super::heap::trim();
        drop(changing);
        let mut ledger = self.ledger.lock().expect("ledger");
        let voices: Vec<String> = self.config.speech.voices.keys().map(|l| voice_entry(l)).collect();
        for entry in voices.iter().map(String::as_str).chain(["speech"]) {
            ledger.remove(entry);
        }
        drop(ledger);
        self.speech_freeing.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Under memory pressure: unload the speech models if no audio turn (nor the preload's
    /// warm-up, nor a `load`) holds them, none has for [`SPEECH_IDLE_BEFORE_SHED`] before
    /// `now`, and no load is under way (never waits for one). Loaded at start by `[speech]
    /// preload` for a user who may only type, they would otherwise stay while the guard is
    /// shed; the next audio turn loads them again. Blocking (ONNX sessions freed, the heap
    /// trimmed): call it off the async workers. Whether they were unloaded.
    pub(super) fn shed_speech(&self, now: std::time::Instant) -> bool {
        let Ok(loading) = self.speech_loading.try_lock() else { return false };
        let taken = {
            // Claims are counted before a turn takes the stack from this slot: read under its
            // lock, none means no turn holds the stack or will take this one.
            let mut slot = self.speech.lock().expect("speech");
            let released = *self.speech_released.lock().expect("speech released");
            if self.speech_users.load(std::sync::atomic::Ordering::SeqCst) > 0
                || now.saturating_duration_since(released) < SPEECH_IDLE_BEFORE_SHED
            {
                return false;
            }
            self.speech_freeing.store(slot.is_some(), std::sync::atomic::Ordering::SeqCst);
            slot.take()
        };
        if taken.is_none() {
            return false;
        }
        self.free_speech(taken);
        // Heard of once the lock is let go: a subscriber reading status at once saw it held
        // with no stack, `loading`, and nothing after said otherwise.
        drop(loading);
        let _ = self.changes.send(());
        true
    }

    /// Status rows of the speech models (`stt`, `vad`, `turn`, `tts`): where they run and why.
    pub(super) fn speech_status(&self, ledger: &kazeia_memory_budget::Ledger) -> Vec<ModelStatus> {
        let loaded = self.speech.lock().expect("speech").clone();
        // Read after the slot: an unload marks it under the slot's lock before taking the stack.
        let freeing = loaded.is_none() && self.speech_freeing.load(std::sync::atomic::Ordering::SeqCst);
        // A load holds `speech_loading` for its whole length (seconds); status only peeks at it
        // (an unload holds it too).
        let loading = loaded.is_none() && !freeing && self.speech_loading.try_lock().is_err();
        let entry = ledger.get("speech");
        let sp = &self.config.speech;
        let unloaded = if sp.preload && self.config.daemon.preload {
            "loaded at start ([speech] preload), else by the next audio turn"
        } else {
            "loaded by the next audio turn"
        };
        let row =
            |role: &str, file: String, device: Option<String>, placement: Option<String>, first: bool| ModelStatus {
                role: role.into(),
                state: match (&loaded, loading) {
                    _ if freeing => ModelState::Loaded,
                    (Some(_), _) => ModelState::Loaded,
                    (None, true) => ModelState::Loading,
                    (None, false) => ModelState::Unloaded,
                },
                file,
                architecture: Some("onnx".into()),
                file_bytes: None,
                device,
                placement: placement.or_else(|| Some(if freeing { "being unloaded" } else { unloaded }.into())),
                shares_model_with: vec![],
                busy: 0,
                turns: 0,
                generated_tokens: 0,
                reserved_bytes: if first { entry.map(|e| e.reserved) } else { None },
                measured_bytes: if first { entry.and_then(|e| e.measured) } else { None },
                progress: None,
                error: None,
                prefix_file_bytes: None,
            };
        // Placements were copied at load: `stt` itself is locked for whole transcriptions.
        let (stt_dev, stt_why, vad_dev, turn_dev) = match &loaded {
            Some(s) => (
                Some(s.stt_placement.device.clone()),
                Some(s.stt_placement.reason.clone()),
                Some(s.vad_placement.device.clone()),
                s.turn_placement.as_ref().map(|p| p.device.clone()),
            ),
            None => (None, None, None, None),
        };
        let mut rows = vec![
            row("stt", self.config.cache_path(&sp.stt).display().to_string(), stt_dev, stt_why.clone(), true),
            row("vad", self.config.cache_path(&sp.vad).display().to_string(), vad_dev, stt_why.clone(), false),
        ];
        if let Some(t) = sp.turn_model() {
            rows.push(row("turn", self.config.cache_path(t).display().to_string(), turn_dev, stt_why, false));
        }
        for (lang, v) in &sp.voices {
            let mut r = row(
                &format!("tts-{lang}"),
                v.clone(),
                None,
                Some(if v.starts_with("espeak:") {
                    "espeak-ng (CPU)".into()
                } else {
                    "ONNX, loaded with the speech stack (a reply language) or on first use".into()
                }),
                false,
            );
            let has = loaded.as_ref().is_some_and(|s| s.has_voice(lang));
            r.state = if has { ModelState::Loaded } else { ModelState::Unloaded };
            // A voice loaded apart from the stack holds its own reservation.
            r.reserved_bytes = ledger.get(&voice_entry(lang)).map(|e| e.reserved);
            rows.push(r);
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    /// While an unload frees the stack (taken from its slot, `speech_loading` held), the speech
    /// rows read `loaded` as a language model's row does until its memory is gone; they read
    /// `loading` only for a load. (They read `loading` during every unload and shed.)
    #[test]
    fn a_stack_being_freed_is_not_read_as_loading() {
        let text = "[[model]]\nrole = \"thinker\"\nfile = \"m.gguf\"\n";
        let sup = Supervisor::for_test(text);
        let stt = |sup: &Supervisor| {
            let ledger = sup.ledger.lock().unwrap();
            sup.speech_status(&ledger).into_iter().find(|r| r.role == "stt").unwrap()
        };
        assert_eq!(stt(&sup).state, ModelState::Unloaded);
        let held = sup.speech_loading.lock().unwrap();
        assert_eq!(stt(&sup).state, ModelState::Loading, "a load holds the lock with no stack yet");
        // As unload_speech and shed_speech mark it, under the slot's lock, before the take.
        sup.speech_freeing.store(true, Ordering::SeqCst);
        let row = stt(&sup);
        assert_eq!(row.state, ModelState::Loaded, "{row:?}");
        assert_eq!(row.placement.as_deref(), Some("being unloaded"));
        sup.free_speech(None);
        assert_eq!(stt(&sup).state, ModelState::Loading, "freed: the lock alone is a load again");
        drop(held);
        assert_eq!(stt(&sup).state, ModelState::Unloaded);
    }

    /// A voice reserved apart (a reply in another language) is no victim of a language model's
    /// load: the engine cannot unload it, so the load evicted the idle guard beside it and was
    /// refused anyway, naming the voice as evicted three times.
    #[test]
    fn a_voice_reserved_apart_is_never_a_language_models_victim() {
        let text = "[[model]]\nrole = \"thinker\"\nfile = \"m.gguf\"\npriority = 100\n\n\
                    [[model]]\nrole = \"guard\"\nfile = \"g.gguf\"\npriority = 90\n";
        let sup = Supervisor::for_test(text);
        let mut ledger = sup.ledger.lock().unwrap();
        ledger.insert("guard", "g.gguf", 90, 100, 10, None);
        ledger.insert(&voice_entry("fr"), "fr.onnx", 95, 0, 200, None);
        let free = ledger.budget.saturating_sub(ledger.used());
        let need = free + 150;
        let r = ledger.admit("thinker", need, 100, |r| sup.in_use(r)).unwrap_err();
        assert!(r.resident.contains("speech:tts-fr 0.0 MiB (priority 95, in use)"), "{r}");
        // Room once the guard goes: it alone is evicted.
        let need = free + 100;
        assert_eq!(ledger.admit("thinker", need, 100, |r| sup.in_use(r)).unwrap(), ["guard"]);
        assert!(sup.in_use("speech") && !sup.in_use("guard"));
    }
}
