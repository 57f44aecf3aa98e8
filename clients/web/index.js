// vq's queue API from a browser or a React Native app: enter, wait as the server says, and
// hand the app the entry token on admission. Uses only `fetch` and timers (no DOM, no Node
// built-ins). Types: index.d.ts (checked against docs/openapi.json by the tests).

const MAX_BACKOFF_S = 30;

/** The answer statuses the queue API gives (docs/openapi.json, Status.status). */
export const STATUSES = Object.freeze(["WAITING", "ADMITTED", "DIRECT_ADMITTED", "PRE_QUEUE", "SCHEDULED", "CLOSED"]);

/** Error codes the client waits out and retries, after the server's Retry-After. */
const RETRIED_503 = new Set(["OVERLOADED", "QUEUE_UNAVAILABLE"]);

function abortError(signal) {
  if (signal && signal.reason instanceof Error) return signal.reason;
  const e = new Error("the wait was aborted");
  e.name = "AbortError";
  return e;
}

/** Resolves after `ms`, or rejects as soon as `signal` aborts. */
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortError(signal));
    const done = () => {
      signal?.removeEventListener("abort", stop);
      resolve();
    };
    const timer = setTimeout(done, Math.max(0, ms));
    const stop = () => {
      clearTimeout(timer);
      reject(abortError(signal));
    };
    signal?.addEventListener("abort", stop, { once: true });
  });
}

/** A queue API error answer (4xx/5xx with {code, detail}) the client does not retry. */
export class QueueError extends Error {
  constructor(status, code, detail) {
    super(`${status} ${code}: ${detail}`);
    this.name = "QueueError";
    this.status = status;
    this.code = code;
    this.detail = detail;
  }
}

/**
 * One buyer's wait in one target's queue.
 *
 *   const room = new WaitingRoom({ baseUrl: "https://shop.example", type: "limited-drop", id: 42,
 *     userId: "7", onUpdate: (s) => render(s) });
 *   const { entryToken } = await room.wait({ signal });   // ADMITTED or DIRECT_ADMITTED
 */
export class WaitingRoom {
  constructor(options) {
    const { baseUrl, type, id, userId } = options ?? {};
    if (!baseUrl || !type || id === undefined || userId === undefined) {
      throw new TypeError("WaitingRoom needs baseUrl, type, id and userId");
    }
    this.api = `${String(baseUrl).replace(/\/+$/, "")}/virtual-queues/${encodeURIComponent(type)}/${encodeURIComponent(String(id))}`;
    // vq takes any 1 to 128 of A-Z a-z 0-9 - _ . : @ + and compares them exactly; it answers
    // 400 INVALID_REQUEST (a QueueError from wait()) for anything else. A number is sent as its
    // digits, which a double holds exactly only up to 2^53: past that it would be another user.
    if (typeof userId === "number" && !Number.isSafeInteger(userId)) {
      throw new TypeError(`userId ${userId} is not a safe integer: pass the id as a string`);
    }
    this.userId = String(userId);
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.headers = options.headers ?? {};
    this.onUpdate = options.onUpdate ?? (() => {});
    this.random = options.random ?? Math.random;
    /** The server's clock minus this device's, ms, from the last answer's Date header. */
    this.skewMs = 0;
    this.entered = false;
  }

  /** Now by the server's clock, epoch ms (countdowns count against it, not the device's). */
  serverNow() {
    return Date.now() + this.skewMs;
  }

  async call(method, path, signal) {
    const resp = await this.fetch(this.api + path, {
      method,
      headers: { ...this.headers, "X-User-Id": this.userId },
      cache: "no-store",
      signal,
    });
    const date = Date.parse(resp.headers.get("date") ?? "");
    if (!Number.isNaN(date)) this.skewMs = date - Date.now();
    const retryAfter = Number(resp.headers.get("retry-after")) || null;
    let body = null;
    if (resp.status !== 204) body = await resp.json().catch(() => null);
    return { status: resp.status, retryAfter, body };
  }

  /** What the app shows, from one answer (see index.d.ts `QueueState`). */
  state(body) {
    const s = { status: body.status, position: body.position ?? null, aheadCount: body.aheadCount ?? 0,
      etaSeconds: body.etaSeconds ?? 0, paused: body.paused === true, message: body.message ?? null,
      opensAt: body.opensAt ?? null, prequeueOpensAt: body.prequeueOpensAt ?? null, secondsToOpen: null,
      entryToken: body.entryToken ?? null, tokenExpiresAt: body.tokenExpiresAt ?? null };
    const at = Date.parse(body.status === "SCHEDULED" ? (body.prequeueOpensAt ?? body.opensAt) : body.opensAt);
    if (!Number.isNaN(at)) s.secondsToOpen = Math.max(0, Math.ceil((at - this.serverNow()) / 1000));
    return s;
  }

  /**
   * Enters (or re-enters) and waits until the buyer may buy: resolves with the ADMITTED or
   * DIRECT_ADMITTED state (its `entryToken` goes as X-Entry-Token to the purchase), or with
   * the CLOSED state; rejects with an AbortError when `signal` aborts (after leaving the
   * queue, unless `leaveOnAbort` is false), or with a QueueError for an answer it cannot wait
   * out (e.g. 400 INVALID_REQUEST).
   */
  async wait({ signal, leaveOnAbort = true } = {}) {
    try {
      return await this.run(signal);
    } catch (e) {
      if (signal?.aborted && leaveOnAbort && this.entered) await this.leave().catch(() => {});
      throw e;
    }
  }

  async run(signal) {
    let backoff = 1;
    let polling = false;
    for (;;) {
      if (signal?.aborted) throw abortError(signal);
      let r;
      try {
        r = await this.call(polling ? "GET" : "POST", polling ? "/entries/me" : "/entries", signal);
      } catch (e) {
        if (signal?.aborted) throw abortError(signal);
        // Offline or no answer: try the same step again, waiting longer each time.
        this.onUpdate({ status: "OFFLINE", retryInSeconds: backoff, error: String(e) });
        await sleep(backoff * 1000, signal);
        backoff = Math.min(backoff * 2, MAX_BACKOFF_S);
        continue;
      }
      backoff = 1;
      const code = r.body?.code;
      if (r.status === 429 || (r.status === 503 && RETRIED_503.has(code))) {
        // QUEUE_FULL (enter again later), OVERLOADED or QUEUE_UNAVAILABLE (same step again):
        // after Retry-After, spread over a second so that buyers do not all come back at once.
        this.onUpdate({ status: code ?? `HTTP_${r.status}`, retryInSeconds: r.retryAfter ?? 5 });
        await sleep((r.retryAfter ?? 5) * 1000 + this.random() * 1000, signal);
        if (r.status === 429) polling = false;
        continue;
      }
      if (r.status === 404 && polling && code === "NOT_IN_QUEUE") {
        // Evicted (or lost): back in at the end of the queue.
        this.onUpdate({ status: "REENTERING" });
        polling = false;
        continue;
      }
      if (r.status >= 500 || !r.body) {
        this.onUpdate({ status: "OFFLINE", retryInSeconds: backoff });
        await sleep(backoff * 1000, signal);
        backoff = Math.min(backoff * 2, MAX_BACKOFF_S);
        continue;
      }
      if (r.status !== 200) throw new QueueError(r.status, code ?? "ERROR", r.body.detail ?? "");
      this.entered = true;
      const s = this.state(r.body);
      this.onUpdate(s);
      switch (s.status) {
        case "ADMITTED":
        case "DIRECT_ADMITTED":
        case "CLOSED":
          this.entered = s.status !== "CLOSED" ? this.entered : false;
          return s;
        case "SCHEDULED": {
          // Not recorded yet: enter again once the pre-queue opens (at most a minute from
          // now, so a changed schedule is seen), spread over two seconds.
          const until = (s.secondsToOpen ?? 5) * 1000;
          this.entered = false;
          await sleep(Math.min(60_000, Math.max(1000, until)) + this.random() * 2000, signal);
          polling = false;
          continue;
        }
        default: {
          // WAITING and PRE_QUEUE: poll when told (also the heartbeat that keeps the place).
          const after = r.body.pollAfterSeconds ?? r.retryAfter ?? 5;
          await sleep(after * 1000, signal);
          polling = true;
        }
      }
    }
  }

  /** Leaves the queue (best effort: a user who stops polling is evicted anyway). */
  async leave() {
    await this.call("DELETE", "/entries/me");
    this.entered = false;
  }
}
