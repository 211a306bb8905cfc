// Why: the Client's routing, limits, timeouts and failure handling, against a scripted fake
// daemon: exact frames (interleavings, unknown events and codes, drops) on demand.
package org.kazeia.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Collectors;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(20)
class ClientTest {
    private static String ev(String type, String id, String rest) {
        return "{\"type\":\"" + type + "\"" + (id == null ? "" : ",\"id\":\"" + id + "\"") + (rest.isEmpty() ? "" : "," + rest) + "}";
    }

    @Test
    void handshakeSaysHelloAndKeepsTheLimits() throws Exception {
        CompletableFuture<Map<String, Object>> hello = new CompletableFuture<>();
        try (FakeDaemon d = new FakeDaemon(c -> {
            hello.complete(c.welcome(4096));
            c.read();
        }); Client client = Client.connect(d.socket, new Options().clientName("test-client 1"))) {
            assertEquals(4096, client.limits().maxFrame());
            assertEquals(List.of("text"), client.welcome().capabilities());
            Map<String, Object> h = hello.get(5, TimeUnit.SECONDS);
            assertEquals("hello", h.get("type"));
            assertEquals(1L, h.get("protocol"));
            assertEquals("test-client 1", h.get("client"));
        }
    }

    @Test
    void framesOverMaxFrameAreRefusedBeforeSending() throws Exception {
        CompletableFuture<Map<String, Object>> next = new CompletableFuture<>();
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(256);
            Map<String, Object> r = c.read();
            next.complete(r);
            c.send(ev("status", (String) r.get("id"), "\"status\":{\"server\":\"fake\",\"models\":[]}"));
            c.read();
        }); Client client = Client.connect(d.socket, new Options())) {
            KazeiaException e = assertThrows(KazeiaException.class, () -> client.turn(TurnRequest.text("x".repeat(300))));
            assertEquals(ErrorCode.FRAME_TOO_LARGE, e.code());
            Turn audio = client.turn(TurnRequest.audio("transcribe", 16000, 1).id("a1"));
            assertEquals(ErrorCode.FRAME_TOO_LARGE,
                    assertThrows(KazeiaException.class, () -> audio.sendAudio(ByteBuffer.allocate(1000), true)).code());
            assertEquals("turn", next.get(5, TimeUnit.SECONDS).get("type"), "the first frame that arrived is the small turn");
            assertTrue(client.isOpen());
        }
    }

    @Test
    void eventsAreRoutedByIdWhateverTheInterleaving() throws Exception {
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            c.read();
            c.send(ev("accepted", "a", "\"pipeline\":\"chat\""));
            c.send(ev("accepted", "b", "\"pipeline\":\"chat\""));
            c.send(ev("token", "b", "\"text\":\"B1\""));
            c.send(ev("token", "a", "\"text\":\"A1\""));
            c.write(Frames.audio("a", 22050, 1, true, ByteBuffer.wrap(new byte[] {1, 0, 2, 0})));
            c.send(ev("done", "b", "\"stop\":\"eos\",\"metrics\":{}"));
            c.send(ev("token", "a", "\"text\":\"A2\""));
            c.send(ev("done", "a", "\"stop\":\"length\",\"metrics\":{\"generated_tokens\":2}"));
            c.read();
        }); Client client = Client.connect(d.socket, new Options())) {
            List<Event> bEvents = new CopyOnWriteArrayList<>();
            Turn a = client.turn(TurnRequest.text("hi").id("a"));
            Turn b = client.turn(TurnRequest.text("yo").id("b"), bEvents::add);
            TurnResult ra = a.await();
            assertEquals("A1A2", ra.text());
            assertEquals("length", ra.stop());
            assertEquals(2, ra.done().metrics().generatedTokens());
            assertEquals(1, ra.audioFrames().size());
            assertEquals(22050, ra.audio().sampleRate());
            assertTrue(b.join(Duration.ofSeconds(5)) instanceof Event.Done);
            assertEquals(3, bEvents.size());
            assertTrue(bEvents.get(0) instanceof Event.Accepted);
            assertEquals(new Event.Token("b", "B1"), bEvents.get(1));
            assertNull(a.next(), "nothing after the final event");
            // Its events were read: a result without done says so (it was an index error).
            assertThrows(IllegalStateException.class, () -> a.await().done());
        }
    }

    @Test
    void unknownEventsAndCodesAreKept() throws Exception {
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            c.send(ev("accepted", "t", "\"pipeline\":\"chat\""));
            c.send(ev("thought", "t", "\"text\":\"hm\""));
            c.send(ev("error", "t", "\"code\":\"quantum_flux\",\"message\":\"new in protocol 7\""));
            c.read();
        }); Client client = Client.connect(d.socket, new Options())) {
            Turn t = client.turn(TurnRequest.text("hi").id("t"));
            assertTrue(t.next() instanceof Event.Accepted);
            Event u = t.next();
            assertTrue(u instanceof Event.Unknown && ((Event.Unknown) u).type().equals("thought"), String.valueOf(u));
            Event.Error e = (Event.Error) t.next();
            assertEquals("quantum_flux", e.code());
            assertNull(t.next());
            assertTrue(client.isOpen());
        }
    }

    @Test
    void unknownCodeReachesTheException() throws Exception {
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            Map<String, Object> r = c.read();
            c.send(ev("error", (String) r.get("id"), "\"code\":\"quantum_flux\",\"message\":\"?\""));
            c.read();
        }); Client client = Client.connect(d.socket, new Options())) {
            KazeiaException e = assertThrows(KazeiaException.class, () -> client.turn(TurnRequest.text("hi")).await());
            assertEquals("quantum_flux", e.code());
            assertTrue(e.requestId().startsWith("jvm-"), e.requestId());
        }
    }

    @Test
    void eventsWithoutAKnownIdGoToTheConnectionListener() throws Exception {
        List<Event> orphans = new CopyOnWriteArrayList<>();
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            c.send(ev("accepted", "t", "\"pipeline\":\"chat\""));
            c.send(ev("error", null, "\"code\":\"bad_frame\",\"message\":\"unknown frame kind 0x07\""));
            c.send(ev("token", "someone-else", "\"text\":\"x\""));
            c.write(new byte[] {0, 0, 0, 2, 0x09, 0}); // a frame of unknown kind
            c.write(new byte[] {0, 0, 0, 3, 0x01, '{', '{'}); // JSON that does not parse
            c.send(ev("done", "t", "\"stop\":\"eos\",\"metrics\":{}"));
            c.read();
        }); Client client = Client.connect(d.socket, new Options().onEvent(orphans::add))) {
            TurnResult r = client.turn(TurnRequest.text("hi").id("t")).await();
            assertEquals("eos", r.stop(), "a connection-level error that keeps the connection fails no request");
            assertEquals(4, orphans.size(), orphans.toString());
            assertEquals(new Event.Error(null, "bad_frame", "unknown frame kind 0x07"), orphans.get(0));
            assertEquals("someone-else", orphans.get(1).id());
            assertEquals(ErrorCode.BAD_FRAME, ((Event.Error) orphans.get(2)).code());
            assertEquals(ErrorCode.BAD_JSON, ((Event.Error) orphans.get(3)).code());
            assertTrue(client.isOpen());
        }
    }

    @Test
    void aClosingConnectionErrorEndsPendingRequestsWithItsCode() throws Exception {
        List<KazeiaException> closed = new CopyOnWriteArrayList<>();
        CountDownLatch bothSent = new CountDownLatch(1);
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            c.read();
            bothSent.await();
            c.send(ev("error", null, "\"code\":\"frame_too_large\",\"message\":\"frame of 9999999 bytes; closing the connection\""));
            c.ch.close();
        }); Client client = Client.connect(d.socket, new Options().onClosed(closed::add))) {
            Turn t = client.turn(TurnRequest.text("hi"));
            CompletableFuture<KazeiaException> status = CompletableFuture.supplyAsync(() -> {
                try {
                    client.status();
                    return null;
                } catch (KazeiaException e) {
                    return e;
                }
            });
            Thread.sleep(100);
            bothSent.countDown();
            Event.Error end = (Event.Error) t.next();
            assertEquals(ErrorCode.FRAME_TOO_LARGE, end.code());
            assertEquals(t.id(), end.id());
            assertEquals(ErrorCode.FRAME_TOO_LARGE, status.get(5, TimeUnit.SECONDS).code());
            assertFalse(client.isOpen());
            assertEquals(1, closed.size());
            assertTrue(closed.get(0).connectionLost());
        }
    }

    @Test
    void aDroppedConnectionEndsEveryOpenRequest() throws Exception {
        List<Event> listened = new CopyOnWriteArrayList<>();
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            c.read();
            c.read();
            c.send(ev("accepted", "t1", "\"pipeline\":\"chat\""));
            c.send(ev("token", "t1", "\"text\":\"Par\""));
            c.ch.close(); // the daemon dies mid-turn
        }); Client client = Client.connect(d.socket, new Options())) {
            Turn t1 = client.turn(TurnRequest.text("hi").id("t1"));
            Turn t2 = client.turn(TurnRequest.text("yo").id("t2"), listened::add);
            Subscription[] sub = new Subscription[1];
            CompletableFuture<KazeiaException> subscribing = CompletableFuture.supplyAsync(() -> {
                try {
                    sub[0] = client.subscribe(s -> {});
                    return null;
                } catch (KazeiaException e) {
                    return e;
                }
            });
            KazeiaException e = assertThrows(KazeiaException.class, t1::await);
            assertEquals(ErrorCode.CONNECTION_CLOSED, e.code());
            assertEquals("t1", e.requestId());
            t2.join(Duration.ofSeconds(5));
            assertEquals(1, listened.size(), listened.toString());
            assertEquals(ErrorCode.CONNECTION_CLOSED, ((Event.Error) listened.get(0)).code());
            assertEquals(ErrorCode.CONNECTION_CLOSED, subscribing.get(5, TimeUnit.SECONDS).code());
            assertEquals(ErrorCode.CONNECTION_CLOSED,
                    assertThrows(KazeiaException.class, () -> client.turn(TurnRequest.text("again"))).code());
            assertEquals(ErrorCode.CONNECTION_CLOSED, assertThrows(KazeiaException.class, client::status).code());
        }
    }

    @Test
    void closingTheClientEndsOpenRequests() throws Exception {
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            c.read();
        })) {
            Client client = Client.connect(d.socket, new Options());
            Turn t = client.turn(TurnRequest.text("hi"));
            client.close();
            Event.Error e = (Event.Error) t.next(Duration.ofSeconds(5));
            assertEquals(ErrorCode.CONNECTION_CLOSED, e.code());
            client.close(); // twice is fine
        }
    }

    @Test
    void refusalsAtTheHandshakeCarryTheirCode() throws Exception {
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.read();
            c.send(ev("error", null, "\"code\":\"permission_denied\",\"message\":\"uid 1234 may not use this daemon\""));
            c.ch.close();
        })) {
            KazeiaException e = assertThrows(KazeiaException.class, () -> Client.connect(d.socket, new Options()));
            assertEquals(ErrorCode.PERMISSION_DENIED, e.code());
        }
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.read();
            c.send("{\"type\":\"welcome\",\"protocol\":2,\"server\":\"future\",\"capabilities\":[],\"limits\":{\"max_frame\":1024}}");
            c.read();
        })) {
            assertEquals(ErrorCode.PROTOCOL_VERSION,
                    assertThrows(KazeiaException.class, () -> Client.connect(d.socket, new Options())).code());
        }
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.read();
            c.send("{\"type\":\"hello\",\"junk\":\"" + "x".repeat(100_000) + "\"}");
            c.read();
        })) {
            KazeiaException e = assertThrows(KazeiaException.class, () -> Client.connect(d.socket, new Options()));
            assertEquals(ErrorCode.UNEXPECTED, e.code());
            assertTrue(e.getMessage().length() < 300, "the daemon's frame is cut in the message: " + e.getMessage().length());
        }
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.read();
            Thread.sleep(2000);
        })) {
            Options quick = new Options().connectTimeout(Duration.ofMillis(300));
            assertEquals(ErrorCode.TIMEOUT, assertThrows(KazeiaException.class, () -> Client.connect(d.socket, quick)).code());
        }
        assertEquals(ErrorCode.CONNECT_FAILED,
                assertThrows(KazeiaException.class, () -> Client.connect(java.nio.file.Path.of("/nonexistent/engine.sock"))).code());
    }

    @Test
    void errorsMarkedNotFinalDoNotEndATurn() throws Exception {
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            c.send(ev("accepted", "v", "\"pipeline\":\"transcribe\""));
            c.send(ev("error", "v", "\"code\":\"bad_frame\",\"message\":\"audio frame with another rate\",\"final\":false"));
            c.send(ev("error", "v", "\"code\":\"busy\",\"message\":\"audio overrun\",\"final\":false"));
            c.send(ev("transcript", "v", "\"text\":\"hello\",\"language\":\"en\""));
            c.send(ev("done", "v", "\"stop\":\"eos\",\"metrics\":{}"));
            c.read();
        }); Client client = Client.connect(d.socket, new Options())) {
            List<Event> all = client.turn(TurnRequest.audio("transcribe", 16000, 1).id("v")).await().events();
            assertEquals(5, all.size(), all.toString());
            assertEquals("hello", ((Event.Transcript) all.get(3)).text());
            assertFalse(((Event.Error) all.get(1)).isFinal());
        }
    }

    @Test
    void aSubscriptionEndsOnlyOnAFinalError() throws Exception {
        CountDownLatch sawNotice = new CountDownLatch(1);
        CountDownLatch sendFinal = new CountDownLatch(1);
        String status = "\"status\":{\"server\":\"fake\",\"models\":[]}";
        List<Event> orphans = new CopyOnWriteArrayList<>();
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            String id = (String) c.read().get("id");
            c.send(ev("status", id, status));
            // PROTOCOL.md §5: final: false is about one frame or refused request; the request goes on.
            c.send(ev("error", id, "\"code\":\"no_audio_request\",\"message\":\"not an audio turn\",\"final\":false"));
            c.send(ev("status", id, status));
            sendFinal.await();
            c.send(ev("error", id, "\"code\":\"engine\",\"message\":\"the end\",\"final\":true"));
            c.send(ev("status", id, status));
            c.read();
        }); Client client = Client.connect(d.socket, new Options().onEvent(e -> {
            orphans.add(e);
            sawNotice.countDown();
        }))) {
            List<StatusReport> pushes = new CopyOnWriteArrayList<>();
            Subscription sub = client.subscribe(pushes::add);
            assertTrue(sawNotice.await(5, TimeUnit.SECONDS));
            DaemonTest.eventually("the status after the notice", () -> pushes.size() == 2);
            assertTrue(sub.isActive(), "a non-final error does not end the subscription");
            Event.Error notice = (Event.Error) orphans.get(0);
            assertEquals(ErrorCode.NO_AUDIO_REQUEST, notice.code());
            assertEquals(sub.id(), notice.id(), "handed to onEvent, its listener takes statuses only");
            assertFalse(notice.isFinal());
            sendFinal.countDown();
            DaemonTest.eventually("the final error ends it", () -> !sub.isActive());
            // The daemon's status after the final error reaches onEvent: by then (frames arrive
            // in order) anything the subscription would wrongly have taken has come.
            DaemonTest.eventually("the status after the final error", () -> orphans.stream().anyMatch(e -> e instanceof Event.Status));
            assertEquals(2, pushes.size(), "nothing delivered after the final error");
            // The final error was the subscription's own, not onEvent's (a status after it has no
            // request left and goes there).
            assertEquals(List.of(notice), orphans.stream().filter(e -> e instanceof Event.Error).collect(Collectors.toList()));
        }
    }

    @Test
    void reasoningIsAskedForAndComesAsThinkingEvents() throws Exception {
        CompletableFuture<Map<String, Object>> turn = new CompletableFuture<>();
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            turn.complete(c.read());
            c.send(ev("accepted", "r", "\"pipeline\":\"guarded-chat\""));
            c.send(ev("verdict", "r", "\"stage\":\"input\",\"label\":\"Safe\",\"categories\":[],\"ms\":3"));
            c.send(ev("verdict", "r", "\"stage\":\"thinking\",\"label\":\"Safe\",\"categories\":[],\"ms\":2"));
            c.send(ev("thinking", "r", "\"text\":\"Capital of France: \""));
            c.send(ev("thinking", "r", "\"text\":\"Paris.\""));
            c.send(ev("token", "r", "\"text\":\"Paris.\""));
            c.send(ev("done", "r", "\"stop\":\"eos\",\"metrics\":{\"generated_tokens\":9,\"thinking_tokens\":6,"
                    + "\"thinking_ms\":40.5,\"ttfa_ms\":55.0}"));
            c.read();
        }); Client client = Client.connect(d.socket, new Options())) {
            TurnResult r = client.turn(TurnRequest.text("What is the capital of France?").id("r").thinkingBudget(64).showThinking(true)).await();
            assertEquals(Map.of("thinking_budget", 64L, "show_thinking", true), turn.get(5, TimeUnit.SECONDS).get("options"));
            assertEquals("Capital of France: Paris.", r.thinking());
            assertEquals("Paris.", r.text());
            assertEquals(List.of("input", "thinking"), r.verdicts().stream().map(Event.Verdict::stage).collect(Collectors.toList()));
            assertEquals(6L, r.done().metrics().thinkingTokens());
            assertEquals(40.5, r.done().metrics().thinkingMs());
            assertEquals(55.0, r.done().metrics().ttfaMs());
        }
    }

    @Test
    void anErrorWithoutFinalEndsTheTurn() throws Exception {
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            c.send(ev("accepted", "v", "\"pipeline\":\"chat\""));
            c.send(ev("error", "v", "\"code\":\"engine\",\"message\":\"boom\""));
            c.send(ev("done", "v", "\"stop\":\"eos\",\"metrics\":{}"));
            c.read();
        }); Client client = Client.connect(d.socket, new Options())) {
            KazeiaException e = assertThrows(KazeiaException.class, () -> client.turn(TurnRequest.text("chat", "hi").id("v")).await());
            assertEquals(ErrorCode.ENGINE, e.code());
        }
    }

    @Test
    void aSilentTurnTimesOutAndIsCancelled() throws Exception {
        CompletableFuture<Map<String, Object>> cancel = new CompletableFuture<>();
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            cancel.complete(c.read());
            c.read();
        }); Client client = Client.connect(d.socket, new Options().eventTimeout(Duration.ofMillis(300)))) {
            Turn t = client.turn(TurnRequest.text("hi").id("slow"));
            assertEquals(ErrorCode.TIMEOUT, assertThrows(KazeiaException.class, () -> t.next(Duration.ofMillis(100))).code());
            assertEquals(ErrorCode.TIMEOUT, assertThrows(KazeiaException.class, t::await).code());
            assertEquals(Map.of("type", "cancel", "id", "slow"), cancel.get(5, TimeUnit.SECONDS));
            assertEquals(ErrorCode.DUPLICATE_ID,
                    assertThrows(KazeiaException.class, () -> client.turn(TurnRequest.text("x").id("slow"))).code(),
                    "an id still open on this client is refused here");
        }
    }

    private static final String STATUS = "\"status\":{\"server\":\"fake\",\"models\":[]}";

    @Test
    void anInterruptIsNotATimeoutAndKeepsTheConnection() throws Exception {
        CompletableFuture<List<Map<String, Object>>> sent = new CompletableFuture<>();
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            c.send(ev("accepted", "i", "\"pipeline\":\"transcribe\""));
            List<Map<String, Object>> frames = new ArrayList<>();
            while (true) {
                Map<String, Object> r = c.read();
                if ("status".equals(r.get("type"))) {
                    c.send(ev("status", (String) r.get("id"), STATUS));
                    break;
                }
                frames.add(r);
            }
            sent.complete(frames);
            c.send(ev("done", "i", "\"stop\":\"eos\",\"metrics\":{}"));
            c.read();
        }); Client client = Client.connect(d.socket, new Options())) {
            Turn t = client.turn(TurnRequest.audio("transcribe", 16000, 1).id("i"));
            // Future.cancel(true), shutdownNow: the thread waiting in await() is interrupted.
            CompletableFuture<KazeiaException> thrown = new CompletableFuture<>();
            AtomicBoolean flagSet = new AtomicBoolean();
            Thread waiter = new Thread(() -> {
                try {
                    t.await();
                    thrown.complete(null);
                } catch (KazeiaException e) {
                    flagSet.set(Thread.currentThread().isInterrupted());
                    thrown.complete(e);
                }
            });
            waiter.start();
            waiter.interrupt();
            KazeiaException e = thrown.get(5, TimeUnit.SECONDS);
            assertEquals(ErrorCode.INTERRUPTED, e.code(), "an interrupt is not a timeout");
            assertTrue(flagSet.get(), "the interrupt flag is set again");
            assertTrue(client.isOpen(), "the connection outlives the interrupt");
            // Writes from an interrupted thread: an interruptible channel closed itself there.
            Thread.currentThread().interrupt();
            try {
                assertTrue(t.sendAudio(ByteBuffer.allocate(320), false));
                client.cancel("elsewhere");
                assertTrue(Thread.currentThread().isInterrupted(), "the flag is left as it was");
            } finally {
                Thread.interrupted();
            }
            assertTrue(client.isOpen());
            client.status();
            List<Map<String, Object>> frames = sent.get(5, TimeUnit.SECONDS);
            assertEquals(List.of("<audio>", "cancel"), frames.stream().map(m -> m.get("type")).collect(Collectors.toList()),
                    "the interrupt cancelled nothing: " + frames);
            assertEquals("elsewhere", frames.get(1).get("id"));
            assertTrue(t.join(Duration.ofSeconds(5)) instanceof Event.Done, "the turn went on to its end");
        }
    }

    @Test
    void aListenerThatThrowsKeepsTheReaderAndTheAppAlive() throws Exception {
        List<Throwable> uncaught = new CopyOnWriteArrayList<>();
        Thread.UncaughtExceptionHandler before = Thread.getDefaultUncaughtExceptionHandler();
        Thread.setDefaultUncaughtExceptionHandler((th, ex) -> uncaught.add(ex));
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            c.send(ev("accepted", "a", "\"pipeline\":\"chat\""));
            c.send(ev("token", "someone-else", "\"text\":\"x\""));
            c.send(ev("token", "a", "\"text\":\"x\""));
            c.send(ev("done", "a", "\"stop\":\"eos\",\"metrics\":{}"));
            Map<String, Object> r = c.read();
            c.send(ev("status", (String) r.get("id"), STATUS));
            c.read();
        }); Client client = Client.connect(d.socket, new Options().requestTimeout(Duration.ofSeconds(3)).onEvent(e -> {
            throw new IllegalStateException("onEvent's bug");
        }))) {
            List<Event> got = new CopyOnWriteArrayList<>();
            Turn a = client.turn(TurnRequest.text("hi").id("a"), e -> {
                got.add(e);
                if (e instanceof Event.Accepted) {
                    throw new IllegalStateException("a listener's bug");
                }
                if (e instanceof Event.Token) {
                    throw new AssertionError("an Error: Kotlin's TODO(), an assert");
                }
            });
            assertTrue(a.join(Duration.ofSeconds(5)) instanceof Event.Done, "the reader lived on: " + got);
            assertEquals(3, got.size(), got.toString());
            client.status();
            assertTrue(client.isOpen());
            assertEquals(List.of(), uncaught, "nothing reaches an uncaught-exception handler (on Android it kills the app)");
        } finally {
            Thread.setDefaultUncaughtExceptionHandler(before);
        }
    }

    @Test
    void closingFromAnotherThreadEndsATurnOnceAndNeverDuringItsListener() throws Exception {
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            c.send(ev("accepted", "c", "\"pipeline\":\"chat\""));
            c.send(ev("token", "c", "\"text\":\"x\""));
            c.send(ev("done", "c", "\"stop\":\"eos\",\"metrics\":{}"));
            c.read();
        })) {
            Client client = Client.connect(d.socket, new Options());
            CountDownLatch inListener = new CountDownLatch(1);
            CountDownLatch release = new CountDownLatch(1);
            AtomicInteger inside = new AtomicInteger();
            AtomicBoolean overlapped = new AtomicBoolean();
            List<Event> got = new CopyOnWriteArrayList<>();
            Turn t = client.turn(TurnRequest.text("hi").id("c"), e -> {
                if (inside.incrementAndGet() > 1) {
                    overlapped.set(true);
                }
                try {
                    got.add(e);
                    if (e instanceof Event.Token) {
                        inListener.countDown();
                        release.await(5, TimeUnit.SECONDS);
                    }
                } catch (InterruptedException ie) {
                    Thread.currentThread().interrupt();
                } finally {
                    inside.decrementAndGet();
                }
            });
            assertTrue(inListener.await(5, TimeUnit.SECONDS));
            Thread closer = new Thread(client::close, "app-thread");
            closer.start();
            Thread.sleep(200); // the closer reaches the turn while its listener runs on the reader
            release.countDown();
            closer.join(5000);
            Event end = t.join(Duration.ofSeconds(5));
            Thread.sleep(200); // what would wrongly follow the final event has come by now
            assertFalse(overlapped.get(), "the listener was called on two threads at once: " + got);
            assertEquals(1, got.stream().filter(e -> e instanceof Event.Done || e instanceof Event.Error).count(), got.toString());
            assertEquals(end, got.get(got.size() - 1), "the final event is the last: " + got);
        }
    }

    @Test
    void aFailedWriteLeavesTheDaemonsLastFramesToTheReader() throws Exception {
        CountDownLatch inListener = new CountDownLatch(1);
        CountDownLatch release = new CountDownLatch(1);
        List<KazeiaException> closed = new CopyOnWriteArrayList<>();
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            c.read();
            c.send(ev("accepted", "v", "\"pipeline\":\"transcribe\""));
            c.send(ev("done", "v", "\"stop\":\"eos\",\"metrics\":{}"));
            c.send(ev("error", null, "\"code\":\"frame_too_large\",\"message\":\"closing the connection\""));
            c.ch.close();
        }); Client client = Client.connect(d.socket, new Options().onClosed(closed::add))) {
            List<Event> got = new CopyOnWriteArrayList<>();
            Turn v = client.turn(TurnRequest.audio("transcribe", 16000, 1).id("v"), e -> {
                got.add(e);
                if (e instanceof Event.Accepted) {
                    inListener.countDown();
                    try {
                        release.await(5, TimeUnit.SECONDS); // the reader is held before the rest
                    } catch (InterruptedException ie) {
                        Thread.currentThread().interrupt();
                    }
                }
            });
            Turn w = client.turn(TurnRequest.text("hi").id("w"));
            assertTrue(inListener.await(5, TimeUnit.SECONDS));
            d.join(); // the daemon sent its last frames and closed
            KazeiaException e = assertThrows(KazeiaException.class, () -> {
                for (int i = 0; i < 50; i++) {
                    v.sendAudio(ByteBuffer.allocate(3200), false);
                }
            });
            assertEquals(ErrorCode.CONNECTION_CLOSED, e.code(), "the write failed");
            release.countDown();
            assertTrue(v.join(Duration.ofSeconds(5)) instanceof Event.Done, "the daemon's done, sent before it closed: " + got);
            assertEquals(ErrorCode.FRAME_TOO_LARGE, assertThrows(KazeiaException.class, w::await).code(),
                    "the code of the daemon's last error, not the failed write's");
            DaemonTest.eventually("closed", () -> !client.isOpen());
            assertEquals(ErrorCode.FRAME_TOO_LARGE, closed.get(0).code());
        }
    }

    @Test
    void blockingCallsFromAListenerThrowBeforeSendingAnything() throws Exception {
        CompletableFuture<Map<String, Object>> next = new CompletableFuture<>();
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            c.send(ev("accepted", "l", "\"pipeline\":\"chat\""));
            next.complete(c.read());
            c.read();
        }); Client client = Client.connect(d.socket, new Options())) {
            List<Throwable> thrown = new CopyOnWriteArrayList<>();
            CountDownLatch tried = new CountDownLatch(1);
            client.turn(TurnRequest.text("hi").id("l"), e -> {
                if (e instanceof Event.Accepted) {
                    List<Runnable> calls = List.of(() -> client.unload("thinker"), () -> client.load("thinker"),
                            client::status, () -> client.subscribe(s -> {}));
                    for (Runnable call : calls) {
                        try {
                            call.run();
                        } catch (Throwable t) {
                            thrown.add(t);
                        }
                    }
                    tried.countDown();
                }
            });
            assertTrue(tried.await(5, TimeUnit.SECONDS));
            assertEquals(4, thrown.size(), thrown.toString());
            assertTrue(thrown.stream().allMatch(t -> t instanceof IllegalStateException), thrown.toString());
            client.cancel("l");
            assertEquals(Map.of("type", "cancel", "id", "l"), next.get(5, TimeUnit.SECONDS),
                    "the refused calls sent nothing (an unload ran while its caller was told it failed)");
        }
    }

    @Test
    void aSubscribeWhoseFirstStatusIsLateIsCancelled() throws Exception {
        CompletableFuture<String> subscribe = new CompletableFuture<>();
        CompletableFuture<Map<String, Object>> next = new CompletableFuture<>();
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            subscribe.complete((String) c.read().get("id"));
            next.complete(c.read());
            c.read();
        }); Client client = Client.connect(d.socket, new Options().requestTimeout(Duration.ofMillis(300)))) {
            KazeiaException e = assertThrows(KazeiaException.class, () -> client.subscribe(s -> {}));
            assertEquals(ErrorCode.TIMEOUT, e.code());
            String id = subscribe.get(5, TimeUnit.SECONDS);
            assertEquals(id, e.requestId());
            assertEquals(Map.of("type", "cancel", "id", id), next.get(5, TimeUnit.SECONDS),
                    "the daemon would push on for a subscription nobody has");
        }
    }

    @Test
    void aListenerThatThrowsOnTheFinalEventStillEndsTheTurn() throws Exception {
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1 << 20);
            c.read();
            c.send(ev("accepted", "f", "\"pipeline\":\"chat\""));
            c.send(ev("done", "f", "\"stop\":\"eos\",\"metrics\":{}"));
            c.read();
        }); Client client = Client.connect(d.socket, new Options())) {
            Turn t = client.turn(TurnRequest.text("hi").id("f"), e -> {
                if (e instanceof Event.Done) {
                    throw new IllegalStateException("a listener's bug on the last event");
                }
            });
            assertTrue(t.join(Duration.ofSeconds(5)) instanceof Event.Done);
            assertTrue(t.isEnded());
        }
    }

    @Test
    void streamAudioCutsItsFramesToTheDaemonsMaxFrame() throws Exception {
        CompletableFuture<List<Map<String, Object>>> audio = new CompletableFuture<>();
        try (FakeDaemon d = new FakeDaemon(c -> {
            c.welcome(1024);
            c.read();
            List<Map<String, Object>> frames = new ArrayList<>();
            Map<String, Object> f;
            do {
                f = c.read();
                frames.add(f);
            } while (!Boolean.TRUE.equals(f.get("last")));
            audio.complete(frames);
            c.read();
        }); Client client = Client.connect(d.socket, new Options())) {
            // 100 ms of 48 kHz stereo is 19,200 bytes: over this daemon's max_frame of 1024.
            Turn t = client.turn(TurnRequest.audio("transcribe", 48000, 2).id("s"));
            assertTrue(t.streamAudio(ByteBuffer.allocate(48_000)));
            List<Map<String, Object>> frames = audio.get(5, TimeUnit.SECONDS);
            long total = 0;
            for (Map<String, Object> f : frames) {
                long bytes = (Long) f.get("bytes");
                assertTrue(Frames.audioLength("s", (int) bytes) <= 1024, "a frame over max_frame: " + bytes);
                assertEquals(0, bytes % 4, "whole sample frames");
                total += bytes;
            }
            assertEquals(48_000, total);
            assertEquals(1, frames.stream().filter(f -> Boolean.TRUE.equals(f.get("last"))).count());
            assertTrue(client.isOpen());
        }
    }
}
