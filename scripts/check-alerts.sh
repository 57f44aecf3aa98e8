#!/usr/bin/env bash
# Checks deploy/prometheus/alerts.yml: promtool check rules, promtool test rules (the alerts
# fire when they should), then, unless --no-scrape, a real Prometheus scrapes a running
# `vq serve` once and must see its virtual_queue_* series. Loopback only, time-bounded,
# stops only the processes it started. Installs promtool (Debian package prometheus) when
# missing. ALERTS_VQ=path runs that vq binary instead of building one.
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

install_missing promtool=prometheus

promtool check rules deploy/prometheus/alerts.yml
(cd deploy/prometheus && promtool test rules alerts_test.yml)

[[ "${1:-}" == "--no-scrape" ]] && exit 0

use_work_dir
work=$WORK
vq_port=$(free_port); prom_port=$(free_port)
start_redis
# ALERTS_VQ: a vq binary already built (scripts/test.sh passes the suite's).
vq_bin=${ALERTS_VQ:-target/debug/vq}
[ -n "${ALERTS_VQ:-}" ] || cargo build --quiet --bin vq
VQ_TOKEN_SECRET=check-alerts-secret-0123456789abcdef VQ_REDIS__URL="$REDIS_URL" VQ_TARGETS__DECLARED='["limited-drop:42"]' \
  spawn vq "$vq_bin" serve --no-pump --flag-on --listen "127.0.0.1:$vq_port"
wait_http "127.0.0.1:$vq_port/healthz" 10 "$SPAWNED" || die "vq serve did not start: $(tail -5 "$work/vq.log")"
for u in 1 2 3; do
  curl -fs -X POST -H "X-User-Id: $u" "127.0.0.1:$vq_port/virtual-queues/limited-drop/42/entries" >/dev/null
done

cat >"$work/prometheus.yml" <<YML
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: ["$PWD/deploy/prometheus/alerts.yml"]
scrape_configs:
  - job_name: vq
    static_configs: [{targets: ["127.0.0.1:$vq_port"]}]
YML
spawn prom prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port"

query='virtual_queue_length{target="LIMITED_DROP:42"}'
deadline=$((SECONDS + 30))
while ((SECONDS < deadline)); do
  answer=$(curl -fsG "127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$query" || true)
  if grep -q '"value":\[[^]]*,"3"\]' <<<"$answer"; then
    echo "prometheus scraped vq serve: $query = 3"
    rules=$(curl -fs "127.0.0.1:$prom_port/api/v1/rules" | grep -o '"health":"[a-z]*"' | sort | uniq -c)
    echo "rule health: $rules"
    grep -q '"health":"err"' <<<"$(curl -fs "127.0.0.1:$prom_port/api/v1/rules")" && { echo "a rule fails to evaluate" >&2; exit 1; }
    exit 0
  fi
  sleep 1
done
echo "prometheus did not see $query within 30 s; last answer: ${answer:-none}" >&2
tail -5 "$work/prom.log" >&2
exit 1
