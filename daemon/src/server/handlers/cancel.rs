//! `cancel`: stop a running request of this connection (a turn or a subscription), or a turn of
//! the same user's other connections (so `kazeia cancel ID` works from another process).
//! Another uid's turns are never touched.

use kazeia_ipc::ErrorCode;

use super::Conn;

pub fn cancel(c: &mut Conn, id: String) {
    if let Some(subscription) = c.subscriptions.remove(&id) {
        // Its task answers `cancelled` (unless it had ended: then nothing runs under the id).
        if !subscription.is_cancelled() {
            subscription.cancel();
            return;
        }
    }
    if !c.sup.cancel(c.who.conn, c.who.uid, &id) {
        let msg = format!("no running request {id:?}");
        c.out.error(Some(id), ErrorCode::UnknownRequest, msg);
    }
}
