//! `kazeia cancel <id>`: stop a running request. A cancel has no answer of its own unless it
//! fails, so a `status` sent behind it on the same connection tells when it was taken.

use std::time::Duration;

use kazeia_ipc::{ErrorCode, Event, Incoming, Request};

use super::client::{connect, not_sent};
use super::{ClientArgs, Exit, Printer};

pub async fn cancel(args: ClientArgs, id: String) -> Exit {
    let printer = Printer::new(args.json);
    let Some(client) = connect(&args, &printer).await else { return Exit::Failed };
    let mut rx = match client.send(Request::Cancel { id: id.clone() }).await {
        Ok(rx) => rx,
        Err(e) => return not_sent(&printer, &e),
    };
    // A cancel has no answer of its own unless it fails: a status request behind it on the same
    // connection is answered after it, so its answer means the cancel was taken.
    let mut st = match client.send(Request::Status { id: client.new_id() }).await {
        Ok(rx) => rx,
        Err(e) => return not_sent(&printer, &e),
    };
    tokio::select! {
        Some(Incoming::Event(ev @ Event::Error { .. })) = rx.recv() => {
            printer.event(&ev);
            Exit::Failed
        }
        answer = st.recv() => {
            // A connection closed before the status came (a daemon stopping or gone) says
            // nothing of the cancel: it printed "cancelled" and exited 0.
            match answer {
                None => {
                    let msg = "the daemon closed the connection before it answered: the cancel may not have been taken";
                    printer.error(ErrorCode::Engine, msg.into());
                    return Exit::Failed;
                }
                Some(Incoming::Event(ev @ Event::Error { .. })) => {
                    printer.event(&ev);
                    return Exit::Failed;
                }
                Some(_) => {}
            }
            // An error for the cancel, if any, was sent before the status: it is here by now.
            if let Ok(Incoming::Event(ev @ Event::Error { .. })) = rx.try_recv() {
                printer.event(&ev);
                return Exit::Failed;
            }
            if !printer.json {
                super::print::noteln!("cancelled {id}");
            }
            Exit::Ok
        }
        _ = tokio::time::sleep(Duration::from_secs(30)) => {
            printer.error(ErrorCode::Engine, "the daemon did not answer".into());
            Exit::Failed
        }
    }
}
