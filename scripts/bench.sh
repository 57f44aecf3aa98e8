#!/usr/bin/env bash
# Benchmarks vq on this machine: one entry point with named scenarios, each on fresh
# redis-servers and everything on 127.0.0.1, stopped by PID on exit. A run ends with one
# summary table; ROUNDS=n repeats the scenario n times and adds the medians (single runs on a
# shared machine differ by a quarter and more). With the figures, what the machine was doing:
# the share of its CPU time the hypervisor took (steal, /proc/stat) and the load average
# (/proc/loadavg) while the run went.
#
#   scripts/bench.sh sale [LOADGEN-FLAGS...]
#       the standard flash sale with `vq loadgen`: USERS=100000 users arriving at RATE=20000
#       enters/s (ARRIVAL=constant), DURATION=10 s of arrivals and polls, clients polling after
#       the server's pollAfterSeconds (--follow-poll-after, as the waiting page does), 5 % of
#       them abandoning, admitted users buying through the gate to loadgen's counting sink.
#       CONCURRENCY=256 requests in flight at most; EXTRA or LOADGEN-FLAGS add loadgen flags
#       (e.g. --assert-poll-p95-ms 50); OUT=report.json keeps loadgen's JSON report (round n
#       of several as report.n.json). Table: enters/s offered and answered, enter and poll
#       P50/P95/P99, 5xx, the most purchases reaching the sink in one tick, and CPU µs per
#       request of loadgen, vq serve and Redis. Exits 3 when loadgen's --assert-… bounds
#       (always --assert-no-5xx) broke in any round. CMDSTATS=prefix keeps each round's Redis
#       INFO commandstats as prefix.ROUND; PROFILE=prefix has Redis log every call (SLOWLOG at
#       0 µs, which slows it: CPU figures of such a round are not comparable) and writes each
#       round's calls and time per buyer by script (scripts/slowlog-profile.py) as prefix.ROUND.
#   scripts/bench.sh naive [LOADGEN-FLAGS...]
#       the same sale with naive clients: every one polls every 2–3 s whatever the server says.
#   scripts/bench.sh starved [LOADGEN-FLAGS...]
#       the naive sale with vq's CPU share cut: vq serve at `nice -n NICE` (10) beside HOGS (1)
#       busy loops, and every buyer sending the purchase twice (--purchase-times 2). What must
#       hold: 0 DIRECT_ADMITTED (Redis answers throughout), at most one batch per tick at the
#       sink, 0 tokens the sink received twice; what it costs: the answers shed (503
#       OVERLOADED) and the P95 of those served. No --assert-no-5xx: shedding is the point.
#   scripts/bench.sh adaptive [LOADGEN-FLAGS...]
#       queue.outflow fixed vs adaptive against the same purchase API whose capacity changes
#       mid-sale: loadgen's sink at CAPACITY (50,20@30s,50@60s purchases/s, waits over
#       MAX_WAIT_MS=1000 answered 503), USERS=10000 arriving at RATE=1000 enters/s, DURATION=90
#       s, CONVERSION=0.6 of admitted buyers buying, ticks of TICK_MS=1000. Fixed admits
#       BATCH=80 per tick (tuned for the full capacity: 80 × 0.6 = 48 purchases/s); adaptive
#       starts at BATCH within BATCH_MIN=10..BATCH_MAX=200, deciding every INTERVAL_MS=3000 with
#       LATENCY_MS=1000, ERROR_RATIO=0.05, INCREASE=10, DECREASE=0.7. Each round runs fixed,
#       then adaptive, each on a fresh redis-server and vq serve. Table: purchases served,
#       refused by the purchase API (503), buyers' purchase errors (non-2xx), purchase P95 at
#       the buyer and at the sink, admitted and no-shows, buyers' wait P50/P95, users still
#       waiting at the end, the batch's lowest and highest; then each run's timeline (loadgen's
#       table) on stderr, and OUT=report.json keeps loadgen's JSON (NAME.MODE.ROUND.json).
#   scripts/bench.sh [wrk] [SECONDS] [CONNECTIONS]
#       wrk -t2 against enter and poll (SECONDS default DURATION or 10, 64 connections), next
#       to the HTTP floor (the same bare axum server answering without Redis: what HTTP
#       alone costs here) and the calibration: a bare axum handler doing one EVALSHA
#       ("return 1") per request (examples/bare_evalsha.rs), the ceiling of any Redis-backed
#       handler here, also run
#       under the very requests of each run (the same wrk script, path and headers, so the
#       client's share of the cost is the same). Each round on a target of its own (the
#       polled queue has the same size every round); polls go through the queue in entry
#       order, each user once per round, as from users who all poll at the same interval;
#       POLL_ORDER=random picks each polled user at random, the hardest order for Redis (see
#       scripts/wrk/poll.lua). vq runs with its default `threads` (one worker per core) unless
#       VQ_THREADS says otherwise (docs/deploy.md). Table: req/s, share of the calibration,
#       P50/P95/P99, 5xx, users per script call, CPU µs per request of wrk, the server and Redis.
#   [PAIRS=3] [SECS=4] [CONNS=64] scripts/bench.sh pair 'A-SPEC' 'B-SPEC'
#       two vq builds or settings where single runs cannot tell them apart: A and B side by
#       side on one fresh redis-server, taking turns (A B B A …) in short wrk runs (CONNS
#       connections), enters
#       first (new users in every run: ids of the run's own), then polls of the users they
#       entered (entry order). A spec is
#       `[NAME=VALUE ...]|BINARY`: settings for that vq and its binary, e.g.
#         scripts/bench.sh pair '|target/release/vq' 'VQ_THREADS=1|target/release/vq'
#         scripts/bench.sh pair '|/tmp/vq-before' '|target/release/vq'
#       Prints every pair (req/s, Redis' and that vq's CPU µs per request), then the medians.
#   [N=100000] [B=16] [ROUNDS=3] scripts/bench.sh lua [LUA_DIR ...]
#       script time per user of enter.lua and status.lua inside Redis, without HTTP, vq or
#       wrk, called as vq calls them (FCALL of one library with the prelude at its head; EVAL=1:
#       EVALSHA of each script with the prelude in front, as where Redis refuses functions):
#       N new users enter in calls of B users (as vq's coalescer sends them under load),
#       then each polls once in entry order in calls of B; Redis' own accounting (INFO
#       commandstats) divided by N. Steadier than req/s on this machine: how a change to a
#       script is judged before `pair`. With several directories (default: lua/) their
#       scripts take turns, ROUNDS times each, e.g.
#         mkdir /tmp/old && git archive HEAD~1 lua | tar -x -C /tmp/old && scripts/bench.sh lua /tmp/old/lua lua
#       (a directory's prelude.lua, when it has one, goes in front of each script, as vq sends it;
#       the keys and arguments are vq's declarations, examples/script_args.rs, for every directory)
#   [BITS=18] [RUNS=9] [USERS=200] scripts/bench.sh pow
#       what the proof of work at entry (entry.pow_bits) costs at BITS: each solve of the
#       waiting page's worker in headless chromium (RUNS page loads, each a new user; the
#       ignored test browser::measure_pow_in_chromium) and of `vq loadgen` (USERS buyers
#       arriving at 20/s against a release vq serve), with the medians: a buyer's wait and what
#       a bot pays per place in CPU seconds on this machine.
#
#   [N=1000000] [CALLS=40] [ROUNDS=3] scripts/bench.sh slices
#       what one call of each sliced script costs Redis (INFO commandstats, per call and per
#       user) with N users waiting in one target, CALLS calls each with the bounds vq uses, on
#       users picked at random, called as vq calls them (FCALL of one library; EVAL=1: EVALSHA
#       with the prelude in front) (scripts/measure-slices.py); Redis at REDIS_NICE (-10).
#   [N=1000000] [WAITING=100000] [SECS=15] [BATCH=2000] [ROUNDS=1] scripts/bench.sh scale
#       one target at scale on one redis-server logging calls over 1 ms (SLOWLOG; Redis at
#       REDIS_NICE=-10, so the neighbours' processes do not stretch its calls, with PIN=1
#       on core 1 alone, vq and wrk on core 0, and with RT=1 at a real-time priority that
#       nothing on the machine preempts): N users
#       pre-queued in limited-drop:1 (straight into Redis, pipelined) and placed by a release
#       `vq serve`'s pump at the sale's opening (the frozen set read and placed in bounded
#       calls), then SECS s of wrk polls of users picked at random across that queue while the
#       pump admits BATCH per TICK_MS=1000 tick, then SECS s of wrk enters of new users into
#       limited-drop:2 (another target of the node). Then on a fresh redis-server the same
#       with WAITING users: wrk enters of new users, then polls of the waiting ones (enter P99
#       next to poll P99). Users stay waiting (queue.heartbeat_timeout_s = 3600, key_ttl_s =
#       7200). Table per phase: Redis calls over 2 ms and over 1 ms (the opening included, the
#       bench's own reads of the queue not), the largest with what it was, the calls over 2 ms
#       by script or command, enter and poll P50/P99, Redis memory per waiting user
#       (used_memory over the placed queue; at WAITING, over the users wrk entered, whose hold
#       keys count too), steal and load.
#       BENCH_VQ=path runs another binary (its scripts are compiled in).
#   [USERS=20000] [RATE=2000] [DURATION=10] [BATCH=200] [ROUNDS=1] scripts/bench.sh shards
#       one target spread over a loopback Redis Cluster of 3 primaries (redis-cli --cluster
#       create: three equal slot ranges), with `shards = 1` and then `shards = 3` for its type,
#       each on a fresh cluster and a fresh release `vq serve`, under the same `vq loadgen`
#       load (USERS new users entering at RATE/s, polling after pollAfterSeconds, BATCH
#       admitted per 1 s tick, no purchases). Per node: Redis CPU (INFO cpu, user + sys, over
#       the run) and per enter, the spread (largest node over smallest), and the script calls'
#       own time (INFO commandstats usec of FCALL, CONFIG RESETSTAT before the run); five
#       costliest commands of each node on stderr; the order error from loadgen's report
#       (Spearman's rho of entry and admission, the largest and mean displacement); steal and
#       load. LOAD=wrk enters new users with wrk (-t2 -c64, DURATION s, closed loop) instead
#       of loadgen: each node's CPU per enter where the coalesced calls are as large as the
#       machine makes them (no admissions, no polls, no order error).
#
# Installs wrk and redis-server (Debian packages) when missing; builds vq in release
# (BENCH_VQ=path runs another binary in sale and naive; not VQ_…: vq reads those as settings).
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

usage() { say "$*"; exit 2; }
# Every vq started here answers for the targets the scenarios load (limited-drop:1 and its
# neighbours): a queue answers only for declared targets.
export VQ_TARGETS__RANGES='["limited-drop:1-100"]'
scenario="${1:-wrk}"
case "$scenario" in
  sale | naive | starved | adaptive | wrk | pair | lua | pow | scale | slices | shards) shift ;;
  [0-9]*) scenario=wrk ;;
  *) sed -n '2,/^# Installs/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
rounds="${ROUNDS:-1}"
install_missing redis-server wrk
secret="bench-secret-0123456789abcdef0123456789"

# ---- measuring: CPU ticks of processes and of the machine, from /proc --------------------
hz=$(getconf CLK_TCK)
ticks_of() { # pid -> utime + stime of that process, in clock ticks
  local stat; stat=$(<"/proc/$1/stat")
  stat=${stat##*) }   # the command name may hold spaces
  awk '{print $12 + $13}' <<<"$stat"
}
# The machine's steal and total CPU time (user nice system idle iowait irq softirq steal), ticks.
machine() { awk '/^cpu / {print $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
steal0="" total0=""
window_start() { read -r steal0 total0 < <(machine); }
window_end() { # -> "steal-% load1" of the window
  local steal1 total1
  read -r steal1 total1 < <(machine)
  awk -v s=$((steal1 - steal0)) -v t=$((total1 - total0)) -v l="$(cut -d' ' -f1 /proc/loadavg)" \
    'BEGIN {printf "%.1f %s", (t > 0 ? 100 * s / t : 0), l}'
}
# Runs a command in the foreground with its CPU time measured (bash's `time`), output to
# $WORK/NAME.out; sets CPU_S (user + system seconds) and RC.
timed() { # name command...
  local name=$1 TIMEFORMAT='%3U %3S'; shift
  RC=0
  { time "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"; } 2>"$WORK/$name.time" || RC=$?
  CPU_S=$(awk '{print $1 + $2}' "$WORK/$name.time")
}
per_req() { # ticks-or-seconds unit requests -> µs per request
  awk -v v="$1" -v u="$2" -v n="$3" -v hz="$hz" 'BEGIN {
    if (n <= 0) { print "-"; exit }
    printf "%.1f", (u == "s" ? v * 1e6 : v * 1e6 / hz) / n }'
}
# The table: a header line and rows of tab-separated fields, the first naming the row; with
# ROUNDS>1 the rows of each round are numbered and the medians of the rows that share a name
# follow them (a median of figures given with d decimals, with d decimals).
table() { # tsv-file
  python3 - "$1" "$rounds" <<'EOF'
import statistics, sys
lines = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
head, rows, rounds = lines[0], lines[1:], int(sys.argv[2])
def decimals(v):
    return len(v.split(".")[1]) if "." in v else 0
out = []
if rounds > 1:
    seen = {}
    for r in rows:
        seen[r[0]] = seen.get(r[0], 0) + 1
        out.append([f"{r[0]}, round {seen[r[0]]}"] + r[1:])
    for name in seen:
        group = [r for r in rows if r[0] == name]
        med = ["median, " + name]
        for col in range(1, len(head)):
            cells = [r[col] if col < len(r) else "-" for r in group]
            try:
                m = statistics.median(float(c) for c in cells)
                med.append(f"{m:.{max(decimals(c) for c in cells)}f}")
            except ValueError:
                med.append("-")
        out.append(med)
else:
    out = rows
allrows = [head] + out
width = [max(len(r[c]) if c < len(r) else 1 for r in allrows) for c in range(len(head))]
def line(r):
    cells = [r[c] if c < len(r) else "-" for c in range(len(head))]
    return "| " + " | ".join(x.ljust(width[c]) if c == 0 else x.rjust(width[c]) for c, x in enumerate(cells)) + " |"
print(line(head))
print("|" + "|".join("-" * (w + 2) for w in width) + "|")
for r in out:
    print(line(r))
EOF
}

# ---- sale and naive: vq loadgen --------------------------------------------------------
loadgen_round() { # round follow(0|1) flags... -> appends a row to $WORK/rows, sets RC
  local round=$1 follow=$2; shift 2
  local vq_port sink_port vq_pid json wrapper=() hogs=() h
  local profile=()
  [ -z "${PROFILE:-}" ] || profile=(--slowlog-log-slower-than 0 --slowlog-max-len 10000000)
  start_redis --maxmemory 512mb --maxmemory-policy noeviction "${profile[@]}"
  vq_port=$(free_port); sink_port=$(free_port)
  # starved: nice execs vq, so the PID measured and stopped is vq's.
  [ "$scenario" != starved ] || wrapper=(nice -n "${NICE:-10}")
  VQ_REDIS__URL="$REDIS_URL" VQ_TOKEN_SECRET="$secret" VQ_GATE__UPSTREAM="http://127.0.0.1:$sink_port" \
    RUST_LOG=warn spawn "vq-$round" "${wrapper[@]}" "$vq" serve --flag-on --listen "127.0.0.1:$vq_port"
  vq_pid=$SPAWNED
  wait_http "http://127.0.0.1:$vq_port/healthz" 20 "$vq_pid" ||
    die "vq serve did not start: $(tail -5 "$WORK/vq-$round.log")"
  json="$WORK/report-$round.json"
  local flags=(--url "http://127.0.0.1:$vq_port" --target limited-drop:1 --users "$users"
    --rate "$rate" --duration "$duration" --arrival "$arrival" --concurrency "$concurrency"
    --abandon 0.05 --purchase --sink "127.0.0.1:$sink_port" --quiet --json "$json")
  [ "$follow" = 0 ] || flags+=(--follow-poll-after)
  if [ "$scenario" = starved ]; then
    flags+=(--purchase-times 2)
    # Busy loops on the cores beside vq for the round (each stops by itself at the latest
    # when the round's time is up).
    for h in $(seq "${HOGS:-1}"); do
      spawn "hog-$round-$h" bash -c "while [ \$SECONDS -lt $((duration + 240)) ]; do :; done"
      hogs+=("$SPAWNED")
    done
  else
    flags+=(--assert-no-5xx)
  fi
  local r0 v0 r1 v1
  r0=$(ticks_of "$REDIS_PID"); v0=$(ticks_of "$vq_pid"); window_start
  # --foreground: a Ctrl-C in the terminal reaches loadgen too.
  # shellcheck disable=SC2086 # EXTRA is words
  # Starved, the last answers take longer to come.
  local limit=$((duration + 60)); [ "$scenario" != starved ] || limit=$((duration + 180))
  timed "loadgen-$round" timeout --foreground --signal=INT --kill-after=10 "$limit" \
    "$vq" loadgen "${flags[@]}" $extra "$@"
  r1=$(ticks_of "$REDIS_PID"); v1=$(ticks_of "$vq_pid")
  local machine_now; machine_now=$(window_end)
  # CMDSTATS=prefix keeps the round's INFO commandstats (every call and command of the sale)
  # as prefix.ROUND, for a breakdown per step.
  [ -z "${CMDSTATS:-}" ] || redis-cli -p "$REDIS_PORT" info commandstats >"$CMDSTATS.$round"
  # PROFILE=prefix: Redis logged every call (SLOWLOG at 0 µs); the round's calls per script.
  [ -z "${PROFILE:-}" ] || python3 scripts/slowlog-profile.py "$REDIS_PORT" "$users" >"$PROFILE.$round"
  for h in "${hogs[@]}"; do stop_pid "$h"; done
  stop_pid "$vq_pid"; stop_pid "$REDIS_PID"
  if ! [ -s "$json" ]; then
    cat "$WORK/loadgen-$round.err" >&2
    die "loadgen wrote no report (exit $RC)"
  fi
  [ -z "${OUT:-}" ] || cp "$json" "$([ "$rounds" = 1 ] && echo "$OUT" || echo "${OUT%.json}.$round.json")"
  python3 - "$json" "$round" "$CPU_S" "$((v1 - v0))" "$((r1 - r0))" "$hz" "$machine_now" "$scenario" <<'EOF' >>"$WORK/rows"
import json, sys
r = json.load(open(sys.argv[1]))
round_, lg_s, vq_t, redis_t, hz = sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
steal, load = sys.argv[7].split()
n = sum(r["statusCounts"].values())
us = lambda sec: f"{sec * 1e6 / n:.1f}" if n else "-"
f = lambda x: f"{x:.0f}" if x >= 100 else f"{x:.1f}"
dmax = r.get("downstreamMaxPerTick")
print("\t".join([sys.argv[8], f(r["offeredEnterRate"]), f(r["achievedEnterRate"]),
    f(r["enter"]["p50Ms"]), f(r["enter"]["p95Ms"]), f(r["enter"]["p99Ms"]),
    f(r["poll"]["p50Ms"]), f(r["poll"]["p95Ms"]), f(r["poll"]["p99Ms"]), f(r["pollRatePerSec"]),
    str(sum(v for k, v in r["statusCounts"].items() if len(k) == 3 and k.startswith("5"))),
    str(r["statusCounts"].get("503", 0)), str(r["directAdmitted"]),
    "-" if dmax is None else str(dmax), str(r["batchSize"]),
    str(r.get("downstreamRepeatedTokens", "-")), str(n),
    us(lg_s), us(vq_t / hz), us(redis_t / hz), steal, load]))
if r.get("rateShortfall"):
    print(f"round {round_}: {r['rateShortfall']}", file=sys.stderr)
EOF
  cat "$WORK/loadgen-$round.out" "$WORK/loadgen-$round.err" >&2
  echo "round $round: loadgen exit $RC" >&2
}

loadgen_scenario() { # follow flags...
  use_work_dir
  local follow=$1; shift
  users="${USERS:-100000}" rate="${RATE:-20000}" duration="${DURATION:-10}"
  arrival="${ARRIVAL:-constant}" concurrency="${CONCURRENCY:-256}" extra="${EXTRA:-}"
  vq="${BENCH_VQ:-target/release/vq}"
  [ -n "${BENCH_VQ:-}" ] || build_release --quiet --bins
  [ -x "$vq" ] || die "no vq binary at $vq"
  local what="clients follow pollAfterSeconds"
  [ "$follow" = 1 ] || what="clients poll every 2-3 s whatever the server says"
  echo "vq bench $scenario: $users users at $rate enters/s ($arrival), ${duration}s, $what;" \
    "loadgen, vq and redis-server $(redis-server --version | awk '{print $3}') on $(nproc) cores" >&2
  printf 'run\tenters/s offered\tanswered\tenter P50 ms\tP95\tP99\tpoll P50 ms\tP95\tP99\tpolls/s\t5xx\tof them 503 shed\tDIRECT_ADMITTED\tmost purchases at the sink in a tick\tbatch\ttokens at the sink twice\trequests\tCPU µs/req loadgen\tvq\tredis\tsteal %%\tload 1m\n' >"$WORK/rows"
  local round worst=0
  for round in $(seq "$rounds"); do
    loadgen_round "$round" "$follow" "$@"
    [ "$RC" = 0 ] || worst=$RC
  done
  table "$WORK/rows"
  exit "$worst"
}

# ---- adaptive: fixed vs adaptive outflow against a purchase API of changing capacity ------
adaptive_run() { # round mode(fixed|adaptive) flags... -> appends a row to $WORK/rows, sets RC
  local round=$1 mode=$2; shift 2
  local vq_port sink_port vq_pid json
  start_redis --maxmemory 512mb --maxmemory-policy noeviction
  vq_port=$(free_port); sink_port=$(free_port)
  VQ_REDIS__URL="$REDIS_URL" VQ_TOKEN_SECRET="$secret" VQ_GATE__UPSTREAM="http://127.0.0.1:$sink_port" \
    VQ_QUEUE__OUTFLOW="$mode" VQ_QUEUE__TICK_MS="$tick_ms" VQ_QUEUE__BATCH_SIZE="$batch" \
    VQ_QUEUE__BATCH_MIN="${BATCH_MIN:-10}" VQ_QUEUE__BATCH_MAX="${BATCH_MAX:-200}" \
    VQ_ADAPTIVE__INTERVAL_MS="${INTERVAL_MS:-3000}" VQ_ADAPTIVE__LATENCY_MS="${LATENCY_MS:-1000}" \
    VQ_ADAPTIVE__ERROR_RATIO="${ERROR_RATIO:-0.05}" VQ_ADAPTIVE__INCREASE="${INCREASE:-10}" \
    VQ_ADAPTIVE__DECREASE="${DECREASE:-0.7}" \
    RUST_LOG=warn spawn "vq-$mode-$round" "$vq" serve --flag-on --listen "127.0.0.1:$vq_port"
  vq_pid=$SPAWNED
  wait_http "http://127.0.0.1:$vq_port/healthz" 20 "$vq_pid" ||
    die "vq serve did not start: $(tail -5 "$WORK/vq-$mode-$round.log")"
  json="$WORK/report-$mode-$round.json"
  local flags=(--url "http://127.0.0.1:$vq_port" --target limited-drop:1 --users "$users"
    --rate "$rate" --duration "$duration" --arrival constant --concurrency "$concurrency"
    --follow-poll-after --purchase --conversion "$conversion" --sink "127.0.0.1:$sink_port"
    --sink-capacity "$capacity" --sink-max-wait-ms "$max_wait" --quiet --json "$json")
  window_start
  # shellcheck disable=SC2086 # EXTRA is words
  timed "loadgen-$mode-$round" timeout --foreground --signal=INT --kill-after=10 "$((duration + 60))" \
    "$vq" loadgen "${flags[@]}" $extra "$@"
  local machine_now; machine_now=$(window_end)
  stop_pid "$vq_pid"; stop_pid "$REDIS_PID"
  if ! [ -s "$json" ]; then
    cat "$WORK/loadgen-$mode-$round.err" >&2
    die "loadgen wrote no report (exit $RC)"
  fi
  [ -z "${OUT:-}" ] || cp "$json" "${OUT%.json}.$mode.$round.json"
  python3 - "$json" "$mode" "$machine_now" <<'EOF' >>"$WORK/rows"
import json, sys
r = json.load(open(sys.argv[1]))
steal, load = sys.argv[3].split()
p = r["statusCountsByKind"].get("purchase", {})
errors = sum(v for k, v in p.items() if not k.startswith("2"))
batches = [t["batch"] for t in r.get("timeline", []) if t.get("batch") is not None]
f = lambda x: f"{x:.0f}" if x >= 100 else f"{x:.1f}"
print("\t".join([sys.argv[2], str(r["purchases"]), str(r.get("downstreamRefused") or 0), str(errors),
    f(r["purchase"]["p95Ms"]), str(r.get("downstreamP95Ms") or "-"),
    str(r["admitted"] + r["directAdmitted"]), str(r["noShows"]),
    f(r["waitSeconds"]["p50"]), f(r["waitSeconds"]["p95"]), str(r["stillWaiting"]),
    str(min(batches)) if batches else "-", str(max(batches)) if batches else "-", steal, load]))
EOF
  cat "$WORK/loadgen-$mode-$round.out" >&2
  echo "round $round, $mode: loadgen exit $RC" >&2
}

adaptive_scenario() {
  use_work_dir
  users="${USERS:-10000}" rate="${RATE:-1000}" duration="${DURATION:-90}" concurrency="${CONCURRENCY:-256}"
  extra="${EXTRA:-}" capacity="${CAPACITY:-50,20@30s,50@60s}" max_wait="${MAX_WAIT_MS:-1000}"
  conversion="${CONVERSION:-0.6}" tick_ms="${TICK_MS:-1000}" batch="${BATCH:-80}"
  vq="${BENCH_VQ:-target/release/vq}"
  [ -n "${BENCH_VQ:-}" ] || build_release --quiet --bins
  [ -x "$vq" ] || die "no vq binary at $vq"
  echo "vq bench adaptive: $users users at $rate enters/s, ${duration}s, conversion $conversion;" \
    "purchase API capacity $capacity per s (waits over ${max_wait} ms refused); batch $batch per ${tick_ms} ms;" \
    "loadgen, vq and redis-server $(redis-server --version | awk '{print $3}') on $(nproc) cores" >&2
  printf 'outflow\tpurchases served\trefused by the API (503)\tpurchase errors at buyers\tpurchase P95 ms (buyer)\tP95 ms (API)\tadmitted\tno-shows\twait P50 s\tP95 s\tstill waiting\tbatch min\tmax\tsteal %%\tload 1m\n' >"$WORK/rows"
  local round mode worst=0
  for round in $(seq "$rounds"); do
    for mode in fixed adaptive; do
      adaptive_run "$round" "$mode" "$@"
      [ "$RC" = 0 ] || worst=$RC
    done
  done
  table "$WORK/rows"
  exit "$worst"
}

# ---- wrk: enter and poll next to the calibration ---------------------------------------
wrk_scenario() {
  use_work_dir
  local secs="${1:-${DURATION:-10}}" conns="${2:-64}" poll_order="${POLL_ORDER:-cycle}"
  case "$poll_order" in cycle | random) ;; *) usage "POLL_ORDER must be cycle or random, got '$poll_order'" ;; esac
  build_release --quiet --bins --example bare_evalsha
  start_redis
  local vport bport vpid bpid
  vport=$(free_port); bport=$(free_port)
  VQ_REDIS__URL="$REDIS_URL" VQ_LISTEN="127.0.0.1:$vport" RUST_LOG=warn VQ_TOKEN_SECRET="$secret" \
    VQ_QUEUE__MAX_CAPACITY=100000000 spawn vq target/release/vq serve --flag-on
  vpid=$SPAWNED
  spawn bare target/release/examples/bare_evalsha "$REDIS_URL" "127.0.0.1:$bport"
  bpid=$SPAWNED
  wait_http "http://127.0.0.1:$vport/healthz" 20 "$vpid" || die "vq serve did not start: $(tail -5 "$WORK/vq.log")"
  wait_http "http://127.0.0.1:$bport/" 20 "$bpid" || die "the calibration did not start: $(tail -5 "$WORK/bare.log")"
  echo "vq bench wrk: wrk -t2 -c$conns -d${secs}s, redis-server $(redis-server --version | awk '{print $3}')," \
    "$(nproc) cores shared by wrk, vq (threads = ${VQ_THREADS:-0, one per core}) and redis; polls in $poll_order order" >&2

  # 5xx answers of vq serve, from its own metrics (wrk counts only non-2xx).
  count_5xx() {
    curl -fs "http://127.0.0.1:$vport/metrics" |
      awk '/^virtual_queue_http_request_duration_seconds_count\{.*status="5/ {n += $NF} END {print n + 0}'
  }
  # One wrk run against PID's port, measured: appends a row NAME.
  measured() { # name pid port base-rps same-rps wrk-args...
    local name=$1 pid=$2 port=$3 base=$4 same=$5; shift 5
    local p0 r0 p1 r1 e0=0 e1=0 machine_now
    [ "$pid" != "$vpid" ] || e0=$(count_5xx)
    redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
    p0=$(ticks_of "$pid"); r0=$(ticks_of "$REDIS_PID"); window_start
    timed wrk wrk -t2 -c"$conns" -d"${secs}s" "$@" "http://127.0.0.1:$port" -- "${wrk_args[@]}"
    p1=$(ticks_of "$pid"); r1=$(ticks_of "$REDIS_PID"); machine_now=$(window_end)
    [ "$RC" = 0 ] || die "wrk failed: $(cat "$WORK/wrk.err")"
    [ "$pid" != "$vpid" ] || e1=$(count_5xx)
    local out n rps calls
    out=$(<"$WORK/wrk.out")
    n=$(awk '/requests in/ {print $1}' <<<"$out")
    rps=$(awk '/Requests\/sec/ {printf "%.0f", $2}' <<<"$out")
    LAST_RPS=$rps
    calls=$(redis-cli -p "$REDIS_PORT" info commandstats | awk -F'[=,]' '/^cmdstat_(evalsha|fcall):/ {c += $2} END {print c}')
    # The floor makes no script calls (what Redis counts then is vq's own background work).
    [[ "$name" != "HTTP floor"* ]] || calls=0
    read -r p50 p95 p99 < <(awk '/^percentiles us:/ {printf "%.2f %.2f %.2f\n", $3 / 1000, $4 / 1000, $5 / 1000}' <<<"$out")
    local share="-" same_share="-" five="-"
    [ -z "$base" ] || share=$(awk -v a="$rps" -v b="$base" 'BEGIN {printf "%.0f", 100 * a / b}')
    [ -z "$same" ] || same_share=$(awk -v a="$rps" -v b="$same" 'BEGIN {printf "%.0f", 100 * a / b}')
    [ "$pid" != "$vpid" ] || five=$((e1 - e0))
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rps" "$share" "$same_share" \
      "$p50" "$p95" "$p99" "$(awk '/Non-2xx/ {print $5}' <<<"$out" | grep . || echo 0)" "$five" \
      "$(awk -v n="$n" -v c="${calls:-0}" 'BEGIN {if (c > 0) printf "%.1f", n / c; else print "-"}')" \
      "$(per_req "$CPU_S" s "$n")" "$(per_req $((p1 - p0)) t "$n")" "$(per_req $((r1 - r0)) t "$n")" \
      "${machine_now% *}" "${machine_now#* }" >>"$WORK/rows"
  }
  printf 'run\treq/s\t%% of calibration\t%% of it under the same requests\tP50 ms\tP95\tP99\tnon-2xx\t5xx\tusers per script call\tCPU µs/req wrk\tserver\tredis\tsteal %%\tload 1m\n' >"$WORK/rows"
  local round base same entered
  for round in $(seq "$rounds"); do
    wrk_args=()
    measured "HTTP floor (no Redis)" "$bpid" "$bport" "" "" -s scripts/wrk/floor.lua
    measured calibration "$bpid" "$bport" "" "" -s scripts/wrk/base.lua
    base=$LAST_RPS
    # New users every run: ids of their own (a user id is one buyer across targets).
    wrk_args=(2 "$round" "${round}00000000")
    measured "calibration, enter requests" "$bpid" "$bport" "" "" -s scripts/wrk/enter.lua
    same=$LAST_RPS
    measured enter "$vpid" "$vport" "$base" "$same" -s scripts/wrk/enter.lua
    entered=$(redis-cli -p "$REDIS_PORT" get "queue:{LIMITED_DROP:$round}:seq")
    redis-cli -p "$REDIS_PORT" --raw zrange "queue:{LIMITED_DROP:$round}:waiting" 0 -1 >"$WORK/users.txt"
    wrk_args=("$WORK/users.txt" "$round" 2 "$poll_order")
    measured "calibration, poll requests" "$bpid" "$bport" "" "" -s scripts/wrk/poll.lua
    same=$LAST_RPS
    measured poll "$vpid" "$vport" "$base" "$same" -s scripts/wrk/poll.lua
    echo "round $round: $entered users entered, then polled" >&2
  done
  table "$WORK/rows"
  echo "redis used_memory at the end: $(redis-cli -p "$REDIS_PORT" info memory | awk -F: '/^used_memory_human/ {print $2}' | tr -d '\r')"
}

# ---- pair: two builds or settings side by side -----------------------------------------
pair_scenario() {
  [ $# -eq 2 ] || usage "usage: scripts/bench.sh pair 'A-SPEC' 'B-SPEC' (a spec is [NAME=VALUE ...]|BINARY)"
  local spec
  for spec in "$@"; do
    [[ "$spec" == *"|"* ]] || usage "spec '$spec' has no '|BINARY'"
    [ -x "${spec#*|}" ] || usage "no vq binary at '${spec#*|}'"
  done
  local secs="${SECS:-4}" pairs="${PAIRS:-3}"
  use_work_dir
  start_redis
  local specs=("$1" "$2") port=() vpid=() i
  for i in 0 1; do
    spec=${specs[i]}
    port[i]=$(free_port)
    # shellcheck disable=SC2086 # the settings are words NAME=VALUE
    # Nobody is evicted while the pairs run: an eviction sweep of either side's users would be
    # counted in whichever side's run it fell (the enter runs last longer than the default
    # heartbeat timeout, and the poll runs poll a sample of the users).
    spawn "vq$i" env ${spec%%|*} VQ_QUEUE__HEARTBEAT_TIMEOUT_S=1200 VQ_REDIS__URL="$REDIS_URL" VQ_LISTEN="127.0.0.1:${port[i]}" RUST_LOG=warn \
      VQ_TOKEN_SECRET="$secret" VQ_QUEUE__MAX_CAPACITY=100000000 "${spec#*|}" serve --flag-on
    vpid[i]=$SPAWNED
    wait_http "http://127.0.0.1:${port[i]}/healthz" 20 "${vpid[i]}" || die "vq $i did not start: $(tail -5 "$WORK/vq$i.log")"
  done
  run_one() { # side kind run -> "req/s redis-us vq-us"
    local i=$1 kind=$2 run=$3 target=$(($1 + 1)) r0 v0 n
    r0=$(ticks_of "$REDIS_PID"); v0=$(ticks_of "${vpid[i]}")
    if [ "$kind" = enter ]; then
      wrk -t2 -c"${CONNS:-64}" -d"${secs}s" -s scripts/wrk/enter.lua "http://127.0.0.1:${port[i]}" -- 2 "$target" "${run}00000000" >"$WORK/pair.out"
    else
      wrk -t2 -c"${CONNS:-64}" -d"${secs}s" -s scripts/wrk/poll.lua "http://127.0.0.1:${port[i]}" -- "$WORK/users$i.txt" "$target" 2 >"$WORK/pair.out"
    fi
    n=$(awk '/requests in/ {print $1}' "$WORK/pair.out")
    echo "$(awk '/Requests\/sec/ {printf "%.0f", $2}' "$WORK/pair.out") $(per_req $(($(ticks_of "$REDIS_PID") - r0)) t "$n") $(per_req $(($(ticks_of "${vpid[i]}") - v0)) t "$n")"
  }
  : >"$WORK/res"
  local kind a b machine_now run=0
  window_start
  for kind in enter poll; do
    if [ "$kind" = poll ]; then
      for i in 0 1; do redis-cli -p "$REDIS_PORT" --raw zrange "queue:{LIMITED_DROP:$((i + 1))}:waiting" 0 -1 >"$WORK/users$i.txt"; done
    fi
    # Every enter run enters new users (ids from run × 10^8): a user entering again is another step.
    for _ in $(seq "$pairs"); do
      run=$((run + 4))
      a=$(run_one 0 "$kind" $((run - 3))); b=$(run_one 1 "$kind" $((run - 2))); echo "$kind $a $b" >>"$WORK/res"
      b=$(run_one 1 "$kind" $((run - 1))); a=$(run_one 0 "$kind" "$run"); echo "$kind $a $b" >>"$WORK/res"
    done
  done
  machine_now=$(window_end)
  echo "A = $1"
  echo "B = $2"
  awk '{printf "%-5s A %6d req/s (redis %4.1f, vq %4.1f us/req) | B %6d req/s (redis %4.1f, vq %4.1f) | B/A %.2f\n", $1, $2, $3, $4, $5, $6, $7, $5 / $2}' "$WORK/res"
  printf 'kind\tA req/s\tB req/s\tB/A\tA vq µs/req\tB vq\tA redis µs/req\tB redis\tredis B/A\n' >"$WORK/rows"
  python3 - "$WORK/res" >>"$WORK/rows" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
for kind in ("enter", "poll"):
    g = [[float(x) for x in r[1:]] for r in rows if r[0] == kind]
    med = lambda i: statistics.median(r[i] for r in g)
    ratio = statistics.median(r[3] / r[0] for r in g)
    # Redis µs per request, B over A pair by pair (runs next to each other share the machine).
    redis = statistics.median(r[4] / r[1] for r in g if r[1] > 0)
    print(f"median {kind} ({len(g)} pairs)\t{med(0):.0f}\t{med(3):.0f}\t{ratio:.3f}\t{med(2):.1f}\t{med(5):.1f}\t{med(1):.1f}\t{med(4):.1f}\t{redis:.3f}")
EOF
  rounds=1 table "$WORK/rows"
  read -r steal load <<<"$machine_now"
  echo "steal ${steal} % of the machine's CPU time during the pairs; load average (1 min) at the end ${load}"
}

# ---- lua: script time per user inside Redis --------------------------------------------
lua_scenario() {
  local n="${N:-100000}" b="${B:-16}" lrounds="${ROUNDS:-3}" dirs=("$@") d
  [ ${#dirs[@]} -gt 0 ] || dirs=(lua)
  for d in "${dirs[@]}"; do
    { [ -f "$d/enter.lua" ] && [ -f "$d/status.lua" ]; } || usage "no enter.lua and status.lua in '$d'"
  done
  use_work_dir
  start_redis
  rcli() { redis-cli -p "$REDIS_PORT" "$@"; }
  with_prelude() { # dir script
    if [ -f "$1/prelude.lua" ]; then printf '%s\n' "$(cat "$1/prelude.lua")"; fi
    cat "$1/$2"
  }
  # The calls as Redis protocol, for `redis-cli --pipe`: target LIMITED_DROP:1, users 1..N,
  # the target keys and the arguments before the users as vq's declarations give them
  # (examples/script_args.rs, from `vq::store::layout`: capacity and key ttl, no fence, the
  # tick and the record ttl where the script takes them), each user's token key
  # (`KEYS[k+i] …:token:{user i}`) between them; no sale.
  cargo build -q --example script_args || die "examples/script_args.rs does not build"
  calls() { # enter|status sha
    target/debug/examples/script_args "$1" >"$WORK/layout.$1" || die "no layout for $1"
    python3 - "$WORK/layout.$1" "$2" "$n" "$b" "$1" <<'EOF'
import sys
layout, sha, n, b, op = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
names, head = open(layout).read().splitlines()
names, head = names.split(), head.split("\t")
p = "queue:{LIMITED_DROP:1}:"
out = sys.stdout.buffer
for first in range(1, n + 1, b):
    users = [str(u) for u in range(first, min(first + b, n + 1))]
    call = ["FCALL", sha[len("fcall:"):]] if sha.startswith("fcall:") else ["EVALSHA", sha]
    args = call + [str(len(names) + len(users))] + [p + k for k in names]
    args += [p + "token:" + u for u in users] + head + users
    if op == "status":
        # status.lua's token for each user, stored if the poll finds them admitted.
        args += ["bench-token-" + u for u in users]
    out.write(("*%d\r\n" % len(args)).encode())
    for a in args:
        out.write(("$%d\r\n%s\r\n" % (len(a.encode()), a)).encode())
EOF
  }
  per_user() { # script time of the EVALSHA or FCALL calls since the last reset, µs per user
    rcli info commandstats | awk -F'[=,]' -v n="$n" '/^cmdstat_(evalsha|fcall):/ {printf "%.2f", $4 / n}'
  }
  # As vq loads them where Redis takes functions: one library, the prelude once at its head and
  # each script a function whose body sets KEYS and ARGV (src/store/redis/scripts.rs).
  library() { # dir
    printf '#!lua name=benchlua\nlocal KEYS, ARGV\n'
    [ ! -f "$1/prelude.lua" ] || cat "$1/prelude.lua"
    local f
    for f in enter status; do
      printf "\nredis.register_function{function_name = 'bench_%s', callback = function(keys, argv)\nKEYS, ARGV = keys, argv\n" "$f"
      cat "$1/$f.lua"
      printf '\nend}\n'
    done
  }
  echo "vq bench lua: script time per user (µs inside Redis), $n users in calls of $b, redis-server $(redis-server --version | awk '{print $3}')" >&2
  printf 'scripts\tenter µs/user\tpoll µs/user\n' >"$WORK/rows"
  local round enter_sha status_sha entered e s
  window_start
  for round in $(seq "$lrounds"); do
    for d in "${dirs[@]}"; do
      rcli flushall >/dev/null
      if [ "${EVAL:-0}" = 1 ]; then
        # As vq sends them where Redis refuses functions: the directory's prelude.lua (when it
        # has one) in front of each script.
        enter_sha=$(rcli script load "$(with_prelude "$d" enter.lua)")
        status_sha=$(rcli script load "$(with_prelude "$d" status.lua)")
      else
        library "$d" | rcli -x function load replace >/dev/null || die "$d: the library did not load"
        enter_sha=fcall:bench_enter status_sha=fcall:bench_status
      fi
      rcli config resetstat >/dev/null
      calls enter "$enter_sha" | rcli --pipe >/dev/null
      entered=$(rcli get 'queue:{LIMITED_DROP:1}:seq')
      [ "$entered" = "$n" ] || die "$d: $entered users entered, expected $n"
      e=$(per_user)
      # CMDSTATS=prefix keeps each phase's INFO commandstats (the scripts' own commands counted).
      [ -z "${CMDSTATS:-}" ] || rcli info commandstats >"$CMDSTATS.$round.$(basename "$d").enter"
      rcli config resetstat >/dev/null
      calls status "$status_sha" | rcli --pipe >/dev/null
      s=$(per_user)
      [ -z "${CMDSTATS:-}" ] || rcli info commandstats >"$CMDSTATS.$round.$(basename "$d").status"
      printf '%s\t%s\t%s\n' "$d" "$e" "$s" >>"$WORK/rows"
      echo "round $round $d: enter $e, poll $s" >&2
    done
  done
  local machine_now steal load
  machine_now=$(window_end)
  rounds=$lrounds table "$WORK/rows"
  read -r steal load <<<"$machine_now"
  echo "steal ${steal} % of the machine's CPU time during the runs; load average (1 min) at the end ${load}"
}

# ---- pow: what the proof of work costs a browser and a bot ------------------------------
pow_scenario() {
  use_work_dir
  local bits="${BITS:-18}" runs="${RUNS:-9}" buyers="${USERS:-200}"
  build_release --quiet --bins
  window_start
  echo "vq bench pow: $bits bits; chromium $(chromium --version 2>/dev/null | awk '{print $2}'), $runs page loads" >&2
  POW_BITS=$bits POW_RUNS=$runs timed chromium-pow cargo nextest run --test it --run-ignored ignored-only \
    measure_pow_in_chromium --no-capture
  [ "$RC" = 0 ] || die "the chromium measurement failed: $(tail -20 "$WORK/chromium-pow.err")"
  grep -h '^pow chromium' "$WORK/chromium-pow.out" "$WORK/chromium-pow.err" >&2 || true
  start_redis
  local port pid json="$WORK/pow.json"
  port=$(free_port)
  VQ_REDIS__URL="$REDIS_URL" VQ_TOKEN_SECRET="$secret" VQ_ENTRY__POW_BITS="$bits" RUST_LOG=warn \
    spawn vq target/release/vq serve --flag-on --listen "127.0.0.1:$port"
  pid=$SPAWNED
  wait_http "http://127.0.0.1:$port/healthz" 20 "$pid" || die "vq serve did not start: $(tail -5 "$WORK/vq.log")"
  timed loadgen timeout --foreground --signal=INT --kill-after=10 $((buyers / 20 + 120)) \
    target/release/vq loadgen --url "http://127.0.0.1:$port" --target limited-drop:1 --users "$buyers" \
    --rate 20 --duration $((buyers / 20 + 5)) --quiet --json "$json"
  stop_pid "$pid"; stop_pid "$REDIS_PID"
  [ -s "$json" ] || die "loadgen wrote no report: $(tail -5 "$WORK/loadgen.err")"
  local machine_now steal load
  machine_now=$(window_end)
  read -r steal load <<<"$machine_now"
  python3 - "$json" "$bits" <<'EOF' >&2
import json, sys
p = json.load(open(sys.argv[1]))["proofOfWork"]
print(f"pow loadgen: {p['solved']} solves at {sys.argv[2]} bits, {p['hashes']} hashes, "
      f"median {p['p50Ms']:.0f} ms, P95 {p['p95Ms']:.0f} ms, {p['cpuSeconds'] / p['solved'] * 1000:.0f} ms of CPU per place")
EOF
  echo "steal ${steal} % of the machine's CPU time during the runs; load average (1 min) at the end ${load}" >&2
}

# ---- scale: one target of a million users, no Redis call over 2 ms -----------------------
scale_scenario() {
  use_work_dir
  local n="${N:-1000000}" mid="${WAITING:-100000}" secs="${SECS:-15}" batch="${BATCH:-2000}"
  local tick_ms="${TICK_MS:-1000}" conns=64 vq="${BENCH_VQ:-target/release/vq}"
  [ -n "${BENCH_VQ:-}" ] || build_release --quiet --bins
  [ -x "$vq" ] || die "no vq binary at $vq"
  echo "vq bench scale: $n users in one target, then $mid; wrk -t2 -c$conns -d${secs}s; batch $batch per ${tick_ms} ms;" \
    "redis-server $(redis-server --version | awk '{print $3}') on $(nproc) cores" >&2
  printf 'phase\twaiting\tcalls over 2 ms\tover 1 ms\tlargest ms\tlargest call\tover 2 ms by call\tenter P50 ms\tP99\tpoll P50 ms\tP99\tbytes per waiting user\tsteal %%\tload 1m\n' >"$WORK/rows"
  rcli() { redis-cli -p "$REDIS_PORT" "$@"; }
  used_memory() { rcli info memory | awk -F: '/^used_memory:/ {print $2 + 0}'; }
  opened() { [ "$(rcli hexists "$1" opened_at)" = 1 ]; }
  # Pre-queues users 1..COUNT of limited-drop:ID (arrival and heartbeat now, as enter.lua
  # writes them), schedules the opening 2 s ahead and waits until the pump has placed them all.
  open_with() { # id count
    local id=$1 count=$2 p="queue:{LIMITED_DROP:$1}:" at from
    python3 - "$p" "$count" "LIMITED_DROP:$id" <<'EOF' | rcli --pipe >/dev/null
import sys, time
p, n, target = sys.argv[1], int(sys.argv[2]), sys.argv[3]
now = str(int(time.time() * 1000))
out = sys.stdout.buffer
def cmd(*args):
    out.write(b"*%d\r\n" % len(args))
    for a in args:
        a = a.encode()
        out.write(b"$%d\r\n%s\r\n" % (len(a), a))
for first in range(1, n + 1, 1000):
    ids = [str(u) for u in range(first, min(first + 1000, n + 1))]
    for key in ("prequeue", "heartbeat"):
        args = ["ZADD", p + key]
        for u in ids:
            args += [now, u]
        cmd(*args)
cmd("SET", p + "seq", "0")
cmd("SADD", "queue:active", target)
EOF
    rcli slowlog reset >/dev/null # the fill's own ZADDs are the bench's, not vq's
    at=$(date -u -d "@$(($(date +%s) + 2))" +%Y-%m-%dT%H:%M:%SZ)
    from=$(date -u -d "@$(($(date +%s) - 60))" +%Y-%m-%dT%H:%M:%SZ)
    VQ_REDIS__URL="$REDIS_URL" VQ_TOKEN_SECRET="$secret" "$vq" sale schedule "limited-drop:$id" \
      --opens-at "$at" --prequeue-from "$from" >"$WORK/schedule.out" 2>&1 ||
      die "schedule failed: $(cat "$WORK/schedule.out")"
    wait_until 300 opened "${p}sale" ||
      die "the opening of $count users did not finish within 300 s"
  }
  # Redis' SLOWLOG so far, kept aside (one JSON array a line), and emptied: the bench's own
  # reads of the queue are not counted (it empties the log after them).
  slowlog_take() { rcli --json slowlog get 1000000 >>"$WORK/slowlog.jsonl"; rcli slowlog reset >/dev/null; }
  # Of the calls Redis logged (over 1 ms): "over-2-ms over-1-ms largest-ms its-command
  # the-commands-over-2-ms-by-count" (a script by its function's name, or by its file where it
  # went as EVALSHA: lua/prelude.lua, a newline and the script; another build's changed scripts
  # show as their sha's first 8 digits).
  slow() {
    slowlog_take
    python3 - "$WORK/slowlog.jsonl" <<'EOF'
import collections, glob, hashlib, json, os, sys
# A logged argument may be raw bytes (a heartbeat bitmap's SETRANGE): read them as replaced.
log = [e for line in open(sys.argv[1], errors="replace") if line.strip() for e in json.loads(line)]
# The bench's own SLOWLOG GET of a long log is logged too: not vq's.
log = [e for e in log if e[3][0].lower() != "slowlog"]
prelude = open("lua/prelude.lua").read()
names = {hashlib.sha1((prelude + "\n" + open(f).read()).encode()).hexdigest(): os.path.basename(f)
         for f in glob.glob("lua/*.lua")}
def what(e):
    args = e[3]
    if args[0].lower() == "evalsha" and len(args) > 1:
        return names.get(args[1], args[1][:8])
    if args[0].lower() == "fcall" and len(args) > 1:
        return args[1]
    return args[0].lower()
if not log:
    print(0, 0, "-", "-", "-")
else:
    big = max(log, key=lambda e: e[2])
    over = collections.Counter(what(e) for e in log if e[2] > 2000)
    print(sum(over.values()), len(log), "%.2f" % (big[2] / 1000), what(big),
          ",".join(f"{k}:{v}" for k, v in over.most_common(4)) or "-")
EOF
    # SLOWLOG_KEEP=prefix keeps each phase's log (prefix-N.jsonl) for a closer look.
    [ -z "${SLOWLOG_KEEP:-}" ] || cp "$WORK/slowlog.jsonl" "${SLOWLOG_KEEP}-$(wc -l <"$WORK/rows").jsonl"
    rm -f "$WORK/slowlog.jsonl"
  }
  wrk_run() { # name script args... -> "p50 p99" (ms)
    "${pin[@]}" wrk -t2 -c"$conns" -d"${secs}s" -s "scripts/wrk/$2" "http://127.0.0.1:$vport" -- "${@:3}" >"$WORK/$1.out" 2>&1 ||
      die "wrk failed: $(cat "$WORK/$1.out")"
    awk '/^percentiles us:/ {printf "%.2f %.2f\n", $3 / 1000, $5 / 1000}' "$WORK/$1.out"
  }
  # The SLOWLOG times a call by the wall clock: on a shared machine Redis at REDIS_NICE (-10)
  # keeps the neighbours' processes from stretching its calls (renice changes Redis' main
  # thread, the one that runs the commands).
  # With PIN=1, Redis has core 1 to itself and vq and wrk share core 0, as Redis has a core of
  # its own in production: the SLOWLOG then times Redis' work, not its waits for a core.
  start_scale_redis() {
    start_redis --slowlog-log-slower-than 1000 --slowlog-max-len 1000000
    renice -n "${REDIS_NICE:--10}" -p "$REDIS_PID" >/dev/null || say "could not renice redis-server"
    [ "${PIN:-0}" = 0 ] || taskset -a -cp 1 "$REDIS_PID" >/dev/null || die "could not pin redis-server"
    # RT=1: Redis' threads at a real-time priority (SCHED_FIFO 10, root): nothing on the
    # machine preempts a call any more, so a call over 2 ms is Redis' own work (or the
    # hypervisor's steal, which the row shows).
    [ "${RT:-0}" = 0 ] || chrt -a -f -p 10 "$REDIS_PID" >/dev/null || die "could not give redis-server a real-time priority (root?)"
  }
  local pin=()
  [ "${PIN:-0}" = 0 ] || pin=(taskset -c 0) # taskset execs the command: vq's PID is its own
  start_vq() {
    vport=$(free_port)
    VQ_REDIS__URL="$REDIS_URL" VQ_LISTEN="127.0.0.1:$vport" RUST_LOG=warn VQ_TOKEN_SECRET="$secret" \
      VQ_QUEUE__MAX_CAPACITY=100000000 VQ_QUEUE__HEARTBEAT_TIMEOUT_S=3600 VQ_QUEUE__KEY_TTL_S=7200 VQ_QUEUE__BATCH_SIZE="$batch" \
      VQ_QUEUE__TICK_MS="$tick_ms" spawn vq "${pin[@]}" "$vq" serve --flag-on
    vpid=$SPAWNED
    wait_http "http://127.0.0.1:$vport/healthz" 20 "$vpid" || die "vq serve did not start: $(tail -5 "$WORK/vq.log")"
  }
  row() { # phase waiting "slow" "enter" "poll" per-user machine
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" $3 $4 $5 "$6" $7 >>"$WORK/rows"
  }
  local round vport vpid mem0 mem1 e0 e1 enter poll
  for round in $(seq "$rounds"); do
    # N waiting in limited-drop:1: the opening, polls across it, enters into another target.
    start_scale_redis
    start_vq
    window_start
    mem0=$(used_memory)
    open_with 1 "$n"
    # The opening's last call unlinks the pre-queue's sets: Redis frees them off its main
    # thread, so the memory is read once nothing is pending.
    for _ in $(seq 100); do
      [ "$(rcli info memory | awk -F: '/^lazyfree_pending_objects:/ {print $2+0}')" = 0 ] && break
      sleep 0.1
    done
    mem1=$(used_memory)
    slowlog_take
    rcli --raw zrange 'queue:{LIMITED_DROP:1}:waiting' 0 -1 >"$WORK/users.txt"
    rcli slowlog reset >/dev/null
    poll=$(wrk_run poll-big poll.lua "$WORK/users.txt" 1 2 random)
    enter=$(wrk_run enter-other enter.lua 2 2 "${round}00000000")
    row "$n in one target (enters: another)" "$n" "$(slow)" "$enter" "$poll" $(((mem1 - mem0) / n)) "$(window_end)"
    stop_pid "$vpid"; stop_pid "$REDIS_PID"
    # WAITING users: enter P99 next to poll P99, both on the target that holds them.
    start_scale_redis
    start_vq
    window_start
    open_with 1 "$mid"
    slowlog_take
    rcli --raw zrange 'queue:{LIMITED_DROP:1}:waiting' 0 -1 >"$WORK/users.txt"
    rcli slowlog reset >/dev/null
    e0=$(rcli get 'queue:{LIMITED_DROP:1}:seq'); mem0=$(used_memory)
    enter=$(wrk_run enter-mid enter.lua 2 1 "${round}00000000")
    e1=$(rcli get 'queue:{LIMITED_DROP:1}:seq'); mem1=$(used_memory)
    poll=$(wrk_run poll-mid poll.lua "$WORK/users.txt" 1 2 random)
    row "$mid in one target" "$mid" "$(slow)" "$enter" "$poll" $(((mem1 - mem0) / (e1 > e0 ? e1 - e0 : 1))) "$(window_end)"
    stop_pid "$vpid"; stop_pid "$REDIS_PID"
    echo "round $round done" >&2
  done
  table "$WORK/rows"
}

# ---- slices: what one call of each sliced script costs Redis ------------------------------
slices_scenario() {
  use_work_dir
  start_redis
  renice -n "${REDIS_NICE:--10}" -p "$REDIS_PID" >/dev/null || say "could not renice redis-server"
  local round
  window_start
  for round in $(seq "$rounds"); do
    python3 scripts/measure-slices.py "$REDIS_PORT" "${N:-1000000}" "${CALLS:-40}" || die "the measurement failed"
  done
  read -r steal load <<<"$(window_end)"
  echo "steal ${steal} % of the machine's CPU time during the runs; load average (1 min) at the end ${load}"
}

# ---- shards: one target over a 3-primary cluster, 1 shard vs 3 --------------------------
CLUSTER_PORTS=() CLUSTER_PIDS=()
start_cluster() { # -> CLUSTER_PORTS, CLUSTER_PIDS: three primaries with equal slot ranges
  use_work_dir
  CLUSTER_PORTS=() CLUSTER_PIDS=()
  local port bus addrs=()
  for _ in 1 2 3; do
    port=$(free_port); bus=$(free_port)
    mkdir -p "$WORK/node-$port"
    spawn "node-$port" redis-server --port "$port" --cluster-port "$bus" --bind 127.0.0.1 \
      --cluster-enabled yes --cluster-config-file nodes.conf --save "" --appendonly no --dir "$WORK/node-$port"
    CLUSTER_PIDS+=("$SPAWNED"); CLUSTER_PORTS+=("$port"); addrs+=("127.0.0.1:$port")
    wait_until 10 redis-cli -p "$port" ping || die "cluster node $port did not start"
  done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$WORK/cluster-create.log" 2>&1 ||
    die "cluster create failed: $(tail -3 "$WORK/cluster-create.log")"
  for port in "${CLUSTER_PORTS[@]}"; do
    wait_until 10 sh -c "redis-cli -p $port cluster info | grep -q cluster_state:ok" || die "cluster node $port not ready"
  done
}

node_cpu() { # port -> the node's CPU seconds so far, user + system (INFO cpu)
  redis-cli -p "$1" info cpu | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.3f", s}'
}
node_script_usec() { # port -> usec of the script calls since the last RESETSTAT (commandstats' fcall/evalsha)
  redis-cli -p "$1" info commandstats | awk -F'[:,=]' '/^cmdstat_(fcall|evalsha)/ {for (i = 1; i < NF; i++) if ($i == "usec") s += $(i + 1)} END {print s + 0}'
}

shards_run() { # round shards -> appends a row to $WORK/rows
  local round=$1 n=$2 vq_port vq_pid json conf nodes port
  start_cluster
  nodes=$(printf 'redis://127.0.0.1:%s,' "${CLUSTER_PORTS[@]}"); nodes=${nodes%,}
  conf="$WORK/vq-shards-$n.toml"
  printf '[[targets.types]]\nslug = "limited-drop"\nshards = %s\n\n[[targets.types]]\nslug = "ticketing-event"\n' "$n" >"$conf"
  vq_port=$(free_port)
  VQ_REDIS__CLUSTER_NODES="$nodes" VQ_TOKEN_SECRET="$secret" VQ_QUEUE__BATCH_SIZE="$batch" VQ_QUEUE__TICK_MS=1000 VQ_QUEUE__MAX_CAPACITY=100000000 \
    RUST_LOG=warn spawn "vq-shards-$n-$round" "$vq" serve --config "$conf" --flag-on --listen "127.0.0.1:$vq_port"
  vq_pid=$SPAWNED
  wait_http "http://127.0.0.1:$vq_port/healthz" 20 "$vq_pid" ||
    die "vq serve did not start: $(tail -5 "$WORK/vq-shards-$n-$round.log")"
  local cpu0=()
  for port in "${CLUSTER_PORTS[@]}"; do redis-cli -p "$port" config resetstat >/dev/null; cpu0+=("$(node_cpu "$port")"); done
  json="$WORK/shards-$n-$round.json"
  window_start
  if [ "${LOAD:-loadgen}" = wrk ]; then
    # New users' enters as fast as vq takes them (closed loop): the coalesced calls are as
    # large as this machine makes them. loadgen's figures are left out of the row.
    wrk -t2 -c64 -d"${duration}s" -s scripts/wrk/enter.lua "http://127.0.0.1:$vq_port" -- 2 1 "${round}00000000" \
      >"$WORK/wrk-shards-$n-$round.out" 2>&1 || die "wrk failed: $(cat "$WORK/wrk-shards-$n-$round.out")"
    awk -v p99="$(awk '/^percentiles us:/ {printf "%.1f", $5 / 1000}' "$WORK/wrk-shards-$n-$round.out")" \
      '/requests in/ {printf "{\"entered\": %d, \"admitted\": null, \"orderError\": {\"rankCorrelation\": null, \"maxDisplacement\": \"-\", \"meanDisplacement\": null}, \"enter\": {\"p99Ms\": %s}, \"poll\": {\"p99Ms\": null}}\n", $1, p99}' \
      "$WORK/wrk-shards-$n-$round.out" >"$json"
    ! grep -q "Non-2xx" "$WORK/wrk-shards-$n-$round.out" || die "wrk met answers other than 2xx: $(cat "$WORK/wrk-shards-$n-$round.out")"
  else
    timed "loadgen-shards-$n-$round" timeout --foreground --signal=INT --kill-after=10 $((duration + 120)) \
      env VQ_REDIS__URL=redis://127.0.0.1:1 "$vq" loadgen --url "http://127.0.0.1:$vq_port" --target limited-drop:1 \
      --users "$users" --rate "$rate" --duration "$duration" --concurrency 128 --follow-poll-after --quiet --json "$json"
  fi
  local machine_now usecs=() scripts=() i=0
  machine_now=$(window_end)
  for port in "${CLUSTER_PORTS[@]}"; do
    usecs+=("$(awk -v a="${cpu0[i]}" -v b="$(node_cpu "$port")" 'BEGIN {printf "%.0f", (b - a) * 1e6}')")
    scripts+=("$(node_script_usec "$port")"); i=$((i + 1))
    # What each node spent its time on, on stderr: the five costliest commands.
    redis-cli -p "$port" info commandstats | awk -F'[:,=]' -v n="$n" -v p="$port" '/^cmdstat_/ {
      for (i = 1; i < NF; i++) { if ($i == "calls") c = $(i + 1); if ($i == "usec") u = $(i + 1) }
      print u, c, substr($1, 9) }' | sort -rn | head -5 |
      awk -v n="$n" -v p="$port" '{printf "%s shard(s), node %s: %s %d calls %.2f s\n", n, p, $3, $2, $1 / 1e6}' >&2
  done
  stop_pid "$vq_pid"
  local pid; for pid in "${CLUSTER_PIDS[@]}"; do stop_pid "$pid"; done
  [ -s "$json" ] || die "loadgen wrote no report: $(tail -5 "$WORK/loadgen-shards-$n-$round.err")"
  [ -z "${OUT:-}" ] || cp "$json" "${OUT%.json}.shards-$n.$round.json"
  python3 - "$json" "$n" "$machine_now" "$(IFS=,; echo "${scripts[*]}")" "${usecs[@]}" <<'PY' >>"$WORK/rows"
import json, sys
r = json.load(open(sys.argv[1]))
n, (steal, load), us = sys.argv[2], sys.argv[3].split(), sorted(float(u) for u in sys.argv[5:])
sc = sorted(float(u) for u in sys.argv[4].split(","))
entered = r["entered"] or 1
o = r["orderError"]
rho = o["rankCorrelation"]
def ms(v):
    return "-" if v is None else f"{v:.1f}"
print("\t".join([f"{n} shard{'s' if n != '1' else ''}", str(r["entered"]), str(r["admitted"] if r["admitted"] is not None else "-"),
    *(f"{u / 1e6:.2f}" for u in us), *(f"{u / entered:.1f}" for u in us), f"{sum(us) / entered:.1f}",
    f"{us[-1] / us[0]:.2f}" if us[0] > 0 else "-", "/".join(f"{u / 1e6:.2f}" for u in sc),
    "-" if rho is None else f"{rho:.4f}",
    str(o["maxDisplacement"]), ms(o["meanDisplacement"]), ms(r["enter"]["p99Ms"]),
    ms(r["poll"]["p99Ms"]), steal, load]))
PY
  [ ! -f "$WORK/loadgen-shards-$n-$round.err" ] || cat "$WORK/loadgen-shards-$n-$round.err" >&2
}

shards_scenario() {
  users="${USERS:-20000}" rate="${RATE:-2000}" duration="${DURATION:-10}" batch="${BATCH:-200}"
  vq="${BENCH_VQ:-target/release/vq}"
  [ -n "${BENCH_VQ:-}" ] || build_release --quiet --bins
  printf 'run\tentered\tadmitted\tnode s (least)\tnode s\tnode s (most)\tµs/enter (least)\tµs/enter\tµs/enter (most)\tµs/enter all\tmost/least\tscripts s per node\trho\tmax displ\tmean displ\tenter p99\tpoll p99\tsteal %%\tload\n' >"$WORK/rows"
  local round
  for round in $(seq "$rounds"); do
    shards_run "$round" 1
    shards_run "$round" 3
  done
  table "$WORK/rows"
  echo "node s: each node's CPU seconds over the run (INFO cpu, user + sys: commands, networking, the probe's TIME); µs/enter = that over the users entered;"
  echo "scripts s per node: commandstats usec of FCALL/EVALSHA (the script calls, the commands they run included), least to most"
}

case "$scenario" in
  shards) use_work_dir; shards_scenario ;;
  pow) pow_scenario ;;
  slices) slices_scenario ;;
  scale) scale_scenario ;;
  sale) loadgen_scenario 1 "$@" ;;
  naive | starved) loadgen_scenario 0 "$@" ;;
  adaptive) adaptive_scenario "$@" ;;
  wrk) wrk_scenario "$@" ;;
  pair) pair_scenario "$@" ;;
  lua) lua_scenario "$@" ;;
esac
