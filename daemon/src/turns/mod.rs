//! Running an admitted [`Turn`]: one flow for every pipeline, text or audio, for the socket and
//! for `kazeia run` alike.
//!
//! [transcribe] → [guard input] → [think] → [guard output] → [speak], as the pipeline's file
//! says: the roles are loaded (with progress on the turn's id), the audio heard (`listen`), the
//! cascade run by the pipelines' runner, and the released sentences spoken (`speaker`). Every
//! part of a turn — the blocking VAD/STT loop, the speaker — is awaited by the turn's own
//! future, which the connection's task set (or `kazeia run`) owns: nothing outlives its turn
//! but a load of its roles under way when it was cancelled, which ends as a `load` request's.
//!
//! Preemptive start (voice): when the listener has the transcript of an utterance whose end the
//! end-of-turn model still doubts (`Heard::Early`), the cascade starts on it; its events wait
//! in their channel, so no token, verdict or audio leaves before the turn has ended. The turn
//! ending on that same transcript takes the reply over as it stands; more speech, another
//! transcript or a failure cancels it (and it never joins the session).

mod draft;
pub mod listen;
mod speaker;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};
use kazeia_ipc::{ErrorCode, Event, Frame, Metrics, StopReason};
use kazeia_pipelines::{run_turn, Engines, GenerateOptions, TurnInput};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

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

/// Run `turn` to its final event (exactly one `done` or `error`, last), which is returned for
/// the caller to send: a connection sends it under the lock that frees the turn's id there, so
/// that nothing (a new turn under the id, its audio) falls between the two.
pub async fn run(sup: Arc<Supervisor>, turn: Turn, audio: Option<AudioSource>, out: Output) -> Frame {
    // An audio turn keeps the speech models from being unloaded under it.
    let speech = (turn.plan.transcribe || turn.plan.speak).then(|| sup.speech_use());
    let last = flow(&sup, &turn, audio, &out).await;
    log_end(&turn, &last);
    // Deregistered and leases released before the final event leaves: a client that unloads
    // the moment it reads `done` found the role still leased ("in use": the D-Bus test failed
    // so in a clean-clone run).
    drop(turn);
    drop(speech);
    Frame::event(&last)
}

/// The turn's events but the final one, which is returned.
async fn flow(sup: &Arc<Supervisor>, turn: &Turn, audio: Option<AudioSource>, out: &Output) -> Event {
    let id = Some(turn.id.clone());
    let ev = |e: Event| out(Frame::event(&e));
    let error = |code, message: String| Event::error(id.clone(), code, message, true);
    let done = |stop, metrics| Event::Done { id: id.clone(), stop, metrics };

    // 1. The roles, loaded under the budget (the lease already keeps them once loaded). A
    // cancel ends the turn at once: it waited for the whole load, and for every load queued
    // before it (PROTOCOL: within a decode step). The load goes on to its end on its own task
    // (dropped halfway, it would leave the ledger and the role's state behind the engine), as a
    // `load` request's would, and tells this turn no more of its progress.
    // (A load that has not begun by then does not: it gives up its place once it has the
    // loads' lock, else turns cancelled one after another queued loads no lease bounded.)
    let roles = turn.pipeline.roles();
    for role in &roles {
        let (sup, role, cancel) = (sup.clone(), role.clone(), turn.cancel.clone());
        let report = progress(out.clone(), &turn.id, &role);
        // Set before the turn's `done` under the lock each progress event is sent under: none
        // follows the final event.
        let ended = Arc::new(std::sync::Mutex::new(false));
        let told = ended.clone();
        let mut load = tokio::spawn(async move {
            let progress = move |p| {
                if !*told.lock().unwrap_or_else(|e| e.into_inner()) {
                    report(p)
                }
            };
            sup.load_for_turn(&role, progress, &cancel).await
        });
        tokio::select! {
            loaded = &mut load => match loaded {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.code == ErrorCode::Cancelled => return done(StopReason::Cancelled, Metrics::default()),
                Ok(Err(e)) => return error(e.code, e.message),
                Err(e) => return error(ErrorCode::Engine, format!("the load stopped: {e}")),
            },
            () = turn.cancel.cancelled() => {
                *ended.lock().unwrap_or_else(|e| e.into_inner()) = true;
                return done(StopReason::Cancelled, Metrics::default());
            }
        }
    }
    sup.touch(&roles);

    // 2. What was said: the text, or the audio heard; a reply may start before the turn ends.
    let mut listening = None;
    let mut ending = None;
    let mut early: Option<Reply<'_>> = None;
    // Early replies being stopped: driven beside the rest, all ended before the final event.
    let mut dropped: Dropped<'_> = FuturesUnordered::new();
    // Partial transcripts taken during speech, for the roles to prefill while the user speaks
    // (`true`: the whole utterance's, before its pause).
    let (heard_so_far, mut partials) = mpsc::unbounded_channel::<(String, bool)>();
    let (text, language) = if turn.plan.transcribe {
        let (mut heard, task) = match audio {
            Some(AudioSource::Stream(ring)) => {
                let (out, id) = (out.clone(), id.clone());
                let partial: listen::Partial = Box::new(move |t, covers| {
                    out(Frame::event(&Event::Transcript {
                        id: id.clone(),
                        text: t.text.clone(),
                        language: Some(t.language.clone()),
                        is_final: false,
                    }));
                    // The whole utterance's draft before its pause is prefilled whole (the
                    // turn's requests then find their prompts held); at a pause the model
                    // doubts, an early reply takes it.
                    match covers {
                        listen::Covers::SoFar => drop(heard_so_far.send((t.text.clone(), false))),
                        listen::Covers::Ahead => drop(heard_so_far.send((t.text.clone(), true))),
                        listen::Covers::Pause => {}
                    }
                });
                listen::start(sup.clone(), ring, turn.cancel.clone(), partial)
            }
            Some(AudioSource::Complete(samples)) => listen::whole(sup.clone(), samples, turn.cancel.clone()),
            None => return error(ErrorCode::BadRequest, "an audio turn without audio".into()),
        };
        listening = Some(task);
        let heard = loop {
            // While an early reply runs, it makes progress as the listener goes on.
            let next = match early.as_mut() {
                Some(r) => tokio::select! {
                    h = heard.recv() => h,
                    () = async { r.run.as_mut().expect("running").await }, if r.run.is_some() => {
                        r.run = None;
                        continue;
                    }
                    Some(e) = r.events.recv() => {
                        r.keep(e);
                        continue;
                    }
                    () = tokio::time::sleep_until(r.hold_until.unwrap_or_else(tokio::time::Instant::now)),
                        if r.hold.is_some() =>
                    {
                        r.hold = None;
                        continue;
                    }
                    Some(()) = dropped.next() => continue,
                    Some((t, whole)) = partials.recv() => {
                        dropped.push(prefill_ahead(sup, turn, t, whole));
                        continue;
                    }
                },
                None => tokio::select! {
                    h = heard.recv() => h,
                    Some(()) = dropped.next() => continue,
                    Some((t, whole)) = partials.recv() => {
                        dropped.push(prefill_ahead(sup, turn, t, whole));
                        continue;
                    }
                },
            };
            match next {
                Some(Heard::Early(t)) if turn.plan.has_text_stages() => {
                    drop_early(&mut early, &mut dropped);
                    tracing::info!(conn = turn.who.conn, "the reply starts before the end of the turn");
                    early = Some(Reply::start(sup, turn, t.text, true));
                }
                Some(Heard::Early(_)) => {}
                Some(Heard::Resumed) => {
                    if early.is_some() {
                        tracing::info!(conn = turn.who.conn, "the user went on: the early reply is dropped");
                    }
                    drop_early(&mut early, &mut dropped);
                }
                Some(Heard::Transcript(t, e)) => {
                    ending = Some(e);
                    break t;
                }
                Some(Heard::Failed(code, message)) => {
                    drop_early(&mut early, &mut dropped);
                    settle(&mut dropped).await;
                    let last = if turn.cancel.is_cancelled() {
                        done(StopReason::Cancelled, Metrics::default())
                    } else {
                        error(code, message)
                    };
                    return stop_listening(listening, last).await;
                }
                None => {
                    drop_early(&mut early, &mut dropped);
                    settle(&mut dropped).await;
                    return error(ErrorCode::Engine, "the speech task stopped".into());
                }
            }
        };
        // A turn cancelled while Whisper ran: what it had decoded is no transcript (the turn
        // ends `cancelled` below, with nothing before it).
        if !turn.cancel.is_cancelled() {
            ev(Event::Transcript {
                id: id.clone(),
                text: heard.text.clone(),
                language: Some(heard.language.clone()),
                is_final: true,
            });
        }
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
        drop_early(&mut early, &mut dropped);
        settle(&mut dropped).await;
        return stop_listening(listening, done(StopReason::Cancelled, Metrics::default())).await;
    }
    // The early reply is the turn's if it answers what the turn's transcript says (and did not
    // fail: an error then, e.g. `busy`, may not be one now).
    let failed = |r: &Reply<'_>| r.kept.iter().any(|e| matches!(e, Event::Error { .. }));
    // What it sent and the turn has not read yet counts too: an `Error` still in the channel
    // (the transcript's branch came first) made a failed early reply the turn's answer.
    if let Some(r) = early.as_mut() {
        while let Ok(e) = r.events.try_recv() {
            r.keep(e);
        }
    }
    let (reply, early_start_ms) = match early.take() {
        Some(mut r) if r.text == text && !failed(&r) => {
            // Its first sentence goes to the speaker: the hold until it takes it, no longer.
            let speaks = turn.plan.speak && r.kept.iter().any(|e| matches!(e, Event::Sentence { .. }));
            match r.hold.take() {
                Some(h) if speaks => h.to_speech(),
                h => drop(h),
            }
            let _ = r.confirm.send(true);
            let lead = r.started.elapsed().as_secs_f64() * 1e3;
            tracing::info!(conn = turn.who.conn, lead_ms = lead, "the early reply is the turn's");
            (Some(r), Some(lead))
        }
        mut other => {
            drop_early(&mut other, &mut dropped);
            (None, None)
        }
    };

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
    let Reply { run, events: mut rx, kept, text: asked, .. } =
        reply.unwrap_or_else(|| Reply::start(sup, turn, text, false));
    let forward = async {
        let mut last = None;
        let mut kept = kept.into_iter();
        loop {
            let e = match kept.next() {
                Some(e) => e,
                None => match rx.recv().await {
                    Some(e) => e,
                    None => break,
                },
            };
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
    let run = async {
        if let Some(run) = run {
            run.await
        }
    };
    let (_, last, ()) = tokio::join!(run, forward, settle(&mut dropped));
    let mut last = last.unwrap_or_else(|| error(ErrorCode::Engine, "the runner ended without a final event".into()));
    // The speaker sends the last audio frame: the final event must follow it.
    let mut spoken = None;
    if let Some(s) = speaker {
        match s.finish().await {
            Ok(s) => {
                // Barge-in (or a cancel) after the Thinker had finished: the reply's last
                // sentences were not spoken, and it did not end as written (PROTOCOL: `done`,
                // `cancelled`; it said `eos`).
                if let (false, Event::Done { stop, .. }) = (s.finished, &mut last) {
                    // The runner recorded the turn in its session if it ended as written (not
                    // cancelled, not blocked): a cancelled turn is not kept (the runner's rule),
                    // and the user did not hear the rest. (Taken back otherwise, it erased the
                    // session's previous turn when it asked the same.)
                    let recorded = matches!(*stop, StopReason::Eos | StopReason::Length | StopReason::ContextFull);
                    *stop = StopReason::Cancelled;
                    if let (true, Some(name)) = (recorded, &turn.request.session) {
                        sup.sessions.retract(&session_key(turn.who.uid, name), &asked);
                    }
                }
                spoken = Some(s)
            }
            Err(e) if matches!(last, Event::Done { .. }) => last = error(e.code(), e.to_string()),
            Err(e) => tracing::warn!("TTS failed after the turn had failed: {e}"),
        }
    }
    if let Event::Done { metrics, .. } = &mut last {
        *metrics = speech_metrics(std::mem::take(metrics), ending.as_ref(), spoken);
        if let Some(lead) = early_start_ms {
            // From the end of the turn, as for a reply that starts then: nothing was released
            // before it.
            metrics.ttft_ms = (metrics.ttft_ms - lead).max(0.0);
            metrics.ttfs_ms = metrics.ttfs_ms.map(|ms| (ms - lead).max(0.0));
            metrics.ttfa_ms = metrics.ttfa_ms.map(|ms| (ms - lead).max(0.0));
            metrics.early_start_ms = Some(lead);
        }
    }
    stop_listening(listening, last).await
}

/// A reply's cascade, as a future the turn drives.
type RunFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Work the turn drives beside the rest until it has ended: early replies that were cancelled,
/// prefills of what the user said so far.
type Dropped<'a> = FuturesUnordered<RunFuture<'a>>;

/// While the user speaks: both guard checks and the Thinker prefill the words heard so far
/// (`kazeia_pipelines::warm`), so that at the end of the turn they decode only the rest; `whole`:
/// the transcript of the whole utterance, before its pause. Each yields to any request of the
/// roles; nothing is sampled or released.
fn prefill_ahead<'a>(sup: &'a Arc<Supervisor>, turn: &'a Turn, text: String, whole: bool) -> RunFuture<'a> {
    Box::pin(async move {
        if !turn.plan.has_text_stages() {
            return;
        }
        // The turn's reasoning budget: a whole prompt prefilled ahead is the Thinker's as the
        // turn will render it (think block open or empty).
        // (`max_tokens` too: the room it leaves decides the history the turn keeps.)
        let o = &turn.request.options;
        let options =
            GenerateOptions { thinking_budget: o.thinking_budget, max_tokens: o.max_tokens, ..Default::default() };
        let input = TurnInput {
            text,
            options,
            session: turn.request.session.as_deref().map(|s| session_key(turn.who.uid, s)),
            ..TurnInput::default()
        };
        let engines = Engines { llm: &sup.engine, policy: &sup.config.guard, sessions: Some(&sup.sessions) };
        let t = Instant::now();
        for (role, outcome) in
            kazeia_pipelines::warm(&turn.pipeline, &input, whole, engines, turn.cancel.child_token()).await
        {
            match outcome {
                Ok(p) => tracing::debug!(
                    conn = turn.who.conn,
                    role,
                    prompt = p.prompt_tokens,
                    prefilled = p.prefilled_tokens,
                    ms = p.ms,
                    "prefilled ahead of the end of the turn"
                ),
                Err(e) => tracing::debug!(conn = turn.who.conn, role, "no prefill ahead: {e}"),
            }
        }
        tracing::debug!(conn = turn.who.conn, ms = t.elapsed().as_secs_f64() * 1e3, "prefills ahead done");
    })
}

/// Cancel the early reply, if any: its hold goes first (a decode waiting on it would not see the
/// cancel for `MAX_HOLD`), its events are never sent, and `dropped` drives it to its end.
fn drop_early<'a>(early: &mut Option<Reply<'a>>, dropped: &mut Dropped<'a>) {
    if let Some(mut r) = early.take() {
        r.hold = None;
        r.cancel.cancel();
        if let Some(run) = r.run.take() {
            dropped.push(run);
        }
    }
}

/// Wait until every dropped early reply has stopped (within a decode step of its cancel).
async fn settle(dropped: &mut Dropped<'_>) {
    while dropped.next().await.is_some() {}
}

/// The cascade running for one transcript: its future (None once it has ended) and its events,
/// kept until the turn forwards them.
struct Reply<'a> {
    text: String,
    run: Option<RunFuture<'a>>,
    events: mpsc::UnboundedReceiver<Event>,
    /// An early reply's events so far, in order.
    kept: Vec<Event>,
    /// Held from an early reply's first released unit until the turn ends: no decode starts
    /// meanwhile (at most `MAX_HOLD`). The reply has what the user will hear first, and the
    /// listener needs the cores: on 2 of them, a Thinker writing on beside it made each
    /// end-of-turn verdict slow and the listener fell seconds behind the microphone.
    hold: Option<kazeia_engine::SpeechHold>,
    /// When the hold ends even if the turn has not (a hold stops every turn's decodes); set
    /// once, when it is taken.
    hold_until: Option<tokio::time::Instant>,
    /// Cancels this reply only (a child of the turn's token).
    cancel: CancellationToken,
    /// Early replies: `true` when the turn takes it (then it may join the session).
    confirm: watch::Sender<bool>,
    started: Instant,
}

impl<'a> Reply<'a> {
    fn start(sup: &'a Arc<Supervisor>, turn: &'a Turn, text: String, early: bool) -> Reply<'a> {
        let o = &turn.request.options;
        let (confirm, confirmed) = watch::channel(false);
        let input = TurnInput {
            id: Some(turn.id.clone()),
            text: text.clone(),
            options: GenerateOptions {
                temperature: o.temperature,
                seed: o.seed,
                max_tokens: o.max_tokens,
                ignore_eos: false,
                thinking_budget: o.thinking_budget,
            },
            session: turn.request.session.as_deref().map(|s| session_key(turn.who.uid, s)),
            show_thinking: o.show_thinking,
            confirmed: early.then_some(confirmed),
        };
        let (tx, events) = mpsc::unbounded_channel();
        let cancel = turn.cancel.child_token();
        let engines = Engines { llm: &sup.engine, policy: &sup.config.guard, sessions: Some(&sup.sessions) };
        let run = Box::pin(run_turn(&turn.pipeline, input, engines, cancel.clone(), tx));
        Reply {
            text,
            run: Some(run),
            events,
            kept: Vec::new(),
            hold: None,
            hold_until: None,
            cancel,
            confirm,
            started: Instant::now(),
        }
    }

    /// Keep an early reply's event; its first unit (or its end) stops the decodes.
    fn keep(&mut self, e: Event) {
        if self.hold_until.is_none() && matches!(e, Event::Sentence { .. } | Event::Done { .. } | Event::Error { .. }) {
            self.hold = Some(kazeia_engine::SpeechHold::speak());
            self.hold_until = Some(tokio::time::Instant::now() + kazeia_engine::MAX_HOLD);
        }
        self.kept.push(e);
    }
}

/// A turn's metrics with its speech stages: how the user's turn ended, the transcription, the
/// first sentence's synthesis and what the user waited from the end of their speech to the
/// reply's first sound.
fn speech_metrics(mut m: Metrics, ending: Option<&listen::Ending>, spoken: Option<speaker::Spoken>) -> Metrics {
    if let Some(e) = ending {
        m.end_of_turn_ms = Some(e.end_of_turn_ms);
        m.turn_checks = Some(e.turn_checks);
        m.turn_check_ms = (e.turn_checks > 0).then_some(e.turn_check_ms as f32);
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
