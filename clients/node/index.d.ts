// Types of the vq entry-token verifier (index.js). test/types.test-d.ts uses them as a purchase
// API would; ../test.sh checks it with `tsc --noEmit` on the installed package.

import type { IncomingMessage, ServerResponse } from "node:http";

/** Why a token is refused; `detail` says it in vq's words. */
export type Reason =
  | "no_user"
  | "missing"
  | "malformed"
  | "bad_signature"
  | "expired"
  | "wrong_type"
  | "wrong_target"
  | "wrong_user";

/** What a valid token says. */
export interface Claims {
  /** The target type's name, e.g. LIMITED_DROP. */
  type: string;
  /** The target id (an unsigned 64-bit integer). */
  id: bigint;
  /** The user id in the token, as X-User-Id gives it. */
  user: string;
  /** Epoch seconds. */
  expiresAt: bigint;
}

export type Verdict =
  | { valid: true; key: "current" | "previous"; claims: Claims }
  | { valid: false; reason: Reason; detail: string };

/** Why a secret is refused (as `vq serve` refuses it at start). */
export class SecretError extends Error {
  reason: "too_short" | "whitespace" | "low_entropy" | "previous_is_current" | "missing";
  constructor(reason: SecretError["reason"], message: string);
}

/** A secret: a string's UTF-8 bytes (never base64-decoded), or bytes as they are. */
export type Secret = string | Uint8Array;

export class Verifier {
  /**
   * @param secret the current VQ_TOKEN_SECRET
   * @param options.previous the retired VQ_TOKEN_SECRET_PREVIOUS, during a rotation
   * @throws SecretError for a secret vq would refuse
   */
  constructor(secret: Secret, options?: { previous?: Secret | null });

  /** From VQ_TOKEN_SECRET (or VQ_TOKEN_SECRET_FILE) and VQ_TOKEN_SECRET_PREVIOUS(_FILE), as vq reads them. */
  static fromEnv(env?: Record<string, string | undefined>): Verifier;

  /**
   * Every check vq's gate makes, in its order.
   * @param type the target type's name, LIMITED_DROP (or its slug, limited-drop)
   * @param id the target id the request is for
   * @param user the buyer's id (X-User-Id); a safe integer or a BigInt stands for its digits
   * @param token the X-Entry-Token
   * @param nowSec epoch seconds (default: now)
   * @throws TypeError for a type or id that is not one (the caller's error)
   */
  verify(
    type: string,
    id: string | number | bigint,
    user: string | number | bigint | undefined | null,
    token: string | undefined | null,
    nowSec?: number,
  ): Verdict;
}

/** What the middleware needs of a request: node's, or a framework's built on it. */
export interface GateRequest extends IncomingMessage {
  /** Set when the token passes. */
  entryToken?: Verdict & { valid: true };
}

export interface GateOptions<Req extends GateRequest = GateRequest> {
  /** The target the request is for, e.g. `(req) => ["LIMITED_DROP", req.params.dropId]`. */
  target: (req: Req) => [string, string | number | bigint];
  /** The buyer's id; by default the X-User-Id header. */
  user?: (req: Req) => string | number | bigint | undefined;
}

/**
 * Express-style middleware `(req, res, next)`, mounted on the purchase route: 403
 * QUEUE_BYPASS_DENIED or 400 INVALID_REQUEST as vq answers, else `next()` with
 * `req.entryToken` set.
 */
export function entryTokenGate<Req extends GateRequest = GateRequest>(
  verifier: Verifier,
  options: GateOptions<Req>,
): (req: Req, res: ServerResponse, next: (err?: unknown) => void) => void;
