// Types of the vq queue client (index.js). `StatusBody` mirrors docs/openapi.json's `Status`
// schema field for field; the tests check that it does.

/** An answer of `POST …/entries` and `GET …/entries/me` (docs/openapi.json `Status`). */
export interface StatusBody {
  status: "WAITING" | "ADMITTED" | "DIRECT_ADMITTED" | "PRE_QUEUE" | "SCHEDULED" | "CLOSED" | "CHALLENGE";
  position: number | null;
  aheadCount: number;
  etaSeconds: number;
  entryToken: string | null;
  tokenExpiresAt: string | null;
  pollAfterSeconds?: number;
  opensAt?: string;
  prequeueOpensAt?: string;
  /** WAITING in a target with lanes: the lane the place is in (`public` or the one a code or claim joined). */
  lane?: string;
  message?: string;
  paused?: true;
  /** identity.mode = "visitor": the token that names the visitor (sent back as X-Visitor-Token). */
  visitorToken?: string;
  /** CHALLENGE: the proof of work to solve before entering (see ChallengeBody). */
  challenge?: { seed: string; bits: number; expiresAt: string };
}

/**
 * The answer of `POST …/entries` to a new user while vq asks for proof of work
 * (`entry.pow_bits`, `vq pow set`): no place yet. The client finds a nonce (decimal digits)
 * such that SHA-256(seed + nonce) starts with `bits` zero bits and enters again with
 * `X-Pow-Seed: seed` and `X-Pow-Nonce: nonce`; wait() does all of it.
 */
export interface ChallengeBody {
  status: "CHALLENGE";
  challenge: { seed: string; bits: number; expiresAt: string };
  visitorToken?: string;
}

/** What the app shows after each answer. */
export interface QueueState {
  status: StatusBody["status"];
  position: number | null;
  aheadCount: number;
  etaSeconds: number;
  /** The sale is paused: nobody is admitted until it resumes; the place is kept. */
  paused: boolean;
  /** CLOSED: why (e.g. "Sold out"). */
  message: string | null;
  /** WAITING in a target with lanes: the lane (`public`, or the one `laneCode`/`laneClaim` joined); `position` counts within it. Null without lanes. */
  lane: string | null;
  opensAt: string | null;
  prequeueOpensAt: string | null;
  /** SCHEDULED and PRE_QUEUE: seconds to the opening (or the pre-queue), by the server's clock. */
  secondsToOpen: number | null;
  /** ADMITTED and DIRECT_ADMITTED: send it as X-Entry-Token to the purchase. */
  entryToken: string | null;
  tokenExpiresAt: string | null;
}

/** Between answers: retrying after an error or a busy answer. */
export interface RetryState {
  status: "OFFLINE" | "QUEUE_FULL" | "OVERLOADED" | "QUEUE_UNAVAILABLE" | "REENTERING" | `HTTP_${number}`;
  retryInSeconds?: number;
  error?: string;
}

/**
 * Proof of work at entry, while it is being solved: first with `progress` 0, then at most every
 * 100 ms, then with `progress` 1 just before entering with the solution. No place yet.
 */
export interface ChallengeState {
  status: "CHALLENGE";
  /** Zero bits asked for: about 2^bits hashes to try (18 bits: ~262,000). */
  bits: number;
  /** Hashes tried so far. */
  tries: number;
  /** 0..1: the chance to have found it by now (at most 0.99 until it is found, then 1). */
  progress: number;
  /** When the challenge expires (server's clock, ISO-8601). */
  expiresAt: string | null;
}

/**
 * A solution got no place: vq refused it (403 POW_REFUSED: reused, expired, the difficulty
 * raised meanwhile), answered it with a new challenge (POW_IGNORED: the X-Pow-* headers did not
 * reach vq), or the challenge expired before it was solved (POW_EXPIRED). The client gets a
 * fresh challenge and solves it, up to `maxAttempts` in a row; the last one ends the wait with
 * a QueueError of that code instead. A challenge that cannot be solved (no string seed, bits
 * outside 0–64) ends the wait at once with a QueueError BAD_CHALLENGE.
 */
export interface PowRetryState {
  status: "POW_REFUSED" | "POW_IGNORED" | "POW_EXPIRED";
  detail: string;
  attempt: number;
  maxAttempts: number;
}

export type UpdateState = QueueState | RetryState | ChallengeState | PowRetryState;

interface CommonOptions {
  /** Where the queue API is served, e.g. "https://shop.example" (no trailing path). */
  baseUrl: string;
  /** The target's type slug, e.g. "limited-drop". */
  type: string;
  id: number | string;
  /** Called with every state: render it. */
  onUpdate?: (state: UpdateState) => void;
  /** Extra request headers (e.g. credentials for the authenticating proxy). */
  headers?: Record<string, string>;
  /** Defaults to the global fetch. */
  fetch?: typeof fetch;
  /** Defaults to Math.random (the jitter of retries). */
  random?: () => number;
  /**
   * Proof of work: solutions in a row that may get no place before wait() rejects with a
   * QueueError (code POW_REFUSED, POW_IGNORED or POW_EXPIRED). Default 3.
   */
  maxPowAttempts?: number;
  /**
   * Proof of work: solve in a Blob Web Worker where there is one (default true). False, or
   * where there is none (React Native, Node) or it cannot start (a CSP without blob: in
   * worker-src): inline, in chunks of a few ms that yield to the event loop.
   */
  powWorker?: boolean;
  /**
   * Presales: an access code the shop handed out (`vq lane codes import`), sent with every enter
   * as the JSON body's `laneCode`; the answer's `lane` names the lane joined. A wrong code makes
   * wait() reject with a QueueError 403 LANE_CODE_INVALID, a code another buyer used 409
   * LANE_CODE_USED; the buyer's place, if any, is kept (a new WaitingRoom without the code
   * waits in the public lane).
   */
  laneCode?: string;
  /**
   * A lane claim the shop signed for this buyer (`<lane>.<expiresAtEpochSec>.<hex HMAC>`), sent
   * with every enter as the JSON body's `laneClaim`; refused: a QueueError 403 LANE_CLAIM_INVALID.
   * Not with `laneCode`.
   */
  laneClaim?: string;
}

/** identity.mode = "header" (the default): the shop names the buyer. */
export interface UserOptions extends CommonOptions {
  /**
   * Sent as X-User-Id, as is: the buyer's id as vq takes it, 1 to 128 characters, each an ASCII
   * letter, a digit or one of `- _ . : @ +` (a UUID, "user_8f3k", "7"), compared exactly ("007"
   * and "7" are two users). vq answers any other value with 400 INVALID_REQUEST (wait() rejects
   * with a QueueError). A number is sent as String(n) and must be a safe integer (else the
   * constructor throws a TypeError). Where an authenticating proxy sets X-User-Id, any value is
   * replaced.
   */
  userId: string | number;
  visitor?: false;
  visitorToken?: never;
}

/**
 * identity.mode = "visitor": vq names the anonymous visitor. No X-User-Id is sent; the
 * `visitorToken` of each answer is kept and sent back as X-Visitor-Token (what an app without
 * cookies needs; browsers also get vq's HttpOnly cookie vq_visitor).
 */
export interface VisitorOptions extends CommonOptions {
  visitor: true;
  userId?: never;
  /**
   * A token an earlier wait stored (`room.visitorToken`, `onVisitorToken`): the same visitor,
   * so the same place. Null or absent: a new visitor. One vq did not sign is a new visitor too.
   */
  visitorToken?: string | null;
  /** Called when vq names the visitor (the first answer, or a new visitor): store it. */
  onVisitorToken?: (token: string) => void;
}

export type WaitingRoomOptions = UserOptions | VisitorOptions;

export declare const STATUSES: readonly StatusBody["status"][];

export declare class QueueError extends Error {
  status: number;
  code: string;
  detail: string;
}

/**
 * Finds a nonce such that SHA-256(seed + nonce) starts with `bits` zero bits (what wait() does
 * for a CHALLENGE): in a Blob Web Worker where there is one, else inline in chunks that yield
 * to the event loop. Resolves null once `deadline` (epoch ms, this device's clock) passes.
 */
export declare function solvePow(seed: string, bits: number, options?: {
  signal?: AbortSignal;
  onProgress?: (tries: number) => void;
  deadline?: number;
  worker?: boolean;
}): Promise<{ nonce: string; tries: number } | null>;

export declare class WaitingRoom {
  constructor(options: WaitingRoomOptions);
  /** Visitor mode (`visitor: true`). */
  readonly visitor: boolean;
  /** Visitor mode: the token naming this visitor (null until vq names one); store it to keep the place. */
  visitorToken: string | null;
  /** The server's clock minus this device's, ms. */
  skewMs: number;
  /** Now by the server's clock, epoch ms. */
  serverNow(): number;
  /**
   * Enters and waits (solving a proof of work first when vq asks for one): resolves with the
   * ADMITTED, DIRECT_ADMITTED or CLOSED state; rejects with an AbortError on abort (after
   * leaving, unless `leaveOnAbort` is false) or a QueueError for an answer it cannot wait out
   * (also after `maxPowAttempts` proofs of work in a row that got no place).
   */
  wait(options?: { signal?: AbortSignal; leaveOnAbort?: boolean }): Promise<QueueState>;
  /** Leaves the queue. */
  leave(): Promise<void>;
}
