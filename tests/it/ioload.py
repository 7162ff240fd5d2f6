#!/usr/bin/env python3
"""Load generator for dbcage's integration tests (tests/it).

Started with a chosen argv[0] (the tests match processes by cmdline), it first waits until
/proc/self/cgroup shows that the process is in the group the test expects (a path containing
MARKER in the chosen controller's hierarchy), so the load it measures starts only once dbcage has
placed it. Then it runs one load for a fixed time and prints one JSON line:

  {"mode": ..., "bytes": N, "ios": N, "seconds": S, "waited": S, "cgroup": PATH, ...}

Modes:
  read FILE [FILE...]   O_DIRECT sequential reads of --bs bytes, round-robin over the files
                        (one process reading several devices "at once").
  randread FILE         O_DIRECT reads of --bs bytes (4 KiB by default) at scattered offsets.
  write FILE            writes of --bs bytes, each followed by fsync, over the first --span bytes
                        of FILE (created if missing).
  mem                   allocates --mib MiB and touches every page; prints bytes when done.

--delay S waits S seconds between being placed and starting the load.

Exit codes: 0 done, 3 the process was not placed in time.
"""

import argparse
import json
import mmap
import os
import sys
import time


def cgroup_path(controller):
    with open("/proc/self/cgroup") as f:
        for line in f:
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) == 3 and controller in parts[1].split(","):
                return parts[2]
    return None


def wait_for_group(controller, marker, timeout):
    start = time.monotonic()
    while True:
        path = cgroup_path(controller)
        if path is not None and marker in path:
            return time.monotonic() - start, path
        if time.monotonic() - start > timeout:
            print(json.dumps({"error": "not placed", "cgroup": path, "marker": marker}))
            sys.stdout.flush()
            sys.exit(3)
        time.sleep(0.01)


def open_direct(path):
    return os.open(path, os.O_RDONLY | os.O_DIRECT)


def run_read(args, files):
    fds = [open_direct(p) for p in files]
    sizes = [os.fstat(fd).st_size // args.bs * args.bs for fd in fds]
    buf = mmap.mmap(-1, args.bs)  # page-aligned, as O_DIRECT needs
    offsets = [0] * len(fds)
    per_file = [0] * len(fds)
    total = ios = 0
    i = 0
    start = time.monotonic()
    while time.monotonic() - start < args.duration:
        k = i % len(fds)
        n = os.preadv(fds[k], [buf], offsets[k])
        if n <= 0:
            raise SystemExit("short read on %s at %d" % (files[k], offsets[k]))
        offsets[k] = (offsets[k] + n) % sizes[k]
        per_file[k] += n
        total += n
        ios += 1
        i += 1
    return total, ios, time.monotonic() - start, {"per_file": per_file}


def run_randread(args, files):
    fd = open_direct(files[0])
    blocks = os.fstat(fd).st_size // args.bs
    buf = mmap.mmap(-1, args.bs)
    total = ios = 0
    # A multiplicative walk over the blocks: scattered, repeatable, no random module needed.
    step = 2654435761 % blocks or 1
    b = 0
    start = time.monotonic()
    while time.monotonic() - start < args.duration:
        b = (b + step) % blocks
        n = os.preadv(fd, [buf], b * args.bs)
        total += n
        ios += 1
    return total, ios, time.monotonic() - start, {}


def run_write(args, files):
    fd = os.open(files[0], os.O_WRONLY | os.O_CREAT, 0o644)
    data = b"\xa5" * args.bs
    span = max(args.span // args.bs, 1)
    total = ios = 0
    b = 0
    start = time.monotonic()
    while time.monotonic() - start < args.duration:
        n = os.pwrite(fd, data, (b % span) * args.bs)
        os.fsync(fd)
        b += 1
        total += n
        ios += 1
    return total, ios, time.monotonic() - start, {}


def run_mem(args, _files):
    n = args.mib << 20
    start = time.monotonic()
    block = bytearray(n)
    page = mmap.PAGESIZE
    for off in range(0, n, page):
        block[off] = 1
    return n, 0, time.monotonic() - start, {}


MODES = {"read": run_read, "randread": run_randread, "write": run_write, "mem": run_mem}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--marker", required=True)
    p.add_argument("--controller", default="blkio")
    p.add_argument("--wait-timeout", type=float, default=30.0)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--bs", type=int, default=256 * 1024)
    p.add_argument("--span", type=int, default=32 << 20)
    p.add_argument("--mib", type=int, default=0)
    p.add_argument("--delay", type=float, default=0.0, help="seconds to wait once placed")
    p.add_argument("mode", choices=sorted(MODES))
    p.add_argument("files", nargs="*")
    args = p.parse_args()
    if args.mode != "mem" and not args.files:
        p.error("mode %s needs a file" % args.mode)
    waited, path = wait_for_group(args.controller, args.marker, args.wait_timeout)
    time.sleep(args.delay)
    total, ios, seconds, extra = MODES[args.mode](args, args.files)
    out = {
        "mode": args.mode,
        "bytes": total,
        "ios": ios,
        "seconds": seconds,
        "waited": waited,
        "cgroup": path,
    }
    out.update(extra)
    print(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
