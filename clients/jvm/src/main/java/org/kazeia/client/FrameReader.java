// Why: reads whole frames from a Transport through a buffer, refusing a frame over the limit
// from its length alone (its body is never read), as the daemon does.
package org.kazeia.client;

import java.io.EOFException;
import java.io.IOException;

final class FrameReader {
    /** One frame: its kind byte and body ({@code body[0..length)}, kind excluded). */
    record Raw(int kind, byte[] body) {}

    private final Transport in;
    private final byte[] buf = new byte[64 * 1024];
    private int pos;
    private int end;

    FrameReader(Transport in) {
        this.in = in;
    }

    /** The next frame, or null when the peer closed cleanly between frames. */
    Raw next(int maxFrame) throws IOException {
        if (!fill(4, true)) {
            return null;
        }
        long len = ((buf[pos] & 0xffL) << 24) | ((buf[pos + 1] & 0xff) << 16) | ((buf[pos + 2] & 0xff) << 8) | (buf[pos + 3] & 0xff);
        pos += 4;
        if (len > maxFrame) {
            throw new KazeiaException(ErrorCode.FRAME_TOO_LARGE,
                    "the daemon sent a frame of " + len + " bytes, over the limit of " + maxFrame);
        }
        if (len == 0) {
            return new Raw(-1, new byte[0]);
        }
        byte[] frame = new byte[(int) len];
        int got = 0;
        while (got < len) {
            if (pos == end && !fill(1, false)) {
                throw new EOFException("connection closed in the middle of a frame");
            }
            int n = Math.min(end - pos, (int) len - got);
            System.arraycopy(buf, pos, frame, got, n);
            pos += n;
            got += n;
        }
        byte[] body = new byte[frame.length - 1];
        System.arraycopy(frame, 1, body, 0, body.length);
        return new Raw(frame[0] & 0xff, body);
    }

    /** Make at least {@code need} bytes available; false on a clean end before any byte (when allowed). */
    private boolean fill(int need, boolean cleanEndOk) throws IOException {
        if (end - pos >= need) {
            return true;
        }
        if (pos > 0) {
            System.arraycopy(buf, pos, buf, 0, end - pos);
            end -= pos;
            pos = 0;
        }
        while (end < need) {
            int n = in.read(buf, end, buf.length - end);
            if (n < 0) {
                if (end == 0 && cleanEndOk) {
                    return false;
                }
                throw new EOFException("connection closed in the middle of a frame");
            }
            end += n;
        }
        return true;
    }
}
