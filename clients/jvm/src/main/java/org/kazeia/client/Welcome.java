// Why: the daemon's answer to hello (PROTOCOL.md §3): what it is and the limits the client
// must keep (max_frame is enforced on every send; the per-uid ones tell an app how many
// connections and running turns it may hold before too_many_connections / too_many_turns).
package org.kazeia.client;

import java.util.List;
import java.util.Map;

public record Welcome(int protocol, String server, List<String> capabilities, Limits limits) {

    /**
     * {@code maxFrame}: largest frame in bytes, kind byte included, length prefix not.
     * {@code queuePerModel}: turns a model role holds beyond the running one before busy.
     * {@code connectionBuffer}: frames waiting for this client before the daemon drops it.
     * {@code maxConnectionsPerUid}, {@code maxTurnsPerUid}: connections and running turns one
     * uid may hold at once (0: not announced, a daemon older than these limits).
     */
    public record Limits(int maxFrame, int queuePerModel, int connectionBuffer, int maxConnectionsPerUid, int maxTurnsPerUid) {}

    static Welcome from(Map<String, Object> m) {
        Fields f = new Fields(m);
        Fields l = new Fields(f.obj("limits"));
        long maxFrame = l.has("max_frame") ? l.num("max_frame") : 1 << 20;
        Limits limits = new Limits(clamp(maxFrame), clamp(l.num("queue_per_model")), clamp(l.num("connection_buffer")),
                clamp(l.num("max_connections_per_uid")), clamp(l.num("max_turns_per_uid")));
        return new Welcome((int) f.num("protocol"), f.str("server"), f.strings("capabilities"), limits);
    }

    private static int clamp(long n) {
        return (int) Math.min(Integer.MAX_VALUE, Math.max(0, n));
    }
}
