#!/usr/bin/env bash
# Issue 24's measured table: IO protection by weights (iocost) against hard caps (a sweep of
# three) and against no control, on a disk of fixed capacity (null_blk, 2 ms timer, 8 tags) in
# the cgroup v2 VM.
# usage: cargo build --release && bench/protect-table.sh   (about 9 minutes under TCG)
#        DBCAGE_BIN=/path/to/dbcage bench/protect-table.sh   (another build)
#        DBCAGE_IOLATENCY=1 bench/protect-table.sh   (boot tests/vm/build-kernel.sh's kernel, which
#            has blk-iolatency, and add B's latency_target alone and with the weights: about
#            11 minutes, plus 15-30 for the kernel's first build)
#        DBCAGE_TABLE_SECONDS=16 bench/protect-table.sh   (each phase measured for 16 s instead of
#            8: steadier p99 and splits, twice the time)
# The guest script is bench/vm/protect-table.sh (what each phase runs is described there).
# Prints the host's load average before and after (the figures depend on it under TCG).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${DBCAGE_IOLATENCY:-0}" = 1 ]; then
    tests/vm/build-kernel.sh
    export DBCAGE_VM_KERNEL_DIR=${DBCAGE_VM_CACHE:-/var/cache/dbcage-vm}/kernel-iolatency
fi
guest=bench/vm/protect-table.sh
if [ -n "${DBCAGE_TABLE_SECONDS:-}" ]; then
    case $DBCAGE_TABLE_SECONDS in
    *[!0-9]* | 0*) echo "DBCAGE_TABLE_SECONDS=$DBCAGE_TABLE_SECONDS: want a whole number of seconds" >&2; exit 2 ;;
    esac
    tmp=$(mktemp -d /tmp/dbcage-test-table.XXXXXX)
    trap 'rm -rf "$tmp"' EXIT
    sed "s/^SECONDS_PER_PHASE=8\$/SECONDS_PER_PHASE=$DBCAGE_TABLE_SECONDS/" $guest >"$tmp/protect-table.sh"
    grep -q "^SECONDS_PER_PHASE=$DBCAGE_TABLE_SECONDS\$" "$tmp/protect-table.sh" || { echo "could not set the phase length in $guest" >&2; exit 1; }
    guest=$tmp/protect-table.sh
fi
export guest
flock /tmp/dbcage-measure.lock sh -c '
  echo "host load before: $(cut -d" " -f1-3 /proc/loadavg)"
  rc=0
  env DBCAGE_VM_MODULES=null_blk DBCAGE_VM_TIMEOUT=2400 \
    tests/vm/run.sh "${DBCAGE_BIN:-target/release/dbcage}" "$guest" || rc=$?
  echo "host load after: $(cut -d" " -f1-3 /proc/loadavg)"
  exit $rc'
