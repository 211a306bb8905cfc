//! `kazeia ask`: one turn through the daemon, streamed; Ctrl-C cancels it there.

use kazeia_ipc::{ErrorCode, Event, Request};

use super::client::{connect, follow};
use super::{AskArgs, Exit, Printer};

pub async fn ask(args: AskArgs) -> Exit {
    let printer = Printer::new(args.client.json);
    let Some(client) = connect(&args.client, &printer).await else { return Exit::Failed };
    let id = client.new_id();
    let req = Request::Turn {
        id: id.clone(),
        pipeline: args.pipeline.clone(),
        text: Some(args.text.clone()),
        audio: None,
        session: args.session.clone(),
        options: args.sampling.turn_options(),
    };
    let rx = match client.send(req).await {
        Ok(rx) => rx,
        Err(e) => {
            printer.error(ErrorCode::Engine, e.to_string());
            return Exit::Failed;
        }
    };
    // Ctrl-C cancels the turn in the daemon, then we wait for its `done`.
    let client = std::sync::Arc::new(client);
    let (c2, id2) = (client.clone(), id.clone());
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = c2.cancel(&id2).await;
        }
    });
    follow(&printer, rx, |ev| matches!(ev, Event::Done { .. })).await
}
