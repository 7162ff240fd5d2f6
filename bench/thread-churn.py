#!/usr/bin/env python3
"""Thread churn, as a thread-per-connection database makes it: starts RATE threads a second for
DURATION seconds, each renaming itself (pthread_setname_np, as MySQL names its threads) and
exiting. Every thread start, rename and exit is a proc-connector event the kernel sends to every
listener; a classifier that works per process should not pay for them.

Usage: thread-churn.py RATE DURATION [--watch PID]
With --watch, prints the CPU time (utime+stime) PID spent during the churn, in total and per
thread started, as one JSON line.
"""
import ctypes
import json
import os
import sys
import threading
import time

PR_SET_NAME = 15
libc = ctypes.CDLL(None, use_errno=True)


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def worker(i):
    libc.prctl(PR_SET_NAME, f"conn_{i % 10000}".encode(), 0, 0, 0)


def main():
    args = sys.argv[1:]
    watch = None
    if "--watch" in args:
        k = args.index("--watch")
        watch = int(args[k + 1])
        del args[k : k + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    rate, duration = float(args[0]), float(args[1])
    hz = os.sysconf("SC_CLK_TCK")
    before = cpu_ticks(watch) if watch else None
    start = time.monotonic()
    n = 0
    while True:
        due = start + n / rate
        now = time.monotonic()
        if now - start >= duration:
            break
        if due > now:
            time.sleep(due - now)
        t = threading.Thread(target=worker, args=(n,))
        t.start()
        t.join()
        n += 1
    elapsed = time.monotonic() - start
    out = {"threads": n, "rate_achieved": n / elapsed}
    if watch:
        ms = (cpu_ticks(watch) - before) * 1000.0 / hz
        out.update({"watched_pid": watch, "cpu_ms": ms, "cpu_us_per_thread": ms * 1000.0 / max(n, 1)})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
