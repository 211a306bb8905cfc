//! The one speaker: sentences in, audio frames out, on a blocking task of its own so that
//! synthesis of sentence n overlaps generation of sentence n+1. A sentence is synthesised
//! clause by clause (a split Piper voice: in pieces of a clause, the first ~0.28 s of audio),
//! and each piece's frames leave as soon as it exists. Frames are ~100 ms
//! so that a cancel lands between two of them; the last frame is flagged and empty.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use kazeia_ipc::{AudioFrame, Frame};
use tokio_util::bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::Output;
use crate::speech::{audio, SpeechError};
use crate::supervisor::Supervisor;

/// The rate of the closing frame when nothing was spoken (the Piper voices' rate).
const DEFAULT_RATE: u32 = 22_050;

/// Audio sent and not yet played (counted from the first frame at the pace of playback) past
/// which a sentence is synthesised without holding the decodes: speech first is for what the
/// listener waits for, not for a backlog. Every sentence held them, one after another, so a
/// `speak` of a long text stalled every other client's turns for the minutes its synthesis
/// took (each decode waiting for the sentence being synthesised). 3 s: a sentence of a few
/// seconds of audio is synthesised in ~0.3 s alone, in up to ~2.3 s beside two roles' decodes.
const AHEAD_S: f64 = 3.0;

pub struct Speaker {
    tx: mpsc::Sender<String>,
    handle: tokio::task::JoinHandle<Result<Spoken, SpeechError>>,
}

/// What the speaker did.
#[derive(Debug, Clone, Copy)]
pub struct Spoken {
    /// Every sentence spoken (false: cancelled).
    pub finished: bool,
    /// When the reply's first audio frame was sent, and how long the first sentence took from
    /// its arrival to that frame (ms).
    pub first_audio: Option<(Instant, f64)>,
}

impl Speaker {
    pub fn start(
        sup: Arc<Supervisor>,
        id: String,
        language: String,
        cancel: CancellationToken,
        out: Output,
    ) -> Speaker {
        let (tx, rx) = mpsc::channel::<String>();
        let handle = tokio::task::spawn_blocking(move || speak(&sup, &id, &language, &cancel, &out, rx));
        Speaker { tx, handle }
    }

    pub fn say(&self, sentence: String) {
        let _ = self.tx.send(sentence);
    }

    /// No more sentences: wait until the last is spoken.
    pub async fn finish(self) -> Result<Spoken, SpeechError> {
        drop(self.tx);
        self.handle.await.unwrap_or_else(|e| Err(SpeechError::Run(format!("the speaker stopped: {e}"))))
    }
}

fn speak(
    sup: &Supervisor,
    id: &str,
    language: &str,
    cancel: &CancellationToken,
    out: &Output,
    sentences: mpsc::Receiver<String>,
) -> Result<Spoken, SpeechError> {
    let stack = sup.speech()?;
    let mut rate = DEFAULT_RATE;
    let frame =
        |rate, last, pcm| Frame::Audio(AudioFrame { id: id.to_string(), sample_rate: rate, channels: 1, last, pcm });
    let mut spoken = Spoken { finished: false, first_audio: None };
    // Seconds of audio sent.
    let mut sent_s = 0.0;
    for sentence in sentences {
        if cancel.is_cancelled() {
            return Ok(spoken);
        }
        let arrived = Instant::now();
        // Speech first: no decode starts while the sentence is synthesised (see SpeechHold),
        // nor since its check passed (the unit handed to speech, see RolePause); unless the
        // listener has `AHEAD_S` of audio still to play: then the speaker only takes the unit
        // handed to it (its hold ends at once, and the handoff's with it).
        let ahead = |sent_s: f64, spoken: &Spoken| {
            spoken.first_audio.map_or(0.0, |(at, _)| sent_s - at.elapsed().as_secs_f64())
        };
        let hold = kazeia_engine::SpeechHold::speak();
        let mut hold = (ahead(sent_s, &spoken) < AHEAD_S).then_some(hold);
        // Clause by clause, piece by piece: each piece's frames leave as soon as it is
        // synthesised, while the next one is.
        let mut audio_s = 0.0;
        stack.say_each(sup, language, &sentence, &mut |samples, r| {
            if spoken.first_audio.is_none() {
                tracing::debug!(
                    chars = sentence.len(),
                    ms = arrived.elapsed().as_secs_f64() * 1e3,
                    "first audio synthesised"
                );
            }
            rate = r;
            audio_s += samples.len() as f64 / f64::from(r);
            for chunk in samples.chunks((r as usize / 10).max(1)) {
                if cancel.is_cancelled() {
                    return false;
                }
                out(frame(r, false, Bytes::from(audio::to_s16le(chunk))));
                spoken.first_audio.get_or_insert_with(|| (Instant::now(), arrived.elapsed().as_secs_f64() * 1e3));
            }
            // A long sentence begun unheld, synthesised beside decodes: once the listener's
            // audio runs low, the rest of it holds them.
            if hold.is_none() && ahead(sent_s + audio_s, &spoken) < AHEAD_S {
                hold = Some(kazeia_engine::SpeechHold::take());
            }
            true
        })?;
        drop(hold);
        sent_s += audio_s;
        tracing::debug!(chars = sentence.len(), ms = arrived.elapsed().as_secs_f64() * 1e3, audio_s, "synthesised");
        if cancel.is_cancelled() {
            return Ok(spoken);
        }
    }
    if cancel.is_cancelled() {
        return Ok(spoken);
    }
    out(frame(rate, true, Bytes::new()));
    spoken.finished = true;
    Ok(spoken)
}
