#!/usr/bin/env bash
# Benchmarks vq on this machine, on a fresh redis-server, everything on 127.0.0.1.
#
#   [ROUNDS=n] [POLL_ORDER=cycle|random] [VQ_THREADS=n] scripts/bench.sh [wrk] [seconds] [connections]
#       wrk against enter and poll (req/s, P50/P99), 64 connections, 10 s each, next to the
#       calibration: a bare axum handler doing one EVALSHA ("return 1") per request
#       (examples/bare_evalsha.rs), the ceiling of any Redis-backed handler here; each figure
#       is also put against that handler under the very requests of the run (the same wrk
#       script, path and headers: the client's share of the cost is then the same). With
#       ROUNDS=n the three runs are repeated n times (each round on a target of its own, so
#       the polled queue has the same size every round) and the medians of the shares of the
#       calibration are printed last: this machine's runs differ by a third. Under each run:
#       where the CPU went, in µs per request (server, Redis, wrk and the rest, idle, stolen
#       by the hypervisor), from /proc.
#       Polls go through the queue in entry order, each user once per round, as from users who
#       all poll at the same interval; POLL_ORDER=random picks each polled user at random, the
#       hardest order for Redis (see scripts/wrk/poll.lua). vq runs with its default `threads`
#       (one worker per core) unless VQ_THREADS says otherwise (docs/deploy.md).
#   scripts/bench.sh sale
#       the standard flash-sale scenario with vq loadgen (scripts/bench-loadgen.sh: 100k
#       users at 20k enters/s, polls every 2-3 s, purchases through the gate to a sink).
#
# Installs wrk and redis-server (Debian packages) when missing; builds vq in release.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-wrk}" in
  sale) shift; exec scripts/bench-loadgen.sh "$@" ;;
  wrk) [ $# -gt 0 ] && shift ;;
esac
secs="${1:-10}"; conns="${2:-64}"
poll_order="${POLL_ORDER:-cycle}"
case "$poll_order" in cycle|random) ;; *) echo "POLL_ORDER must be cycle or random, got '$poll_order'" >&2; exit 2 ;; esac

pkgs=()
command -v redis-server >/dev/null 2>&1 || pkgs+=(redis-server)
command -v wrk >/dev/null 2>&1 || pkgs+=(wrk)
if [ ${#pkgs[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi
cargo build --release --quiet --bins --example bare_evalsha

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rport=$(free_port); vport=$(free_port)
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
rpid=$!; pids+=("$rpid")
export VQ_REDIS__URL="redis://127.0.0.1:$rport" VQ_LISTEN="127.0.0.1:$vport" RUST_LOG=warn
export VQ_TOKEN_SECRET="bench-secret-0123456789abcdef0123456789"
export VQ_QUEUE__MAX_CAPACITY=100000000
for _ in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
target/release/vq serve --flag-on >"$work/vq.log" 2>&1 &
vpid=$!; pids+=("$vpid")
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$vport/healthz" >/dev/null && break; sleep 0.1; done

# Where the CPU went during one wrk run, in µs per request: the server's and Redis' own time
# (/proc/<pid>/stat), the rest of the busy time (wrk, and kernel work charged to no process),
# idle, and the time the hypervisor gave to others ("steal" in /proc/stat: on this machine runs
# with much of it are slower by a third). Sets `out` (wrk's output), `cpu` and `stolen_ms`.
cpu_of() { awk '{print $14 + $15}' "/proc/$1/stat"; }
sys_cpu() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $5 + $6, $9}' /proc/stat; }
measured() { # server-pid wrk-args...
  local pid=$1 p0 r0 b0 i0 t0 p1 r1 b1 i1 t1 n; shift
  p0=$(cpu_of "$pid"); r0=$(cpu_of "$rpid"); read -r b0 i0 t0 < <(sys_cpu)
  out=$(wrk -t2 -c"$conns" -d"${secs}s" --latency "$@")
  p1=$(cpu_of "$pid"); r1=$(cpu_of "$rpid"); read -r b1 i1 t1 < <(sys_cpu)
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  stolen_ms=$(( (t1 - t0) * 10 ))
  cpu=$(awk -v n="$n" -v p=$((p1 - p0)) -v r=$((r1 - r0)) -v b=$((b1 - b0)) -v i=$((i1 - i0)) -v t=$((t1 - t0)) 'BEGIN {
    f = 1e4 / n   # clock ticks of 10 ms, per request, in µs
    printf "CPU µs per request: server %.1f, redis %.1f, wrk and the rest %.1f, idle %.1f, stolen %.1f", p * f, r * f, (b - p - r) * f, i * f, t * f }')
}
wrk_rps() { awk '/Requests\/sec/ {print $2}'; }
run() { # name script script-args...   (vq, after the calibration under the same requests)
  local name=$1 script=$2; shift 2
  local same; same=$(wrk -t2 -c"$conns" -d"${secs}s" -s "scripts/wrk/$script" "http://127.0.0.1:$bport" -- "$@" | wrk_rps)
  redis-cli -p "$rport" config resetstat >/dev/null
  measured "$vpid" -s "scripts/wrk/$script" "http://127.0.0.1:$vport" -- "$@"
  local rps p50 p99 non2xx n calls
  rps=$(wrk_rps <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx/ {print $5}' <<<"$out")
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  # Script calls in Redis (enters and polls go out coalesced per target; see src/store/coalesce.rs).
  calls=$(redis-cli -p "$rport" info commandstats | awk -F'[=,]' '/^cmdstat_evalsha:/ {print $2}')
  local share same_share
  share=$(awk -v a="$rps" -v b="$base_rps" 'BEGIN {printf "%.0f", 100*a/b}')
  same_share=$(awk -v a="$rps" -v b="$same" 'BEGIN {printf "%.0f", 100*a/b}')
  printf '%-6s %10s req/s   P50 %-8s P99 %-8s non-2xx %-4s %3s %% of base (%3s %% of its %s under these requests), %.1f users per script call, %s ms stolen\n       %s\n' \
    "$name" "$rps" "$p50" "$p99" "${non2xx:-0}" "$share" "$same_share" "$same" "$(awk -v n="$n" -v c="${calls:-1}" 'BEGIN {print n/c}')" "$stolen_ms" "$cpu"
  shares["$name"]+="$share "
  same_shares["$name"]+="$same_share "
}
declare -A shares same_shares
median() { tr ' ' '\n' | grep . | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
bport=$(free_port)
target/release/examples/bare_evalsha "redis://127.0.0.1:$rport" "127.0.0.1:$bport" >"$work/bare.log" 2>&1 &
bpid=$!; pids+=("$bpid")
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$bport/" >/dev/null && break; sleep 0.1; done
echo "vq bench: wrk -t2 -c$conns -d${secs}s, redis-server $(redis-server --version | awk '{print $3}'), $(nproc) cores shared by wrk, vq (threads = ${VQ_THREADS:-0, one per core}) and redis; polls in $poll_order order"
for round in $(seq "${ROUNDS:-1}"); do
  [ "${ROUNDS:-1}" -gt 1 ] && echo "round $round"
  measured "$bpid" "http://127.0.0.1:$bport/"
  base_rps=$(wrk_rps <<<"$out")
  printf '%-6s %10s req/s   P50 %-8s P99 %-8s (bare axum + one EVALSHA "return 1": the ceiling), %s ms stolen\n       %s\n' base \
    "$base_rps" "$(awk '$1=="50%" {print $2}' <<<"$out")" "$(awk '$1=="99%" {print $2}' <<<"$out")" "$stolen_ms" "$cpu"
  run enter enter.lua 2 "$round"
  entered=$(redis-cli -p "$rport" get "queue:{LIMITED_DROP:$round}:seq")
  redis-cli -p "$rport" --raw zrange "queue:{LIMITED_DROP:$round}:waiting" 0 -1 >"$work/users.txt"
  run poll poll.lua "$work/users.txt" "$round" 2 "$poll_order"
done
if [ "${ROUNDS:-1}" -gt 1 ]; then
  echo "median share of the calibration over ${ROUNDS} rounds: enter $(median <<<"${shares[enter]}") %, poll $(median <<<"${shares[poll]}") %"
  echo "median share of the calibration under the same requests: enter $(median <<<"${same_shares[enter]}") %, poll $(median <<<"${same_shares[poll]}") %"
fi
echo "users entered in the last round: $entered; redis used_memory: $(redis-cli -p "$rport" info memory | awk -F: '/^used_memory_human/ {print $2}' | tr -d '\r')"
