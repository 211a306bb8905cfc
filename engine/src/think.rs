//! Telling the Thinker's reasoning from its answer, as text streams out of the sampler.
//!
//! Qwen-style models reason in `<think>…</think>` before they answer. The reasoning must never
//! reach the answer stream (tokens, sentences, speech, a session's history), and the block must
//! be closed by the engine when the thinking budget runs out (the app once hung on unbounded
//! thinking). Tokens arrive as text pieces that may split a tag anywhere (`</th` + `ink>`), so
//! the filter holds back the longest suffix that could still begin a tag.
//!
//! Pure: the engine feeds it pieces and routes what it returns; `tests` cover every split.

/// Opens a reasoning block.
pub const OPEN: &str = "<think>";
/// Closes it.
pub const CLOSE: &str = "</think>";
/// What the engine appends when the budget runs out: the template's end of thinking, as
/// Qwen3's templates write the empty block (`<think>\n\n</think>\n\n`).
pub const FORCED_CLOSE: &str = "\n</think>\n\n";

/// Where the stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Nothing but whitespace yet: the model may still open a block.
    Start,
    Thinking,
    Answer,
}

/// A classified piece of output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Thinking(String),
    Answer(String),
}

#[derive(Debug)]
pub struct ThinkFilter {
    state: State,
    /// Text not yet classified: a possible tag's beginning, or leading whitespace.
    held: String,
    /// The answer has produced nothing yet: its leading whitespace (after `</think>`) is dropped.
    answer_started: bool,
}

/// The longest suffix of `s` that is a proper prefix of `tag`.
fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

impl ThinkFilter {
    /// `opened`: the prompt itself ends inside an open block (the engine opened it).
    pub fn new(opened: bool) -> ThinkFilter {
        ThinkFilter {
            state: if opened { State::Thinking } else { State::Start },
            held: String::new(),
            answer_started: false,
        }
    }

    /// For a model whose template has no think block (SmolLM2): everything is answer. A reply
    /// that began with `<think>` (asked to, or by chance) vanished as reasoning, and an end of
    /// generation inside it made the engine write a `</think>` the model never knew.
    pub fn answering() -> ThinkFilter {
        ThinkFilter { state: State::Answer, held: String::new(), answer_started: false }
    }

    pub fn state(&self) -> State {
        self.state
    }

    /// Classify `text`, appended to what came before.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.held.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = State::Thinking;
                    } else if OPEN.starts_with(trimmed) {
                        // Whitespace, or the beginning of `<think>`: wait for more.
                        return out;
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking => match self.held.find(CLOSE) {
                    Some(at) => {
                        let thought = self.held[..at].to_string();
                        self.held = self.held[at + CLOSE.len()..].to_string();
                        if !thought.is_empty() {
                            out.push(Piece::Thinking(thought));
                        }
                        self.state = State::Answer;
                    }
                    None => {
                        let keep = partial_suffix(&self.held, CLOSE);
                        let ready = self.held[..self.held.len() - keep].to_string();
                        self.held.drain(..self.held.len() - keep);
                        if !ready.is_empty() {
                            out.push(Piece::Thinking(ready));
                        }
                        return out;
                    }
                },
                State::Answer => {
                    let mut text = std::mem::take(&mut self.held);
                    if !self.answer_started {
                        text = text.trim_start().to_string();
                    }
                    if !text.is_empty() {
                        self.answer_started = true;
                        out.push(Piece::Answer(text));
                    }
                    return out;
                }
            }
        }
    }

    /// The end of the stream: whatever is held goes where the state says (an unfinished tag
    /// inside a thought is part of the thought; leading whitespace alone is nothing).
    pub fn finish(&mut self) -> Vec<Piece> {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Thinking if !held.is_empty() => vec![Piece::Thinking(held)],
            State::Start if !held.trim().is_empty() => vec![Piece::Answer(held.trim_start().to_string())],
            State::Answer if !held.is_empty() => vec![Piece::Answer(held)],
            _ => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_model_without_a_think_block_only_answers() {
        let mut f = ThinkFilter::answering();
        let mut out = f.push("  <think>");
        out.extend(f.push("hi</think> there"));
        let text: String = out
            .iter()
            .map(|p| match p {
                Piece::Answer(t) => t.clone(),
                Piece::Thinking(t) => panic!("reasoning {t:?}"),
            })
            .collect();
        assert_eq!(text, "<think>hi</think> there");
        assert_eq!(f.state(), State::Answer);
    }

    use super::*;
    use proptest::prelude::*;

    /// The whole stream through the filter in the given pieces: (thinking, answer).
    fn run(opened: bool, pieces: &[&str]) -> (String, String) {
        let mut f = ThinkFilter::new(opened);
        let mut out: Vec<Piece> = pieces.iter().flat_map(|p| f.push(p)).collect();
        out.extend(f.finish());
        let mut t = String::new();
        let mut a = String::new();
        for p in out {
            match p {
                Piece::Thinking(s) => t.push_str(&s),
                Piece::Answer(s) => a.push_str(&s),
            }
        }
        (t, a)
    }

    #[test]
    fn thinking_then_answer() {
        let (t, a) = run(false, &["<think>", "\nLet me see.", "</think>", "\n\nParis."]);
        assert_eq!((t.as_str(), a.as_str()), ("\nLet me see.", "Paris."));
    }

    #[test]
    fn no_block_is_all_answer() {
        assert_eq!(run(false, &[" The capital", " is Paris."]), (String::new(), "The capital is Paris.".into()));
        // A tag later in an answer is the answer's text, not a new block.
        assert_eq!(run(false, &["Use <think> tags"]).1, "Use <think> tags");
    }

    #[test]
    fn tags_split_anywhere() {
        let (t, a) = run(false, &["<th", "ink>hm", "m</th", "in", "k>\nok"]);
        assert_eq!((t.as_str(), a.as_str()), ("hmm", "ok"));
    }

    #[test]
    fn opened_by_the_prompt_and_forced_closed() {
        let (t, a) = run(true, &["step one", FORCED_CLOSE, "Answer."]);
        assert_eq!((t.as_str(), a.as_str()), ("step one\n", "Answer."));
    }

    #[test]
    fn an_unclosed_thought_never_becomes_answer() {
        let (t, a) = run(true, &["still thinking </thi"]);
        assert_eq!((t.as_str(), a.as_str()), ("still thinking </thi", ""));
    }

    proptest! {
        /// However the stream is cut into pieces (multi-byte characters included), the
        /// classification is the same as for the whole text at once.
        #[test]
        fn any_split_gives_the_same_result(
            thought in "[a-zé <>/\n]{0,40}",
            answer in "[A-Za-zé <>/.\n]{0,40}",
            cuts in proptest::collection::vec(0usize..120, 0..12),
            opened in any::<bool>(),
        ) {
            let mut thought = thought;
            while thought.contains(CLOSE) {
                thought = thought.replace(CLOSE, "");
            }
            let whole = if opened { format!("{thought}{CLOSE}{answer}") } else { format!("{OPEN}{thought}{CLOSE}{answer}") };
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c % (whole.len() + 1)).filter(|&c| whole.is_char_boundary(c)).collect();
            bounds.sort_unstable();
            bounds.dedup();
            let mut pieces = Vec::new();
            let mut last = 0;
            for b in bounds.into_iter().chain([whole.len()]) {
                pieces.push(&whole[last..b]);
                last = b;
            }
            prop_assert_eq!(run(opened, &pieces), run(opened, &[&whole]));
            let (t, a) = run(opened, &[&whole]);
            prop_assert_eq!(t, thought);
            prop_assert_eq!(a, answer.trim_start().to_string());
        }
    }
}
