#!/usr/bin/env bash
# The release build, exactly as the Dockerfile runs it (no container engine is needed to test
# it): a locked release build of vq, installed as OUT_DIR/vq (default target/dist/vq).
#
#   scripts/build-release.sh [OUT_DIR]
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
out="${1:-target/dist}"
build_release --locked --bin vq
mkdir -p "$out"
install -m 0755 target/release/vq "$out/vq"
"$out/vq" --version >/dev/null
echo "built $out/vq"
