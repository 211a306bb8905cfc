// Why: the JSON reader/writer is the library's own (no dependency), so it is tested here on
// every escape, number form and, above all, on hostile input, which must be refused cleanly.
package org.kazeia.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTimeoutPreemptively;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.junit.jupiter.api.Test;

class JsonTest {
    private static KazeiaException refused(String text) {
        KazeiaException e = assertThrows(KazeiaException.class, () -> Json.parse(text), text);
        assertEquals(ErrorCode.BAD_JSON, e.code());
        return e;
    }

    private static KazeiaException refusedBytes(byte[] bytes) {
        KazeiaException e = assertThrows(KazeiaException.class, () -> Json.parse(bytes), Arrays.toString(bytes));
        assertEquals(ErrorCode.BAD_JSON, e.code());
        return e;
    }

    @Test
    void parsesEveryKindOfValue() {
        Object v = Json.parse(" {\"a\":[1,-2,3.5,-0.25e2,1E3,true,false,null],\"b\":{},\"c\":[],\"d\":\"x\"}\n");
        Map<?, ?> m = (Map<?, ?>) v;
        assertEquals(List.of("a", "b", "c", "d"), List.copyOf(m.keySet()), "insertion order kept");
        assertEquals(Arrays.asList(1L, -2L, 3.5, -25.0, 1000.0, true, false, null), m.get("a"));
        assertEquals(Map.of(), m.get("b"));
        assertEquals(List.of(), m.get("c"));
        assertEquals("x", m.get("d"));
        assertEquals(0L, Json.parse("-0"));
        assertEquals(Long.MAX_VALUE, Json.parse("9223372036854775807"));
        assertEquals(9223372036854775808.0, Json.parse("9223372036854775808"), "out of long range: a double");
    }

    @Test
    void decodesAllEscapesIncludingSurrogatePairs() {
        assertEquals("\" \\ / \b \f \n \r \t", Json.parse("\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\""));
        assertEquals("é€", Json.parse("\"\\u00e9\\u20AC\""));
        assertEquals("😀", Json.parse("\"\\ud83d\\ude00\""), "a pair makes one code point");
        assertEquals("😀é", Json.parse("\"😀é\""), "raw non-ASCII passes");
        assertEquals("a\u007fb", Json.parse("\"a\u007fb\""), "DEL is not a control character in JSON");
    }

    @Test
    void writesWhatItReads() {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("s", "quote\" backslash\\ nl\n tab\t nul\u0000 bell\u0007 😀 é \u2028");
        m.put("n", List.of(1L, -7L, 2.5, 0.0));
        m.put("nested", Map.of("t", true));
        m.put("nil", null);
        String text = Json.write(m);
        assertTrue(text.contains("\\u0000") && text.contains("\\u0007"), text);
        assertEquals(m, Json.parse(text));
        assertEquals(m, Json.parse(Json.writeBytes(m)));
        assertEquals("0.7", Json.write(0.7f), "floats keep their short form");
    }

    @Test
    void writerRefusesWhatJsonCannotCarry() {
        assertEquals(ErrorCode.BAD_REQUEST, assertThrows(KazeiaException.class, () -> Json.write("a\ud800b")).code());
        assertEquals(ErrorCode.BAD_REQUEST, assertThrows(KazeiaException.class, () -> Json.write("\udc00")).code());
        assertEquals(ErrorCode.BAD_REQUEST, assertThrows(KazeiaException.class, () -> Json.write(Double.NaN)).code());
        assertEquals(ErrorCode.BAD_REQUEST, assertThrows(KazeiaException.class, () -> Json.write(Map.of(1, 2))).code());
        assertEquals(ErrorCode.BAD_REQUEST, assertThrows(KazeiaException.class, () -> Json.write(new Object())).code());
    }

    @Test
    void refusesMalformedSyntax() {
        for (String bad : List.of("", " ", "{", "}", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "{a:1}", "{'a':1}", "[1 2]",
                "01", "-", "1.", ".5", "1e", "+1", "0x10", "NaN", "Infinity", "tru", "nul", "\"abc", "[", "[[]",
                "{} {}", "1 2", "/* c */ 1", "[1]//", "\"\\x41\"", "\"\\u12\"", "\"\\u12G4\"", "\"\\u١٢٣٤\"",
                "1e400", "{\"a\":1,\"a\":2}", "\ufeff{}")) {
            refused(bad);
        }
    }

    @Test
    void refusesControlCharactersAndLoneSurrogates() {
        for (char c = 0; c < 0x20; c++) {
            refused("\"a" + c + "b\"");
        }
        refused("\"\\ud83d\"");
        refused("\"\\ud83dx\"");
        refused("\"\\ud83d\\u0041\"");
        refused("\"\\ude00\"");
        refused("\"\ud83d\"");
        refused("\"\ude00\ud83d\"");
    }

    @Test
    void refusesInvalidUtf8Cleanly() {
        byte q = '"';
        refusedBytes(new byte[] {q, (byte) 0xff, q});                     // never valid
        refusedBytes(new byte[] {q, (byte) 0xc3, q});                     // truncated 2-byte sequence
        refusedBytes(new byte[] {q, (byte) 0xc0, (byte) 0xaf, q});        // overlong '/'
        refusedBytes(new byte[] {q, (byte) 0xe0, (byte) 0x80, (byte) 0xaf, q}); // overlong, 3 bytes
        refusedBytes(new byte[] {q, (byte) 0xed, (byte) 0xa0, (byte) 0x80, q}); // UTF-16 surrogate as UTF-8 (CESU)
        refusedBytes(new byte[] {q, (byte) 0xf4, (byte) 0x90, (byte) 0x80, (byte) 0x80, q}); // above U+10FFFF
        refusedBytes(new byte[] {q, (byte) 0x80, q});                     // lone continuation byte
        assertEquals("é", Json.parse("\"é\"".getBytes(StandardCharsets.UTF_8)));
    }

    @Test
    void deepNestingIsRefusedNotAStackOverflow() {
        String ok = "[".repeat(Json.MAX_DEPTH) + "]".repeat(Json.MAX_DEPTH);
        Json.parse(ok);
        refused("[".repeat(Json.MAX_DEPTH + 1) + "]".repeat(Json.MAX_DEPTH + 1));
        refused("[".repeat(100_000));
        refused("{\"a\":".repeat(100_000));
        List<Object> deep = List.of();
        for (int i = 0; i <= Json.MAX_DEPTH + 1; i++) {
            deep = List.of(deep);
        }
        final Object tooDeep = deep;
        assertEquals(ErrorCode.BAD_REQUEST, assertThrows(KazeiaException.class, () -> Json.write(tooDeep)).code());
    }

    @Test
    void hugeInputsAreHandledInLinearTime() {
        assertTimeoutPreemptively(Duration.ofSeconds(10), () -> {
            String big = "x".repeat(8 << 20);
            assertEquals(big, Json.parse("\"" + big + "\""));
            String escaped = "\\n".repeat(2 << 20);
            assertEquals((2 << 20), ((String) Json.parse("\"" + escaped + "\"")).length());
            String digits = "1".repeat(1 << 20);
            assertTrue(Json.parse(digits + ".5e-1048570") instanceof Double);
            refused("\"" + big); // unterminated
            StringBuilder arr = new StringBuilder("[");
            for (int i = 0; i < 500_000; i++) {
                arr.append(i).append(',');
            }
            arr.append("0]");
            assertEquals(500_001, ((List<?>) Json.parse(arr.toString())).size());
        });
    }

    @Test
    void parseObjectWantsAnObject() {
        byte[] b = "[1]".getBytes(StandardCharsets.UTF_8);
        assertEquals(ErrorCode.BAD_JSON, assertThrows(KazeiaException.class, () -> Json.parseObject(b, 0, b.length)).code());
    }
}
