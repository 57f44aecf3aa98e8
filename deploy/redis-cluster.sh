#!/usr/bin/env bash
# A 3-primary Redis Cluster from real redis-server processes on loopback, for trying vq's
# cluster mode on one machine (docs/deploy.md, Redis Cluster): each node with its own data
# dir, AOF on, maxmemory 512mb and noeviction as vq needs; no replicas.
#
#   deploy/redis-cluster.sh up      start the three nodes, create the cluster, wait until every
#                                   node says cluster_state:ok, print the VQ_REDIS__CLUSTER_NODES=…
#                                   line that points vq (serve, pump and every command) at it
#   deploy/redis-cluster.sh status  what runs (from the PID files) and the cluster's state
#   deploy/redis-cluster.sh down    stop exactly the processes `up` started (PID files)
#
# Environment: REDIS_CLUSTER_DIR (state dir, default target/redis-cluster), REDIS_CLUSTER_PORTS
# (three client ports, e.g. "7000 7001 7002"; default: free ones; each node's bus port is
# another free port). Then, e.g.:
#   eval "$(deploy/redis-cluster.sh up | grep ^VQ_REDIS__CLUSTER_NODES= | sed 's/^/export /')"
#   vq serve --flag-on       # or scripts/topology.sh up: three replicas on this cluster
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/../scripts/lib.sh"
state="${REDIS_CLUSTER_DIR:-$(pwd)/target/redis-cluster}"

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# An `up` that fails half-way stops the nodes it started.
on_exit() { [ -z "${starting:-}" ] || down >/dev/null 2>&1; }

up() {
  local f
  for f in "$state"/*.pid; do
    [ -e "$f" ] || continue
    alive "$f" && die "already up ($f is running): deploy/redis-cluster.sh down first"
  done
  install_missing redis-server redis-cli=redis-tools
  rm -rf "$state"; mkdir -p "$state"
  starting=1
  local ports=() port bus addrs=()
  read -r -a ports <<<"${REDIS_CLUSTER_PORTS:-$(free_port) $(free_port) $(free_port)}"
  [ ${#ports[@]} -eq 3 ] || die "REDIS_CLUSTER_PORTS needs three ports, got '${REDIS_CLUSTER_PORTS:-}'"
  for port in "${ports[@]}"; do
    bus=$(free_port)
    mkdir -p "$state/$port"
    redis-server --port "$port" --cluster-port "$bus" --bind 127.0.0.1 \
      --cluster-enabled yes --cluster-config-file nodes.conf --dir "$state/$port" \
      --appendonly yes --appendfsync everysec --save "" \
      --maxmemory 512mb --maxmemory-policy noeviction </dev/null >"$state/$port.log" 2>&1 &
    echo $! >"$state/redis-$port.pid"
    addrs+=("127.0.0.1:$port")
  done
  for port in "${ports[@]}"; do
    wait_until 10 redis-cli -p "$port" ping ||
      die "the node on 127.0.0.1:$port does not answer: $(tail -3 "$state/$port.log")"
  done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes </dev/null >"$state/create.log" 2>&1 ||
    die "redis-cli --cluster create failed: $(tail -5 "$state/create.log")"
  # Every node must agree that all slots are served before a client reads the slot map.
  for port in "${ports[@]}"; do
    wait_until 10 bash -c "redis-cli -p $port cluster info | grep -q cluster_state:ok" ||
      die "the node on 127.0.0.1:$port never said cluster_state:ok"
  done
  local nodes
  nodes=$(printf 'redis://%s,' "${addrs[@]}"); nodes=${nodes%,}
  say "a 3-primary Redis Cluster on ${addrs[*]} (state in $state); stop it with deploy/redis-cluster.sh down"
  echo "VQ_REDIS__CLUSTER_NODES=$nodes" | tee "$state/env"
  starting=""
}

status() {
  local f any=0 port
  for f in "$state"/redis-*.pid; do
    [ -e "$f" ] || continue
    any=1
    port=$(basename "$f" .pid); port=${port#redis-}
    if alive "$f"; then
      echo "node 127.0.0.1:$port running (pid $(cat "$f")), $(redis-cli -p "$port" cluster info | grep cluster_state | tr -d '\r')"
    else
      echo "node 127.0.0.1:$port stopped"
    fi
  done
  [ "$any" = 1 ] || echo "nothing started from $state"
}

down() {
  stop_pid_files "$state"/redis-*.pid
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: deploy/redis-cluster.sh up|status|down" >&2; exit 2 ;;
esac
