//! `kazeia load`: load a role's model (or the speech models) now; one answer.

use super::client::one_answer;
use super::{ClientArgs, Exit};

pub async fn load(args: ClientArgs, role: String) -> Exit {
    one_answer(args, |id| kazeia_ipc::Request::Load { id, role }).await
}
