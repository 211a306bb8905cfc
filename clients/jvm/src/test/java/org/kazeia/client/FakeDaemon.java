// Why: a scripted stand-in for the daemon on a real Unix socket, so the client's routing,
// limits and failure handling are tested on exact frames the real daemon cannot be made to send.
package org.kazeia.client;

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

final class FakeDaemon implements AutoCloseable {
    /** What the fake does with one accepted connection. */
    interface Script {
        void run(Conn c) throws Exception;
    }

    /** One accepted connection, seen from the daemon's side. */
    static final class Conn {
        final SocketChannel ch;
        private final FrameReader in;

        Conn(SocketChannel ch) {
            this.ch = ch;
            this.in = new FrameReader(new Transport() {
                @Override
                public int read(byte[] b, int off, int len) throws IOException {
                    return ch.read(ByteBuffer.wrap(b, off, len));
                }

                @Override
                public void write(byte[] b, int off, int len) {
                    throw new UnsupportedOperationException();
                }

                @Override
                public void close() {}
            });
        }

        /** The next JSON request (audio frames are returned as {"type":"<audio>",…}). */
        Map<String, Object> read() throws IOException {
            FrameReader.Raw f = in.next(1 << 20);
            if (f == null) {
                return null;
            }
            if (f.kind() == 2) {
                Event.Audio a = Frames.decodeAudio(f.body(), 0, f.body().length);
                Map<String, Object> m = new LinkedHashMap<>();
                m.put("type", "<audio>");
                m.put("id", a.id());
                m.put("bytes", (long) a.pcm().remaining());
                m.put("last", a.last());
                return m;
            }
            return Json.parseObject(f.body(), 0, f.body().length);
        }

        void send(String json) throws IOException {
            byte[] f = Frames.json(Json.parseObject(json.getBytes(), 0, json.getBytes().length));
            write(f);
        }

        void write(byte[] f) throws IOException {
            ByteBuffer b = ByteBuffer.wrap(f);
            while (b.hasRemaining()) {
                ch.write(b);
            }
        }

        /** Read hello, answer welcome with this max_frame. */
        Map<String, Object> welcome(int maxFrame) throws IOException {
            Map<String, Object> hello = read();
            send("{\"type\":\"welcome\",\"protocol\":1,\"server\":\"fake 0\",\"capabilities\":[\"text\"],"
                    + "\"limits\":{\"max_frame\":" + maxFrame + ",\"queue_per_model\":8,\"connection_buffer\":1024}}");
            return hello;
        }
    }

    final Path socket;
    private final Path dir;
    private final ServerSocketChannel server;
    private final Thread thread;
    /** Completes when the script returns (exceptionally if it threw). */
    final CompletableFuture<Void> finished = new CompletableFuture<>();

    FakeDaemon(Script script) throws IOException {
        dir = Files.createTempDirectory("kazeia-fake");
        socket = dir.resolve("fake.sock");
        server = ServerSocketChannel.open(StandardProtocolFamily.UNIX);
        server.bind(UnixDomainSocketAddress.of(socket));
        thread = new Thread(() -> {
            try (SocketChannel ch = server.accept()) {
                script.run(new Conn(ch));
                finished.complete(null);
            } catch (Throwable t) {
                finished.completeExceptionally(t);
            }
        }, "fake-daemon");
        thread.setDaemon(true);
        thread.start();
    }

    /** Wait for the script; rethrow what it threw. */
    void join() throws Exception {
        finished.get(10, TimeUnit.SECONDS);
    }

    @Override
    public void close() throws IOException {
        server.close();
        Files.deleteIfExists(socket);
        Files.deleteIfExists(dir);
    }
}
