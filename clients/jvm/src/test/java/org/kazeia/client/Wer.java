// Why: speech synthesis is not byte-stable, so speech tests judge a transcript by word error
// rate with a margin, normalised as the daemon's own tests do (daemon/src/speech/wer.rs).
package org.kazeia.client;

import java.util.Arrays;
import java.util.List;
import java.util.Locale;

final class Wer {
    private Wer() {}

    static List<String> words(String s) {
        StringBuilder b = new StringBuilder();
        s.toLowerCase(Locale.ROOT).codePoints().forEach(c ->
                b.appendCodePoint(Character.isLetterOrDigit(c) || c == '\'' || c == '\u2019' ? c : ' '));
        String t = b.toString().replace('\u2019', '\'').trim();
        return t.isEmpty() ? List.of() : Arrays.asList(t.split("\\s+"));
    }

    /** Word-level edit distance over the reference's length. */
    static double wer(String reference, String hyp) {
        List<String> r = words(reference);
        List<String> h = words(hyp);
        int[] d = new int[h.size() + 1];
        for (int j = 0; j <= h.size(); j++) {
            d[j] = j;
        }
        for (int i = 1; i <= r.size(); i++) {
            int prev = d[0];
            d[0] = i;
            for (int j = 1; j <= h.size(); j++) {
                int cur = d[j];
                d[j] = Math.min(Math.min(d[j] + 1, d[j - 1] + 1), prev + (r.get(i - 1).equals(h.get(j - 1)) ? 0 : 1));
                prev = cur;
            }
        }
        return d[h.size()] / (double) Math.max(1, r.size());
    }
}
