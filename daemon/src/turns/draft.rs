//! A draft transcript: Whisper on the utterance heard so far, on its own thread beside the
//! listener, while the user may still be speaking.
//!
//! `[speech] draft_ahead` (64 ms) into a silence, before the pause is called, the draft of the
//! whole utterance starts: when the turn ends at that pause, its transcript is already under
//! way instead of starting then (neither the rest of the pause nor the end-of-turn verdict
//! comes before Whisper's ~0.5 s); speech after it leaves it a partial transcript. While the user
//! speaks on, a draft every `[speech] partial_every` of new speech gives a partial transcript.
//! A draft of speech the user went on with is stopped, inside the encoder too, so that the
//! next one does not wait behind it. Dropping a draft stops it and joins its thread: nothing
//! outlives the turn's listener. A partial draft's Whisper window is the audio and
//! `[speech] partial_margin` (15 s: a 3 s utterance's encoder 96-104 ms against 214-249, less
//! of the cores taken from the prefills ahead while the user speaks); a draft that may be the
//! turn's transcript (at a pause, or `draft_ahead` into a silence) runs the turn's window: the
//! whole 30 s, or one cut to the audio and `[speech] turn_margin` (20 s) in `cut_languages`
//! (English: on an AVX2-only EPYC the whole window's encoder takes ~630 ms).

use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::speech::{SpeechError, Stop, Transcript};
use crate::supervisor::SpeechStack;

/// A draft's outcome: the transcript and when it was ready.
pub type Drafted = Result<(Transcript, Instant), SpeechError>;

pub struct Draft {
    /// Samples of the utterance it transcribes (from the utterance's start).
    pub covers: usize,
    stop: Arc<Stop>,
    result: mpsc::Receiver<Drafted>,
    ready: Option<Drafted>,
    thread: Option<JoinHandle<()>>,
}

impl Draft {
    /// Transcribe `samples` (the utterance so far) on a new thread; `hint`: the token ids of
    /// the latest draft of the same utterance, Whisper's guess (the same text in fewer decoder
    /// calls: most of a draft is the one before it). `partial`: a draft while the user speaks,
    /// never the turn's transcript (its shorter window).
    pub fn start(
        stack: Arc<SpeechStack>,
        samples: Vec<f32>,
        language: Option<String>,
        hint: Vec<u32>,
        partial: bool,
    ) -> Result<Draft, SpeechError> {
        let stop = Arc::new(Stop::new()?);
        let (tx, result) = mpsc::channel();
        let covers = samples.len();
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("stt-draft".into())
            .spawn(move || {
                // The transcriber's lock: a draft of another turn, or this turn's previous one
                // still stopping, goes first.
                let mut stt = stack.stt.lock().expect("stt");
                let t = if s.is_stopped() {
                    Err(SpeechError::Run("stopped".into()))
                } else if partial {
                    stt.transcribe_partial_until(&samples, language.as_deref(), &hint, &s)
                } else {
                    stt.transcribe_until(&samples, language.as_deref(), &hint, &s)
                };
                drop(stt);
                let _ = tx.send(t.map(|t| (t, Instant::now())));
            })
            .map_err(|e| SpeechError::Run(format!("could not start a draft transcription: {e}")))?;
        Ok(Draft { covers, stop, result, ready: None, thread: Some(thread) })
    }

    /// The transcript if it is ready, the first time it is found ready (for a partial event).
    pub fn poll(&mut self) -> Option<&Drafted> {
        if self.ready.is_some() {
            return None;
        }
        self.ready = Some(self.result.try_recv().ok()?);
        self.ready.as_ref()
    }

    /// The transcript of a draft found ready by an earlier poll.
    pub fn ended(&self) -> Option<&Transcript> {
        self.ready.as_ref()?.as_ref().ok().map(|(t, _)| t)
    }

    pub fn is_running(&self) -> bool {
        self.ready.is_none()
    }

    /// Wait for the transcript, unless `cancelled` says the turn ended first (None: the draft
    /// is then stopped, inside the encoder too, as it is dropped). Waited for whole, a long
    /// utterance's draft held a cancelled turn for seconds, its leases with it.
    pub fn wait_until(mut self, cancelled: impl Fn() -> bool) -> Option<Drafted> {
        if let Some(r) = self.ready.take() {
            return Some(r);
        }
        loop {
            match self.result.recv_timeout(std::time::Duration::from_millis(10)) {
                Ok(r) => return Some(r),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Some(Err(SpeechError::Run("the draft transcription stopped".into())))
                }
                Err(mpsc::RecvTimeoutError::Timeout) if cancelled() => return None,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
    }
}

impl Drop for Draft {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            // A draft still running is stopped (its result was not awaited); one that ended is
            // only joined.
            if !t.is_finished() {
                tracing::debug!(covers = self.covers, "draft stopped");
                self.stop.stop();
            }
            let _ = t.join();
        }
    }
}
