// Why: the daemon's events (PROTOCOL.md §5) as plain typed values. A sealed interface of
// records: Kotlin matches them with `when (e) { is Event.Token -> … }`, Java with instanceof.
package org.kazeia.client;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.List;
import java.util.Map;

/** Something the daemon sent about a request. {@link #id()} is null only for connection-level events. */
public sealed interface Event {
    String id();

    /** The turn passed validation and admission; always a turn's first event. */
    record Accepted(String id, String pipeline) implements Event {}

    /** A role the request needs is loading; {@code progress} in 0..1. */
    record LoadProgress(String id, String role, double progress) implements Event {}

    /** Answer to {@link Client#load}. */
    record Loaded(String id, String role) implements Event {}

    /** Answer to {@link Client#unload}. */
    record Unloaded(String id, String role) implements Event {}

    /** A piece of generated text, in order. */
    record Token(String id, String text) implements Event {}

    /**
     * A turn with {@link TurnRequest#showThinking}: a piece of the Thinker's reasoning, in order,
     * all before the reply. Never part of the reply (not a token, not spoken, not kept in the
     * session); on guarded pipelines each sentence of it passed the output guard first.
     */
    record Thinking(String id, String text) implements Event {}

    /** Guarded pipelines: a sentence released after the output guard passed it. */
    record Sentence(String id, String text) implements Event {}

    /**
     * Guarded pipelines: a guard decision. {@code stage}: "input" (the user's text), "output" (a
     * sentence of the reply, before it is released) or "thinking" (a sentence of reasoning a
     * turn asked to see with {@link TurnRequest#showThinking}); kept as a string for stages
     * added later.
     */
    record Verdict(String id, String stage, String label, List<String> categories, double ms) implements Event {}

    /**
     * Speech pipelines: what was heard; {@code language} may be null. {@code isFinal} false: a
     * partial transcript of the speech so far, while the user may still be speaking; the turn
     * answers the final one, its last transcript.
     */
    record Transcript(String id, String text, String language, boolean isFinal) implements Event {}

    /** Answer to {@link Client#status()}, and the pushes of {@link Client#subscribe}. */
    record Status(String id, StatusReport status) implements Event {}

    /**
     * The turn ended. {@code stop} is "eos", "length", "context_full", "cancelled" or "blocked"
     * (kept as a string: a newer daemon may add reasons).
     */
    record Done(String id, String stop, Metrics metrics) implements Event {
        public boolean cancelled() {
            return "cancelled".equals(stop);
        }
    }

    /** The request failed. {@code code} is kept even when this library does not know it. */
    record Error(String id, String code, String message, boolean isFinal) implements Event {
        /** A final error: it ends the request {@code id} names (PROTOCOL.md: {@code final}). */
        public Error(String id, String code, String message) {
            this(id, code, message, true);
        }

        public KazeiaException exception() {
            return new KazeiaException(code, message, id, null);
        }
    }

    /**
     * An audio frame (kind 0x02): mono or interleaved s16le PCM. {@code pcm()} is a read-only,
     * little-endian buffer, a view of its own at each call; it may be empty (e.g. the flagged
     * last frame of a reply).
     */
    record Audio(String id, int sampleRate, int channels, boolean last, ByteBuffer pcm) implements Event {
        public Audio {
            pcm = pcm.asReadOnlyBuffer().order(ByteOrder.LITTLE_ENDIAN);
        }

        /**
         * A new view each call (duplicate() resets the order: little-endian set again): one
         * buffer shared by every caller had one position, and a reader that consumed it left
         * the next one an empty frame.
         */
        @Override
        public ByteBuffer pcm() {
            return pcm.duplicate().order(ByteOrder.LITTLE_ENDIAN);
        }

        /** Sample frames in this chunk (samples per channel). */
        public int frames() {
            return pcm.remaining() / (2 * channels);
        }

        public short[] samples() {
            short[] out = new short[pcm.remaining() / 2];
            pcm.duplicate().order(ByteOrder.LITTLE_ENDIAN).asShortBuffer().get(out);
            return out;
        }

        @Override
        public String toString() {
            return "Audio[id=" + id + ", sampleRate=" + sampleRate + ", channels=" + channels + ", last=" + last
                    + ", bytes=" + pcm.remaining() + "]";
        }
    }

    /** An event type this library does not know (a newer daemon): kept whole, never an error. */
    record Unknown(String id, String type, Map<String, Object> fields) implements Event {}
}
