#!/usr/bin/env python3
"""Issue 7, side by side: an instance-total IO budget split "equal" vs "demand".

Three loop disks (ext4 on sparse files), one tenant with read_bps = TOTAL (12 MiB/s by default)
over the three, the daemon (`dbcage run`) placing O_DIRECT readers (tests/it/ioload.py, 64 KiB
reads, one process per busy disk). For each load and each split:

  one      readers on disk 0
  two      readers on disks 0 and 1
  three    readers on all three
  moving   one reader that moves 0 -> 1 -> 2 -> 0, MOVE_SECS (10 s) on each

it prints the share of the total actually achieved (the tenant's own counters,
blkio.throttle.io_service_bytes_recursive of its `limited` leaf, v1; io.stat on v2), the time
from each move until the new disk reaches 95% of the total (1-s windows sampled every 100 ms;
the worst move), and the largest per-device sum of the limits over all samples of the control
files (read about every millisecond by a thread, must be <= TOTAL).

--key balances write_bps (writes each followed by fsync), read_iops (4 KiB O_DIRECT reads at
scattered offsets) or write_iops (4 KiB writes + fsync) instead; the iops total is --total-iops
(300 by default).

Usage (root): bench/balance.sh [--key read_bps] [--total-mib 12] [--secs 12] [--move-secs 10]
              [--only one,moving]
Everything it makes has dbcage-test in its name and is removed on exit.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
IOLOAD = os.path.join(REPO, "tests", "it", "ioload.py")


def sh(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()


class Disks:
    def __init__(self, n, mib):
        self.dir = tempfile.mkdtemp(prefix="dbcage-test-balance-")
        self.devs, self.mounts, self.files = [], [], []
        try:
            for i in range(n):
                img = os.path.join(self.dir, "dbcage-test-%d.img" % i)
                with open(img, "wb") as f:
                    f.truncate(mib << 20)
                dev = sh("losetup", "--find", "--show", img)
                self.devs.append(dev)
                sh("mkfs.ext4", "-q", "-F", dev)
                m = os.path.join(self.dir, "dbcage-test-mnt-%d" % i)
                os.mkdir(m)
                sh("mount", dev, m)
                self.mounts.append(m)
                f = os.path.join(m, "dbcage-test-read.dat")
                sh("dd", "if=/dev/zero", "of=" + f, "bs=1M", "count=64", "oflag=direct",
                   "conv=fsync", "status=none")
                self.files.append(f)
        except BaseException:
            self.close()
            raise

    def devnum(self, i):
        st = os.stat(self.devs[i])
        return "%d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev))

    def close(self):
        for m in self.mounts:
            for _ in range(50):
                if subprocess.run(["umount", m], capture_output=True).returncode == 0:
                    break
                time.sleep(0.1)
            else:
                subprocess.run(["umount", "-l", m])
        for d in self.devs:
            subprocess.run(["losetup", "-d", d])
        shutil.rmtree(self.dir, ignore_errors=True)


def hierarchy():
    """(version, directory of this process's cgroup in the io hierarchy)."""
    for line in open("/proc/self/cgroup"):
        hid, ctrls, path = line.rstrip("\n").split(":", 2)
        if "blkio" in ctrls.split(","):
            for ml in open("/proc/self/mountinfo"):
                l, r = ml.split(" - ")
                if r.split()[0] == "cgroup" and "blkio" in r.split()[2].split(","):
                    return 1, l.split()[4] + path
    for line in open("/proc/self/cgroup"):
        if line.startswith("0::"):
            return 2, "/sys/fs/cgroup" + line.rstrip("\n")[3:]
    raise SystemExit("no blkio (v1) or io (v2) hierarchy")


VERSION, OWN = hierarchy()


# The balanced key (--key): v1 counter file and row, v1 limit file, v2 io.stat / io.max field.
KEYS = {
    "read_bps": ("blkio.throttle.io_service_bytes_recursive", "Read",
                 "blkio.throttle.read_bps_device", "rbytes", "rbps"),
    "write_bps": ("blkio.throttle.io_service_bytes_recursive", "Write",
                  "blkio.throttle.write_bps_device", "wbytes", "wbps"),
    "read_iops": ("blkio.throttle.io_serviced_recursive", "Read",
                  "blkio.throttle.read_iops_device", "rios", "riops"),
    "write_iops": ("blkio.throttle.io_serviced_recursive", "Write",
                   "blkio.throttle.write_iops_device", "wios", "wiops"),
}
KEY = "read_bps"


def read_bytes(leaf):
    """The balanced key's counter per device (bytes or IOs)."""
    v1file, v1row, _, v2stat, _ = KEYS[KEY]
    out = {}
    if VERSION == 1:
        try:
            text = open(os.path.join(leaf, v1file)).read()
        except OSError:
            return out
        for l in text.splitlines():
            f = l.split()
            if len(f) == 3 and f[1] == v1row:
                out[f[0]] = int(f[2])
    else:
        try:
            text = open(os.path.join(leaf, "io.stat")).read()
        except OSError:
            return out
        for l in text.splitlines():
            f = l.split()
            kv = dict(x.split("=", 1) for x in f[1:] if "=" in x)
            out[f[0]] = int(kv.get(v2stat, 0))
    return out


def read_limits(leaf):
    _, _, v1limit, _, v2max = KEYS[KEY]
    out = {}
    try:
        if VERSION == 1:
            for l in open(os.path.join(leaf, v1limit)):
                d, v = l.split()
                out[d] = int(v)
        else:
            for l in open(os.path.join(leaf, "io.max")):
                f = l.split()
                kv = dict(x.split("=", 1) for x in f[1:])
                if kv.get(v2max, "max") != "max":
                    out[f[0]] = int(kv[v2max])
    except OSError:
        pass
    return out


class Sampler(threading.Thread):
    """Reads the per-device limits about every millisecond; keeps the max sum, the count, and
    the samples where a device had no limit at all (unlimited: the worst case, a violation)."""

    def __init__(self, leaf, devs):
        super().__init__(daemon=True)
        self.leaf, self.devs = leaf, devs
        self.stop = False
        self.n = 0
        self.max_sum = 0
        self.unlimited = 0
        self.first_unlimited = None

    def run(self):
        while not self.stop:
            l = read_limits(self.leaf)
            self.n += 1
            if all(d in l for d in self.devs):
                self.max_sum = max(self.max_sum, sum(l[d] for d in self.devs))
            else:
                self.unlimited += 1
                if self.first_unlimited is None:
                    self.first_unlimited = l
            time.sleep(0.001)


class Rates(threading.Thread):
    """Samples the counters every 100 ms: (t, {dev: bytes})."""

    def __init__(self, leaf):
        super().__init__(daemon=True)
        self.leaf = leaf
        self.stop = False
        self.samples = []

    def run(self):
        while not self.stop:
            self.samples.append((time.monotonic(), read_bytes(self.leaf)))
            time.sleep(0.1)

    def bytes_between(self, t0, t1, devs):
        a = [s for s in self.samples if s[0] >= t0]
        b = [s for s in self.samples if s[0] <= t1]
        if not a or not b or b[-1][0] <= a[0][0]:
            return 0.0, 0.0
        (ta, ca), (tb, cb) = a[0], b[-1]
        return sum(cb.get(d, 0) - ca.get(d, 0) for d in devs), tb - ta

    def first_at(self, t0, t1, devs, want):
        """First time after t0 (seconds since t0) when a 1-s window on devs reaches `want` B/s."""
        for i, (t, c) in enumerate(self.samples):
            if t < t0 + 1.0 or t > t1:
                continue
            prev = [s for s in self.samples[:i] if t - s[0] >= 0.99 and s[0] >= t0]
            if not prev:
                continue
            tp, cp = prev[-1]
            rate = sum(c.get(d, 0) - cp.get(d, 0) for d in devs) / (t - tp)
            if rate >= want:
                return t - t0
        return None


def reader(name, marker, ctrl, f, secs):
    """The load for the balanced key: O_DIRECT 64 KiB reads (bps) or 4 KiB reads at scattered
    offsets (iops); writes each followed by fsync (64 KiB for bps, 4 KiB for iops)."""
    bs = "65536" if KEY.endswith("bps") else "4096"
    mode = {"read_bps": "read", "read_iops": "randread"}.get(KEY, "write")
    target = f if mode != "write" else f + ".dbcage-test-w"
    args = [name, IOLOAD, "--marker", marker, "--controller", ctrl, "--duration", str(secs),
            "--bs", bs, mode, target]
    return subprocess.Popen(args, executable=sys.executable, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dbcage", default=os.path.join(REPO, "target", "release", "dbcage"))
    ap.add_argument("--key", default="read_bps", choices=sorted(KEYS),
                    help="the limit to balance (read_bps by default)")
    ap.add_argument("--total-mib", type=float, default=12, help="total for the bps keys")
    ap.add_argument("--total-iops", type=int, default=300, help="total for the iops keys")
    ap.add_argument("--secs", type=float, default=12, help="steady loads: seconds per run")
    ap.add_argument("--warmup", type=float, default=4, help="steady loads: seconds not counted")
    ap.add_argument("--move-secs", type=float, default=10)
    ap.add_argument("--floor", default="1%")
    ap.add_argument("--interval", default=None, help="rebalance_interval (default: dbcage's)")
    ap.add_argument("--only", default="one,two,three,moving")
    ap.add_argument("--splits", default="equal,demand")
    ap.add_argument("--json", default=None, help="append the results as JSON lines here")
    a = ap.parse_args()
    global KEY
    KEY = a.key
    total = int(a.total_mib * (1 << 20)) if KEY.endswith("bps") else a.total_iops
    tag = "dbcage-test-bal-%d" % os.getpid()
    disks = Disks(3, 256)
    work = tempfile.mkdtemp(prefix="dbcage-test-balance-run-")
    leaf = os.path.join(OWN, tag, "db", "limited")
    ctrl = "blkio" if VERSION == 1 else "io"
    marker = "/%s/db/limited" % tag
    name = "ora_bal_%d" % os.getpid()
    devs = [disks.devnum(i) for i in range(3)]
    daemon = None
    policy = None
    results = []

    def stop_daemon():
        nonlocal daemon
        if daemon is not None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
            daemon = None

    try:
        for split in a.splits.split(","):
            policy = os.path.join(work, "dbcage-%s.toml" % split)
            with open(policy, "w") as f:
                f.write('[agent]\nparent = "self"\nroot = "%s"\nmetrics = "off"\n\n' % tag)
                f.write('[[tenant]]\nname = "db"\nmatch = [{ cmdline = "^%s( |$)" }]\n' % name)
                f.write("storage = [%s]\n" % ", ".join('"%s"' % m for m in disks.mounts))
                f.write('[tenant.io]\n%s = %d\nsplit = "%s"\nfloor = "%s"\n'
                        % (KEY, total, split, a.floor))
                if a.interval and split == "demand":
                    f.write('rebalance_interval = "%s"\n' % a.interval)
            daemon = subprocess.Popen([a.dbcage, "-c", policy, "run"], stdout=subprocess.DEVNULL,
                                      stderr=open(os.path.join(work, "daemon-%s.log" % split), "w"))
            time.sleep(1.0)
            for load in a.only.split(","):
                sampler = Sampler(leaf, devs)
                rates = Rates(leaf)
                sampler.start()
                rates.start()
                row = {"split": split, "load": load}
                if load == "moving":
                    order = [0, 1, 2, 0]
                    marks = []
                    for k in order:
                        p = reader(name, marker, ctrl, disks.files[k], a.move_secs)
                        out, err = p.communicate(timeout=a.move_secs + 60)
                        r = json.loads(out.strip().splitlines()[-1])
                        end = time.monotonic()
                        marks.append((end - r["seconds"], end, k))
                    recov = []
                    for i, (t0, t1, k) in enumerate(marks):
                        if i == 0:
                            continue
                        recov.append(rates.first_at(t0, t1, [devs[k]], 0.95 * total))
                    b, dt = 0.0, 0.0
                    for t0, t1, k in marks:
                        bb, d = rates.bytes_between(t0, t1, devs)
                        b, dt = b + bb, dt + d
                    row["share"] = b / dt / total if dt else 0.0
                    row["recovery_s"] = (None if any(r is None for r in recov)
                                         else max(recov))
                    row["recovery_each_s"] = recov
                else:
                    busy = {"one": [0], "two": [0, 1], "three": [0, 1, 2]}[load]
                    ps = [reader(name, marker, ctrl, disks.files[k], a.secs) for k in busy]
                    t0 = time.monotonic()
                    for p in ps:
                        p.communicate(timeout=a.secs + 60)
                    t1 = time.monotonic()
                    b, dt = rates.bytes_between(t0 + a.warmup, t1 - 0.5, devs)
                    row["share"] = b / dt / total if dt else 0.0
                sampler.stop = rates.stop = True
                sampler.join()
                rates.join()
                row["limit_samples"] = sampler.n
                row["max_sum"] = sampler.max_sum
                row["unlimited_samples"] = sampler.unlimited
                row["first_unlimited"] = sampler.first_unlimited
                row["total"] = total
                results.append(row)
                print(json.dumps(row), flush=True)
                time.sleep(1.5)  # let the balancer see the idle interval before the next load
            stop_daemon()
    finally:
        stop_daemon()
        if policy:
            subprocess.run([a.dbcage, "-c", policy, "release", "--all"], capture_output=True)
        try:
            os.unlink("/run/dbcage/%s.balance.json" % tag)
        except OSError:
            pass
        disks.close()
        shutil.rmtree(work, ignore_errors=True)

    print()
    shown = "%.0f MiB/s" % a.total_mib if KEY.endswith("bps") else "%d IOPS" % total
    print("cgroup v%d, 3 loop disks, total %s %s, floor %s; share of the total "
          "achieved (steady: after %.0f s warm-up)" % (VERSION, shown, KEY, a.floor, a.warmup))
    print("%-8s %10s %10s %16s %22s" % ("load", "equal", "demand", "recovery(demand)",
                                        "max sum / total"))
    by = {(r["split"], r["load"]): r for r in results}
    for load in a.only.split(","):
        e, d = by.get(("equal", load)), by.get(("demand", load))
        fmt = lambda r: "%.1f%%" % (100 * r["share"]) if r else "-"
        rec = "-"
        if d and load == "moving":
            rec = "%.1f s" % d["recovery_s"] if d["recovery_s"] is not None else "never"
        worst = max((r["max_sum"] for r in (e, d) if r), default=0)
        print("%-8s %10s %10s %16s %14d / %d" % (load, fmt(e), fmt(d), rec, worst, total))
    if a.json:
        with open(a.json, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    # The guarantee: the limits never sum above the total, and no device is ever unlimited.
    bad = [r for r in results if r["max_sum"] > r["total"] or r["unlimited_samples"]]
    for r in bad:
        print("VIOLATION %s/%s: max sum %d > total %d, or %d of %d samples with a device "
              "unlimited (first: %s)" % (r["split"], r["load"], r["max_sum"], r["total"],
                                         r["unlimited_samples"], r["limit_samples"],
                                         r["first_unlimited"]), file=sys.stderr)
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
