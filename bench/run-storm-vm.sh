#!/usr/bin/env bash
# Issue 8's storm on cgroup v2 in the test VM (tests/vm/storm.sh), with and without the
# favordynmods mount option: builds dbcage and the storm bench, then boots the VM under the
# host-wide measurement lock (/tmp/dbcage-measure.lock; the VM's emulated CPUs need the host's).
#
# Usage: bench/run-storm-vm.sh [KEY=VALUE...]
#   KEY=VALUE pairs go into the guest as /extra/storm.env: BASE_RATES and DBCAGE_RATES (execs/s,
#   default 10,50 each), DURATION (s per rate, default 3), FORK_N and EXEC_N (fork and exec
#   cycles per fork-cost round, default 300 and 30), FORK_ROUNDS (per mode, default 8),
#   WATCH_MS (default 500), CLASSIFIER_NICE (default -10), STORM_ARGS (more storm options).
#   Environment: DBCAGE_VM_TIMEOUT (default 900 s here). With the defaults the VM runs for
#   1.5 to 2.5 minutes (the emulated CPUs share the host's two cores). Figures: bench/README.md.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
cargo build --release --quiet
BENCH=$(cargo bench --bench storm --no-run --message-format=json 2>/dev/null |
    grep '"kind":\["bench"\]' | grep '"name":"storm"' |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n1)
[ -x "$BENCH" ] || { echo "run-storm-vm: could not build the storm bench" >&2; exit 1; }
EXTRA=()
if [ $# -gt 0 ]; then
    ENVDIR=$(mktemp -d /tmp/dbcage-test-storm-vm-XXXX)
    trap 'rm -rf "$ENVDIR"' EXIT
    for kv in "$@"; do
        case "$kv" in
            BASE_RATES=* | DBCAGE_RATES=* | DURATION=* | FORK_N=* | EXEC_N=* | FORK_ROUNDS=* | WATCH_MS=* | CLASSIFIER_NICE=* | STORM_ARGS=*) ;;
            *) echo "run-storm-vm: unknown setting $kv" >&2; exit 2 ;;
        esac
        printf '%s=%q\n' "${kv%%=*}" "${kv#*=}"
    done >"$ENVDIR/storm.env"
    EXTRA=("$ENVDIR/storm.env")
fi
export DBCAGE_VM_TIMEOUT=${DBCAGE_VM_TIMEOUT:-900}
flock /tmp/dbcage-measure.lock tests/vm/run.sh target/release/dbcage tests/vm/storm.sh "$BENCH" "${EXTRA[@]}"
