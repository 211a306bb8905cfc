//! `kazeia soak`: drive a running daemon with mixed turns, cancels, vanishing clients and
//! reloads, and judge its memory (see `crate::soak`).

use kazeia_ipc::ErrorCode;

use super::{Exit, Printer};

pub async fn soak(args: crate::soak::SoakArgs) -> Exit {
    let printer = Printer::new(args.json);
    let socket = args.socket.clone().unwrap_or_else(crate::server::default_path);
    if let Err(e) = crate::soak::check_outputs(&args) {
        printer.error(ErrorCode::BadRequest, format!("soak: {e:#}"));
        return Exit::Usage;
    }
    // Past the arguments, an error is the run's (no daemon, a daemon gone): as `ask`'s, exit 1.
    match crate::soak::run(args, socket).await {
        Ok(v) if v.passed() => Exit::Ok,
        Ok(_) => Exit::Failed,
        Err(e) => {
            printer.error(ErrorCode::Engine, format!("soak: {e:#}"));
            Exit::Failed
        }
    }
}
