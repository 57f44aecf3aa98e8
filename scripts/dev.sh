#!/usr/bin/env bash
# The main job on one machine: vq serve on localhost with everything it needs.
#
# - uses the Redis at $VQ_REDIS__URL when set; otherwise starts a private redis-server on a
#   free loopback port (installing the Debian package when missing), never one that happens to
#   answer on 6379, and prints the VQ_REDIS__URL that points the operator commands (vq flag,
#   sale, stats, ...) at it; with no way to get one it stops and says why (VQ_STORE=memory runs
#   the embedded single-instance store instead, where no operator command reaches);
# - forwards gated purchases to a stand-in purchase API it starts (scripts/purchase-stand-in.py,
#   200 to everything) unless VQ_GATE__UPSTREAM names one, e.g. the sink of
#   `vq loadgen --sink 127.0.0.1:9000` with VQ_GATE__UPSTREAM=http://127.0.0.1:9000;
# - lets a browser name its user with ?user=ID on the waiting page (page.allow_query_user,
#   trials only) and prints such a URL;
# - generates a development secret when VQ_TOKEN_SECRET is not set (and says so);
# - builds vq (release; DEV_PROFILE=debug for a debug build) with cargo's progress shown,
#   declares the example target limited-drop:42 (VQ_TARGETS__DECLARED), turns the queue on,
#   prints curl lines to try once vq answers, and serves until Ctrl-C.
#   A redis-server it started is stopped on exit.
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

listen="${VQ_LISTEN:-127.0.0.1:8080}"
export VQ_LISTEN="$listen"
on_exit() {
  [ -z "$REDIS_PID" ] || say "stopped the redis-server this script started (pid $REDIS_PID)"
}

redis_answers() { # url
  local hostport="${1#redis://}"; hostport="${hostport%%/*}"
  local host="${hostport%%:*}" port="${hostport##*:}"
  [ "$port" = "$hostport" ] && port=6379
  (exec 3<>"/dev/tcp/$host/$port" && printf 'PING\r\n' >&3 && timeout 1 head -c 5 <&3 | grep -q PONG) 2>/dev/null
}

if [ "${VQ_STORE:-redis}" = "redis" ]; then
  if [ -n "${VQ_REDIS__URL:-}" ]; then
    redis_answers "$VQ_REDIS__URL" || die "VQ_REDIS__URL=$VQ_REDIS__URL does not answer; start it or unset VQ_REDIS__URL"
    say "using the Redis at $VQ_REDIS__URL (VQ_REDIS__URL)"
  else
    install_missing redis-server || true
    command -v redis-server >/dev/null 2>&1 ||
      die "no redis-server on this machine, and installing it failed (apt-get's error is above: another apt may hold its lock; retry when it is done). Nothing was started. Either point VQ_REDIS__URL at a running Redis, or run VQ_STORE=memory $0: the embedded single-instance store serves the queue API, the gate and the waiting page, but no operator command reaches it (vq flag, sale, stats, batch need Redis)"
    start_redis --maxmemory 512mb --maxmemory-policy noeviction
    export VQ_REDIS__URL="$REDIS_URL"
    say "started a private redis-server on 127.0.0.1:$REDIS_PORT (pid $REDIS_PID; stopped on exit)"
  fi
else
  say "VQ_STORE=$VQ_STORE: the embedded single-instance store; operator commands (vq flag, sale, stats, batch) cannot reach it"
fi

# The purchase API behind the gate: a stand-in unless VQ_GATE__UPSTREAM names one.
if [ -z "${VQ_GATE__UPSTREAM:-}" ]; then
  stand_in_port=$(free_port)
  spawn purchase-stand-in python3 scripts/purchase-stand-in.py "$stand_in_port"
  export VQ_GATE__UPSTREAM="http://127.0.0.1:$stand_in_port"
  wait_http "$VQ_GATE__UPSTREAM/" 10 "$SPAWNED" || die "the purchase API stand-in did not start on $VQ_GATE__UPSTREAM"
  say "purchases that pass the gate go to a stand-in purchase API on $VQ_GATE__UPSTREAM (200 to everything; VQ_GATE__UPSTREAM=URL names your own)"
else
  say "purchases that pass the gate go to $VQ_GATE__UPSTREAM (VQ_GATE__UPSTREAM)"
fi
# A browser has no X-User-Id: let the waiting page take ?user=ID (trials only).
export VQ_PAGE__ALLOW_QUERY_USER="${VQ_PAGE__ALLOW_QUERY_USER:-true}"

if [ -z "${VQ_TOKEN_SECRET:-}" ] && [ -z "${VQ_TOKEN_SECRET_FILE:-}" ]; then
  VQ_TOKEN_SECRET="$(head -c 32 /dev/urandom | base64)"
  export VQ_TOKEN_SECRET
  say "generated a development token secret for this run (set VQ_TOKEN_SECRET in production)"
fi

profile="${DEV_PROFILE:-release}"
if [ -x "${CARGO_TARGET_DIR:-target}/$profile/vq" ]; then
  say "building vq ($profile): only what changed since the last build"
else
  say "building vq ($profile) for the first time: cargo compiles ~200 crates, which takes about 4 minutes on 2 cores; later runs take seconds"
fi
if [ "$profile" = "release" ]; then build_release --bins; else cargo build; fi
vq="${CARGO_TARGET_DIR:-target}/$profile/vq"

if (exec 3<>"/dev/tcp/${listen%:*}/${listen##*:}") 2>/dev/null; then
  die "something already listens on $listen: stop it, or choose another address with VQ_LISTEN=127.0.0.1:PORT"
fi
# A queue answers only for declared targets: declare the example one (README, Operating a
# sale: `vq target add` declares more at runtime).
export VQ_TARGETS__DECLARED="${VQ_TARGETS__DECLARED:-[\"limited-drop:42\"]}"
spawn - "$vq" serve --flag-on "$@"
vq_pid=$SPAWNED
# The curl lines only once vq answers: a busy port or a bad setting ends vq serve first, with
# its own error above.
until wait_http "http://$listen/healthz" 1 "$vq_pid"; do
  if ! kill -0 "$vq_pid" 2>/dev/null; then
    code=0
    wait "$vq_pid" || code=$?
    say "vq serve did not start (exit $code): see its error above"
    exit "$(( code == 0 ? 1 : code ))"
  fi
done

cat >&2 <<EOT
==> vq serve on http://$listen with the queue on for the declared target limited-drop:42. Try:
  curl -s -X POST -H 'X-User-Id: 1' http://$listen/virtual-queues/limited-drop/42/entries
  curl -s -H 'X-User-Id: 1' http://$listen/virtual-queues/limited-drop/42/entries/me
  curl -s http://$listen/virtual-queues/limited-drop/42/stats
  curl -s -X DELETE -H 'X-User-Id: 1' http://$listen/virtual-queues/limited-drop/42/entries/me
==> The first answer is WAITING; poll again after the next tick (2 s) to be ADMITTED.
==> The waiting page in a browser, as user 1 (?user= stands in for the X-User-Id a login would set):
  http://$listen/waiting-room/limited-drop/42?user=1
EOT
if [ "${VQ_STORE:-redis}" = "redis" ]; then
  cat >&2 <<EOT
==> Operator commands talk to this Redis only with its URL (without it they try 127.0.0.1:6379):
  export VQ_REDIS__URL=$VQ_REDIS__URL
  $vq stats     # also: vq flag status, vq sale show, vq batch show
EOT
fi
say "Ctrl-C stops it."
wait "$vq_pid"
