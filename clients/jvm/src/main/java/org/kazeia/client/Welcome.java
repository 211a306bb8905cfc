// Why: the daemon's answer to hello (PROTOCOL.md §3): what it is and the limits the client
// must keep (max_frame is enforced on every send).
package org.kazeia.client;

import java.util.List;
import java.util.Map;

public record Welcome(int protocol, String server, List<String> capabilities, Limits limits) {

    /** {@code maxFrame}: largest frame in bytes, kind byte included, length prefix not. */
    public record Limits(int maxFrame, int queuePerModel, int connectionBuffer) {}

    static Welcome from(Map<String, Object> m) {
        Fields f = new Fields(m);
        Fields l = new Fields(f.obj("limits"));
        long maxFrame = l.has("max_frame") ? l.num("max_frame") : 1 << 20;
        Limits limits = new Limits((int) Math.min(Integer.MAX_VALUE, Math.max(0, maxFrame)),
                (int) l.num("queue_per_model"), (int) l.num("connection_buffer"));
        return new Welcome((int) f.num("protocol"), f.str("server"), f.strings("capabilities"), limits);
    }
}
