// Why: one connection to the daemon: the handshake, a reader thread that routes every frame
// by request id to its open request, and the requests themselves (turn, status, load,
// unload, subscribe, cancel). Thread-safe: requests may run concurrently on one Client.
// Listeners are called one event at a time per request, never after its final event, and what
// they throw is logged, never let out: it must not kill the reader thread (every request would
// then wait for its timeout) nor reach an uncaught-exception handler (on Android: the app dies).
package org.kazeia.client;

import java.io.IOException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import java.util.function.DoubleConsumer;
import java.util.function.Predicate;
import java.util.logging.Level;
import java.util.logging.Logger;

public final class Client implements AutoCloseable {
    /** The protocol version this library speaks. */
    public static final int PROTOCOL = 1;
    /** Frame limit assumed until welcome says otherwise (PROTOCOL.md §2). */
    private static final int DEFAULT_MAX_FRAME = 1 << 20;
    /**
     * After a write failed, how long the reader may go on reading what the daemon sent before
     * it closed (a turn's done, a connection-level error's code) before the socket is closed.
     */
    private static final long DRAIN_MS = 2000;
    private static final Logger LOG = Logger.getLogger("org.kazeia.client");

    /**
     * An open request's route and the lock its deliveries take: the reader's, and the final
     * error a closing thread gives it, come one at a time. A lock of the library's own: an
     * application holding a Turn's monitor cannot block the reader.
     */
    private static final class Open {
        final Route route;

        Open(Route route) {
            this.route = route;
        }
    }

    private final Transport transport;
    private final Options options;
    private final Map<String, Open> routes = new ConcurrentHashMap<>();
    private final Object writeLock = new Object();
    private final String idPrefix;
    private final AtomicLong nextId = new AtomicLong(1);
    private final CompletableFuture<Welcome> handshake = new CompletableFuture<>();
    private final Thread reader;
    private volatile Welcome welcome;
    /** Why the connection ends, set once when it begins to end (no request is taken after). */
    private volatile KazeiaException closing;
    /**
     * Why it ended, set once the {@code onClosed} listener has been told: {@link #isOpen} read
     * false before the listener ran, and a caller that waited for it found the listener not yet
     * called (the JVM test of a daemon dropping the connection failed that way, once).
     */
    private volatile KazeiaException closedBy;
    /** The last connection-level error: when the daemon then closes, it is the reason. */
    private volatile Event.Error lastConnectionError;
    /**
     * Why a write failed, set once: nothing is sent after it, but the socket stays open for the
     * reader to drain (bounded by {@link #DRAIN_MS}); its end of stream then ends the connection.
     */
    private volatile KazeiaException writeFailed;

    private Client(Transport transport, Options options) {
        this.transport = transport;
        this.options = options;
        byte[] r = new byte[4];
        new SecureRandom().nextBytes(r);
        this.idPrefix = String.format("jvm-%02x%02x%02x%02x-", r[0], r[1], r[2], r[3]);
        this.reader = new Thread(this::readLoop, "kazeia-reader");
        this.reader.setDaemon(true);
    }

    // ------------------------------------------------------------------ connecting

    /** Connect to the default socket ({@link #defaultSocket()}). */
    public static Client connect() {
        return connect(defaultSocket(), new Options());
    }

    public static Client connect(Path socket) {
        return connect(socket, new Options());
    }

    public static Client connect(Path socket, Options options) {
        return connect(UnixTransport.connect(socket), options);
    }

    /** Handshake over an already connected transport (e.g. Android's LocalSocketTransport). */
    public static Client connect(Transport transport, Options options) {
        Client c = new Client(transport, options);
        c.hello();
        return c;
    }

    /**
     * $KAZEIA_SOCKET, else $XDG_RUNTIME_DIR/kazeia/engine.sock, else
     * ~/.cache/kazeia/run/engine.sock (PROTOCOL.md §1).
     */
    public static Path defaultSocket() {
        String env = System.getenv("KAZEIA_SOCKET");
        if (env != null && !env.isEmpty()) {
            return Paths.get(env);
        }
        String xdg = System.getenv("XDG_RUNTIME_DIR");
        if (xdg != null && !xdg.isEmpty()) {
            return Paths.get(xdg, "kazeia", "engine.sock");
        }
        return Paths.get(System.getProperty("user.home"), ".cache", "kazeia", "run", "engine.sock");
    }

    private void hello() {
        reader.start();
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("type", "hello");
        m.put("protocol", PROTOCOL);
        m.put("client", options.clientName());
        try {
            byte[] f = Frames.json(m);
            synchronized (writeLock) {
                transport.write(f, 0, f.length);
            }
        } catch (IOException e) {
            // A refused peer may find the socket closed before hello is written: the reader
            // still gets the refusal (permission_denied …), so wait for it below.
        }
        try {
            welcome = handshake.get(options.connectTimeout().toMillis(), TimeUnit.MILLISECONDS);
        } catch (TimeoutException e) {
            KazeiaException t = new KazeiaException(ErrorCode.TIMEOUT, "no welcome within " + options.connectTimeout());
            shutdown(t);
            throw t;
        } catch (ExecutionException e) {
            KazeiaException k = asKazeia(e.getCause());
            shutdown(k);
            throw k;
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            KazeiaException k = new KazeiaException(ErrorCode.INTERRUPTED, "interrupted during the handshake");
            shutdown(k);
            throw k;
        }
    }

    // ------------------------------------------------------------------ what the daemon said

    public Welcome welcome() {
        return welcome;
    }

    public Welcome.Limits limits() {
        return welcome.limits();
    }

    public boolean isOpen() {
        return closedBy == null;
    }

    /** Why the connection ended, or null while it is open. */
    public KazeiaException closeReason() {
        return closedBy;
    }

    /** A fresh request id, unique to this client (and, by its random prefix, across clients). */
    public String newId() {
        return idPrefix + nextId.getAndIncrement();
    }

    Options options() {
        return options;
    }

    // ------------------------------------------------------------------ requests

    /** Start a turn whose events are read with {@link Turn#next()}, iteration or {@link Turn#await()}. */
    public Turn turn(TurnRequest request) {
        return turn(request, null);
    }

    /**
     * Start a turn whose events are given to {@code listener} on the reader thread, in order,
     * ending with exactly one Done or Error (connection_closed if the connection drops).
     * The listener must return quickly: the daemon drops a client that stops reading.
     */
    public Turn turn(TurnRequest request, Consumer<Event> listener) {
        String id = request.id() != null ? request.id() : newId();
        Turn t = new Turn(this, id, request, listener);
        open(id, t, Frames.json(request.toJson(id)));
        return t;
    }

    /** Shorthand: a chat turn with this text, awaited. */
    public TurnResult ask(String text) {
        return turn(TurnRequest.text(text)).await();
    }

    /** The daemon's state. */
    public StatusReport status() {
        String id = newId();
        Event e = call(id, request("status", id, null), ev -> ev instanceof Event.Status, options.requestTimeout(), null);
        return ((Event.Status) e).status();
    }

    /** Load a role (no-op when loaded); blocks until loaded. Errors: no_model, model_file, over_budget… */
    public void load(String role) {
        load(role, null);
    }

    /** Load a role, reporting progress (0..1) on the reader thread. */
    public void load(String role, DoubleConsumer progress) {
        String id = newId();
        Consumer<Event> p = progress == null ? null : ev -> {
            if (ev instanceof Event.LoadProgress) {
                progress.accept(((Event.LoadProgress) ev).progress());
            }
        };
        call(id, request("load", id, role), ev -> ev instanceof Event.Loaded, options.loadTimeout(), p);
    }

    /** Unload a role. Error no_model when it is not loaded. */
    public void unload(String role) {
        String id = newId();
        call(id, request("unload", id, role), ev -> ev instanceof Event.Unloaded, options.requestTimeout(), null);
    }

    /**
     * Receive a status now and each time a model's state changes, until the connection closes
     * or the subscription is closed. Waits for the first status (also given to the listener).
     */
    public Subscription subscribe(Consumer<StatusReport> listener) {
        notOnReader(); // before the request leaves: it would run on, and its caller be told it failed
        String id = newId();
        Subscription s = new Subscription(this, id, listener);
        open(id, s, Frames.json(request("subscribe", id, null)));
        s.awaitFirst(options.requestTimeout());
        return s;
    }

    /**
     * Cancel a running request by id: one of this client's turns, or, when this connection never
     * had a turn under that id, a turn of another connection of the same uid (as `kazeia cancel
     * ID`). No answer on success, nor for a turn of this connection that has ended; an unknown id
     * gets an error unknown_request, given to {@link Options#onEvent} when the id is not one of
     * this client's.
     * An id outside PROTOCOL.md §4's rule (1 to 128 bytes of UTF-8, no control character) is
     * refused here: {@link IllegalArgumentException}.
     */
    public void cancel(String id) {
        // A bad id would be refused with an error carrying no id: say so here instead.
        TurnRequest.checkName("id", Objects.requireNonNull(id, "id"));
        send(Frames.json(request("cancel", id, null)));
    }

    /** Close the connection; open requests end with connection_closed. The daemon cancels their turns. */
    @Override
    public void close() {
        shutdown(new KazeiaException(ErrorCode.CONNECTION_CLOSED, "the client closed the connection"));
    }

    // ------------------------------------------------------------------ plumbing for requests

    private static Map<String, Object> request(String type, String id, String role) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("type", type);
        m.put("id", id);
        if (role != null) {
            m.put("role", role);
        }
        return m;
    }

    /** Register a route under {@code id}, then send its request frame. */
    void open(String id, Route route, byte[] frame) {
        Open o = new Open(route);
        synchronized (routes) {
            KazeiaException c = closing != null ? closing : writeFailed;
            if (c != null) {
                throw c.forRequest(id);
            }
            if (routes.putIfAbsent(id, o) != null) {
                throw new KazeiaException(ErrorCode.DUPLICATE_ID, "request " + id + " is already open on this client", id, null);
            }
        }
        try {
            send(frame);
        } catch (KazeiaException e) {
            routes.remove(id, o);
            throw e.forRequest(id);
        }
    }

    /** A request with one final answer, awaited; an error answer is thrown. */
    private Event call(String id, Map<String, Object> req, Predicate<Event> answer, Duration timeout, Consumer<Event> progress) {
        CompletableFuture<Event> result = new CompletableFuture<>();
        Route r = new Route() {
            @Override
            public boolean isFinal(Event e) {
                return (e instanceof Event.Error && ((Event.Error) e).isFinal()) || answer.test(e);
            }

            @Override
            public void deliver(Event e) {
                if (isFinal(e)) {
                    result.complete(e);
                } else if (progress != null) {
                    progress.accept(e);
                }
            }

            @Override
            public void fail(KazeiaException e) {
                result.completeExceptionally(e);
            }
        };
        // Before the request leaves: from a listener, it would run (a role really unloaded) and
        // its caller be told it failed.
        notOnReader();
        open(id, r, Frames.json(req));
        Event e = waitFor(result, timeout, id);
        if (e instanceof Event.Error) {
            throw ((Event.Error) e).exception();
        }
        return e;
    }

    /**
     * Wait for a request's answer; on timeout the request is forgotten (its late answer goes to
     * onEvent). An interrupt throws code interrupted, the flag set again; the request stays open.
     */
    <T> T waitFor(CompletableFuture<T> f, Duration timeout, String id) {
        notOnReader();
        try {
            return f.get(timeout.toMillis(), TimeUnit.MILLISECONDS);
        } catch (TimeoutException e) {
            Open o = routes.get(id);
            if (o != null) {
                routes.remove(id, o);
            }
            throw new KazeiaException(ErrorCode.TIMEOUT, "no answer to " + id + " within " + timeout, id, null);
        } catch (ExecutionException e) {
            throw asKazeia(e.getCause()).forRequest(id);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new KazeiaException(ErrorCode.INTERRUPTED, "interrupted while waiting for " + id, id, e);
        }
    }

    /** Blocking from a listener would wait for the thread that must deliver the answer. */
    void notOnReader() {
        if (Thread.currentThread() == reader) {
            throw new IllegalStateException("blocking call from a Kazeia listener (the reader thread): hand it to another thread");
        }
    }

    /** Write one whole frame, refusing it here when it is over the daemon's max_frame. */
    void send(byte[] frame) {
        checkLength(frame.length - 4L);
        KazeiaException c = closing != null ? closing : writeFailed;
        if (c != null) {
            throw new KazeiaException(c.code(), c.messageOnly());
        }
        try {
            synchronized (writeLock) {
                transport.write(frame, 0, frame.length);
            }
        } catch (IOException e) {
            KazeiaException why = closing;
            if (why == null) {
                why = new KazeiaException(ErrorCode.CONNECTION_CLOSED, "cannot write to the daemon: " + e.getMessage(), null, e);
                writeFailed(why);
            }
            throw new KazeiaException(why.code(), why.messageOnly());
        }
    }

    /**
     * A write failed (the daemon closed, or the socket broke): send nothing more, but leave the
     * socket to the reader until its end of stream, at most {@link #DRAIN_MS}. Closing it at
     * once threw away what the daemon had sent before closing: a turn's real done, or the
     * connection-level error whose code the open requests must end with.
     */
    private void writeFailed(KazeiaException why) {
        synchronized (routes) {
            if (closing != null || writeFailed != null) {
                return;
            }
            writeFailed = why;
        }
        Thread drain = new Thread(() -> {
            try {
                reader.join(DRAIN_MS);
            } catch (InterruptedException e) {
                // nobody interrupts this thread; end the connection now if one does
            }
            shutdown(why); // nothing when the reader's end of stream ended the connection first
        }, "kazeia-drain");
        drain.setDaemon(true);
        drain.start();
    }

    /** The daemon's max_frame (welcome's, or the protocol's default before it). */
    int maxFrame() {
        Welcome w = welcome;
        return w != null ? w.limits().maxFrame() : DEFAULT_MAX_FRAME;
    }

    /** Refuse (before sending) a frame whose length is over the daemon's max_frame. */
    void checkLength(long length) {
        int limit = maxFrame();
        if (length > limit) {
            throw new KazeiaException(ErrorCode.FRAME_TOO_LARGE, "a frame of " + length
                    + " bytes is over the daemon's limit of " + limit + " bytes (welcome limits.max_frame); not sent");
        }
    }

    static KazeiaException asKazeia(Throwable t) {
        if (t instanceof KazeiaException) {
            return (KazeiaException) t;
        }
        return new KazeiaException(ErrorCode.UNEXPECTED, String.valueOf(t), null, t);
    }

    // ------------------------------------------------------------------ the reader thread

    private void readLoop() {
        FrameReader in = new FrameReader(transport);
        KazeiaException end = null;
        try {
            while (true) {
                Welcome w = welcome;
                // The daemon's frames obey its own max_frame; accept at least the default.
                int limit = Math.max(DEFAULT_MAX_FRAME, w == null ? 0 : w.limits().maxFrame());
                FrameReader.Raw f = in.next(limit);
                if (f == null) {
                    end = closedByDaemon("the daemon closed the connection");
                    break;
                }
                if (closing != null) {
                    // Ended (close(), …): frames still in the buffer are about requests that
                    // have had their final event.
                    break;
                }
                dispatch(f);
            }
        } catch (KazeiaException e) {
            end = e;
        } catch (IOException e) {
            end = closedByDaemon("connection lost: " + e.getMessage());
        } catch (Throwable e) {
            // An Error too: a reader gone without shutdown left isOpen() true and every request
            // waiting for its timeout.
            end = new KazeiaException(ErrorCode.UNEXPECTED, "reader failed: " + e, null, e);
        } finally {
            shutdown(end != null ? end : closing != null ? closing
                    : new KazeiaException(ErrorCode.UNEXPECTED, "the reader ended"));
        }
    }

    private KazeiaException closedByDaemon(String what) {
        Event.Error last = lastConnectionError;
        if (last != null && ErrorCode.closesConnection(last.code())) {
            return new KazeiaException(last.code(), what + " after: " + last.message());
        }
        return new KazeiaException(ErrorCode.CONNECTION_CLOSED, what);
    }

    private void dispatch(FrameReader.Raw f) {
        if (f.kind() == Frames.KIND_JSON) {
            Map<String, Object> m;
            try {
                m = Json.parseObject(f.body(), 0, f.body().length);
            } catch (KazeiaException e) {
                orphan(new Event.Error(null, ErrorCode.BAD_JSON, "the daemon sent a JSON frame that does not parse: " + e.messageOnly()));
                return;
            }
            if (!handshake.isDone()) {
                onHandshake(m);
                return;
            }
            route(Events.decode(m));
        } else if (f.kind() == Frames.KIND_AUDIO && handshake.isDone()) {
            Event.Audio a;
            try {
                a = Frames.decodeAudio(f.body(), 0, f.body().length);
            } catch (KazeiaException e) {
                orphan(new Event.Error(null, ErrorCode.BAD_FRAME, "the daemon sent a bad audio frame: " + e.messageOnly()));
                return;
            }
            route(a);
        } else if (!handshake.isDone()) {
            handshake.completeExceptionally(new KazeiaException(ErrorCode.UNEXPECTED, "the daemon's first frame is not JSON"));
        } else {
            orphan(new Event.Error(null, ErrorCode.BAD_FRAME, "the daemon sent a frame of unknown kind " + f.kind()));
        }
    }

    private void onHandshake(Map<String, Object> m) {
        Object type = m.get("type");
        if ("welcome".equals(type)) {
            Welcome w = Welcome.from(m);
            if (w.protocol() != PROTOCOL) {
                handshake.completeExceptionally(new KazeiaException(ErrorCode.PROTOCOL_VERSION,
                        "the daemon speaks protocol " + w.protocol() + ", this client " + PROTOCOL));
                return;
            }
            welcome = w;
            handshake.complete(w);
        } else if ("error".equals(type)) {
            Event.Error e = (Event.Error) Events.decode(m);
            lastConnectionError = e;
            handshake.completeExceptionally(e.exception());
        } else {
            // Cut: the daemon's frame may be 1 MiB, too much for an exception's message.
            String got = Json.write(m);
            if (got.length() > 200) {
                got = got.substring(0, 200) + "…";
            }
            handshake.completeExceptionally(new KazeiaException(ErrorCode.UNEXPECTED, "expected welcome, got " + got));
        }
    }

    private void route(Event ev) {
        String id = ev.id();
        Open o = id == null ? null : routes.get(id);
        if (o == null) {
            if (id == null && ev instanceof Event.Error) {
                lastConnectionError = (Event.Error) ev;
            }
            orphan(ev);
            return;
        }
        boolean fin = o.route.isFinal(ev);
        synchronized (o) {
            // Delivered only while the route is still this request's, and a final event only by
            // whoever removes it: shutdown on another thread may have ended it (with
            // connection_closed) since the lookup, and a second final event followed.
            if (fin ? routes.remove(id, o) : routes.get(id) == o) {
                try {
                    o.route.deliver(ev);
                } catch (Throwable e) {
                    report(e);
                }
                return;
            }
        }
        if (closing == null) {
            orphan(ev); // forgotten meanwhile (its wait timed out): as if it had come after
        }
    }

    private void orphan(Event ev) {
        tell(options.onEvent(), ev);
    }

    /** An event its open request has no use for (a subscription's non-final error): to onEvent. */
    void unrouted(Event ev) {
        orphan(ev);
    }

    /** Hand {@code value} to a listener the application may not have set; what it throws is reported. */
    private static <T> void tell(Consumer<T> listener, T value) {
        if (listener != null) {
            try {
                listener.accept(value);
            } catch (Throwable e) {
                report(e);
            }
        }
    }

    /**
     * A listener threw (an Error too: Kotlin's TODO(), an assert): logged, never rethrown. It
     * must not kill the reader, and the thread's uncaught-exception handler, which it once went
     * to, kills the app on Android.
     */
    private static void report(Throwable t) {
        LOG.log(Level.WARNING, "a Kazeia listener threw; the connection goes on", t);
    }

    /**
     * End the connection once: close the socket, tell the {@code onClosed} listener, then end
     * every open request with {@code reason}. The listener comes first so that whoever wakes up
     * on a request's end already finds the connection reported closed (the other order was a
     * race a test caught: a request's end seen before the listener ran). A request's end waits
     * for a delivery the reader is making to it (its lock), and is not given once the reader
     * gave it its final event.
     */
    private void shutdown(KazeiaException reason) {
        synchronized (routes) {
            if (closing != null) {
                return;
            }
            closing = reason;
        }
        transport.close();
        handshake.completeExceptionally(reason);
        tell(options.onClosed(), reason);
        closedBy = reason;
        for (Map.Entry<String, Open> e : routes.entrySet()) {
            Open o = e.getValue();
            synchronized (o) {
                if (routes.remove(e.getKey(), o)) {
                    try {
                        o.route.fail(reason.forRequest(e.getKey()));
                    } catch (Throwable ex) {
                        report(ex);
                    }
                }
            }
        }
    }
}
