#!/usr/bin/env bash
# What `favordynmods` costs every fork and exit on this host: the storm bench's --fork-cost
# (N fork+_exit+waitpid cycles and N spawn+exec+wait cycles of a binary that exits at once), in
# rounds that alternate without and with the option, so that drift on a shared host falls on
# both sides alike.
#
# Usage (root; hold the measure lock, since the option changes every fork, exit and cgroup move
# on the host while it is mounted):
#   flock /tmp/dbcage-measure.lock bench/favordynmods-cost.sh
# Environment: ROUNDS (pairs, default 6), CYCLES (per round, default 3000).
#
# "With" mounts a controller-less named v1 hierarchy with the option, as `agent.favordynmods =
# true` does, at /run/dbcage-test-favordynmods-cost-PID, and unmounts it after each round and on
# exit, also on failure. It refuses to run when a cgroup mount on the host has the option
# already (there would be no "without").
set -euo pipefail

ROUNDS=${ROUNDS:-6}
CYCLES=${CYCLES:-3000}
REPO=$(cd "$(dirname "$0")/.." && pwd)
DIR=/run/dbcage-test-favordynmods-cost-$$
NAME=$(basename "$DIR")

die() { echo "favordynmods-cost: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (it mounts a cgroup hierarchy)"
has_option() { awk '$0 ~ / - cgroup2? / && $NF ~ /(^|,)favordynmods(,|$)/ { found = 1 } END { exit !found }' /proc/self/mountinfo; }
has_option && die "a cgroup mount on this host has favordynmods already: $(awk '$NF ~ /favordynmods/ { print $5 }' /proc/self/mountinfo | tr '\n' ' ')"

W=$(mktemp -d /tmp/dbcage-test-favordynmods-cost-XXXX)
unmount() {
    if awk -v d="$DIR" '$5 == d { found = 1 } END { exit !found }' /proc/self/mountinfo; then
        umount "$DIR" || umount -l "$DIR"
    fi
    rmdir "$DIR" 2>/dev/null || true
}
cleanup() { local rc=$?; trap - EXIT INT TERM; unmount; rm -rf "$W"; exit "$rc"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

cd "$REPO"
BENCH=$(cargo bench --bench storm --no-run --message-format=json 2>/dev/null |
    grep '"kind":\["bench"\]' | grep '"name":"storm"' |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n1)
[ -x "$BENCH" ] || die "could not build the storm bench"

for r in $(seq "$ROUNDS"); do
    "$BENCH" --fork-cost "$CYCLES" --name off --json-out "$W/off.jsonl" >/dev/null
    mkdir -p "$DIR"
    mount -t cgroup -o "none,name=$NAME,favordynmods" cgroup "$DIR"
    has_option || die "mounted $DIR but mountinfo shows no favordynmods"
    "$BENCH" --fork-cost "$CYCLES" --name on --json-out "$W/on.jsonl" >/dev/null
    unmount
    echo "round $r of $ROUNDS done"
done
python3 - "$W/off.jsonl" "$W/on.jsonl" <<'PY'
import json, statistics, sys
rows = {}
for path in sys.argv[1:]:
    for line in open(path):
        d = json.loads(line)
        rows.setdefault(d["fork_cost"], []).append(d)
keys = [("fork_exit_wait_mean_us", "fork+_exit+waitpid mean"), ("fork_exit_wait_p50_us", "fork+_exit+waitpid p50"),
        ("fork_exit_wait_p99_us", "fork+_exit+waitpid p99"), ("spawn_exec_wait_mean_us", "spawn+exec+wait mean"),
        ("spawn_exec_wait_p50_us", "spawn+exec+wait p50")]
print(f"{'us per cycle (median of rounds; min-max)':<44} {'without':>18} {'with':>18} {'cost':>8}")
for k, label in keys:
    off = [d[k] for d in rows["off"]]
    on = [d[k] for d in rows["on"]]
    mo, mn = statistics.median(off), statistics.median(on)
    print(f"{label:<44} {mo:8.1f} ({min(off):.0f}-{max(off):.0f}) {mn:8.1f} ({min(on):.0f}-{max(on):.0f}) {mn - mo:+7.1f}")
print(json.dumps({"rounds": len(rows["off"]), "off": rows["off"], "on": rows["on"]}))
PY
