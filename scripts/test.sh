#!/usr/bin/env bash
# Runs every test of vq: installs what the suite needs when missing (Debian packages, as
# root or through sudo), then the whole suite with cargo-nextest (cargo test without it).
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=()
command -v redis-server >/dev/null 2>&1 || pkgs+=(redis-server)
command -v python3 >/dev/null 2>&1 || pkgs+=(python3)
command -v promtool >/dev/null 2>&1 || pkgs+=(prometheus)
if [ ${#pkgs[@]} -gt 0 ]; then
  echo "installing: ${pkgs[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast "$@"
else
  cargo test --no-fail-fast "$@"
fi
