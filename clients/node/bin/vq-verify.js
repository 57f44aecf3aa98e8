#!/usr/bin/env node
// vq-verify TYPE ID USER TOKEN: the verdict as JSON (keys from VQ_TOKEN_SECRET[_FILE] and
// VQ_TOKEN_SECRET_PREVIOUS[_FILE], as vq reads them); exit 0 valid, 1 invalid, 2 usage. USER is
// the user id as X-User-Id gives it (a string: a UUID, user_8f3k or 7 alike).
import { Verifier } from '../index.js';

const args = process.argv.slice(2);
if (args.length !== 4) {
  console.error('usage: vq-verify TYPE ID USER TOKEN');
  process.exit(2);
}
const verdict = Verifier.fromEnv().verify(...args);
console.log(JSON.stringify(verdict, (_, v) => (typeof v === 'bigint' ? v.toString() : v)));
process.exit(verdict.valid ? 0 : 1);
