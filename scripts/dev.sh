#!/usr/bin/env bash
# The main job on one machine: vq serve on localhost with everything it needs.
#
# - uses the Redis at $VQ_REDIS__URL when set; otherwise starts a private redis-server on a
#   free loopback port (installing the Debian package when missing), never one that happens to
#   answer on 6379; with no way to get one, falls back to the embedded single-instance store
#   (VQ_STORE=memory forces that);
# - generates a development secret when VQ_TOKEN_SECRET is not set (and says so);
# - builds vq (release; DEV_PROFILE=debug for a debug build) with cargo's progress shown,
#   turns the queue on, prints curl lines to try once vq answers, and serves until Ctrl-C.
#   A redis-server it started is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '==> %s\n' "$*" >&2; }
listen="${VQ_LISTEN:-127.0.0.1:8080}"
export VQ_LISTEN="$listen"
started_redis=""
vq_pid=""

cleanup() {
  if [ -n "$vq_pid" ]; then
    kill "$vq_pid" 2>/dev/null || true
    wait "$vq_pid" 2>/dev/null || true
  fi
  if [ -n "$started_redis" ]; then
    kill "$started_redis" 2>/dev/null || true
    wait "$started_redis" 2>/dev/null || true
    say "stopped the redis-server this script started (pid $started_redis)"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

redis_answers() { # url
  local hostport="${1#redis://}"; hostport="${hostport%%/*}"
  local host="${hostport%%:*}" port="${hostport##*:}"
  [ "$port" = "$hostport" ] && port=6379
  (exec 3<>"/dev/tcp/$host/$port" && printf 'PING\r\n' >&3 && timeout 1 head -c 5 <&3 | grep -q PONG) 2>/dev/null
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

if [ "${VQ_STORE:-redis}" = "redis" ]; then
  if [ -n "${VQ_REDIS__URL:-}" ]; then
    redis_answers "$VQ_REDIS__URL" || { say "VQ_REDIS__URL=$VQ_REDIS__URL does not answer; start it or unset VQ_REDIS__URL"; exit 1; }
    say "using the Redis at $VQ_REDIS__URL (VQ_REDIS__URL)"
  else
    if ! command -v redis-server >/dev/null 2>&1; then
      say "redis-server is missing: installing the Debian package"
      sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
      { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null; } || true
    fi
    if command -v redis-server >/dev/null 2>&1; then
      port="$(free_port)"
      export VQ_REDIS__URL="redis://127.0.0.1:$port"
      mkdir -p target/dev-redis
      redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
        --maxmemory 512mb --maxmemory-policy noeviction --dir target/dev-redis \
        >target/dev-redis/redis.log 2>&1 &
      started_redis=$!
      for _ in $(seq 50); do redis_answers "$VQ_REDIS__URL" && break; sleep 0.1; done
      redis_answers "$VQ_REDIS__URL" || { say "redis-server did not start: see target/dev-redis/redis.log"; exit 1; }
      say "started a private redis-server on 127.0.0.1:$port (pid $started_redis; stopped on exit)"
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
if [ -x "target/$profile/vq" ]; then
  say "building vq ($profile): only what changed since the last build"
else
  say "building vq ($profile) for the first time: cargo compiles ~200 crates, which takes about 4 minutes on 2 cores; later runs take seconds"
fi
if [ "$profile" = "release" ]; then cargo build --release; else cargo build; fi
vq="target/$profile/vq"

if (exec 3<>"/dev/tcp/${listen%:*}/${listen##*:}") 2>/dev/null; then
  say "something already listens on $listen: stop it, or choose another address with VQ_LISTEN=127.0.0.1:PORT"
  exit 1
fi
"$vq" serve --flag-on "$@" &
vq_pid=$!
# The curl lines only once vq answers: a busy port or a bad setting ends vq serve first, with
# its own error above.
until curl -fs -o /dev/null "http://$listen/healthz" 2>/dev/null; do
  if ! kill -0 "$vq_pid" 2>/dev/null; then
    wait "$vq_pid" || code=$?
    vq_pid=""
    say "vq serve did not start (exit ${code:-0}): see its error above"
    exit "${code:-1}"
  fi
  sleep 0.1
done

cat >&2 <<EOT
==> vq serve on http://$listen with the queue on. Try:
  curl -s -X POST -H 'X-User-Id: 1' http://$listen/virtual-queues/limited-drop/42/entries
  curl -s -H 'X-User-Id: 1' http://$listen/virtual-queues/limited-drop/42/entries/me
  curl -s http://$listen/virtual-queues/limited-drop/42/stats
  curl -s -X DELETE -H 'X-User-Id: 1' http://$listen/virtual-queues/limited-drop/42/entries/me
==> The first answer is WAITING; poll again after the next tick (2 s) to be ADMITTED.
==> Ctrl-C stops it.
EOT
wait "$vq_pid"
