#!/bin/bash
# What a daemon's rescan costs when only its groups are many: 1,000 tenants (cpu quota and
# memory limit each, about 12,000 groups in four v1 hierarchies), no process of theirs, a daemon
# that rescans every second. For each build, RUNS times alternately: the daemon's CPU over 8 s
# from its 4th second (utime+stime), its rescans in that time (its --stats-out), their wall time
# (p50, p99), its RSS at the end, and how its plans read the groups (this build's stats:
# in full, files again, from the inotify watch).
#
#   OLD=/path/to/older/dbcage NEW=target/release/dbcage RUNS=3 bench/rescan-groups.sh
#
# Holds the measure lock; removes its groups (dbcage-test-rescan-groups) on exit, pass or fail.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
NEW=$(realpath "${NEW:-$here/../target/release/dbcage}")
OLD=${OLD:+$(realpath "$OLD")}
RUNS=${RUNS:-3}
ROOT=dbcage-test-rescan-groups
dir=$(mktemp -d /tmp/dbcage-test-rescan-groups.XXXXXX)
cleanup() {
    [ -n "${pid:-}" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    remove_root "$ROOT"
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

python3 - "$dir/dbcage.toml" "$ROOT" <<'EOF'
import sys
path, root = sys.argv[1:]
lines = ['[agent]', 'parent = "self"', f'root = "{root}"', '']
for i in range(1000):
    lines += ['[[tenant]]', f'name = "w{i:04d}"',
              f'match = [{{ comm = "^wbq{i:04d}$" }}, {{ cmdline = "^wbq{i:04d}x( |$)" }}]',
              '[tenant.cpu]', 'cores = 0.5', '[tenant.memory]', 'max = "1GiB"', '']
open(path, 'w').write("\n".join(lines))
EOF

one() { # one BIN LABEL
    local bin=$1 label=$2 c0 c1 rss
    "$bin" -c "$dir/dbcage.toml" run --rescan-interval 1s --metrics off \
        --stats-out "$dir/stats.json" >"$dir/run.log" 2>&1 &
    pid=$!
    sleep 4
    kill -0 "$pid" 2>/dev/null || { echo "$label: the daemon did not start:"; cat "$dir/run.log"; exit 1; }
    c0=$(awk '{print $14+$15}' "/proc/$pid/stat")
    sleep 8
    c1=$(awk '{print $14+$15}' "/proc/$pid/stat")
    rss=$(awk '/^VmRSS/{print $2}' "/proc/$pid/status")
    kill -TERM "$pid"
    wait "$pid" || true
    pid=
    python3 - "$label" "$c0" "$c1" "$rss" "$dir/stats.json" <<'EOF'
import json, os, sys
label, c0, c1, rss, stats = sys.argv[1:]
s = json.load(open(stats))
tick = os.sysconf("SC_CLK_TCK")
cpu = (int(c1) - int(c0)) * 1000 / tick
r = s["rescan_ms"]
print(f"{label:>4}  CPU over 8 s {cpu:6.0f} ms  rescans {s['rescans']:>2} (all of the run)  "
      f"rescan wall p50 {r['p50']:6.1f} p99 {r['p99']:6.1f} ms  RSS {int(rss) / 1024:5.1f} MiB  "
      f"groups {s.get('groups', '-')}")
EOF
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
exec 9>/tmp/dbcage-measure.lock
flock 9
for _ in $(seq "$RUNS"); do
    [ -n "$OLD" ] && one "$OLD" old
    one "$NEW" new
done
flock -u 9
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
