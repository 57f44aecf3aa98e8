package vq.token;

/**
 * {@code java -cp … vq.token.VerifyCli TYPE ID USER TOKEN}: the verdict on one line, keys from the
 * environment as vq reads them; exit 0 valid, 1 invalid, 2 usage.
 */
public final class VerifyCli {
    private VerifyCli() {}

    public static void main(String[] args) {
        if (args.length != 4) {
            System.err.println("usage: VerifyCli TYPE ID USER TOKEN");
            System.exit(2);
        }
        EntryTokenVerifier.Verdict v = EntryTokenVerifier.fromEnv().verify(args[0], args[1], args[2], args[3]);
        if (v.isValid()) {
            EntryTokenVerifier.Claims c = v.claims();
            System.out.println("valid key=" + v.key().name().toLowerCase(java.util.Locale.ROOT) + " target=" + c.type() + ":"
                    + c.idString() + " user=" + c.userString() + " expiresAt=" + c.expiresAtString());
        } else {
            System.out.println(v.reason().name().toLowerCase(java.util.Locale.ROOT) + ": " + v.detail());
        }
        System.exit(v.isValid() ? 0 : 1);
    }
}
