//! `kazeia status`: the daemon's models, memory and turns; one answer.

use super::client::one_answer;
use super::{ClientArgs, Exit};

pub async fn status(args: ClientArgs) -> Exit {
    one_answer(args, |id| kazeia_ipc::Request::Status { id }).await
}
