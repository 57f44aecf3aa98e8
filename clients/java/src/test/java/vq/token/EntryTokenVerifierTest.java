package vq.token;

import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletOutputStream;
import jakarta.servlet.WriteListener;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.ByteArrayOutputStream;
import java.lang.reflect.Proxy;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * The shared vectors (../test-vectors.json: vq's own verdicts) and the servlet filter. A plain
 * runner (no JUnit to fetch): {@code java … vq.token.EntryTokenVerifierTest path/to/test-vectors.json}
 * exits 1 naming every failed check.
 */
public final class EntryTokenVerifierTest {
    private static final List<String> failures = new ArrayList<>();
    private static int checks;

    static void check(boolean ok, String what) {
        checks++;
        if (!ok) {
            failures.add(what);
        }
    }

    static void equal(Object expected, Object actual, String what) {
        check(Objects.equals(expected, actual), what + ": expected " + expected + ", got " + actual);
    }

    public static void main(String[] args) throws Exception {
        @SuppressWarnings("unchecked")
        Map<String, Object> vectors = (Map<String, Object>) new Json(Files.readString(Paths.get(args[0]))).value();
        sharedVectors(vectors);
        secretRules(vectors);
        fromEnv(vectors);
        userIds(vectors);
        filter(vectors);
        failures.forEach(f -> System.out.println("FAIL " + f));
        System.out.println(checks + " checks, " + failures.size() + " failed");
        System.exit(failures.isEmpty() ? 0 : 1);
    }

    @SuppressWarnings("unchecked")
    static Map<String, String> secrets(Map<String, Object> v) {
        return (Map<String, String>) v.get("secrets");
    }

    static EntryTokenVerifier verifierFor(Map<String, Object> v, List<?> keys) {
        Map<String, String> s = secrets(v);
        return EntryTokenVerifier.of(s.get("current"), keys.contains("previous") ? s.get("previous") : null);
    }

    @SuppressWarnings("unchecked")
    static void sharedVectors(Map<String, Object> v) {
        List<Object> cases = (List<Object>) v.get("cases");
        check(cases.size() > 40, "the vectors file lost its cases");
        for (Object o : cases) {
            Map<String, Object> c = (Map<String, Object>) o;
            Map<String, String> e = (Map<String, String>) c.get("expect");
            String name = (String) c.get("name");
            Map<String, Object> expected = new LinkedHashMap<>();
            for (String k : new String[] {"verdict", "detail", "key", "claims"}) {
                if (c.containsKey(k)) {
                    expected.put(k, c.get(k));
                }
            }
            Map<String, Object> ours = new LinkedHashMap<>();
            try {
                EntryTokenVerifier.Verdict verdict = verifierFor(v, (List<?>) c.get("keys"))
                        .verify(e.get("type"), e.get("id"), e.get("user"), (String) c.get("token"),
                                Long.parseLong((String) c.get("now")));
                if (verdict.isValid()) {
                    EntryTokenVerifier.Claims cl = verdict.claims();
                    ours.put("verdict", "valid");
                    ours.put("key", verdict.key().name().toLowerCase(Locale.ROOT));
                    Map<String, Object> claims = new HashMap<>();
                    claims.put("type", cl.type());
                    claims.put("id", cl.idString());
                    claims.put("user", cl.userString());
                    claims.put("expiresAt", cl.expiresAtString());
                    ours.put("claims", claims);
                } else {
                    ours.put("verdict", verdict.reason().name().toLowerCase(Locale.ROOT));
                    ours.put("detail", verdict.detail());
                }
            } catch (IllegalArgumentException ex) {
                // The caller's error: vq's ParseError text need not be copied.
                ours.put("verdict", "invalid_target");
                ours.put("detail", expected.get("detail"));
            }
            equal(expected, ours, name);
        }
    }

    @SuppressWarnings("unchecked")
    static void secretRules(Map<String, Object> v) {
        for (Object o : (List<Object>) v.get("secretRules")) {
            Map<String, String> rule = (Map<String, String>) o;
            String verdict = "accepted";
            try {
                EntryTokenVerifier.of(rule.get("secret"));
            } catch (EntryTokenVerifier.SecretException e) {
                verdict = e.reason();
            }
            equal(rule.get("verdict"), verdict, "secret rule " + rule.get("name"));
        }
        String cur = secrets(v).get("current");
        try {
            EntryTokenVerifier.of(cur, cur);
            check(false, "a previous secret equal to the current one is refused");
        } catch (EntryTokenVerifier.SecretException e) {
            equal("previous_is_current", e.reason(), "previous equal to current");
        }
        check(!EntryTokenVerifier.of(cur).toString().contains(cur), "toString never prints the secret");
    }

    @SuppressWarnings("unchecked")
    static void fromEnv(Map<String, Object> v) throws Exception {
        Path old = Files.createTempFile("vq-java-", ".secret");
        try {
            Files.write(old, (secrets(v).get("previous") + "\r\n\n").getBytes(StandardCharsets.UTF_8));
            Map<String, String> env = new HashMap<>();
            env.put("VQ_TOKEN_SECRET", secrets(v).get("current"));
            env.put("VQ_TOKEN_SECRET_PREVIOUS_FILE", old.toString());
            for (Object o : (List<Object>) v.get("cases")) {
                Map<String, Object> c = (Map<String, Object>) o;
                if (c.get("name").equals("signed with the previous key, during a rotation")) {
                    EntryTokenVerifier.Verdict verdict = EntryTokenVerifier.fromEnv(env)
                            .verify("LIMITED_DROP", "42", "7", (String) c.get("token"), Long.parseLong((String) c.get("now")));
                    equal(EntryTokenVerifier.KeyUsed.PREVIOUS, verdict.key(), "fromEnv reads the previous key's file");
                }
            }
        } finally {
            Files.delete(old);
        }
        try {
            EntryTokenVerifier.fromEnv(Collections.emptyMap());
            check(false, "fromEnv without VQ_TOKEN_SECRET throws");
        } catch (EntryTokenVerifier.SecretException e) {
            equal("missing", e.reason(), "fromEnv without a secret");
        }
    }

    static void userIds(Map<String, Object> v) throws Exception {
        EntryTokenVerifier verifier = verifierFor(v, List.of());
        String token = mint(secrets(v).get("current"), "LIMITED_DROP|42|7|1767225600");
        long now = 1767225300L;
        // vq's is_user_id_byte: ASCII letters, digits and - _ . : @ +. Every other ASCII character,
        // in the middle of an id, makes it no user id; each allowed one makes it another user's.
        String allowed = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:@+";
        for (char c = 0; c < 128; c++) {
            EntryTokenVerifier.Reason want = allowed.indexOf(c) >= 0
                    ? EntryTokenVerifier.Reason.WRONG_USER : EntryTokenVerifier.Reason.NO_USER;
            equal(want, verifier.verify("LIMITED_DROP", "42", "a" + c + "b", token, now).reason(), "user id with byte " + (int) c);
        }
        equal(EntryTokenVerifier.Reason.WRONG_USER, verifier.verify("LIMITED_DROP", "42", "u".repeat(128), token, now).reason(),
                "a user id of 128 characters");
        equal(EntryTokenVerifier.Reason.NO_USER, verifier.verify("LIMITED_DROP", "42", "u".repeat(129), token, now).reason(),
                "a user id of 129 characters");
        equal(EntryTokenVerifier.Reason.NO_USER, verifier.verify("LIMITED_DROP", "42", null, token, now).reason(), "no user id");
        equal(EntryTokenVerifier.Reason.NO_USER, verifier.verify("LIMITED_DROP", "42", "\u0667", token, now).reason(),
                "an Arabic-Indic 7 is no user id");
        String bad = mint(secrets(v).get("current"), "LIMITED_DROP|42|a/b|1767225600");
        equal("the entry token is malformed: bad user id", verifier.verify("LIMITED_DROP", "42", "7", bad, now).detail(),
                "a token's user id outside the rule");
        EntryTokenVerifier.Verdict ok = verifier.verify("LIMITED_DROP", "42", "7", token, now);
        equal("7", ok.claims().user(), "claims().user() is the string");
        equal("7", ok.claims().userString(), "userString() is the same");
    }

    static String mint(String secret, String payload) throws Exception {
        Mac mac = Mac.getInstance("HmacSHA256");
        mac.init(new SecretKeySpec(secret.getBytes(StandardCharsets.UTF_8), "HmacSHA256"));
        java.util.Base64.Encoder b64 = java.util.Base64.getUrlEncoder().withoutPadding();
        byte[] p = payload.getBytes(StandardCharsets.UTF_8);
        return b64.encodeToString(p) + "." + b64.encodeToString(mac.doFinal(p));
    }

    /** One request through the filter: [status, body, passed?]. */
    static Object[] exchange(EntryTokenFilter f, String path, Map<String, List<String>> headers) throws Exception {
        Map<String, Object> attributes = new HashMap<>();
        HttpServletRequest req = (HttpServletRequest) Proxy.newProxyInstance(
                EntryTokenVerifierTest.class.getClassLoader(), new Class<?>[] {HttpServletRequest.class}, (p, m, a) -> {
                    switch (m.getName()) {
                        case "getServletPath": return path;
                        case "getPathInfo": return null;
                        case "getHeader": {
                            List<String> vs = headers.getOrDefault(((String) a[0]).toLowerCase(Locale.ROOT), List.of());
                            return vs.isEmpty() ? null : vs.get(0);
                        }
                        case "getHeaders":
                            return Collections.enumeration(headers.getOrDefault(((String) a[0]).toLowerCase(Locale.ROOT), List.of()));
                        case "setAttribute": attributes.put((String) a[0], a[1]); return null;
                        default: throw new UnsupportedOperationException(m.getName());
                    }
                });
        int[] status = {200};
        ByteArrayOutputStream body = new ByteArrayOutputStream();
        ServletOutputStream out = new ServletOutputStream() {
            @Override public boolean isReady() { return true; }
            @Override public void setWriteListener(WriteListener l) {}
            @Override public void write(int b) { body.write(b); }
        };
        HttpServletResponse res = (HttpServletResponse) Proxy.newProxyInstance(
                EntryTokenVerifierTest.class.getClassLoader(), new Class<?>[] {HttpServletResponse.class}, (p, m, a) -> {
                    switch (m.getName()) {
                        case "setStatus": status[0] = (Integer) a[0]; return null;
                        case "getOutputStream": return out;
                        case "setContentType": case "setContentLength": return null;
                        default: throw new UnsupportedOperationException(m.getName());
                    }
                });
        boolean[] passed = {false};
        FilterChain chain = (rq, rs) -> passed[0] = true;
        f.doFilter(req, res, chain);
        return new Object[] {status[0], body.toString(StandardCharsets.UTF_8), passed[0], attributes.get(EntryTokenFilter.VERDICT_ATTRIBUTE)};
    }

    static Map<String, List<String>> headers(String... kv) {
        Map<String, List<String>> h = new HashMap<>();
        for (int i = 0; i < kv.length; i += 2) {
            h.computeIfAbsent(kv[i].toLowerCase(Locale.ROOT), k -> new ArrayList<>()).add(kv[i + 1]);
        }
        return h;
    }

    static void filter(Map<String, Object> v) throws Exception {
        String current = secrets(v).get("current");
        EntryTokenFilter f = new EntryTokenFilter(EntryTokenVerifier.of(current), "LIMITED_DROP", "/limited-drops/{id}/orders");
        String token = mint(current, "LIMITED_DROP|42|7|" + (System.currentTimeMillis() / 1000 + 60));
        Object[] ok = exchange(f, "/limited-drops/42/orders", headers("X-User-Id", "7", "X-Entry-Token", token));
        equal(true, ok[2], "a valid token passes");
        check(ok[3] instanceof EntryTokenVerifier.Verdict, "the verdict is a request attribute");
        Object[] other = exchange(f, "/limited-drops/42/orders", headers("X-User-Id", "8", "X-Entry-Token", token));
        equal(403, other[0], "another user's token: status");
        equal("{\"code\":\"QUEUE_BYPASS_DENIED\",\"detail\":\"the entry token belongs to another user\"}", other[1], "another user's token: body");
        equal(false, other[2], "another user's token does not pass");
        for (String spelling : new String[] {"/Limited-Drops/42/ORDERS", "/limited-drops/42/orders/", "/limited-drops/42/orders.json",
                "/limited-drops/42;x=1/orders", "/limited-drops/43/orders"}) {
            Object[] r = exchange(f, spelling, headers("X-User-Id", "7"));
            equal(403, r[0], spelling + " is gated");
        }
        equal(400, exchange(f, "/limited-drops/4x/orders", headers("X-User-Id", "7", "X-Entry-Token", token))[0], "a bad id: 400");
        equal(400, exchange(f, "/limited-drops/42/orders", headers("X-User-Id", "7", "x-user-id", "7", "X-Entry-Token", token))[0],
                "X-User-Id twice: 400");
        // An opaque user id, compared exactly: its upper case is another user.
        String uuid = "3f2a9c1e-7b4d-4c1e-9a8f-2b6c1d0e9f3a";
        String forUuid = mint(current, "LIMITED_DROP|42|" + uuid + "|" + (System.currentTimeMillis() / 1000 + 60));
        Object[] byUuid = exchange(f, "/limited-drops/42/orders", headers("X-User-Id", uuid, "X-Entry-Token", forUuid));
        equal(true, byUuid[2], "a UUID user's token passes");
        equal(uuid, byUuid[3] instanceof EntryTokenVerifier.Verdict ? ((EntryTokenVerifier.Verdict) byUuid[3]).claims().user() : null,
                "the UUID is the claims' user");
        Object[] upper = exchange(f, "/limited-drops/42/orders",
                headers("X-User-Id", uuid.toUpperCase(Locale.ROOT), "X-Entry-Token", forUuid));
        equal(403, upper[0], "the UUID in upper case is another user");
        Object[] elsewhere = exchange(f, "/limited-drops/42", headers());
        equal(true, elsewhere[2], "other paths pass unchecked");
    }

    /** Just enough JSON for the vectors file: objects, arrays, strings, numbers, booleans, null. */
    static final class Json {
        private final String s;
        private int i;

        Json(String s) { this.s = s; }

        Object value() {
            ws();
            char c = s.charAt(i);
            if (c == '{') {
                Map<String, Object> m = new LinkedHashMap<>();
                i++;
                ws();
                if (s.charAt(i) == '}') { i++; return m; }
                do {
                    ws();
                    String k = string();
                    ws();
                    expect(':');
                    m.put(k, value());
                    ws();
                } while (s.charAt(i++) == ',');
                return m;
            }
            if (c == '[') {
                List<Object> l = new ArrayList<>();
                i++;
                ws();
                if (s.charAt(i) == ']') { i++; return l; }
                do { l.add(value()); ws(); } while (s.charAt(i++) == ',');
                return l;
            }
            if (c == '"') return string();
            if (s.startsWith("true", i)) { i += 4; return true; }
            if (s.startsWith("false", i)) { i += 5; return false; }
            if (s.startsWith("null", i)) { i += 4; return null; }
            int start = i;
            while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) i++;
            return Double.parseDouble(s.substring(start, i));
        }

        private String string() {
            expect('"');
            StringBuilder b = new StringBuilder();
            while (true) {
                char c = s.charAt(i++);
                if (c == '"') return b.toString();
                if (c != '\\') { b.append(c); continue; }
                char e = s.charAt(i++);
                switch (e) {
                    case 'n': b.append('\n'); break;
                    case 't': b.append('\t'); break;
                    case 'r': b.append('\r'); break;
                    case 'b': b.append('\b'); break;
                    case 'f': b.append('\f'); break;
                    case 'u': b.append((char) Integer.parseInt(s.substring(i, i + 4), 16)); i += 4; break;
                    default: b.append(e);
                }
            }
        }

        private void expect(char c) {
            if (s.charAt(i++) != c) throw new IllegalArgumentException("expected " + c + " at " + (i - 1));
        }

        private void ws() {
            while (i < s.length() && Character.isWhitespace(s.charAt(i))) i++;
        }
    }
}
