//! The runner: executes a pipeline's stages for one turn and streams protocol events.

use kazeia_ipc::{ErrorCode, Event};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::definition::{Pipeline, Stage};
use crate::llm::{ChatMessage, GenEvent, GenerateOptions, GenerateRequest, Llm};

/// The input of one turn.
#[derive(Debug, Clone, Default)]
pub struct TurnInput {
    /// Client-chosen request id, echoed in every event.
    pub id: Option<String>,
    pub text: String,
    pub options: GenerateOptions,
}

/// The engines a pipeline may use.
pub struct Engines<'a> {
    pub llm: &'a dyn Llm,
}

/// Run one turn of `pipeline`. Every event goes to `out`; the turn always ends with exactly one
/// `done` or `error` event. A closed `out` (the client went away) cancels the turn.
pub async fn run_turn(
    pipeline: &Pipeline,
    input: TurnInput,
    engines: Engines<'_>,
    cancel: CancellationToken,
    out: mpsc::UnboundedSender<Event>,
) {
    let id = input.id.clone();
    let mut messages = vec![ChatMessage::new("user", input.text.clone())];
    for (i, stage) in pipeline.stages.iter().enumerate() {
        let last = i + 1 == pipeline.stages.len();
        match stage {
            Stage::Think { role } => {
                let req = GenerateRequest { role: role.clone(), messages: messages.clone(), options: input.options.clone() };
                match think(engines.llm, req, &cancel, &out, id.clone(), last).await {
                    Some(reply) => messages.push(ChatMessage::new("assistant", reply)),
                    None => return,
                }
            }
        }
    }
}

/// Run a think stage; stream its tokens. Returns the reply text, or None when the turn ended
/// (error or final `done` already sent).
async fn think(
    llm: &dyn Llm,
    req: GenerateRequest,
    cancel: &CancellationToken,
    out: &mpsc::UnboundedSender<Event>,
    id: Option<String>,
    last: bool,
) -> Option<String> {
    let mut rx = match llm.generate(req, cancel.child_token()) {
        Ok(rx) => rx,
        Err(e) => {
            let _ = out.send(Event::Error { id, code: e.code, message: e.message });
            return None;
        }
    };
    let mut reply = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            GenEvent::Prefill { .. } => {}
            GenEvent::Token { text, .. } => {
                reply.push_str(&text);
                if out.send(Event::Token { id: id.clone(), text }).is_err() {
                    // Nobody listens any more: stop the engine within one token.
                    cancel.cancel();
                }
            }
            GenEvent::Finished(Ok(summary)) => {
                if last {
                    let _ = out.send(Event::Done { id, stop: summary.stop, metrics: summary.metrics });
                    return None;
                }
                return Some(reply);
            }
            GenEvent::Finished(Err(e)) => {
                let _ = out.send(Event::Error { id, code: e.code, message: e.message });
                return None;
            }
        }
    }
    let _ = out.send(Event::Error { id, code: ErrorCode::Engine, message: "engine stopped without finishing the turn".into() });
    None
}
