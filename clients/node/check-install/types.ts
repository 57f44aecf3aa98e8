// Compiled with `tsc --noEmit` in a scratch project that installed the packed package
// (../../test.sh): the declarations describe index.js as a purchase API uses it.
import { createServer } from "node:http";
import { SecretError, Verifier, entryTokenGate, type Claims, type GateRequest, type Reason, type Verdict } from "vq-entry-token";

const verifier: Verifier = Verifier.fromEnv({ VQ_TOKEN_SECRET: "x".repeat(40) });
const rotated = new Verifier(new Uint8Array(32), { previous: "y".repeat(40) });
const v: Verdict = verifier.verify("LIMITED_DROP", "42", "7", "token", 1767225300);
if (v.valid) {
  const claims: Claims = v.claims;
  const id: bigint = claims.id;
  const key: "current" | "previous" = v.key;
  void [id, key, claims.user.toUpperCase(), claims.expiresAt];
} else {
  const reason: Reason = v.reason;
  void [reason, v.detail.length];
}
rotated.verify("limited-drop", 42n, 7, undefined);
// @ts-expect-error a verdict has no reason until it is known to be invalid
void v.reason;
// @ts-expect-error the target id is a string, a number or a bigint
verifier.verify("LIMITED_DROP", { id: 42 }, "7", "token");

interface ShopRequest extends GateRequest {
  params: { dropId: string };
}
const gate = entryTokenGate<ShopRequest>(verifier, { target: (req) => ["LIMITED_DROP", req.params.dropId] });
createServer((req, res) => {
  const shop: ShopRequest = Object.assign(req, { params: { dropId: "42" } });
  gate(shop, res, (err) => {
    if (err) throw err;
    void shop.entryToken?.claims.user;
  });
});
try {
  new Verifier("short");
} catch (e) {
  if (e instanceof SecretError) {
    const why: "too_short" | "whitespace" | "low_entropy" | "previous_is_current" | "missing" = e.reason;
    void why;
  }
}
