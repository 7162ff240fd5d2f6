#!/usr/bin/env python3
"""The kernel's own cost of moving one process between cgroups (cgroup v1), per hierarchy set.

Usage (root): bench/move-cost.py HIERARCHIES [MOVES]
  bench/move-cost.py cpu 3000
  bench/move-cost.py cpu,cpuacct,cpuset,blkio,memory 3000   # what dbcage run does per process

Makes groups dbcage-test-movecost/{a,b} under this process's own group in each hierarchy (so
memory groups nest inside whatever memory group runs it), moves one sleeping child back and forth
MOVES times through kept-open cgroup.procs descriptors (close together: no RCU grace period
wait), and prints wall and system time per move. Everything it makes is removed, also on failure.
"""
import os
import resource
import subprocess
import sys
import time

CG = "/sys/fs/cgroup"


def self_group(hierarchy):
    for line in open("/proc/self/cgroup"):
        _, controllers, path = line.strip().split(":", 2)
        if hierarchy in controllers.split(","):
            return path.rstrip("/")
    sys.exit(f"move-cost: no {hierarchy} line in /proc/self/cgroup")


def main():
    hierarchies = sys.argv[1].split(",") if len(sys.argv) > 1 else ["cpu"]
    moves = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    made, fds, child = [], [], None
    try:
        bases = []
        for h in hierarchies:
            base = f"{CG}/{h}{self_group(h)}/dbcage-test-movecost"
            for d in (base, f"{base}/a", f"{base}/b"):
                os.mkdir(d)
                made.append(d)
                if h == "cpuset":  # an empty cpuset takes no process
                    parent = os.path.dirname(d)
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        with open(f"{parent}/{f}") as src, open(f"{d}/{f}", "w") as dst:
                            dst.write(src.read().strip())
            bases.append(base)
        child = subprocess.Popen(["sleep", "600"])
        targets = {x: [os.open(f"{b}/{x}/cgroup.procs", os.O_WRONLY) for b in bases] for x in "ab"}
        fds = targets["a"] + targets["b"]
        pid = str(child.pid).encode()
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        for i in range(moves):
            for fd in targets["ab"[i % 2]]:
                os.write(fd, pid)
        t1, r1 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
        print(f"{','.join(hierarchies)}: {moves} moves of one process, {len(hierarchies)} "
              f"hierarchies each: wall {(t1 - t0) / moves * 1e6:.1f} us, "
              f"system {(r1.ru_stime - r0.ru_stime) / moves * 1e6:.1f} us per move")
    finally:
        for fd in fds:
            os.close(fd)
        if child:
            child.kill()
            child.wait()
        for d in reversed(made):
            try:
                os.rmdir(d)
            except OSError as e:
                print(f"move-cost: could not remove {d}: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
