//! Sentence boundaries in streamed text: a sentence ends at `.`, `!`, `?` or `…` followed by
//! white space, at a full-width `。` `！` `？` (CJK writes no space after them), or at a line
//! break. Very short pieces ("1.", "M.") are joined to what follows. A unit never grows past
//! [`MAX_BYTES`]: without an end mark it is cut at its last white space before (a reply in
//! Chinese, a long list written without marks or a URL was one unit: held whole until the
//! Thinker stopped, and past the guard's context it failed the turn).
//! A spoken reply's first unit may be a clause (see [`first_clause`]): its audio can start
//! before the whole first sentence is written and checked.

const MIN_CHARS: usize = 12;

/// The longest unit, in UTF-8 bytes: a byte-level BPE vocabulary (SmolLM2's, Qwen's) spends at
/// most one token a byte, so it is at most 500 tokens whatever the script (a Chinese character
/// is 3 bytes and 2-3 tokens in SmolLM2's, which has 80 CJK entries; English text ~4 bytes a
/// token). With the shortened output check's context (`runner::SHORT`) and the guard's
/// instructions it fits the guard's 2048 tokens, here and on the device.
pub const MAX_BYTES: usize = 500;

/// Byte length of the first complete sentence in `text` (its trailing white space included),
/// or None when no sentence is complete yet. Past [`MAX_BYTES`] without an end, the text up to
/// its last white space within them (all of them, to a character's start, when there is none).
pub fn first_sentence(text: &str) -> Option<usize> {
    // White space before the unit goes with it, and counts for nothing (it is trimmed).
    let start = ws_len(text);
    let mut chars = text[start..].char_indices().map(|(i, c)| (start + i, c)).peekable();
    let mut count = 0;
    let mut last_space = None;
    while let Some((i, c)) = chars.next() {
        let end = i + c.len_utf8();
        if end - start > MAX_BYTES {
            return Some(last_space.unwrap_or(i)).filter(|&n| n > start);
        }
        count += 1;
        if c.is_whitespace() && count > MIN_CHARS {
            last_space = Some(end + ws_len(&text[end..]));
        }
        let boundary = match c {
            '\n' | '。' | '！' | '？' => true,
            '.' | '!' | '?' | '…' => chars.peek().is_some_and(|(_, n)| n.is_whitespace()),
            _ => false,
        };
        if boundary && text[..end].trim().chars().count() >= MIN_CHARS {
            // Include the white space that follows, so the next sentence starts clean.
            return Some(end + ws_len(&text[end..]));
        }
    }
    None
}

/// Bytes of white space `text` starts with.
fn ws_len(text: &str) -> usize {
    text.len() - text.trim_start().len()
}

/// Words a first clause needs: "Oui, …" or "Well, …" alone is no unit worth a guard check.
const MIN_CLAUSE_WORDS: usize = 4;

/// Byte length of the first complete clause or sentence in `text` (trailing white space
/// included): a sentence as [`first_sentence`], or a clause ending at `,`, `;` or `:` followed
/// by white space after at least four words, whichever ends first.
pub fn first_clause(text: &str) -> Option<usize> {
    let sentence = first_sentence(text);
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let end = i + c.len_utf8();
        if sentence.is_some_and(|s| end >= s) {
            break;
        }
        let boundary = matches!(c, ',' | ';' | ':') && chars.peek().is_some_and(|(_, n)| n.is_whitespace());
        if boundary
            // (Words: a French spaced ":" or ";" is none.)
            && text[..end].split_whitespace().filter(|w| w.chars().any(char::is_alphanumeric)).count() >= MIN_CLAUSE_WORDS
            && text[..end].trim().chars().count() >= MIN_CHARS
        {
            return Some(end + ws_len(&text[end..]));
        }
    }
    sentence
}

/// The sentences of a complete text (the last one may lack its end mark), trimmed, none empty.
pub fn sentences(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || loop {
        if rest.trim().is_empty() {
            return None;
        }
        let n = first_sentence(rest).unwrap_or(rest.len());
        let s = rest[..n].trim();
        rest = &rest[n..];
        if !s.is_empty() {
            return Some(s);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any text, fed whole: every unit ends on a character boundary, is at most
        /// `MAX_BYTES` bytes trimmed, and together they are the text; a text longer than
        /// `MAX_BYTES` (after its leading white space) always has a first unit.
        #[test]
        fn units_are_bounded_and_cover_the_text(text in "(\\PC|[ \n。.!?,]|[ ]{1,600}){0,400}") {
            let mut rest = text.as_str();
            let mut joined = String::new();
            while let Some(n) = first_sentence(rest) {
                prop_assert!(n > 0 && rest.is_char_boundary(n));
                prop_assert!(rest[..n].trim().len() <= MAX_BYTES, "{:?}", &rest[..n]);
                prop_assert!(!rest[..n].trim().is_empty());
                joined.push_str(&rest[..n]);
                rest = &rest[n..];
            }
            prop_assert!(rest.trim_start().len() <= MAX_BYTES, "{rest:?}");
            joined.push_str(rest);
            prop_assert_eq!(joined, text.clone());
            if let Some(n) = first_clause(&text) {
                prop_assert!(first_sentence(&text).is_some_and(|s| n <= s));
            }
        }
    }

    #[test]
    fn a_unit_without_an_end_is_cut_at_a_space_before_max_bytes() {
        let words = "mot ".repeat(200);
        let n = first_sentence(&words).unwrap();
        assert_eq!(n % 4, 0, "after a space: {n}");
        assert!(n <= MAX_BYTES && n > MAX_BYTES - 4, "{n}");
        assert_eq!(first_sentence(&words[..MAX_BYTES - 1]), None, "shorter: it may still end");
        // No space at all (a URL, a hash): cut at the limit, at a character's start.
        let url = "a".repeat(MAX_BYTES + 1);
        assert_eq!(first_sentence(&url), Some(MAX_BYTES));
        let han = "字".repeat(MAX_BYTES);
        assert_eq!(first_sentence(&han), Some(MAX_BYTES / 3 * 3));
        let blank = " ".repeat(MAX_BYTES * 2);
        assert_eq!(first_sentence(&blank), None, "white space alone is no unit");
        assert_eq!(first_sentence(&format!("{blank}{url}")), Some(blank.len() + MAX_BYTES), "it goes with the next");
    }

    #[test]
    fn full_width_marks_end_a_sentence_without_a_space() {
        let t = "巴黎是法国的首都，也是最大的城市。它有两千多年的历史。";
        let n = first_sentence(t).unwrap();
        assert_eq!(&t[..n], "巴黎是法国的首都，也是最大的城市。");
        assert_eq!(sentences(t).collect::<Vec<_>>(), ["巴黎是法国的首都，也是最大的城市。", "它有两千多年的历史。"]);
    }

    #[test]
    fn sentences_of_a_whole_text() {
        let v: Vec<&str> = sentences("Hello there, friend! How are you today? Fine").collect();
        assert_eq!(v, ["Hello there, friend!", "How are you today?", "Fine"]);
        assert_eq!(sentences("  ").count(), 0);
    }

    #[test]
    fn splits_on_sentence_ends() {
        let t = "The capital of France is Paris. It is big";
        let n = first_sentence(t).unwrap();
        assert_eq!(&t[..n], "The capital of France is Paris. ");
        assert_eq!(first_sentence(&t[n..]), None);
        assert_eq!(first_sentence("Paris."), None, "no white space yet: the sentence may go on");
        assert_eq!(first_sentence("1. First point is long enough. x").map(|n| n > 3), Some(true));
        assert_eq!(
            first_sentence("Oui ! C'est bien Paris, la capitale.\nSuite"),
            Some("Oui ! C'est bien Paris, la capitale.\n".len())
        );
    }

    #[test]
    fn a_first_clause_needs_four_words_and_ends_before_the_sentence() {
        let t = "Well, the capital of France, as you know, is Paris. It is big";
        let n = first_clause(t).unwrap();
        assert_eq!(&t[..n], "Well, the capital of France, ");
        // A sentence that ends before any clause does is the unit.
        assert_eq!(first_clause("The capital is Paris. Yes, it is, truly."), Some("The capital is Paris. ".len()));
        // Too few words before the comma: the sentence.
        assert_eq!(first_clause("Oui, c'est Paris. Et puis"), Some("Oui, c'est Paris. ".len()));
        assert_eq!(first_clause("Bien sûr : la capitale de la France est Paris"), None);
        // French spaces its colon: the mark is no word.
        assert_eq!(first_clause("Oui oui oui : la suite est longue"), None);
        assert_eq!(first_clause("La capitale de la France : Paris"), Some("La capitale de la France : ".len()));
        // No white space after the mark yet: the clause may go on ("3,5").
        assert_eq!(first_clause("It costs about 3,"), None);
    }
}
