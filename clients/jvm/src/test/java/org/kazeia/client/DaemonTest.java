// Why: the library against the real daemon (started by clients/jvm/run-tests, socket passed as
// -Dkazeia.socket): handshake, text, guarded and audio turns, cancel, error codes, status /
// load / unload / subscribe, limits and dropped connections, with PROTOCOL.md §7's order checked;
// ids and sessions at §4's bounds, the reasoning options, the typed metrics and status rows.
package org.kazeia.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.function.BooleanSupplier;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.api.Timeout;

@TestInstance(TestInstance.Lifecycle.PER_CLASS)
@Timeout(90)
class DaemonTest {
    private Client client;
    private final List<Event> orphans = new CopyOnWriteArrayList<>();

    static Path socket() {
        String s = System.getProperty("kazeia.socket", System.getenv("KAZEIA_SOCKET"));
        assertNotNull(s, "run through clients/jvm/run-tests: it starts a daemon and passes -Dkazeia.socket");
        return Path.of(s);
    }

    @BeforeAll
    void connect() {
        client = Client.connect(socket(), new Options().clientName("kazeia-jvm-tests").onEvent(orphans::add));
    }

    @AfterAll
    void close() {
        client.close();
    }

    // ------------------------------------------------------------------ helpers

    /** PROTOCOL.md §7: accepted first, exactly one final done/error, last; one id throughout. */
    static void assertTurnShape(String id, List<Event> events) {
        assertFalse(events.isEmpty());
        assertTrue(events.get(0) instanceof Event.Accepted, "accepted first: " + events);
        int finals = 0;
        for (Event e : events) {
            assertEquals(id, e.id(), "every event carries the turn's id");
            if (e instanceof Event.Done || e instanceof Event.Error) {
                finals++;
            }
        }
        assertEquals(1, finals, "exactly one final event: " + events);
        Event last = events.get(events.size() - 1);
        assertTrue(last instanceof Event.Done || last instanceof Event.Error, "the final event is last: " + events);
    }

    static List<Event> collect(Turn t) {
        List<Event> out = new ArrayList<>();
        for (Event e : t) {
            out.add(e);
        }
        return out;
    }

    static int indexOf(List<Event> events, Class<?> type) {
        for (int i = 0; i < events.size(); i++) {
            if (type.isInstance(events.get(i))) {
                return i;
            }
        }
        return -1;
    }

    static void eventually(String what, BooleanSupplier cond) throws InterruptedException {
        long end = System.nanoTime() + Duration.ofSeconds(10).toNanos();
        while (!cond.getAsBoolean()) {
            if (System.nanoTime() > end) {
                fail("timed out waiting for: " + what);
            }
            Thread.sleep(20);
        }
    }

    /** Speech from espeak-ng (not byte-stable, hence WER checks), as a WAV read back. */
    static Pcm say(String text) throws IOException, InterruptedException {
        Path wav = Files.createTempFile("kazeia-jvm", ".wav");
        try {
            Process p = new ProcessBuilder("espeak-ng", "-w", wav.toString(), text).redirectErrorStream(true).start();
            String out = new String(p.getInputStream().readAllBytes());
            assertEquals(0, p.waitFor(), "espeak-ng: " + out);
            return Wav.read(wav);
        } finally {
            Files.deleteIfExists(wav);
        }
    }

    TurnResult transcribe(Pcm clip) {
        Pcm pcm = clip.toMono16k();
        Turn t = client.turn(TurnRequest.audio("transcribe", pcm.sampleRate(), pcm.channels()));
        assertTrue(t.streamAudio(pcm));
        TurnResult r = t.await();
        assertTurnShape(t.id(), r.events());
        return r;
    }

    // ------------------------------------------------------------------ tests

    @Test
    void handshakeKeepsTheDaemonsLimits() {
        try (Client c = Client.connect(socket())) {
            Welcome w = c.welcome();
            assertEquals(1, w.protocol());
            assertTrue(w.server().startsWith("kazeia "), w.server());
            assertTrue(w.capabilities().containsAll(List.of("text", "audio", "cancel", "status", "load", "subscribe")), w.toString());
            assertEquals(new Welcome.Limits(1 << 20, 8, 1024, 64, 32), w.limits(), "models.toml keeps the defaults");
            StatusReport s = c.status();
            assertEquals(1, s.protocol());
            assertTrue(s.connections() >= 2, "this client and the shared one: " + s.connections());
            assertTrue(s.pipelines().containsAll(List.of("chat", "guarded-chat", "guard")), s.pipelines().toString());
            assertNotNull(s.model("thinker"));
            assertNotNull(s.model("guard"));
        }
    }

    @Test
    void aTextTurnStreamsTokensThenDone() {
        Turn t = client.turn(TurnRequest.text("chat", "What is the capital of France?").temperature(0).maxTokens(16));
        List<Event> events = collect(t);
        assertTurnShape(t.id(), events);
        assertEquals("chat", ((Event.Accepted) events.get(0)).pipeline());
        TurnResult r = new TurnResult(t.id(), events);
        assertFalse(r.text().isBlank(), events.toString());
        assertTrue(Set.of("eos", "length").contains(r.stop()), r.stop());
        long generated = r.done().metrics().generatedTokens();
        assertTrue(generated >= 1 && generated <= 16, "generated " + generated);
        assertTrue(r.done().metrics().promptTokens() > 0);
        Metrics m = r.done().metrics();
        for (Object o : java.util.Arrays.asList(m.guardInMs(), m.thinkingTokens(), m.ttfaMs(), m.endOfTurnMs(), m.sttMs(),
                m.ttsFirstMs(), m.speechEndToAudioMs(), m.earlyStartMs())) {
            assertNull(o, "an unguarded text turn without reasoning or speech: " + m);
        }
    }

    @Test
    void twoTurnsOnOneConnectionAreDemultiplexed() throws InterruptedException {
        List<Event> a = new CopyOnWriteArrayList<>();
        List<Event> b = new CopyOnWriteArrayList<>();
        Turn ta = client.turn(TurnRequest.text("Name a colour.").temperature(0).maxTokens(6), a::add);
        Turn tb = client.turn(TurnRequest.text("guard", "Name a fruit.").temperature(0), b::add);
        ta.join(Duration.ofSeconds(60));
        tb.join(Duration.ofSeconds(60));
        assertTurnShape(ta.id(), a);
        assertTurnShape(tb.id(), b);
        assertTrue(b.stream().anyMatch(e -> e instanceof Event.Verdict), b.toString());
    }

    @Test
    void aGuardedTurnGivesVerdictsBeforeText() {
        Turn t = client.turn(TurnRequest.text("guarded-chat", "What is the capital of France?").temperature(0).maxTokens(24));
        List<Event> events = collect(t);
        assertTurnShape(t.id(), events);
        assertTrue(events.get(events.size() - 1) instanceof Event.Done, events.toString());
        int verdict = indexOf(events, Event.Verdict.class);
        int token = indexOf(events, Event.Token.class);
        int sentence = indexOf(events, Event.Sentence.class);
        assertTrue(verdict > 0, "a verdict: " + events);
        assertEquals("input", ((Event.Verdict) events.get(verdict)).stage(), "the input verdict comes first");
        assertTrue(token > verdict && sentence > verdict, "verdicts before the first token and sentence: " + events);
        // Each released sentence passed the output guard: an output verdict since the previous one.
        boolean checked = false;
        for (Event e : events) {
            if (e instanceof Event.Verdict && ((Event.Verdict) e).stage().equals("output")) {
                checked = true;
            } else if (e instanceof Event.Sentence) {
                assertTrue(checked, "an output verdict before each sentence: " + events);
                checked = false;
            }
        }
        Event.Done done = (Event.Done) events.get(events.size() - 1);
        assertNotNull(done.metrics().guardInMs(), "guarded metrics");
    }

    @Test
    void cancelEndsTheTurnWithDoneCancelled() throws InterruptedException {
        Turn t = client.turn(TurnRequest.text("Tell me a very long story about a dragon who learns to fly over the sea.")
                .temperature(0).maxTokens(300));
        List<Event> events = new ArrayList<>();
        for (Event e : t) {
            events.add(e);
            if (e instanceof Event.Token && events.stream().filter(x -> x instanceof Event.Token).count() == 1) {
                t.cancel();
            }
        }
        assertTurnShape(t.id(), events);
        Event.Done done = (Event.Done) events.get(events.size() - 1);
        assertEquals("cancelled", done.stop(), events.toString());
        assertTrue(done.cancelled());
        assertTrue(done.metrics().generatedTokens() < 300, "stopped early: " + done.metrics().generatedTokens());
        Thread.sleep(300);
        assertTrue(orphans.stream().noneMatch(e -> t.id().equals(e.id())), "nothing about the id after done: " + orphans);
        assertTrue(t.isEnded());
        t.cancel(); // after the end: nothing fails, and nothing about the id comes back (the client
                    // sends no cancel, and the daemon ignores a late cancel of this connection's ended turn)
        client.status(); // the daemon answers in order: anything about the id would have come by now
        assertTrue(orphans.stream().noneMatch(e -> t.id().equals(e.id())), "nothing about the id after a late cancel: " + orphans);
    }

    @Test
    void errorCodesReachTheirException() throws InterruptedException {
        Turn bad = client.turn(TurnRequest.text("no-such-pipeline", "hi"));
        KazeiaException e = assertThrows(KazeiaException.class, bad::await);
        assertEquals(ErrorCode.PIPELINE, e.code());
        assertEquals(bad.id(), e.requestId());
        assertEquals(ErrorCode.NO_MODEL, assertThrows(KazeiaException.class, () -> client.load("no-such-role")).code());
        assertEquals(ErrorCode.BAD_REQUEST,
                assertThrows(KazeiaException.class, () -> client.turn(TurnRequest.text("transcribe", "hi")).await()).code(),
                "transcribe without audio");
        assertEquals(ErrorCode.BAD_REQUEST,
                assertThrows(KazeiaException.class, () -> client.turn(TurnRequest.audio("chat", 16000, 1)).await()).code(),
                "audio on a text pipeline");
        client.cancel("no-such-request");
        eventually("unknown_request for a cancel of nothing", () -> orphans.stream().anyMatch(o -> o instanceof Event.Error
                && ((Event.Error) o).code().equals(ErrorCode.UNKNOWN_REQUEST) && "no-such-request".equals(o.id())));
        assertTrue(client.isOpen());
    }

    @Test
    void subscribeSeesUnloadAndLoad() throws InterruptedException {
        List<StatusReport> pushes = new CopyOnWriteArrayList<>();
        try (Subscription sub = client.subscribe(pushes::add)) {
            assertNotNull(sub.first().model("guard"));
            assertEquals(1, pushes.size(), "the first status is given to the listener too");
            client.unload("guard");
            eventually("a push with guard unloaded", () -> pushes.stream().anyMatch(s -> "unloaded".equals(s.model("guard").state())));
            assertEquals(ErrorCode.NO_MODEL, assertThrows(KazeiaException.class, () -> client.unload("guard")).code());
            List<Double> progress = new CopyOnWriteArrayList<>();
            client.load("guard", progress::add);
            assertEquals("loaded", client.status().model("guard").state());
            eventually("a push with guard loaded again", () -> "loaded".equals(pushes.get(pushes.size() - 1).model("guard").state()));
            for (double p : progress) {
                assertTrue(p >= 0 && p <= 1, "progress in 0..1: " + progress);
            }
        }
    }

    @Test
    void closedSubscriptionsEndInTheDaemon() throws InterruptedException {
        // The daemon holds 16 subscriptions a connection: twenty opened and closed one after
        // the other pass only if each close ended its own there.
        for (int i = 0; i < 20; i++) {
            Subscription sub = client.subscribe(s -> {});
            sub.close();
            assertFalse(sub.isActive());
        }
    }

    @Test
    void subscriptionGoesOnAfterANonFinalError() throws InterruptedException {
        List<StatusReport> pushes = new CopyOnWriteArrayList<>();
        try (Subscription sub = client.subscribe(pushes::add)) {
            // An audio frame under the subscription's id: the daemon answers no_audio_request,
            // final: false (PROTOCOL.md §5), about that frame only.
            client.send(Frames.audio(sub.id(), 16000, 1, true, java.nio.ByteBuffer.allocate(0)));
            eventually("no_audio_request under the subscription's id", () -> orphans.stream().anyMatch(o -> o instanceof Event.Error
                    && sub.id().equals(o.id()) && ((Event.Error) o).code().equals(ErrorCode.NO_AUDIO_REQUEST)
                    && !((Event.Error) o).isFinal()));
            assertTrue(sub.isActive(), "a non-final error does not end the subscription");
            int before = pushes.size();
            // A turn admitted and ended: the daemon pushes a status for each, still to this listener.
            client.turn(TurnRequest.text("chat", "Hi.").temperature(0).maxTokens(1)).await();
            eventually("pushes after the error", () -> pushes.size() > before);
            assertTrue(orphans.stream().noneMatch(o -> o instanceof Event.Status && sub.id().equals(o.id())),
                    "no push of the subscription fell to onEvent: " + orphans);
        }
    }

    @Test
    void idsAndSessionsAtTheProtocolsBoundsAndBeyond() throws InterruptedException {
        // At the bound, 128 bytes of UTF-8 whatever the characters' widths: the daemon takes them.
        String id = "é".repeat(64);
        String session = "s-" + "😀".repeat(31) + "xx";
        Turn t = client.turn(TurnRequest.text("chat", "Say hi.").id(id).session(session).temperature(0).maxTokens(2));
        List<Event> events = collect(t);
        assertTurnShape(id, events);
        assertTrue(events.get(events.size() - 1) instanceof Event.Done, events.toString());
        // One byte more, or a control character: refused here, since the daemon refuses them
        // with a bad_request that carries no id (it is the problem), which no turn would hear of.
        assertThrows(IllegalArgumentException.class, () -> TurnRequest.text("chat", "hi").id(id + "x"));
        assertThrows(IllegalArgumentException.class, () -> TurnRequest.text("chat", "hi").session("a\tb"));
        assertThrows(IllegalArgumentException.class, () -> client.cancel("a\nb"));
        client.send(Frames.json(Map.of("type", "turn", "id", id + "x", "pipeline", "chat", "text", "hi")));
        client.send(Frames.json(Map.of("type", "turn", "id", "jvm-raw-1", "pipeline", "chat", "text", "hi", "session", "a\tb")));
        eventually("the id's refusal, without id", () -> orphans.stream().anyMatch(o -> o instanceof Event.Error && o.id() == null
                && ((Event.Error) o).code().equals(ErrorCode.BAD_REQUEST) && ((Event.Error) o).message().contains("`id` must be at most 128 bytes")));
        eventually("the session's refusal, without id", () -> orphans.stream().anyMatch(o -> o instanceof Event.Error && o.id() == null
                && ((Event.Error) o).code().equals(ErrorCode.BAD_REQUEST)
                && ((Event.Error) o).message().contains("`session` must not contain control characters")));
        assertTrue(orphans.stream().noneMatch(o -> "jvm-raw-1".equals(o.id())), "the daemon never names the id: " + orphans);
    }

    @Test
    void reasoningOptionsAreTheDaemonsOwn() {
        // The daemon refuses unknown option fields (bad_request): these names are its own.
        // SmolLM2's template has no think block, and a budget never turns reasoning on: no
        // thinking event and no reasoning metric, on either path.
        for (String pipeline : List.of("chat", "guarded-chat")) {
            Turn t = client.turn(TurnRequest.text(pipeline, "What is the capital of France?").temperature(0).maxTokens(8)
                    .thinkingBudget(32).showThinking(true));
            List<Event> events = collect(t);
            assertTurnShape(t.id(), events);
            TurnResult r = new TurnResult(t.id(), events);
            assertTrue(events.get(events.size() - 1) instanceof Event.Done, events.toString());
            assertEquals("", r.thinking(), events.toString());
            assertTrue(r.verdicts().stream().noneMatch(v -> v.stage().equals("thinking")), events.toString());
            assertNull(r.done().metrics().thinkingTokens());
            assertNull(r.done().metrics().thinkingMs());
            assertNull(r.done().metrics().ttfaMs());
        }
        TurnResult none = client.turn(TurnRequest.text("chat", "Hi.").temperature(0).maxTokens(2).thinkingBudget(0)).await();
        assertEquals("", none.thinking());
    }

    @Test
    void statusRowsCarryTheModelsFigures() {
        client.load("thinker");
        client.load("guard");
        StatusReport s = client.status();
        StatusReport.Model thinker = s.model("thinker");
        StatusReport.Model guard = s.model("guard");
        for (StatusReport.Model m : List.of(thinker, guard)) {
            assertEquals("loaded", m.state(), m.toString());
            assertEquals("llama", m.architecture(), "SmolLM2's GGUF: " + m);
            assertNotNull(m.fileBytes(), m.toString());
            assertTrue(m.fileBytes() > 1_000_000, m.toString());
            assertNotNull(m.reservedBytes(), "a loaded role holds bytes against the budget: " + m);
        }
        assertEquals(thinker.fileBytes(), guard.fileBytes(), "one file");
        assertTrue(thinker.sharesModelWith().contains("guard") || guard.sharesModelWith().contains("thinker"),
                "models.toml gives both roles one file: " + thinker.sharesModelWith() + " / " + guard.sharesModelWith());
        assertTrue(s.reservedBytes() > 0 && s.reservedBytes() <= s.budgetBytes(), s.toString());
    }

    @Test
    void transcribeHearsWhatWasSaid() throws Exception {
        String said = "Please open the window in the kitchen.";
        TurnResult r = transcribe(say(said));
        // Partial transcripts (final: false) may come before the final one.
        List<Event> ev = new ArrayList<>(r.events());
        ev.removeAll(r.partialTranscripts());
        assertEquals(3, ev.size(), "accepted, transcript, done: " + ev);
        Event.Transcript heard = r.transcript();
        assertNotNull(heard);
        assertTrue(heard.isFinal());
        assertEquals(1, indexOf(ev, Event.Transcript.class));
        assertEquals("en", heard.language());
        double wer = Wer.wer(said, heard.text());
        assertTrue(wer <= 0.35, "WER " + wer + ": heard \"" + heard.text() + "\"");
        // An audio turn's metrics (PROTOCOL.md §5): how the turn ended and the transcription.
        Metrics m = r.done().metrics();
        assertNotNull(m.endOfTurnMs(), m.toString());
        assertTrue(m.endOfTurnMs() >= 0, m.toString());
        assertNotNull(m.turnChecks(), m.toString());
        assertNotNull(m.sttMs(), m.toString());
        assertTrue(m.turnChecks() > 0 || m.turnCheckMs() == null, "turn_check_ms only with verdicts asked: " + m);
        assertNull(m.ttsFirstMs(), "nothing spoken");
    }

    @Test
    void speakSendsAudioFramesThenDone() throws Exception {
        String text = "Good morning. The kitchen window is open.";
        Turn t = client.turn(TurnRequest.text("speak", text));
        List<Event> events = collect(t);
        assertTurnShape(t.id(), events);
        List<Event.Audio> frames = new ArrayList<>();
        int lastAudio = -1;
        for (int i = 0; i < events.size(); i++) {
            if (events.get(i) instanceof Event.Audio) {
                Event.Audio a = (Event.Audio) events.get(i);
                assertFalse(!frames.isEmpty() && frames.get(frames.size() - 1).last(), "no audio after the flagged frame");
                frames.add(a);
                lastAudio = i;
            }
        }
        assertTrue(frames.size() > 1, events.toString());
        assertEquals(events.size() - 2, lastAudio, "done right after the last audio frame");
        assertTrue(frames.get(frames.size() - 1).last(), "the last frame is flagged");
        for (Event.Audio a : frames.subList(0, frames.size() - 1)) {
            assertFalse(a.last());
        }
        int rate = frames.get(0).sampleRate();
        assertTrue(rate >= 8000 && rate <= 48000, "plausible rate " + rate);
        assertEquals("eos", ((Event.Done) events.get(events.size() - 1)).stop());
        Metrics m = ((Event.Done) events.get(events.size() - 1)).metrics();
        assertNotNull(m.ttsFirstMs(), "a spoken reply's first synthesis: " + m);
        assertTrue(m.ttsFirstMs() > 0, m.toString());
        assertNull(m.endOfTurnMs(), "speak listens to nothing: " + m);
        Pcm reply = new TurnResult(t.id(), events).audio();
        assertEquals(1, reply.channels());
        assertTrue(reply.seconds() > 1.0, "speech of a few words: " + reply.seconds() + " s");
        // The PCM really is that speech (byte order, rate): Whisper hears it back.
        double wer = Wer.wer(text, transcribe(reply).transcript().text());
        assertTrue(wer <= 0.5, "round trip WER " + wer);
    }

    @Test
    void framesOverMaxFrameAreRefusedHereAndTheConnectionStays() {
        KazeiaException e = assertThrows(KazeiaException.class,
                () -> client.turn(TurnRequest.text("x".repeat(client.limits().maxFrame()))));
        assertEquals(ErrorCode.FRAME_TOO_LARGE, e.code());
        assertTrue(client.isOpen());
        assertEquals(1, client.status().protocol());
    }

    /** A transport whose test can write raw bytes or kill the socket under the client. */
    static final class Tap implements Transport {
        final UnixTransport inner = UnixTransport.connect(socket());

        @Override
        public int read(byte[] b, int off, int len) throws IOException {
            return inner.read(b, off, len);
        }

        @Override
        public void write(byte[] b, int off, int len) throws IOException {
            inner.write(b, off, len);
        }

        @Override
        public void close() {
            inner.close();
        }
    }

    @Test
    void theDaemonDroppingTheConnectionEndsTheTurn() throws Exception {
        List<Event> connectionEvents = new CopyOnWriteArrayList<>();
        List<KazeiaException> closed = new CopyOnWriteArrayList<>();
        Tap tap = new Tap();
        Client c = Client.connect(tap, new Options().onEvent(connectionEvents::add).onClosed(closed::add));
        Turn t = c.turn(TurnRequest.text("Tell me a very long story about a brave knight.").temperature(0).maxTokens(300));
        assertTrue(t.next() instanceof Event.Accepted);
        // A length over max_frame: the daemon refuses it from the length alone, says
        // frame_too_large (no id: the stream is out of step) and closes the connection.
        int over = c.limits().maxFrame() + 1;
        tap.write(new byte[] {(byte) (over >>> 24), (byte) (over >>> 16), (byte) (over >>> 8), (byte) over}, 0, 4);
        List<Event> rest = collect(t);
        Event end = rest.get(rest.size() - 1);
        // The daemon cancels the connection's turns before closing; the done may or may not
        // make it out before the socket closes. Either way: one final event, then nothing.
        if (end instanceof Event.Done) {
            assertEquals("cancelled", ((Event.Done) end).stop());
        } else {
            assertEquals(ErrorCode.FRAME_TOO_LARGE, ((Event.Error) end).code(), rest.toString());
        }
        eventually("the connection is closed", () -> !c.isOpen());
        assertEquals(ErrorCode.FRAME_TOO_LARGE, c.closeReason().code());
        assertEquals(1, closed.size());
        assertTrue(connectionEvents.stream().anyMatch(e -> e instanceof Event.Error && e.id() == null
                && ((Event.Error) e).code().equals(ErrorCode.FRAME_TOO_LARGE)), connectionEvents.toString());
        assertTrue(assertThrows(KazeiaException.class, c::status).connectionLost());
        assertEquals(1, client.status().protocol(), "the daemon itself is fine");
    }

    @Test
    void aSocketDyingUnderTheClientEndsEveryOpenRequest() throws Exception {
        Tap tap = new Tap();
        Client c = Client.connect(tap, new Options());
        Turn t = c.turn(TurnRequest.text("Tell me a very long story about a lighthouse.").temperature(0).maxTokens(300));
        assertTrue(t.next() instanceof Event.Accepted);
        tap.inner.close(); // as if the socket died
        KazeiaException e = assertThrows(KazeiaException.class, t::await);
        assertEquals(ErrorCode.CONNECTION_CLOSED, e.code());
        assertEquals(t.id(), e.requestId());
        assertFalse(c.isOpen());
        assertEquals(ErrorCode.CONNECTION_CLOSED, assertThrows(KazeiaException.class, c::status).code());
        eventually("the daemon cancelled the orphaned turn", () -> client.status().turnsRunning() == 0);
    }
}
