#!/usr/bin/env bash
# The main job on one machine: vq serve on localhost with everything it needs.
#
# - uses the Redis at $VQ_REDIS__URL when set; otherwise starts a private redis-server on a
#   free loopback port (installing the Debian package when missing), never one that happens to
#   answer on 6379; with no way to get one, falls back to the embedded single-instance store
#   (VQ_STORE=memory forces that);
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
    if command -v redis-server >/dev/null 2>&1; then
      start_redis --maxmemory 512mb --maxmemory-policy noeviction
      export VQ_REDIS__URL="$REDIS_URL"
      say "started a private redis-server on 127.0.0.1:$REDIS_PORT (pid $REDIS_PID; stopped on exit)"
    else
      say "no redis-server available: using the embedded store (single instance only)"
      export VQ_STORE=memory
    fi
  fi
fi

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
==> Ctrl-C stops it.
EOT
wait "$vq_pid"
