// Run in a scratch project that installed the packed package (../../test.sh): the package
// resolves by its name, and verifies a token of the shared vectors as vq does.
import { readFileSync } from 'node:fs';
import { Verifier } from 'vq-entry-token';

const vectors = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const c = vectors.cases.find((x) => x.name === 'valid');
const v = new Verifier(vectors.secrets.current).verify(c.expect.type, c.expect.id, c.expect.user, c.token, Number(c.now));
if (!v.valid || v.claims.user !== c.claims.user) {
  console.error('the installed package refused the vectors\' valid token:', v);
  process.exit(1);
}
console.log('vq-entry-token installed from its tarball verifies a token');
