//! `subscribe`: a status now, then one after every change, until the connection ends.

use kazeia_ipc::Event;
use tokio::sync::broadcast::error::RecvError;

use super::Conn;

pub fn subscribe(c: &mut Conn, id: String) {
    let (sup, out, stop) = (c.sup.clone(), c.out.clone(), c.cancel.clone());
    c.tasks.spawn(async move {
        let mut changes = sup.changes.subscribe();
        out.send(&Event::Status { id: Some(id.clone()), status: sup.status() });
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
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
