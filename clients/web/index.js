// vq's queue API from a browser or a React Native app: enter, wait as the server says, and
// hand the app the entry token on admission. Solves vq's proof of work at entry (CHALLENGE)
// and waits as an anonymous visitor in identity.mode = "visitor". Uses only `fetch` and timers
// (and a Blob Web Worker where there is one; no DOM, no Node built-ins). Types: index.d.ts
// (checked against docs/openapi.json by the tests).

const MAX_BACKOFF_S = 30;
/** Solutions in a row that get no place (refused, or answered with another challenge) before
 * wait() gives up with a QueueError: each one is a fresh challenge solved again. */
const MAX_POW_ATTEMPTS = 3;
/** Without a worker: hashes tried between two looks at the clock, and how long to hash before
 * yielding to the event loop (a slow phone's JS engine does fewer hashes in the same time). */
const INLINE_CHUNK = 512;
const INLINE_SLICE_MS = 12;
/** Progress reports to onUpdate, at most one in this many ms (an app re-renders on each). */
const PROGRESS_EVERY_MS = 100;
/** Hashes between two progress reports of the worker. */
const WORKER_CHUNK = 16384;

/** The answer statuses the queue API gives (docs/openapi.json, Status.status). */
export const STATUSES = Object.freeze(["WAITING", "ADMITTED", "DIRECT_ADMITTED", "PRE_QUEUE", "SCHEDULED", "CLOSED", "CHALLENGE"]);

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

/**
 * A SHA-256 proof-of-work search, self-contained (no outer names: its source is also what a
 * Web Worker runs). `search(seed, bits, from, count)` tries the nonces from .. from+count-1
 * (their decimal digits) and returns the first n such that SHA-256(seed + n) starts with
 * `bits` zero bits, or -1. The seed is ASCII (vq's seeds are base64url, digits and dots).
 */
function powSearcher() {
  var K = new Int32Array([0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152,
    0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138,
    0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70,
    0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5,
    0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa,
    0xa4506ceb, 0xbef9a3f7, 0xc67178f2]);
  var W = new Int32Array(64), b = new Uint8Array(64);
  // Leading zero bits (up to 64) of SHA-256 of the first l bytes of m.
  function zeros(m, l) {
    var n = (l + 72) >> 6 << 6, i;
    if (b.length < n) b = new Uint8Array(n);
    b.fill(0);
    b.set(m.subarray(0, l));
    b[l] = 128;
    var bitLen = l * 8;
    b[n - 4] = bitLen >>> 24 & 255; b[n - 3] = bitLen >>> 16 & 255; b[n - 2] = bitLen >>> 8 & 255; b[n - 1] = bitLen & 255;
    var h0 = 0x6a09e667, h1 = 0xbb67ae85 | 0, h2 = 0x3c6ef372, h3 = 0xa54ff53a | 0,
      h4 = 0x510e527f, h5 = 0x9b05688c | 0, h6 = 0x1f83d9ab, h7 = 0x5be0cd19;
    for (var o = 0; o < n; o += 64) {
      for (i = 0; i < 16; i++) W[i] = b[o + 4 * i] << 24 | b[o + 4 * i + 1] << 16 | b[o + 4 * i + 2] << 8 | b[o + 4 * i + 3];
      for (i = 16; i < 64; i++) {
        var x = W[i - 15], y = W[i - 2];
        W[i] = ((x >>> 7 | x << 25) ^ (x >>> 18 | x << 14) ^ x >>> 3) + W[i - 16] +
          ((y >>> 17 | y << 15) ^ (y >>> 19 | y << 13) ^ y >>> 10) + W[i - 7] | 0;
      }
      var a = h0, c = h1, d = h2, e = h3, f = h4, g = h5, h = h6, k = h7;
      for (i = 0; i < 64; i++) {
        var t1 = k + ((f >>> 6 | f << 26) ^ (f >>> 11 | f << 21) ^ (f >>> 25 | f << 7)) + (f & g ^ ~f & h) + K[i] + W[i] | 0;
        var t2 = ((a >>> 2 | a << 30) ^ (a >>> 13 | a << 19) ^ (a >>> 22 | a << 10)) + (a & c ^ a & d ^ c & d) | 0;
        k = h; h = g; g = f; f = e + t1 | 0; e = d; d = c; c = a; a = t1 + t2 | 0;
      }
      h0 = h0 + a | 0; h1 = h1 + c | 0; h2 = h2 + d | 0; h3 = h3 + e | 0;
      h4 = h4 + f | 0; h5 = h5 + g | 0; h6 = h6 + h | 0; h7 = h7 + k | 0;
    }
    return h0 ? Math.clz32(h0) : h1 ? 32 + Math.clz32(h1) : 64;
  }
  return function search(seed, bits, from, count) {
    var m = new Uint8Array(seed.length + 24), s = seed.length;
    for (var i = 0; i < s; i++) m[i] = seed.charCodeAt(i);
    for (var n = from; n < from + count; n++) {
      var digits = String(n);
      for (var j = 0; j < digits.length; j++) m[s + j] = digits.charCodeAt(j);
      if (zeros(m, s + digits.length) >= bits) return n;
    }
    return -1;
  };
}

/** The Worker source: the searcher, run in chunks, reporting the hashes tried after each. */
function workerSource() {
  const src = String(powSearcher);
  // Where functions do not keep their source (Hermes, some minifiers), there is no worker.
  if (!/^function powSearcher\(\)\s*\{/.test(src) || src.includes("[native code]")) return null;
  return `var search=(${src})();self.onmessage=function(e){var d=e.data,n=0;for(;;){` +
    "var f=search(d.seed,d.bits,n,d.chunk);if(f>=0){postMessage({nonce:String(f),tries:f+1});return}" +
    "n+=d.chunk;postMessage({tries:n})}}";
}

let inlineSearch = null;

/** Inline: slices of a few ms of hashing, yielding to the event loop between them (the UI
 * stays live). */
async function solveInline(seed, bits, { signal, onProgress, deadline }) {
  inlineSearch ??= powSearcher();
  for (let n = 0; ;) {
    if (signal?.aborted) throw abortError(signal);
    const sliceEnd = Date.now() + INLINE_SLICE_MS;
    do {
      const found = inlineSearch(seed, bits, n, INLINE_CHUNK);
      if (found >= 0) return { nonce: String(found), tries: found + 1 };
      n += INLINE_CHUNK;
    } while (Date.now() < sliceEnd);
    onProgress(n);
    if (deadline !== undefined && Date.now() >= deadline) return null;
    await sleep(0, signal);
  }
}

/** In a Blob Web Worker. Resolves `undefined` when no worker starts (then solve inline). */
function solveInWorker(seed, bits, { signal, onProgress, deadline }) {
  const src = workerSource();
  if (!src) return Promise.resolve(undefined);
  return new Promise((resolve, reject) => {
    let worker, url;
    try {
      url = URL.createObjectURL(new Blob([src], { type: "text/javascript" }));
      worker = new Worker(url);
    } catch {
      if (url) URL.revokeObjectURL(url);
      return resolve(undefined);
    }
    let heard = false;
    const end = (settle, value) => {
      worker.terminate();
      URL.revokeObjectURL(url);
      signal?.removeEventListener("abort", stop);
      settle(value);
    };
    const stop = () => end(reject, abortError(signal));
    if (signal?.aborted) return stop();
    signal?.addEventListener("abort", stop, { once: true });
    worker.onmessage = (e) => {
      heard = true;
      if (e.data.nonce !== undefined) return end(resolve, { nonce: e.data.nonce, tries: e.data.tries });
      onProgress(e.data.tries);
      if (deadline !== undefined && Date.now() >= deadline) end(resolve, null);
    };
    // A worker refused before it said anything (e.g. a Content-Security-Policy without
    // blob: in worker-src): solve inline instead. After that, an error is an error.
    worker.onerror = (e) => {
      e?.preventDefault?.();
      if (!heard) end(resolve, undefined);
      else end(reject, new Error(`the proof-of-work worker failed: ${e?.message ?? e}`));
    };
    worker.postMessage({ seed, bits, chunk: WORKER_CHUNK });
  });
}

/**
 * Finds a nonce such that SHA-256(seed + nonce) starts with `bits` zero bits: in a Blob Web
 * Worker where there is one (browsers), else inline in chunks that yield to the event loop
 * (React Native, Node). Resolves `{nonce, tries}`, or null once `deadline` (epoch ms, this
 * device's clock) passes; rejects with an AbortError when `signal` aborts.
 */
export async function solvePow(seed, bits, { signal, onProgress = () => {}, deadline, worker = true } = {}) {
  if (typeof seed !== "string" || !/^[\x21-\x7e]{1,1024}$/.test(seed)) throw new TypeError("the seed must be 1 to 1024 ASCII characters");
  if (!Number.isInteger(bits) || bits < 0 || bits > 64) throw new TypeError(`bits must be an integer from 0 to 64, not ${bits}`);
  const options = { signal, onProgress, deadline };
  const canWork = worker && typeof Worker === "function" && typeof Blob === "function" &&
    typeof URL !== "undefined" && typeof URL.createObjectURL === "function";
  if (canWork) {
    const solved = await solveInWorker(seed, bits, options);
    if (solved !== undefined) return solved;
  }
  return solveInline(seed, bits, options);
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
 *
 * With identity.mode = "visitor", `visitor: true` instead of `userId` (and the `visitorToken`
 * an earlier wait stored, if any): vq names the visitor.
 */
export class WaitingRoom {
  constructor(options) {
    const { baseUrl, type, id, userId, visitor = false, visitorToken = null } = options ?? {};
    if (!baseUrl || !type || id === undefined || (userId === undefined && visitor !== true)) {
      throw new TypeError("WaitingRoom needs baseUrl, type, id, and userId (or visitor: true)");
    }
    this.api = `${String(baseUrl).replace(/\/+$/, "")}/virtual-queues/${encodeURIComponent(type)}/${encodeURIComponent(String(id))}`;
    /** Visitor mode: no X-User-Id; vq names the visitor in `visitorToken`. */
    this.visitor = visitor === true;
    /** Visitor mode: the token that names this visitor, sent as X-Visitor-Token (null until vq
     * has named one). Store it to keep the place across restarts of the app. */
    this.visitorToken = null;
    if (this.visitor) {
      // Explicit, not "userId omitted": a buyer id that is undefined by mistake must not turn
      // a signed-in buyer into an anonymous visitor.
      if (userId !== undefined) throw new TypeError("userId and visitor: true exclude each other: vq names visitors itself");
      if (visitorToken !== null && visitorToken !== undefined) {
        if (typeof visitorToken !== "string" || visitorToken === "") throw new TypeError("visitorToken must be a non-empty string");
        this.visitorToken = visitorToken;
      }
      this.userId = null;
    } else {
      if (visitorToken !== null && visitorToken !== undefined) throw new TypeError("visitorToken needs visitor: true");
      // vq takes any 1 to 128 of A-Z a-z 0-9 - _ . : @ + and compares them exactly; it answers
      // 400 INVALID_REQUEST (a QueueError from wait()) for anything else. A number is sent as its
      // digits, which a double holds exactly only up to 2^53: past that it would be another user.
      if (typeof userId === "number" && !Number.isSafeInteger(userId)) {
        throw new TypeError(`userId ${userId} is not a safe integer: pass the id as a string`);
      }
      this.userId = String(userId);
    }
    this.onVisitorToken = options.onVisitorToken ?? (() => {});
    const attempts = options.maxPowAttempts ?? MAX_POW_ATTEMPTS;
    if (!Number.isInteger(attempts) || attempts < 1) throw new TypeError("maxPowAttempts must be a positive integer");
    this.maxPowAttempts = attempts;
    this.powWorker = options.powWorker ?? true;
    const { laneCode, laneClaim } = options;
    if (laneCode !== undefined && laneClaim !== undefined) throw new TypeError("laneCode and laneClaim exclude each other");
    for (const [name, v] of [["laneCode", laneCode], ["laneClaim", laneClaim]]) {
      if (v !== undefined && (typeof v !== "string" || v === "")) throw new TypeError(`${name} must be a non-empty string`);
    }
    /** The enter's JSON body: the proof of a lane, or null (an enter without a body). */
    this.enterBody = laneCode !== undefined ? JSON.stringify({ laneCode })
      : laneClaim !== undefined ? JSON.stringify({ laneClaim }) : null;
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

  async call(method, path, signal, extra, json) {
    const headers = { ...this.headers, ...extra };
    if (!this.visitor) headers["X-User-Id"] = this.userId;
    else if (this.visitorToken) headers["X-Visitor-Token"] = this.visitorToken;
    if (json) headers["Content-Type"] = "application/json";
    const resp = await this.fetch(this.api + path, { method, headers, cache: "no-store", signal, body: json ?? undefined });
    const date = Date.parse(resp.headers.get("date") ?? "");
    if (!Number.isNaN(date)) this.skewMs = date - Date.now();
    const retryAfter = Number(resp.headers.get("retry-after")) || null;
    let body = null;
    if (resp.status !== 204) body = await resp.json().catch(() => null);
    // Visitor mode: vq names a new visitor (no token yet, or one it did not sign) in every
    // answer; keep the name it gives, so the next request is the same visitor's.
    const named = body?.visitorToken;
    if (this.visitor && typeof named === "string" && named && named !== this.visitorToken) {
      this.visitorToken = named;
      this.onVisitorToken(named);
    }
    return { status: resp.status, retryAfter, body };
  }

  /** What the app shows, from one answer (see index.d.ts `QueueState`). */
  state(body) {
    const s = { status: body.status, position: body.position ?? null, aheadCount: body.aheadCount ?? 0,
      etaSeconds: body.etaSeconds ?? 0, paused: body.paused === true, message: body.message ?? null,
      lane: body.lane ?? null, opensAt: body.opensAt ?? null, prequeueOpensAt: body.prequeueOpensAt ?? null, secondsToOpen: null,
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

  /**
   * Solves a CHALLENGE answer's proof of work, reporting progress; resolves the headers that
   * carry the solution, or null when the challenge expired before it was solved.
   */
  async solveChallenge(challenge, signal) {
    const { seed, bits, expiresAt } = challenge ?? {};
    if (typeof seed !== "string" || !Number.isInteger(bits) || bits < 0 || bits > 64) {
      throw new QueueError(200, "BAD_CHALLENGE", `not a challenge this client can solve: ${JSON.stringify(challenge)}`);
    }
    const expected = 2 ** bits;
    const report = (tries, progress) => this.onUpdate({ status: "CHALLENGE", bits, tries, progress, expiresAt: expiresAt ?? null });
    report(0, 0);
    let reported = Date.now();
    // expiresAt is by the server's clock; the deadline by this device's.
    const at = Date.parse(expiresAt ?? "");
    const deadline = Number.isNaN(at) ? undefined : at - this.skewMs;
    const solved = await solvePow(seed, bits, {
      signal, deadline, worker: this.powWorker,
      // The chance to have found it by now, at most 99 % until it is found.
      onProgress: (tries) => {
        if (Date.now() - reported < PROGRESS_EVERY_MS) return;
        reported = Date.now();
        report(tries, Math.min(0.99, 1 - Math.exp(-tries / expected)));
      },
    });
    if (!solved) return null;
    report(solved.tries, 1);
    return { "X-Pow-Seed": seed, "X-Pow-Nonce": solved.nonce };
  }

  async run(signal) {
    let backoff = 1;
    let polling = false;
    // The solution of the last challenge, sent with the next enter (and only with it).
    let proof = null;
    // Solutions in a row that got no place: past maxPowAttempts, the wait ends.
    let powFailures = 0;
    const powFailed = (status, code, detail) => {
      powFailures += 1;
      if (powFailures >= this.maxPowAttempts) {
        throw new QueueError(status, code, `${detail} (${powFailures} proofs of work in a row got no place)`);
      }
      this.onUpdate({ status: code, detail, attempt: powFailures, maxAttempts: this.maxPowAttempts });
    };
    for (;;) {
      if (signal?.aborted) throw abortError(signal);
      let r;
      const sent = polling ? null : proof;
      try {
        r = polling ? await this.call("GET", "/entries/me", signal)
          : await this.call("POST", "/entries", signal, sent ?? undefined, this.enterBody);
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
      // A solution is good once: whatever vq answered, the next enter goes without it, except
      // after a 503 (the instance shed the request or could not record it: the same step again).
      if (!(r.status === 503 && RETRIED_503.has(code))) proof = null;
      if (r.status === 403 && code === "POW_REFUSED") {
        // Reused, expired, the difficulty raised meanwhile: enter again for a new challenge.
        powFailed(403, code, r.body?.detail ?? "");
        polling = false;
        continue;
      }
      if (r.status === 429 || (r.status === 503 && RETRIED_503.has(code))) {
        // QUEUE_FULL (enter again later), OVERLOADED or QUEUE_UNAVAILABLE (same step again):
        // after Retry-After, spread over a second so that buyers do not all come back at once.
        this.onUpdate({ status: code ?? `HTTP_${r.status}`, retryInSeconds: r.retryAfter ?? 5 });
        await sleep((r.retryAfter ?? 5) * 1000 + this.random() * 1000, signal);
        if (r.status === 429) {
          polling = false;
          powFailures = 0; // an answer that is not about the work: the count starts again
        }
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
      if (r.body.status === "CHALLENGE") {
        // Proof of work before a place. A challenge in answer to a solution means it never
        // reached vq (a proxy dropping X-Pow-Seed and X-Pow-Nonce?): counted, not looped on.
        if (sent) powFailed(200, "POW_IGNORED", "vq answered a solution with a new challenge: did X-Pow-Seed and X-Pow-Nonce reach it?");
        proof = await this.solveChallenge(r.body.challenge, signal);
        if (!proof) powFailed(200, "POW_EXPIRED", `the challenge expired (${r.body.challenge.expiresAt}) before it was solved`);
        polling = false;
        continue;
      }
      powFailures = 0;
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
    // A visitor vq has not named yet holds no place; without a token the request would only
    // name a new visitor.
    if (this.visitor && !this.visitorToken) return;
    await this.call("DELETE", "/entries/me");
    this.entered = false;
  }
}
