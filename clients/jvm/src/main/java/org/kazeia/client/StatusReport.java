// Why: the daemon's state (answer to status, pushes of subscribe; PROTOCOL.md §5), typed for
// the fields an app shows, with the raw object kept for the rest.
package org.kazeia.client;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;

public record StatusReport(
        String server,
        int protocol,
        long pid,
        double uptimeS,
        int connections,
        int turnsRunning,
        List<String> pipelines,
        long budgetBytes,
        long reservedBytes,
        String pressure,
        List<Model> models,
        Map<String, Object> raw) {

    /** One configured role. {@code state}: unloaded, loading, loaded or failed. */
    public record Model(String role, String state, String file, String device, String placement, long busy,
            long turns, long generatedTokens, Double progress, String error, Map<String, Object> raw) {}

    /** The role's entry, or null. */
    public Model model(String role) {
        for (Model m : models) {
            if (m.role().equals(role)) {
                return m;
            }
        }
        return null;
    }

    static StatusReport from(Map<String, Object> m) {
        Fields f = new Fields(m);
        List<Model> models = new ArrayList<>();
        for (Map<String, Object> o : f.objects("models")) {
            Fields g = new Fields(o);
            models.add(new Model(g.str("role"), g.str("state"), g.str("file"), g.optStr("device"), g.optStr("placement"),
                    g.num("busy"), g.num("turns"), g.num("generated_tokens"), g.optDbl("progress"), g.optStr("error"), o));
        }
        return new StatusReport(f.str("server"), (int) f.num("protocol"), f.num("pid"), f.dbl("uptime_s"),
                (int) f.num("connections"), (int) f.num("turns_running"), f.strings("pipelines"), f.num("budget_bytes"),
                f.num("reserved_bytes"), f.str("pressure"), Collections.unmodifiableList(models), m);
    }
}
