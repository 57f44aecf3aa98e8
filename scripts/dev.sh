#!/usr/bin/env bash
# The main job on one machine: vq serve on localhost with everything it needs.
#
# - uses the Redis at $VQ_REDIS__URL, or one on 127.0.0.1:6379, or installs (Debian package)
#   and starts a private redis-server; with no way to get one, falls back to the embedded
#   single-instance store (VQ_STORE=memory forces that);
# - generates a development secret when VQ_TOKEN_SECRET is not set (and says so);
# - builds vq (release; DEV_PROFILE=debug for a debug build), turns the queue on, prints curl
#   lines to try, and serves until Ctrl-C. A redis-server it started is stopped on exit.
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

if [ "${VQ_STORE:-redis}" = "redis" ]; then
  url="${VQ_REDIS__URL:-redis://127.0.0.1:6379}"
  if redis_answers "$url"; then
    say "using the Redis at $url"
  elif [ -n "${VQ_REDIS__URL:-}" ]; then
    say "VQ_REDIS__URL=$url does not answer; start it or unset VQ_REDIS__URL"; exit 1
  else
    if ! command -v redis-server >/dev/null 2>&1; then
      say "redis-server is missing: installing the Debian package"
      sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
      { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null; } || true
    fi
    if command -v redis-server >/dev/null 2>&1; then
      mkdir -p target/dev-redis
      redis-server --port 6379 --bind 127.0.0.1 --save "" --appendonly no \
        --maxmemory 512mb --maxmemory-policy noeviction --dir target/dev-redis \
        >target/dev-redis/redis.log 2>&1 &
      started_redis=$!
      for _ in $(seq 50); do redis_answers "$url" && break; sleep 0.1; done
      redis_answers "$url" || { say "redis-server did not start: see target/dev-redis/redis.log"; exit 1; }
      say "started redis-server on 127.0.0.1:6379 (pid $started_redis)"
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
if [ "$profile" = "release" ]; then cargo build --release --quiet; else cargo build --quiet; fi
vq="target/$profile/vq"

cat >&2 <<EOT
==> vq serve on http://$listen with the queue on. Try:
  curl -s -X POST -H 'X-User-Id: 1' http://$listen/virtual-queues/limited-drop/42/entries
  curl -s -H 'X-User-Id: 1' http://$listen/virtual-queues/limited-drop/42/entries/me
  curl -s http://$listen/virtual-queues/limited-drop/42/stats
  curl -s -X DELETE -H 'X-User-Id: 1' http://$listen/virtual-queues/limited-drop/42/entries/me
==> Ctrl-C stops it.
EOT
"$vq" serve --flag-on "$@" &
vq_pid=$!
wait "$vq_pid"
