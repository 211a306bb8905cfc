//! `cancel`: stop a running request of this connection, or of the same user's other
//! connections (so `kazeia cancel ID` works from another process). Another uid's turns are
//! never touched.

use kazeia_ipc::ErrorCode;

use super::Conn;

pub fn cancel(c: &Conn, id: String) {
    if !c.sup.cancel(c.who.conn, c.who.uid, &id) {
        let msg = format!("no running request {id:?}");
        c.out.error(Some(id), ErrorCode::UnknownRequest, msg);
    }
}
