// Why: TurnRequest's own checks (no daemon): what PROTOCOL.md §4 refuses is refused when the
// request is built. An id or session the daemon refuses gets an error without id, which no turn
// hears of: caught late, the turn would only end at its event timeout.
package org.kazeia.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;

import org.junit.jupiter.api.Test;

class TurnRequestTest {
    private static TurnRequest chat() {
        return TurnRequest.text("chat", "hi");
    }

    @Test
    void idsAndSessionsFollowTheProtocolsRule() {
        // At the bounds: 1 byte, and 128 bytes of UTF-8 whatever the characters' widths.
        List<String> good = List.of("a", "x".repeat(128), "é".repeat(64), "€".repeat(42) + "xx", "😀".repeat(32),
                "jvm-0a1b2c3d-7", "with space", "tab-free\u00a0nbsp");
        for (String s : good) {
            assertEquals(s, chat().id(s).id(), s);
            assertEquals(s, chat().session(s).session(), s);
        }
        assertNull(chat().session("s").session(null).session(), "null: no session");

        for (String s : List.of("", "x".repeat(129), "é".repeat(65), "😀".repeat(32) + "x")) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> chat().id(s));
            assertTrue(e.getMessage().contains("1 to 128 bytes of UTF-8"), e.getMessage());
            e = assertThrows(IllegalArgumentException.class, () -> chat().session(s));
            assertTrue(e.getMessage().startsWith("session must be 1 to 128 bytes"), e.getMessage());
        }
        // Control characters: C0, DEL and C1 (Rust's char::is_control, which the daemon uses).
        for (String s : List.of("a\nb", "\u0000", "t\t", "\u001f", "\u007f", "x\u0085", "\u009f")) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> chat().id(s));
            assertTrue(e.getMessage().contains("must not contain control characters"), e.getMessage());
            assertThrows(IllegalArgumentException.class, () -> chat().session(s));
        }
        // A lone surrogate has no UTF-8 form.
        for (String s : List.of("\ud800", "a\udc00", "\ud83d")) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> chat().id(s));
            assertTrue(e.getMessage().contains("lone surrogate"), e.getMessage());
        }
        assertThrows(NullPointerException.class, () -> chat().id(null));
        // Generated ids follow the rule too.
        assertEquals("jvm-00000000-1", TurnRequest.checkName("id", "jvm-00000000-1"));
    }

    @Test
    void numbersOutOfTheProtocolsRangesAreRefusedEarly() {
        assertEquals(ErrorCode.BAD_REQUEST, assertThrows(KazeiaException.class, () -> chat().maxTokens(0)).code(),
                "max_tokens >= 1");
        assertThrows(KazeiaException.class, () -> chat().maxTokens(-1));
        assertThrows(KazeiaException.class, () -> chat().maxTokens(1L << 32));
        chat().maxTokens(1).maxTokens(0xffffffffL);

        KazeiaException rate = assertThrows(KazeiaException.class, () -> TurnRequest.audio("transcribe", 7999, 1));
        assertEquals(ErrorCode.BAD_REQUEST, rate.code());
        assertTrue(rate.getMessage().contains("from 8000 to 384000"), rate.getMessage());
        assertThrows(KazeiaException.class, () -> TurnRequest.audio("transcribe", 384001, 1));
        assertThrows(KazeiaException.class, () -> TurnRequest.audio("transcribe", Integer.MAX_VALUE, 1));
        assertEquals(384000, TurnRequest.audio("transcribe", 384000, 1).sampleRate());
        assertThrows(KazeiaException.class, () -> TurnRequest.audio("transcribe", 0, 1));
        assertThrows(KazeiaException.class, () -> TurnRequest.audio("transcribe", -16000, 1));
        assertThrows(KazeiaException.class, () -> TurnRequest.audio("transcribe", 16000, 0));
        assertThrows(KazeiaException.class, () -> TurnRequest.audio("transcribe", 16000, 256));
        assertEquals(8000, TurnRequest.audio("transcribe", 8000, 1).sampleRate());
        assertEquals(255, TurnRequest.audio("voice", 48000, 255).channels());

        assertThrows(KazeiaException.class, () -> chat().thinkingBudget(-1));
        assertThrows(KazeiaException.class, () -> chat().thinkingBudget(1L << 32));
        chat().thinkingBudget(0).thinkingBudget(0xffffffffL);
    }

    @Test
    @SuppressWarnings("unchecked")
    void reasoningOptionsAreSentOnlyWhenSet() {
        Map<String, Object> plain = chat().toJson("t");
        assertFalse(plain.containsKey("options"), plain.toString());
        Map<String, Object> m = chat().maxTokens(64).thinkingBudget(0).showThinking(true).session("s").toJson("t");
        assertEquals(Map.of("max_tokens", 64L, "thinking_budget", 0L, "show_thinking", true), m.get("options"));
        assertEquals("s", m.get("session"));
        Map<String, Object> off = (Map<String, Object>) chat().showThinking(false).toJson("t").get("options");
        assertEquals(Map.of("show_thinking", false), off);
        // Through the writer and the reader: the JSON the daemon gets.
        Object back = Json.parse(java.util.Arrays.copyOfRange(Frames.json(m), 5, Frames.json(m).length));
        assertEquals(Map.of("max_tokens", 64L, "thinking_budget", 0L, "show_thinking", true), ((Map<String, Object>) back).get("options"));
    }
}
