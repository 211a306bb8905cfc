// Why: the knobs of a connection (name said in hello, timeouts, connection-level listeners) in
// one fluent object, so Client.connect stays a one-liner in Java and Kotlin.
package org.kazeia.client;

import java.time.Duration;
import java.util.Objects;
import java.util.function.Consumer;

public final class Options {
    private String clientName = "kazeia-jvm 0.1";
    private Duration connectTimeout = Duration.ofSeconds(10);
    private Duration requestTimeout = Duration.ofSeconds(30);
    private Duration loadTimeout = Duration.ofMinutes(5);
    private Duration eventTimeout = Duration.ofMinutes(2);
    private Consumer<Event> onEvent;
    private Consumer<KazeiaException> onClosed;

    /** Said in hello (e.g. "kazeia-android 0.3"). */
    public Options clientName(String name) {
        this.clientName = Objects.requireNonNull(name);
        return this;
    }

    /** Connect + handshake. */
    public Options connectTimeout(Duration d) {
        this.connectTimeout = Objects.requireNonNull(d);
        return this;
    }

    /** status, unload and subscribe's first answer. */
    public Options requestTimeout(Duration d) {
        this.requestTimeout = Objects.requireNonNull(d);
        return this;
    }

    /** load (a large model can take minutes). */
    public Options loadTimeout(Duration d) {
        this.loadTimeout = Objects.requireNonNull(d);
        return this;
    }

    /** Longest wait for a turn's next event in {@link Turn#next()} and {@link Turn#await()}. */
    public Options eventTimeout(Duration d) {
        this.eventTimeout = Objects.requireNonNull(d);
        return this;
    }

    /**
     * Events that belong to no open request of this client: connection-level errors (no id),
     * answers about ids it does not track (e.g. unknown_request for {@link Client#cancel(String)}
     * of another connection's turn), and the errors with {@code final: false} about a
     * {@link Subscription} (its listener takes statuses only; it goes on). Called on the reader
     * thread: return quickly.
     */
    public Options onEvent(Consumer<Event> listener) {
        this.onEvent = listener;
        return this;
    }

    /**
     * Called once when the connection ends, with the reason (code connection_closed,
     * frame_too_large, …), before the requests still open end with it.
     */
    public Options onClosed(Consumer<KazeiaException> listener) {
        this.onClosed = listener;
        return this;
    }

    public String clientName() {
        return clientName;
    }

    public Duration connectTimeout() {
        return connectTimeout;
    }

    public Duration requestTimeout() {
        return requestTimeout;
    }

    public Duration loadTimeout() {
        return loadTimeout;
    }

    public Duration eventTimeout() {
        return eventTimeout;
    }

    Consumer<Event> onEvent() {
        return onEvent;
    }

    Consumer<KazeiaException> onClosed() {
        return onClosed;
    }
}
