#!/usr/bin/env bash
# Runs every test of vq: installs what the suite needs when missing (Debian packages, as
# root or through sudo; the Python API tools in target/venv), checks the alert rules with
# promtool, then the whole suite with cargo-nextest (cargo test without it).
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=()
command -v redis-server >/dev/null 2>&1 || pkgs+=(redis-server)
command -v python3 >/dev/null 2>&1 || pkgs+=(python3)
command -v promtool >/dev/null 2>&1 || pkgs+=(prometheus)
[ -x /usr/sbin/nginx ] || pkgs+=(nginx)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || pkgs+=(python3-venv)
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
if [ ${#pkgs[@]} -gt 0 ]; then
  echo "installing: ${pkgs[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi
# The waiting page's tests drive Debian's chromium; where it cannot be installed they are
# skipped, and say so.
if ! [ -x /usr/bin/chromedriver ]; then
  echo "installing: chromium chromium-driver (waiting page tests)"
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null; }; then
    echo "WARNING: chromium could not be installed: the browser tests are SKIPPED"
    export BROWSER_TESTS=skip
  fi
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
