#!/usr/bin/env bash
# The deploy/compose.yml topology from local processes on loopback, for machines without a
# container engine: redis-server (maxmemory 512mb, noeviction, AOF on), three `vq serve` on
# their own ports, a stub purchase backend, and a real nginx (Debian package) load-balancing
# to them with deploy/nginx/vq.conf, plus deploy/nginx/auth-request.conf on a second port.
#
#   scripts/topology.sh up      start everything, print VQ_URL=… lines, return once all answer
#   scripts/topology.sh status  what runs (from the PID files)
#   scripts/topology.sh down    stop exactly what `up` started (PID files in the state dir)
#
# Environment: TOPOLOGY_DIR (state dir, default target/topology), TOPOLOGY_VQ (default: the
# release build, built with scripts/build-release.sh when missing), VQ_TOKEN_SECRET (else a
# random one is written to the state dir, mode 600), PURCHASE_BACKEND (an http:// URL; else
# the stub backend), VQ_TARGETS__DECLARED (default: limited-drop:1 and limited-drop:42, the
# targets scripts/topology-check.sh loads), and any VQ_* setting for the three replicas (e.g.
# VQ_QUEUE__TICK_MS; with VQ_REDIS__CLUSTER_NODES they use that cluster, no redis-server is
# started, and the printed lines name the cluster's nodes instead of a VQ_REDIS__URL).
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
repo=$(pwd)
state="${TOPOLOGY_DIR:-$repo/target/topology}"

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_for() { # what command...
  local what=$1; shift
  wait_until 10 "$@" || die "$what does not answer (logs in $state)"
}

# Starts "$@" in the background, detached from this shell's output, and records its PID.
start() { # name command...
  local name=$1; shift
  "$@" </dev/null >"$state/$name.log" 2>&1 &
  echo $! >"$state/$name.pid"
}

up() {
  for f in "$state"/*.pid; do
    [ -e "$f" ] || continue
    alive "$f" && die "already up ($f is running): scripts/topology.sh down first"
  done
  install_missing redis-server /usr/sbin/nginx=nginx curl python3
  local nginx_bin; nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
  rm -rf "$state"; mkdir -p "$state/redis" "$state/nginx/logs" "$state/nginx/tmp"

  local vq="${TOPOLOGY_VQ:-}"
  if [ -z "$vq" ]; then
    vq="$repo/target/dist/vq"
    [ -x "$vq" ] || scripts/build-release.sh >&2
  fi
  [ -x "$vq" ] || die "no vq binary at $vq"

  if [ -z "${VQ_TOKEN_SECRET:-}" ] && [ -z "${VQ_TOKEN_SECRET_FILE:-}" ]; then
    (umask 077; head -c 32 /dev/urandom | base64 >"$state/secret")
    export VQ_TOKEN_SECRET_FILE="$state/secret"
    say "generated a token secret in $state/secret"
  fi

  local rport nport aport bport
  rport=$(free_port); nport=$(free_port); aport=$(free_port); bport=$(free_port)
  local vports=("$(free_port)" "$(free_port)" "$(free_port)")

  # With VQ_REDIS__CLUSTER_NODES set the replicas use that cluster (and never redis.url): no
  # redis-server of our own then.
  local redis_env="VQ_REDIS__URL=redis://127.0.0.1:$rport"
  if [ -n "${VQ_REDIS__CLUSTER_NODES:-}" ]; then
    redis_env="VQ_REDIS__CLUSTER_NODES=$VQ_REDIS__CLUSTER_NODES"
    say "Redis Cluster mode: the replicas use $VQ_REDIS__CLUSTER_NODES"
  else
    start redis redis-server --port "$rport" --bind 127.0.0.1 --dir "$state/redis" \
      --maxmemory 512mb --maxmemory-policy noeviction --appendonly yes --appendfsync everysec --save ""
    wait_for "redis-server" redis-cli -p "$rport" ping
  fi

  # A stand-in for the purchase API: answers 200 with what it got.
  cat >"$state/backend.py" <<'EOF'
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def handle_one(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.dumps({"backend": "stub", "method": self.command, "path": self.path,
                           "body": self.rfile.read(n).decode(errors="replace")}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    do_GET = do_POST = do_PUT = do_DELETE = handle_one
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
EOF
  start backend python3 "$state/backend.py" "$bport"
  local backend="${PURCHASE_BACKEND:-http://127.0.0.1:$bport}"

  # A queue answers only for declared targets.
  export VQ_TARGETS__DECLARED="${VQ_TARGETS__DECLARED:-[\"limited-drop:1\",\"limited-drop:42\"]}"
  local i
  for i in 0 1 2; do
    start "vq$((i + 1))" env VQ_LISTEN="127.0.0.1:${vports[$i]}" VQ_INSTANCE_ID="vq$((i + 1))" \
      "$redis_env" VQ_GATE__UPSTREAM="$backend" RUST_LOG="${RUST_LOG:-info}" \
      "$vq" serve
  done

  # deploy/nginx/vq.conf as compose runs it, with the replicas' loopback ports. There is no
  # login here: the AUTH LAYER of both files takes the client's X-User-Id as authenticated.
  # shellcheck disable=SC2016 # nginx variables, for sed
  local trust_client='s/set $vq_user_id "";/set $vq_user_id $http_x_user_id;/'
  sed -e "s/vq1:8080/127.0.0.1:${vports[0]}/; s/vq2:8080/127.0.0.1:${vports[1]}/; s/vq3:8080/127.0.0.1:${vports[2]}/" \
      -e "s/listen 80;/listen 127.0.0.1:$nport;/" -e "$trust_client" deploy/nginx/vq.conf >"$state/nginx/vq.conf"
  local servers=""
  for i in 0 1 2; do servers+="server 127.0.0.1:${vports[$i]}; "; done
  sed -e "s/@LISTEN@/$aport/; s/@VQ@/$servers/; s#@BACKEND@#${backend#http://}#g" \
      -e "$trust_client" deploy/nginx/auth-request.conf >"$state/nginx/auth-request.conf"
  cat >"$state/nginx/nginx.conf" <<EOF
daemon off;
worker_processes 2;
pid $state/nginx/nginx.pid;
error_log $state/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $state/nginx/tmp/body;
    proxy_temp_path $state/nginx/tmp/proxy;
    fastcgi_temp_path $state/nginx/tmp/fastcgi;
    uwsgi_temp_path $state/nginx/tmp/uwsgi;
    scgi_temp_path $state/nginx/tmp/scgi;
    include $state/nginx/vq.conf;
    include $state/nginx/auth-request.conf;
}
EOF
  "$nginx_bin" -t -p "$state/nginx" -c "$state/nginx/nginx.conf" >"$state/nginx-test.log" 2>&1 \
    || die "nginx refuses the config: $(cat "$state/nginx-test.log")"
  start nginx "$nginx_bin" -p "$state/nginx" -c "$state/nginx/nginx.conf"

  for i in 0 1 2; do wait_for "vq$((i + 1))" curl -sf "http://127.0.0.1:${vports[$i]}/healthz"; done
  wait_for "the stub backend" curl -sf "http://127.0.0.1:$bport/"
  wait_for "nginx" curl -sf "http://127.0.0.1:$nport/healthz"
  wait_for "nginx auth_request" curl -sf "http://127.0.0.1:$aport/"

  {
    echo "VQ_URL=http://127.0.0.1:$nport"
    echo "$redis_env"
    echo "TOPOLOGY_REPLICAS=http://127.0.0.1:${vports[0]},http://127.0.0.1:${vports[1]},http://127.0.0.1:${vports[2]}"
    echo "TOPOLOGY_AUTH_REQUEST_URL=http://127.0.0.1:$aport"
    echo "TOPOLOGY_BACKEND_URL=$backend"
    echo "TOPOLOGY_DIR=$state"
  } | tee "$state/env"
}

status() {
  local f any=0
  for f in "$state"/*.pid; do
    [ -e "$f" ] || continue
    any=1
    if alive "$f"; then echo "$(basename "$f" .pid) running (pid $(cat "$f"))"; else echo "$(basename "$f" .pid) stopped"; fi
  done
  [ "$any" = 1 ] || echo "nothing started from $state"
}

down() {
  # nginx first (no new requests), then the replicas, the backend, Redis last.
  stop_pid_files "$state"/{nginx,vq1,vq2,vq3,backend,redis}.pid
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: scripts/topology.sh up|status|down" >&2; exit 2 ;;
esac
