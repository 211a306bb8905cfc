//! `kazeia unload`: unload a role's model, refused while a turn uses it; one answer.

use super::client::one_answer;
use super::{ClientArgs, Exit};

pub async fn unload(args: ClientArgs, role: String) -> Exit {
    one_answer(args, |id| kazeia_ipc::Request::Unload { id, role }).await
}
