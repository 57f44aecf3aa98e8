#!/usr/bin/env bash
# Redis script time per user of enter.lua and status.lua, without HTTP, vq or wrk: on a fresh
# redis-server, N new users enter in calls of B users (as vq's coalescer sends them under
# load), then each polls once in entry order in calls of B; Redis' own accounting
# (INFO commandstats, µs inside EVALSHA) divided by N. Much steadier than req/s on this
# machine, so it is how a change to a script is judged before scripts/bench-pair.sh.
#
#   [N=100000] [B=16] [ROUNDS=3] scripts/bench-lua.sh [LUA_DIR ...]
#
# With several directories (default: lua/) their scripts take turns, ROUNDS times each, e.g.
#   git show HEAD~1:lua/enter.lua > /tmp/old/enter.lua; git show HEAD~1:lua/status.lua > /tmp/old/status.lua
#   scripts/bench-lua.sh /tmp/old lua
set -euo pipefail
cd "$(dirname "$0")/.."
n="${N:-100000}"; b="${B:-16}"; rounds="${ROUNDS:-3}"
dirs=("$@"); [ ${#dirs[@]} -gt 0 ] || dirs=(lua)
for d in "${dirs[@]}"; do
  [ -f "$d/enter.lua" ] && [ -f "$d/status.lua" ] || { echo "no enter.lua and status.lua in '$d'" >&2; exit 2; }
done
command -v redis-server >/dev/null 2>&1 || { echo "needs redis-server (scripts/bench.sh installs it)" >&2; exit 2; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
work=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
rpid=$!
trap 'kill "$rpid" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
rcli() { redis-cli -p "$port" "$@"; }

# The calls as Redis protocol, for `redis-cli --pipe`: the keys and arguments vq sends
# (src/store/redis.rs), target LIMITED_DROP:1, users 1..N.
calls() { # enter|status sha
  python3 - "$1" "$2" "$n" "$b" <<'EOF'
import sys, time
op, sha, n, b = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
p = "queue:{LIMITED_DROP:1}:"
if op == "enter":
    names = ["waiting", "heartbeat", "seq", "admitted_count", "batch_size", "entry_times", "departed"]
else:
    names = ["waiting", "heartbeat", "admitted_count", "batch_size", "departed"]
now = str(int(time.time() * 1000))
head = ["100000000", "1800", now] if op == "enter" else [now]
out = sys.stdout.buffer
for first in range(1, n + 1, b):
    users = [str(u) for u in range(first, min(first + b, n + 1))]
    args = ["EVALSHA", sha, str(len(names) + len(users))] + [p + k for k in names]
    args += [p + "token:" + u for u in users] + head + users
    out.write(("*%d\r\n" % len(args)).encode())
    for a in args:
        out.write(("$%d\r\n%s\r\n" % (len(a.encode()), a)).encode())
EOF
}
per_user() { # script time of the EVALSHA calls since the last reset, µs per user
  rcli info commandstats | awk -F'[=,]' -v n="$n" '/^cmdstat_evalsha:/ {printf "%.2f", $4 / n}'
}

echo "script time per user (µs inside Redis), $n users in calls of $b, redis-server $(redis-server --version | awk '{print $3}')"
for round in $(seq "$rounds"); do
  for d in "${dirs[@]}"; do
    rcli flushall >/dev/null
    enter_sha=$(rcli script load "$(cat "$d/enter.lua")")
    status_sha=$(rcli script load "$(cat "$d/status.lua")")
    rcli config resetstat >/dev/null
    calls enter "$enter_sha" | rcli --pipe >/dev/null
    entered=$(rcli get 'queue:{LIMITED_DROP:1}:seq')
    [ "$entered" = "$n" ] || { echo "$d: $entered users entered, expected $n" >&2; exit 1; }
    e=$(per_user)
    rcli config resetstat >/dev/null
    calls status "$status_sha" | rcli --pipe >/dev/null
    s=$(per_user)
    printf 'round %d  %-24s enter %5s   poll %5s\n' "$round" "$d" "$e" "$s"
  done
done
