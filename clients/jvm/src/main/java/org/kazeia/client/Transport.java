// Why: the byte stream under the protocol, so the same Client runs over a JVM
// SocketChannel (UnixTransport) or Android's LocalSocket (src/android), or a test double.
package org.kazeia.client;

import java.io.IOException;

/**
 * A connected, bidirectional byte stream. {@link #read} is called by one reader thread only;
 * {@link #write} by one thread at a time (the Client serializes writers), which may be an
 * application thread with its interrupt flag set: an interrupt must not close the stream (as an
 * InterruptibleChannel's does) nor cut a frame short; keep the flag as it was. {@link #close} may
 * be called from any thread, more than once, and must make a blocked {@link #read} return or throw.
 */
public interface Transport extends AutoCloseable {
    /** Read up to {@code len} bytes; blocks until at least one; -1 at end of stream. */
    int read(byte[] buf, int off, int len) throws IOException;

    /** Write all {@code len} bytes. */
    void write(byte[] buf, int off, int len) throws IOException;

    /** Close both directions; never throws. */
    @Override
    void close();
}
