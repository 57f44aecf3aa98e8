#!/usr/bin/env python3
"""How long the machine itself stops a running process: what no Redis call can beat.

Usage: scripts/measure-stalls.py [SECONDS=60] [CORE=1]

A busy loop pinned to CORE at a real-time priority (SCHED_FIFO 10, as `bench.sh scale` gives
Redis with RT=1) reads the monotonic clock as fast as it can; a gap between two reads is time
the loop did not run: the hypervisor, an interrupt, a kernel thread. It runs in bursts of
400 ms with 100 ms of sleep between them, so it stays under the kernel's real-time share
(`sched_rt_runtime_us`, 95 % of each second) and is never throttled, and no other process
starves. Prints the gaps over 0.5, 1 and 2 ms, the largest with when it came, the time
measured, and the steal over the run (/proc/stat). Needs root for the priority (without it,
says so and runs at the normal one).
"""

import os
import sys
import time

BURST_S = 0.4
REST_S = 0.1


def steal_ticks():
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]), sum(int(x) for x in fields[1:9])


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    core = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    os.sched_setaffinity(0, {core})
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        prio = "SCHED_FIFO 10"
    except PermissionError:
        prio = "normal priority (not root)"
    clock = time.monotonic_ns
    edges = (500_000, 1_000_000, 2_000_000)
    over = [0, 0, 0]
    largest, largest_at = 0, 0.0
    busy_ns = 0
    s0, t0 = steal_ticks()
    start = clock()
    end = start + int(seconds * 1e9)
    while clock() < end:
        burst_end = min(end, clock() + int(BURST_S * 1e9))
        last = clock()
        first = last
        while last < burst_end:
            now = clock()
            gap = now - last
            if gap > edges[0]:
                for i, edge in enumerate(edges):
                    if gap > edge:
                        over[i] += 1
                if gap > largest:
                    largest, largest_at = gap, (now - start) / 1e9
            last = now
        busy_ns += last - first
        time.sleep(REST_S)
    s1, t1 = steal_ticks()
    steal = 100.0 * (s1 - s0) / max(1, t1 - t0)
    print(
        f"core {core} at {prio}, {busy_ns / 1e9:.1f} s of busy loop over {seconds:.0f} s: "
        f"gaps over 0.5 ms {over[0]}, over 1 ms {over[1]}, over 2 ms {over[2]}; "
        f"largest {largest / 1e6:.2f} ms at {largest_at:.1f} s; steal {steal:.1f} %"
    )


if __name__ == "__main__":
    main()
