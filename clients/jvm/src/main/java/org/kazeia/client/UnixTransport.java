// Why: the JVM transport: a Unix stream socket through SocketChannel + UnixDomainSocketAddress
// (Java 16+), no native code.
package org.kazeia.client;

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;

public final class UnixTransport implements Transport {
    private final SocketChannel ch;

    private UnixTransport(SocketChannel ch) {
        this.ch = ch;
    }

    /** Connect to the daemon's socket; fails with code "connect_failed". */
    public static UnixTransport connect(Path socket) {
        SocketChannel ch = null;
        try {
            ch = SocketChannel.open(StandardProtocolFamily.UNIX);
            ch.connect(UnixDomainSocketAddress.of(socket));
            return new UnixTransport(ch);
        } catch (IOException | RuntimeException e) {
            if (ch != null) {
                try {
                    ch.close();
                } catch (IOException ignored) {
                    // nothing more to do
                }
            }
            throw new KazeiaException(ErrorCode.CONNECT_FAILED,
                    "cannot connect to " + socket + ": " + e + " (is `kazeia serve` running?)", null, e);
        }
    }

    @Override
    public int read(byte[] buf, int off, int len) throws IOException {
        return ch.read(ByteBuffer.wrap(buf, off, len));
    }

    @Override
    public void write(byte[] buf, int off, int len) throws IOException {
        ByteBuffer b = ByteBuffer.wrap(buf, off, len);
        while (b.hasRemaining()) {
            ch.write(b);
        }
    }

    @Override
    public void close() {
        try {
            ch.close();
        } catch (IOException ignored) {
            // closing twice or a reset peer: the socket is gone either way
        }
    }
}
