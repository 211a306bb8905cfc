// Why: a subscribe request (PROTOCOL.md §4): status pushes for as long as the connection
// lives; close() cancels it in the daemon (a connection holds at most 16 subscriptions).
package org.kazeia.client;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.function.Consumer;

public final class Subscription implements Route, AutoCloseable {
    private final Client client;
    private final String id;
    private final Consumer<StatusReport> listener;
    private final CompletableFuture<StatusReport> first = new CompletableFuture<>();
    private volatile boolean closed;

    Subscription(Client client, String id, Consumer<StatusReport> listener) {
        this.client = client;
        this.id = id;
        this.listener = listener;
    }

    public String id() {
        return id;
    }

    /** The status the daemon sent when the subscription began. */
    public StatusReport first() {
        return first.getNow(null);
    }

    public boolean isActive() {
        return !closed && client.isOpen();
    }

    void awaitFirst(Duration timeout) {
        try {
            client.waitFor(first, timeout, id);
        } catch (KazeiaException e) {
            closed = true;
            if (ErrorCode.TIMEOUT.equals(e.code()) || ErrorCode.INTERRUPTED.equals(e.code())) {
                // The daemon may hold it open (its first status late): it would push on, and
                // count against the connection's 16, for a subscription its caller never got.
                try {
                    client.cancel(id);
                } catch (KazeiaException ignored) {
                    // the connection is closing: the subscription ends with it
                }
            }
            throw e;
        }
    }

    /**
     * Only an error with {@code final: true} ends the subscription (PROTOCOL.md §5). One with
     * {@code final: false} under its id (e.g. no_audio_request for an audio frame sent under
     * it) is about that one frame or refused request: the pushes go on.
     */
    @Override
    public boolean isFinal(Event e) {
        return e instanceof Event.Error && ((Event.Error) e).isFinal();
    }

    @Override
    public void deliver(Event e) {
        if (e instanceof Event.Status) {
            StatusReport s = ((Event.Status) e).status();
            try {
                if (!closed && listener != null) {
                    listener.accept(s);
                }
            } finally {
                // After the listener: subscribe() returns once the first status was given to it.
                first.complete(s);
            }
        } else if (isFinal(e)) {
            closed = true;
            first.completeExceptionally(((Event.Error) e).exception());
        } else if (e instanceof Event.Error) {
            // Not the subscription's end, and its listener takes statuses: the application
            // hears of it where it hears of events no request takes.
            client.unrouted(e);
        }
    }

    @Override
    public void fail(KazeiaException e) {
        closed = true;
        first.completeExceptionally(e);
    }

    /**
     * Stop the pushes: the listener hears no more, and a cancel naming the subscription ends it
     * in the daemon (its final error {@code cancelled} ends the route). Without it, each
     * subscription a long-lived connection closed went on pushing, and the 17th was refused.
     */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        if (client.isOpen()) {
            try {
                client.cancel(id);
            } catch (KazeiaException e) {
                // The connection is closing: the subscription ends with it.
            }
        }
    }
}
