//! Word error rate: how the speech tests judge a transcript against
//! what was said. Piper samples noise at every rendering, so the same sentence is heard a
//! little differently each time: tests compare by WER with a margin, never by exact text.

/// Word error rate of `hyp` against `reference`: word-level edit distance over the reference's
/// length, after lower-casing and dropping punctuation (apostrophes and accents kept).
pub fn wer(reference: &str, hyp: &str) -> f64 {
    let (e, n) = word_errors(reference, hyp);
    e as f64 / n.max(1) as f64
}

/// (edits, reference words): sum these over clips for a corpus WER.
pub fn word_errors(reference: &str, hyp: &str) -> (usize, usize) {
    let words = |s: &str| -> Vec<String> {
        s.to_lowercase()
            .chars()
            .map(|c| if c.is_alphanumeric() || c == '\'' || c == '’' { c } else { ' ' })
            .collect::<String>()
            .replace('’', "'")
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let (r, h) = (words(reference), words(hyp));
    let mut d: Vec<usize> = (0..=h.len()).collect();
    for i in 1..=r.len() {
        let mut prev = d[0];
        d[0] = i;
        for j in 1..=h.len() {
            let cur = d[j];
            d[j] = (d[j] + 1).min(d[j - 1] + 1).min(prev + usize::from(r[i - 1] != h[j - 1]));
            prev = cur;
        }
    }
    (d[h.len()], r.len())
}

#[cfg(test)]
mod tests {
    #[test]
    fn wer_counts_word_edits() {
        assert_eq!(super::wer("The cat sat.", "the cat sat"), 0.0);
        assert_eq!(super::word_errors("a b c d", "a x c"), (2, 4));
        assert_eq!(super::wer("Il fait très beau", "il fait tres beau"), 0.25);
    }
}
