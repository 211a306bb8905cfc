//! Work a voice turn can do while the user still speaks: with each partial transcript, the two
//! guard checks' prompts and the Thinker's are prefilled up to the words heard so far, so that at
//! the end of the turn they decode only the rest. Measured on this machine (SmolLM2-135M for both
//! roles, 2 cores), a guard check after its cached instructions decodes the question's ~7-30
//! tokens plus 18 fixed ones at ~3 ms each, and the voice turn waits for all of it; during
//! speech the cores are mostly idle (a partial draft every `partial_every`, 1 s, of speech).
//!
//! Nothing is sampled and nothing is released: these are prefills of the caller's text into the
//! roles' caches (the same ones every turn prefills), and each yields to any request queued
//! behind it (the engine skips it then, or stops it within 32 tokens if it is running). The last word heard is
//! left out (Whisper often changes it, or the punctuation after it, once it hears more); where
//! the final transcript departs from the partial anyway, the common prefix stays and the rest is
//! decoded again, as for any prompt.
//!
//! The transcript of the whole utterance, when it is ready before the end of the turn is decided
//! (Whisper starts `draft_ahead` into the silence, the pause is called later), is prefilled whole
//! instead: the input check's prompt to its last token, the Thinker's to where its generation
//! starts decoding, the output check's up to the reply. If the turn ends there, its requests
//! find their prompts held (the input check decodes 1 token instead of the question's last words
//! and the ~12 of its fixed closing).

use kazeia_engine::api::{LlmError, PrefillRequest, Prefilled, Upto, PREFILL_CUT};
use tokio_util::sync::CancellationToken;

use crate::definition::Pipeline;
use crate::guard::Check;
use crate::runner::{thinker_history, thinker_messages, Engines, TurnInput};

/// The part of a partial transcript worth prefilling: up to the end of its last word but one,
/// or None when that leaves nothing (or the text holds the cut mark).
pub fn settled(text: &str) -> Option<&str> {
    if text.contains(PREFILL_CUT) {
        return None;
    }
    let text = text.trim_end();
    let cut = text.rfind(char::is_whitespace)?;
    let head = text[..cut].trim_end();
    (!head.is_empty()).then_some(head)
}

/// Prefill the roles of `pipeline` that read the user's text (the input guard, the Thinker, the
/// output guard) with `input.text` as heard so far, or with `whole` as the turn's likely
/// transcript. Returns each role's outcome, in that order (a prefill skipped for a request says
/// `busy`; nothing here fails the turn).
pub async fn warm(
    pipeline: &Pipeline,
    input: &TurnInput,
    whole: bool,
    engines: Engines<'_>,
    cancel: CancellationToken,
) -> Vec<(String, Result<Prefilled, LlmError>)> {
    let Ok(plan) = pipeline.plan() else { return Vec::new() };
    if input.text.contains(PREFILL_CUT) {
        return Vec::new();
    }
    let heard = match whole {
        true if !input.text.trim().is_empty() => input.text.clone(),
        true => return Vec::new(),
        false => match settled(&input.text) {
            Some(head) => format!("{head}{PREFILL_CUT}"),
            None => return Vec::new(),
        },
    };
    // A pipeline without the prefix cache starts each check from an empty slot: a guard's
    // prefill would be thrown away.
    let guards = pipeline.prefix_cache;
    let guard_prefill = |role: &String, check: Check| {
        // A whole transcript's output check: the reply is not written yet, up to where it goes.
        let reply = if whole && check == Check::Output { PREFILL_CUT.to_string() } else { String::new() };
        let p = engines.policy.format.prompt(check, &heard, &reply);
        let mut r = PrefillRequest::new(role.clone(), p.messages, check.slot());
        r.fixed = Some(p.fixed);
        if whole && check == Check::Input {
            r.upto = Upto::Check { answer_prefix: p.answer_prefix };
        }
        (role.clone(), engines.llm.prefill(r, cancel.clone()))
    };
    // The input check first (the turn needs it first), with the Thinker beside it: the roles
    // decode one at a time anyway.
    let input_check = plan.input_guard.as_ref().filter(|_| guards).map(|role| guard_prefill(role, Check::Input));
    let thinker = plan.think.as_ref().map(|role| {
        let mut r = PrefillRequest::new(role.clone(), thinker_messages(&plan, input, &engines, &heard), 0);
        // The turn's generation leaves out the oldest history when it does not fit: so does this.
        r.history = thinker_history(&plan, &r.messages);
        r.options = input.options.clone();
        r.options.thinking_budget = r.options.thinking_budget.or(plan.think_budget);
        if whole {
            r.upto = Upto::Generation;
        }
        (role.clone(), engines.llm.prefill(r, cancel.clone()))
    });
    let mut outcomes = Vec::new();
    if let Some((role, rx)) = input_check {
        outcomes.push((role, outcome(rx).await));
    }
    // The output check's prompt holds the question too, before the reply. It is submitted once
    // the input check's prefill has ended: both checks are usually one role, where a prefill
    // with another queued behind it yields (the input check's would never run).
    let output_check = plan.output_guard.as_ref().filter(|_| guards).map(|role| guard_prefill(role, Check::Output));
    for (role, rx) in thinker.into_iter().chain(output_check) {
        outcomes.push((role, outcome(rx).await));
    }
    outcomes
}

async fn outcome(
    submitted: Result<tokio::sync::oneshot::Receiver<Result<Prefilled, LlmError>>, LlmError>,
) -> Result<Prefilled, LlmError> {
    match submitted {
        Ok(rx) => rx.await.unwrap_or_else(|_| Err(LlmError::new(kazeia_ipc::ErrorCode::Engine, "engine stopped"))),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::settled;

    #[test]
    fn the_last_word_heard_is_left_out() {
        assert_eq!(settled("What is the capital."), Some("What is the"));
        assert_eq!(settled("Quelle est la capitale  "), Some("Quelle est la"));
        assert_eq!(settled("Hello"), None);
        assert_eq!(settled(""), None);
        assert_eq!(settled(" - two"), Some(" -"));
        assert_eq!(settled("a\u{E000} b c"), None);
    }
}
