#!/usr/bin/env bash
# Redis CPU per one-user script call, FCALL of a vq build's function library against EVALSHA of
# prelude + script from another lua/ directory (the build before), same keys and arguments,
# alternating A B B A for ROUNDS rounds of N calls (redis-benchmark -c 4 -P 16), with steal.
# Everything on 127.0.0.1; the redis-server and vq it starts are stopped by PID on exit.
#   mkdir /tmp/old && git archive main lua | tar -x -C /tmp/old
#   ROUNDS=3 N=100000 scripts/bench-fcall.sh /tmp/old/lua target/release/vq
set -euo pipefail
base_lua=$1 vqbin=$2 rounds=${ROUNDS:-5} n=${N:-200000}
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
vport=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
rpid=$!
trap 'kill $rpid 2>/dev/null; [ -n "${vpid:-}" ] && kill $vpid 2>/dev/null; true' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
r() { redis-cli -p "$port" "$@"; }
# The fcall build loads its library on its first call.
VQ_REDIS__URL="redis://127.0.0.1:$port" VQ_LISTEN="127.0.0.1:$vport" VQ_TOKEN_SECRET=bench-secret-0123456789abcdef0123456789 \
  RUST_LOG=warn "$vqbin" serve --flag-on >"$dir/vq.log" 2>&1 &
vpid=$!
until curl -s -o /dev/null "http://127.0.0.1:$vport/healthz"; do sleep 0.05; done
curl -s -X POST -H 'X-User-Id: 42' "http://127.0.0.1:$vport/virtual-queues/limited-drop/1/entries" >/dev/null
kill $vpid; wait $vpid 2>/dev/null || true; vpid=""
lib=$(r --raw function list | awk 'prev=="library_name"{print; exit} {prev=$0}')
[ -n "$lib" ] || { echo "no library loaded" >&2; exit 1; }
sha_status=$(r script load "$(cat "$base_lua/prelude.lua")
$(cat "$base_lua/status.lua")")
sha_enter=$(r script load "$(cat "$base_lua/prelude.lua")
$(cat "$base_lua/enter.lua")")
P='queue:{LIMITED_DROP:1}:'
status_args=(9 ${P}waiting ${P}heartbeat ${P}admitted_count ${P}batch_size ${P}departed ${P}token:42 ${P}sale ${P}prequeue ${P}opening 0 1800 42)
# enter.lua's arguments before its users; an enter.lua that counts the queues each user holds
# takes four more (hold_max 0: no count, and no keys of the holds).
enter_head() { # enter.lua -> its arguments before the users
  echo 100000000 1800 0 0 0 2000 2592000 64
  if grep -q 'hold_max' "$1"; then echo 0 - 0 0; fi
}
fcall_holds=()
[[ "$(r --raw function list withcode)" != *hold_max* ]] || fcall_holds=(0 - 0 0)
enter_keys=(12 ${P}waiting ${P}heartbeat ${P}seq ${P}admitted_count ${P}batch_size ${P}entry_times ${P}departed ${P}record ${P}token:__rand_int__ ${P}sale ${P}prequeue ${P}opening)
# shellcheck disable=SC2207 # numbers and '-'
evalsha_enter_args=("${enter_keys[@]}" $(enter_head "$base_lua/enter.lua") u__rand_int__)
fcall_enter_args=("${enter_keys[@]}" 100000000 1800 0 0 0 2000 2592000 64 "${fcall_holds[@]}" u__rand_int__)
ticks() { awk '{print $14 + $15}' /proc/$rpid/stat; }
steal() { awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
hz=$(getconf CLK_TCK)
one() { # name cmd-head... -> "name usec_per_call cpu_us_per_call"
  local name=$1; shift
  r config resetstat >/dev/null
  local t0; t0=$(ticks)
  redis-benchmark -p "$port" -c 4 -P 16 -n "$n" -r 1000000000 "$@" >/dev/null 2>&1
  local t1; t1=$(ticks)
  local cmd; cmd=$(echo "$1" | tr 'A-Z' 'a-z')
  local usec; usec=$(r info commandstats | tr -d '\r' | awk -F'[=,]' -v c="cmdstat_$cmd:calls" '$1==c {print $6}')
  echo "$name $usec $(python3 -c "print(round(($t1-$t0)*1e6/$hz/$n, 2))")"
}
read -r s0 tot0 < <(steal)
for i in $(seq "$rounds"); do
  one evalsha_status EVALSHA "$sha_status" "${status_args[@]}"
  one fcall_status FCALL "${lib}_status" "${status_args[@]}"
  one fcall_enter FCALL "${lib}_enter" "${fcall_enter_args[@]}"
  one evalsha_enter EVALSHA "$sha_enter" "${evalsha_enter_args[@]}"
  one evalsha_enter EVALSHA "$sha_enter" "${evalsha_enter_args[@]}"
  one fcall_enter FCALL "${lib}_enter" "${fcall_enter_args[@]}"
  one fcall_status FCALL "${lib}_status" "${status_args[@]}"
  one evalsha_status EVALSHA "$sha_status" "${status_args[@]}"
done | tee "$dir/res"
read -r s1 tot1 < <(steal)
echo "library $lib; waiting users at the end: $(r zcard "${P}waiting")"
python3 - "$dir/res" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
for name in ("evalsha_status", "fcall_status", "evalsha_enter", "fcall_enter"):
    u = [float(r[1]) for r in rows if r[0] == name]; c = [float(r[2]) for r in rows if r[0] == name]
    print(f"{name:15s} usec_per_call median {statistics.median(u):.2f} ({min(u):.2f}-{max(u):.2f})  redis CPU/call median {statistics.median(c):.2f} ({min(c):.2f}-{max(c):.2f}) n={len(u)}")
PY
echo "steal $(python3 -c "print(round(100*($s1-$s0)/max(1,($tot1-$tot0)),1))") % of the machine's CPU time"
