//! An async client: connects, says hello, and routes incoming events to the request that asked.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio_util::codec::Framed;

use crate::frame::{AudioFrame, Frame, FrameCodec, FrameError, MAX_FRAME};
use crate::request::{bad_name, Request, TurnOptions, PROTOCOL_VERSION};
use crate::{ErrorCode, Event, Limits, StatusReport};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {path}: {source} (is `kazeia serve` running?)")]
    Connect { path: String, source: std::io::Error },
    #[error("connection closed by the daemon")]
    Closed,
    #[error("the daemon refused: [{code}] {message}")]
    Refused { code: ErrorCode, message: String },
    #[error("unexpected answer: {0}")]
    Unexpected(String),
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// Something the daemon sent for a request.
#[derive(Debug, Clone)]
pub enum Incoming {
    Event(Event),
    Audio(AudioFrame),
}

/// Where each request's events go, and whether the connection is gone: set by the reader when
/// it ends (and by the writer when a write fails), under the same lock a request's route is
/// added under. A request sent after the daemon had gone found the writer still waiting for
/// frames, queued its frame, added its route, and waited for good.
#[derive(Default)]
struct Table {
    map: HashMap<String, mpsc::UnboundedSender<Incoming>>,
    closed: bool,
}

type Routes = Arc<Mutex<Table>>;

/// How long the daemon has to answer `hello` (its own handshake timeout is 10 s): a socket that
/// accepts and never answers (a stopped daemon, another program on the path) blocked `connect`
/// for good.
const WELCOME_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A connection to the daemon. Cheap to share by reference; requests may run concurrently.
pub struct Client {
    out: mpsc::Sender<Frame>,
    routes: Routes,
    next: AtomicU64,
    prefix: String,
    pub welcome: Event,
    /// The reader and writer tasks: both own half of the socket.
    tasks: [tokio::task::AbortHandle; 2],
}

impl Drop for Client {
    /// Dropping the client closes the connection (the daemon then cancels its turns).
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Client {
    /// Connect and perform the handshake.
    pub async fn connect(path: &Path, client_name: &str) -> Result<Client, ClientError> {
        // Request ids are made from the name: one the daemon refuses made every request wait
        // for an answer that names no request (see [`check`]).
        let longest = format!("{client_name}-{}-{}", std::process::id(), u64::MAX);
        if let Some(why) = bad_name(&longest) {
            return Err(refused(
                ErrorCode::BadRequest,
                format!("the client name {client_name:?}: its request ids {why}"),
            ));
        }
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| ClientError::Connect { path: path.display().to_string(), source })?;
        let mut framed = Framed::new(stream, FrameCodec::new(MAX_FRAME));
        // A refused peer may find the connection closed before its hello is written: read the
        // daemon's answer (the refusal) before reporting the write error.
        let sent = framed
            .send(Frame::request(&Request::Hello { protocol: PROTOCOL_VERSION, client: client_name.into() }))
            .await;
        let answer = tokio::time::timeout(WELCOME_TIMEOUT, framed.next())
            .await
            .map_err(|_| ClientError::Unexpected(format!("no welcome within {} s", WELCOME_TIMEOUT.as_secs())))?;
        let welcome = match answer {
            Some(Ok(Frame::Json(b))) => {
                serde_json::from_slice::<Event>(&b).map_err(|e| ClientError::Unexpected(e.to_string()))?
            }
            Some(Ok(other)) => return Err(ClientError::Unexpected(format!("{other:?}"))),
            Some(Err(e)) => return Err(sent.err().unwrap_or(e).into()),
            None => return Err(sent.err().map_or(ClientError::Closed, ClientError::from)),
        };
        match &welcome {
            Event::Welcome { .. } => {}
            Event::Error { code, message, .. } => {
                return Err(ClientError::Refused { code: *code, message: message.clone() })
            }
            other => return Err(ClientError::Unexpected(format!("{other:?}"))),
        }
        let (sink, mut stream) = framed.split();
        let (out, mut out_rx) = mpsc::channel::<Frame>(64);
        let routes: Routes = Arc::default();
        let writer_routes = routes.clone();
        let writer = tokio::spawn(async move {
            let mut sink = sink;
            while let Some(f) = out_rx.recv().await {
                if sink.send(f).await.is_err() {
                    // No request sent from now on can be written. Those waiting keep their
                    // routes for a while: what the daemon sent before it went is still to be
                    // read. Then they end: a socket still open (a write that failed for another
                    // reason) would keep them waiting for answers to frames never sent.
                    writer_routes.lock().expect("routes lock").closed = true;
                    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                    writer_routes.lock().expect("routes lock").map.clear();
                    break;
                }
            }
        });
        let reader_routes = routes.clone();
        let reader = tokio::spawn(async move {
            while let Some(Ok(frame)) = stream.next().await {
                let (id, item) = match frame {
                    Frame::Json(b) => match serde_json::from_slice::<Event>(&b) {
                        Ok(ev) => (ev.id().map(str::to_string), Incoming::Event(ev)),
                        // An event this client cannot read (a newer daemon's) that ends its
                        // request still ends it: dropped, its request waited for good.
                        Err(e) => match unreadable_end(&b, &e) {
                            Some((id, ev)) => (Some(id), Incoming::Event(ev)),
                            None => continue,
                        },
                    },
                    Frame::Audio(a) => (Some(a.id.clone()), Incoming::Audio(a)),
                    Frame::Invalid(_) => continue,
                };
                // A request's last event: its route goes with it.
                let last = matches!(
                    &item,
                    Incoming::Event(
                        Event::Done { .. }
                            | Event::Loaded { .. }
                            | Event::Unloaded { .. }
                            | Event::Error { is_final: true, .. }
                    )
                );
                // What names no request of ours (its receiver dropped, its last event read) is
                // dropped: kept for a reader nobody was, it grew for as long as the client lived.
                let mut routes = reader_routes.lock().expect("routes lock");
                if let Some(tx) = id.as_ref().and_then(|id| routes.map.get(id)) {
                    if tx.send(item).is_err() || last {
                        routes.map.remove(id.as_ref().expect("id"));
                    }
                }
            }
            // The daemon went away: every waiting request sees its channel close, and a request
            // sent from now on fails at once.
            let mut routes = reader_routes.lock().expect("routes lock");
            routes.closed = true;
            routes.map.clear();
        });
        Ok(Client {
            out,
            routes,
            next: AtomicU64::new(1),
            prefix: format!("{}-{}", client_name, std::process::id()),
            welcome,
            tasks: [reader.abort_handle(), writer.abort_handle()],
        })
    }

    /// Requests the client keeps a route for (their last event has not come, or their receiver
    /// was dropped since the last request).
    pub fn pending(&self) -> usize {
        self.routes.lock().expect("routes lock").map.len()
    }

    /// Whether the connection is gone (the daemon closed it, or a write failed).
    pub fn is_closed(&self) -> bool {
        self.routes.lock().expect("routes lock").closed
    }

    /// A fresh request id, unique to this process.
    pub fn new_id(&self) -> String {
        format!("{}-{}", self.prefix, self.next.fetch_add(1, Ordering::Relaxed))
    }

    pub fn limits(&self) -> Option<&Limits> {
        match &self.welcome {
            Event::Welcome { limits, .. } => Some(limits),
            _ => None,
        }
    }

    /// A frame over the daemon's limit (its welcome's `max_frame`) is refused here: the writer
    /// would refuse to encode it, and its request would wait for an answer that never comes.
    fn fits(&self, frame: &Frame) -> Result<(), ClientError> {
        let max = self.limits().map_or(MAX_FRAME, |l| l.max_frame.min(MAX_FRAME));
        // What the decoder makes of bytes it cannot read; never sent.
        if let Frame::Invalid(_) = frame {
            return Err(ClientError::Unexpected("an invalid frame cannot be sent".into()));
        }
        match frame.size() {
            len if len > max => Err(FrameError::TooLarge { len, max }.into()),
            _ => Ok(()),
        }
    }

    /// Send a request and receive everything that names its id, until the receiver is dropped.
    /// Refused here, as the daemon would refuse it: a bad `id` or `session` (see [`check`]), and
    /// the id of a request of this client still running (the daemon answers `duplicate_id` and
    /// the running one goes on: its route was replaced, its receiver closed).
    pub async fn send(&self, req: Request) -> Result<mpsc::UnboundedReceiver<Incoming>, ClientError> {
        check(&req)?;
        let frame = Frame::request(&req);
        self.fits(&frame)?;
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut routes = self.routes.lock().expect("routes lock");
            if routes.closed {
                return Err(ClientError::Closed);
            }
            if let Some(id) = req.id() {
                // Routes whose receiver is gone (a `status` read once, a subscription dropped):
                // each call left one behind, for as long as the client lived.
                routes.map.retain(|_, tx| !tx.is_closed());
                match (routes.map.contains_key(id), &req) {
                    // A cancel names a running request by design: an error for it goes to that
                    // request's route (this receiver closes at once).
                    (true, Request::Cancel { .. }) => {}
                    (true, _) => {
                        return Err(refused(ErrorCode::DuplicateId, format!("request {id:?} is already running")))
                    }
                    (false, _) => drop(routes.map.insert(id.to_string(), tx)),
                }
            }
        }
        self.out.send(frame).await.map_err(|_| ClientError::Closed)?;
        Ok(rx)
    }

    /// Send a frame that expects no answer of its own (cancel, audio).
    pub async fn send_frame(&self, frame: Frame) -> Result<(), ClientError> {
        self.fits(&frame)?;
        if self.is_closed() {
            return Err(ClientError::Closed);
        }
        self.out.send(frame).await.map_err(|_| ClientError::Closed)
    }

    /// Start a text turn; events arrive on the returned channel until `done` or `error`.
    pub async fn turn(
        &self,
        id: &str,
        pipeline: &str,
        text: &str,
        options: TurnOptions,
    ) -> Result<mpsc::UnboundedReceiver<Incoming>, ClientError> {
        self.send(Request::Turn {
            id: id.into(),
            pipeline: pipeline.into(),
            text: Some(text.into()),
            audio: None,
            session: None,
            options,
        })
        .await
    }

    pub async fn cancel(&self, id: &str) -> Result<(), ClientError> {
        let req = Request::Cancel { id: id.into() };
        check(&req)?;
        self.send_frame(Frame::request(&req)).await
    }

    pub async fn status(&self) -> Result<StatusReport, ClientError> {
        let id = self.new_id();
        let mut rx = self.send(Request::Status { id: id.clone() }).await?;
        let answer = rx.recv().await;
        // One answer: nothing more is routed to it.
        self.routes.lock().expect("routes lock").map.remove(&id);
        match answer {
            Some(Incoming::Event(Event::Status { status, .. })) => Ok(status),
            Some(Incoming::Event(Event::Error { code, message, .. })) => Err(ClientError::Refused { code, message }),
            Some(other) => Err(ClientError::Unexpected(format!("{other:?}"))),
            None => Err(ClientError::Closed),
        }
    }
}

/// An event with an id that this client cannot read (a newer daemon's error code, stop reason
/// or model state) and that would end its request (a final `error`, `done`, `status`,
/// `loaded`, `unloaded`), as the request's final error. PROTOCOL §6: a client treats an unknown
/// code as an error. (A subscription that gets a `status` it cannot read ends with it: it
/// could read none of the pushes that follow.)
fn unreadable_end(frame: &[u8], why: &serde_json::Error) -> Option<(String, Event)> {
    let v: serde_json::Value = serde_json::from_slice(frame).ok()?;
    let id = v.get("id")?.as_str()?.to_string();
    let message = match v.get("type")?.as_str()? {
        "error" if v.get("final").and_then(|f| f.as_bool()) != Some(false) => format!(
            "[{}] {}",
            v.get("code").and_then(|c| c.as_str()).unwrap_or("?"),
            v.get("message").and_then(|m| m.as_str()).unwrap_or_default()
        ),
        t @ ("done" | "status" | "loaded" | "unloaded") => format!("a `{t}` this client cannot read: {why}"),
        _ => return None,
    };
    let code = v.get("code").and_then(|c| serde_json::from_value(c.clone()).ok()).unwrap_or(ErrorCode::Engine);
    Some((id.clone(), Event::Error { id: Some(id), code, message, is_final: true }))
}

fn refused(code: ErrorCode, message: String) -> ClientError {
    ClientError::Refused { code, message }
}

/// What the daemon refuses without echoing the id (a bad `id`, or a turn's bad `session`:
/// PROTOCOL §5): its error names no request, so it never reached the request's receiver, which
/// waited for good (`kazeia ask --session ''`; `kazeia cancel ''` said it had cancelled).
fn check(req: &Request) -> Result<(), ClientError> {
    let bad = |field: &str, why: &str| Err(refused(ErrorCode::BadRequest, format!("`{field}` {why}")));
    if let Some(why) = req.id().and_then(bad_name) {
        return bad("id", why);
    }
    if let Request::Turn { session: Some(s), .. } = req {
        if let Some(why) = bad_name(s) {
            return bad("session", why);
        }
    }
    Ok(())
}
