//! Hearing an audio turn. The connection decodes each audio frame (s16le, any rate and channels),
//! converts it to 16 kHz mono and pushes it into a lock-free SPSC ring (`ringbuf`); a blocking
//! task pops 512-sample chunks, runs the VAD and, at the end of the turn, Whisper. While the
//! reply runs it keeps listening: new speech (barge-in) cancels the turn. A whole recording
//! (`kazeia run`) is transcribed as it is.
//!
//! The end of the turn: with an end-of-turn model (`[speech] turn`), the model is asked at each
//! pause of `turn_pause` (200 ms) and again every `turn_pause` while the silence goes on; the
//! turn ends when it says complete, or after `turn_max_silence` whatever it says. Speech after
//! a pause continues the same utterance (one transcript). Without the model the turn ends after
//! `vad_silence` (500 ms), and always at the client's `last` frame. Re-asking matters on this
//! machine's synthetic voices: a whole question heard as unfinished at 200 ms (p 0.11) was
//! heard as finished at 400 ms (p 0.70), while a hesitation ("the, um,") stayed at 0.01.
//!
//! Preemptive start: when the transcript of the utterance up to a pause is ready while the
//! model still says "not yet", the task says so (`Heard::Early`) and the turn starts its reply
//! on it, releasing nothing until the turn ends (`Heard::Transcript`); speech after it
//! (`Heard::Resumed`) makes the turn drop that work. A turn the model doubts until
//! `turn_max_silence` (3 s) then has its first unit written and checked when it ends, instead
//! of starting only then.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kazeia_ipc::{AudioFrame, ErrorCode};
use ringbuf::traits::{Consumer, Observer, Producer, Split};
use ringbuf::{HeapCons, HeapProd, HeapRb};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::draft::Draft;
use crate::speech::{audio, vad, Transcript, Vad, VadEvent, VadParams};
use crate::supervisor::Supervisor;

/// 20 s of 16 kHz audio in flight between the socket and the speech task.
const RING: usize = 20 * 16_000;

/// Speech heard during the reply that stops it (barge-in): 192 ms, six VAD chunks with sound
/// in them, near Pipecat's default (0.2 s of speech before the user is taken to speak). On the
/// first chunk the VAD called speech, a cough, a click or a door stopped every reply it fell in.
const BARGE_IN: Duration = Duration::from_millis(192);

/// What the turn learns from the speech task: at most one `Transcript` or `Failed`, last;
/// before it, any number of `Early`, each followed by `Resumed` unless it is the last.
pub enum Heard {
    /// The utterance's transcript at a pause the end-of-turn model doubts: the turn may start
    /// its reply on it, but releases nothing before `Transcript`.
    Early(Transcript),
    /// The user spoke again after an `Early`: its transcript is not the turn's.
    Resumed,
    Transcript(Transcript, Ending),
    Failed(ErrorCode, String),
}

/// How the user's turn ended, for the turn's metrics.
#[derive(Debug, Clone)]
pub struct Ending {
    /// When the user stopped speaking: when the latest audio frame came, less the audio since
    /// the silence began up to that frame's end (audio comes at the microphone's pace), or the
    /// moment a whole recording was handed over. Not the decision's instant less the audio the
    /// listener took: it takes none while the end-of-turn model runs, so each verdict was left
    /// out of the wait (`end_of_turn_ms` was the pause alone, 224 ms in bench-voice, and the
    /// client waited ~300 ms more than `speech_end_to_audio_ms` said).
    pub speech_end: Instant,
    /// From the end of speech to the end of the turn (ms): the pause waited and the verdicts.
    pub end_of_turn_ms: f64,
    /// Whisper on the utterance (ms).
    pub stt_ms: f64,
    /// The end-of-turn model's verdicts asked.
    pub turn_checks: u32,
    /// The verdict that ended the turn (ms; 0 when the longest silence or the client's `last`
    /// frame ended it).
    pub turn_check_ms: f64,
}

/// The connection's side of an audio turn: where its audio frames go.
pub struct AudioInput {
    producer: HeapProd<f32>,
    /// The stream's own: its phase and filter carried from frame to frame.
    resampler: audio::Resampler,
    rate: u32,
    channels: u16,
    ended: Arc<AtomicBool>,
    arrived: Arc<Mutex<Arrived>>,
    pub overrun: bool,
    /// A frame came after the `last` one (and was refused, once).
    pub after_last: bool,
}

/// The speech task's side.
pub struct Ring {
    consumer: HeapCons<f32>,
    ended: Arc<AtomicBool>,
    arrived: Arc<Mutex<Arrived>>,
}

/// The samples pushed so far and when the latest frame came: the clock a turn's end of speech
/// is read against (audio comes at the microphone's pace; the listener may lag behind it, as
/// while the end-of-turn model runs).
#[derive(Clone, Copy)]
struct Arrived {
    samples: usize,
    at: Instant,
}

/// A ring for a stream of `rate` Hz, `channels`-channel frames.
pub fn ring(rate: u32, channels: u16) -> (AudioInput, Ring) {
    let (producer, consumer) = HeapRb::<f32>::new(RING).split();
    let ended = Arc::new(AtomicBool::new(false));
    let arrived = Arc::new(Mutex::new(Arrived { samples: 0, at: Instant::now() }));
    (
        AudioInput {
            producer,
            resampler: audio::Resampler::new(rate, 16_000),
            rate,
            channels,
            ended: ended.clone(),
            arrived: arrived.clone(),
            overrun: false,
            after_last: false,
        },
        Ring { consumer, ended, arrived },
    )
}

impl AudioInput {
    /// Push one frame's samples (converted to 16 kHz mono). False when the ring is full: the
    /// speech task fell more than the ring's length behind.
    pub fn push(&mut self, a: &AudioFrame) -> bool {
        // A full ring drops the frame before it is resampled: the resampling (~35 filter taps a
        // sample, on the connection's async worker) went on for every frame of a fast stream
        // after the overrun, on the cores the decodes need.
        let full = self.producer.is_full();
        let samples = match full {
            true => Vec::new(),
            false => self.resampler.push(&audio::mono(&audio::from_s16le(&a.pcm), self.channels), a.last),
        };
        // Under the lock: the listener reads the count and the instant together.
        let mut arrived = self.arrived.lock().unwrap_or_else(|p| p.into_inner());
        let pushed = self.producer.push_slice(&samples);
        // Only audio counts as the stream going on: empty frames (or ones too short for one
        // sample at 16 kHz) every second kept a turn and its roles' leases past `audio_idle`.
        if !samples.is_empty() || (full && !a.pcm.is_empty()) {
            *arrived = Arrived { samples: arrived.samples + pushed, at: Instant::now() };
        }
        drop(arrived);
        if a.last {
            self.ended.store(true, Ordering::Release);
        }
        !full && pushed == samples.len()
    }

    /// The stream's `last` frame has come: the turn hears no more of it.
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    pub fn matches(&self, a: &AudioFrame) -> bool {
        a.sample_rate == self.rate && u16::from(a.channels) == self.channels
    }

    /// What tells this input from another registered later under the same request id.
    pub fn mark(&self) -> InputMark {
        InputMark(self.ended.clone())
    }

    pub fn is(&self, mark: &InputMark) -> bool {
        Arc::ptr_eq(&self.ended, &mark.0)
    }
}

/// One [`AudioInput`]'s identity.
pub struct InputMark(Arc<AtomicBool>);

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

/// Where partial transcripts go while the user speaks, with what each covers.
pub type Partial = Box<dyn Fn(&Transcript, Covers) + Send>;

/// What a draft transcript covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Covers {
    /// The speech so far, the user still speaking: its last word may change.
    SoFar,
    /// The whole utterance, drafted `draft_ahead` into its silence and ready before the pause is
    /// called: the turn's transcript if the user says no more.
    Ahead,
    /// The whole utterance at a pause the end-of-turn model doubts: an early reply takes it.
    Pause,
}

/// Listen to a stream: partial transcripts go to `partial`, what was heard comes through the
/// receiver (see [`Heard`]); the task then watches for barge-in, cancelling `turn` when the user
/// speaks again, until stopped.
pub fn start(
    sup: Arc<Supervisor>,
    ring: Ring,
    turn: CancellationToken,
    partial: Partial,
) -> (mpsc::UnboundedReceiver<Heard>, Task) {
    let (tx, rx) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let s = stop.clone();
    let handle = tokio::task::spawn_blocking(move || listen(&sup, ring, &turn, &s, tx, &partial));
    (rx, Task { stop, handle })
}

/// Transcribe a whole recording (windows of ≤ 30 s cut at pauses).
pub fn whole(
    sup: Arc<Supervisor>,
    samples: Vec<f32>,
    turn: CancellationToken,
) -> (mpsc::UnboundedReceiver<Heard>, Task) {
    let (tx, rx) = mpsc::unbounded_channel();
    let handle = tokio::task::spawn_blocking(move || {
        let speech_end = Instant::now();
        let ending = Ending { speech_end, end_of_turn_ms: 0.0, stt_ms: 0.0, turn_checks: 0, turn_check_ms: 0.0 };
        let _ = tx.send(transcribe(&sup, &samples, &[], None, &turn, ending));
    });
    (rx, Task { stop: CancellationToken::new(), handle })
}

/// The ids of a draft that ended since the last poll: the next transcription's hint (a draft
/// dropped unpolled would lose them).
fn harvest(draft: &mut Option<Draft>, hint: &mut Vec<u32>) {
    if let Some(Ok((t, _))) = draft.as_mut().and_then(Draft::poll) {
        hint.clone_from(&t.ids);
    }
}

/// Whisper on `samples`. `speech`: whether the VAD heard speech in them (None: not known yet, the
/// VAD runs on them first). No speech is `no_speech`, never a transcript: Whisper turns silence
/// into words ("you").
fn transcribe(
    sup: &Supervisor,
    samples: &[f32],
    hint: &[u32],
    speech: Option<bool>,
    cancel: &CancellationToken,
    ending: Ending,
) -> Heard {
    if samples.len() < 1_600 {
        return Heard::Failed(ErrorCode::BadRequest, "no speech in the audio (under 100 ms)".into());
    }
    let stack = match sup.speech() {
        Ok(s) => s,
        Err(e) => return Heard::Failed(e.code(), e.to_string()),
    };
    let language = language(sup);
    let start = Instant::now();
    let mut stt = stack.stt.lock().expect("stt");
    let speech = match speech {
        Some(s) => s,
        None => match stt.vad.segments(samples) {
            Ok(s) => !s.is_empty(),
            Err(e) => return Heard::Failed(e.code(), e.to_string()),
        },
    };
    if !speech {
        return Heard::Failed(ErrorCode::NoSpeech, "no speech heard in the audio".into());
    }
    let t = stt.transcribe(samples, language.as_deref(), hint, &|| cancel.is_cancelled());
    drop(stt);
    let stt_ms = start.elapsed().as_secs_f64() * 1e3;
    if let Ok(t) = &t {
        log_transcribed(t, "at the end of the turn", stt_ms);
    }
    match t {
        Ok(t) => heard_in(sup, t, Ending { stt_ms, ..ending }),
        Err(e) => Heard::Failed(e.code(), e.to_string()),
    }
}

/// Whisper's figures for the turn's transcript, in the debug log; `stt_ms`: from the end of the
/// turn until it was ready.
fn log_transcribed(t: &Transcript, source: &'static str, stt_ms: f64) {
    tracing::debug!(
        source,
        stt_ms,
        encoder_ms = t.encoder_ms,
        decoder_ms = t.decoder_ms,
        tokens = t.tokens,
        decoder_calls = t.decoder_calls,
        "transcribed"
    );
}

/// The transcript, unless Whisper itself says it heard no speech (noise the VAD took for
/// speech: what Whisper writes then is invented).
fn heard_in(sup: &Supervisor, t: Transcript, ending: Ending) -> Heard {
    if t.is_no_speech(sup.config.speech.no_speech_threshold) {
        tracing::debug!(t.no_speech_prob, t.avg_logprob, "Whisper heard no speech");
        return Heard::Failed(
            ErrorCode::NoSpeech,
            format!("no speech heard in the audio (Whisper's no-speech probability {:.2})", t.no_speech_prob),
        );
    }
    Heard::Transcript(t, ending)
}

/// The language Whisper is told (None: it detects).
fn language(sup: &Supervisor) -> Option<String> {
    match sup.config.speech.language.as_str() {
        "auto" => None,
        l => Some(l.to_string()),
    }
}

/// VAD over the ring until the utterance ends, with drafts of the transcript on the way (see
/// `draft`), then the transcript; then barge-in until `stop`.
fn listen(
    sup: &Supervisor,
    mut ring: Ring,
    turn: &CancellationToken,
    stop: &CancellationToken,
    heard: mpsc::UnboundedSender<Heard>,
    partial: &Partial,
) {
    // The speech models load (once per daemon) while the user is still speaking.
    let stack = match sup.speech() {
        Ok(s) => s,
        Err(e) => {
            let _ = heard.send(Heard::Failed(e.code(), e.to_string()));
            return;
        }
    };
    let s = &sup.config.speech;
    let model = stack.turn.as_ref();
    let pause = s.pause();
    let params = VadParams { min_silence: pause, quiet: s.vad_quiet, ..VadParams::default() };
    let mut vad = match Vad::load(&sup.config.cache_path(&s.vad), s.backend, params) {
        Ok(v) => v,
        Err(e) => {
            let _ = heard.send(Heard::Failed(e.code(), e.to_string()));
            return;
        }
    };
    let ended = |r: &Ring| r.ended.load(Ordering::Acquire);
    // No frame for `audio_idle`: the client stalled (see `SpeechConfig::audio_idle`).
    let stalled = |r: &Ring| r.arrived.lock().unwrap_or_else(|p| p.into_inner()).at.elapsed() >= s.audio_idle;
    let most = vad::samples(s.max_utterance);
    // Audio that comes slower than it plays (one sample a second: never `audio_idle`, and
    // `max_utterance` of samples in days) held the turn and its roles' leases for as long: once
    // the audio that came is `audio_idle` behind the wall clock, the stream ends as at `last`.
    // (A bound on the wall time alone would cut a real-time stream's long utterance after a
    // long silence.) Not a stalled stream's: that is `stalled`, and each turn ends by one bound
    // only, whatever the machine's pace.
    let listening = Instant::now();
    let overdue = |r: &Ring| {
        let came = r.arrived.lock().unwrap_or_else(|p| p.into_inner()).samples;
        !stalled(r)
            && listening.elapsed() >= Duration::from_secs_f64(came as f64 / 16_000.0).saturating_add(s.audio_idle)
    };
    // The utterance reached `max_utterance`: the user may still be speaking, which is not a
    // barge-in on the reply to what they said (it would cancel every such turn's reply).
    let mut capped = false;
    let mut utterance: Vec<f32> = Vec::new();
    let mut chunk = vec![0f32; vad::CHUNK];
    // Speech has begun: `utterance` grows; before it, `recent` keeps the last chunk + pad.
    let mut speaking = false;
    let pad = 1_600; // 100 ms kept before the VAD's onset
    let mut recent: Vec<f32> = Vec::new();
    let ms = |n: usize| n as f64 / 16.0;
    let (pause_n, max_n) = (vad::samples(pause), vad::samples(s.turn_max_silence));
    // Samples heard so far; while the model said "not yet": where the silence began, and when
    // to ask again.
    let mut pos = 0usize;
    let mut waiting: Option<(usize, usize)> = None;
    let mut checks = 0u32;
    // The latest verdict's time, and that of the one that ended the turn (0: the longest
    // silence or the client's `last` frame ended it).
    let (mut check_ms, mut ended_by) = (0f64, 0f64);
    // The latest draft transcript, and whether speech began after it started (then the
    // transcript of the turn cannot be it; speech going on after a draft started inside an
    // utterance's silence does not set it: no verdict waits there, and `ahead` says which
    // silence that draft is for).
    let mut draft: Option<Draft> = None;
    let mut spoke_since_draft = false;
    // The token ids of the latest draft that ended: the next one's guess.
    let mut hint: Vec<u32> = Vec::new();
    // An `Early` transcript was sent and no speech came after it.
    let mut early = false;
    // The latest draft, if it was started `draft_ahead` into a silence, before the pause:
    // where that silence began, and the sample the draft's audio ends at.
    let mut ahead: Option<(usize, usize)> = None;
    let ahead_n = vad::samples(s.draft_ahead);
    let partial_n = vad::samples(s.partial_every);
    // A draft's transcript worth a partial event or an early start (Whisper's own no-speech
    // rule: what it writes over noise is invented).
    let heard_words = |t: &Transcript| !t.text.is_empty() && !t.is_no_speech(s.no_speech_threshold);
    let lang = language(sup);
    let new_draft = |utterance: &[f32], hint: &[u32], partial: bool| match Draft::start(
        stack.clone(),
        utterance.to_vec(),
        lang.clone(),
        hint.to_vec(),
        partial,
    ) {
        Ok(d) => Some(d),
        Err(e) => {
            tracing::warn!("{e}");
            None
        }
    };
    // Is the utterance a finished turn? A model that fails ends the turn (as silence would).
    // `check_ms`: this verdict's time, for the turn's metrics.
    let complete = |utterance: &[f32], checks: &mut u32, check_ms: &mut f64| -> bool {
        let Some(m) = model else { return true };
        *checks += 1;
        let t = Instant::now();
        // The verdict first: the user is waiting on it, and an early reply's decodes beside it
        // slowed it several times over on 2 cores. The model's lock first: another turn's
        // verdict may hold it, and the decodes need not wait on that wait too.
        let mut model = m.lock().expect("end-of-turn model");
        let hold = kazeia_engine::SpeechHold::take();
        let verdict = model.probability(utterance);
        drop(hold);
        drop(model);
        *check_ms = t.elapsed().as_secs_f64() * 1e3;
        match verdict {
            Ok(p) => {
                tracing::debug!(p, ms = *check_ms, "end-of-turn verdict");
                p > s.turn_threshold
            }
            Err(e) => {
                tracing::warn!("end-of-turn model failed, ending the turn at the pause: {e}");
                true
            }
        }
    };
    // 1. The utterance; `since`: where the silence that ended it began (None: the client's
    // `last` frame ended it).
    let since: Option<usize> = loop {
        if turn.is_cancelled() || stop.is_cancelled() {
            let _ = heard.send(Heard::Failed(ErrorCode::Cancelled, "cancelled".into()));
            return;
        }
        if let Some(Ok((t, _))) = draft.as_mut().and_then(Draft::poll) {
            // (A draft that ended before its pause was called is offered at the pause.)
            tracing::debug!(
                frames = t.frames,
                encoder_ms = t.encoder_ms,
                decoder_ms = t.decoder_ms,
                tokens = t.tokens,
                decoder_calls = t.decoder_calls,
                hint = hint.len(),
                "draft ready"
            );
            hint.clone_from(&t.ids);
            if heard_words(t) {
                // The whole utterance so far: a pause's draft, or one started `draft_ahead` into
                // this silence with nothing heard after its audio (the pause will take it).
                let covers = if spoke_since_draft {
                    Covers::SoFar
                } else if waiting.is_some() {
                    Covers::Pause
                } else if ahead.is_some_and(|(_, until)| vad.heard_until() <= until) {
                    Covers::Ahead
                } else {
                    Covers::SoFar
                };
                partial(t, covers);
                // The draft of the whole utterance, chosen at the pause the model doubts
                // (started there or `draft_ahead` into its silence): the turn's transcript if
                // the user says no more.
                if waiting.is_some() && !spoke_since_draft {
                    let _ = heard.send(Heard::Early(t.clone()));
                    early = true;
                }
            }
        }
        if ring.consumer.occupied_len() >= vad::CHUNK {
            ring.consumer.pop_slice(&mut chunk);
            pos += vad::CHUNK;
            if speaking {
                utterance.extend_from_slice(&chunk);
                if utterance.len() >= most {
                    tracing::info!(
                        seconds = s.max_utterance.as_secs_f64(),
                        "the utterance is at `max_utterance`: the turn ends"
                    );
                    capped = true;
                    break None;
                }
            } else {
                recent.extend_from_slice(&chunk);
                let keep = recent.len().saturating_sub(pad + vad::CHUNK);
                recent.drain(..keep);
                // Nobody spoke for as long as an utterance may last: the turn ends, `no_speech`
                // (a stream of silence held the turn and its roles' leases for good).
                if pos >= most {
                    tracing::info!(
                        seconds = s.max_utterance.as_secs_f64(),
                        "no speech within `max_utterance`: the turn ends"
                    );
                    utterance = std::mem::take(&mut recent);
                    break None;
                }
            }
            match vad.push(&chunk) {
                Ok(Some(VadEvent::SpeechStart(_))) if !speaking => {
                    speaking = true;
                    utterance = std::mem::take(&mut recent);
                }
                // The user went on after a pause: the same utterance, no verdict pending.
                Ok(Some(VadEvent::SpeechStart(_))) => {
                    waiting = None;
                    spoke_since_draft = true;
                    if std::mem::take(&mut early) {
                        let _ = heard.send(Heard::Resumed);
                    }
                }
                // The client sent the whole utterance already (`last` came: a recording sent
                // faster than it plays): it ends at `last`, not at a pause inside it; the
                // speech after that pause was taken for a barge-in on the turn's own reply.
                Ok(Some(VadEvent::SpeechEnd(_))) if ended(&ring) => {}
                Ok(Some(VadEvent::SpeechEnd(seg))) => {
                    let silence = vad.silence_start(&seg);
                    // The transcript, beside the verdict: the draft started `draft_ahead`
                    // into this silence if all that came after it is silence (no quieter
                    // speech between the thresholds), else one from now; an older draft stops
                    // first (it holds the transcriber).
                    let started_ahead =
                        draft.is_some() && ahead.is_some_and(|(at, until)| at == silence && vad.heard_until() <= until);
                    tracing::debug!(started_ahead, heard_until = vad.heard_until(), ?ahead, silence, "pause");
                    if !started_ahead {
                        harvest(&mut draft, &mut hint);
                        drop(draft.take());
                        draft = new_draft(&utterance, &hint, false);
                        ahead = None;
                    }
                    spoke_since_draft = false;
                    // (`last` may have come while the model was asked.)
                    if complete(&utterance, &mut checks, &mut check_ms) && !ended(&ring) {
                        ended_by = check_ms;
                        break Some(silence);
                    }
                    waiting = Some((silence, pos + pause_n));
                    // Doubted, and its draft ended already: the early start cannot wait for
                    // a poll that has passed.
                    if let Some(t) = draft.as_ref().and_then(Draft::ended) {
                        if heard_words(t) {
                            let _ = heard.send(Heard::Early(t.clone()));
                            early = true;
                        }
                    }
                }
                Ok(None) => match waiting {
                    Some(_) if ended(&ring) => {}
                    Some((silence, _)) if pos - silence >= max_n => break Some(silence),
                    Some((silence, next)) if pos >= next => {
                        if complete(&utterance, &mut checks, &mut check_ms) {
                            ended_by = check_ms;
                            break Some(silence);
                        }
                        waiting = Some((silence, pos + pause_n));
                    }
                    // Speech after a pause too short for the VAD to call an utterance (a
                    // click, a breath): the silence counts again from here. Before any pause
                    // (no verdict asked yet) a lone click ends nothing: listening goes on.
                    None if checks > 0 && !vad.in_speech() => waiting = Some((pos, pos)),
                    // `draft_ahead` into a silence: the draft of the whole utterance starts
                    // now, not at the pause (a partial draft running stops first, as at the
                    // pause), unless this silence has one or an earlier silence's is still
                    // running (one stopped at every short gap could starve the partials; the
                    // pause then starts one as before). Speech after it leaves it a partial.
                    None if ahead_n > 0
                        && !(ahead.is_some() && draft.as_ref().is_some_and(Draft::is_running))
                        && vad
                            .silence()
                            .is_some_and(|at| pos - at >= ahead_n && ahead.is_none_or(|(a, _)| a != at)) =>
                    {
                        harvest(&mut draft, &mut hint);
                        drop(draft.take());
                        draft = new_draft(&utterance, &hint, false);
                        ahead = vad.silence().map(|at| (at, pos));
                        spoke_since_draft = false;
                    }
                    // Speech goes on: a partial transcript after each `partial_every` of it,
                    // one draft at a time.
                    None if partial_n > 0
                        && vad.in_speech()
                        && !draft.as_ref().is_some_and(Draft::is_running)
                        && utterance.len() >= draft.as_ref().map_or(0, |d| d.covers) + partial_n =>
                    {
                        draft = new_draft(&utterance, &hint, true);
                        ahead = None;
                        spoke_since_draft = true;
                    }
                    _ => {}
                },
                Err(e) => {
                    let _ = heard.send(Heard::Failed(ErrorCode::Engine, e.to_string()));
                    return;
                }
            }
        } else if ended(&ring) || stalled(&ring) || overdue(&ring) {
            // The client said `last`, or sent nothing for `audio_idle`: what is left is the
            // utterance (a stall before any speech: `no_speech`).
            if !ended(&ring) {
                if stalled(&ring) {
                    tracing::info!(
                        seconds = s.audio_idle.as_secs_f64(),
                        "no audio frame for `audio_idle`: the turn ends"
                    );
                } else {
                    tracing::info!(
                        seconds = listening.elapsed().as_secs_f64(),
                        heard_seconds = pos as f64 / 16_000.0,
                        "the audio comes slower than it plays (`audio_idle` behind the wall clock): the turn ends"
                    );
                }
            }
            let mut rest = vec![0f32; ring.consumer.occupied_len()];
            ring.consumer.pop_slice(&mut rest);
            pos += rest.len();
            if !speaking {
                utterance = std::mem::take(&mut recent);
            }
            utterance.extend(rest);
            break None;
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let segment_end = since.is_some();
    // When the latest frame came, less the audio since the speech stopped up to its end: where
    // the silence that ended the turn began, else (the client's `last` frame, a stream that
    // stalled) the end of the last speech the VAD heard. With `now` for the latter, a turn a
    // stall ended after `audio_idle` (30 s) said it had waited ~0 ms.
    let stopped = since.unwrap_or_else(|| vad.heard_until().min(pos));
    let speech_end = {
        let arrived = *ring.arrived.lock().unwrap_or_else(|p| p.into_inner());
        let waited = arrived.samples.max(pos).saturating_sub(stopped);
        arrived.at.checked_sub(Duration::from_secs_f64(ms(waited) / 1e3)).unwrap_or(arrived.at)
    };
    let end_of_turn_ms = speech_end.elapsed().as_secs_f64() * 1e3;
    // The draft chosen at the pause that ended the turn is its transcript (what came after it
    // is silence); else Whisper starts now, with the latest draft's ids as its hint.
    harvest(&mut draft, &mut hint);
    let drafted = match draft.take() {
        Some(d) if segment_end && !spoke_since_draft => {
            let decided = Instant::now();
            tracing::debug!(covers = d.covers, "the turn ended: waiting for the draft begun at the pause");
            let Some(drafted) = d.wait_until(|| turn.is_cancelled() || stop.is_cancelled()) else {
                tracing::debug!("cancelled while the draft transcription ran: stopped");
                let _ = heard.send(Heard::Failed(ErrorCode::Cancelled, "cancelled".into()));
                return;
            };
            match drafted {
                Ok((t, ready)) => {
                    let stt_ms = ready.saturating_duration_since(decided).as_secs_f64() * 1e3;
                    log_transcribed(&t, "draft", stt_ms);
                    Some(heard_in(
                        sup,
                        t,
                        Ending { speech_end, end_of_turn_ms, stt_ms, turn_checks: checks, turn_check_ms: ended_by },
                    ))
                }
                Err(e) => {
                    tracing::warn!("the draft transcription failed, transcribing again: {e}");
                    None
                }
            }
        }
        _ => None,
    };
    let t = drafted.unwrap_or_else(|| {
        let ending = Ending { speech_end, end_of_turn_ms, stt_ms: 0.0, turn_checks: checks, turn_check_ms: ended_by };
        transcribe(sup, &utterance, &hint, Some(speaking), turn, ending)
    });
    let failed = matches!(t, Heard::Failed(..));
    let _ = heard.send(t);
    if failed || (!segment_end && ended(&ring)) {
        return;
    }
    // 2. Barge-in: new speech while the reply runs cancels the turn (after `max_utterance`, the
    // audio still coming is only drained).
    vad.reset();
    while !stop.is_cancelled() && !turn.is_cancelled() {
        if ring.consumer.occupied_len() >= vad::CHUNK {
            ring.consumer.pop_slice(&mut chunk);
            if capped {
                continue;
            }
            if let Ok(Some(VadEvent::SpeechStart(_))) = vad.push(&chunk) {
                tracing::info!("sound during the reply: a barge-in once it is 192 ms of speech");
            }
            if vad.voiced() >= vad::samples(BARGE_IN) {
                tracing::info!("barge-in: the user spoke during the reply; stopping it");
                turn.cancel();
            }
        } else if ended(&ring) {
            return;
        } else {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
