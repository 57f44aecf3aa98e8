// The queue client against a real `vq serve` and redis-server on loopback (started here, stopped
// by PID): a buyer waits through a paced queue and gets a token vq verifies; scheduled, paused
// and closed sales; a full queue's 429 and an overloaded instance's 503 are waited out as
// Retry-After says; abort leaves the queue; a proof of work at entry is solved (in a Blob
// worker or inline), a refused one gets a fresh challenge and endless refusals end the wait;
// visitor mode keeps vq's visitor token; a presale code joins its lane. VQ_BIN names the vq binary (default: the debug build
// of this checkout).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync, spawnSync } from "node:child_process";
import { createServer } from "node:net";
import { createServer as createHttpServer } from "node:http";
import { createHash } from "node:crypto";
import { Worker as ThreadWorker } from "node:worker_threads";
import { resolveObjectURL } from "node:buffer";
import { readFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { WaitingRoom, STATUSES, QueueError, solvePow } from "../index.js";

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, "../../..");
const VQ = process.env.VQ_BIN ? resolve(process.env.VQ_BIN) : join(root, "target/debug/vq");
const SECRET = "client-test-secret-0123456789abcdef0123456789";
// The targets the queues answer for (vq answers 404 UNKNOWN_TARGET for any other).
const TARGETS = '["limited-drop:40-49"]';
const started = [];
let dir;

function freePort() {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// vq reads every VQ_… variable as a setting (VQ_BIN among them would stop it): children get
// the environment without them, and only the settings given here.
const clean = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("VQ_")));

function start(cmd, args, env = {}) {
  const child = spawn(cmd, args, { env: { ...clean, ...env }, stdio: "ignore" });
  started.push(child);
  return child;
}

async function until(what, check, secs = 15) {
  const deadline = Date.now() + secs * 1000;
  for (;;) {
    try {
      if (await check()) return;
    } catch {}
    if (Date.now() > deadline) throw new Error(`${what}: not within ${secs} s`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

let redisUrl;

/** A redis-server of its own; resolves with its URL. */
async function redis() {
  const port = await freePort();
  start("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir]);
  await until("redis-server", () => new Promise((resolve) => {
    const s = createServer();
    s.once("error", () => resolve(true));
    s.listen(port, "127.0.0.1", () => s.close(() => resolve(false)));
  }));
  return `redis://127.0.0.1:${port}`;
}

/** `vq serve --flag-on` with `env` (on the shared Redis unless `env` names another); resolves
 * with its base URL. */
async function serve(env = {}) {
  const port = await freePort();
  start(VQ, ["serve", "--flag-on", "--listen", `127.0.0.1:${port}`], {
    VQ_REDIS__URL: redisUrl, VQ_TOKEN_SECRET: SECRET, VQ_TARGETS__RANGES: TARGETS, RUST_LOG: "warn", ...env,
  });
  const url = `http://127.0.0.1:${port}`;
  await until("vq serve", async () => (await fetch(`${url}/healthz`)).ok);
  return url;
}

function vq(...args) {
  const env = { ...clean, VQ_REDIS__URL: redisUrl, VQ_TOKEN_SECRET: SECRET, VQ_TARGETS__RANGES: TARGETS };
  return execFileSync(VQ, args, { env }).toString();
}

let fast;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), "vq-client-"));
  redisUrl = await redis();
  // One admission a tick, ticks of 200 ms.
  fast = await serve({ VQ_QUEUE__TICK_MS: "200", VQ_QUEUE__BATCH_SIZE: "1" });
});

after(() => {
  for (const c of started.reverse()) c.kill("SIGKILL");
  // Retried: a process just killed may still be letting go of its files.
  rmSync(dir, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
});

test("a buyer waits through a paced queue and is handed a token vq verifies", async () => {
  // Two buyers ahead, both polling (a buyer who stops polling is evicted, not admitted), both
  // in the queue before the third enters.
  const placed = new Set();
  const ahead = [1, 2].map((u) =>
    new WaitingRoom({ baseUrl: fast, type: "limited-drop", id: 42, userId: u, onUpdate: (s) => s.position && placed.add(u) }).wait());
  await until("the buyers ahead in the queue", () => placed.size === 2);
  const seen = [];
  const room = new WaitingRoom({ baseUrl: fast, type: "limited-drop", id: 42, userId: 3, onUpdate: (s) => seen.push(s) });
  const done = await room.wait();
  assert.equal(done.status, "ADMITTED");
  assert.ok(seen.some((s) => s.status === "WAITING" && s.position === 3), JSON.stringify(seen));
  assert.ok(done.entryToken && done.tokenExpiresAt);
  vq("verify", done.entryToken, "--target", "limited-drop:42", "--user", "3");
  for (const a of await Promise.all(ahead)) assert.equal(a.status, "ADMITTED");
});

test("a scheduled sale: SCHEDULED with a countdown, then the pre-queue, then admitted", async () => {
  const now = Date.now();
  const iso = (ms) => new Date(ms).toISOString();
  vq("sale", "schedule", "limited-drop:43", "--prequeue-from", iso(now + 1500), "--opens-at", iso(now + 6000));
  const seen = [];
  const room = new WaitingRoom({ baseUrl: fast, type: "limited-drop", id: 43, userId: 7, onUpdate: (s) => seen.push(s) });
  const done = await room.wait();
  assert.equal(done.status, "ADMITTED", JSON.stringify(seen));
  const statuses = seen.map((s) => s.status);
  assert.ok(statuses.indexOf("SCHEDULED") < statuses.indexOf("PRE_QUEUE"), statuses.join());
  const scheduled = seen.find((s) => s.status === "SCHEDULED");
  // 1.5 s ahead, counted against the server's Date header (whole seconds): up to a second more.
  assert.ok(scheduled.secondsToOpen >= 1 && scheduled.secondsToOpen <= 3, JSON.stringify(scheduled));
  assert.ok(seen.find((s) => s.status === "PRE_QUEUE").opensAt);
});

test("a paused sale says so and keeps the place; a closed one ends the wait with its message", async () => {
  vq("sale", "pause", "limited-drop:44");
  const seen = [];
  const room = new WaitingRoom({ baseUrl: fast, type: "limited-drop", id: 44, userId: 9, onUpdate: (s) => seen.push(s) });
  const waiting = room.wait();
  await until("a paused answer", () => seen.some((s) => s.status === "WAITING" && s.paused));
  vq("sale", "close", "limited-drop:44", "--message", "Sold out");
  const done = await waiting;
  assert.equal(done.status, "CLOSED");
  assert.equal(done.message, "Sold out");
});

test("a full queue's 429 is waited out as Retry-After says; abort leaves the queue", async () => {
  // Room for one, and nobody admitted (a minute-long tick; a Redis of its own, where the
  // other instance's pump does not admit).
  const full = await serve({ VQ_REDIS__URL: await redis(), VQ_QUEUE__MAX_CAPACITY: "1", VQ_QUEUE__TICK_MS: "60000" });
  const firstSeen = [];
  const first = new WaitingRoom({ baseUrl: full, type: "limited-drop", id: 45, userId: 1, onUpdate: (s) => firstSeen.push(s) });
  const abortFirst = new AbortController();
  const firstWait = first.wait({ signal: abortFirst.signal });
  await until("the first buyer's place", () => firstSeen.some((s) => s.status === "WAITING"));
  const seen = [];
  const second = new WaitingRoom({ baseUrl: full, type: "limited-drop", id: 45, userId: 2, onUpdate: (s) => seen.push(s) });
  const abort = new AbortController();
  const secondWait = second.wait({ signal: abort.signal });
  await until("QUEUE_FULL", () => seen.some((s) => s.status === "QUEUE_FULL"));
  assert.equal(seen.find((s) => s.status === "QUEUE_FULL").retryInSeconds, 5);
  // The first buyer gives up: aborting leaves, which frees the place.
  abortFirst.abort();
  await assert.rejects(firstWait, { name: "AbortError" });
  await until("the second buyer's place", () => seen.some((s) => s.status === "WAITING"), 20);
  abort.abort();
  await assert.rejects(secondWait, { name: "AbortError" });
  for (const user of ["1", "2"]) {
    const r = await fetch(`${full}/virtual-queues/limited-drop/45/entries/me`, { headers: { "X-User-Id": user } });
    assert.equal(r.status, 404, `user ${user} left on abort`);
  }
});

test("an overloaded instance's 503 is waited out as Retry-After says, then the same step again", async () => {
  let calls = 0;
  // The first answer is what an instance shedding load says (vq answers it under overload,
  // which a test cannot make on demand); the rest are the real vq's.
  const shedding = async (url, init) => {
    calls += 1;
    if (calls === 1) {
      return new Response(JSON.stringify({ code: "OVERLOADED", detail: "busy" }), {
        status: 503, headers: { "Retry-After": "1", "Content-Type": "application/json" } });
    }
    return fetch(url, init);
  };
  const seen = [];
  const room = new WaitingRoom({ baseUrl: fast, type: "limited-drop", id: 46, userId: 5, fetch: shedding,
    onUpdate: (s) => seen.push({ ...s, at: Date.now() }) });
  const t0 = Date.now();
  const done = await room.wait();
  assert.equal(done.status, "ADMITTED");
  assert.equal(seen[0].status, "OVERLOADED");
  assert.equal(seen[0].retryInSeconds, 1);
  assert.ok(seen[1].at - t0 >= 1000, "entered again only after Retry-After");
});

test("the typed answer is the OpenAPI document's Status, field for field", () => {
  const doc = JSON.parse(readFileSync(join(root, "docs/openapi.json"), "utf8"));
  const status = doc.components.schemas.Status;
  const dts = readFileSync(join(here, "../index.d.ts"), "utf8");
  const body = dts.slice(dts.indexOf("export interface StatusBody {"));
  const fields = body.slice(0, body.indexOf("\n}")).split("\n").slice(1)
    .map((l) => l.trim().match(/^(\w+)(\??):/)).filter(Boolean);
  assert.deepEqual(fields.map((m) => m[1]).sort(), Object.keys(status.properties).sort());
  for (const [, name, optional] of fields) {
    assert.equal(optional === "", status.required.includes(name), `${name}: required in one, optional in the other`);
  }
  assert.deepEqual([...STATUSES].sort(), [...status.properties.status.enum].sort());
});

test("a presale code joins its lane once: the state names the lane; another buyer's use of the code and a wrong code end the wait with vq's answer", async () => {
  vq("lane", "add", "limited-drop:49", "members", "--share", "50");
  const env = { ...clean, VQ_REDIS__URL: redisUrl, VQ_TOKEN_SECRET: SECRET, VQ_TARGETS__RANGES: TARGETS };
  execFileSync(VQ, ["lane", "codes", "import", "limited-drop:49", "members"], { env, input: "FAN-7Q2K\n" });
  // The serving instance reads its lanes every flag refresh: until then an enter has no lane.
  let probe = 0;
  await until("the instance serves the lane", async () => {
    const r = await fetch(`${fast}/virtual-queues/limited-drop/49/entries`, { method: "POST", headers: { "X-User-Id": `probe-${probe++}` } });
    return (await r.json()).lane === "public";
  });
  const seen = [];
  const done = await new WaitingRoom({ baseUrl: fast, type: "limited-drop", id: 49, userId: "fan-1", laneCode: "FAN-7Q2K",
    onUpdate: (s) => seen.push(s) }).wait();
  assert.equal(done.status, "ADMITTED");
  assert.ok(seen.some((s) => s.status === "WAITING" && s.lane === "members"), JSON.stringify(seen));
  vq("verify", done.entryToken, "--target", "limited-drop:49", "--user", "fan-1");
  await assert.rejects(new WaitingRoom({ baseUrl: fast, type: "limited-drop", id: 49, userId: "fan-2", laneCode: "FAN-7Q2K" }).wait(),
    { name: "QueueError", status: 409, code: "LANE_CODE_USED" });
  await assert.rejects(new WaitingRoom({ baseUrl: fast, type: "limited-drop", id: 49, userId: "fan-3", laneCode: "FAN-0000" }).wait(),
    { name: "QueueError", status: 403, code: "LANE_CODE_INVALID" });
  // A lane claim goes as the JSON body's laneClaim, with every enter.
  const sent = [];
  const answer = { code: "LANE_CLAIM_INVALID", detail: "the claim's signature does not match" };
  const claimed = new WaitingRoom({ baseUrl: "http://x", type: "limited-drop", id: 49, userId: "fan-4", laneClaim: "members.9.ab",
    fetch: async (url, init) => { sent.push(init); return new Response(JSON.stringify(answer), { status: 403 }); } });
  await assert.rejects(claimed.wait(), { status: 403, code: "LANE_CLAIM_INVALID" });
  assert.equal(sent[0].method, "POST");
  assert.equal(sent[0].headers["Content-Type"], "application/json");
  assert.deepEqual(JSON.parse(sent[0].body), { laneClaim: "members.9.ab" });
  const at = { baseUrl: "http://x", type: "limited-drop", id: 49, userId: "7" };
  assert.throws(() => new WaitingRoom({ ...at, laneCode: "A", laneClaim: "B" }), TypeError);
  assert.throws(() => new WaitingRoom({ ...at, laneCode: "" }), TypeError);
  assert.throws(() => new WaitingRoom({ ...at, laneClaim: 7 }), TypeError);
});

test("an answer it cannot wait out ends the wait with a QueueError", async () => {
  const room = new WaitingRoom({ baseUrl: fast, type: "limited-drop", id: 99, userId: 1 });
  await assert.rejects(room.wait(), { name: "QueueError", status: 404, code: "UNKNOWN_TARGET" });
});

test("a UUID user id waits and is handed a token vq verifies for that id exactly", async () => {
  const uuid = "3f2a9c1e-7b4d-4c1e-9a8f-2b6c1d0e9f3a";
  const done = await new WaitingRoom({ baseUrl: fast, type: "limited-drop", id: 47, userId: uuid }).wait();
  assert.equal(done.status, "ADMITTED");
  vq("verify", done.entryToken, "--target", "limited-drop:47", "--user", uuid);
  // Compared exactly: the same UUID in upper case is another user (vq verify exits 1).
  assert.throws(() => vq("verify", done.entryToken, "--target", "limited-drop:47", "--user", uuid.toUpperCase()),
    (e) => e.status === 1);
});

test("a user id vq does not take ends the wait with vq's 400", async () => {
  const room = new WaitingRoom({ baseUrl: fast, type: "limited-drop", id: 48, userId: "7 8" });
  await assert.rejects(room.wait(), (e) => e.name === "QueueError" && e.status === 400 && e.code === "INVALID_REQUEST" &&
    /not a user id: expected 1 to 128 characters/.test(e.detail));
});

test("userId is sent as is; a number as its digits, and only a safe integer", async () => {
  const sent = [];
  const recording = async (url, init) => {
    sent.push(init.headers["X-User-Id"]);
    return new Response(JSON.stringify({ code: "UNKNOWN_TARGET", detail: "no" }), { status: 404 });
  };
  for (const userId of ["007", "user_8f3k", 7]) {
    await assert.rejects(new WaitingRoom({ baseUrl: "http://x", type: "limited-drop", id: 1, userId, fetch: recording }).wait());
  }
  assert.deepEqual(sent, ["007", "user_8f3k", "7"]);
  for (const userId of [2 ** 53, 7.5, NaN]) {
    assert.throws(() => new WaitingRoom({ baseUrl: "http://x", type: "limited-drop", id: 1, userId }), TypeError, String(userId));
  }
});

// ---- Proof of work at entry ----

/** Leading zero bits of SHA-256(seed + nonce), by Node's own SHA-256. */
function zeroBits(seed, nonce) {
  let n = 0;
  for (const b of createHash("sha256").update(seed + nonce).digest()) {
    if (b !== 0) return n + Math.clz32(b) - 24;
    n += 8;
  }
  return n;
}

/** The first nonce (decimal) that solves `seed` at `bits`, by Node's SHA-256. */
function firstNonce(seed, bits) {
  for (let n = 0; ; n++) if (zeroBits(seed, String(n)) >= bits) return String(n);
}

test("solvePow finds the first nonce Node's SHA-256 agrees with, for seeds of one to three blocks", async () => {
  // Lengths around the 55/56- and 119/120-byte padding edges, and vq's ~80-character seeds.
  for (const len of [1, 20, 50, 54, 55, 56, 57, 63, 64, 65, 80, 100, 118, 119, 120, 121, 150]) {
    const seed = createHash("sha256").update(String(len)).digest("base64url").repeat(4).slice(0, len);
    for (const bits of [0, 3, 8, 11]) {
      const got = await solvePow(seed, bits);
      assert.equal(got.nonce, firstNonce(seed, bits), `seed of ${len}, ${bits} bits`);
      assert.equal(got.tries, Number(got.nonce) + 1);
    }
  }
  // An expired deadline: null, not a spin.
  assert.equal(await solvePow("x".repeat(80), 40, { deadline: Date.now() - 1 }), null);
  const abort = new AbortController();
  abort.abort();
  await assert.rejects(solvePow("x".repeat(80), 40, { signal: abort.signal }), { name: "AbortError" });
});

/** A browser's Worker on Node's worker_threads: runs the Blob URL's script with `self`,
 * `postMessage` and `onmessage` as in a browser's dedicated worker. */
class BlobWorker {
  static made = 0;
  static solved = [];
  constructor(url) {
    BlobWorker.made += 1;
    const blob = resolveObjectURL(url);
    if (!blob) throw new Error(`no blob at ${url}`);
    const prelude = "const {parentPort}=require('node:worker_threads');globalThis.self=globalThis;" +
      "globalThis.postMessage=(d)=>parentPort.postMessage(d);parentPort.on('message',(d)=>self.onmessage({data:d}));\n";
    this.thread = blob.text().then((src) => {
      const t = new ThreadWorker(prelude + src, { eval: true });
      t.on("message", (data) => {
        if (data.nonce !== undefined) BlobWorker.solved.push(data.nonce);
        this.onmessage?.({ data });
      });
      t.on("error", (e) => this.onerror?.(e));
      return t;
    });
  }
  postMessage(data) { this.thread.then((t) => t.postMessage(data)); }
  terminate() { this.thread.then((t) => t.terminate()); }
}

test("in a browser the work runs in a Blob Web Worker (the same nonce); a worker that cannot start falls back inline", async () => {
  const seed = "q2bXw1pXzKJ5s0l7a9dFdg.1765000000.14.3v0cM4bA0sJpKx1q1mZ6Qm9o5tU3yWq8s2Ff7uYH2kE";
  const progress = [];
  try {
    globalThis.Worker = BlobWorker;
    const got = await solvePow(seed, 14, { onProgress: (t) => progress.push(t) });
    assert.equal(BlobWorker.made, 1, "a worker started");
    assert.equal(got.nonce, firstNonce(seed, 14));
    assert.deepEqual(BlobWorker.solved, [got.nonce], "the worker found it");
    if (Number(got.nonce) >= 16384) assert.ok(progress.length > 0, "the worker reports progress");
    // A Content-Security-Policy without blob: in worker-src: the constructor throws.
    globalThis.Worker = class { constructor() { throw new Error("refused by the CSP"); } };
    assert.equal((await solvePow(seed, 14)).nonce, got.nonce);
  } finally {
    delete globalThis.Worker;
  }
});

/** A fetch that records each request's method, headers and answer, passing it to `inner`. */
function recorder(inner = fetch) {
  const sent = [];
  const f = async (url, init) => {
    const resp = await inner(url, init);
    const body = await resp.clone().json().catch(() => null);
    sent.push({ method: init.method, url, headers: { ...init.headers }, status: resp.status, body });
    return resp;
  };
  f.sent = sent;
  return f;
}

/** A vq with proof of work at entry (and a Redis of its own: `vq pow set` changes it for every
 * instance there), admitting one user every 200 ms. */
async function powServe(env = {}) {
  const url = await redis();
  return { url, base: await serve({ VQ_REDIS__URL: url, VQ_ENTRY__POW_BITS: "10", VQ_QUEUE__TICK_MS: "200", VQ_QUEUE__BATCH_SIZE: "1", ...env }) };
}

function vqOn(redisAt, ...args) {
  return spawnSync(VQ, args, { env: { ...clean, VQ_REDIS__URL: redisAt, VQ_TOKEN_SECRET: SECRET, VQ_TARGETS__RANGES: TARGETS } });
}

let pow;
test("proof of work at entry (10 bits): solved with progress shown, entered with the solution, admitted", async () => {
  pow = await powServe();
  const seen = [];
  const rec = recorder();
  const room = new WaitingRoom({ baseUrl: pow.base, type: "limited-drop", id: 40, userId: 11, fetch: rec, onUpdate: (s) => seen.push(s) });
  const done = await room.wait();
  assert.equal(done.status, "ADMITTED", JSON.stringify(seen));
  vq("verify", done.entryToken, "--target", "limited-drop:40", "--user", "11");
  // First a challenge and no place; then the solution, which vq checks with the same hash.
  const [first, second] = rec.sent;
  assert.equal(first.method, "POST");
  assert.equal(first.headers["X-Pow-Seed"], undefined);
  assert.equal(first.body.status, "CHALLENGE");
  const { seed, bits } = first.body.challenge;
  assert.equal(bits, 10);
  assert.equal(second.method, "POST");
  assert.equal(second.headers["X-Pow-Seed"], seed);
  assert.match(second.headers["X-Pow-Nonce"], /^[0-9]{1,64}$/);
  assert.ok(zeroBits(seed, second.headers["X-Pow-Nonce"]) >= 10);
  assert.equal(second.status, 200);
  assert.ok(["WAITING", "ADMITTED"].includes(second.body.status), JSON.stringify(second.body));
  // Progress through onUpdate: 0 first, 1 once solved, nothing in between out of 0..1.
  const challenge = seen.filter((s) => s.status === "CHALLENGE");
  assert.equal(challenge[0].progress, 0);
  assert.equal(challenge.at(-1).progress, 1);
  assert.ok(challenge.every((s) => s.bits === 10 && s.progress >= 0 && s.progress <= 1 && s.expiresAt), JSON.stringify(challenge));
  // Only the enter after a challenge carries a solution: the polls carry none.
  assert.ok(rec.sent.slice(2).every((r) => r.headers["X-Pow-Seed"] === undefined));
});

test("a solution refused because the difficulty rose meanwhile (vq pow set) gets a fresh challenge, then a place", async () => {
  const raised = await powServe();
  let raisedYet = false;
  // Between the first challenge and its solution, the operator raises the difficulty to 12
  // bits, and every instance has taken it (a new user's challenge asks 12).
  const raising = async (url, init) => {
    const resp = await fetch(url, init);
    const body = await resp.clone().json().catch(() => null);
    if (!raisedYet && body?.challenge?.bits === 10) {
      raisedYet = true;
      const out = vqOn(raised.url, "pow", "set", "12");
      // With no instance confirming in time it still says so; the write is what counts.
      assert.match(out.stdout.toString(), /flag written/, out.stderr.toString());
      await until("12 bits in force", async () => {
        const r = await fetch(url, { method: "POST", headers: { "X-User-Id": "probe" } });
        return (await r.json()).challenge?.bits === 12;
      });
    }
    return resp;
  };
  const seen = [];
  const room = new WaitingRoom({ baseUrl: raised.base, type: "limited-drop", id: 41, userId: 12, fetch: raising, onUpdate: (s) => seen.push(s) });
  const done = await room.wait();
  assert.equal(done.status, "ADMITTED", JSON.stringify(seen));
  vq("verify", done.entryToken, "--target", "limited-drop:41", "--user", "12");
  const refused = seen.find((s) => s.status === "POW_REFUSED");
  assert.ok(refused, JSON.stringify(seen));
  assert.match(refused.detail, /asks for 10 bits, the queue now 12/);
  assert.equal(refused.attempt, 1);
  const bits = seen.filter((s) => s.status === "CHALLENGE" && s.progress === 0).map((s) => s.bits);
  assert.deepEqual(bits, [10, 12]);
});

test("solutions refused every time end the wait with a QueueError after maxPowAttempts, not a loop", async () => {
  let solutions = 0;
  // Every solution is altered into a nonce that does not solve its seed: vq refuses each.
  const wrong = async (url, init) => {
    const seed = init.headers["X-Pow-Seed"];
    if (seed) {
      solutions += 1;
      const bits = Number(seed.split(".")[2]);
      let n = 0;
      while (zeroBits(seed, String(n)) >= bits) n++;
      init = { ...init, headers: { ...init.headers, "X-Pow-Nonce": String(n) } };
    }
    return fetch(url, init);
  };
  const seen = [];
  const room = new WaitingRoom({ baseUrl: pow.base, type: "limited-drop", id: 42, userId: 13, fetch: wrong, onUpdate: (s) => seen.push(s) });
  await assert.rejects(room.wait(), (e) => e instanceof QueueError && e.status === 403 && e.code === "POW_REFUSED" &&
    /does not solve/.test(e.detail) && /3 proofs of work in a row/.test(e.detail));
  assert.equal(solutions, 3);
  assert.deepEqual(seen.filter((s) => s.status === "POW_REFUSED").map((s) => s.attempt), [1, 2]);
  const r = await fetch(`${pow.base}/virtual-queues/limited-drop/42/entries/me`, { headers: { "X-User-Id": "13" } });
  assert.equal(r.status, 404, "no place");
});

test("a proxy that drops the solution's headers ends the wait with POW_IGNORED after maxPowAttempts", async () => {
  let posts = 0;
  const dropping = async (url, init) => {
    posts += 1;
    const { "X-Pow-Seed": _s, "X-Pow-Nonce": _n, ...headers } = init.headers;
    return fetch(url, { ...init, headers });
  };
  const room = new WaitingRoom({ baseUrl: pow.base, type: "limited-drop", id: 42, userId: 14, fetch: dropping, maxPowAttempts: 2 });
  await assert.rejects(room.wait(), { name: "QueueError", status: 200, code: "POW_IGNORED" });
  assert.equal(posts, 3, "a challenge, then two solutions each answered with a new challenge");
});

// ---- Visitor mode ----

// v_<22 chars of id>.<expiry, epoch s>.<signature>
const VISITOR_TOKEN = /^v_[A-Za-z0-9_-]{22}\.[0-9]+\.[A-Za-z0-9_-]+$/;

test("visitor mode: two rooms without a stored token are two visitors; a stored token keeps the place", async () => {
  // Nobody admitted: a minute-long tick, on a Redis of its own.
  const base = await serve({ VQ_REDIS__URL: await redis(), VQ_IDENTITY__MODE: "visitor", VQ_QUEUE__TICK_MS: "60000" });
  const rooms = [];
  const open = (options = {}) => {
    const r = { seen: [], named: [], rec: recorder(), abort: new AbortController() };
    r.room = new WaitingRoom({ baseUrl: base, type: "limited-drop", id: 43, visitor: true, fetch: r.rec,
      onUpdate: (s) => r.seen.push(s), onVisitorToken: (t) => r.named.push(t), ...options });
    r.waiting = r.room.wait({ signal: r.abort.signal, leaveOnAbort: false });
    r.waiting.catch(() => {});
    rooms.push(r);
    return r;
  };
  const placed = (r) => until("a place", () => r.seen.some((s) => s.status === "WAITING")).then(() => r.seen.find((s) => s.status === "WAITING"));
  try {
    const a = open();
    assert.equal((await placed(a)).position, 1);
    const b = open();
    assert.equal((await placed(b)).position, 2);
    assert.match(a.room.visitorToken, VISITOR_TOKEN);
    assert.match(b.room.visitorToken, VISITOR_TOKEN);
    assert.notEqual(a.room.visitorToken, b.room.visitorToken);
    assert.deepEqual(a.named, [a.room.visitorToken], "told once, to store it");
    // No X-User-Id (vq refuses it in this mode), and the first request names nobody (every
    // later one names the visitor vq named: the next tests).
    assert.ok([...a.rec.sent, ...b.rec.sent].every((r) => r.headers["X-User-Id"] === undefined));
    assert.equal(a.rec.sent[0].headers["X-Visitor-Token"], undefined);
    assert.equal(a.rec.sent[0].body.visitorToken, a.room.visitorToken);
    // The app is closed without leaving, and opened again with the token it stored: the same
    // visitor, the same place (and nothing new to store).
    a.abort.abort();
    await assert.rejects(a.waiting, { name: "AbortError" });
    const again = open({ visitorToken: a.named[0] });
    assert.equal((await placed(again)).position, 1);
    assert.equal(again.rec.sent[0].headers["X-Visitor-Token"], a.named[0]);
    assert.equal(again.room.visitorToken, a.named[0]);
    assert.deepEqual(again.named, []);
    // Leaving as that visitor frees visitor a's place.
    await again.room.leave();
    const r = await fetch(`${base}/virtual-queues/limited-drop/43/entries/me`, { headers: { "X-Visitor-Token": a.named[0] } });
    assert.equal(r.status, 404);
  } finally {
    for (const r of rooms) r.abort.abort();
  }
});

test("visitor mode with proof of work: the challenged visitor sends the solution and is admitted as that visitor", async () => {
  const { base } = await powServe({ VQ_IDENTITY__MODE: "visitor" });
  const rec = recorder();
  const room = new WaitingRoom({ baseUrl: base, type: "limited-drop", id: 44, visitor: true, fetch: rec });
  const done = await room.wait();
  assert.equal(done.status, "ADMITTED");
  // The challenge is signed for the visitor vq named with it: the solution goes as that visitor.
  const [challenge, solution] = rec.sent;
  assert.equal(challenge.body.status, "CHALLENGE");
  assert.match(challenge.body.visitorToken, VISITOR_TOKEN);
  assert.equal(solution.headers["X-Visitor-Token"], challenge.body.visitorToken);
  assert.ok(solution.headers["X-Pow-Nonce"]);
  assert.equal(room.visitorToken, challenge.body.visitorToken);
  // Every request after the first: that visitor, and never X-User-Id.
  assert.ok(rec.sent.slice(1).every((r) => r.headers["X-Visitor-Token"] === room.visitorToken));
  assert.ok(rec.sent.every((r) => r.headers["X-User-Id"] === undefined));
  const visitorId = room.visitorToken.split(".")[0];
  vq("verify", done.entryToken, "--target", "limited-drop:44", "--user", visitorId);
});

// ---- In a real browser ----

const CHROMIUM = process.env.CHROMIUM || "chromium";
const hasChromium = spawnSync(CHROMIUM, ["--version"]).status === 0;

/** The page the browser loads: waits with the client (from this page's origin, vq on another)
 * and posts back what happened, with which Worker solved the challenge. */
const browserPage = (vqBase) => `<!doctype html><script type="module">
import { WaitingRoom } from "/index.js";
const Native = window.Worker;
let byWorker = 0;
window.Worker = class extends Native {
  constructor(...a) { super(...a); this.addEventListener("message", (e) => { if (e.data.nonce !== undefined) byWorker++; }); }
};
const report = (o) => fetch("/result", { method: "POST", body: JSON.stringify(o) });
try {
  const room = new WaitingRoom({ baseUrl: ${JSON.stringify(vqBase)}, type: "limited-drop", id: 45, visitor: true });
  const done = await room.wait();
  report({ status: done.status, entryToken: done.entryToken, visitorToken: room.visitorToken, byWorker });
} catch (e) { report({ error: String(e) }); }
</script>`;

/** Loads the page in headless chromium, served with `headers`; resolves what it posted. */
async function inChromium(port, vqBase, headers = {}) {
  let posted;
  const result = new Promise((resolve) => (posted = resolve));
  const server = createHttpServer((req, res) => {
    if (req.url === "/index.js") {
      res.writeHead(200, { "Content-Type": "text/javascript" });
      return res.end(readFileSync(join(here, "../index.js")));
    }
    if (req.url === "/result") {
      let body = "";
      req.on("data", (c) => (body += c));
      req.on("end", () => { res.end(); posted(JSON.parse(body)); });
      return;
    }
    res.writeHead(200, { "Content-Type": "text/html", ...headers });
    res.end(browserPage(vqBase));
  });
  await new Promise((resolve) => server.listen(port, "127.0.0.1", resolve));
  const profile = mkdtempSync(join(dir, "chromium-"));
  // A process group of its own: chromium's renderer, zygote and crash handler are stopped with it.
  const browser = spawn(CHROMIUM, ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    `--user-data-dir=${profile}`, `http://127.0.0.1:${port}/`], { env: clean, stdio: "ignore", detached: true });
  try {
    return await Promise.race([result, new Promise((_, reject) => setTimeout(() => reject(new Error("no result from chromium in 60 s")), 60_000))]);
  } finally {
    try {
      process.kill(-browser.pid, "SIGKILL");
    } catch {}
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
}

test("in headless chromium, from another origin: a visitor's work runs in a Blob worker (inline where the CSP forbids workers), then admitted",
  { skip: !hasChromium && `no ${CHROMIUM} here` }, async () => {
    const port = await freePort();
    const base = await serve({ VQ_REDIS__URL: await redis(), VQ_IDENTITY__MODE: "visitor", VQ_ENTRY__POW_BITS: "14",
      VQ_QUEUE__TICK_MS: "200", VQ_HTTP__CORS_ORIGINS: `http://127.0.0.1:${port}` });
    // X-Visitor-Token and X-Pow-* pass vq's CORS preflight; the Blob worker solves it.
    const inWorker = await inChromium(port, base);
    assert.equal(inWorker.status, "ADMITTED", JSON.stringify(inWorker));
    assert.equal(inWorker.byWorker, 1, "solved in the worker");
    assert.match(inWorker.visitorToken, VISITOR_TOKEN);
    vq("verify", inWorker.entryToken, "--target", "limited-drop:45", "--user", inWorker.visitorToken.split(".")[0]);
    // A page whose Content-Security-Policy forbids workers: solved inline, still admitted.
    const inline = await inChromium(port, base, { "Content-Security-Policy": "worker-src 'none'" });
    assert.equal(inline.status, "ADMITTED", JSON.stringify(inline));
    assert.equal(inline.byWorker, 0, "no worker solved it");
    assert.notEqual(inline.visitorToken, inWorker.visitorToken, "another browser profile, another visitor");
  });

test("visitor mode or a user id, not both, not neither; a stored token only in visitor mode", async () => {
  const at = { baseUrl: "http://x", type: "limited-drop", id: 1 };
  assert.throws(() => new WaitingRoom({ ...at, visitor: true, userId: "7" }), TypeError);
  assert.throws(() => new WaitingRoom({ ...at, userId: "7", visitorToken: "v_x.y" }), TypeError);
  assert.throws(() => new WaitingRoom({ ...at }), TypeError);
  assert.throws(() => new WaitingRoom({ ...at, visitor: true, visitorToken: 7 }), TypeError);
  assert.equal(new WaitingRoom({ ...at, visitor: true }).visitorToken, null);
  assert.equal(new WaitingRoom({ ...at, visitor: true, visitorToken: null }).visitorToken, null, "nothing stored yet");
  assert.equal(new WaitingRoom({ ...at, visitor: true, visitorToken: "v_x.y" }).visitorToken, "v_x.y");
  // A visitor not yet named holds no place: leaving asks vq nothing.
  let calls = 0;
  await new WaitingRoom({ ...at, visitor: true, fetch: async () => { calls += 1; return new Response(null, { status: 204 }); } }).leave();
  assert.equal(calls, 0);
});
