//! `subscribe`: a status now, then one after every change, until the connection ends or a
//! `cancel` names it (then `error` `cancelled`, final). Each subscription is a task that builds a
//! status at every change: a connection holds at most [`MAX_SUBSCRIPTIONS`] (a client's
//! "close" that never told the daemon left one more running at each screen it opened).

use kazeia_ipc::{ErrorCode, Event};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::Conn;

/// Subscriptions one connection may hold at once.
pub const MAX_SUBSCRIPTIONS: usize = 16;

pub fn subscribe(c: &mut Conn, id: String) {
    // One that ended by itself (the daemon stopping) no longer counts.
    c.subscriptions.retain(|_, ended| !ended.is_cancelled());
    if c.subscriptions.len() >= MAX_SUBSCRIPTIONS {
        let msg = format!("this connection holds {MAX_SUBSCRIPTIONS} subscriptions: cancel one first");
        return c.out.error(Some(id), ErrorCode::BadRequest, msg);
    }
    let cancelled = CancellationToken::new();
    c.subscriptions.insert(id.clone(), cancelled.clone());
    let (sup, out, closing) = (c.sup.clone(), c.out.clone(), c.cancel.clone());
    c.tasks.spawn(async move {
        let _ended = cancelled.clone().drop_guard();
        let mut changes = sup.changes.subscribe();
        out.send(&Event::Status { id: Some(id.clone()), status: sup.status() });
        loop {
            tokio::select! {
                _ = closing.cancelled() => break,
                _ = cancelled.cancelled() => {
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
