//! `cancel`: stop a running request of this connection (a turn or a subscription), or a turn of
//! the same user's other connections (so `kazeia cancel ID` works from another process).
//! Another uid's turns are never touched, nor other connections' when this one has had a turn
//! under the id (see `TurnIds`).

use kazeia_ipc::ErrorCode;

use super::Conn;

pub fn cancel(c: &mut Conn, id: String) {
    // Its task answers `cancelled`; the id stays taken until then.
    if let Some(subscription) = c.subscriptions.get(&id).filter(|s| s.running()) {
        subscription.stop();
        return;
    }
    // A turn of this connection, running or ended: this connection's alone. Ended (or ending:
    // its final event on its way), the cancel is too late and ignored; nothing about an id
    // follows its final event (PROTOCOL §7).
    if c.turn_ids.lock().expect("turn ids").knows(&id) {
        c.sup.cancel_own(c.who.conn, &id);
        return;
    }
    // `final: false`: the error is about this cancel, not the request under the id.
    if !c.sup.cancel(c.who.conn, c.who.uid, &id) {
        let msg = format!("no running request {id:?}");
        c.out.notice(Some(id), ErrorCode::UnknownRequest, msg);
    }
}
