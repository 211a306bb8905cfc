//! `subscribe`: a status now, then one after every change, until the connection ends or a
//! `cancel` names it (then `error` `cancelled`, final). Each subscription is a task that builds a
//! status at every change: a connection holds at most [`MAX_SUBSCRIPTIONS`] (a client's
//! "close" that never told the daemon left one more running at each screen it opened). Its id
//! stays taken until its final event has been queued, as a turn's does.

use kazeia_ipc::{ErrorCode, Event};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::Conn;

/// Subscriptions one connection may hold at once.
pub const MAX_SUBSCRIPTIONS: usize = 16;

/// A running subscription: `stop` asks it to end (a `cancel`), `ended` says it has (its final
/// event queued).
pub struct Subscription {
    stop: CancellationToken,
    ended: CancellationToken,
}

impl Subscription {
    pub fn running(&self) -> bool {
        !self.ended.is_cancelled()
    }

    pub fn stop(&self) {
        self.stop.cancel();
    }
}

pub fn subscribe(c: &mut Conn, id: String) {
    c.subscriptions.retain(|_, s| s.running());
    if c.subscriptions.len() >= MAX_SUBSCRIPTIONS {
        let msg = format!("this connection holds {MAX_SUBSCRIPTIONS} subscriptions: cancel one first");
        return c.out.error(Some(id), ErrorCode::BadRequest, msg);
    }
    let (stop, ended) = (CancellationToken::new(), CancellationToken::new());
    c.subscriptions.insert(id.clone(), Subscription { stop: stop.clone(), ended: ended.clone() });
    let (sup, out, closing) = (c.sup.clone(), c.out.clone(), c.cancel.clone());
    c.tasks.spawn(async move {
        let _ended = ended.drop_guard();
        let mut changes = sup.changes.subscribe();
        out.send(&Event::Status { id: Some(id.clone()), status: sup.status() });
        loop {
            tokio::select! {
                biased;
                _ = closing.cancelled() => break,
                _ = stop.cancelled() => {
                    out.send(&Event::error(Some(id), ErrorCode::Cancelled, "subscription cancelled", true));
                    break;
                }
                r = changes.recv() => match r {
                    Ok(()) | Err(RecvError::Lagged(_)) => {
                        out.send(&Event::Status { id: Some(id.clone()), status: sup.status() });
                    }
                    Err(RecvError::Closed) => break,
                }
            }
        }
    });
}
