// Why: the JVM transport: a Unix stream socket through SocketChannel + UnixDomainSocketAddress
// (Java 16+), no native code. Writes go through a thread of its own: a SocketChannel is
// interruptible, so a write from a thread with its interrupt flag set (Future.cancel(true),
// shutdownNow) closed the socket, and with it every request of the Client.
package org.kazeia.client;

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.RejectedExecutionException;

public final class UnixTransport implements Transport {
    private final SocketChannel ch;
    /** The one thread that writes to {@link #ch}: no caller ever interrupts it. */
    private final ExecutorService writer = Executors.newSingleThreadExecutor(r -> {
        Thread t = new Thread(r, "kazeia-writer");
        t.setDaemon(true);
        return t;
    });

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

    /**
     * Write on the writer thread and wait for it, through interrupts: an interrupt of the caller
     * neither closes the socket nor cuts a frame in half (the rest of the stream would be out of
     * step). The flag is set again on return, for the caller's next blocking call to see.
     */
    @Override
    public void write(byte[] buf, int off, int len) throws IOException {
        Future<?> done;
        try {
            done = writer.submit(() -> {
                ByteBuffer b = ByteBuffer.wrap(buf, off, len);
                while (b.hasRemaining()) {
                    ch.write(b);
                }
                return null;
            });
        } catch (RejectedExecutionException e) {
            throw new IOException("the transport is closed", e);
        }
        boolean interrupted = false;
        try {
            while (true) {
                try {
                    done.get();
                    return;
                } catch (InterruptedException e) {
                    interrupted = true;
                } catch (ExecutionException e) {
                    Throwable t = e.getCause();
                    if (t instanceof IOException) {
                        throw (IOException) t;
                    }
                    throw new IOException(String.valueOf(t), t);
                }
            }
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    @Override
    public void close() {
        writer.shutdown();
        try {
            ch.close(); // a write blocked on a full socket ends with AsynchronousCloseException
        } catch (IOException ignored) {
            // closing twice or a reset peer: the socket is gone either way
        }
    }
}
