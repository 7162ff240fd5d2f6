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
  rename                does not wait first: after --delay S renames itself (writes --comm to
                        /proc/self/comm, as prctl(PR_SET_NAME) does), then waits until placed and
                        prints how long that took ("waited") and where it was before ("before");
                        then stays --duration seconds.
  forks                 once placed, forks --children processes that live until it exits (they
                        die with it); the first of them renames itself to --comm after --delay S
                        if --comm is given. Writes {"children": [PID...]} to --out, then stays
                        --duration seconds.
  spawn-storm           does not wait first: renames itself to --comm (so that a rule on that
                        name makes the daemon move it now) and at once starts --children
                        `sleep --duration` processes with posix_spawn (a vfork: as fast as a
                        fork gets), argv[0] --child-name and `dbcage-test-other` in turn, while
                        the daemon is moving it. Writes {"children": [PID...]} to --out, then
                        waits for them.

--controller takes a comma-separated list: the marker must show in each of them.

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
    """The process's group in the controller's v1 hierarchy, else its unified (v2) group."""
    unified = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            parts = line.rstrip("\n").split(":", 2)
            if len(parts) != 3:
                continue
            if controller in parts[1].split(","):
                return parts[2]
            if parts[0] == "0" and parts[1] == "":
                unified = parts[2]
    return unified


def wait_for_group(controllers, marker, timeout):
    start = time.monotonic()
    while True:
        paths = [cgroup_path(c) for c in controllers.split(",")]
        path = paths[0]
        if all(p is not None and marker in p for p in paths):
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
    # A block device's fstat size is 0: its size is where SEEK_END lands.
    sizes = [(os.fstat(fd).st_size or os.lseek(fd, 0, os.SEEK_END)) // args.bs * args.bs for fd in fds]
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


def set_comm(name):
    with open("/proc/self/comm", "w") as f:
        f.write(name)


def run_rename(args):
    time.sleep(args.delay)
    before = cgroup_path(args.controller.split(",")[0])
    set_comm(args.comm)
    waited, path = wait_for_group(args.controller, args.marker, args.wait_timeout)
    print(json.dumps({"mode": "rename", "before": before, "waited": waited, "cgroup": path}))
    sys.stdout.flush()
    time.sleep(args.duration)


def run_forks(args):
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()
    children = []
    for i in range(args.children):
        pid = os.fork()
        if pid == 0:
            try:
                libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the parent
                if os.getppid() != parent:
                    os._exit(0)
                if i == 0 and args.comm:
                    time.sleep(args.delay)
                    set_comm(args.comm)
                while os.getppid() == parent:
                    time.sleep(0.1)
            finally:
                os._exit(0)
        children.append(pid)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"children": children}, f)
    os.rename(tmp, args.out)
    time.sleep(args.duration)


def run_spawn_storm(args):
    sleep = "/usr/bin/sleep" if os.path.exists("/usr/bin/sleep") else "/bin/sleep"
    names = [args.child_name, "dbcage-test-other"]
    set_comm(args.comm)
    children = [
        os.posix_spawn(sleep, [names[i % 2], str(args.duration)], os.environ)
        for i in range(args.children)
    ]
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"children": children}, f)
    os.rename(tmp, args.out)
    for _ in children:
        os.wait()


MODES = {"read": run_read, "randread": run_randread, "write": run_write, "mem": run_mem}
OWN_WAIT = {"rename": run_rename, "spawn-storm": run_spawn_storm}
NO_LOAD = {"forks": run_forks}


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
    p.add_argument("--comm", default=None, help="rename, forks: the new name")
    p.add_argument("--children", type=int, default=0, help="forks: how many")
    p.add_argument("--out", default=None, help="forks, spawn-storm: where to write the children's pids")
    p.add_argument("--child-name", default="dbcage-test-child", help="spawn-storm: argv[0] of every second child")
    p.add_argument("mode", choices=sorted(list(MODES) + list(OWN_WAIT) + list(NO_LOAD)))
    p.add_argument("files", nargs="*")
    args = p.parse_args()
    if args.mode in OWN_WAIT:
        OWN_WAIT[args.mode](args)
        return
    if args.mode in MODES and args.mode != "mem" and not args.files:
        p.error("mode %s needs a file" % args.mode)
    if args.mode == "forks" and not args.out:
        p.error("mode forks needs --out")
    waited, path = wait_for_group(args.controller, args.marker, args.wait_timeout)
    if args.mode in NO_LOAD:
        NO_LOAD[args.mode](args)
        return
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
