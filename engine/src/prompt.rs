//! Turning chat messages into the model's prompt text, with the template stored in the file.

use crate::api::ChatMessage;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate};

use crate::error::GenerateError;
use crate::model::SharedModel;

/// The empty think block that Qwen3/Qwen3.5 templates emit for `enable_thinking = false`:
/// the model then answers directly instead of reasoning first.
const NO_THINK: &str = "<think>\n\n</think>\n\n";

pub fn build(model: &SharedModel, messages: &[ChatMessage], thinking: bool) -> Result<String, GenerateError> {
    let Some(template) = &model.template else {
        // A base model (no template in the file): plain text, the last message is the prompt.
        return Ok(messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n"));
    };
    let tmpl = LlamaChatTemplate::new(template).map_err(|e| GenerateError::Prompt(e.to_string()))?;
    let chat = messages
        .iter()
        .map(|m| LlamaChatMessage::new(m.role.clone(), m.content.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| GenerateError::Prompt(format!("message contains a NUL byte: {e}")))?;
    let mut prompt = model
        .model
        .apply_chat_template(&tmpl, &chat, true)
        .map_err(|e| GenerateError::Prompt(format!("chat template of {}: {e}", model.path.display())))?;
    if !thinking && template.contains("<think>") {
        prompt.push_str(NO_THINK);
    }
    Ok(prompt)
}
