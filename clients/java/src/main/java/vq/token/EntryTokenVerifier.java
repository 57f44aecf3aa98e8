package vq.token;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.util.Base64;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.regex.Pattern;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * Verifies vq entry tokens inside a JVM purchase API, exactly as vq's gate does
 * ({@code src/token.rs}): {@code base64url(payload) "." base64url(HMAC-SHA256(secret, payload))},
 * no padding, payload {@code TYPE|id|user|expiresAtEpochSec}. JDK only; thread-safe.
 *
 * <p>What this cannot do: one-time use of a token and pacing need vq's Redis; only vq's gate
 * (or {@code /gate/verify}) does those.
 *
 * <p>Target ids are unsigned 64-bit values held in a {@code long} ({@link Long#toUnsignedString}).
 * User ids are strings, as vq takes them: 1 to 128 characters, each an ASCII letter, a digit or
 * one of {@code - _ . : @ +}, compared exactly ({@code 007} and {@code 7} are two users).
 */
public final class EntryTokenVerifier {
    static final int MIN_SECRET_LEN = 32;
    static final int MIN_DISTINCT_BYTES = 8;
    private static final Pattern DIGITS = Pattern.compile("[0-9]+");
    /** A target type as vq spells it (any the operator configures): the name in tokens, the slug in URLs. */
    private static final Pattern TYPE_NAME = Pattern.compile("[A-Z][A-Z0-9]*(_[A-Z0-9]+)*");
    private static final Pattern TYPE_SLUG = Pattern.compile("[a-z][a-z0-9]*(-[a-z0-9]+)*");
    private static final int MAX_TYPE_LEN = 32;
    private static final Pattern EXPIRY = Pattern.compile("\\+?[0-9]+");
    private static final Pattern B64URL = Pattern.compile("[A-Za-z0-9_-]*");
    /**
     * A user id as vq takes it ({@code src/domain/target.rs}, {@code is_user_id_byte}): none of its
     * characters is {@code |}, so the payload's four fields stay unambiguous. Spelt out (no
     * {@code \w}), so no non-ASCII letter or digit matches; used with {@code matches()}, whole.
     */
    private static final Pattern USER_ID = Pattern.compile("[A-Za-z0-9._:@+-]{1,128}");
    static final String NO_USER =
            "X-User-Id is missing or not a user id: expected 1 to 128 characters, each a letter, a digit or one of - _ . : @ +";

    /** Why a token is refused; {@link Verdict#detail()} is vq's text. */
    public enum Reason { MISSING, NO_USER, MALFORMED, BAD_SIGNATURE, EXPIRED, WRONG_TYPE, WRONG_TARGET, WRONG_USER }

    /** Which key signed a valid token. */
    public enum KeyUsed { CURRENT, PREVIOUS }

    /** What a token says, once decoded. The target id and expiry are unsigned 64-bit; the user id is a string. */
    public static final class Claims {
        private final String type;
        private final long id, expiresAt;
        private final String user;

        Claims(String type, long id, String user, long expiresAt) {
            this.type = type;
            this.id = id;
            this.user = user;
            this.expiresAt = expiresAt;
        }

        public String type() { return type; }
        public long id() { return id; }
        /** The user id as the token holds it (any vq user id: {@code 7}, a UUID, …). */
        public String user() { return user; }
        public long expiresAt() { return expiresAt; }
        public String idString() { return Long.toUnsignedString(id); }
        /** The same as {@link #user()} (kept from when user ids were numbers). */
        public String userString() { return user; }
        public String expiresAtString() { return Long.toUnsignedString(expiresAt); }
    }

    /** Valid (with the claims and the key that signed), or the reason and vq's detail text. */
    public static final class Verdict {
        private final Reason reason;
        private final String detail;
        private final Claims claims;
        private final KeyUsed key;

        private Verdict(Reason reason, String detail, Claims claims, KeyUsed key) {
            this.reason = reason;
            this.detail = detail;
            this.claims = claims;
            this.key = key;
        }

        static Verdict refuse(Reason reason, String detail) { return new Verdict(reason, detail, null, null); }

        public boolean isValid() { return reason == null; }
        /** Null when valid. */
        public Reason reason() { return reason; }
        /** vq's text for the refusal (the {@code detail} of its 403); null when valid. */
        public String detail() { return detail; }
        /** Null unless valid. */
        public Claims claims() { return claims; }
        /** Null unless valid. */
        public KeyUsed key() { return key; }
    }

    /** A secret vq would refuse at start; {@link #reason()} says which rule. */
    public static final class SecretException extends IllegalArgumentException {
        private static final long serialVersionUID = 1L;
        private final String reason;

        SecretException(String reason, String message) {
            super(message);
            this.reason = reason;
        }

        /** too_short, whitespace, low_entropy, previous_is_current or missing. */
        public String reason() { return reason; }
    }

    private final byte[] current;
    private final byte[] previous;

    private EntryTokenVerifier(byte[] current, byte[] previous) {
        this.current = current;
        this.previous = previous;
    }

    /** The current secret ({@code VQ_TOKEN_SECRET}): its UTF-8 bytes are the key (never base64-decoded). */
    public static EntryTokenVerifier of(String secret) {
        return of(secret.getBytes(StandardCharsets.UTF_8), null);
    }

    /** During a rotation: the current secret and the one being retired ({@code VQ_TOKEN_SECRET_PREVIOUS}). */
    public static EntryTokenVerifier of(String secret, String previous) {
        return of(secret.getBytes(StandardCharsets.UTF_8), previous == null ? null : previous.getBytes(StandardCharsets.UTF_8));
    }

    /** Keys as bytes; {@code previous} may be null. */
    public static EntryTokenVerifier of(byte[] secret, byte[] previous) {
        byte[] cur = checkSecret(secret, "the secret");
        byte[] prev = previous == null ? null : checkSecret(previous, "the previous secret");
        if (prev != null && MessageDigest.isEqual(cur, prev)) {
            throw new SecretException("previous_is_current", "the previous secret equals the current one");
        }
        return new EntryTokenVerifier(cur, prev);
    }

    /**
     * From {@code VQ_TOKEN_SECRET} (or the file named by {@code VQ_TOKEN_SECRET_FILE}, trailing CR/LF
     * dropped) and {@code VQ_TOKEN_SECRET_PREVIOUS(_FILE)}, as vq reads them.
     */
    public static EntryTokenVerifier fromEnv() {
        return fromEnv(System.getenv());
    }

    public static EntryTokenVerifier fromEnv(Map<String, String> env) {
        byte[] secret = readSecret(env, "VQ_TOKEN_SECRET");
        if (secret == null) {
            throw new SecretException("missing", "VQ_TOKEN_SECRET is not set (nor VQ_TOKEN_SECRET_FILE)");
        }
        return of(secret, readSecret(env, "VQ_TOKEN_SECRET_PREVIOUS"));
    }

    private static byte[] readSecret(Map<String, String> env, String name) {
        String value = env.get(name);
        if (value != null && !value.isEmpty()) {
            return value.getBytes(StandardCharsets.UTF_8);
        }
        String file = env.get(name + "_FILE");
        if (file == null || file.isEmpty()) {
            return null;
        }
        byte[] bytes;
        try {
            bytes = Files.readAllBytes(Paths.get(file));
        } catch (IOException e) {
            throw new IllegalStateException(name + "_FILE=" + file + ": cannot read the secret file: " + e.getMessage(), e);
        }
        int end = bytes.length;
        while (end > 0 && (bytes[end - 1] == '\n' || bytes[end - 1] == '\r')) {
            end--;
        }
        byte[] out = new byte[end];
        System.arraycopy(bytes, 0, out, 0, end);
        return out;
    }

    static byte[] checkSecret(byte[] key, String origin) {
        if (key.length < MIN_SECRET_LEN) {
            throw new SecretException("too_short", origin + " is " + key.length + " bytes long: it must be at least 32 bytes");
        }
        boolean allSpace = true;
        Set<Byte> distinct = new HashSet<>();
        for (byte b : key) {
            allSpace &= b == ' ' || b == '\t' || b == '\n' || b == '\f' || b == '\r';
            distinct.add(b);
        }
        if (allSpace) {
            throw new SecretException("whitespace", origin + " is only whitespace");
        }
        if (distinct.size() < MIN_DISTINCT_BYTES) {
            throw new SecretException("low_entropy", origin + " has only " + distinct.size() + " distinct characters (at least 8 needed)");
        }
        return key.clone();
    }

    @Override
    public String toString() {
        return previous == null ? "EntryTokenVerifier(***)" : "EntryTokenVerifier(***, previous ***)";
    }

    /** Every check, against the clock (epoch seconds, as vq reads it). */
    public Verdict verify(String type, String id, String user, String token) {
        return verify(type, id, user, token, System.currentTimeMillis() / 1000);
    }

    /**
     * Every check vq's gate makes, in its order: a user id, a token, well-formed, signed by one of
     * the keys (constant time), unexpired, for this type, target id and user.
     *
     * @param type the target type's name, LIMITED_DROP (or its slug, limited-drop)
     * @param id the target id the request is for, in decimal
     * @param user the buyer's id (X-User-Id): 1 to 128 characters, each an ASCII letter, a digit or
     *        one of {@code - _ . : @ +}, compared exactly; null or not one: {@link Reason#NO_USER}
     * @param token the X-Entry-Token; null or empty: {@link Reason#MISSING}
     * @throws IllegalArgumentException when {@code type} or {@code id} is not one (the caller's error)
     */
    public Verdict verify(String type, String id, String user, String token, long nowEpochSec) {
        String kind = targetType(type);
        if (kind == null) {
            throw new IllegalArgumentException(
                "`" + type + "` is not a target type: expected a slug such as limited-drop or its name, LIMITED_DROP");
        }
        Long targetId = positive(id);
        if (targetId == null) {
            throw new IllegalArgumentException("`" + id + "` is not a positive 64-bit integer id");
        }
        if (!isUserId(user)) {
            return Verdict.refuse(Reason.NO_USER, NO_USER);
        }
        if (token == null || token.isEmpty()) {
            return Verdict.refuse(Reason.MISSING, "no entry token: send the X-Entry-Token header");
        }
        Decoded d;
        try {
            d = decode(token);
        } catch (MalformedToken e) {
            return Verdict.refuse(Reason.MALFORMED, "the entry token is malformed: " + e.getMessage());
        }
        KeyUsed key = keyOf(d.payload, d.sig);
        if (key == null) {
            return Verdict.refuse(Reason.BAD_SIGNATURE, "the entry token's signature does not match");
        }
        Claims c = d.claims;
        if (Long.compareUnsigned(c.expiresAt, nowEpochSec) <= 0) {
            return Verdict.refuse(Reason.EXPIRED, "the entry token expired at " + c.expiresAtString() + " (epoch seconds)");
        }
        if (!c.type.equals(kind)) {
            return Verdict.refuse(Reason.WRONG_TYPE, "the entry token is for " + c.type + ", not " + kind);
        }
        if (c.id != targetId) {
            return Verdict.refuse(Reason.WRONG_TARGET, "the entry token is for " + c.type + ":" + c.idString()
                    + ", not " + kind + ":" + Long.toUnsignedString(targetId));
        }
        if (!c.user.equals(user)) {
            return Verdict.refuse(Reason.WRONG_USER, "the entry token belongs to another user");
        }
        return new Verdict(null, null, c, key);
    }

    private KeyUsed keyOf(byte[] payload, byte[] sig) {
        if (MessageDigest.isEqual(hmac(current, payload), sig)) {
            return KeyUsed.CURRENT;
        }
        if (previous != null && MessageDigest.isEqual(hmac(previous, payload), sig)) {
            return KeyUsed.PREVIOUS;
        }
        return null;
    }

    private static byte[] hmac(byte[] key, byte[] payload) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key, "HmacSHA256"));
            return mac.doFinal(payload);
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("HmacSHA256 is in every JDK", e);
        }
    }

    static String targetType(String type) {
        if (type == null || type.length() > MAX_TYPE_LEN) {
            return null;
        }
        if (TYPE_NAME.matcher(type).matches()) {
            return type;
        }
        if (TYPE_SLUG.matcher(type).matches()) {
            return type.toUpperCase(java.util.Locale.ROOT).replace('-', '_');
        }
        return null;
    }

    /** Whether {@code s} is a user id as vq takes it. */
    static boolean isUserId(String s) {
        return s != null && USER_ID.matcher(s).matches();
    }

    /** vq's target ids: a u64 above 0 in ASCII digits (leading zeros allowed, no sign); null otherwise. */
    static Long positive(String s) {
        if (s == null || !DIGITS.matcher(s).matches()) {
            return null;
        }
        Long n = u64(s);
        return n == null || n == 0 ? null : n;
    }

    /** ASCII digits as an unsigned 64-bit value, null past it (leading zeros may be many). */
    private static Long u64(String digits) {
        int i = 0;
        while (i < digits.length() - 1 && digits.charAt(i) == '0') {
            i++;
        }
        String d = digits.substring(i);
        if (d.length() > 20) {
            return null;
        }
        try {
            return Long.parseUnsignedLong(d);
        } catch (NumberFormatException e) {
            return null;
        }
    }

    private static final class MalformedToken extends Exception {
        private static final long serialVersionUID = 1L;
        MalformedToken(String why) {
            super(why, null, false, false);
        }
    }

    private static final class Decoded {
        final Claims claims;
        final byte[] payload, sig;

        Decoded(Claims claims, byte[] payload, byte[] sig) {
            this.claims = claims;
            this.payload = payload;
            this.sig = sig;
        }
    }

    /**
     * vq's decoder is strict: its alphabet only, no padding, the canonical encoding only (unused
     * bits zero). Java's URL decoder accepts padding and non-zero unused bits.
     */
    private static byte[] base64url(String s) {
        if (!B64URL.matcher(s).matches() || s.length() % 4 == 1) {
            return null;
        }
        byte[] bytes = Base64.getUrlDecoder().decode(s);
        return Base64.getUrlEncoder().withoutPadding().encodeToString(bytes).equals(s) ? bytes : null;
    }

    /**
     * Splits and decodes a token without checking its signature (vq's {@code token::decode}): the
     * one place that knows the payload's fields.
     */
    private static Decoded decode(String raw) throws MalformedToken {
        int dot = raw.indexOf('.');
        if (dot < 0) {
            throw new MalformedToken("no `.` separator");
        }
        byte[] payload = base64url(raw.substring(0, dot));
        if (payload == null) {
            throw new MalformedToken("payload is not base64url");
        }
        byte[] sig = base64url(raw.substring(dot + 1));
        if (sig == null) {
            throw new MalformedToken("signature is not base64url");
        }
        String text;
        try {
            text = StandardCharsets.UTF_8.newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(payload))
                    .toString();
        } catch (CharacterCodingException e) {
            throw new MalformedToken("payload is not text");
        }
        String[] parts = text.split("\\|", -1); // -1: keep trailing empty fields, as Rust does
        if (parts.length != 4) {
            throw new MalformedToken("payload is not TYPE|id|user|expiry");
        }
        if (parts[0].length() > MAX_TYPE_LEN || !TYPE_NAME.matcher(parts[0]).matches()) {
            throw new MalformedToken("bad target type");
        }
        Long id = positive(parts[1]);
        if (id == null) {
            throw new MalformedToken("bad target id");
        }
        if (!isUserId(parts[2])) {
            throw new MalformedToken("bad user id");
        }
        // Any u64 as Rust parses it: a leading + is accepted.
        Long exp = EXPIRY.matcher(parts[3]).matches()
                ? u64(parts[3].startsWith("+") ? parts[3].substring(1) : parts[3]) : null;
        if (exp == null) {
            throw new MalformedToken("bad expiry");
        }
        return new Decoded(new Claims(parts[0], id, parts[2], exp), payload, sig);
    }
}
