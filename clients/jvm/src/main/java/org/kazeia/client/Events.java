// Why: turns a parsed JSON event into its typed record (PROTOCOL.md §5). Unknown types become
// Event.Unknown and unknown error codes stay strings: a newer daemon never crashes this client.
package org.kazeia.client;

import java.util.Collections;
import java.util.Map;

final class Events {
    private Events() {}

    static Event decode(Map<String, Object> m) {
        Fields f = new Fields(m);
        String id = f.optStr("id");
        String type = f.str("type");
        switch (type) {
            case "accepted":
                return new Event.Accepted(id, f.str("pipeline"));
            case "load_progress":
                return new Event.LoadProgress(id, f.str("role"), f.dbl("progress"));
            case "loaded":
                return new Event.Loaded(id, f.str("role"));
            case "unloaded":
                return new Event.Unloaded(id, f.str("role"));
            case "token":
                return new Event.Token(id, f.str("text"));
            case "thinking":
                return new Event.Thinking(id, f.str("text"));
            case "sentence":
                return new Event.Sentence(id, f.str("text"));
            case "verdict":
                return new Event.Verdict(id, f.str("stage"), f.str("label"), f.strings("categories"), f.dbl("ms"));
            case "transcript":
                return new Event.Transcript(id, f.str("text"), f.optStr("language"), f.bool("final", true));
            case "status":
                return new Event.Status(id, StatusReport.from(f.obj("status")));
            case "done":
                return new Event.Done(id, f.str("stop"), Metrics.from(f.obj("metrics")));
            case "error":
                return new Event.Error(id, f.has("code") ? f.str("code") : ErrorCode.UNEXPECTED, f.str("message"),
                        f.bool("final", true));
            default:
                return new Event.Unknown(id, type, Collections.unmodifiableMap(m));
        }
    }
}
