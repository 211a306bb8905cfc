// Why: what the reader thread needs from an open request to hand it its events: which event
// ends it, where events go, and how it ends when the connection drops.
package org.kazeia.client;

interface Route {
    /** Whether {@code e} is this request's last event (the reader then forgets the id first). */
    boolean isFinal(Event e);

    /**
     * Called on the reader thread, in arrival order, one at a time with {@link #fail} (the
     * Client's lock for the request); a final event only if {@link #fail} did not come first.
     */
    void deliver(Event e);

    /**
     * The connection ended before the final event: end the request with this error. Called on
     * the thread that ended it (the reader, or one calling close()), at most once, never after
     * a final event was delivered.
     */
    void fail(KazeiaException e);
}
