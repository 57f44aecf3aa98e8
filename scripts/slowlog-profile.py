#!/usr/bin/env python3
"""Breaks a Redis server's SLOWLOG down by script: what each of vq's functions (FCALL, its
`vq_<hash>_` prefix stripped) and each plain command cost, per buyer. Run against a
redis-server started with `--slowlog-log-slower-than 0 --slowlog-max-len <enough>` (every
call logged; `scripts/bench.sh sale` does this with PROFILE=prefix). SLOWLOG's own accounting
adds to every call, so the figures are shares to compare, not Redis' CPU.

    scripts/slowlog-profile.py PORT BUYERS
"""
import collections
import re
import socket
import sys


def send(sock, *args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    sock.sendall(out)


def read(f):
    line = f.readline()[:-2]
    kind, rest = line[:1], line[1:]
    if kind in (b"+", b"-"):
        return rest.decode()
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2].decode("utf-8", "replace")
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [read(f) for _ in range(n)]
    raise ValueError(f"not RESP: {line!r}")


def main():
    port, buyers = int(sys.argv[1]), int(sys.argv[2])
    sock = socket.create_connection(("127.0.0.1", port))
    f = sock.makefile("rb")
    send(sock, "SLOWLOG", "GET", "-1")
    log = read(f)
    by = collections.defaultdict(lambda: [0, 0])
    for entry in log:
        micros, args = entry[2], entry[3]
        name = args[0].lower()
        if name in ("fcall", "fcall_ro") and len(args) > 1:
            name = re.sub(r"^vq_[0-9a-f]+_", "", args[1])
        by[name][0] += 1
        by[name][1] += micros
    calls = sum(c for c, _ in by.values())
    total = sum(m for _, m in by.values())
    print(f"{len(log)} calls logged, {buyers} buyers: {calls / buyers:.2f} calls and {total / buyers:.1f} µs per buyer")
    print(f"{'call':28} {'calls/buyer':>11} {'µs/call':>8} {'µs/buyer':>9} {'share':>6}")
    for name, (c, m) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:28} {c / buyers:11.3f} {m / c:8.1f} {m / buyers:9.1f} {100 * m / total:5.1f}%")


main()
