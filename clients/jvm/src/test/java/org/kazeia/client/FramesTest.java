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
