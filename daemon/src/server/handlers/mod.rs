//! One handler per request kind (pueue's `message_handler/<request>.rs`): the connection reads a
//! frame, [`dispatch`] parses it and calls the handler, which answers on the connection's
//! outbox and spawns long work (turns, loads, subscriptions) into the connection's task set.

pub mod audio;
mod cancel;
mod load;
mod status;
mod subscribe;
mod turn;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use kazeia_ipc::{ErrorCode, Request};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::connection::Outbox;
use crate::supervisor::{Supervisor, Who};
use crate::turns::AudioInput;

/// The connection's running audio turns, by request id: where their audio frames go.
type AudioTurns = Arc<Mutex<HashMap<String, AudioInput>>>;

/// The ids of this connection's turns: running until their final event is queued (the
/// supervisor forgets a turn just before: its leases go first), then among the latest
/// `ENDED_KEPT` ended. Lock order: a connection's `audio` before its `turn_ids`. What the
/// connection did under an id stays on the connection:
/// - a new turn under an id whose final event has not left is `duplicate_id`: admitted in that
///   gap, its `accepted` came before the old turn's `done`, which the client took for its own;
/// - a `cancel` of a turn of this connection that has ended is ignored: it looked among the
///   user's other connections, and stopped another app's turn of the same id;
/// - audio frames for it are dropped (the microphone streams until the client reads `done`).
#[derive(Default)]
pub struct TurnIds {
    live: HashSet<String>,
    ended: VecDeque<String>,
}

/// Ended turn ids a connection remembers: at most 128 KiB of ids.
const ENDED_KEPT: usize = 1024;

impl TurnIds {
    pub fn is_live(&self, id: &str) -> bool {
        self.live.contains(id)
    }

    /// Whether this connection has had a turn under `id` (running, ending or ended).
    pub fn knows(&self, id: &str) -> bool {
        self.live.contains(id) || self.ended(id)
    }

    /// Whether a turn under `id` has ended here and none runs under it now.
    pub fn ended(&self, id: &str) -> bool {
        !self.live.contains(id) && self.ended.iter().any(|e| e == id)
    }

    fn begin(&mut self, id: &str) {
        self.live.insert(id.to_string());
    }

    /// The turn's final event is queued. A reused id moves to the newest place.
    fn end(&mut self, id: &str) {
        self.live.remove(id);
        self.ended.retain(|e| e != id);
        if self.ended.len() == ENDED_KEPT {
            self.ended.pop_front();
        }
        self.ended.push_back(id.to_string());
    }
}

/// A connection's state, as the handlers see it.
pub struct Conn {
    pub(super) sup: Arc<Supervisor>,
    pub(super) out: Outbox,
    pub(super) who: Who,
    /// Cancels everything this connection started.
    pub(super) cancel: CancellationToken,
    pub(super) tasks: JoinSet<()>,
    pub(super) audio: AudioTurns,
    pub(super) turn_ids: Arc<Mutex<TurnIds>>,
    /// The connection's subscriptions, by id (ended ones are dropped at the next `subscribe`).
    pub(super) subscriptions: HashMap<String, subscribe::Subscription>,
    /// The connection's `load` and `unload` requests, by id: each token is cancelled once the
    /// request's final event is queued (ended ones are dropped at the next of them).
    pub(super) loads: HashMap<String, CancellationToken>,
}

impl Conn {
    pub fn new(sup: Arc<Supervisor>, out: Outbox, who: Who) -> Conn {
        Conn {
            sup,
            out,
            who,
            cancel: CancellationToken::new(),
            tasks: JoinSet::new(),
            audio: AudioTurns::default(),
            turn_ids: Arc::default(),
            subscriptions: HashMap::new(),
            loads: HashMap::new(),
        }
    }

    /// Whether a turn, a subscription, a load or an unload of this connection runs under `id`.
    pub(super) fn running(&self, id: &str) -> bool {
        self.sup.is_running(self.who.conn, id)
            || self.turn_ids.lock().expect("turn ids").is_live(id)
            || self.subscriptions.get(id).is_some_and(|s| s.running())
            || self.loads.get(id).is_some_and(|ended| !ended.is_cancelled())
    }

    /// The client is gone (or the daemon stops): cancel its work and wait for it.
    pub async fn close(&mut self) {
        self.cancel.cancel();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Parse one JSON frame and run its handler.
pub fn dispatch(c: &mut Conn, body: &[u8]) {
    let req = match kazeia_ipc::parse_request(body) {
        // A bad request under the id of a running turn ends only itself.
        Err(e) if e.id.as_deref().is_some_and(|id| c.running(id)) => return c.out.notice(e.id, e.code, e.message),
        Err(e) => return c.out.error(e.id, e.code, e.message),
        Ok(r) => r,
    };
    // Every event of a request carries its id: a request under the id of a running turn or
    // subscription would be mistaken for it. (`cancel`'s id names its target; a turn's is checked
    // again by the supervisor, under the lock that registers it.)
    if let Request::Status { id }
    | Request::Load { id, .. }
    | Request::Unload { id, .. }
    | Request::Subscribe { id }
    | Request::Turn { id, .. } = &req
    {
        if c.running(id) {
            let msg = format!("request {id:?} is already running");
            return c.out.notice(Some(id.clone()), ErrorCode::DuplicateId, msg);
        }
    }
    match req {
        Request::Hello { .. } => c.out.error(None, ErrorCode::BadRequest, "hello was already said"),
        Request::Status { id } => status::status(c, id),
        Request::Cancel { id } => cancel::cancel(c, id),
        Request::Load { id, role } => load::load(c, id, role),
        Request::Unload { id, role } => load::unload(c, id, role),
        Request::Subscribe { id } => subscribe::subscribe(c, id),
        Request::Turn { id, pipeline, text, audio, session, options } => {
            turn::turn(c, crate::supervisor::TurnRequest { id, pipeline, text, audio, session, options })
        }
    }
}
