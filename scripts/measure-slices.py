#!/usr/bin/env python3
"""What one call of each sliced script costs Redis with N users waiting in one target.

Usage: measure-slices.py PORT [N] [CALLS] -- against a scratch redis-server on 127.0.0.1:PORT,
which it FLUSHes (scripts/bench.sh slices starts one). Fills limited-drop:1 with N users
(the waiting ZSET and their heartbeats in the beats string, prelude.lua's beat_tag), then runs
CALLS calls of each script as vq sends it (FCALL of one library of functions with
lua/prelude.lua at its head, as src/store/redis/scripts.rs builds it; with EVAL=1 in the
environment, EVALSHA of the prelude, a newline and the script, as where Redis refuses
functions) with the slice vq uses (read from the Rust sources, where the bounds live), on users
picked at random, and prints Redis' own time per call (INFO commandstats usec_per_call) and
per user.
"""
import os
import random
import re
import socket
import sys


def bound(path, name):
    """A slice bound as the Rust source declares it (`pub const NAME: T = 123;`)."""
    return int(re.search(rf"pub const {name}: \w+ = ([\d_]+);", open(path).read()).group(1).replace("_", ""))


SLICES = "src/store/redis/slices.rs"
VIEW, ADMIT, READ, SWEEP = (bound(SLICES, n) for n in ("VIEW_USERS_PER_CALL", "ADMIT_SLICE", "OPENING_READ_SLICE",
                                                       "SWEEP_SEQS"))
EVICT, CHUNK = bound("src/pump.rs", "EVICT_SLICE"), bound("src/pump.rs", "OPENING_CHUNK")

port = int(sys.argv[1])
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
calls = int(sys.argv[3]) if len(sys.argv) > 3 else 40
sock = socket.create_connection(("127.0.0.1", port))
replies = sock.makefile("rb")


def encode(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def read():
    line = replies.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b"+":
        return rest.decode()
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        return None if size < 0 else replies.read(size + 2)[:-2].decode()
    size = int(rest)
    return None if size < 0 else [read() for _ in range(size)]


def pipe(*commands):
    sock.sendall(b"".join(encode(*c) for c in commands))
    return [read() for _ in commands]


def cmd(*args):
    return pipe(args)[0]


P = "queue:{LIMITED_DROP:1}:"
PRELUDE = open("lua/prelude.lua").read()


EVAL = os.environ.get("EVAL", "0") == "1"
SCRIPTS = ("view.lua", "evict.lua", "admit.lua", "sale_place.lua")
CALL_MARK = "\n-- vq:call"


def library():
    """The scripts as functions of one library, the prelude once at its head; a script's part
    before its CALL_MARK line runs once, around its function (src/store/redis/scripts.rs)."""
    text = "#!lua name=slices\nlocal KEYS, ARGV\n" + PRELUDE + "\n"
    for name in SCRIPTS:
        body = open("lua/" + name).read()
        once, at = None, body.find(CALL_MARK)
        if at >= 0:
            once, body = body[:at], body[at + 1:]
        if once is not None:
            text += "do\n" + once + "\n"
        text += ("redis.register_function{function_name = 'slices_%s', callback = function(keys, argv)\n"
                 "KEYS, ARGV = keys, argv\n%s\nend}\n" % (name[:-4], body))
        if once is not None:
            text += "end\n"
    return text


def script(name):
    """How the script is called (FCALL of its function, or EVALSHA of its sha), and its target
    KEYS in the header's order."""
    if EVAL:
        call = ("EVALSHA", cmd("SCRIPT", "LOAD", PRELUDE + "\n" + open("lua/" + name).read()))
    else:
        call = ("FCALL", "slices_" + name[:-4])
    keys = [P + l.split("queue:{T}:")[1].split()[0] for l in open("lua/" + name)
            if l.startswith("-- KEYS[") and "queue:{T}:" in l]
    return call, keys


def stat(command):
    """usec_per_call of `command` since the last CONFIG RESETSTAT."""
    for line in cmd("INFO", "commandstats").split("\r\n"):
        if line.startswith(f"cmdstat_{command}:"):
            fields = dict(kv.split("=") for kv in line.split(":", 1)[1].split(","))
            return float(fields["usec_per_call"])
    return 0.0


def beats(users, ms):
    """Heartbeats of users without a seq (the pre-queue's ZSET)."""
    for i in range(0, len(users), 1000):
        cmd("ZADD", P + "heartbeat", *[x for u in users[i:i + 1000] for x in (ms, u)])


def beat_tag(ms):
    """prelude.lua's beat_tag, asked of the prelude itself."""
    return cmd("EVAL", PRELUDE + "\nreturn beat_tag(tonumber(ARGV[1]))", 0, ms)


def set_raw(key, value):
    sock.sendall(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n" % (len(key), key.encode(), len(value)) + value + b"\r\n")
    read()


cmd("FLUSHALL")
if not EVAL:
    cmd("FUNCTION", "LOAD", "REPLACE", library())
STAT = "evalsha" if EVAL else "fcall"
now = int(cmd("TIME")[0]) * 1000
for first in range(1, n + 1, 1000):
    ids = range(first, min(first + 1000, n + 1))
    cmd("ZADD", P + "waiting", *[x for u in ids for x in (u, u)])
# Every user's heartbeat now: a u32 per seq from byte 4 (seq 0 is never given).
set_raw(P + "beats", bytes(4) + beat_tag(now).to_bytes(4, "big") * n)
cmd("SET", P + "seq", n)
rows = []

# The heartbeat flush: VIEW_USERS_PER_CALL polled users a call.
per = VIEW
call, keys = script("view.lua")
cmd("CONFIG", "RESETSTAT")
for _ in range(calls):
    cmd(*call, len(keys), *keys, 0, *random.sample(range(1, n + 1), per))
rows.append(("view.lua", per, stat(STAT)))

# Eviction: a sweep reads SWEEP_SEQS seqs a call and evicts the stale among them (at most
# EVICT_SLICE): first a sweep that finds nobody stale, then one through a queue where
# calls * EVICT_SLICE users, at random, stopped polling an hour ago.
call, keys = script("evict.lua")
keys = keys[:7]
cmd("CONFIG", "RESETSTAT")
made = 0
while made < calls:
    made += 1
    if cmd(*call, len(keys), *keys, 60000, EVICT, 3600, 0, SWEEP)[1] != 1:
        break
rows.append(("evict.lua, nobody stale", SWEEP, stat(STAT)))
old = beat_tag(now - 3_600_000)
stale = random.sample(range(1, n + 1), calls * EVICT)
for i in range(0, len(stale), 1000):
    cmd("BITFIELD", P + "beats", *[x for s in stale[i:i + 1000] for x in ("SET", "u32", f"#{s}", old)])
cmd("DEL", P + "sweep")
cmd("CONFIG", "RESETSTAT")
made, evicted = 0, 0
while made < calls:
    r = cmd(*call, len(keys), *keys, 60000, EVICT, 3600, 0, SWEEP)
    made, evicted = made + 1, evicted + r[0]
    if r[1] != 1:
        break
rows.append((f"evict.lua, {evicted / made:.0f} stale users a call", SWEEP, stat(STAT)))

# Admission: one tick's batch in ADMIT_SLICE slices, each call continuing the tick.
per = ADMIT
call, keys = script("admit.lua")
cmd("CONFIG", "RESETSTAT")
cont, made = "", 0
while made < calls:
    r = cmd(*call, len(keys), *keys, calls * per, 600000, 3600, "m", 100, 0, 0, 0, 0,
            3600, "60:1", 60, 100, 0, per, cont)
    made += 1
    if r[7] != 1:
        break
    cont = r[8]
rows.append(("admit.lua", per, stat(STAT)))

# The opening: OPENING_CHUNK pre-queued users (with heartbeats) placed into the queue a call.
per = CHUNK
call, keys = script("sale_place.lua")
cmd("HSET", P + "sale", "frozen", calls * per, "base", n, "seed", "00", "commitment", "00")
placed = [f"p{i}" for i in range(calls * per)]
beats(placed, now)
cmd("CONFIG", "RESETSTAT")
for c in range(calls):
    args = [x for i in range(c * per, (c + 1) * per) for x in (n + 1 + i, placed[i])]
    cmd(*call, len(keys), *keys, 0, now, 3600, 100, 3600, 100, *args)
rows.append(("sale_place.lua", per, stat(STAT)))

# The opening's read of the frozen set: OPENING_READ_SLICE members a ZRANGE.
per = READ
cmd("CONFIG", "RESETSTAT")
for c in range(calls):
    cmd("ZRANGE", P + "waiting", c * per, (c + 1) * per - 1)
rows.append(("ZRANGE (the opening's read)", per, stat("zrange")))

print(f"{n} users waiting in one target, {calls} calls each, users at random")
print("| call | users (or seqs read) a call | µs a call | µs a user |")
print("| --- | --- | --- | --- |")
for name, per, us in rows:
    print(f"| {name} | {per} | {us:.0f} | {us / per:.2f} |")
