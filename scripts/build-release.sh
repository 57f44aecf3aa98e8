#!/usr/bin/env bash
# The release build, exactly as the Dockerfile runs it (no container engine is needed to test
# it): a locked release build of vq, installed as OUT_DIR/vq (default target/dist/vq).
#
#   scripts/build-release.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/dist}"
cargo build --release --locked --bin vq
mkdir -p "$out"
install -m 0755 target/release/vq "$out/vq"
"$out/vq" --version >/dev/null
echo "built $out/vq"
