//! Turning chat messages into the model's prompt text, with the template stored in the file
//! (or the role's `chat_template`).
//!
//! Templates with a think block (Qwen3, Qwen3.5) decide whether the model reasons: off appends
//! the empty block (`<think>\n\n</think>\n\n`, as the templates do for `enable_thinking =
//! false`); on opens the block (`<think>\n`), so the engine knows from the first token that
//! what follows is reasoning, and where the prompt ended before it (the state it rewinds to
//! so that the cache holds what the next turn's prompt will: earlier turns are re-rendered
//! without their reasoning).

use crate::api::ChatMessage;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate};

use crate::error::GenerateError;
use crate::model::SharedModel;

/// The empty think block that turns thinking off.
const NO_THINK: &str = "<think>\n\n</think>\n\n";
/// Opens the block: the model reasons from here.
pub const OPEN_THINK: &str = "<think>\n";

/// A prompt: the conversation up to the assistant's turn, then what the engine opens the turn
/// with. The split matters: the next turn's prompt re-renders this answer without the opening
/// (Qwen-style templates drop the think block), so the conversation is the part it shares.
pub struct Prompt {
    pub base: String,
    /// `OPEN_THINK` when the model will reason, the empty block when it must not, else empty.
    pub open: &'static str,
    /// The model reasons: the engine opened the block.
    pub thinks: bool,
}

pub fn build(
    model: &SharedModel,
    override_template: Option<&str>,
    messages: &[ChatMessage],
    thinking: bool,
) -> Result<Prompt, GenerateError> {
    let Some(template) = override_template.or(model.template.as_deref()) else {
        // A base model (no template in the file): plain text, the last message is the prompt.
        let base = messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n");
        return Ok(Prompt { base, open: "", thinks: false });
    };
    let tmpl = LlamaChatTemplate::new(template).map_err(|e| GenerateError::Prompt(e.to_string()))?;
    let chat = messages
        .iter()
        .map(|m| LlamaChatMessage::new(m.role.clone(), m.content.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| GenerateError::Prompt(format!("message contains a NUL byte: {e}")))?;
    let base = model
        .model
        .apply_chat_template(&tmpl, &chat, true)
        .map_err(|e| GenerateError::Prompt(format!("chat template of {}: {e}", model.path.display())))?;
    let has_block = template.contains("<think>");
    let open = match (has_block, thinking) {
        (false, _) => "",
        (true, true) => OPEN_THINK,
        (true, false) => NO_THINK,
    };
    Ok(Prompt { base, open, thinks: has_block && thinking })
}
