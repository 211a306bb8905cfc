// Why: NOT Android. Debian has no android.jar, so clients/jvm/build type-checks the Android
// transport against these stand-ins, which copy only the signatures it uses from the Android
// SDK (android.net.LocalSocket, API 1+). They are never packaged; on a device the real class runs.
package android.net;

import java.io.Closeable;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;

public class LocalSocket implements Closeable {
    public LocalSocket() {
        throw new UnsupportedOperationException("stub");
    }

    public void connect(LocalSocketAddress endpoint) throws IOException {
        throw new UnsupportedOperationException("stub");
    }

    public InputStream getInputStream() throws IOException {
        throw new UnsupportedOperationException("stub");
    }

    public OutputStream getOutputStream() throws IOException {
        throw new UnsupportedOperationException("stub");
    }

    public void shutdownInput() throws IOException {
        throw new UnsupportedOperationException("stub");
    }

    @Override
    public void close() throws IOException {
        throw new UnsupportedOperationException("stub");
    }
}
