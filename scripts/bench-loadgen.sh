#!/usr/bin/env bash
# The standard loadgen scenario (issue 5): a fresh redis-server on a free loopback port,
# `vq serve` whose gate forwards to the loadgen's counting sink, `vq flag on`, then
# `vq loadgen` — 100k users arriving at 20k enters/s (5 s of arrivals), a 10 s run, polls
# every 2–3 s, purchases by admitted users — and prints the report.
#
# Starts everything itself, stops exactly what it started (by PID), and is bounded in time.
# Environment knobs (defaults = the standard scenario):
#   BENCH_VQ  vq binary (not VQ_…: that prefix is vq configuration) (default: target/release/vq, built if missing)
#   USERS=100000 RATE=20000 DURATION=10 ARRIVAL=constant CONCURRENCY=256
#   OUT       JSON report path (default: a file in the temp dir, printed at the end)
#   EXTRA     more loadgen flags, e.g. EXTRA="--assert-poll-p95-ms 300"
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
USERS="${USERS:-100000}"
RATE="${RATE:-20000}"
DURATION="${DURATION:-10}"
ARRIVAL="${ARRIVAL:-constant}"
CONCURRENCY="${CONCURRENCY:-256}"
EXTRA="${EXTRA:-}"

if [[ -z "${BENCH_VQ:-}" ]]; then
    BENCH_VQ="$ROOT/target/release/vq"
    [[ -x "$BENCH_VQ" ]] || (cd "$ROOT" && cargo build --release --quiet)
fi

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

WORK="$(mktemp -d)"
OUT="${OUT:-$WORK/report.json}"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    echo "logs: $WORK" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM

REDIS_PORT="$(free_port)"
VQ_PORT="$(free_port)"
SINK_PORT="$(free_port)"

# Output to files, never a pipe: a background redis-server holding a pipe makes `| tail` hang.
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --maxmemory 512mb --maxmemory-policy noeviction >"$WORK/redis.log" 2>&1 &
PIDS+=("$!")
for _ in $(seq 100); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
    sleep 0.05
done
redis-cli -p "$REDIS_PORT" ping >/dev/null || { echo "redis-server did not start" >&2; exit 1; }

export VQ_REDIS__URL="redis://127.0.0.1:$REDIS_PORT"
export VQ_TOKEN_SECRET="${VQ_TOKEN_SECRET:-bench-secret-0123456789abcdef0123456789}"
export VQ_GATE__UPSTREAM="http://127.0.0.1:$SINK_PORT"
RUST_LOG=warn "$BENCH_VQ" serve --listen "127.0.0.1:$VQ_PORT" >"$WORK/serve.log" 2>&1 &
PIDS+=("$!")
for _ in $(seq 200); do
    curl -fs "http://127.0.0.1:$VQ_PORT/healthz" >/dev/null 2>&1 && break
    sleep 0.05
done
curl -fs "http://127.0.0.1:$VQ_PORT/healthz" >/dev/null || { echo "vq serve did not start" >&2; exit 1; }

"$BENCH_VQ" flag on >/dev/null
sleep 1.2 # flag.refresh_ms: every instance sees the flag

echo "redis :$REDIS_PORT  vq serve :$VQ_PORT  sink :$SINK_PORT  ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
cpu_s() { awk -v t="$(getconf CLK_TCK)" '{ printf "%.1f", ($14 + $15) / t }' "/proc/$1/stat"; }
REDIS_CPU0="$(cpu_s "${PIDS[0]}")"
SERVE_CPU0="$(cpu_s "${PIDS[1]}")"
set +e
TIMEFORMAT='cpu seconds: loadgen %U user + %S sys'
# shellcheck disable=SC2086
time timeout --signal=INT --kill-after=10 "$((DURATION + 60))" "$BENCH_VQ" loadgen \
    --url "http://127.0.0.1:$VQ_PORT" --target limited-drop:1 \
    --users "$USERS" --rate "$RATE" --duration "$DURATION" --arrival "$ARRIVAL" \
    --concurrency "$CONCURRENCY" --abandon 0.05 --purchase --sink "127.0.0.1:$SINK_PORT" \
    --assert-no-5xx --json "$OUT" $EXTRA
code=$?
set -e
echo "cpu seconds: redis-server $(awk -v a="$(cpu_s "${PIDS[0]}")" -v b="$REDIS_CPU0" 'BEGIN{printf "%.1f", a-b}'), vq serve $(awk -v a="$(cpu_s "${PIDS[1]}")" -v b="$SERVE_CPU0" 'BEGIN{printf "%.1f", a-b}') (the machine has $(nproc) cores; other work on it is not counted)"
echo "json report: $OUT (loadgen exit $code)"
exit "$code"
