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

    /**
     * One configured role. {@code state}: unloaded, loading (with {@code progress}), loaded or
     * failed (with {@code error}). {@code device} and {@code placement}: where the model really
     * runs and why. {@code busy}: engine requests running or queued on the role; {@code turns}:
     * admitted turns using it; {@code generatedTokens}: since it loaded.
     *
     * <p>{@code architecture} (e.g. "llama"; "onnx" for a speech model) and {@code fileBytes}: the
     * model file's.
     * {@code sharesModelWith}: the roles naming the same file (loaded once; empty when none).
     * {@code reservedBytes}: what a loaded role holds against the status' {@code budgetBytes} (an
     * estimate; a shared file counts once); {@code measuredBytes}: the RSS growth measured when it
     * loaded (may be negative; null when another load or an unload ran meanwhile: the process has
     * one RSS). {@code prefixFileBytes}: loaded roles, once written: the size of the file keeping
     * the role's fixed prefix (never a user's words) across loads and restarts. Each is null when the
     * daemon does not give it, except {@code sharesModelWith}: an empty list then.
     */
    public record Model(String role, String state, String file, String device, String placement, long busy,
            long turns, long generatedTokens, Double progress, String error, String architecture, Long fileBytes,
            List<String> sharesModelWith, Long reservedBytes, Long measuredBytes, Long prefixFileBytes,
            Map<String, Object> raw) {}

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
                    g.num("busy"), g.num("turns"), g.num("generated_tokens"), g.optDbl("progress"), g.optStr("error"),
                    g.optStr("architecture"), g.optNum("file_bytes"), g.strings("shares_model_with"), g.optNum("reserved_bytes"),
                    g.optNum("measured_bytes"), g.optNum("prefix_file_bytes"), o));
        }
        return new StatusReport(f.str("server"), (int) f.num("protocol"), f.num("pid"), f.dbl("uptime_s"),
                (int) f.num("connections"), (int) f.num("turns_running"), f.strings("pipelines"), f.num("budget_bytes"),
                f.num("reserved_bytes"), f.str("pressure"), Collections.unmodifiableList(models), m);
    }
}
