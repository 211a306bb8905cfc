// Why: the wire format and the event decoding are tested without a daemon: frames survive
// any split of the byte stream, bad headers are refused, and newer events and codes pass.
package org.kazeia.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.EOFException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.List;
import java.util.Map;

import org.junit.jupiter.api.Test;

class FramesTest {
    /** A transport that gives the bytes back in pieces of at most {@code step}. */
    static final class Bytes implements Transport {
        private final byte[] data;
        private final int step;
        private int pos;

        Bytes(byte[] data, int step) {
            this.data = data;
            this.step = step;
        }

        @Override
        public int read(byte[] buf, int off, int len) {
            if (pos == data.length) {
                return -1;
            }
            int n = Math.min(Math.min(len, step), data.length - pos);
            System.arraycopy(data, pos, buf, off, n);
            pos += n;
            return n;
        }

        @Override
        public void write(byte[] buf, int off, int len) {
            throw new UnsupportedOperationException();
        }

        @Override
        public void close() {}
    }

    @Test
    void jsonFrameHasLengthKindAndBody() {
        byte[] f = Frames.json(Map.of("type", "status", "id", "1"));
        ByteBuffer b = ByteBuffer.wrap(f);
        assertEquals(f.length - 4, b.getInt(), "length counts kind + body, big-endian");
        assertEquals(1, b.get());
        assertEquals(Map.of("type", "status", "id", "1"), Json.parse(java.util.Arrays.copyOfRange(f, 5, f.length)));
    }

    @Test
    void audioFrameMatchesTheSpecByteForByte() {
        ByteBuffer pcm = ByteBuffer.wrap(new byte[] {1, 0, 2, 0});
        byte[] f = Frames.audio("t1", 16000, 1, true, pcm);
        byte[] want = {0, 0, 0, 15, 0x02, 0, 2, 't', '1', 0, 0, 0x3e, (byte) 0x80, 1, 1, 1, 0, 2, 0};
        assertArrayEquals(want, f);
        assertEquals(0, pcm.position(), "the caller's buffer is left as it was");
        assertEquals(15, Frames.audioLength("t1", 4));
        Event.Audio a = Frames.decodeAudio(f, 5, f.length - 5);
        assertEquals("t1", a.id());
        assertEquals(16000, a.sampleRate());
        assertEquals(1, a.channels());
        assertTrue(a.last());
        assertArrayEquals(new short[] {1, 2}, a.samples());
        a.pcm().getShort(); // one reader consuming its buffer …
        assertEquals(4, a.pcm().remaining(), "… leaves the next one the whole frame");
        assertEquals(ByteOrder.LITTLE_ENDIAN, a.pcm().order());
    }

    @Test
    void audioFramesRefuseHalfSamples() {
        assertEquals(ErrorCode.BAD_REQUEST,
                assertThrows(KazeiaException.class, () -> Frames.audio("x", 16000, 2, false, ByteBuffer.allocate(6))).code());
        byte[][] bad = {
            {},                                   // no id length
            {0, 5, 'a'},                          // id longer than the frame
            {0, 1, 'a', 0, 0, 0x3e, (byte) 0x80, 1, 0, 7}, // half a sample
            {0, 1, 'a', 0, 0, 0, 0, 1, 0},        // zero rate
            {0, 1, 'a', 0, 0, 0x3e, (byte) 0x80, 0, 0}, // no channel
            {0, 1, (byte) 0xff, 0, 0, 0x3e, (byte) 0x80, 1, 0}, // id not UTF-8
        };
        for (byte[] b : bad) {
            assertEquals(ErrorCode.BAD_FRAME, assertThrows(KazeiaException.class, () -> Frames.decodeAudio(b, 0, b.length)).code());
        }
    }

    @Test
    void framesSurviveAnySplitOfTheStream() throws Exception {
        ByteArrayOutputStream wire = new ByteArrayOutputStream();
        wire.write(Frames.json(Map.of("type", "token", "id", "a", "text", "é😀")));
        wire.write(Frames.audio("a", 22050, 1, false, ByteBuffer.allocate(100_000)));
        wire.write(Frames.json(Map.of("type", "done", "id", "a", "stop", "eos")));
        for (int step : new int[] {1, 3, 7, 4096, 1 << 20}) {
            FrameReader r = new FrameReader(new Bytes(wire.toByteArray(), step));
            assertEquals(1, r.next(1 << 20).kind());
            FrameReader.Raw audio = r.next(1 << 20);
            assertEquals(2, audio.kind());
            assertEquals(100_000, Frames.decodeAudio(audio.body(), 0, audio.body().length).pcm().remaining());
            assertEquals(1, r.next(1 << 20).kind());
            assertNull(r.next(1 << 20), "a clean end between frames");
        }
    }

    @Test
    void oversizedAndTruncatedFrames() {
        byte[] big = {0, 0x10, 0, 1, 1};
        assertEquals(ErrorCode.FRAME_TOO_LARGE,
                assertThrows(KazeiaException.class, () -> new FrameReader(new Bytes(big, 5)).next(1 << 20)).code());
        byte[] cut = {0, 0, 0, 10, 1, '{'};
        assertThrows(EOFException.class, () -> new FrameReader(new Bytes(cut, 2)).next(1 << 20));
        byte[] cutHeader = {0, 0};
        assertThrows(EOFException.class, () -> new FrameReader(new Bytes(cutHeader, 2)).next(1 << 20));
    }

    @Test
    @SuppressWarnings("unchecked")
    void eventsDecodeToTheirRecords() {
        Event e = Events.decode(Map.of("type", "verdict", "id", "t", "stage", "input", "label", "Unsafe",
                "categories", List.of("Violent"), "ms", 12.5));
        assertEquals(new Event.Verdict("t", "input", "Unsafe", List.of("Violent"), 12.5), e);
        Event.Done d = (Event.Done) Events.decode((Map<String, Object>) Json.parse(
                "{\"type\":\"done\",\"id\":\"t\",\"stop\":\"eos\",\"metrics\":{\"prompt_tokens\":22,\"generated_tokens\":7,"
                        + "\"ttft_ms\":118.6,\"prefill_tok_s\":208.5,\"decode_tok_s\":85.0,\"guard_in_ms\":3,\"future\":1}}"));
        assertEquals(22, d.metrics().promptTokens());
        assertEquals(118.6, d.metrics().ttftMs());
        assertEquals(3.0, d.metrics().guardInMs());
        assertNull(d.metrics().ttfsMs());
        assertEquals(1L, d.metrics().raw().get("future"), "fields added later are kept");
        Event t = Events.decode(Map.of("type", "transcript", "id", "v", "text", "bonjour"));
        assertEquals(new Event.Transcript("v", "bonjour", null, true), t, "without `final`: final");
        Event p = Events.decode(Map.of("type", "transcript", "id", "v", "text", "bon", "language", "fr", "final", false));
        assertEquals(new Event.Transcript("v", "bon", "fr", false), p);
    }

    @Test
    @SuppressWarnings("unchecked")
    void reasoningAndEveryMetricDecode() {
        assertEquals(new Event.Thinking("t", "The user asks"), Events.decode(Map.of("type", "thinking", "id", "t", "text", "The user asks")));
        assertEquals(new Event.Verdict("t", "thinking", "Safe", List.of(), 4.0), Events.decode(Map.of("type", "verdict", "id", "t",
                "stage", "thinking", "label", "Safe", "categories", List.of(), "ms", 4)));
        // Every field of PROTOCOL.md §5's metrics paragraph, each with its own value.
        Metrics m = ((Event.Done) Events.decode((Map<String, Object>) Json.parse("{\"type\":\"done\",\"id\":\"v\",\"stop\":\"eos\","
                + "\"metrics\":{\"prompt_tokens\":1,\"generated_tokens\":2,\"ttft_ms\":3.5,\"prefill_tok_s\":4.5,\"decode_tok_s\":5.5,"
                + "\"cached_tokens\":6,\"guard_in_ms\":7.5,\"ttfs_ms\":8.5,\"guard_out_ms\":9.5,\"tokens_held\":10,"
                + "\"thinking_tokens\":11,\"thinking_ms\":12.5,\"ttfa_ms\":13.5,\"end_of_turn_ms\":14.5,\"turn_checks\":15,"
                + "\"turn_check_ms\":16.25,\"stt_ms\":17.5,\"tts_first_ms\":18.5,\"speech_end_to_audio_ms\":19.5,"
                + "\"early_start_ms\":20.5}}"))).metrics();
        assertEquals(List.of(1L, 2L, 3.5, 4.5, 5.5, 6L, 7.5, 8.5, 9.5, 10L, 11L, 12.5, 13.5, 14.5, 15L, 16.25, 17.5, 18.5, 19.5, 20.5),
                List.of(m.promptTokens(), m.generatedTokens(), m.ttftMs(), m.prefillTokS(), m.decodeTokS(), m.cachedTokens(),
                        m.guardInMs(), m.ttfsMs(), m.guardOutMs(), m.tokensHeld(), m.thinkingTokens(), m.thinkingMs(), m.ttfaMs(),
                        m.endOfTurnMs(), m.turnChecks(), m.turnCheckMs(), m.sttMs(), m.ttsFirstMs(), m.speechEndToAudioMs(),
                        m.earlyStartMs()));
        // A plain text turn has none of the optional ones.
        Metrics plain = Metrics.from(Map.of("prompt_tokens", 22L, "generated_tokens", 7L, "ttft_ms", 118.6));
        for (Object o : java.util.Arrays.asList(plain.guardInMs(), plain.ttfsMs(), plain.guardOutMs(), plain.tokensHeld(),
                plain.thinkingTokens(), plain.thinkingMs(), plain.ttfaMs(), plain.endOfTurnMs(), plain.turnChecks(),
                plain.turnCheckMs(), plain.sttMs(), plain.ttsFirstMs(), plain.speechEndToAudioMs(), plain.earlyStartMs())) {
            assertNull(o, plain.toString());
        }
        TurnResult r = new TurnResult("t", List.of(new Event.Accepted("t", "chat"), new Event.Thinking("t", "Paris is "),
                new Event.Thinking("t", "the capital."), new Event.Token("t", "Paris."), new Event.Done("t", "eos", plain)));
        assertEquals("Paris is the capital.", r.thinking());
        assertEquals("Paris.", r.text(), "the reasoning is never part of the reply");
    }

    @Test
    @SuppressWarnings("unchecked")
    void welcomeAndStatusKeepEveryDocumentedField() {
        // PROTOCOL.md §3's welcome and §5's status, as written there.
        Welcome w = Welcome.from((Map<String, Object>) Json.parse("{\"type\":\"welcome\",\"protocol\":1,\"server\":\"kazeia 0.1.0\","
                + "\"capabilities\":[\"text\",\"audio\",\"cancel\",\"status\",\"load\",\"subscribe\"],"
                + "\"limits\":{\"max_frame\":1048576,\"queue_per_model\":8,\"connection_buffer\":1024,"
                + "\"max_connections_per_uid\":64,\"max_turns_per_uid\":32}}"));
        assertEquals(new Welcome.Limits(1048576, 8, 1024, 64, 32), w.limits());
        assertEquals(new Welcome.Limits(1 << 20, 0, 0, 0, 0), Welcome.from(Map.of("type", "welcome", "protocol", 1L)).limits(),
                "an older daemon's welcome: max_frame's default, 0 for the rest");

        StatusReport s = StatusReport.from((Map<String, Object>) Json.parse("{\"server\":\"kazeia 0.1.0\",\"protocol\":1,\"pid\":4242,"
                + "\"uptime_s\":12.5,\"connections\":2,\"turns_running\":1,\"pipelines\":[\"chat\"],\"budget_bytes\":11811160064,"
                + "\"reserved_bytes\":363963648,\"pressure\":\"normal\",\"models\":[{\"role\":\"thinker\",\"state\":\"loaded\","
                + "\"file\":\"/m/SmolLM2-135M-Instruct.Q4_1.gguf\",\"architecture\":\"llama\",\"file_bytes\":98362432,\"device\":\"cpu\","
                + "\"placement\":\"cpu\",\"shares_model_with\":[\"guard\"],\"busy\":1,\"turns\":1,\"generated_tokens\":1873,"
                + "\"reserved_bytes\":291611904,\"measured_bytes\":-4096,\"prefix_file_bytes\":524288},"
                + "{\"role\":\"stt\",\"state\":\"loading\",\"file\":\"/m/whisper\",\"progress\":0.5}]}"));
        assertEquals(11811160064L, s.budgetBytes());
        assertEquals(363963648L, s.reservedBytes());
        StatusReport.Model t = s.model("thinker");
        assertEquals("llama", t.architecture());
        assertEquals(98362432L, t.fileBytes());
        assertEquals(List.of("guard"), t.sharesModelWith());
        assertEquals(291611904L, t.reservedBytes());
        assertEquals(-4096L, t.measuredBytes(), "an RSS growth may be negative");
        assertEquals(524288L, t.prefixFileBytes());
        assertEquals(1873L, t.generatedTokens());
        StatusReport.Model stt = s.model("stt");
        assertEquals(0.5, stt.progress());
        assertNull(stt.architecture());
        assertNull(stt.fileBytes());
        assertEquals(List.of(), stt.sharesModelWith(), "none shared: empty, never null");
        assertNull(stt.reservedBytes());
        assertNull(stt.measuredBytes());
        assertNull(stt.prefixFileBytes());
    }

    @Test
    void unknownTypesAndCodesAreKeptNotFatal() {
        Event u = Events.decode(Map.of("type", "thought", "id", "t", "text", "hm"));
        assertTrue(u instanceof Event.Unknown);
        assertEquals("thought", ((Event.Unknown) u).type());
        assertEquals("hm", ((Event.Unknown) u).fields().get("text"));
        Event.Error err = (Event.Error) Events.decode(Map.of("type", "error", "id", "t", "code", "quantum_flux", "message", "?"));
        KazeiaException ex = err.exception();
        assertEquals("quantum_flux", ex.code());
        assertEquals("t", ex.requestId());
        // Mistyped fields give defaults, never an exception.
        Event odd = Events.decode(Map.of("type", "token", "id", "t", "text", 5));
        assertEquals(new Event.Token("t", ""), odd);
    }

    @Test
    void pcmConversions() {
        short[] stereo = {100, 300, -100, -300, 1000, 2000};
        Pcm p = Pcm.of(stereo, 32000, 2);
        assertEquals(3, p.frames());
        Pcm mono = p.toMono();
        assertArrayEquals(new short[] {200, -200, 1500}, mono.samples());
        Pcm half = Pcm.of(new short[] {0, 10, 20, 30, 40, 50, 60, 70}, 32000, 1).resample(16000);
        assertArrayEquals(new short[] {0, 20, 40, 60}, half.samples());
        Pcm up = Pcm.of(new short[] {0, 100}, 8000, 1).resample(16000);
        assertArrayEquals(new short[] {0, 50, 100, 100}, up.samples());
        ByteBuffer le = mono.data();
        assertEquals(ByteOrder.LITTLE_ENDIAN, le.order());
        Pcm back = Wav.parse(Wav.bytes(mono));
        assertEquals(32000, back.sampleRate());
        assertArrayEquals(mono.samples(), back.samples());
        assertEquals(ErrorCode.BAD_REQUEST, assertThrows(KazeiaException.class, () -> Wav.parse(new byte[] {1, 2, 3})).code());
    }
}
