// Why: a finished turn's events, with the usual questions answered (the reply's text, its
// sentences, the reasoning shown, the verdicts, what was heard, the spoken audio).
package org.kazeia.client;

import java.io.ByteArrayOutputStream;
import java.util.ArrayList;
import java.util.List;

public record TurnResult(String id, List<Event> events) {

    /**
     * The final event. A result without it (await() after next() or iteration had read the
     * turn's events, Done included) throws IllegalStateException saying so, not an index error.
     */
    public Event.Done done() {
        Event last = events.isEmpty() ? null : events.get(events.size() - 1);
        if (!(last instanceof Event.Done)) {
            throw new IllegalStateException("turn " + id + ": this result has no done event"
                    + (events.isEmpty() ? " (no event: they had been read with next() or iteration before await())" : ""));
        }
        return (Event.Done) last;
    }

    public String stop() {
        return done().stop();
    }

    /** The tokens, concatenated: the reply as released. */
    public String text() {
        return joined(Event.Token.class, Event.Token::text);
    }

    /** The reasoning shown ({@link TurnRequest#showThinking}), concatenated; empty when none was. */
    public String thinking() {
        return joined(Event.Thinking.class, Event.Thinking::text);
    }

    /** The text of every event of one kind, in order, concatenated. */
    private <T extends Event> String joined(Class<T> kind, java.util.function.Function<T, String> text) {
        StringBuilder b = new StringBuilder();
        for (Event e : events) {
            if (kind.isInstance(e)) {
                b.append(text.apply(kind.cast(e)));
            }
        }
        return b.toString();
    }

    public List<String> sentences() {
        List<String> out = new ArrayList<>();
        for (Event e : events) {
            if (e instanceof Event.Sentence) {
                out.add(((Event.Sentence) e).text());
            }
        }
        return out;
    }

    public List<Event.Verdict> verdicts() {
        List<Event.Verdict> out = new ArrayList<>();
        for (Event e : events) {
            if (e instanceof Event.Verdict) {
                out.add((Event.Verdict) e);
            }
        }
        return out;
    }

    /** What a speech pipeline heard (its final transcript), or null. */
    public Event.Transcript transcript() {
        for (Event e : events) {
            if (e instanceof Event.Transcript && ((Event.Transcript) e).isFinal()) {
                return (Event.Transcript) e;
            }
        }
        return null;
    }

    /** The partial transcripts sent while the user was speaking, in order. */
    public List<Event.Transcript> partialTranscripts() {
        List<Event.Transcript> out = new ArrayList<>();
        for (Event e : events) {
            if (e instanceof Event.Transcript && !((Event.Transcript) e).isFinal()) {
                out.add((Event.Transcript) e);
            }
        }
        return out;
    }

    public List<Event.Audio> audioFrames() {
        List<Event.Audio> out = new ArrayList<>();
        for (Event e : events) {
            if (e instanceof Event.Audio) {
                out.add((Event.Audio) e);
            }
        }
        return out;
    }

    /** The audio frames' PCM joined (format of the first non-empty frame), or null without audio. */
    public Pcm audio() {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        int rate = 0;
        int channels = 0;
        for (Event.Audio a : audioFrames()) {
            if (a.pcm().remaining() == 0) {
                continue;
            }
            if (rate == 0) {
                rate = a.sampleRate();
                channels = a.channels();
            } else if (a.sampleRate() != rate || a.channels() != channels) {
                throw new KazeiaException(ErrorCode.UNEXPECTED, "audio frames of one turn change format ("
                        + rate + " Hz x" + channels + " then " + a.sampleRate() + " Hz x" + a.channels() + ")");
            }
            byte[] b = new byte[a.pcm().remaining()];
            a.pcm().duplicate().get(b);
            out.write(b, 0, b.length);
        }
        return rate == 0 ? null : Pcm.of(out.toByteArray(), rate, channels);
    }
}
