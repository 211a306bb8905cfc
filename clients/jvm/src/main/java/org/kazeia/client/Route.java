// Why: what the reader thread needs from an open request to hand it its events: which event
// ends it, where events go, and how it ends when the connection drops.
package org.kazeia.client;

interface Route {
    /** Whether {@code e} is this request's last event (the reader then forgets the id first). */
    boolean isFinal(Event e);

    /** Called on the reader thread, in arrival order. */
    void deliver(Event e);

    /** The connection ended before the final event: end the request with this error. */
    void fail(KazeiaException e);
}
