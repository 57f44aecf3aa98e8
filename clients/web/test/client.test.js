// The queue client against a real `vq serve` and redis-server on loopback (started here, stopped
// by PID): a buyer waits through a paced queue and gets a token vq verifies; scheduled, paused
// and closed sales; a full queue's 429 and an overloaded instance's 503 are waited out as
// Retry-After says; abort leaves the queue. VQ_BIN names the vq binary (default: the debug
// build of this checkout).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { createServer } from "node:net";
import { readFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { WaitingRoom, STATUSES } from "../index.js";

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
  rmSync(dir, { recursive: true, force: true });
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
