// Why: the Android transport. Android apps cannot use UnixDomainSocketAddress (no Java 16
// java.net on Android), so the app connects with android.net.LocalSocket; the Client on top
// is the same. Built by the app (Gradle/AGP), not by clients/jvm/build: see README.md.
package org.kazeia.client.android;

import android.net.LocalSocket;
import android.net.LocalSocketAddress;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;

import org.kazeia.client.ErrorCode;
import org.kazeia.client.KazeiaException;
import org.kazeia.client.Transport;

/**
 * Usage: {@code Client.connect(LocalSocketTransport.connect("/data/…/engine.sock"), new Options())}.
 * The path is a filesystem socket (Namespace.FILESYSTEM), as the daemon creates it.
 */
public final class LocalSocketTransport implements Transport {
    private final LocalSocket socket;
    private final InputStream in;
    private final OutputStream out;

    private LocalSocketTransport(LocalSocket socket) throws IOException {
        this.socket = socket;
        this.in = socket.getInputStream();
        this.out = socket.getOutputStream();
    }

    /** Connect to the daemon's socket file; fails with code "connect_failed". */
    public static LocalSocketTransport connect(String path) {
        LocalSocket s = new LocalSocket();
        try {
            s.connect(new LocalSocketAddress(path, LocalSocketAddress.Namespace.FILESYSTEM));
            return new LocalSocketTransport(s);
        } catch (IOException | RuntimeException e) {
            try {
                s.close();
            } catch (IOException ignored) {
                // nothing more to do
            }
            throw new KazeiaException(ErrorCode.CONNECT_FAILED, "cannot connect to " + path + ": " + e, null, e);
        }
    }

    @Override
    public int read(byte[] buf, int off, int len) throws IOException {
        return in.read(buf, off, len);
    }

    @Override
    public void write(byte[] buf, int off, int len) throws IOException {
        out.write(buf, off, len);
        out.flush();
    }

    @Override
    public void close() {
        // shutdownInput wakes a reader blocked in read(); close alone may not on every release.
        try {
            socket.shutdownInput();
        } catch (IOException | RuntimeException ignored) {
            // already closed
        }
        try {
            socket.close();
        } catch (IOException ignored) {
            // already closed
        }
    }
}
