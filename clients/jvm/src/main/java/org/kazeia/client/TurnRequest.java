// Why: what a turn asks for (PROTOCOL.md §4: pipeline, text or audio format, session,
// options), built fluently and checked here so a typo fails before it reaches the socket.
package org.kazeia.client;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Objects;

public final class TurnRequest {
    private String id;
    private String pipeline;
    private final String text;
    private final int sampleRate;
    private final int channels;
    private String session;
    private Float temperature;
    private Long seed;
    private Long maxTokens;

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
     * with {@link Turn#sendAudio} / {@link Turn#streamAudio}.
     */
    public static TurnRequest audio(String pipeline, int sampleRate, int channels) {
        if (sampleRate <= 0 || channels < 1 || channels > 255) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "audio needs a positive sample rate and 1..255 channels");
        }
        return new TurnRequest(pipeline, null, sampleRate, channels);
    }

    /** Choose the request id (default: {@link Client#newId()}). */
    public TurnRequest id(String id) {
        this.id = Objects.requireNonNull(id);
        return this;
    }

    public TurnRequest pipeline(String pipeline) {
        this.pipeline = Objects.requireNonNull(pipeline);
        return this;
    }

    /** Reserved by the protocol (conversation state); the daemon may ignore it. */
    public TurnRequest session(String session) {
        this.session = session;
        return this;
    }

    /** Sampling temperature; 0 is greedy. */
    public TurnRequest temperature(double t) {
        if (!(t >= 0) || Double.isInfinite(t)) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "temperature must be a finite number >= 0");
        }
        this.temperature = (float) t;
        return this;
    }

    /** 0 .. 2^32-1. */
    public TurnRequest seed(long seed) {
        if (seed < 0 || seed > 0xffffffffL) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "seed must be in 0..4294967295");
        }
        this.seed = seed;
        return this;
    }

    public TurnRequest maxTokens(long n) {
        if (n < 0 || n > 0xffffffffL) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "max_tokens must be in 0..4294967295");
        }
        this.maxTokens = n;
        return this;
    }

    public String id() {
        return id;
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
        if (!o.isEmpty()) {
            m.put("options", o);
        }
        return m;
    }
}
