#!/usr/bin/env bash
# Runs the three verifiers' suites (Node, Python, Java) against the shared vectors
# (test-vectors.json), the ecosystems' own checks (node --check and tsc on the declarations,
# compileall and ruff, javac -Xlint -Werror through Maven), and installs each verifier as a user
# does: `npm pack` installed into a scratch project, imported by name and its types compiled; a
# wheel built and pip-installed into a scratch venv; the jar built by `mvn -o test`. Given a vq
# binary (first argument, or VQ_BIN), also checks every verifier against tokens that `vq mint`
# signs (test-against-vq.sh). Every suite runs; the script fails when any of them failed.
#
# Needs node (18+) and npm, python3 (3.9+), a JDK (11+), Debian's Maven with junit5, surefire,
# the compiler/resources/jar plugins, jackson-databind and the Jakarta Servlet API (it builds
# offline on /usr/share/maven-repo), and CLIENT_TOOLS (default ../target/client-tools) holding
# typescript and @types/node (node_modules) and a venv with setuptools and ruff (venv):
# ../scripts/test.sh installs all of them.
set -euo pipefail
# Relative to where the script is called from.
TOOLS=$(realpath -m "${CLIENT_TOOLS:-$(dirname "$0")/../target/client-tools}")
cd "$(dirname "$0")"

SERVLET_JAR=${SERVLET_JAR:-/usr/share/java/jakarta-servlet-api.jar}
failed=()
suite() { # name command...
  local name=$1; shift
  echo "==> clients: $name"
  "$@" || failed+=("$name")
}

TSC=$TOOLS/node_modules/.bin/tsc
TSC_ARGS=(--noEmit --strict --target es2022 --module nodenext --moduleResolution nodenext
  --types node --typeRoots "$TOOLS/node_modules/@types")
VENV=$TOOLS/venv
VECTORS=$(realpath test-vectors.json)

tools_present() {
  [ -x "$TSC" ] && [ -x "$VENV/bin/ruff" ] && [ -x "$VENV/bin/pip" ] || {
    echo "missing in $TOOLS: typescript and @types/node (node_modules), a venv with setuptools and ruff;"
    echo "../scripts/test.sh installs them (or set CLIENT_TOOLS)"
    return 1
  }
}

# The sources as each ecosystem checks them: every script parses, the declarations compile,
# the Python modules compile and pass ruff (its settings in python/pyproject.toml).
ecosystem_checks() {
  local f
  for f in $(find node web -name node_modules -prune -o \( -name '*.js' -o -name '*.mjs' \) -print); do
    node --check "$f" || return 1
  done
  "$TSC" "${TSC_ARGS[@]}" node/index.d.ts web/index.d.ts &&
    PYTHONPYCACHEPREFIX=$(mktemp -d "${TMPDIR:-/tmp}/vq-pycache.XXXXXX") python3 -m compileall -q python &&
    "$VENV/bin/ruff" check --no-cache python
}

# The Node verifier as a user installs it: the tarball `npm pack` makes, installed into a new
# project, imported by its name, and node/check-install/types.ts compiled against it.
node_package() {
  local scratch tarball
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/vq-npm.XXXXXX")
  # shellcheck disable=SC2064 # the directory is known now
  trap "rm -rf '$scratch'" RETURN
  tarball=$(cd node && npm pack --silent --pack-destination "$scratch") &&
    tar -tzf "$scratch/$tarball" | sort | tr '\n' ' ' &&
    echo &&
    (cd "$scratch" && npm init -y >/dev/null && npm install --silent --no-audit --no-fund "./$tarball") &&
    cp node/check-install/smoke.mjs node/check-install/types.ts "$scratch/" &&
    (cd "$scratch" && node smoke.mjs "$VECTORS" && "$TSC" "${TSC_ARGS[@]}" types.ts)
}

# The Python verifier as a user installs it: a wheel built from the sources (a copy:
# setuptools writes build/ and *.egg-info beside them), pip-installed into a new venv, then
# imported there (with its py.typed) and its `vq-verify` run.
python_package() {
  local scratch
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/vq-wheel.XXXXXX")
  # shellcheck disable=SC2064 # the directory is known now
  trap "rm -rf '$scratch'" RETURN
  cp -r python "$scratch/src" &&
    "$VENV/bin/pip" wheel -q --no-deps --no-build-isolation -w "$scratch/dist" "$scratch/src" &&
    python3 -m venv "$scratch/venv" &&
    "$scratch/venv/bin/pip" install -q --no-index "$scratch"/dist/vq_token-*.whl &&
    (cd "$scratch" && venv/bin/python - "$VECTORS" <<'PY'
import json
import sys
from importlib.resources import files

import vq_token

assert "site-packages" in vq_token.__file__, vq_token.__file__
assert files("vq_token").joinpath("py.typed").is_file(), "the wheel lacks py.typed"
vectors = json.load(open(sys.argv[1]))
c = next(x for x in vectors["cases"] if x["name"] == "valid")
e = c["expect"]
v = vq_token.Verifier(vectors["secrets"]["current"]).verify(e["type"], e["id"], e["user"], c["token"], now=int(c["now"]))
assert v and v.claims.user == c["claims"]["user"], v
print("vq-token installed from its wheel verifies a token")
PY
    ) &&
    vq_verify_console_script "$scratch/venv/bin/vq-verify"
}

# The wheel's `vq-verify` refuses the vectors' valid token, long expired by now, as expired.
vq_verify_console_script() {
  local secret token out
  secret=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["secrets"]["current"])' "$VECTORS")
  token=$(python3 -c 'import json, sys; print(next(c["token"] for c in json.load(open(sys.argv[1]))["cases"] if c["name"] == "valid"))' "$VECTORS")
  out=$(VQ_TOKEN_SECRET=$secret "$1" LIMITED_DROP 42 7 "$token") && return 1
  [[ $out == *'"reason": "expired"'* ]] || { echo "vq-verify said: $out"; return 1; }
}

# The Java verifier's Maven build: compiles (javac -Xlint:all -Werror) and runs the JUnit 5
# suite, offline on Debian's repository (java/.mvn/maven.config).
java_suite() {
  (cd java && mvn -o -q -B test)
}

suite node node --test --test-reporter=spec node/test/
suite python bash -c 'cd python && python3 -m unittest discover -s tests'
suite java java_suite
if tools_present; then
  suite "ecosystem checks" ecosystem_checks
  suite "node package, installed" node_package
  suite "python wheel, installed" python_package
else
  failed+=("tools")
fi
vq_bin=${1:-${VQ_BIN:-}}
if [ -n "$vq_bin" ]; then
  suite "tokens from vq mint" ./test-against-vq.sh "$vq_bin" "$SERVLET_JAR"
  suite "web client against vq serve" env VQ_BIN="$(realpath "$vq_bin")" node --test --test-reporter=spec web/test/
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "==> clients: FAILED: ${failed[*]}"
  exit 1
fi
echo "==> clients: all suites passed"
