#!/usr/bin/env python3
"""What a token issued and a purchase claimed cost, with a replica: two vq binaries side by side.

Each run starts a fresh redis-server primary, a replica of it (`--replicaof`), a purchase API
stand-in answering 200, and one `vq serve` of the binary under test (tick 200 ms, batch 1000,
gate pacing off, so what is timed is the Redis work, not a wait for a tick). USERS users enter;
once the pump has admitted them, each is timed for its first poll answered ADMITTED (the token
issued: status.lua, and with the replicas' confirmation, WAIT) and for its purchase
through the gate (token_claim.lua, and WAIT, then the forward). Runs alternate A B B A ... for
PAIRS pairs; the table gives each run's medians and the median of each binary's medians, with
the steal time (/proc/stat) over the whole measurement.

    scripts/measure-durable-writes.py BEFORE_BINARY AFTER_BINARY [PAIRS=3] [USERS=300]

Everything on 127.0.0.1; every process started here is stopped by its PID.
"""
import http.client
import http.server
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

SECRET = "bench-secret-0123456789abcdef0123456789"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, secs=10):
    end = time.time() + secs
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"nothing listens on {port}")


def redis_cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True, check=True).stdout.strip()


class Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        n = int(self.headers.get("content-length") or 0)
        self.rfile.read(n)
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def steal():
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    return cpu[7], sum(cpu)


def one_run(binary, users, procs):
    tmp = tempfile.mkdtemp()
    p_port, r_port, vq_port = free_port(), free_port(), free_port()
    base = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0"]
    log = open(os.path.join(tmp, "log"), "w")
    primary = subprocess.Popen(["redis-server", "--port", str(p_port), *base], cwd=tmp, stdout=log, stderr=log)
    procs.append(primary)
    wait_port(p_port)
    replica = subprocess.Popen(
        ["redis-server", "--port", str(r_port), *base, "--replicaof", "127.0.0.1", str(p_port)], cwd=tmp, stdout=log, stderr=log
    )
    procs.append(replica)
    wait_port(r_port)
    while "master_link_status:up" not in redis_cli(r_port, "INFO", "replication"):
        time.sleep(0.02)
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    redis_cli(p_port, "HSET", "virtual-queue:flag", "enabled", "1", "percent", "100", "version", "1")
    env = dict(
        os.environ,
        VQ_REDIS__URL=f"redis://127.0.0.1:{p_port}",
        VQ_TOKEN_SECRET=SECRET,
        VQ_TARGETS__RANGES='["limited-drop:1-100"]',
        VQ_QUEUE__TICK_MS="200",
        VQ_QUEUE__BATCH_SIZE="1000",
        VQ_GATE__UPSTREAM=f"http://127.0.0.1:{upstream.server_address[1]}",
        VQ_GATE__PACE="false",
        RUST_LOG="warn",
    )
    vq = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{vq_port}"], env=env, stdout=log, stderr=log)
    procs.append(vq)
    wait_port(vq_port)
    conn = http.client.HTTPConnection("127.0.0.1", vq_port, timeout=10)

    def req(method, path, headers):
        t = time.perf_counter()
        conn.request(method, path, headers=headers)
        r = conn.getresponse()
        body = r.read()
        return r.status, body, (time.perf_counter() - t) * 1e6

    target = "limited-drop/7"
    for u in range(1, users + 1):
        status, body, _ = req("POST", f"/virtual-queues/{target}/entries", {"X-User-Id": str(u)})
        assert status == 200, (status, body)
    time.sleep(0.6)  # a few ticks: the pump admits every user (batch 1000)
    polls, buys, tokens = [], [], {}
    for u in range(1, users + 1):
        status, body, us = req("GET", f"/virtual-queues/{target}/entries/me", {"X-User-Id": str(u)})
        doc = json.loads(body)
        assert status == 200 and doc.get("status") == "ADMITTED", (status, body)
        polls.append(us)
        tokens[u] = doc["entryToken"]
    for u in range(1, users + 1):
        status, body, us = req("POST", "/limited-drops/7/orders", {"X-User-Id": str(u), "X-Entry-Token": tokens[u]})
        assert status == 200, (status, body)
        buys.append(us)
    conn.close()
    stats = redis_cli(p_port, "INFO", "commandstats")
    waits = next((l.split("calls=")[1].split(",")[0] for l in stats.splitlines() if l.startswith("cmdstat_wait:")), "0")
    upstream.shutdown()
    for p in (vq, replica, primary):
        p.terminate()
        p.wait()
        procs.remove(p)
    return statistics.median(polls), statistics.median(buys), int(waits)


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    a, b = sys.argv[1], sys.argv[2]
    pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    users = int(sys.argv[4]) if len(sys.argv) > 4 else 300
    procs = []
    order = []
    for i in range(pairs):
        order += [("before", a), ("after", b)] if i % 2 == 0 else [("after", b), ("before", a)]
    s0, t0 = steal()
    results = {"before": [], "after": []}
    try:
        for name, binary in order:
            poll, buy, waits = one_run(binary, users, procs)
            results[name].append((poll, buy))
            print(f"{name:6} issue poll P50 {poll:8.0f} µs   purchase P50 {buy:8.0f} µs   WAIT calls {waits}", flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.wait()
    s1, t1 = steal()
    print(f"steal {100.0 * (s1 - s0) / max(1, t1 - t0):.1f} % of CPU time; load {open('/proc/loadavg').read().split()[:3]}")
    for name in ("before", "after"):
        polls = [p for p, _ in results[name]]
        buys = [b for _, b in results[name]]
        print(f"{name:6} median of medians: issue poll {statistics.median(polls):8.0f} µs   purchase {statistics.median(buys):8.0f} µs")


if __name__ == "__main__":
    main()
