#!/usr/bin/env bash
# What one small sale costs Redis in instructions, for vq builds side by side, where CPU time
# on this shared machine moves by a fifth and more from one run to the next: redis-server runs
# under valgrind's callgrind, which counts the instructions it executes in user space (the
# same count for the same work, whatever the machine is doing; the kernel's side of each
# round trip, its read and write, is not counted). Each run: a fresh redis-server under
# callgrind, one `vq serve` of the binary, `vq loadgen` with USERS=1000 buyers arriving at
# RATE=100/s for DURATION=10 s, polling as the server says, buying through the gate (batch
# BATCH=200 per 2-s tick; Redis timeouts raised, as callgrind slows Redis some fifty times);
# then the same without load (IDLE: the probes, ticks and cron alone), whose count is
# subtracted. Runs alternate over the binaries RUNS=2 times.
#
# LOAD=enter measures a new user's enter alone instead: wrk with CONNS=8 connections enters
# new users for DURATION s (scripts/wrk/enter.lua), the idle run's count is subtracted, and
# what is left is divided by wrk's enters; the script calls are read from Redis' `INFO
# commandstats` (the users a call carries set how much of its fixed part each user pays).
# With WARM=s, wrk first enters other new users for that long and the counts start after it
# (`callgrind_control -z`, `CONFIG RESETSTAT`; the idle run waits as long and starts its count
# there too): a long sale's enter, past the first users of each structure (a HASH of fewer
# than `hash-max-listpack-entries` fields is a list Redis scans, a ZSET of few members too).
#
#   scripts/measure-redis-instructions.sh [ENV ...|]BINARY...
#
# A spec `ENV ...|BINARY` runs that binary under `env ENV ...` (e.g. `-u VQ_TARGETS__RANGES|/tmp/vq-old`
# for a build that refuses a setting it does not know).
# Prints per binary and run: instructions in all, less the idle run's, per buyer entered, and
# the buyers admitted (which must agree across binaries for the counts to compare); with
# LOAD=enter, per enter and the users per script call.
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

[ $# -ge 1 ] || die "usage: scripts/measure-redis-instructions.sh [ENV ...|]BINARY..."
install_missing valgrind redis-server curl wrk
use_work_dir
users="${USERS:-1000}" rate="${RATE:-100}" duration="${DURATION:-10}" batch="${BATCH:-200}" runs="${RUNS:-2}"
load="${LOAD:-sale}" conns="${CONNS:-8}" warm="${WARM:-0}"
case "$load" in sale | enter) ;; *) die "LOAD is sale or enter, not '$load'" ;; esac
for spec in "$@"; do
  [ -x "${spec#*|}" ] || die "no vq binary at '${spec#*|}'"
done
secret="bench-secret-0123456789abcdef0123456789"

# One run: sets RUN_TOTAL (the instructions redis-server executed) and RUN_ADMITTED (the
# buyers admitted); with LOAD=enter, RUN_ENTERS (wrk's enters) and RUN_CALLS (script calls).
one_run() { # spec name idle(0|1)
  local spec=$1 name=$2 idle=$3 bin redis_port vq_port sink_port redis_pid vq_pid envs=()
  bin=${spec#*|}
  # shellcheck disable=SC2206 # the settings are words NAME=VALUE, as bench.sh pair's specs
  [[ "$spec" == *"|"* ]] && envs=(${spec%%|*})
  redis_port=$(free_port); vq_port=$(free_port); sink_port=$(free_port)
  mkdir -p "$WORK/$name.dir"
  spawn "$name.redis" valgrind --tool=callgrind --callgrind-out-file="$WORK/$name.cg" \
    redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK/$name.dir"
  redis_pid=$SPAWNED
  wait_until 30 redis-cli -p "$redis_port" ping || die "redis-server under callgrind did not start"
  VQ_REDIS__URL="redis://127.0.0.1:$redis_port" VQ_REDIS__TIMEOUT_MS=5000 VQ_TOKEN_SECRET="$secret" \
    VQ_TARGETS__RANGES='["limited-drop:1-100"]' VQ_GATE__UPSTREAM="http://127.0.0.1:$sink_port" \
    VQ_QUEUE__BATCH_SIZE="$batch" RUST_LOG=warn spawn "$name.vq" env "${envs[@]}" "$bin" serve --flag-on --listen "127.0.0.1:$vq_port"
  vq_pid=$SPAWNED
  wait_http "http://127.0.0.1:$vq_port/healthz" 30 "$vq_pid" || die "vq serve did not start: $(tail -5 "$WORK/$name.vq.log")"
  local admitted=0
  RUN_ENTERS=0 RUN_CALLS=0
  if [ "$load" = enter ] && [ "$warm" != 0 ]; then
    if [ "$idle" = 1 ]; then
      sleep "$warm"
    else
      wrk -t2 -c"$conns" -d"${warm}s" --timeout 30s -s scripts/wrk/enter.lua "http://127.0.0.1:$vq_port" -- 2 1 900000000 \
        >"$WORK/$name.warm.wrk" || die "wrk failed: $(tail -5 "$WORK/$name.warm.wrk")"
    fi
    callgrind_control -z "$redis_pid" >/dev/null 2>&1 || die "callgrind_control could not zero $name's counts"
    redis-cli -p "$redis_port" config resetstat >/dev/null
  fi
  if [ "$idle" = 1 ]; then
    sleep "$duration"
  elif [ "$load" = enter ]; then
    wrk -t2 -c"$conns" -d"${duration}s" --timeout 30s -s scripts/wrk/enter.lua "http://127.0.0.1:$vq_port" -- 2 1 0 >"$WORK/$name.wrk" ||
      die "wrk failed: $(tail -5 "$WORK/$name.wrk")"
    RUN_ENTERS=$(awk '/requests in/ {print $1}' "$WORK/$name.wrk")
    [ "${RUN_ENTERS:-0}" -gt 0 ] || die "wrk entered nobody: $(tail -5 "$WORK/$name.wrk")"
    # Script calls: FCALL (or EVALSHA where a build sends scripts so).
    RUN_CALLS=$(redis-cli -p "$redis_port" info commandstats | tr -d '\r' |
      awk -F'[:=,]' '/^cmdstat_(fcall|evalsha|eval):/ {n += $3} END {print n + 0}')
  else
    timeout --signal=INT --kill-after=10 $((duration + 110)) "$bin" loadgen --url "http://127.0.0.1:$vq_port" \
      --target limited-drop:1 --users "$users" --rate "$rate" --duration "$duration" --arrival constant \
      --concurrency 64 --abandon 0.05 --purchase --sink "127.0.0.1:$sink_port" --quiet --follow-poll-after \
      --assert-no-5xx --json "$WORK/$name.json" >"$WORK/$name.loadgen.log" 2>&1 ||
      die "loadgen failed: $(tail -5 "$WORK/$name.loadgen.log")"
    admitted=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["admitted"] if r["directAdmitted"] == 0 else "FAILED-OPEN")' "$WORK/$name.json")
  fi
  stop_pid "$vq_pid"
  # callgrind writes its counts when redis-server exits (SIGTERM: it shuts down, saving nothing).
  stop_pid "$redis_pid"
  RUN_TOTAL=$(awk '/^summary:/ {print $2; exit}' "$WORK/$name.cg")
  [ -n "$RUN_TOTAL" ] || die "no callgrind summary for $name"
  RUN_ADMITTED=$admitted
}

idle_of=()
for b in "$@"; do
  one_run "$b" "idle-$(basename "${b#*|}")" 1
  idle_of+=("$RUN_TOTAL")
done
if [ "$load" = enter ]; then
  printf '| binary | run | instructions | less idle | enters | per enter | users per script call |\n|---|---|---|---|---|---|---|\n'
else
  printf '| binary | run | instructions | less idle | per buyer entered | admitted |\n|---|---|---|---|---|---|\n'
fi
for r in $(seq "$runs"); do
  i=0
  for b in "$@"; do
    one_run "$b" "run$r-$i-$(basename "${b#*|}")" 0
    net=$((RUN_TOTAL - idle_of[i]))
    if [ "$load" = enter ]; then
      printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$b" "$r" "$RUN_TOTAL" "$net" "$RUN_ENTERS" "$((net / RUN_ENTERS))" \
        "$(awk -v u="$RUN_ENTERS" -v c="$RUN_CALLS" 'BEGIN {printf "%.1f", c ? u / c : 0}')"
    else
      printf '| %s | %s | %s | %s | %s | %s |\n' "$b" "$r" "$RUN_TOTAL" "$net" "$((net / users))" "$RUN_ADMITTED"
    fi
    i=$((i + 1))
  done
done
