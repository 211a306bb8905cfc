// Why: the wire format (PROTOCOL.md §2) in one place: a u32 big-endian length, a kind byte
// (0x01 JSON, 0x02 audio) and the body; audio bodies carry id, rate, channels, flags, PCM.
package org.kazeia.client;

import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.Map;

final class Frames {
    private Frames() {}

    static final byte KIND_JSON = 0x01;
    static final byte KIND_AUDIO = 0x02;
    /** Audio header after the id: u32 rate, u8 channels, u8 flags. */
    private static final int AUDIO_TAIL = 6;

    /** A whole JSON frame, length prefix included. */
    static byte[] json(Map<String, Object> msg) {
        byte[] body = Json.writeBytes(msg);
        ByteBuffer b = ByteBuffer.allocate(5 + body.length).order(ByteOrder.BIG_ENDIAN);
        b.putInt(1 + body.length).put(KIND_JSON).put(body);
        return b.array();
    }

    /** Bytes an audio frame for {@code id} with {@code pcmBytes} of PCM takes, counted as max_frame counts. */
    static long audioLength(String id, int pcmBytes) {
        return 1L + 2 + id.getBytes(StandardCharsets.UTF_8).length + AUDIO_TAIL + pcmBytes;
    }

    /** A whole audio frame, length prefix included. {@code pcm} is read from position to limit, untouched. */
    static byte[] audio(String id, int sampleRate, int channels, boolean last, ByteBuffer pcm) {
        byte[] idb = id.getBytes(StandardCharsets.UTF_8);
        if (idb.length > 0xffff) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "request id longer than 65535 bytes");
        }
        if (channels < 1 || channels > 255 || sampleRate <= 0) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST, "audio needs 1..255 channels and a positive rate");
        }
        int n = pcm.remaining();
        if (n % (2 * channels) != 0) {
            throw new KazeiaException(ErrorCode.BAD_REQUEST,
                    "PCM of " + n + " bytes is not a whole number of s16 frames of " + channels + " channel(s)");
        }
        int len = 1 + 2 + idb.length + AUDIO_TAIL + n;
        ByteBuffer b = ByteBuffer.allocate(4 + len).order(ByteOrder.BIG_ENDIAN);
        b.putInt(len).put(KIND_AUDIO).putShort((short) idb.length).put(idb).putInt(sampleRate)
                .put((byte) channels).put((byte) (last ? 1 : 0)).put(pcm.duplicate());
        return b.array();
    }

    /** Decode an audio body (after the kind byte); malformed headers give "bad_frame". */
    static Event.Audio decodeAudio(byte[] body, int off, int len) {
        ByteBuffer b = ByteBuffer.wrap(body, off, len).order(ByteOrder.BIG_ENDIAN);
        if (b.remaining() < 2) {
            throw new KazeiaException(ErrorCode.BAD_FRAME, "audio frame without an id length");
        }
        int idLen = Short.toUnsignedInt(b.getShort());
        if (b.remaining() < idLen + AUDIO_TAIL) {
            throw new KazeiaException(ErrorCode.BAD_FRAME, "audio header shorter than its id length says");
        }
        String id;
        try {
            id = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(body, b.position(), idLen)).toString();
        } catch (CharacterCodingException e) {
            throw new KazeiaException(ErrorCode.BAD_FRAME, "audio id is not UTF-8");
        }
        ((Buffer) b).position(b.position() + idLen); // via Buffer: older Android lacks the covariant overload
        long rate = Integer.toUnsignedLong(b.getInt());
        int channels = Byte.toUnsignedInt(b.get());
        int flags = Byte.toUnsignedInt(b.get());
        if (rate == 0 || channels == 0 || rate > Integer.MAX_VALUE) {
            throw new KazeiaException(ErrorCode.BAD_FRAME, "audio frame with a zero (or absurd) rate or no channel");
        }
        if (b.remaining() % (2 * channels) != 0) {
            throw new KazeiaException(ErrorCode.BAD_FRAME, "audio PCM is not a whole number of s16 frames");
        }
        byte[] pcm = new byte[b.remaining()];
        b.get(pcm);
        return new Event.Audio(id, (int) rate, channels, (flags & 1) == 1, ByteBuffer.wrap(pcm));
    }
}
