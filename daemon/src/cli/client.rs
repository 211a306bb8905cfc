//! Talking to the daemon: connect (a clear error when none runs) and follow a request's events
//! to its final one.

use kazeia_ipc::{Client, ClientError, ErrorCode, Event, Incoming, Request};
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
/// reply). An error that was not final (audio dropped, a frame refused) makes the exit code
/// its own even when the request then ends well: `ask --audio` whose audio the daemon dropped
/// exited 0 with the transcript of what was left.
pub async fn follow(
    printer: &Printer,
    mut rx: mpsc::UnboundedReceiver<Incoming>,
    is_final: impl Fn(&Event) -> bool,
    mut on_event: impl FnMut(&Event),
    mut audio: impl FnMut(kazeia_ipc::AudioFrame),
) -> Exit {
    let mut failed: Option<ErrorCode> = None;
    while let Some(item) = rx.recv().await {
        match item {
            Incoming::Event(ev) => {
                printer.event(&ev);
                on_event(&ev);
                match ev {
                    Event::Error { code, is_final: true, .. } => return Exit::for_code(code),
                    Event::Error { code, .. } => failed = failed.or(Some(code)),
                    _ => {}
                }
                if is_final(&ev) {
                    return failed.map_or(Exit::Ok, Exit::for_code);
                }
            }
            Incoming::Audio(a) => audio(a),
        }
    }
    printer.error(ErrorCode::Engine, "the daemon closed the connection".into());
    Exit::Failed
}

/// A request with one answer (`status`, `load`, `unload`): sent, then its events printed to
/// that answer.
pub async fn one_answer(args: ClientArgs, make: impl FnOnce(String) -> Request) -> Exit {
    let printer = Printer::new(args.json);
    let Some(client) = connect(&args, &printer).await else { return Exit::Failed };
    let rx = match client.send(make(client.new_id())).await {
        Ok(rx) => rx,
        Err(e) => return not_sent(&printer, &e),
    };
    let last = |ev: &Event| matches!(ev, Event::Status { .. } | Event::Loaded { .. } | Event::Unloaded { .. });
    follow(&printer, rx, last, |_| {}, |_| {}).await
}
