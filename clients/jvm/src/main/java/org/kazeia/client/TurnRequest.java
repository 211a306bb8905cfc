// Why: what a turn asks for (PROTOCOL.md §4: pipeline, text or audio format, session,
// options), built fluently and checked here so a typo fails before it reaches the socket. The
// checks matter most for the id and the session: the daemon refuses a bad one with an error
// that carries no id (it is the problem), so the turn would never hear of it and would only
// end at its event timeout.
package org.kazeia.client;

import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;

public final class TurnRequest {
    /** Longest request id or session name, in bytes of UTF-8 (PROTOCOL.md §4). */
    public static final int MAX_NAME_BYTES = 128;
    /** Lowest audio sample rate the daemon takes, in Hz (PROTOCOL.md §4, Audio turns). */
    public static final int MIN_SAMPLE_RATE = 8000;
    /** Highest audio sample rate the daemon takes, in Hz (PROTOCOL.md §4, Audio turns). */
    public static final int MAX_SAMPLE_RATE = 384000;

    private String id;
    private String pipeline;
    private final String text;
    private final int sampleRate;
    private final int channels;
    private String session;
    private Float temperature;
    private Long seed;
    private Long maxTokens;
    private Long thinkingBudget;
    private Boolean showThinking;

    private TurnRequest(String pipeline, String text, int sampleRate, int channels) {
        this.pipeline = Objects.requireNonNull(pipeline, "pipeline");
        this.text = text;
        this.sampleRate = sampleRate;
        this.channels = channels;
    }

    /** A turn on the daemon's default pipeline, {@code guarded-chat}: the Guard checks both ways. */
    public static TurnRequest text(String text) {
        return text("guarded-chat", text);
    }

    /** A text turn on {@code pipeline} (chat, guarded-chat, guard, speak…). */
    public static TurnRequest text(String pipeline, String text) {
        return new TurnRequest(pipeline, Objects.requireNonNull(text, "text"), 0, 0);
    }

    /**
     * An audio turn (transcribe, voice): s16le audio at this rate and channel count follows
     * with {@link Turn#sendAudio} / {@link Turn#streamAudio}. The rate is 8000 to 384000 Hz (the
     * daemon converts any such rate to 16 kHz mono); channels 1..255 (one byte on the wire).
     */
    public static TurnRequest audio(String pipeline, int sampleRate, int channels) {
        if (sampleRate < MIN_SAMPLE_RATE || sampleRate > MAX_SAMPLE_RATE) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "audio sample_rate must be from " + MIN_SAMPLE_RATE + " to "
                    + MAX_SAMPLE_RATE + " Hz, not " + sampleRate);
        }
        if (channels < 1 || channels > 255) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "audio channels must be in 1..255, not " + channels);
        }
        return new TurnRequest(pipeline, null, sampleRate, channels);
    }

    /**
     * Choose the request id (default: {@link Client#newId()}): 1 to 128 bytes of UTF-8, no
     * control character, else {@link IllegalArgumentException}.
     */
    public TurnRequest id(String id) {
        this.id = checkName("id", Objects.requireNonNull(id, "id"));
        return this;
    }

    public TurnRequest pipeline(String pipeline) {
        this.pipeline = Objects.requireNonNull(pipeline);
        return this;
    }

    /**
     * Continue a conversation: turns naming the same session see its earlier turns (the daemon
     * keeps them until {@code [daemon] session_ttl} of idleness; a session is its uid's own, two
     * uids never share one). Applies to text turns and to {@code voice}'s reply. Same rule as
     * an id: 1 to 128 bytes of UTF-8, no control character, else
     * {@link IllegalArgumentException}. null: no session (the default), a turn of its own.
     */
    public TurnRequest session(String session) {
        this.session = session == null ? null : checkName("session", session);
        return this;
    }

    /** Sampling temperature, from 0 to 5; 0 (and up to 0.001) is greedy. */
    public TurnRequest temperature(double t) {
        if (!(t >= 0 && t <= 5)) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "temperature must be a number from 0 to 5");
        }
        this.temperature = (float) t;
        return this;
    }

    /** 0 .. 2^32-1. */
    public TurnRequest seed(long seed) {
        this.seed = u32("seed", seed, 0);
        return this;
    }

    /**
     * Most tokens generated, 1 .. 2^32-1 (a turn that reasons: of the answer, once the think
     * block closed; see {@link #thinkingBudget(long)}).
     */
    public TurnRequest maxTokens(long n) {
        this.maxTokens = u32("max_tokens", n, 1);
        return this;
    }

    /**
     * Most tokens the Thinker may reason before the engine closes its think block and the
     * answer follows (PROTOCOL.md, Reasoning); 0: no reasoning. 0 .. 2^32-1. Only a role
     * configured with {@code thinking = true} reasons: a budget never turns reasoning on.
     * Default: the pipeline's think stage, else the role's {@code thinking_budget}, else
     * max_tokens.
     */
    public TurnRequest thinkingBudget(long n) {
        this.thinkingBudget = u32("thinking_budget", n, 0);
        return this;
    }

    /** An option the daemon reads as a u32: {@code min} .. 2^32-1, else bad_request naming it. */
    private static long u32(String field, long n, long min) {
        if (n < min || n > 0xffffffffL) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, field + " must be in " + min + "..4294967295");
        }
        return n;
    }

    /**
     * Ask for the reasoning as {@link Event.Thinking} events, all before the reply (never part
     * of it: no token, sentence or audio). On guarded pipelines each sentence of it passes the
     * output guard first (a {@link Event.Verdict} with stage "thinking"), and a blocking verdict
     * ends the turn as for the reply.
     */
    public TurnRequest showThinking(boolean show) {
        this.showThinking = show;
        return this;
    }

    public String id() {
        return id;
    }

    public String session() {
        return session;
    }

    public String pipeline() {
        return pipeline;
    }

    public String text() {
        return text;
    }

    public boolean isAudio() {
        return sampleRate > 0;
    }

    public int sampleRate() {
        return sampleRate;
    }

    public int channels() {
        return channels;
    }

    Map<String, Object> toJson(String id) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("type", "turn");
        m.put("id", id);
        m.put("pipeline", pipeline);
        if (text != null) {
            m.put("text", text);
        }
        if (isAudio()) {
            Map<String, Object> a = new LinkedHashMap<>();
            a.put("sample_rate", sampleRate);
            a.put("channels", channels);
            m.put("audio", a);
        }
        if (session != null) {
            m.put("session", session);
        }
        Map<String, Object> o = new LinkedHashMap<>();
        if (temperature != null) {
            o.put("temperature", temperature);
        }
        if (seed != null) {
            o.put("seed", seed);
        }
        if (maxTokens != null) {
            o.put("max_tokens", maxTokens);
        }
        if (thinkingBudget != null) {
            o.put("thinking_budget", thinkingBudget);
        }
        if (showThinking != null) {
            o.put("show_thinking", showThinking);
        }
        if (!o.isEmpty()) {
            m.put("options", o);
        }
        return m;
    }

    /**
     * PROTOCOL.md §4's rule for a client-chosen name (a request id, a session): 1 to 128 bytes
     * of UTF-8, no control character (U+0000..U+001F, U+007F..U+009F). A lone surrogate has no
     * UTF-8 form at all. Returns {@code s}; {@link IllegalArgumentException} naming the rule.
     */
    static String checkName(String what, String s) {
        long bytes = 0;
        for (int i = 0; i < s.length(); ) {
            int c = s.codePointAt(i);
            if (c >= Character.MIN_SURROGATE && c <= Character.MAX_SURROGATE) { // codePointAt gives one only alone
                throw new IllegalArgumentException(what + " must be valid UTF-8 (PROTOCOL.md §4): a lone surrogate at index " + i);
            }
            if (Character.isISOControl(c)) {
                throw new IllegalArgumentException(String.format(Locale.ROOT,
                        "%s must not contain control characters (PROTOCOL.md §4): U+%04X at index %d", what, c, i));
            }
            bytes += c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
            i += Character.charCount(c);
        }
        if (bytes < 1 || bytes > MAX_NAME_BYTES) {
            throw new IllegalArgumentException(what + " must be 1 to " + MAX_NAME_BYTES + " bytes of UTF-8 (PROTOCOL.md §4), not "
                    + bytes);
        }
        return s;
    }
}
