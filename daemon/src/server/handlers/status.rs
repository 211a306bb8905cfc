//! `status`: the supervisor's report, at once (never waits on a load or a transcription).

use kazeia_ipc::Event;

use super::Conn;

pub fn status(c: &Conn, id: String) {
    c.out.send(&Event::Status { id: Some(id), status: c.sup.status() });
}
