// Why: reading fields out of a parsed JSON object, leniently: a missing or mistyped field gives
// a default instead of an exception, so one odd field never costs the client its connection.
package org.kazeia.client;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;

final class Fields {
    private final Map<String, Object> m;

    Fields(Map<String, Object> m) {
        this.m = m == null ? Collections.emptyMap() : m;
    }

    boolean has(String k) {
        return m.get(k) != null;
    }

    /** A boolean field, {@code dflt} when missing or not a boolean. */
    boolean bool(String k, boolean dflt) {
        Object v = m.get(k);
        return v instanceof Boolean ? (Boolean) v : dflt;
    }

    String str(String k) {
        String s = optStr(k);
        return s == null ? "" : s;
    }

    String optStr(String k) {
        Object v = m.get(k);
        return v instanceof String ? (String) v : null;
    }

    long num(String k) {
        Long v = optNum(k);
        return v == null ? 0 : v;
    }

    Long optNum(String k) {
        Object v = m.get(k);
        return v instanceof Number ? ((Number) v).longValue() : null;
    }

    double dbl(String k) {
        Double v = optDbl(k);
        return v == null ? 0 : v;
    }

    Double optDbl(String k) {
        Object v = m.get(k);
        return v instanceof Number ? ((Number) v).doubleValue() : null;
    }

    @SuppressWarnings("unchecked")
    Map<String, Object> obj(String k) {
        Object v = m.get(k);
        return v instanceof Map ? Collections.unmodifiableMap((Map<String, Object>) v) : Collections.emptyMap();
    }

    List<String> strings(String k) {
        List<String> out = new ArrayList<>();
        if (m.get(k) instanceof List) {
            for (Object o : (List<?>) m.get(k)) {
                if (o instanceof String) {
                    out.add((String) o);
                }
            }
        }
        return Collections.unmodifiableList(out);
    }

    @SuppressWarnings("unchecked")
    List<Map<String, Object>> objects(String k) {
        List<Map<String, Object>> out = new ArrayList<>();
        if (m.get(k) instanceof List) {
            for (Object o : (List<?>) m.get(k)) {
                if (o instanceof Map) {
                    out.add(Collections.unmodifiableMap((Map<String, Object>) o));
                }
            }
        }
        return out;
    }
}
