// Why: the one exception type of the library. Unchecked (Kotlin-friendly), it carries the
// protocol's error code as a string, so codes the daemon adds later are kept, not lost.
package org.kazeia.client;

public class KazeiaException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final String code;
    private final String requestId;

    public KazeiaException(String code, String message) {
        this(code, message, null, null);
    }

    public KazeiaException(String code, String message, String requestId, Throwable cause) {
        super("[" + code + "] " + message, cause);
        this.code = code;
        this.requestId = requestId;
    }

    /** The error code: one of {@link ErrorCode}'s, or a newer one the daemon sent. */
    public String code() {
        return code;
    }

    /** The request it is about, or null for connection-level errors. */
    public String requestId() {
        return requestId;
    }

    /** True when the connection is gone and a new {@link Client} is needed. */
    public boolean connectionLost() {
        return ErrorCode.closesConnection(code);
    }

    /** The same error, about request {@code id}. */
    KazeiaException forRequest(String id) {
        return new KazeiaException(code, messageOnly(), id, getCause());
    }

    /** The message without the "[code] " prefix. */
    public String messageOnly() {
        String m = getMessage();
        String prefix = "[" + code + "] ";
        return m != null && m.startsWith(prefix) ? m.substring(prefix.length()) : m;
    }
}
