#!/usr/bin/env bash
# Redis CPU per call of enter.lua, status.lua and admit.lua from two lua/ directories side by
# side (A: the one before, B: this one), each loaded as a function library the way vq generates
# it (src/store/redis/scripts.rs: `local KEYS, ARGV`, the prelude once, each script a function's
# body, a script's steps before its `-- vq:call` line defined once), in one redis-server, alternating A B B A for ROUNDS rounds of N calls
# (redis-benchmark -c 4 -P 16). Target LIMITED_DROP:1 with an open sale (its hash read by every
# call) and USERS waiting users. Prints usec per call (INFO commandstats: wall time in the script,
# preemption included) and redis-server's CPU per call (/proc utime+stime) per run, medians, and
# the steal time (OPS="status admit" measures those only). Everything on 127.0.0.1; the redis-server it starts is stopped by PID on exit.
#   mkdir /tmp/old && git archive main lua | tar -x -C /tmp/old
#   ROUNDS=5 N=100000 scripts/bench-lua-pair.sh /tmp/old/lua lua
set -euo pipefail
a=$1 b=$2 rounds=${ROUNDS:-5} n=${N:-100000} users=${USERS:-1000} ops=${OPS:-enter_new status admit}
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
rpid=$!
trap 'kill $rpid 2>/dev/null; true' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
r() { redis-cli -p "$port" "$@"; }
library() { # name dir: the library's text of enter, status and admit, as scripts.rs writes it
  python3 - "$1" "$2" <<'PY'
import sys
name, d = sys.argv[1], sys.argv[2]
out = ["#!lua name=%s\nlocal KEYS, ARGV\n%s\n" % (name, open(d + "/prelude.lua").read().rstrip("\n"))]
for s in ("enter", "status", "admit"):
    body = open("%s/%s.lua" % (d, s)).read().rstrip("\n")
    at = body.find("\n-- vq:call")  # the steps before it are defined once, in a do block
    once, body = (body[:at], body[at + 1:]) if at >= 0 else (None, body)
    if once is not None:
        out.append("do\n%s\n" % once)
    out.append("redis.register_function{function_name = '%s_%s', flags = {}, callback = function(keys, argv)\n"
               "KEYS, ARGV = keys, argv\n%s\nend}\n" % (name, s, body))
    if once is not None:
        out.append("end\n")
# The sale's part of an enter or a poll alone, 1000 times a call: what a change of the
# prelude's sale_read / sale_phase / sale_tail costs each call (OPS=sale_path).
out.append("redis.register_function{function_name = '%s_sale_path', flags = {'no-writes'}, callback = function(keys, argv)\n"
           "KEYS, ARGV = keys, argv\nlocal out = {}\nfor i = 1, 1000 do\n  local phase, sale = sale_phase(KEYS[1], 5)\n"
           "  sale_tail(out, phase, sale)\nend\nreturn #out\nend}\n" % name)
sys.stdout.write("".join(out))
PY
}
for side in a b; do
  d=$a
  [ "$side" = b ] && d=$b
  loaded=$(r function load "$(library "pair_$side" "$d")")
  [ "$loaded" = "pair_$side" ] || { echo "$d: $loaded" >&2; exit 1; }
done
P='queue:{LIMITED_DROP:1}:'
r hset "${P}sale" opens_at 1 opened_at 2 frozen 0 >/dev/null
enter_keys=(${P}waiting ${P}heartbeat ${P}seq ${P}admitted_count ${P}batch_size ${P}entry_times ${P}departed ${P}record)
# enter.lua's arguments before its users, per side: an enter.lua that counts the queues each
# user holds takes four more (hold_max 0: no count, and no keys of the holds).
enter_head() { # dir -> its enter.lua's arguments before the users
  echo 100000000 1800 0 0 0 2000 2592000 64
  if grep -q 'hold_max' "$1/enter.lua"; then echo 0 - 0 0; fi
}
# shellcheck disable=SC2207 # numbers and '-'
head_a=($(enter_head "$a")) head_b=($(enter_head "$b"))
sale_keys=(${P}sale ${P}prequeue ${P}opening)
# Known users u000000000000 .. (USERS of them, as redis-benchmark's __rand_int__ spells them).
for i in $(seq 0 $((users - 1))); do
  u=$(printf 'u%012d' "$i")
  r fcall pair_b_enter 12 "${enter_keys[@]}" "${P}token:$u" "${sale_keys[@]}" "${head_b[@]}" "$u" >/dev/null
done
enter_new_a=(12 "${enter_keys[@]}" "${P}token:n__rand_int__" "${sale_keys[@]}" "${head_a[@]}" n__rand_int__)
enter_new_b=(12 "${enter_keys[@]}" "${P}token:n__rand_int__" "${sale_keys[@]}" "${head_b[@]}" n__rand_int__)
status=(9 ${P}waiting ${P}heartbeat ${P}admitted_count ${P}batch_size ${P}departed ${P}token:u__rand_int__ "${sale_keys[@]}" 0 1800 u__rand_int__)
admit=(17 ${P}waiting ${P}admitted_count ${P}last_tick ${P}batch_size ${P}admissions ${P}entry_times ${P}waits ${P}heartbeat ${P}seq ${P}evicted ${P}departed "${sale_keys[@]}" ${P}ledger ${P}record ${P}events
  1 1 1800 bench 10000 0 0 0 0 2592000 "120:1 600:10 3600:60" 60 10000 0 500 '')
one() { # label function random-range args...
  local label=$1 fn=$2 range=$3; shift 3
  r config resetstat >/dev/null
  local t0 t1
  t0=$(ticks)
  redis-benchmark -p "$port" -c 4 -P 16 -n "$n" -r "$range" FCALL "$fn" "$@" >/dev/null 2>&1
  t1=$(ticks)
  echo "$label $(r info commandstats | tr -d '\r' | awk -F'[=,]' '$1=="cmdstat_fcall:calls" {print $6}') $(python3 -c "print(round(($t1-$t0)*1e6/$hz/$n, 2))")"
}
ticks() { awk '{print $14 + $15}' "/proc/$rpid/stat"; }
hz=$(getconf CLK_TCK)
steal() { awk '/^cpu /{print $9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
read -r s0 tot0 < <(steal)
for i in $(seq "$rounds"); do
  for side in a b b a; do
    for op in $ops; do
      case $op in
        enter_new) if [ "$side" = a ]; then new=("${enter_new_a[@]}"); else new=("${enter_new_b[@]}"); fi
          one "enter_new_$side" "pair_${side}_enter" 1000000000 "${new[@]}" ;;
        status) one "status_$side" "pair_${side}_status" "$users" "${status[@]}" ;;
        admit) one "admit_$side" "pair_${side}_admit" 1 "${admit[@]}" ;;
        sale_path) one "sale_path_$side" "pair_${side}_sale_path" 1 1 "${P}sale" ;;
      esac
    done
  done
done | tee "$dir/res"
read -r s1 tot1 < <(steal)
python3 - "$dir/res" <<'PY'
import statistics, sys
runs, cpu = {}, {}
for line in open(sys.argv[1]):
    name, usec, us = line.split()
    runs.setdefault(name, []).append(float(usec))
    cpu.setdefault(name, []).append(float(us))
print("per call, medians of %d runs each: script time (usec, INFO commandstats) and redis-server CPU (µs, utime+stime)" % len(next(iter(runs.values()))))
for op in ("enter_new", "status", "admit", "sale_path"):
    if op + "_a" not in runs:
        continue
    a, b = statistics.median(runs[op + "_a"]), statistics.median(runs[op + "_b"])
    ca, cb = statistics.median(cpu[op + "_a"]), statistics.median(cpu[op + "_b"])
    print("%-10s usec A %6.2f  B %6.2f  B/A %.3f   CPU A %6.2f  B %6.2f  B/A %.3f" % (op, a, b, b / a, ca, cb, cb / ca))
PY
echo "steal $(python3 -c "print(round(100*($s1-$s0)/max(1,$tot1-$tot0),1))") % of the machine's CPU time during the runs"
