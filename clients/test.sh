#!/usr/bin/env bash
# Runs the three verifiers' suites (Node, Python, Java) against the shared vectors
# (test-vectors.json); given a vq binary (first argument, or VQ_BIN), also checks every verifier
# against tokens that `vq mint` signs (test-against-vq.sh). Every suite runs; the script fails
# when any of them failed. Needs node (18+), python3 (3.9+), a JDK (11+) and the Jakarta
# Servlet API jar (Debian: libjakarta-servlet-api-java), which ../scripts/test.sh installs.
set -euo pipefail
cd "$(dirname "$0")"

SERVLET_JAR=${SERVLET_JAR:-/usr/share/java/jakarta-servlet-api.jar}
failed=()
suite() { # name command...
  local name=$1; shift
  echo "==> clients: $name"
  "$@" || failed+=("$name")
}

java_suite() {
  local classes
  classes=$(mktemp -d "${TMPDIR:-/tmp}/vq-java.XXXXXX")
  # shellcheck disable=SC2064 # the directory is known now
  trap "rm -rf '$classes'" RETURN
  # shellcheck disable=SC2046 # the source paths hold no spaces
  javac --release 11 -Xlint:all -Werror -d "$classes" -cp "$SERVLET_JAR" $(find java/src -name '*.java') &&
    java -cp "$classes:$SERVLET_JAR" vq.token.EntryTokenVerifierTest test-vectors.json
}

suite node node --test --test-reporter=spec node/test/
suite python bash -c 'cd python && python3 -m unittest discover -s tests'
suite java java_suite
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
