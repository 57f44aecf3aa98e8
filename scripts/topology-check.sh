#!/usr/bin/env bash
# Proves the local topology (scripts/topology.sh) end to end, and stops it again:
#   1. nginx's auth_request config (deploy/nginx/auth-request.conf) with the real nginx:
#      a purchase without a token, or with another user's, is 403; with a minted token the
#      backend answers;
#   2. a short load through nginx (wrk with scripts/wrk/mixed.lua: new users entering and
#      random polls of users entered before, spread by nginx over the three replicas, answers
#      counted by status class), with one replica killed (SIGKILL) half-way: admission stays
#      at one batch per tick (admit.lua's log in Redis), and the survivors keep answering;
#   3. `down` leaves no process behind.
#
#   scripts/topology-check.sh [SECONDS]     default 12; tick 500 ms, batch 20 unless set
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
secs="${1:-12}"
export VQ_QUEUE__TICK_MS="${VQ_QUEUE__TICK_MS:-500}" VQ_QUEUE__BATCH_SIZE="${VQ_QUEUE__BATCH_SIZE:-20}"
export VQ_QUEUE__MAX_CAPACITY="${VQ_QUEUE__MAX_CAPACITY:-1000000}" VQ_FLAG__REFRESH_MS=200 RUST_LOG=warn
export TOPOLOGY_DIR="${TOPOLOGY_DIR:-$(pwd)/target/topology-check}"
install_missing wrk
fail() { echo "FAIL: $*" >&2; exit 1; }
topology_up=1
on_exit() { [ -z "$topology_up" ] || scripts/topology.sh down >/dev/null 2>&1 || true; }

env_lines=$(scripts/topology.sh up)
eval "$(grep -E '^(VQ_URL|VQ_REDIS__URL|TOPOLOGY_[A-Z_]+)=' <<<"$env_lines" | sed 's/^/export /')"
vq="${TOPOLOGY_VQ:-target/dist/vq}"
rcli() { redis-cli -u "$VQ_REDIS__URL" "$@"; }
# `vq mint` needs the replicas' secret: the one given, or the one `up` generated.
[ -n "${VQ_TOKEN_SECRET:-}" ] || export VQ_TOKEN_SECRET_FILE="$TOPOLOGY_DIR/secret"
"$vq" flag on >/dev/null

echo "== auth_request (nginx -> /gate/verify -> backend) on $TOPOLOGY_AUTH_REQUEST_URL"
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
order="$TOPOLOGY_AUTH_REQUEST_URL/limited-drops/42/orders"
tok=$("$vq" mint --target limited-drop:42 --user 7)
[ "$(code -X POST -H 'X-User-Id: 7' "$order")" = 403 ] || fail "no token must be 403"
[ "$(code -X POST -H 'X-User-Id: 8' -H "X-Entry-Token: $tok" "$order")" = 403 ] || fail "other user's token must be 403"
[ "$(code -X POST -H 'X-User-Id: 7' -H 'X-Entry-Token: forged.x' "$order")" = 403 ] || fail "forged token must be 403"
body=$(curl -sf -X POST -H 'X-User-Id: 7' -H "X-Entry-Token: $tok" -d '{"qty":1}' "$order") || fail "valid token refused"
grep -q '"backend": "stub"' <<<"$body" || fail "backend did not answer: $body"
[ "$(code -X POST -H 'X-User-Id: 7' -H "X-Entry-Token: $tok" "$order")" = 403 ] || fail "a token must buy once"
echo "   no token 403, other user's token 403, forged 403, valid token -> backend 200, again 403"

echo "== gate through nginx (vq's reverse proxy) on $VQ_URL"
[ "$(code -X POST -H 'X-User-Id: 7' "$VQ_URL/limited-drops/42/orders")" = 403 ] || fail "gate without token must be 403"
tok=$("$vq" mint --target limited-drop:42 --user 9)
[ "$(code -X POST -H 'X-User-Id: 9' -H "X-Entry-Token: $tok" "$VQ_URL/limited-drops/42/orders")" = 200 ] || fail "gate with token"
echo "   no token 403, valid token 200"

echo "== load through nginx for ${secs}s: tick ${VQ_QUEUE__TICK_MS} ms, batch ${VQ_QUEUE__BATCH_SIZE}; vq2 killed at $((secs / 2))s"
tick_now() { rcli --raw TIME | python3 -c 'import sys; s, us = map(int, sys.stdin.read().split()); print((s * 1000 + us // 1000) // '"$VQ_QUEUE__TICK_MS"')'; }
start_tick=$(tick_now)
spawn - wrk -t1 -c32 -d"${secs}s" --latency -s scripts/wrk/mixed.lua "$VQ_URL" >"$TOPOLOGY_DIR/wrk.txt"
wrk_pid=$SPAWNED
sleep $((secs / 2))
kill -KILL "$(cat "$TOPOLOGY_DIR/vq2.pid")"
kill_tick=$(tick_now)
wait "$wrk_pid"
end_tick=$(tick_now)

IFS=, read -r r1 r2 r3 <<<"$TOPOLOGY_REPLICAS"
for r in "$r1" "$r3"; do curl -sf "$r/healthz" >/dev/null || fail "survivor $r stopped answering"; done
if curl -sf "$r2/healthz" >/dev/null 2>&1; then fail "vq2 still answers after SIGKILL"; fi
printf '   wrk: %s req/s, latency P50 %s P99 %s; %s\n' "$(awk '/Requests\/sec/ {print $2}' "$TOPOLOGY_DIR/wrk.txt")" \
  "$(awk '$1=="50%" {print $2}' "$TOPOLOGY_DIR/wrk.txt")" "$(awk '$1=="99%" {print $2}' "$TOPOLOGY_DIR/wrk.txt")" \
  "$(grep statuses "$TOPOLOGY_DIR/wrk.txt")"

# admit.lua's log: "tick:admitted", newest first, last 60 ticks. Every tick of the run must
# show exactly one batch, except at most one around the kill (the dead instance's lock).
rcli --raw LRANGE 'queue:{LIMITED_DROP:1}:admissions' 0 -1 | python3 -c '
import sys
start, kill, end, batch = map(int, sys.argv[1:])
log = [l.split(":") for l in sys.stdin.read().split()]
ticks = {}
for t, n in log:
    assert int(t) not in ticks, f"tick {t} advanced twice"
    ticks[int(t)] = int(n)
bad = False
for phase, lo, hi in (("before kill", start + 1, kill), ("after kill ", kill + 1, end)):
    window = range(lo, hi)
    full = sum(1 for t in window if ticks.get(t) == batch)
    over = [t for t in window if ticks.get(t, 0) > batch]
    print(f"   {phase}: {len(window)} ticks, {full} admitted one full batch of {batch}, "
          f"{sum(ticks.get(t, 0) for t in window)} users admitted, max per tick {max([ticks.get(t, 0) for t in window] or [0])}")
    bad |= bool(over)
missing = [t for t in range(start + 1, end) if ticks.get(t) != batch]
print(f"   ticks without a full batch: {missing}")
sys.exit(1 if bad or len(missing) > 1 else 0)
' "$start_tick" "$kill_tick" "$end_tick" "$VQ_QUEUE__BATCH_SIZE" || fail "admission was not one batch per tick"

echo "== down"
scripts/topology.sh down
topology_up=""
left=$(pgrep -f "$TOPOLOGY_DIR|$(realpath "$vq") serve" || true)
[ -z "$left" ] || fail "processes left behind: $left"
echo "   no process left behind"
echo "OK"
