// Why: a running turn: its events in order (pulled with next()/iteration, or pushed to a
// listener), its cancel handle, and the audio it sends. Every turn ends with exactly one Done
// or Error event, and nothing follows it; a dropped connection ends it with Error
// "connection_closed". An interrupt of a waiting thread is code "interrupted": the turn goes on.
package org.kazeia.client;

import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

public final class Turn implements Route, Iterable<Event>, AutoCloseable {
    private final Client client;
    private final String id;
    private final TurnRequest request;
    private final Consumer<Event> listener;
    private final LinkedBlockingQueue<Event> queue = new LinkedBlockingQueue<>();
    private final CompletableFuture<Event> ended = new CompletableFuture<>();
    /** Set (before the event is handed over) to the final event. */
    private volatile Event finalEvent;
    /** The consumer took the final event from the queue. */
    private boolean drained;

    Turn(Client client, String id, TurnRequest request, Consumer<Event> listener) {
        this.client = client;
        this.id = id;
        this.request = request;
        this.listener = listener;
    }

    public String id() {
        return id;
    }

    public TurnRequest request() {
        return request;
    }

    /** True once the final event has arrived (it may not have been read yet). */
    public boolean isEnded() {
        return finalEvent != null;
    }

    // ------------------------------------------------------------------ Route (reader thread)

    @Override
    public boolean isFinal(Event e) {
        if (e instanceof Event.Done) {
            return true;
        }
        // PROTOCOL.md §5: an error with `final: false` (a bad frame of this audio turn, an
        // overrun, a second request under this id) is reported with the id while the turn goes on.
        return e instanceof Event.Error && ((Event.Error) e).isFinal();
    }

    /** Called one at a time (the Client's lock for this route). */
    @Override
    public void deliver(Event e) {
        if (finalEvent != null) {
            return; // PROTOCOL.md §7: nothing about the id follows its final event
        }
        boolean fin = isFinal(e);
        if (fin) {
            finalEvent = e;
        }
        try {
            if (listener != null) {
                listener.accept(e);
            } else {
                queue.add(e);
            }
        } finally {
            // Even when the listener throws on the final event: join() would wait for its timeout.
            if (fin) {
                ended.complete(e);
            }
        }
    }

    @Override
    public void fail(KazeiaException e) {
        deliver(new Event.Error(id, e.code(), e.messageOnly()));
    }

    // ------------------------------------------------------------------ reading events

    /** The next event, waiting up to the client's event timeout; null after the final event was read. */
    public Event next() {
        return next(client.options().eventTimeout());
    }

    /**
     * The next event; null after the final event was read; code "timeout" when none came in
     * time, "interrupted" when the thread was interrupted (its flag set again; the turn goes on).
     */
    public Event next(Duration timeout) {
        if (listener != null) {
            throw new IllegalStateException("this turn gives its events to its listener");
        }
        client.notOnReader();
        synchronized (queue) {
            if (drained) {
                return null;
            }
            Event e;
            try {
                e = queue.poll(timeout.toMillis(), TimeUnit.MILLISECONDS);
            } catch (InterruptedException ie) {
                Thread.currentThread().interrupt();
                throw new KazeiaException(ErrorCode.INTERRUPTED, "interrupted while waiting for " + id, id, ie);
            }
            if (e == null) {
                throw new KazeiaException(ErrorCode.TIMEOUT, "no event for turn " + id + " within " + timeout, id, null);
            }
            if (e == finalEvent) {
                drained = true;
            }
            return e;
        }
    }

    /** The events until the final one (inclusive). Each step waits up to the event timeout. */
    @Override
    public Iterator<Event> iterator() {
        return new Iterator<>() {
            private Event ahead;

            @Override
            public boolean hasNext() {
                if (ahead == null) {
                    ahead = Turn.this.next();
                }
                return ahead != null;
            }

            @Override
            public Event next() {
                if (!hasNext()) {
                    throw new NoSuchElementException();
                }
                Event e = ahead;
                ahead = null;
                return e;
            }
        };
    }

    /**
     * Read every event until the final one (those not read yet by next() or iteration). A final
     * Error is thrown as its KazeiaException (connection_closed when the connection dropped).
     * When no event comes within the event timeout the turn is cancelled and "timeout" thrown.
     * An interrupt throws "interrupted" (flag set again) and leaves the turn running: an
     * interrupt may mean "stop waiting", not "stop the turn"; cancel() it if it means that too.
     */
    public TurnResult await() {
        List<Event> events = new ArrayList<>();
        Event e;
        while (true) {
            try {
                e = next();
            } catch (KazeiaException t) {
                if (ErrorCode.TIMEOUT.equals(t.code())) {
                    cancel();
                }
                throw t;
            }
            if (e == null) {
                break;
            }
            events.add(e);
        }
        Event last = events.isEmpty() ? finalEvent : events.get(events.size() - 1);
        if (last instanceof Event.Error) {
            throw ((Event.Error) last).exception();
        }
        return new TurnResult(id, Collections.unmodifiableList(events));
    }

    /**
     * Wait until the turn ended (either mode); returns its final event without consuming events.
     * Codes: "timeout", "interrupted" (flag set again); the turn goes on either way.
     */
    public Event join(Duration timeout) {
        client.notOnReader();
        try {
            return ended.get(timeout.toMillis(), TimeUnit.MILLISECONDS);
        } catch (java.util.concurrent.TimeoutException e) {
            throw new KazeiaException(ErrorCode.TIMEOUT, "turn " + id + " did not end within " + timeout, id, null);
        } catch (java.util.concurrent.ExecutionException e) {
            throw Client.asKazeia(e.getCause());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new KazeiaException(ErrorCode.INTERRUPTED, "interrupted while waiting for " + id, id, e);
        }
    }

    // ------------------------------------------------------------------ acting on the turn

    /**
     * Ask the daemon to stop this turn. It then ends with Done (stop "cancelled"); tokens already
     * on the way may still arrive first. Does nothing once the turn has ended; never throws.
     */
    public void cancel() {
        if (finalEvent != null) {
            return;
        }
        try {
            client.cancel(id);
        } catch (KazeiaException e) {
            // the connection is gone: the turn ends with connection_closed anyway
        }
    }

    /** Cancel the turn if it still runs. */
    @Override
    public void close() {
        cancel();
    }

    /**
     * Send one audio frame: s16le PCM (position..limit, left untouched) in the turn's format.
     * {@code last} ends the utterance. Returns false (nothing sent) when the turn has already ended.
     */
    public boolean sendAudio(ByteBuffer pcm, boolean last) {
        if (!request.isAudio()) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "turn " + id + " (" + request.pipeline() + ") takes no audio", id, null);
        }
        if (finalEvent != null) {
            return false;
        }
        client.checkLength(Frames.audioLength(id, pcm.remaining()));
        client.send(Frames.audio(id, request.sampleRate(), request.channels(), last, pcm));
        return true;
    }

    /**
     * Send a whole clip as 100 ms frames (smaller when the daemon's max_frame cannot hold one),
     * the last one flagged (an empty clip: one empty flagged frame), as fast as the socket takes
     * them. The daemon holds up to 20 s of a turn's audio ahead of its speech task and drops
     * what comes past that (error busy, "audio overrun"): send a longer clip at its own pace,
     * frame by frame with {@link #sendAudio}. Returns false if the turn ended before everything
     * was sent.
     */
    public boolean streamAudio(ByteBuffer pcm) {
        int frameBytes = 2 * request.channels();
        // A frame over max_frame closes the connection (PROTOCOL.md §2): 100 ms of 48 kHz
        // stereo is 19,200 bytes, of 384 kHz x 255 channels 19 MB. Whole sample frames only.
        long room = client.maxFrame() - Frames.audioLength(id, 0);
        int fit = (int) Math.min(Integer.MAX_VALUE, Math.max(0, room / frameBytes * frameBytes));
        // At least one sample frame: when not even that fits, sendAudio refuses it (frame_too_large).
        int chunk = Math.max(frameBytes, Math.min(Math.max(1, request.sampleRate() / 10) * frameBytes, fit));
        ByteBuffer all = pcm.duplicate();
        do {
            int n = Math.min(chunk, all.remaining());
            ByteBuffer part = all.slice();
            ((Buffer) part).limit(n); // via Buffer: no Java 9 covariant overload (older Android)
            ((Buffer) all).position(all.position() + n);
            if (!sendAudio(part, !all.hasRemaining())) {
                return false;
            }
        } while (all.hasRemaining());
        return true;
    }

    /** {@link #streamAudio(ByteBuffer)} for a clip, which must be in the turn's format. */
    public boolean streamAudio(Pcm clip) {
        if (clip.sampleRate() != request.sampleRate() || clip.channels() != request.channels()) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "clip is " + clip.sampleRate() + " Hz x" + clip.channels()
                    + ", the turn said " + request.sampleRate() + " Hz x" + request.channels(), id, null);
        }
        return streamAudio(clip.data());
    }
}
