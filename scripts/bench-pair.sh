#!/usr/bin/env bash
# Compares two vq builds or settings where single runs cannot: this machine's speed drifts by a
# quarter within minutes, so A and B run side by side on one fresh redis-server and take turns
# (A B B A ...) in short wrk runs, enters first, then polls of the users they entered (entry
# order, as scripts/bench.sh). Prints every pair, then the median B/A per kind.
#
#   [PAIRS=3] [SECS=4] scripts/bench-pair.sh 'A-SPEC' 'B-SPEC'
#
# A spec is `[NAME=VALUE ...]|BINARY`: settings for that vq (e.g. VQ_THREADS=1) and its
# binary, e.g.
#   scripts/bench-pair.sh '|target/release/vq' 'VQ_THREADS=1|target/release/vq'
#   scripts/bench-pair.sh '|/tmp/vq-before' '|target/release/vq'
# Per run: req/s, and Redis' and that vq's CPU µs per request (/proc/<pid>/stat).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { sed -n '7,12p' "$0" >&2; exit 2; }
for spec in "$@"; do
  [[ "$spec" == *"|"* ]] || { echo "spec '$spec' has no '|BINARY'" >&2; exit 2; }
  [ -x "${spec#*|}" ] || { echo "no vq binary at '${spec#*|}'" >&2; exit 2; }
done
command -v wrk >/dev/null && command -v redis-server >/dev/null ||
  { echo "needs wrk and redis-server (scripts/bench.sh installs both)" >&2; exit 2; }
secs="${SECS:-4}"; pairs="${PAIRS:-3}"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }
work=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
rpid=$!; pids+=("$rpid")
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
specs=("$1" "$2"); port=(); vpid=()
for i in 0 1; do
  spec=${specs[i]}
  port[i]=$(free_port)
  # shellcheck disable=SC2086 # the settings are words NAME=VALUE
  env ${spec%%|*} VQ_REDIS__URL="redis://127.0.0.1:$rport" VQ_LISTEN="127.0.0.1:${port[i]}" RUST_LOG=warn \
    VQ_TOKEN_SECRET="bench-secret-0123456789abcdef0123456789" VQ_QUEUE__MAX_CAPACITY=100000000 \
    "${spec#*|}" serve --flag-on >"$work/vq$i.log" 2>&1 &
  vpid[i]=$!; pids+=("${vpid[i]}")
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:${port[i]}/healthz" >/dev/null && break; sleep 0.1; done
  curl -sf "http://127.0.0.1:${port[i]}/healthz" >/dev/null || { echo "vq $i did not start:" >&2; cat "$work/vq$i.log" >&2; exit 1; }
done

run() { # side kind -> "req/s redis-us vq-us"
  local i=$1 kind=$2 target=$(( $1 + 1 )) r0 v0 out n
  r0=$(cpu "$rpid"); v0=$(cpu "${vpid[i]}")
  if [ "$kind" = enter ]; then
    out=$(wrk -t2 -c64 -d"${secs}s" -s scripts/wrk/enter.lua "http://127.0.0.1:${port[i]}" -- 2 "$target")
  else
    out=$(wrk -t2 -c64 -d"${secs}s" -s scripts/wrk/poll.lua "http://127.0.0.1:${port[i]}" -- "$work/users$i.txt" "$target" 2)
  fi
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  awk -v rps="$(awk '/Requests\/sec/ {print $2}' <<<"$out")" -v r=$(( $(cpu "$rpid") - r0 )) \
    -v v=$(( $(cpu "${vpid[i]}") - v0 )) -v n="$n" 'BEGIN {printf "%.0f %.1f %.1f", rps, r * 1e4 / n, v * 1e4 / n}'
}
: >"$work/res"
for kind in enter poll; do
  if [ "$kind" = poll ]; then
    for i in 0 1; do redis-cli -p "$rport" --raw zrange "queue:{LIMITED_DROP:$((i + 1))}:waiting" 0 -1 >"$work/users$i.txt"; done
  fi
  for _ in $(seq "$pairs"); do
    a=$(run 0 "$kind"); b=$(run 1 "$kind"); echo "$kind $a $b" >>"$work/res"
    b=$(run 1 "$kind"); a=$(run 0 "$kind"); echo "$kind $a $b" >>"$work/res"
  done
done
echo "A = $1"
echo "B = $2"
awk '{printf "%-5s A %6d req/s (redis %4.1f, vq %4.1f us/req) | B %6d req/s (redis %4.1f, vq %4.1f) | B/A %.2f\n", $1, $2, $3, $4, $5, $6, $7, $5 / $2}' "$work/res"
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
for kind in enter poll; do
  echo "$kind: median B/A $(awk -v k=$kind '$1 == k {printf "%.3f\n", $5 / $2}' "$work/res" | median) over $(( pairs * 2 )) pairs"
done
