//! `cancel`: stop a running request of this connection (a turn or a subscription), or a turn of
//! the same user's other connections (so `kazeia cancel ID` works from another process).
//! Another uid's turns are never touched.

use kazeia_ipc::ErrorCode;

use super::Conn;

pub fn cancel(c: &mut Conn, id: String) {
    // Its task answers `cancelled`; the id stays taken until then.
    if let Some(subscription) = c.subscriptions.get(&id).filter(|s| s.running()) {
        subscription.stop();
        return;
    }
    // `final: false`: the error is about this cancel, not the request under the id. A turn is
    // deregistered just before its final event leaves: a cancel between the two once told the
    // client, with a final error, that the turn had failed, and its `done` came after.
    if !c.sup.cancel(c.who.conn, c.who.uid, &id) {
        let msg = format!("no running request {id:?}");
        c.out.notice(Some(id), ErrorCode::UnknownRequest, msg);
    }
}
