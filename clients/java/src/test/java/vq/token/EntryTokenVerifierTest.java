package vq.token;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.DynamicTest.dynamicTest;

import com.fasterxml.jackson.core.type.TypeReference;
import com.fasterxml.jackson.databind.ObjectMapper;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletOutputStream;
import jakarta.servlet.WriteListener;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
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
import java.util.stream.Stream;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * The shared vectors (../test-vectors.json: vq's own verdicts, path in the system property
 * {@code vq.vectors}, which the pom sets) and the servlet filter.
 */
class EntryTokenVerifierTest {
    private static Map<String, Object> vectors;

    @BeforeAll
    static void readVectors() throws IOException {
        Path path = Paths.get(System.getProperty("vq.vectors", "../test-vectors.json"));
        vectors = new ObjectMapper().readValue(path.toFile(), new TypeReference<Map<String, Object>>() {});
    }

    @SuppressWarnings("unchecked")
    static Map<String, String> secrets() {
        return (Map<String, String>) vectors.get("secrets");
    }

    @SuppressWarnings("unchecked")
    static List<Map<String, Object>> cases() {
        return (List<Map<String, Object>>) vectors.get("cases");
    }

    static EntryTokenVerifier verifierFor(List<?> keys) {
        Map<String, String> s = secrets();
        return EntryTokenVerifier.of(s.get("current"), keys.contains("previous") ? s.get("previous") : null);
    }

    @Test
    void theVectorsFileKeepsItsCases() {
        assertTrue(cases().size() > 40, "the vectors file lost its cases");
    }

    /** One test per shared case: the verdict (and detail, key, claims) vq gives. */
    @TestFactory
    Stream<DynamicTest> sharedVectors() {
        return cases().stream().map(c -> dynamicTest((String) c.get("name"), () -> {
            Map<String, Object> expected = new LinkedHashMap<>();
            for (String k : new String[] {"verdict", "detail", "key", "claims"}) {
                if (c.containsKey(k)) {
                    expected.put(k, c.get(k));
                }
            }
            assertEquals(expected, verdictOf(c), (String) c.get("name"));
        }));
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> verdictOf(Map<String, Object> c) {
        Map<String, String> e = (Map<String, String>) c.get("expect");
        Map<String, Object> ours = new LinkedHashMap<>();
        try {
            EntryTokenVerifier.Verdict verdict = verifierFor((List<?>) c.get("keys"))
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
            ours.put("detail", c.get("detail"));
        }
        return ours;
    }

    /** Each secret vq refuses at start, refused with the same reason. */
    @TestFactory
    @SuppressWarnings("unchecked")
    Stream<DynamicTest> secretRules() {
        return ((List<Map<String, String>>) vectors.get("secretRules")).stream().map(rule ->
                dynamicTest("secret rule " + rule.get("name"), () -> {
                    String verdict = "accepted";
                    try {
                        EntryTokenVerifier.of(rule.get("secret"));
                    } catch (EntryTokenVerifier.SecretException e) {
                        verdict = e.reason();
                    }
                    assertEquals(rule.get("verdict"), verdict);
                }));
    }

    @Test
    void aPreviousSecretEqualToTheCurrentOneIsRefused() {
        String cur = secrets().get("current");
        EntryTokenVerifier.SecretException e =
                assertThrows(EntryTokenVerifier.SecretException.class, () -> EntryTokenVerifier.of(cur, cur));
        assertEquals("previous_is_current", e.reason());
    }

    @Test
    void toStringNeverPrintsTheSecret() {
        String cur = secrets().get("current");
        assertTrue(!EntryTokenVerifier.of(cur).toString().contains(cur));
    }

    @Test
    void fromEnvReadsThePreviousKeysFile() throws Exception {
        Path old = Files.createTempFile("vq-java-", ".secret");
        try {
            Files.write(old, (secrets().get("previous") + "\r\n\n").getBytes(StandardCharsets.UTF_8));
            Map<String, String> env = new HashMap<>();
            env.put("VQ_TOKEN_SECRET", secrets().get("current"));
            env.put("VQ_TOKEN_SECRET_PREVIOUS_FILE", old.toString());
            Map<String, Object> c = cases().stream()
                    .filter(x -> x.get("name").equals("signed with the previous key, during a rotation"))
                    .findFirst().orElseThrow();
            EntryTokenVerifier.Verdict verdict = EntryTokenVerifier.fromEnv(env)
                    .verify("LIMITED_DROP", "42", "7", (String) c.get("token"), Long.parseLong((String) c.get("now")));
            assertEquals(EntryTokenVerifier.KeyUsed.PREVIOUS, verdict.key());
        } finally {
            Files.delete(old);
        }
    }

    @Test
    void fromEnvWithoutASecretThrows() {
        EntryTokenVerifier.SecretException e = assertThrows(EntryTokenVerifier.SecretException.class,
                () -> EntryTokenVerifier.fromEnv(Collections.emptyMap()));
        assertEquals("missing", e.reason());
    }

    @Test
    void userIdsFollowVqsRule() throws Exception {
        EntryTokenVerifier verifier = verifierFor(List.of());
        String token = mint(secrets().get("current"), "LIMITED_DROP|42|7|1767225600");
        long now = 1767225300L;
        // vq's is_user_id_byte: ASCII letters, digits and - _ . : @ +. Every other ASCII character,
        // in the middle of an id, makes it no user id; each allowed one makes it another user's.
        String allowed = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:@+";
        for (char c = 0; c < 128; c++) {
            EntryTokenVerifier.Reason want = allowed.indexOf(c) >= 0
                    ? EntryTokenVerifier.Reason.WRONG_USER : EntryTokenVerifier.Reason.NO_USER;
            assertEquals(want, verifier.verify("LIMITED_DROP", "42", "a" + c + "b", token, now).reason(), "user id with byte " + (int) c);
        }
        assertEquals(EntryTokenVerifier.Reason.WRONG_USER, verifier.verify("LIMITED_DROP", "42", "u".repeat(128), token, now).reason(),
                "a user id of 128 characters");
        assertEquals(EntryTokenVerifier.Reason.NO_USER, verifier.verify("LIMITED_DROP", "42", "u".repeat(129), token, now).reason(),
                "a user id of 129 characters");
        assertEquals(EntryTokenVerifier.Reason.NO_USER, verifier.verify("LIMITED_DROP", "42", null, token, now).reason(), "no user id");
        assertEquals(EntryTokenVerifier.Reason.NO_USER, verifier.verify("LIMITED_DROP", "42", "\u0667", token, now).reason(),
                "an Arabic-Indic 7 is no user id");
        String bad = mint(secrets().get("current"), "LIMITED_DROP|42|a/b|1767225600");
        assertEquals("the entry token is malformed: bad user id", verifier.verify("LIMITED_DROP", "42", "7", bad, now).detail(),
                "a token's user id outside the rule");
        EntryTokenVerifier.Verdict ok = verifier.verify("LIMITED_DROP", "42", "7", token, now);
        assertEquals("7", ok.claims().user(), "claims().user() is the string");
        assertEquals("7", ok.claims().userString(), "userString() is the same");
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

    @Test
    void filterGatesTheRouteAsVqDoes() throws Exception {
        String current = secrets().get("current");
        EntryTokenFilter f = new EntryTokenFilter(EntryTokenVerifier.of(current), "LIMITED_DROP", "/limited-drops/{id}/orders");
        String token = mint(current, "LIMITED_DROP|42|7|" + (System.currentTimeMillis() / 1000 + 60));
        Object[] ok = exchange(f, "/limited-drops/42/orders", headers("X-User-Id", "7", "X-Entry-Token", token));
        assertEquals(true, ok[2], "a valid token passes");
        assertTrue(ok[3] instanceof EntryTokenVerifier.Verdict, "the verdict is a request attribute");
        Object[] other = exchange(f, "/limited-drops/42/orders", headers("X-User-Id", "8", "X-Entry-Token", token));
        assertEquals(403, other[0], "another user's token: status");
        assertEquals("{\"code\":\"QUEUE_BYPASS_DENIED\",\"detail\":\"the entry token belongs to another user\"}", other[1], "another user's token: body");
        assertEquals(false, other[2], "another user's token does not pass");
        for (String spelling : new String[] {"/Limited-Drops/42/ORDERS", "/limited-drops/42/orders/", "/limited-drops/42/orders.json",
                "/limited-drops/42;x=1/orders", "/limited-drops/43/orders"}) {
            Object[] r = exchange(f, spelling, headers("X-User-Id", "7"));
            assertEquals(403, r[0], spelling + " is gated");
        }
        assertEquals(400, exchange(f, "/limited-drops/4x/orders", headers("X-User-Id", "7", "X-Entry-Token", token))[0], "a bad id: 400");
        assertEquals(400, exchange(f, "/limited-drops/42/orders", headers("X-User-Id", "7", "x-user-id", "7", "X-Entry-Token", token))[0],
                "X-User-Id twice: 400");
        // An opaque user id, compared exactly: its upper case is another user.
        String uuid = "3f2a9c1e-7b4d-4c1e-9a8f-2b6c1d0e9f3a";
        String forUuid = mint(current, "LIMITED_DROP|42|" + uuid + "|" + (System.currentTimeMillis() / 1000 + 60));
        Object[] byUuid = exchange(f, "/limited-drops/42/orders", headers("X-User-Id", uuid, "X-Entry-Token", forUuid));
        assertEquals(true, byUuid[2], "a UUID user's token passes");
        assertEquals(uuid, byUuid[3] instanceof EntryTokenVerifier.Verdict ? ((EntryTokenVerifier.Verdict) byUuid[3]).claims().user() : null,
                "the UUID is the claims' user");
        Object[] upper = exchange(f, "/limited-drops/42/orders",
                headers("X-User-Id", uuid.toUpperCase(Locale.ROOT), "X-Entry-Token", forUuid));
        assertEquals(403, upper[0], "the UUID in upper case is another user");
        Object[] elsewhere = exchange(f, "/limited-drops/42", headers());
        assertEquals(true, elsewhere[2], "other paths pass unchecked");
    }
}
