#!/usr/bin/env bash
# Two vq builds on the embedded store (VQ_STORE=memory, no Redis), side by side: a fresh
# `vq serve` per run, A and B taking turns (A B B A …) for ROUNDS rounds; each run is SECS s of
# wrk enters of new users (scripts/wrk/enter.lua), then SECS s of wrk polls of the users it
# entered, in entry order (scripts/wrk/poll.lua), CONN connections, two wrk threads. One line
# per run: req/s, P50/P95/P99 µs, vq's CPU µs per request (utime + stime of the serve process
# over the phase), the non-2xx answers and the machine's steal over the run. Everything on
# 127.0.0.1; each vq it starts is stopped by PID. The queue takes every user (max_capacity 10^8)
# and keeps them waiting (heartbeat timeout 1 h): every answer is a place or a position.
#   mkdir /tmp/main && git archive main | tar -x -C /tmp/main
#   (cd /tmp/main && cargo build --release) && cp /tmp/main/target/release/vq /tmp/vq-main
#   cargo build --release && ROUNDS=3 SECS=5 scripts/bench-embedded.sh /tmp/vq-main target/release/vq
# Polls of ids that no enter used (wrk's two threads enter ids of alternate parity, and do not
# finish with equal counts) are answered 404 NOT_IN_QUEUE and counted as non-2xx.
set -euo pipefail
a=$1 b=$2 rounds=${ROUNDS:-3} secs=${SECS:-5} conn=${CONN:-64}
wrk_dir=$(cd "$(dirname "$0")/wrk" && pwd)
work=$(mktemp -d)
vpid=""
trap '[ -n "$vpid" ] && kill $vpid 2>/dev/null; rm -rf "$work"; true' EXIT
hz=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
cpu_line() { awk '/^cpu / {print $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
field() { awk -v k="$1" '$0 ~ k {print $2}' "$2"; }
pcts() { awk '/percentiles us/ {print $3 "/" $4 "/" $5}' "$1"; }
non2xx() { awk '/Non-2xx/ {print $NF} END {}' "$1" | grep . || echo 0; }
run() { # name binary round
  local name=$1 bin=$2 round=$3 first=$(($3 * 100000000))
  local port
  port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  VQ_STORE=memory VQ_TOKEN_SECRET=bench-secret-0123456789abcdef0123456789 VQ_TARGETS__RANGES='["limited-drop:1-100"]' \
    VQ_QUEUE__HEARTBEAT_TIMEOUT_S=3600 VQ_QUEUE__KEY_TTL_S=7200 VQ_QUEUE__MAX_CAPACITY=100000000 RUST_LOG=warn \
    "$bin" serve --flag-on --listen "127.0.0.1:$port" >"$work/$name.$round.log" 2>&1 &
  vpid=$!
  until curl -s -o /dev/null "http://127.0.0.1:$port/healthz"; do sleep 0.05; done
  local t0 t1 t2 s0 s1 n pn
  t0=$(cpu_ticks $vpid) s0=$(cpu_line)
  wrk -t2 -c"$conn" -d"${secs}s" -s "$wrk_dir/enter.lua" "http://127.0.0.1:$port" -- 2 1 "$first" >"$work/enter"
  t1=$(cpu_ticks $vpid)
  n=$(awk '/requests in/ {print $1}' "$work/enter")
  seq $((first + 1)) $((first + n)) >"$work/ids"
  wrk -t2 -c"$conn" -d"${secs}s" -s "$wrk_dir/poll.lua" "http://127.0.0.1:$port" -- "$work/ids" 1 2 >"$work/poll"
  t2=$(cpu_ticks $vpid) s1=$(cpu_line)
  pn=$(awk '/requests in/ {print $1}' "$work/poll")
  kill $vpid
  wait $vpid 2>/dev/null || true
  vpid=""
  printf '%s round %s: enter %s req/s, P50/P95/P99 %s us, %s us CPU/req | poll %s req/s, %s us, %s us CPU/req | non-2xx %s/%s | steal %s %%\n' \
    "$name" "$round" "$(field Requests/sec "$work/enter")" "$(pcts "$work/enter")" \
    "$(((t1 - t0) * 1000000 / hz / n))" \
    "$(field Requests/sec "$work/poll")" "$(pcts "$work/poll")" "$(((t2 - t1) * 1000000 / hz / pn))" \
    "$(non2xx "$work/enter")" "$(non2xx "$work/poll")" \
    "$(echo "$s0 $s1" | awk '{d = $4 - $2; printf "%.1f", d ? 100 * ($3 - $1) / d : 0}')"
}
for r in $(seq "$rounds"); do
  if ((r % 2)); then run A "$a" "$r"; run B "$b" "$r"; else run B "$b" "$r"; run A "$a" "$r"; fi
done
