// Verifies vq entry tokens in a Node process, exactly as vq's gate does (src/token.rs):
// `base64url(payload) "." base64url(HMAC-SHA256(secret, payload))`, no padding, payload
// `TYPE|id|user|expiresAtEpochSec`. No dependencies: node:crypto only.
//
// What this cannot do: one-time use of a token and pacing need vq's Redis; only vq's gate
// (or /gate/verify) does those.

import { createHmac, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';

// A target type as vq spells it (any the operator configures): the name in tokens
// (LIMITED_DROP), the slug in URLs (limited-drop), at most 32 characters.
const TYPE_NAME = /^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$/;
const TYPE_SLUG = /^[a-z][a-z0-9]*(-[a-z0-9]+)*$/;
const MAX_TYPE_LEN = 32;
// A user id as vq takes it (src/domain/target.rs, is_user_id_byte): 1 to 128 characters, each an
// ASCII letter, a digit or one of - _ . : @ +, compared exactly as sent (no normalising: `007`
// and `7` are two users). None of them is `|`, so the payload's four fields stay unambiguous.
const USER_ID = /^[A-Za-z0-9._:@+-]{1,128}$/;
const NO_USER = 'X-User-Id is missing or not a user id: expected 1 to 128 characters, each a letter, a digit or one of - _ . : @ +';
const U64_MAX = (1n << 64n) - 1n;
const MIN_SECRET_LEN = 32;
const MIN_DISTINCT_BYTES = 8;
const ASCII_WHITESPACE = new Set([0x20, 0x09, 0x0a, 0x0c, 0x0d]);

/** Why a secret is refused (as `vq serve` refuses it at start). */
export class SecretError extends Error {
  constructor(reason, message) {
    super(message);
    this.name = 'SecretError';
    this.reason = reason; // too_short | whitespace | low_entropy | previous_is_current | missing
  }
}

/** The key bytes of a secret: a string's UTF-8 bytes (never base64-decoded), or a Buffer as is. */
function keyBytes(secret, origin) {
  const bytes = typeof secret === 'string' ? Buffer.from(secret, 'utf8') : Buffer.from(secret ?? []);
  if (bytes.length < MIN_SECRET_LEN) throw new SecretError('too_short', `${origin} is ${bytes.length} bytes long: it must be at least 32 bytes`);
  if (bytes.every((b) => ASCII_WHITESPACE.has(b))) throw new SecretError('whitespace', `${origin} is only whitespace`);
  const distinct = new Set(bytes).size;
  if (distinct < MIN_DISTINCT_BYTES) throw new SecretError('low_entropy', `${origin} has only ${distinct} distinct characters (at least 8 needed)`);
  return bytes;
}

function parsePositive(s) {
  // vq: a u64 above 0, ASCII digits only (leading zeros allowed, no sign).
  if (typeof s !== 'string' || !/^[0-9]+$/.test(s)) return null;
  const n = BigInt(s);
  return n > 0n && n <= U64_MAX ? n : null;
}

/**
 * The expected user id as the caller gives it: a string as is; a safe integer or a BigInt as its
 * decimal digits (String(n)), a convenience for shops with integer ids. Null when it is not a
 * user id (an unsafe integer is refused too: its digits may not be the id the caller meant).
 */
function expectedUser(user) {
  let s;
  if (typeof user === 'string') s = user;
  else if (typeof user === 'bigint' || (typeof user === 'number' && Number.isSafeInteger(user))) s = String(user);
  else return null;
  return USER_ID.test(s) ? s : null;
}

function decodeB64url(s) {
  // vq's decoder (base64 URL_SAFE_NO_PAD) is strict: its alphabet only, no padding, and the
  // canonical encoding only (unused bits zero). Buffer.from(…, 'base64url') is not.
  if (!/^[A-Za-z0-9_-]*$/.test(s) || s.length % 4 === 1) return null;
  const bytes = Buffer.from(s, 'base64url');
  return bytes.toString('base64url') === s ? bytes : null;
}

const UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

class Malformed extends Error {}

/**
 * Splits and decodes a token without checking its signature (vq's `token::decode`): the one
 * place that knows the payload's fields. Throws Malformed with vq's reason.
 */
function decodeToken(raw) {
  const dot = raw.indexOf('.');
  if (dot < 0) throw new Malformed('no `.` separator');
  const payload = decodeB64url(raw.slice(0, dot));
  if (!payload) throw new Malformed('payload is not base64url');
  const sig = decodeB64url(raw.slice(dot + 1));
  if (!sig) throw new Malformed('signature is not base64url');
  let text;
  try {
    text = UTF8.decode(payload);
  } catch {
    throw new Malformed('payload is not text');
  }
  const parts = text.split('|');
  if (parts.length !== 4) throw new Malformed('payload is not TYPE|id|user|expiry');
  const [type, id, user, exp] = parts;
  if (type.length > MAX_TYPE_LEN || !TYPE_NAME.test(type)) throw new Malformed('bad target type');
  const targetId = parsePositive(id);
  if (targetId === null) throw new Malformed('bad target id');
  if (!USER_ID.test(user)) throw new Malformed('bad user id');
  // The expiry is any u64 as Rust parses it: a leading + is accepted.
  if (!/^\+?[0-9]+$/.test(exp) || BigInt(exp) > U64_MAX) throw new Malformed('bad expiry');
  const claims = { type, id: targetId, user, expiresAt: BigInt(exp) };
  return { claims, payload, sig };
}

function refuse(reason, detail) {
  return { valid: false, reason, detail };
}

/** A `{type, id}` as a route gives it (`LIMITED_DROP` or `limited-drop`; a decimal id). */
function expectedTarget(type, id) {
  const ok = typeof type === 'string' && type.length <= MAX_TYPE_LEN && (TYPE_NAME.test(type) || TYPE_SLUG.test(type));
  if (!ok) throw new TypeError(`\`${type}\` is not a target type: expected a slug such as limited-drop or its name, LIMITED_DROP`);
  const t = type.toUpperCase().replaceAll('-', '_');
  const n = parsePositive(typeof id === 'string' ? id : String(id));
  if (n === null || (typeof id === 'number' && !Number.isSafeInteger(id))) throw new TypeError(`\`${id}\` is not a positive 64-bit integer id`);
  return { type: t, id: n };
}

export class Verifier {
  /**
   * @param {string|Buffer} secret the current VQ_TOKEN_SECRET
   * @param {{previous?: string|Buffer}} [options] the retired VQ_TOKEN_SECRET_PREVIOUS, during a rotation
   */
  constructor(secret, { previous } = {}) {
    const keys = [['current', keyBytes(secret, 'the secret')]];
    if (previous !== undefined && previous !== null) {
      const old = keyBytes(previous, 'the previous secret');
      if (old.equals(keys[0][1])) throw new SecretError('previous_is_current', 'the previous secret equals the current one');
      keys.push(['previous', old]);
    }
    this.#keys = keys;
  }

  #keys;

  /** From VQ_TOKEN_SECRET (or the file named by VQ_TOKEN_SECRET_FILE) and VQ_TOKEN_SECRET_PREVIOUS(_FILE), as vq reads them. */
  static fromEnv(env = process.env) {
    const read = (name) => {
      if (env[name]) return env[name];
      const file = env[`${name}_FILE`];
      if (!file) return undefined;
      let bytes = readFileSync(file);
      let end = bytes.length;
      while (end > 0 && (bytes[end - 1] === 0x0a || bytes[end - 1] === 0x0d)) end--;
      return bytes.subarray(0, end);
    };
    const secret = read('VQ_TOKEN_SECRET');
    if (secret === undefined) throw new SecretError('missing', 'VQ_TOKEN_SECRET is not set (nor VQ_TOKEN_SECRET_FILE)');
    return new Verifier(secret, { previous: read('VQ_TOKEN_SECRET_PREVIOUS') });
  }

  /**
   * Every check vq's gate makes, in its order: a user id, a token, well-formed, signed by one
   * of the keys (constant time), unexpired, for this type, target id and user.
   *
   * @param {string} type the target type's name, LIMITED_DROP (or its slug, limited-drop)
   * @param {string|number|bigint} id the target id the request is for; invalid ids throw TypeError
   * @param {string|number|bigint|undefined} user the buyer's id (X-User-Id): 1 to 128 characters,
   *        each an ASCII letter, a digit or one of - _ . : @ +, compared exactly; a safe integer or
   *        a BigInt stands for its decimal digits. Anything else: no_user
   * @param {string|undefined} token the X-Entry-Token
   * @param {number} [nowSec] epoch seconds (default: now)
   * @returns {{valid: true, key: 'current'|'previous', claims: {type: string, id: bigint, user: string, expiresAt: bigint}}
   *          | {valid: false, reason: string, detail: string}}
   */
  verify(type, id, user, token, nowSec = Math.floor(Date.now() / 1000)) {
    const target = expectedTarget(type, id);
    const userId = expectedUser(user);
    if (userId === null) return refuse('no_user', NO_USER);
    if (typeof token !== 'string' || token === '') return refuse('missing', 'no entry token: send the X-Entry-Token header');
    let decoded;
    try {
      decoded = decodeToken(token);
    } catch (e) {
      if (e instanceof Malformed) return refuse('malformed', `the entry token is malformed: ${e.message}`);
      throw e;
    }
    const { claims, payload, sig } = decoded;
    const key = this.#keys.find(([, k]) => {
      const mac = createHmac('sha256', k).update(payload).digest();
      return sig.length === mac.length && timingSafeEqual(sig, mac);
    });
    if (!key) return refuse('bad_signature', "the entry token's signature does not match");
    if (claims.expiresAt <= BigInt(nowSec)) return refuse('expired', `the entry token expired at ${claims.expiresAt} (epoch seconds)`);
    if (claims.type !== target.type) return refuse('wrong_type', `the entry token is for ${claims.type}, not ${target.type}`);
    if (claims.id !== target.id) return refuse('wrong_target', `the entry token is for ${claims.type}:${claims.id}, not ${target.type}:${target.id}`);
    if (claims.user !== userId) return refuse('wrong_user', 'the entry token belongs to another user');
    return { valid: true, key: key[0], claims };
  }
}

function deny(res, status, code, detail) {
  res.statusCode = status;
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify({ code, detail }));
}

/**
 * Express-style middleware `(req, res, next)` (plain node:http works too). Mount it on the
 * purchase route itself, so the framework's routing decides what it guards:
 *
 *   app.post('/limited-drops/:dropId/orders',
 *     entryTokenGate(verifier, { target: (req) => ['LIMITED_DROP', req.params.dropId] }), handler);
 *
 * Refuses with vq's answers: 403 QUEUE_BYPASS_DENIED {code, detail}; 400 INVALID_REQUEST for
 * an identity header sent twice or a target id that is not one. Passes with `req.entryToken`
 * = the verdict (claims and key).
 *
 * @param {Verifier} verifier
 * @param {{target: (req) => [string, string|number|bigint], user?: (req) => string|undefined}} options
 *        user: the buyer's id, by default the X-User-Id header (which the proxy in front must set
 *        from the login: vq trusts it as sent)
 */
export function entryTokenGate(verifier, { target, user = (req) => req.headers['x-user-id'] } = {}) {
  if (typeof target !== 'function') throw new TypeError('entryTokenGate needs target: (req) => [type, id]');
  return function vqEntryTokenGate(req, res, next) {
    const raw = req.rawHeaders ?? [];
    for (const name of ['x-user-id', 'x-entry-token']) {
      if (raw.filter((h, i) => i % 2 === 0 && h.toLowerCase() === name).length > 1) {
        const shown = name === 'x-user-id' ? 'X-User-Id' : 'X-Entry-Token';
        return deny(res, 400, 'INVALID_REQUEST', `${shown} sent more than once: send it once`);
      }
    }
    let verdict;
    try {
      const [type, id] = target(req);
      verdict = verifier.verify(type, id, user(req), req.headers['x-entry-token']);
    } catch (e) {
      if (e instanceof TypeError) return deny(res, 400, 'INVALID_REQUEST', e.message);
      return next(e);
    }
    if (!verdict.valid) return deny(res, 403, 'QUEUE_BYPASS_DENIED', verdict.detail);
    req.entryToken = verdict;
    return next();
  };
}
