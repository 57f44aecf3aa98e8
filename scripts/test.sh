#!/usr/bin/env bash
# Runs every test of vq: installs what the suite needs when missing (Debian packages, as
# root or through sudo; the Python API tools in target/venv; the clients' tools in
# target/client-tools), fails fast when `cargo fmt --check` or `cargo clippy --all-targets
# -- -D warnings` does, runs the token verifiers' suites and packaging checks in clients/
# (Node, Python, Java: under a minute), then the whole suite with cargo-nextest (cargo test
# without it), then checks the clients' verifiers against tokens signed by the vq binary that
# suite built, the alert rules (scripts/check-alerts.sh) and the local three-replica topology
# behind nginx (scripts/topology-check.sh) with that binary.
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

# The habits every change keeps: formatted, and no clippy warning. Checked first, so a run
# that would fail on them fails in seconds rather than after the suite.
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
cargo fmt --check >/dev/null || die "cargo fmt --check: the code is not formatted as rustfmt.toml says; run \`cargo fmt\`"
cargo clippy --quiet --all-targets -- -D warnings ||
  die "cargo clippy --all-targets -- -D warnings: fix the warnings above"

needs=(redis-server python3 promtool=prometheus /usr/sbin/nginx=nginx caddy wrk curl)
# clients/: node's test runner and npm, a JDK, and Debian's Maven with what the Java verifier's
# pom.xml uses from /usr/share/maven-repo (offline): JUnit 5, surefire, the compiler, resources
# and jar plugins, Jackson (the tests read the vectors) and the Jakarta Servlet API.
needs+=(node=nodejs npm javac=default-jdk-headless mvn=maven)
repo=/usr/share/maven-repo
needs+=("$repo/org/junit/jupiter/junit-jupiter/5.9.2=junit5"
  "$repo/org/apache/maven/plugins/maven-surefire-plugin/2.22.3=libsurefire-java"
  "$repo/org/apache/maven/plugins/maven-compiler-plugin/3.10.1=libmaven-compiler-plugin-java"
  "$repo/org/apache/maven/plugins/maven-resources-plugin/3.3.0=libmaven-resources-plugin-java"
  "$repo/org/apache/maven/plugins/maven-jar-plugin/3.3.0=libmaven-jar-plugin-java"
  "$repo/com/fasterxml/jackson/core/jackson-databind/2.14.0=libjackson2-databind-java"
  /usr/share/java/jakarta-servlet-api.jar=libjakarta-servlet-api-java)
# An instance with its clock a minute off (tests/it/overload.rs) runs under libfaketime.
needs+=(/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1=faketime)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || needs+=(python3-venv)
install_missing "${needs[@]}"
# The waiting page's tests drive Debian's chromium; where it cannot be installed they are
# left out of the run (the summary counts them as skipped) and the script says so.
nextest_skip=() cargo_skip=()
if ! install_missing /usr/bin/chromedriver=chromium-driver chromium; then
  echo "WARNING: chromium could not be installed: the browser tests (browser::) are SKIPPED"
  nextest_skip=(-E 'not test(/^browser::/)') cargo_skip=(-- --skip browser::)
fi

# openapi-spec-validator and schemathesis check docs/openapi.json and fuzz the live API.
venv=target/venv
tools=(openapi-spec-validator==0.9.0 schemathesis==4.32.5)
if ! [ -x "$venv/bin/schemathesis" ] || ! [ -x "$venv/bin/openapi-spec-validator" ]; then
  echo "installing into $venv: ${tools[*]}"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "${tools[@]}"
fi

# clients/test.sh's tools: typescript and @types/node for the declarations, a venv with
# setuptools (a wheel with PEP 639 metadata, built without fetching anything) and ruff.
client_tools=target/client-tools
if ! [ -x "$client_tools/node_modules/.bin/tsc" ] || ! [ -d "$client_tools/node_modules/@types/node" ]; then
  echo "installing into $client_tools: typescript, @types/node"
  npm install --prefix "$client_tools" --silent --no-audit --no-fund typescript@5.9.3 @types/node@20
fi
if ! [ -x "$client_tools/venv/bin/ruff" ]; then
  echo "installing into $client_tools/venv: setuptools, ruff"
  python3 -m venv "$client_tools/venv"
  "$client_tools/venv/bin/pip" install -q setuptools==80.9.0 ruff==0.17.6
fi

# A failing client does not stop the Rust suite; the script fails at the end.
clients_ok=true
CLIENT_TOOLS=$client_tools clients/test.sh || clients_ok=false

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast "${nextest_skip[@]}" "$@"
else
  cargo test --no-fail-fast "$@" "${cargo_skip[@]}"
fi

# The binary the integration tests ran (a separate `cargo build` would rebuild vq with other
# dependency features, ~40 s); built only when the run above did not need it.
vq_bin=${CARGO_TARGET_DIR:-target}/debug/vq
[ -x "$vq_bin" ] || cargo build --bin vq
# Absolute: the clients' scripts run from their own directories.
vq_bin=$(realpath "$vq_bin")
clients/test-against-vq.sh "$vq_bin" || clients_ok=false
# The web client waits in real queues of that binary (its own redis-server and vq serve).
VQ_BIN="$vq_bin" node --test --test-reporter=spec clients/web/test/ || clients_ok=false
# The alert rules (promtool, then a real Prometheus scraping that binary) and the local
# topology (three replicas behind a real nginx, one killed under load), ~40 s together.
ALERTS_VQ="$vq_bin" scripts/check-alerts.sh
TOPOLOGY_VQ="$vq_bin" TOPOLOGY_DIR="$(pwd)/target/topology-check" scripts/topology-check.sh
$clients_ok || die "clients/: a client's suite failed (see above)"
say "clients/: every verifier accepts and refuses vq's tokens as vq does; the web client waits through real queues"
