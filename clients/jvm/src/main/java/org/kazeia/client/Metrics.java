// Why: the measurements carried by `done` (PROTOCOL.md §5, its metrics paragraph), typed. The
// fields only some turns have are null when the turn has none (guard ones without a guard,
// reasoning ones when the Thinker did not reason, speech ones on text turns), and the raw
// object keeps fields added later.
package org.kazeia.client;

import java.util.Map;

/**
 * Every turn: {@code promptTokens}, {@code generatedTokens} (reasoning included),
 * {@code ttftMs} (from the start of the cascade, once its models are loaded, to the first token
 * released), {@code prefillTokS}, {@code decodeTokS}, {@code cachedTokens} (prompt tokens reused
 * from the context).
 *
 * <p>Guarded pipelines: {@code guardInMs}, {@code ttfsMs} (first released sentence),
 * {@code guardOutMs} (sum of the output checks), {@code tokensHeld} (Thinker tokens produced
 * before the input verdict).
 *
 * <p>Turns that reasoned: {@code thinkingTokens} (part of generatedTokens), {@code thinkingMs}
 * (first reasoning token to the answer's first token), {@code ttfaMs} (the Thinker's time to
 * its first answer token, from when the engine took the request).
 *
 * <p>Audio turns: {@code endOfTurnMs} (end of the user's speech to the end of their turn),
 * {@code turnChecks} (end-of-turn verdicts asked), {@code turnCheckMs} (the verdict that ended
 * the turn, part of endOfTurnMs; 0 when the silence or the last frame ended it), {@code sttMs}
 * (end of the turn to its transcript).
 *
 * <p>Spoken replies: {@code ttsFirstMs} (the first sentence's synthesis, to its first audio
 * frame); {@code voice}: {@code speechEndToAudioMs} (end of the user's speech to the reply's
 * first audio frame: what the user waits) and {@code earlyStartMs} (the reply started that long
 * before the end of the turn; then ttft, ttfs and ttfa count from the end of the turn).
 */
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
        Long thinkingTokens,
        Double thinkingMs,
        Double ttfaMs,
        Double endOfTurnMs,
        Long turnChecks,
        Double turnCheckMs,
        Double sttMs,
        Double ttsFirstMs,
        Double speechEndToAudioMs,
        Double earlyStartMs,
        Map<String, Object> raw) {

    static Metrics from(Map<String, Object> m) {
        Fields f = new Fields(m);
        return new Metrics(f.num("prompt_tokens"), f.num("generated_tokens"), f.dbl("ttft_ms"), f.dbl("prefill_tok_s"),
                f.dbl("decode_tok_s"), f.num("cached_tokens"), f.optDbl("guard_in_ms"), f.optDbl("ttfs_ms"),
                f.optDbl("guard_out_ms"), f.optNum("tokens_held"), f.optNum("thinking_tokens"), f.optDbl("thinking_ms"),
                f.optDbl("ttfa_ms"), f.optDbl("end_of_turn_ms"), f.optNum("turn_checks"), f.optDbl("turn_check_ms"),
                f.optDbl("stt_ms"), f.optDbl("tts_first_ms"), f.optDbl("speech_end_to_audio_ms"), f.optDbl("early_start_ms"), m);
    }
}
