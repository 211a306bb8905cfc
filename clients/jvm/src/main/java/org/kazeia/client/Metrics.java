// Why: the measurements carried by `done` (PROTOCOL.md §5), typed; optional guard fields are
// null when the pipeline has no guard, and the raw object keeps fields added later.
package org.kazeia.client;

import java.util.Map;

public record Metrics(
        long promptTokens,
        long generatedTokens,
        double ttftMs,
        double prefillTokS,
        double decodeTokS,
        long cachedTokens,
        Double guardInMs,
        Double ttfsMs,
        Double guardOutMs,
        Long tokensHeld,
        Map<String, Object> raw) {

    static Metrics from(Map<String, Object> m) {
        Fields f = new Fields(m);
        return new Metrics(f.num("prompt_tokens"), f.num("generated_tokens"), f.dbl("ttft_ms"), f.dbl("prefill_tok_s"),
                f.dbl("decode_tok_s"), f.num("cached_tokens"), f.optDbl("guard_in_ms"), f.optDbl("ttfs_ms"),
                f.optDbl("guard_out_ms"), f.optNum("tokens_held"), m);
    }
}
