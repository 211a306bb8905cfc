//! Hearing an audio turn. The connection decodes each audio frame (s16le, any rate and channels),
//! converts it to 16 kHz mono and pushes it into a lock-free SPSC ring (`ringbuf`); a blocking
//! task pops 512-sample chunks, runs the VAD and, at the end of the utterance (VAD silence or
//! the client's `last` frame), Whisper. While the reply runs it keeps listening: new speech
//! (barge-in) cancels the turn. A whole recording (`kazeia run`) is transcribed as it is.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kazeia_ipc::{AudioFrame, ErrorCode};
use ringbuf::traits::{Consumer, Observer, Producer, Split};
use ringbuf::{HeapCons, HeapProd, HeapRb};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::speech::{audio, vad, Transcript, Vad, VadEvent, VadParams};
use crate::supervisor::Supervisor;

/// 20 s of 16 kHz audio in flight between the socket and the speech task.
const RING: usize = 20 * 16_000;

/// What the turn learns from the speech task.
pub enum Heard {
    Transcript(Transcript),
    Failed(ErrorCode, String),
}

/// The connection's side of an audio turn: where its audio frames go.
pub struct AudioInput {
    producer: HeapProd<f32>,
    rate: u32,
    channels: u16,
    ended: Arc<AtomicBool>,
    pub overrun: bool,
}

/// The speech task's side.
pub struct Ring {
    consumer: HeapCons<f32>,
    ended: Arc<AtomicBool>,
}

/// A ring for a stream of `rate` Hz, `channels`-channel frames.
pub fn ring(rate: u32, channels: u16) -> (AudioInput, Ring) {
    let (producer, consumer) = HeapRb::<f32>::new(RING).split();
    let ended = Arc::new(AtomicBool::new(false));
    (AudioInput { producer, rate, channels, ended: ended.clone(), overrun: false }, Ring { consumer, ended })
}

impl AudioInput {
    /// Push one frame's samples (converted to 16 kHz mono). False when the ring is full: the
    /// speech task fell more than the ring's length behind.
    pub fn push(&mut self, a: &AudioFrame) -> bool {
        let samples = audio::to_16k_mono(&audio::from_s16le(&a.pcm), self.rate, self.channels);
        let pushed = self.producer.push_slice(&samples);
        if a.last {
            self.ended.store(true, Ordering::Release);
        }
        pushed == samples.len()
    }

    pub fn matches(&self, a: &AudioFrame) -> bool {
        a.sample_rate == self.rate && u16::from(a.channels) == self.channels
    }
}

/// The running speech task of a turn.
pub struct Task {
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
}

impl Task {
    /// Stop listening (barge-in is over) and wait for the task.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.handle.await;
    }
}

/// Listen to a stream: the transcript comes through the receiver; the task then watches for
/// barge-in, cancelling `turn` when the user speaks again, until stopped.
pub fn start(sup: Arc<Supervisor>, ring: Ring, turn: CancellationToken) -> (oneshot::Receiver<Heard>, Task) {
    let (tx, rx) = oneshot::channel();
    let stop = CancellationToken::new();
    let s = stop.clone();
    let handle = tokio::task::spawn_blocking(move || listen(&sup, ring, &turn, &s, tx));
    (rx, Task { stop, handle })
}

/// Transcribe a whole recording (windows of ≤ 30 s cut at pauses).
pub fn whole(sup: Arc<Supervisor>, samples: Vec<f32>, turn: CancellationToken) -> (oneshot::Receiver<Heard>, Task) {
    let (tx, rx) = oneshot::channel();
    let handle = tokio::task::spawn_blocking(move || {
        let _ = tx.send(transcribe(&sup, &samples, &turn));
    });
    (rx, Task { stop: CancellationToken::new(), handle })
}

fn transcribe(sup: &Supervisor, samples: &[f32], cancel: &CancellationToken) -> Heard {
    if samples.len() < 1_600 {
        return Heard::Failed(ErrorCode::BadRequest, "no speech in the audio (under 100 ms)".into());
    }
    let stack = match sup.speech() {
        Ok(s) => s,
        Err(e) => return Heard::Failed(e.code(), e.to_string()),
    };
    let language = match sup.config.speech.language.as_str() {
        "auto" => None,
        l => Some(l.to_string()),
    };
    let t = stack.stt.lock().expect("stt").transcribe(samples, language.as_deref(), &|| cancel.is_cancelled());
    match t {
        Ok(t) => Heard::Transcript(t),
        Err(e) => Heard::Failed(e.code(), e.to_string()),
    }
}

/// VAD over the ring until the utterance ends, then Whisper; then barge-in until `stop`.
fn listen(
    sup: &Supervisor,
    mut ring: Ring,
    turn: &CancellationToken,
    stop: &CancellationToken,
    heard: oneshot::Sender<Heard>,
) {
    // The speech models load (once per daemon) while the user is still speaking.
    if let Err(e) = sup.speech() {
        let _ = heard.send(Heard::Failed(e.code(), e.to_string()));
        return;
    }
    let s = &sup.config.speech;
    let params = VadParams { min_silence: s.vad_silence, ..VadParams::default() };
    let mut vad = match Vad::load(&sup.config.cache_path(&s.vad), s.backend, params) {
        Ok(v) => v,
        Err(e) => {
            let _ = heard.send(Heard::Failed(e.code(), e.to_string()));
            return;
        }
    };
    let ended = |r: &Ring| r.ended.load(Ordering::Acquire);
    let mut utterance: Vec<f32> = Vec::new();
    let mut chunk = vec![0f32; vad::CHUNK];
    // Speech has begun: `utterance` grows; before it, `recent` keeps the last chunk + pad.
    let mut speaking = false;
    let pad = 1_600; // 100 ms kept before the VAD's onset
    let mut recent: Vec<f32> = Vec::new();
    // 1. The utterance.
    let segment_end = loop {
        if turn.is_cancelled() || stop.is_cancelled() {
            let _ = heard.send(Heard::Failed(ErrorCode::Cancelled, "cancelled".into()));
            return;
        }
        if ring.consumer.occupied_len() >= vad::CHUNK {
            ring.consumer.pop_slice(&mut chunk);
            if speaking {
                utterance.extend_from_slice(&chunk);
            } else {
                recent.extend_from_slice(&chunk);
                let keep = recent.len().saturating_sub(pad + vad::CHUNK);
                recent.drain(..keep);
            }
            match vad.push(&chunk) {
                Ok(Some(VadEvent::SpeechStart(_))) if !speaking => {
                    speaking = true;
                    utterance = std::mem::take(&mut recent);
                }
                Ok(Some(VadEvent::SpeechEnd(_))) => break true,
                Ok(_) => {}
                Err(e) => {
                    let _ = heard.send(Heard::Failed(ErrorCode::Engine, e.to_string()));
                    return;
                }
            }
        } else if ended(&ring) {
            // The client said `last`: what is left is the utterance.
            let mut rest = vec![0f32; ring.consumer.occupied_len()];
            ring.consumer.pop_slice(&mut rest);
            if !speaking {
                utterance = std::mem::take(&mut recent);
            }
            utterance.extend(rest);
            break false;
        } else {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    };
    let t = transcribe(sup, &utterance, turn);
    let failed = matches!(t, Heard::Failed(..));
    let _ = heard.send(t);
    if failed || (!segment_end && ended(&ring)) {
        return;
    }
    // 2. Barge-in: new speech while the reply runs cancels the turn.
    vad.reset();
    while !stop.is_cancelled() && !turn.is_cancelled() {
        if ring.consumer.occupied_len() >= vad::CHUNK {
            ring.consumer.pop_slice(&mut chunk);
            if let Ok(Some(VadEvent::SpeechStart(_))) = vad.push(&chunk) {
                tracing::info!("barge-in: the user spoke during the reply; stopping it");
                turn.cancel();
            }
        } else if ended(&ring) {
            return;
        } else {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
