//! Running an admitted [`Turn`]: one flow for every pipeline, text or audio, for the socket and
//! for `kazeia run` alike.
//!
//! [transcribe] → [guard input] → [think] → [guard output] → [speak], as the pipeline's file
//! says: the roles are loaded (with progress on the turn's id), the audio heard (`listen`), the
//! cascade run by the pipelines' runner, and the released sentences spoken (`speaker`). Every
//! part of a turn — the blocking VAD/STT loop, the speaker — is awaited by the turn's own
//! future, which the connection's task set (or `kazeia run`) owns: nothing outlives its turn.

mod draft;
pub mod listen;
mod speaker;

use std::sync::Arc;

use kazeia_ipc::{ErrorCode, Event, Frame, Metrics, StopReason};
use kazeia_pipelines::{run_turn, Engines, GenerateOptions, TurnInput};
use tokio::sync::mpsc;

use crate::supervisor::{Supervisor, Turn};
pub use listen::{AudioInput, Heard};
use speaker::Speaker;

/// Where a turn's events and audio frames go (a connection's outbox, the CLI's printer).
pub type Output = Arc<dyn Fn(Frame) + Send + Sync>;

/// An audio turn's input: streamed frames (the socket) or a whole recording (`kazeia run`).
pub enum AudioSource {
    Stream(listen::Ring),
    Complete(Vec<f32>),
}

/// Run `turn` to its final event (exactly one `done` or `error`, last). `progress` tells whether
/// load progress is sent as events.
pub async fn run(sup: Arc<Supervisor>, turn: Turn, audio: Option<AudioSource>, out: Output) {
    // An audio turn keeps the speech models from being unloaded under it.
    let speech = (turn.plan.transcribe || turn.plan.speak).then(|| sup.speech_use());
    let last = flow(&sup, &turn, audio, &out).await;
    log_end(&turn, &last);
    // Deregistered and leases released before the final event leaves: a client that unloads
    // the moment it reads `done` found the role still leased ("in use": the D-Bus test failed
    // so in a clean-clone run).
    drop(turn);
    drop(speech);
    out(Frame::event(&last));
}

/// The turn's events but the final one, which is returned.
async fn flow(sup: &Arc<Supervisor>, turn: &Turn, audio: Option<AudioSource>, out: &Output) -> Event {
    let id = Some(turn.id.clone());
    let ev = |e: Event| out(Frame::event(&e));
    let error = |code, message: String| Event::Error { id: id.clone(), code, message, is_final: true };
    let done = |stop, metrics| Event::Done { id: id.clone(), stop, metrics };

    // 1. The roles, loaded under the budget (the lease already keeps them once loaded).
    let roles = turn.pipeline.roles();
    for role in &roles {
        if let Err(e) = sup.ensure_loaded(role, progress(out.clone(), &turn.id, role)).await {
            return error(e.code, e.message);
        }
    }
    sup.touch(&roles);

    // 2. What was said: the text, or the audio heard.
    let mut listening = None;
    let mut ending = None;
    let (text, language) = if turn.plan.transcribe {
        let (heard, task) = match audio {
            Some(AudioSource::Stream(ring)) => {
                let (out, id) = (out.clone(), id.clone());
                let partial: listen::Partial = Box::new(move |t| {
                    out(Frame::event(&Event::Transcript {
                        id: id.clone(),
                        text: t.text.clone(),
                        language: Some(t.language.clone()),
                        is_final: false,
                    }))
                });
                listen::start(sup.clone(), ring, turn.cancel.clone(), partial)
            }
            Some(AudioSource::Complete(samples)) => listen::whole(sup.clone(), samples, turn.cancel.clone()),
            None => return error(ErrorCode::BadRequest, "an audio turn without audio".into()),
        };
        listening = Some(task);
        let heard = match heard.await {
            Ok(Heard::Transcript(t, e)) => {
                ending = Some(e);
                t
            }
            Ok(Heard::Failed(code, message)) => {
                return if turn.cancel.is_cancelled() {
                    done(StopReason::Cancelled, Metrics::default())
                } else {
                    error(code, message)
                }
            }
            Err(_) => return error(ErrorCode::Engine, "the speech task stopped".into()),
        };
        ev(Event::Transcript {
            id: id.clone(),
            text: heard.text.clone(),
            language: Some(heard.language.clone()),
            is_final: true,
        });
        let language = sup.config.speech.reply_language(&heard.language);
        (heard.text, language)
    } else {
        let text = turn.request.text.clone().unwrap_or_default();
        // `[speech] language` fixed (not `auto`): speak it; else the text's own language.
        let language = match sup.config.speech.language.as_str() {
            "auto" => kazeia_pipelines::guard::detect_language(&text),
            fixed => fixed,
        };
        let language = sup.config.speech.reply_language(language);
        (text, language)
    };
    if turn.cancel.is_cancelled() {
        return stop_listening(listening, done(StopReason::Cancelled, Metrics::default())).await;
    }

    // 3. Speech only: the transcript, or the text spoken.
    if !turn.plan.has_text_stages() {
        let last = if turn.plan.speak {
            let speaker = Speaker::start(sup.clone(), turn.id.clone(), language, turn.cancel.clone(), out.clone());
            for sentence in kazeia_pipelines::split::sentences(&text) {
                speaker.say(sentence.to_string());
            }
            match speaker.finish().await {
                Ok(s) if s.finished => {
                    done(StopReason::Eos, speech_metrics(Metrics::default(), ending.as_ref(), Some(s)))
                }
                Ok(_) => done(StopReason::Cancelled, Metrics::default()),
                Err(e) => error(e.code(), e.to_string()),
            }
        } else {
            let stop = if turn.cancel.is_cancelled() { StopReason::Cancelled } else { StopReason::Eos };
            done(stop, speech_metrics(Metrics::default(), ending.as_ref(), None))
        };
        return stop_listening(listening, last).await;
    }

    // 4. The cascade; its sentences spoken as they are released. Barge-in (new speech heard by
    // the listening task) cancels the turn's token, which stops the runner and the speaker.
    let speaker = turn
        .plan
        .speak
        .then(|| Speaker::start(sup.clone(), turn.id.clone(), language, turn.cancel.clone(), out.clone()));
    let o = &turn.request.options;
    let input = TurnInput {
        id: id.clone(),
        text,
        options: GenerateOptions {
            temperature: o.temperature,
            seed: o.seed,
            max_tokens: o.max_tokens,
            ignore_eos: false,
            thinking_budget: o.thinking_budget,
        },
        session: turn.request.session.as_deref().map(|s| session_key(turn.who.uid, s)),
        show_thinking: o.show_thinking,
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let forward = async {
        let mut last = None;
        while let Some(e) = rx.recv().await {
            if let (Event::Sentence { text, .. }, Some(s)) = (&e, &speaker) {
                s.say(text.clone());
            }
            match e {
                Event::Done { .. } | Event::Error { .. } => last = Some(e),
                e => ev(e),
            }
        }
        last
    };
    let engines = Engines { llm: &sup.engine, policy: &sup.config.guard, sessions: Some(&sup.sessions) };
    let (_, last) = tokio::join!(run_turn(&turn.pipeline, input, engines, turn.cancel.clone(), tx), forward);
    let mut last = last.unwrap_or_else(|| error(ErrorCode::Engine, "the runner ended without a final event".into()));
    // The speaker sends the last audio frame: the final event must follow it.
    let mut spoken = None;
    if let Some(s) = speaker {
        match s.finish().await {
            Ok(s) => spoken = Some(s),
            Err(e) if matches!(last, Event::Done { .. }) => last = error(e.code(), e.to_string()),
            Err(e) => tracing::warn!("TTS failed after the turn had failed: {e}"),
        }
    }
    if let Event::Done { metrics, .. } = &mut last {
        *metrics = speech_metrics(std::mem::take(metrics), ending.as_ref(), spoken);
    }
    stop_listening(listening, last).await
}

/// A turn's metrics with its speech stages: how the user's turn ended, the transcription, the
/// first sentence's synthesis and what the user waited from the end of their speech to the
/// reply's first sound.
fn speech_metrics(mut m: Metrics, ending: Option<&listen::Ending>, spoken: Option<speaker::Spoken>) -> Metrics {
    if let Some(e) = ending {
        m.end_of_turn_ms = Some(e.end_of_turn_ms);
        m.turn_checks = Some(e.turn_checks);
        m.stt_ms = Some(e.stt_ms);
    }
    if let Some((at, tts_ms)) = spoken.and_then(|s| s.first_audio) {
        m.tts_first_ms = Some(tts_ms);
        if let Some(e) = ending {
            m.speech_end_to_audio_ms = Some(at.duration_since(e.speech_end).as_secs_f64() * 1e3);
        }
    }
    m
}

/// The listening task keeps watching for barge-in while the reply runs: stop it and wait for it
/// before the final event, so that nothing of the turn is left running.
async fn stop_listening(task: Option<listen::Task>, last: Event) -> Event {
    if let Some(task) = task {
        task.stop().await;
    }
    last
}

/// A progress callback sending `load_progress` events, at most one per percent.
pub fn progress(out: Output, id: &str, role: &str) -> impl Fn(f32) + Send + 'static {
    let (id, role) = (id.to_string(), role.to_string());
    let last = std::sync::atomic::AtomicU32::new(u32::MAX);
    move |p: f32| {
        let pct = (p * 100.0) as u32;
        if last.swap(pct, std::sync::atomic::Ordering::Relaxed) != pct {
            out(Frame::event(&Event::LoadProgress { id: Some(id.clone()), role: role.clone(), progress: p }));
        }
    }
}

/// One line per finished turn: how it stopped and what it generated (the id is the client's
/// string, so it is logged escaped).
fn log_end(turn: &Turn, last: &Event) {
    let (conn, id, pipeline) = (turn.who.conn, &turn.id, &turn.pipeline.name);
    match last {
        Event::Done { stop, metrics, .. } => {
            let stop = format!("{stop:?}").to_lowercase();
            tracing::info!(conn, id = ?id, pipeline, stop, generated = metrics.generated_tokens, "turn ended");
        }
        Event::Error { code, .. } => tracing::info!(conn, id = ?id, pipeline, code = code.as_str(), "turn ended"),
        _ => tracing::warn!(conn, id = ?id, pipeline, "turn ended without a final event"),
    }
}

/// A session's key in the store: the client's name, within its user's own space (two users
/// naming a session "default" never share a conversation). The separator is a control
/// character, which a client's name cannot hold (the parser refuses them).
pub fn session_key(uid: u32, name: &str) -> String {
    format!("{uid}\u{1f}{name}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn sessions_are_scoped_to_their_user() {
        assert_ne!(super::session_key(1000, "default"), super::session_key(1001, "default"));
        // No name can make one user's key look like another's.
        assert_ne!(super::session_key(10, "0\u{1f}x"), super::session_key(100, "x"));
        assert!(kazeia_ipc::parse_request(
            "{\"type\":\"turn\",\"id\":\"t\",\"text\":\"hi\",\"session\":\"0\\u001fx\"}".as_bytes()
        )
        .is_err());
    }
}
