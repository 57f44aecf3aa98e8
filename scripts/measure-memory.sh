#!/usr/bin/env bash
# Measures Redis memory per waiting user: a fresh redis-server, one vq serve (release, no
# pump, so everyone stays waiting), wrk entering new users into one target until about
# USERS are in, then INFO memory before/after. Everything on 127.0.0.1, stopped on exit.
# With PREQUEUE=1 the target has a sale in its pre-queue (opening an hour ahead), so the same
# entries are pre-queued users instead: what one costs before the opening.
#
#   [BENCH_VQ=path] [PREQUEUE=1] scripts/measure-memory.sh [USERS]   default 100000 users, target/dist/vq
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
users="${1:-100000}"
# A queue answers only for declared targets.
export VQ_TARGETS__RANGES='["limited-drop:1-1"]'
vq="${BENCH_VQ:-target/dist/vq}"   # not VQ_…: vq reads those as settings
[ -x "$vq" ] || scripts/build-release.sh >&2
install_missing redis-server wrk
vport=$(free_port)
start_redis
rport=$REDIS_PORT
used() { redis-cli -p "$rport" info memory | awk -F: '/^used_memory:/ {print $2+0}'; }
VQ_REDIS__URL="$REDIS_URL" VQ_LISTEN="127.0.0.1:$vport" VQ_QUEUE__MAX_CAPACITY=$((users * 2)) \
  VQ_TOKEN_SECRET="measure-secret-0123456789abcdef0123456789" RUST_LOG=warn \
  spawn vq "$vq" serve --no-pump --flag-on
wait_http "http://127.0.0.1:$vport/healthz" 10 "$SPAWNED" || die "vq serve did not start: $(tail -5 "$WORK/vq.log")"
queue=waiting what="waiting users"
if [ "${PREQUEUE:-0}" = 1 ]; then
  queue=prequeue what="pre-queued users"
  VQ_REDIS__URL="$REDIS_URL" "$vq" sale schedule limited-drop:1 \
    --opens-at "$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ)" --prequeue-from "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >/dev/null ||
    die "vq sale schedule failed"
fi
# One user first, so the per-target keys exist before the baseline.
curl -sf -X POST -H 'X-User-Id: 999999999' "http://127.0.0.1:$vport/virtual-queues/limited-drop/1/entries" >/dev/null
before=$(used)
# wrk cannot stop after N requests: enter new users (ids 1, 2, …) for a while, then check.
wrk -t1 -c32 -d"${ENTER_SECS:-15}s" -s scripts/wrk/enter.lua "http://127.0.0.1:$vport" -- 1 >/dev/null
n=$(( $(redis-cli -p "$rport" zcard "queue:{LIMITED_DROP:1}:$queue") - 1 ))
[ "$n" -ge "$users" ] || { echo "only $n users entered in ${ENTER_SECS:-15}s: raise ENTER_SECS" >&2; exit 1; }
after=$(used)
echo "redis $(redis-server --version | awk '{print $3}'): $n $what in one target"
echo "used_memory: before $before B, after $after B; $(( (after - before) / n )) B per ${what%s};" \
  "$(( (after - before) * 100000 / n / 1048576 )) MiB per 100k"
redis-cli -p "$rport" --raw memory usage "queue:{LIMITED_DROP:1}:$queue" | sed "s/^/$queue ZSET bytes: /"
redis-cli -p "$rport" --raw memory usage 'queue:{LIMITED_DROP:1}:heartbeat' | sed 's/^/heartbeat ZSET bytes: /'
redis-cli -p "$rport" --raw memory usage 'queue:{LIMITED_DROP:1}:entry_times' | sed 's/^/entry_times ZSET bytes (one member per enter call): /'
