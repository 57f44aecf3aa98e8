// The shared vectors (../test-vectors.json, vq's own verdicts) and the middleware.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { readFileSync, writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Verifier, SecretError, entryTokenGate } from '../index.js';

const vectors = JSON.parse(readFileSync(new URL('../../test-vectors.json', import.meta.url)));
const { secrets } = vectors;

function verifierFor(keys) {
  return new Verifier(secrets.current, keys.includes('previous') ? { previous: secrets.previous } : {});
}

/** The verdict in the vectors' terms (decimal strings for numbers). */
function verdictOf(c) {
  let v;
  try {
    v = verifierFor(c.keys).verify(c.expect.type, c.expect.id, c.expect.user, c.token, Number(c.now));
  } catch (e) {
    if (e instanceof TypeError) return { verdict: 'invalid_target', detail: e.message };
    throw e;
  }
  if (!v.valid) return { verdict: v.reason, detail: v.detail };
  const { type, id, user, expiresAt } = v.claims;
  return { verdict: 'valid', key: v.key, claims: { type, id: `${id}`, user: `${user}`, expiresAt: `${expiresAt}` } };
}

test('every shared vector gets vq\'s verdict', () => {
  assert.ok(vectors.cases.length > 40);
  for (const c of vectors.cases) {
    const expected = { verdict: c.verdict };
    for (const k of ['detail', 'key', 'claims']) if (k in c) expected[k] = c[k];
    if (c.verdict === 'invalid_target') {
      // The caller's error: the detail is vq's ParseError text, which the clients need not copy.
      assert.equal(verdictOf(c).verdict, 'invalid_target', c.name);
      continue;
    }
    assert.deepEqual(verdictOf(c), expected, c.name);
  }
});

test('secrets are refused as vq refuses them', () => {
  for (const rule of vectors.secretRules) {
    let verdict = 'accepted';
    try {
      new Verifier(rule.secret);
    } catch (e) {
      assert.ok(e instanceof SecretError, rule.name);
      verdict = e.reason;
    }
    assert.equal(verdict, rule.verdict, rule.name);
  }
  assert.throws(() => new Verifier(secrets.current, { previous: secrets.current }), /previous secret equals/);
});

test('fromEnv reads the variables and files vq reads', () => {
  const dir = mkdtempSync(join(tmpdir(), 'vq-node-'));
  writeFileSync(join(dir, 'old'), `${secrets.previous}\r\n\n`);
  const v = Verifier.fromEnv({ VQ_TOKEN_SECRET: secrets.current, VQ_TOKEN_SECRET_PREVIOUS_FILE: join(dir, 'old') });
  const c = vectors.cases.find((x) => x.name === 'signed with the previous key, during a rotation');
  assert.equal(v.verify('LIMITED_DROP', '42', '7', c.token, Number(c.now)).key, 'previous');
  assert.throws(() => Verifier.fromEnv({}), SecretError);
});

function fakeExchange(headers, rawHeaders) {
  const req = { headers, rawHeaders: rawHeaders ?? Object.entries(headers).flat(), params: { dropId: '42' } };
  const res = { statusCode: 200, headers: {}, body: null, setHeader(k, v) { this.headers[k] = v; }, end(b) { this.body = JSON.parse(b); } };
  return { req, res };
}

test('the middleware passes a valid token and refuses as vq does', () => {
  const valid = vectors.cases.find((x) => x.name === 'valid');
  const gate = entryTokenGate(verifierFor(['current']), { target: (req) => ['LIMITED_DROP', req.params.dropId] });
  const now = Math.floor(Date.now() / 1000);
  const run = (headers, raw) => {
    const { req, res } = fakeExchange(headers, raw);
    let passed = false;
    gate(req, res, () => { passed = true; });
    return { req, res, passed };
  };
  // The vectors' valid token expired long ago in real time: the expiry is what refuses it.
  const old = run({ 'x-user-id': '7', 'x-entry-token': valid.token });
  assert.equal(old.passed, false);
  assert.equal(old.res.statusCode, 403);
  assert.deepEqual(old.res.body, { code: 'QUEUE_BYPASS_DENIED', detail: 'the entry token expired at 1767225600 (epoch seconds)' });
  // A fresh token minted here with the same format.
  const fresh = mint(secrets.current, `LIMITED_DROP|42|7|${now + 60}`);
  const ok = run({ 'x-user-id': '7', 'x-entry-token': fresh });
  assert.equal(ok.passed, true);
  assert.equal(ok.req.entryToken.claims.user, '7');
  assert.equal(run({ 'x-user-id': '8', 'x-entry-token': fresh }).res.body.detail, 'the entry token belongs to another user');
  assert.equal(run({ 'x-user-id': '7' }).res.body.detail, 'no entry token: send the X-Entry-Token header');
  const twice = run({ 'x-user-id': '7', 'x-entry-token': fresh }, ['X-User-Id', '7', 'x-user-id', '7', 'X-Entry-Token', fresh]);
  assert.equal(twice.res.statusCode, 400);
  assert.equal(twice.res.body.code, 'INVALID_REQUEST');
  // An opaque user id, as a shop with UUIDs sends it; compared exactly, so its upper case is another user.
  const uuid = '3f2a9c1e-7b4d-4c1e-9a8f-2b6c1d0e9f3a';
  const forUuid = mint(secrets.current, `LIMITED_DROP|42|${uuid}|${now + 60}`);
  const byUuid = run({ 'x-user-id': uuid, 'x-entry-token': forUuid });
  assert.equal(byUuid.passed, true);
  assert.equal(byUuid.req.entryToken.claims.user, uuid);
  assert.equal(run({ 'x-user-id': uuid.toUpperCase(), 'x-entry-token': forUuid }).res.body.detail, 'the entry token belongs to another user');
  // Node joins a repeated header it does not know into "a, b": not a user id.
  const joined = run({ 'x-user-id': '7, 7', 'x-entry-token': fresh }, ['x-user-id', '7, 7', 'x-entry-token', fresh]);
  assert.equal(joined.res.statusCode, 403);
  assert.match(joined.res.body.detail, /^X-User-Id is missing or not a user id: /);
  const badId = entryTokenGate(verifierFor(['current']), { target: () => ['LIMITED_DROP', '42abc'] });
  const { req, res } = fakeExchange({ 'x-user-id': '7', 'x-entry-token': fresh });
  badId(req, res, () => assert.fail('passed'));
  assert.equal(res.statusCode, 400);
});

/** A token as vq mints one (the format is the contract; the vectors prove it). */
function mint(secret, payload) {
  const sig = createHmac('sha256', secret).update(payload).digest('base64url');
  return `${Buffer.from(payload).toString('base64url')}.${sig}`;
}

const NOW = 1767225300;
const TOKEN_FOR_7 = mint(secrets.current, 'LIMITED_DROP|42|7|1767225600');

test('a user id is 1 to 128 of the characters vq allows, and nothing else', () => {
  const v = verifierFor(['current']);
  // vq's is_user_id_byte: ASCII letters, digits and - _ . : @ +. Every other ASCII character,
  // in the middle of an id, makes it no user id; each allowed one makes it another user's.
  const allowed = /[A-Za-z0-9._:@+-]/;
  for (let b = 0; b < 128; b++) {
    const c = String.fromCharCode(b);
    const want = allowed.test(c) ? 'wrong_user' : 'no_user';
    assert.equal(v.verify('LIMITED_DROP', '42', `a${c}b`, TOKEN_FOR_7, NOW).reason, want, `byte ${b}`);
  }
  assert.equal(v.verify('LIMITED_DROP', '42', 'u'.repeat(128), TOKEN_FOR_7, NOW).reason, 'wrong_user');
  assert.equal(v.verify('LIMITED_DROP', '42', 'u'.repeat(129), TOKEN_FOR_7, NOW).reason, 'no_user');
  // A JavaScript $ never matches before a final newline, but be explicit about it.
  assert.equal(v.verify('LIMITED_DROP', '42', '7\n', TOKEN_FOR_7, NOW).reason, 'no_user');
  // And in the token: a payload user id outside the rule is malformed.
  const bad = mint(secrets.current, 'LIMITED_DROP|42|a/b|1767225600');
  assert.equal(v.verify('LIMITED_DROP', '42', '7', bad, NOW).detail, 'the entry token is malformed: bad user id');
});

test('a number as the user id stands for its decimal digits', () => {
  const v = verifierFor(['current']);
  for (const user of [7, 7n, '7']) {
    const got = v.verify('LIMITED_DROP', '42', user, TOKEN_FOR_7, NOW);
    assert.equal(got.valid, true, `${typeof user} ${user}`);
    assert.equal(got.claims.user, '7');
  }
  assert.equal(v.verify('LIMITED_DROP', '42', 8, TOKEN_FOR_7, NOW).reason, 'wrong_user');
  // Digits a double cannot hold exactly, fractions and other values are no user id.
  for (const user of [2 ** 53, 7.5, NaN, undefined, null, true, ['7'], { toString: () => '7' }]) {
    assert.equal(v.verify('LIMITED_DROP', '42', user, TOKEN_FOR_7, NOW).reason, 'no_user', String(user));
  }
});
