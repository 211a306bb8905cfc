//! One client connection: peer check, handshake, then requests until the client goes away.
//!
//! Outgoing frames pass through a bounded buffer; a client that does not read fast enough to keep
//! it from filling is disconnected (the engine is never made to wait for a socket). When a
//! connection ends for any reason, every turn it started is cancelled.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use kazeia_ipc::{ErrorCode, Event, Frame, FrameCodec, FrameError, Limits, Request, PROTOCOL_VERSION};
use kazeia_pipelines::{run_turn, Engines, GenerateOptions, TurnInput};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

use super::supervisor::{Supervisor, TurnEntry};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The sending half of a connection, shared by its tasks.
#[derive(Clone)]
struct Outbox {
    tx: mpsc::Sender<Frame>,
    /// Cancelled when the buffer overflowed: the connection must close.
    overflow: CancellationToken,
    conn: u64,
}

impl Outbox {
    fn send(&self, ev: &Event) {
        self.send_frame(Frame::event(ev));
    }

    fn send_frame(&self, f: Frame) {
        match self.tx.try_send(f) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                if !self.overflow.is_cancelled() {
                    tracing::warn!(
                        conn = self.conn,
                        "client reads too slowly: its buffer of frames is full, closing the connection"
                    );
                    self.overflow.cancel();
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    fn error(&self, id: Option<String>, code: ErrorCode, message: impl Into<String>) {
        self.send(&Event::Error { id, code, message: message.into() });
    }
}

/// Counts the connection while it lives.
struct Counted(Arc<Supervisor>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

pub async fn handle(sup: Arc<Supervisor>, stream: UnixStream, closing: CancellationToken) {
    let conn = sup.next_conn_id();
    let uid = stream.peer_cred().map(|c| c.uid()).unwrap_or(u32::MAX);
    let own = unsafe { libc::geteuid() };
    let allowed =
        if sup.config.daemon.allow_uids.is_empty() { uid == own } else { sup.config.daemon.allow_uids.contains(&uid) };
    let max_frame = sup.config.daemon.max_frame;
    if let Some(bytes) = sup.config.daemon.socket_send_buffer {
        set_send_buffer(&stream, bytes);
    }
    let mut framed = Framed::new(stream, FrameCodec::new(max_frame));
    if !allowed {
        tracing::warn!(conn, uid, "refused a peer whose uid is not allowed");
        let ev = Event::Error {
            id: None,
            code: ErrorCode::PermissionDenied,
            message: format!("uid {uid} may not use this daemon"),
        };
        let _ = framed.send(Frame::event(&ev)).await;
        return;
    }
    sup.connections.fetch_add(1, Ordering::Relaxed);
    let _counted = Counted(sup.clone());

    // Handshake: the first frame must be a hello with our protocol version.
    let refuse = |code, message: String| Frame::event(&Event::Error { id: None, code, message });
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, framed.next()).await {
        Ok(Some(Ok(Frame::Json(b)))) => match serde_json::from_slice::<Request>(&b) {
            Ok(Request::Hello { protocol, .. }) if protocol == PROTOCOL_VERSION => {
                let welcome = Event::Welcome {
                    protocol: PROTOCOL_VERSION,
                    server: format!("kazeia {}", env!("CARGO_PKG_VERSION")),
                    capabilities: vec![
                        "text".into(),
                        "audio".into(),
                        "cancel".into(),
                        "status".into(),
                        "load".into(),
                        "subscribe".into(),
                    ],
                    limits: Limits {
                        max_frame,
                        queue_per_model: sup.config.daemon.queue_per_model,
                        connection_buffer: sup.config.daemon.connection_buffer,
                    },
                };
                if framed.send(Frame::event(&welcome)).await.is_err() {
                    return;
                }
            }
            Ok(Request::Hello { protocol, .. }) => {
                let msg = format!("protocol {protocol} is not supported; this daemon speaks {PROTOCOL_VERSION}");
                let _ = framed.send(refuse(ErrorCode::ProtocolVersion, msg)).await;
                return;
            }
            Ok(_) => {
                let _ = framed.send(refuse(ErrorCode::HandshakeRequired, "the first frame must be hello".into())).await;
                return;
            }
            Err(e) => {
                let _ = framed.send(refuse(ErrorCode::BadJson, format!("expected hello: {e}"))).await;
                return;
            }
        },
        Ok(Some(Ok(Frame::Audio(_) | Frame::Invalid(_)))) => {
            let _ = framed.send(refuse(ErrorCode::HandshakeRequired, "the first frame must be hello".into())).await;
            return;
        }
        Ok(Some(Err(e))) => {
            let _ = framed.send(refuse(frame_error_code(&e), e.to_string())).await;
            return;
        }
        Ok(None) | Err(_) => return,
    }

    let (mut sink, mut stream) = framed.split();
    let (tx, mut rx) = mpsc::channel::<Frame>(sup.config.daemon.connection_buffer);
    let out = Outbox { tx, overflow: CancellationToken::new(), conn };
    let writer = tokio::spawn(async move {
        while let Some(f) = rx.recv().await {
            if sink.send(f).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    // Cancels everything this connection started.
    let conn_cancel = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let audio: AudioTurns = Arc::new(Mutex::new(HashMap::new()));

    loop {
        tokio::select! {
            _ = out.overflow.cancelled() => break,
            _ = closing.cancelled() => break,
            frame = stream.next() => match frame {
                None => break,
                Some(Ok(Frame::Json(b))) => on_json(&sup, &out, &conn_cancel, &mut tasks, &audio, conn, uid, &b),
                Some(Ok(Frame::Audio(a))) => on_audio(&out, &audio, a),
                Some(Ok(Frame::Invalid(e))) => out.error(None, ErrorCode::BadFrame, e.to_string()),
                Some(Err(FrameError::Io(_))) => break,
                Some(Err(e)) => {
                    // The stream is out of step (a frame over the limit): say why, then close.
                    out.error(None, frame_error_code(&e), format!("{e}; closing the connection"));
                    break;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    conn_cancel.cancel();
    // Turns stop within one token or prefill chunk; wait for them so their resources are freed.
    while tasks.join_next().await.is_some() {}
    drop(out);
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    tracing::debug!(conn, "connection closed");
}

fn set_send_buffer(stream: &UnixStream, bytes: usize) {
    use std::os::unix::io::AsRawFd;
    let v = bytes as libc::c_int;
    // SAFETY: a valid socket fd and a c_int option value of the right size.
    let r = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&v as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        tracing::warn!("SO_SNDBUF {bytes}: {}", std::io::Error::last_os_error());
    }
}

fn frame_error_code(e: &FrameError) -> ErrorCode {
    match e {
        FrameError::TooLarge { .. } => ErrorCode::FrameTooLarge,
        _ => ErrorCode::BadFrame,
    }
}

/// The connection's running audio turns, by request id.
type AudioTurns = Arc<Mutex<HashMap<String, super::voice::AudioInput>>>;

fn on_audio(out: &Outbox, audio: &AudioTurns, a: kazeia_ipc::AudioFrame) {
    let mut turns = audio.lock().expect("audio turns");
    let Some(input) = turns.get_mut(&a.id) else {
        let msg = format!("audio frame for {:?}, which is not a running audio turn", a.id);
        return out.error(Some(a.id), ErrorCode::NoAudioRequest, msg);
    };
    if !input.matches(&a) {
        return out.error(
            Some(a.id),
            ErrorCode::BadFrame,
            "audio frame with another rate or channel count than the turn's `audio`",
        );
    }
    if !input.push(&a) && !input.overrun {
        input.overrun = true;
        out.error(
            Some(a.id),
            ErrorCode::Busy,
            "audio overrun: the speech thread is more than 20 s behind; samples were dropped",
        );
    }
}

/// Register a speech turn (duplicate ids refused) and accept it: its cancel token and a sender
/// of frames to this connection.
#[allow(clippy::type_complexity)]
fn begin_speech_turn(
    sup: &Arc<Supervisor>,
    out: &Outbox,
    conn_cancel: &CancellationToken,
    conn: u64,
    uid: u32,
    id: &str,
    pipeline: &str,
) -> Option<(CancellationToken, Arc<dyn Fn(Frame) + Send + Sync>)> {
    let cancel = conn_cancel.child_token();
    if !sup.add_turn(conn, id, TurnEntry { conn, uid, cancel: cancel.clone() }) {
        out.error(Some(id.to_string()), ErrorCode::DuplicateId, format!("request {id:?} is already running"));
        return None;
    }
    out.send(&Event::Accepted { id: id.to_string(), pipeline: pipeline.to_string() });
    let sender = out.clone();
    Some((cancel, Arc::new(move |f| sender.send_frame(f))))
}

/// The audio pipelines, served by server/voice.rs rather than by pipeline files.
const AUDIO_PIPELINES: &[&str] = &["transcribe", "voice"];

#[allow(clippy::too_many_arguments)]
fn on_json(
    sup: &Arc<Supervisor>,
    out: &Outbox,
    conn_cancel: &CancellationToken,
    tasks: &mut JoinSet<()>,
    audio: &AudioTurns,
    conn: u64,
    uid: u32,
    b: &[u8],
) {
    let req = match kazeia_ipc::parse_request(b) {
        Ok(r) => r,
        Err(e) => return out.error(e.id, e.code, e.message),
    };
    match req {
        Request::Hello { .. } => out.error(None, ErrorCode::BadRequest, "hello was already said"),
        Request::Status { id } => out.send(&Event::Status { id: Some(id), status: sup.status() }),
        Request::Cancel { id } => {
            if !sup.cancel(conn, uid, &id) {
                out.error(Some(id.clone()), ErrorCode::UnknownRequest, format!("no running request {id:?}"));
            }
        }
        Request::Load { id, role } => {
            let (sup, out) = (sup.clone(), out.clone());
            tasks.spawn(async move {
                match sup.ensure_loaded(&role, progress_sender(&out, &id, &role)).await {
                    Ok(()) => out.send(&Event::Loaded { id: Some(id), role }),
                    Err(e) => out.error(Some(id), e.code, e.message),
                }
            });
        }
        Request::Unload { id, role } => {
            let (sup, out) = (sup.clone(), out.clone());
            tasks.spawn(async move {
                if sup.unload(&role).await {
                    out.send(&Event::Unloaded { id: Some(id), role });
                } else {
                    out.error(Some(id), ErrorCode::NoModel, format!("role {role:?} is not loaded"));
                }
            });
        }
        Request::Subscribe { id } => {
            let (sup, out, stop) = (sup.clone(), out.clone(), conn_cancel.clone());
            tasks.spawn(async move {
                let mut changes = sup.changes.subscribe();
                out.send(&Event::Status { id: Some(id.clone()), status: sup.status() });
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        r = changes.recv() => match r {
                            Ok(()) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                                out.send(&Event::Status { id: Some(id.clone()), status: sup.status() });
                            }
                            Err(_) => break,
                        }
                    }
                }
            });
        }
        Request::Turn { id, pipeline, text, audio: audio_spec, session, options } => {
            if sup.stopping.is_cancelled() {
                return out.error(Some(id), ErrorCode::ShuttingDown, "the daemon is shutting down");
            }
            if sup.pressure() == kazeia_memory_budget::pressure::Level::Critical {
                return out.error(
                    Some(id),
                    ErrorCode::MemoryPressure,
                    "critical memory pressure: new turns are refused until it eases",
                );
            }
            if pipeline == "speak" {
                let Some(text) = text.filter(|t| !t.trim().is_empty()) else {
                    return out.error(Some(id), ErrorCode::BadRequest, "speak takes `text`");
                };
                let Some((cancel, send)) = begin_speech_turn(sup, out, conn_cancel, conn, uid, &id, &pipeline) else {
                    return;
                };
                let done = {
                    let (sup, id) = (sup.clone(), id.clone());
                    Box::new(move || sup.remove_turn(conn, &id))
                };
                return super::voice::speak(sup.clone(), id, text, None, cancel, send, done);
            }
            if AUDIO_PIPELINES.contains(&pipeline.as_str()) {
                let Some(spec) = audio_spec else {
                    return out.error(Some(id), ErrorCode::BadRequest, format!("pipeline {pipeline:?} takes audio: give `audio` {{sample_rate, channels}} and send audio frames"));
                };
                if spec.sample_rate < 8_000 || spec.channels == 0 {
                    return out.error(Some(id), ErrorCode::BadRequest, "audio: sample_rate >= 8000 and channels >= 1");
                }
                let Some((cancel, send)) = begin_speech_turn(sup, out, conn_cancel, conn, uid, &id, &pipeline) else {
                    return;
                };
                let done = {
                    let (sup, audio, id) = (sup.clone(), audio.clone(), id.clone());
                    Box::new(move || {
                        audio.lock().expect("audio turns").remove(&id);
                        sup.remove_turn(conn, &id);
                    })
                };
                let input = super::voice::start(
                    sup.clone(),
                    id.clone(),
                    pipeline == "voice",
                    spec.sample_rate,
                    u16::from(spec.channels),
                    cancel,
                    send,
                    done,
                );
                audio.lock().expect("audio turns").insert(id, input);
                return;
            }
            let pipeline = match sup.registry.get(&pipeline) {
                Ok(p) => p.clone(),
                Err(e) => return out.error(Some(id), ErrorCode::Pipeline, e.to_string()),
            };
            let audio = audio_spec;
            let text = match (text, audio) {
                (Some(t), None) => t,
                (_, Some(_)) => {
                    return out.error(
                        Some(id),
                        ErrorCode::BadRequest,
                        format!("pipeline {:?} does not take audio", pipeline.name),
                    )
                }
                (None, None) => return out.error(Some(id), ErrorCode::BadRequest, "a turn needs text or audio"),
            };
            // Admission: a role already holding its running turn and a full queue answers busy
            // now, without queueing. The lease counts this turn until it ends.
            let lease = match sup.lease(&pipeline.roles()) {
                Ok(l) => l,
                Err(e) => return out.error(Some(id), e.code, e.message),
            };
            let cancel = conn_cancel.child_token();
            if !sup.add_turn(conn, &id, TurnEntry { conn, uid, cancel: cancel.clone() }) {
                return out.error(
                    Some(id.clone()),
                    ErrorCode::DuplicateId,
                    format!("request {id:?} is already running"),
                );
            }
            out.send(&Event::Accepted { id: id.clone(), pipeline: pipeline.name.clone() });
            let (sup, out) = (sup.clone(), out.clone());
            tasks.spawn(async move {
                for role in pipeline.roles() {
                    if let Err(e) = sup.ensure_loaded(&role, progress_sender(&out, &id, &role)).await {
                        out.error(Some(id.clone()), e.code, e.message);
                        sup.remove_turn(conn, &id);
                        return;
                    }
                }
                sup.touch(&pipeline.roles());
                let input = TurnInput {
                    id: Some(id.clone()),
                    text,
                    options: GenerateOptions {
                        temperature: options.temperature,
                        seed: options.seed,
                        max_tokens: options.max_tokens,
                        ignore_eos: false,
                    },
                    session,
                };
                let (tx, mut rx) = mpsc::unbounded_channel();
                let forward = async {
                    let mut last = None;
                    while let Some(ev) = rx.recv().await {
                        out.send(&ev);
                        last = Some(ev);
                    }
                    last
                };
                let engine = sup.engine.clone();
                let engines = Engines { llm: &engine, policy: &sup.config.guard, sessions: Some(&sup.sessions) };
                let (_, last) = tokio::join!(run_turn(&pipeline, input, engines, cancel, tx), forward);
                log_turn_end(conn, &id, last.as_ref());
                sup.remove_turn(conn, &id);
                drop(lease);
            });
        }
    }
}

/// One line per finished text turn: how it stopped and what it generated (the id is the
/// client's string, so it is logged escaped).
fn log_turn_end(conn: u64, id: &str, last: Option<&Event>) {
    match last {
        Some(Event::Done { stop, metrics, .. }) => {
            let stop = format!("{stop:?}").to_lowercase();
            tracing::info!(conn, id = ?id, stop, generated = metrics.generated_tokens, "turn ended");
        }
        Some(Event::Error { code, .. }) => tracing::info!(conn, id = ?id, code = code.as_str(), "turn ended"),
        _ => tracing::info!(conn, id = ?id, "turn ended without a final event"),
    }
}

/// A progress callback that sends `load_progress` events, at most one per percent.
fn progress_sender(out: &Outbox, id: &str, role: &str) -> impl Fn(f32) + Send + 'static {
    let (out, id, role) = (out.clone(), id.to_string(), role.to_string());
    let last = std::sync::atomic::AtomicU32::new(u32::MAX);
    move |p: f32| {
        let pct = (p * 100.0) as u32;
        if last.swap(pct, Ordering::Relaxed) != pct {
            out.send(&Event::LoadProgress { id: Some(id.clone()), role: role.clone(), progress: p });
        }
    }
}
