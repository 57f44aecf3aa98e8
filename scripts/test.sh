#!/usr/bin/env bash
# Runs every test of vq: installs what the suite needs when missing (Debian packages, as
# root or through sudo; the Python API tools in target/venv), runs the alert rules' unit tests
# with promtool, then the whole suite with cargo-nextest (cargo test without it).
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

needs=(redis-server python3 promtool=prometheus /usr/sbin/nginx=nginx)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || needs+=(python3-venv)
install_missing "${needs[@]}"
# The waiting page's tests drive Debian's chromium; where it cannot be installed they are
# skipped, and say so.
if ! install_missing /usr/bin/chromedriver=chromium-driver chromium; then
  echo "WARNING: chromium could not be installed: the browser tests are SKIPPED"
  export BROWSER_TESTS=skip
fi

# openapi-spec-validator and schemathesis check docs/openapi.json and fuzz the live API.
venv=target/venv
tools=(openapi-spec-validator==0.9.0 schemathesis==4.32.5)
if ! [ -x "$venv/bin/schemathesis" ] || ! [ -x "$venv/bin/openapi-spec-validator" ]; then
  echo "installing into $venv: ${tools[*]}"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "${tools[@]}"
fi

promtool test rules deploy/prometheus/alerts_test.yml

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast "$@"
else
  cargo test --no-fail-fast "$@"
fi
