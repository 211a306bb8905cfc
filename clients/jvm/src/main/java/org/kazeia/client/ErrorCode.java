// Why: error codes are stable strings (PROTOCOL.md §6); naming them once lets apps compare
// without typos, while any code the daemon adds later still passes through as a plain string.
package org.kazeia.client;

import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.Set;

/** The protocol's error codes, and the few this library adds for failures on its own side. */
public final class ErrorCode {
    private ErrorCode() {}

    // The daemon's codes (PROTOCOL.md §6).
    public static final String BAD_CONFIG = "bad_config";
    public static final String MODEL_FILE = "model_file";
    public static final String LOAD_FAILED = "load_failed";
    public static final String NO_MODEL = "no_model";
    public static final String CONTEXT_OVERFLOW = "context_overflow";
    public static final String ENGINE = "engine";
    public static final String PIPELINE = "pipeline";
    public static final String BAD_REQUEST = "bad_request";
    public static final String BUSY = "busy";
    public static final String BAD_JSON = "bad_json";
    public static final String UNKNOWN_TYPE = "unknown_type";
    public static final String BAD_FRAME = "bad_frame";
    public static final String FRAME_TOO_LARGE = "frame_too_large";
    public static final String PROTOCOL_VERSION = "protocol_version";
    public static final String HANDSHAKE_REQUIRED = "handshake_required";
    public static final String NO_AUDIO_REQUEST = "no_audio_request";
    public static final String UNKNOWN_REQUEST = "unknown_request";
    public static final String DUPLICATE_ID = "duplicate_id";
    public static final String PERMISSION_DENIED = "permission_denied";
    public static final String SHUTTING_DOWN = "shutting_down";
    public static final String CANCELLED = "cancelled";
    public static final String MEMORY_PRESSURE = "memory_pressure";
    public static final String OVER_BUDGET = "over_budget";
    public static final String TOO_MANY_CONNECTIONS = "too_many_connections";
    public static final String TOO_MANY_TURNS = "too_many_turns";
    /** An audio turn in which the daemon heard no speech. */
    public static final String NO_SPEECH = "no_speech";

    // This library's codes: never sent by the daemon.
    /** The connection ended (daemon gone, socket closed, {@link Client#close()}). */
    public static final String CONNECTION_CLOSED = "connection_closed";
    /** The socket could not be opened. */
    public static final String CONNECT_FAILED = "connect_failed";
    /** Nothing arrived within the configured time. */
    public static final String TIMEOUT = "timeout";
    /**
     * The waiting thread was interrupted (its interrupt flag is set again): the request goes on,
     * the connection stays open. Not {@link #TIMEOUT}, which cancels a turn.
     */
    public static final String INTERRUPTED = "interrupted";
    /** The daemon answered something the protocol does not allow here. */
    public static final String UNEXPECTED = "unexpected";

    /** Every code PROTOCOL.md §6 lists. */
    public static final Set<String> PROTOCOL_CODES = Collections.unmodifiableSet(new HashSet<>(Arrays.asList(BAD_CONFIG, MODEL_FILE, LOAD_FAILED, NO_MODEL,
            CONTEXT_OVERFLOW, ENGINE, PIPELINE, BAD_REQUEST, BUSY, BAD_JSON, UNKNOWN_TYPE, BAD_FRAME,
            FRAME_TOO_LARGE, PROTOCOL_VERSION, HANDSHAKE_REQUIRED, NO_AUDIO_REQUEST, UNKNOWN_REQUEST,
            DUPLICATE_ID, PERMISSION_DENIED, SHUTTING_DOWN, CANCELLED, MEMORY_PRESSURE, OVER_BUDGET,
            TOO_MANY_CONNECTIONS, TOO_MANY_TURNS, NO_SPEECH)));

    /** Whether the daemon closes the connection after this error (or the connection is gone). */
    public static boolean closesConnection(String code) {
        return FRAME_TOO_LARGE.equals(code) || PROTOCOL_VERSION.equals(code) || HANDSHAKE_REQUIRED.equals(code)
                || PERMISSION_DENIED.equals(code) || TOO_MANY_CONNECTIONS.equals(code) || CONNECTION_CLOSED.equals(code);
    }
}
