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
            printer.error(code_of(&e), e.to_string());
            None
        }
    }
}

/// The protocol's code for a client error: a refusal's own (the daemon's, or the client's for
/// what the daemon would refuse), else `engine`.
pub fn code_of(e: &ClientError) -> ErrorCode {
    match e {
        ClientError::Refused { code, .. } => *code,
        _ => ErrorCode::Engine,
    }
}

/// A request the client could not send: its error, and the exit its code calls for (a bad
/// `--session` is a usage error).
pub fn not_sent(printer: &Printer, e: &ClientError) -> Exit {
    let code = code_of(e);
    printer.error(code, e.to_string());
    Exit::for_code(code)
}

/// Print a request's events until its final one. Audio frames go to `audio` (a turn's spoken
/// reply).
pub async fn follow(
    printer: &Printer,
    mut rx: mpsc::UnboundedReceiver<Incoming>,
    is_final: impl Fn(&Event) -> bool,
    mut on_event: impl FnMut(&Event),
    mut audio: impl FnMut(kazeia_ipc::AudioFrame),
) -> Exit {
    while let Some(item) = rx.recv().await {
        match item {
            Incoming::Event(ev) => {
                printer.event(&ev);
                on_event(&ev);
                if let Event::Error { code, is_final: true, .. } = ev {
                    return Exit::for_code(code);
                }
                if is_final(&ev) {
                    return Exit::Ok;
                }
            }
            Incoming::Audio(a) => audio(a),
        }
    }
    printer.error(ErrorCode::Engine, "the daemon closed the connection".into());
    Exit::Failed
}
