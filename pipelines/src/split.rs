//! Sentence boundaries in streamed text: a sentence ends at `.`, `!`, `?` or `…` followed by
//! white space, or at a line break. Very short pieces ("1.", "M.") are joined to what follows.
//! A spoken reply's first unit may be a clause (see [`first_clause`]): its audio can start
//! before the whole first sentence is written and checked.

const MIN_CHARS: usize = 12;

/// Byte length of the first complete sentence in `text` (its trailing white space included),
/// or None when no sentence is complete yet.
pub fn first_sentence(text: &str) -> Option<usize> {
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let end = i + c.len_utf8();
        let boundary = match c {
            '\n' => true,
            '.' | '!' | '?' | '…' | '。' => chars.peek().is_some_and(|(_, n)| n.is_whitespace()),
            _ => false,
        };
        if boundary && text[..end].trim().chars().count() >= MIN_CHARS {
            // Include the white space that follows, so the next sentence starts clean.
            let rest = &text[end..];
            let ws = rest.len() - rest.trim_start().len();
            return Some(end + ws);
        }
    }
    None
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
            && text[..end].split_whitespace().count() >= MIN_CLAUSE_WORDS
            && text[..end].trim().chars().count() >= MIN_CHARS
        {
            let rest = &text[end..];
            return Some(end + rest.len() - rest.trim_start().len());
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
        assert_eq!(first_clause("La capitale de la France : Paris"), Some("La capitale de la France : ".len()));
        // No white space after the mark yet: the clause may go on ("3,5").
        assert_eq!(first_clause("It costs about 3,"), None);
    }
}
