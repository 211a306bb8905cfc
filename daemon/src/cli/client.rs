//! Talking to the daemon: connect (a clear error when none runs) and follow a request's events
//! to its final one.

use kazeia_ipc::{Client, ClientError, ErrorCode, Event, Incoming};
use tokio::sync::mpsc;

use super::{ClientArgs, Exit, Printer};

pub async fn connect(args: &ClientArgs, printer: &Printer) -> Option<Client> {
    let path = args.socket.clone().unwrap_or_else(crate::server::default_path);
    match Client::connect(&path, "cli").await {
        Ok(c) => Some(c),
        Err(e) => {
            let code = match &e {
                ClientError::Refused { code, .. } => *code,
                _ => ErrorCode::Engine,
            };
            printer.error(code, e.to_string());
            None
        }
    }
}

/// Print a request's events until its final one.
pub async fn follow(
    printer: &Printer,
    mut rx: mpsc::UnboundedReceiver<Incoming>,
    is_final: impl Fn(&Event) -> bool,
) -> Exit {
    while let Some(item) = rx.recv().await {
        if let Incoming::Event(ev) = item {
            printer.event(&ev);
            if let Event::Error { .. } = ev {
                return Exit::Failed;
            }
            if is_final(&ev) {
                return Exit::Ok;
            }
        }
    }
    printer.error(ErrorCode::Engine, "the daemon closed the connection".into());
    Exit::Failed
}
