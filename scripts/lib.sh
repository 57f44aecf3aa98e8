# shellcheck shell=bash
# What the scripts in scripts/ share; each one starts with
#
#   . "$(dirname "$0")/lib.sh"
#
# which sets `-euo pipefail`, moves to the repository root and installs the exit trap. Then:
#
#   install_missing CMD[=PKG] ...   installs the Debian packages of the commands that are
#                                   missing (PKG defaults to CMD; CMD may be a path, of a
#                                   command or of any file the package installs), as root or
#                                   through sudo; fails when apt-get does
#   build_release [CARGO-ARGS]      cargo build --release
#   free_port                       prints a free loopback TCP port
#   use_work_dir                    sets WORK, a temp dir of this run: removed when the script
#                                   ends well or by Ctrl-C / SIGTERM, kept (and named) after a
#                                   failure or with KEEP_WORK=1
#   spawn NAME CMD...               starts CMD in the background, stdin from /dev/null, output
#                                   to $WORK/NAME.log (never a pipe: a background redis-server
#                                   holding a pipe makes `script | tail` hang), or to this
#                                   script's own output with NAME `-`; sets SPAWNED and stops it
#                                   on exit
#   start_redis [REDIS-ARGS]        a private redis-server on 127.0.0.1 and a free port, its
#                                   dir under $WORK, ready once `redis-cli ping` answers; sets
#                                   REDIS_PORT, REDIS_URL, REDIS_PID
#   wait_until SECS CMD...          runs CMD every 0.1 s until it succeeds; fails after SECS
#   wait_http URL SECS [PID]        wait_until for an HTTP 2xx, failing early when PID ends
#   stop_pid PID                    SIGTERM, then SIGKILL after 10 s; waits for it (and no
#                                   longer stops it on exit)
#   await_stopped PID...            waits up to 10 s for processes already sent SIGTERM (not
#                                   children of this script) to end, SIGKILL to those left;
#                                   says how many stopped
#   stop_pid_files FILE...          for each pid file, in order: SIGTERM to its process (and
#                                   its children, e.g. nginx's workers) if alive, then removes
#                                   the file; await_stopped for all of them
#
# Check the scripts with `shellcheck -x scripts/*.sh` (-x follows this file).
#
# On exit (normal, error, Ctrl-C or SIGTERM) every process started with `spawn` is stopped by
# its PID, the last started first, then the script's own `on_exit` runs if it defines one;
# nothing is ever stopped by name.

set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf '==> %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

install_missing() {
  local want pkgs=() sudo=""
  for want in "$@"; do
    local cmd="${want%%=*}" pkg="${want#*=}"
    command -v "$cmd" >/dev/null 2>&1 || [ -e "$cmd" ] || pkgs+=("$pkg")
  done
  [ ${#pkgs[@]} -gt 0 ] || return 0
  say "installing: ${pkgs[*]}"
  [ "$(id -u)" = 0 ] || sudo="sudo"
  # RUNLEVEL=1 keeps the packages from starting their system-wide services (a redis-server on
  # 6379, an nginx on 80): the scripts start their own.
  $sudo apt-get update -qq &&
    $sudo env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq "${pkgs[@]}" >/dev/null
}

build_release() { cargo build --release "$@"; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

WORK=""
use_work_dir() {
  [ -n "$WORK" ] || WORK=$(mktemp -d "${TMPDIR:-/tmp}/vq-$(basename "$0" .sh).XXXXXX")
}

STARTED=()
SPAWNED=""
spawn() { # name command...
  local name=$1; shift
  if [ "$name" = - ]; then
    "$@" </dev/null &
  else
    use_work_dir
    "$@" </dev/null >"$WORK/$name.log" 2>&1 &
  fi
  SPAWNED=$!
  STARTED+=("$SPAWNED")
}

wait_until() { # secs command...
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

wait_http() { # url secs [pid]
  local url=$1 deadline=$((SECONDS + $2)) pid=${3:-}
  until curl -fs -o /dev/null "$url" 2>/dev/null; do
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then return 1; fi
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

# shellcheck disable=SC2034 # read by the scripts
REDIS_PORT="" REDIS_URL="" REDIS_PID=""
# shellcheck disable=SC2120 # the arguments are optional
start_redis() { # redis-server args (later ones override the defaults)...
  use_work_dir
  REDIS_PORT=$(free_port)
  # shellcheck disable=SC2034 # read by the scripts
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
  mkdir -p "$WORK/redis-$REDIS_PORT"
  spawn "redis-$REDIS_PORT" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" \
    --appendonly no --dir "$WORK/redis-$REDIS_PORT" "$@"
  # shellcheck disable=SC2034 # read by the scripts
  REDIS_PID=$SPAWNED
  wait_until 10 redis-cli -p "$REDIS_PORT" ping ||
    die "redis-server on 127.0.0.1:$REDIS_PORT did not answer within 10 s: $(tail -3 "$WORK/redis-$REDIS_PORT.log")"
}

stop_pid() { # pid
  local i
  for i in "${!STARTED[@]}"; do [ "${STARTED[i]}" != "$1" ] || unset 'STARTED[i]'; done
  STARTED=("${STARTED[@]}")
  kill -TERM "$1" 2>/dev/null || return 0
  local deadline=$((SECONDS + 10))
  while kill -0 "$1" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.05; done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

await_stopped() {
  local pid running=()
  for _ in $(seq 100); do
    running=()
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && running+=("$pid"); done
    [ ${#running[@]} -eq 0 ] && { say "stopped $# processes"; return 0; }
    sleep 0.1
  done
  say "still running after 10 s, killing: ${running[*]}"
  kill -KILL "${running[@]}" 2>/dev/null || true
}

stop_pid_files() {
  local f pid c pids=()
  for f in "$@"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
      # Children (nginx's workers) are remembered to check that they are gone too.
      for c in $(pgrep -P "$pid" 2>/dev/null || true); do pids+=("$c"); done
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
    rm -f "$f"
  done
  await_stopped "${pids[@]}"
}

stop_started() {
  local code=$?
  trap - EXIT
  # A child signalled between its fork and its exec still runs this trap: only the script
  # itself stops what it started.
  [ "$BASHPID" = "$$" ] || exit "$code"
  while [ ${#STARTED[@]} -gt 0 ]; do stop_pid "${STARTED[-1]}"; done
  if declare -F on_exit >/dev/null; then on_exit || true; fi
  if [ -n "$WORK" ]; then
    rmdir "$WORK" 2>/dev/null && WORK=""
  fi
  if [ -n "$WORK" ]; then
    case "$code:${KEEP_WORK:-}" in
      0: | 130: | 143:) rm -rf "$WORK" ;;
      *) say "logs: $WORK" ;;
    esac
  fi
  exit "$code"
}
trap stop_started EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
