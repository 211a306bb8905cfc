// Why: control frames are JSON and the library has no third-party dependency, so it carries
// this small strict reader/writer (RFC 8259: nothing more, nothing less; bad input is refused
// with code "bad_json", never half-read).
package org.kazeia.client;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Values map to Java as: object = {@code Map<String,Object>} (insertion order kept), array =
 * {@code List<Object>}, string = {@code String}, integer = {@code Long} (a {@code Double} when
 * it does not fit), other number = {@code Double}, true/false = {@code Boolean}, null = {@code null}.
 */
public final class Json {
    /** Deepest nesting accepted (as serde_json): hostile input cannot exhaust the stack. */
    public static final int MAX_DEPTH = 128;

    private final String s;
    private int i;

    private Json(String s) {
        this.s = s;
    }

    /** Parse one JSON value from UTF-8 bytes; invalid UTF-8 (overlong, surrogates, truncated) is refused. */
    public static Object parse(byte[] utf8) {
        return parse(utf8, 0, utf8.length);
    }

    public static Object parse(byte[] utf8, int off, int len) {
        String text;
        try {
            text = StandardCharsets.UTF_8.newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(utf8, off, len))
                    .toString();
        } catch (CharacterCodingException e) {
            throw new KazeiaException(ErrorCode.BAD_JSON, "invalid UTF-8: " + e.getMessage());
        }
        return parse(text);
    }

    /** Parse one JSON value; only whitespace may surround it. */
    public static Object parse(String text) {
        Json p = new Json(text);
        p.ws();
        Object v = p.value(0);
        p.ws();
        if (p.i != text.length()) {
            throw p.fail("trailing characters after the value");
        }
        return v;
    }

    /** Parse a JSON object (the shape of every protocol message). */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> parseObject(byte[] utf8, int off, int len) {
        Object v = parse(utf8, off, len);
        if (!(v instanceof Map)) {
            throw new KazeiaException(ErrorCode.BAD_JSON, "expected a JSON object");
        }
        return (Map<String, Object>) v;
    }

    private KazeiaException fail(String why) {
        return new KazeiaException(ErrorCode.BAD_JSON, why + " at offset " + i);
    }

    private void ws() {
        while (i < s.length()) {
            char c = s.charAt(i);
            if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
                return;
            }
            i++;
        }
    }

    private Object value(int depth) {
        if (i >= s.length()) {
            throw fail("unexpected end of input");
        }
        char c = s.charAt(i);
        switch (c) {
            case '{':
                return object(depth + 1);
            case '[':
                return array(depth + 1);
            case '"':
                return string();
            case 't':
                return literal("true", Boolean.TRUE);
            case 'f':
                return literal("false", Boolean.FALSE);
            case 'n':
                return literal("null", null);
            default:
                if (c == '-' || (c >= '0' && c <= '9')) {
                    return number();
                }
                throw fail("unexpected character " + describe(c));
        }
    }

    private static String describe(char c) {
        return c < 0x20 || c > 0x7e ? String.format("U+%04X", (int) c) : "'" + c + "'";
    }

    private Object literal(String word, Object v) {
        if (!s.startsWith(word, i)) {
            throw fail("invalid literal");
        }
        i += word.length();
        return v;
    }

    private Map<String, Object> object(int depth) {
        if (depth > MAX_DEPTH) {
            throw fail("nesting deeper than " + MAX_DEPTH);
        }
        i++; // {
        Map<String, Object> m = new LinkedHashMap<>();
        ws();
        if (peek() == '}') {
            i++;
            return m;
        }
        while (true) {
            ws();
            if (peek() != '"') {
                throw fail("expected a string key");
            }
            String key = string();
            ws();
            expect(':');
            ws();
            Object v = value(depth);
            if (m.containsKey(key)) {
                throw fail("duplicate key \"" + key + "\"");
            }
            m.put(key, v);
            ws();
            char c = next();
            if (c == '}') {
                return m;
            }
            if (c != ',') {
                i--;
                throw fail("expected ',' or '}'");
            }
        }
    }

    private List<Object> array(int depth) {
        if (depth > MAX_DEPTH) {
            throw fail("nesting deeper than " + MAX_DEPTH);
        }
        i++; // [
        List<Object> a = new ArrayList<>();
        ws();
        if (peek() == ']') {
            i++;
            return a;
        }
        while (true) {
            ws();
            a.add(value(depth));
            ws();
            char c = next();
            if (c == ']') {
                return a;
            }
            if (c != ',') {
                i--;
                throw fail("expected ',' or ']'");
            }
        }
    }

    private char peek() {
        if (i >= s.length()) {
            throw fail("unexpected end of input");
        }
        return s.charAt(i);
    }

    private char next() {
        char c = peek();
        i++;
        return c;
    }

    private void expect(char c) {
        if (next() != c) {
            i--;
            throw fail("expected '" + c + "'");
        }
    }

    private String string() {
        i++; // opening quote
        StringBuilder b = null;
        int start = i;
        while (true) {
            char c = next();
            if (c == '"') {
                return b == null ? s.substring(start, i - 1) : b.toString();
            }
            if (c < 0x20) {
                i--;
                throw fail("unescaped control character " + describe(c) + " in a string");
            }
            if (Character.isSurrogate(c)) {
                // Only whole pairs: a lone surrogate is not a Unicode scalar value.
                if (!Character.isHighSurrogate(c) || i >= s.length() || !Character.isLowSurrogate(s.charAt(i))) {
                    i--;
                    throw fail("lone surrogate in a string");
                }
                if (b != null) {
                    b.append(c).append(s.charAt(i));
                }
                i++;
                continue;
            }
            if (c != '\\') {
                if (b != null) {
                    b.append(c);
                }
                continue;
            }
            if (b == null) {
                b = new StringBuilder(s.length() - start < 64 ? 16 : 64);
                b.append(s, start, i - 1);
            }
            char e = next();
            switch (e) {
                case '"': b.append('"'); break;
                case '\\': b.append('\\'); break;
                case '/': b.append('/'); break;
                case 'b': b.append('\b'); break;
                case 'f': b.append('\f'); break;
                case 'n': b.append('\n'); break;
                case 'r': b.append('\r'); break;
                case 't': b.append('\t'); break;
                case 'u': {
                    char u = hex4();
                    if (Character.isHighSurrogate(u)) {
                        if (!s.startsWith("\\u", i)) {
                            throw fail("high surrogate \\u escape without its low half");
                        }
                        i += 2;
                        char lo = hex4();
                        if (!Character.isLowSurrogate(lo)) {
                            throw fail("high surrogate \\u escape followed by a non-low surrogate");
                        }
                        b.append(u).append(lo);
                    } else if (Character.isLowSurrogate(u)) {
                        throw fail("lone low surrogate \\u escape");
                    } else {
                        b.append(u);
                    }
                    break;
                }
                default:
                    i--;
                    throw fail("invalid escape \\" + describe(e));
            }
        }
    }

    private char hex4() {
        if (i + 4 > s.length()) {
            throw fail("truncated \\u escape");
        }
        int v = 0;
        for (int k = 0; k < 4; k++) {
            int d = Character.digit(s.charAt(i + k), 16);
            // Character.digit accepts non-ASCII digits: only 0-9a-fA-F are JSON.
            if (d < 0 || s.charAt(i + k) > 'f') {
                throw fail("invalid hex digit in \\u escape");
            }
            v = v * 16 + d;
        }
        i += 4;
        return (char) v;
    }

    private Object number() {
        int start = i;
        boolean integral = true;
        if (s.charAt(i) == '-') {
            i++;
        }
        if (i >= s.length()) {
            throw fail("truncated number");
        }
        if (s.charAt(i) == '0') {
            i++;
            if (i < s.length() && isDigit(s.charAt(i))) {
                throw fail("leading zero in a number");
            }
        } else if (isDigit(s.charAt(i))) {
            digits();
        } else {
            throw fail("expected a digit");
        }
        if (i < s.length() && s.charAt(i) == '.') {
            integral = false;
            i++;
            if (i >= s.length() || !isDigit(s.charAt(i))) {
                throw fail("expected a digit after '.'");
            }
            digits();
        }
        if (i < s.length() && (s.charAt(i) == 'e' || s.charAt(i) == 'E')) {
            integral = false;
            i++;
            if (i < s.length() && (s.charAt(i) == '+' || s.charAt(i) == '-')) {
                i++;
            }
            if (i >= s.length() || !isDigit(s.charAt(i))) {
                throw fail("expected a digit in the exponent");
            }
            digits();
        }
        String t = s.substring(start, i);
        if (integral) {
            try {
                return Long.parseLong(t);
            } catch (NumberFormatException tooBig) {
                // falls through to a double, as serde_json does for out-of-range integers
            }
        }
        double d = Double.parseDouble(t);
        if (Double.isInfinite(d)) {
            i = start;
            throw fail("number out of range");
        }
        return d;
    }

    private void digits() {
        while (i < s.length() && isDigit(s.charAt(i))) {
            i++;
        }
    }

    private static boolean isDigit(char c) {
        return c >= '0' && c <= '9';
    }

    // ---------------------------------------------------------------- writing

    /** Serialize a value (Map with String keys, Iterable, array of Object, String, Number, Boolean, null). */
    public static String write(Object v) {
        StringBuilder b = new StringBuilder();
        write(b, v, 0);
        return b.toString();
    }

    /** Serialize to UTF-8 bytes. */
    public static byte[] writeBytes(Object v) {
        return write(v).getBytes(StandardCharsets.UTF_8);
    }

    private static void write(StringBuilder b, Object v, int depth) {
        if (depth > MAX_DEPTH) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "cannot encode: nesting deeper than " + MAX_DEPTH);
        }
        if (v == null) {
            b.append("null");
        } else if (v instanceof String) {
            writeString(b, (String) v);
        } else if (v instanceof Boolean) {
            b.append(v.toString());
        } else if (v instanceof Double || v instanceof Float) {
            double d = ((Number) v).doubleValue();
            if (Double.isNaN(d) || Double.isInfinite(d)) {
                throw new KazeiaException(ErrorCode.BAD_REQUEST, "cannot encode " + v + " in JSON");
            }
            // Float.toString keeps 0.7f as "0.7" (not 0.699999988...).
            b.append(v instanceof Float ? Float.toString((Float) v) : Double.toString(d));
        } else if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte
                || v instanceof java.math.BigInteger) {
            b.append(v.toString());
        } else if (v instanceof java.math.BigDecimal) {
            b.append(((java.math.BigDecimal) v).toString());
        } else if (v instanceof Map) {
            b.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                if (!(e.getKey() instanceof String)) {
                    throw new KazeiaException(ErrorCode.BAD_REQUEST, "cannot encode: object keys must be strings");
                }
                if (!first) {
                    b.append(',');
                }
                first = false;
                writeString(b, (String) e.getKey());
                b.append(':');
                write(b, e.getValue(), depth + 1);
            }
            b.append('}');
        } else if (v instanceof Iterable || v instanceof Object[]) {
            Iterable<?> it = v instanceof Object[] ? java.util.Arrays.asList((Object[]) v) : (Iterable<?>) v;
            b.append('[');
            boolean first = true;
            for (Object o : it) {
                if (!first) {
                    b.append(',');
                }
                first = false;
                write(b, o, depth + 1);
            }
            b.append(']');
        } else {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "cannot encode a " + v.getClass().getName() + " in JSON");
        }
    }

    private static void writeString(StringBuilder b, String s) {
        b.append('"');
        for (int k = 0; k < s.length(); k++) {
            char c = s.charAt(k);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                case '\b': b.append("\\b"); break;
                case '\f': b.append("\\f"); break;
                default:
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else if (Character.isHighSurrogate(c) && k + 1 < s.length() && Character.isLowSurrogate(s.charAt(k + 1))) {
                        b.append(c).append(s.charAt(++k));
                    } else if (Character.isSurrogate(c)) {
                        // UTF-8 cannot carry it and the daemon would refuse the escape: say so here.
                        throw new KazeiaException(ErrorCode.BAD_REQUEST, "cannot encode a string with a lone surrogate (U+"
                                + Integer.toHexString(c).toUpperCase() + ") at index " + k);
                    } else {
                        b.append(c);
                    }
            }
        }
        b.append('"');
    }
}
