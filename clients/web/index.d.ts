// Types of the vq queue client (index.js). `StatusBody` mirrors docs/openapi.json's `Status`
// schema field for field; the tests check that it does.

/** An answer of `POST …/entries` and `GET …/entries/me` (docs/openapi.json `Status`). */
export interface StatusBody {
  status: "WAITING" | "ADMITTED" | "DIRECT_ADMITTED" | "PRE_QUEUE" | "SCHEDULED" | "CLOSED";
  position: number | null;
  aheadCount: number;
  etaSeconds: number;
  entryToken: string | null;
  tokenExpiresAt: string | null;
  pollAfterSeconds?: number;
  opensAt?: string;
  prequeueOpensAt?: string;
  message?: string;
  paused?: true;
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

export interface WaitingRoomOptions {
  /** Where the queue API is served, e.g. "https://shop.example" (no trailing path). */
  baseUrl: string;
  /** The target's type slug, e.g. "limited-drop". */
  type: string;
  id: number | string;
  /**
   * Sent as X-User-Id, as is: the buyer's id as vq takes it, 1 to 128 characters, each an ASCII
   * letter, a digit or one of `- _ . : @ +` (a UUID, "user_8f3k", "7"), compared exactly ("007"
   * and "7" are two users). vq answers any other value with 400 INVALID_REQUEST (wait() rejects
   * with a QueueError). A number is sent as String(n) and must be a safe integer (else the
   * constructor throws a TypeError). Where an authenticating proxy sets X-User-Id, any value is
   * replaced.
   */
  userId: string | number;
  /** Called with every state: render it. */
  onUpdate?: (state: QueueState | RetryState) => void;
  /** Extra request headers (e.g. credentials for the authenticating proxy). */
  headers?: Record<string, string>;
  /** Defaults to the global fetch. */
  fetch?: typeof fetch;
  /** Defaults to Math.random (the jitter of retries). */
  random?: () => number;
}

export declare const STATUSES: readonly StatusBody["status"][];

export declare class QueueError extends Error {
  status: number;
  code: string;
  detail: string;
}

export declare class WaitingRoom {
  constructor(options: WaitingRoomOptions);
  /** The server's clock minus this device's, ms. */
  skewMs: number;
  /** Now by the server's clock, epoch ms. */
  serverNow(): number;
  /**
   * Enters and waits: resolves with the ADMITTED, DIRECT_ADMITTED or CLOSED state; rejects
   * with an AbortError on abort (after leaving, unless `leaveOnAbort` is false) or a
   * QueueError for an answer it cannot wait out.
   */
  wait(options?: { signal?: AbortSignal; leaveOnAbort?: boolean }): Promise<QueueState>;
  /** Leaves the queue. */
  leave(): Promise<void>;
}
