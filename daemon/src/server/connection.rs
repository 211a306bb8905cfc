//! One client connection: peer check, handshake, then requests until the client goes away.
//!
//! Outgoing frames pass through a bounded buffer; a client that does not read fast enough to keep
//! it from filling is disconnected (the engine is never made to wait for a socket). When a
//! connection ends for any reason, every turn it started is cancelled.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use kazeia_ipc::{ErrorCode, Event, Frame, FrameCodec, FrameError, Limits, Request, PROTOCOL_VERSION};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

use super::handlers::{self, Conn};
use crate::supervisor::{Supervisor, Who};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The sending half of a connection, shared by its tasks.
#[derive(Clone)]
pub(super) struct Outbox {
    tx: mpsc::Sender<Frame>,
    /// Cancelled when the buffer overflowed: the connection must close.
    overflow: CancellationToken,
    conn: u64,
}

impl Outbox {
    pub(super) fn send(&self, ev: &Event) {
        self.send_frame(Frame::event(ev));
    }

    pub(super) fn send_frame(&self, f: Frame) {
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

    /// This outbox as a turn's output (events and audio frames).
    pub(super) fn output(&self) -> crate::turns::Output {
        let out = self.clone();
        Arc::new(move |f: Frame| out.send_frame(f))
    }

    pub(super) fn error(&self, id: Option<String>, code: ErrorCode, message: impl Into<String>) {
        self.send(&Event::error(id, code, message, true));
    }

    /// An error that does not end the request `id` names (a bad frame of a running audio turn,
    /// a second request under a running id): `final: false`.
    pub(super) fn notice(&self, id: Option<String>, code: ErrorCode, message: impl Into<String>) {
        self.send(&Event::error(id, code, message, false));
    }
}

/// Counts the connection while it lives, in all and for its peer's uid.
struct Counted(Arc<Supervisor>, u32);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::Relaxed);
        let mut per_uid = self.0.per_uid.lock().expect("per-uid connections");
        if let Some(n) = per_uid.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                per_uid.remove(&self.1);
            }
        }
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
    // The refusals before and at the handshake: one error frame without an id, then close.
    let refuse = |code, message: String| Frame::event(&Event::error(None, code, message, true));
    if !allowed {
        tracing::warn!(conn, uid, "refused a peer whose uid is not allowed");
        let _ = framed.send(refuse(ErrorCode::PermissionDenied, format!("uid {uid} may not use this daemon"))).await;
        return;
    }
    // One user cannot take every connection (each holds buffers and a task).
    let over = {
        let mut per_uid = sup.per_uid.lock().expect("per-uid connections");
        let n = per_uid.entry(uid).or_insert(0);
        let over = *n >= sup.config.daemon.max_connections_per_uid;
        if !over {
            *n += 1;
        }
        over
    };
    if over {
        let max = sup.config.daemon.max_connections_per_uid;
        tracing::warn!(conn, uid, max, "refused a connection over the per-uid limit");
        let message = format!("uid {uid} already has {max} connections open (limits.max_connections_per_uid)");
        let _ = framed.send(refuse(ErrorCode::TooManyConnections, message)).await;
        return;
    }
    sup.connections.fetch_add(1, Ordering::Relaxed);
    let _counted = Counted(sup.clone(), uid);

    // Handshake: the first frame must be a hello with our protocol version.
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
                        max_connections_per_uid: sup.config.daemon.max_connections_per_uid,
                        max_turns_per_uid: sup.config.daemon.max_turns_per_uid,
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
            // Not even a request: still "any other first frame" (docs/PROTOCOL.md).
            Err(e) => {
                let message = format!("the first frame must be hello: {e}");
                let _ = framed.send(refuse(ErrorCode::HandshakeRequired, message)).await;
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
    // The writer ends when the client stops taking frames (or a frame cannot be sent): the
    // connection then ends too, its turns cancelled, instead of running on with no one to hear.
    let writer_gone = CancellationToken::new();
    let gone = writer_gone.clone();
    let mut writer = tokio::spawn(async move {
        let _gone = gone.drop_guard();
        while let Some(f) = rx.recv().await {
            match sink.send(f).await {
                Ok(()) => {}
                Err(FrameError::Io(_)) => return,
                // Only a frame over the limit: every error message is cut (`Event::error`), so
                // this is a defect, said once, not a connection left half open in silence.
                Err(e) => {
                    tracing::error!(conn, "an outgoing frame could not be sent ({e}); closing the connection");
                    return;
                }
            }
        }
        let _ = sink.close().await;
    });
    // Everything this connection started lives in its task set and is cancelled with it.
    let mut c = Conn::new(sup.clone(), out.clone(), Who { conn, uid });

    loop {
        tokio::select! {
            _ = out.overflow.cancelled() => break,
            _ = writer_gone.cancelled() => break,
            _ = closing.cancelled() => break,
            frame = stream.next() => match frame {
                None => break,
                Some(Ok(Frame::Json(b))) => handlers::dispatch(&mut c, &b),
                Some(Ok(Frame::Audio(a))) => handlers::audio::frame(&c, a),
                Some(Ok(Frame::Invalid(e))) => out.error(None, ErrorCode::BadFrame, e.to_string()),
                Some(Err(FrameError::Io(_))) => break,
                Some(Err(e)) => {
                    // The stream is out of step (a frame over the limit): say why, then close.
                    out.error(None, frame_error_code(&e), format!("{e}; closing the connection"));
                    break;
                }
            },
            Some(_) = c.tasks.join_next(), if !c.tasks.is_empty() => {}
        }
    }
    // Turns stop within one token or prefill chunk; wait for them so their resources are freed.
    c.close().await;
    // The last senders of the outbox: the writer sends what is queued, then closes.
    drop(c);
    drop(out);
    // The frames left go out unless the client does not read them: a writer blocked on a full
    // socket would hold it open for good (the peer's uid no longer counting it), so it stops.
    if tokio::time::timeout(Duration::from_secs(2), &mut writer).await.is_err() {
        writer.abort();
    }
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
