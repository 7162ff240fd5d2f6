#!/usr/bin/env bash
# Issue 24's measured table: IO protection by weights (iocost) against hard caps (a sweep of
# three) and against no control, on a disk of fixed capacity (null_blk, 2 ms timer, 8 tags) in
# the cgroup v2 VM.
# usage: cargo build --release && bench/protect-table.sh   (about 6-8 minutes under TCG)
#        DBCAGE_BIN=/path/to/dbcage bench/protect-table.sh   (another build)
#        DBCAGE_IOLATENCY=1 bench/protect-table.sh   (boot tests/vm/build-kernel.sh's kernel, which
#            has blk-iolatency, and add B's latency_target alone and with the weights: about
#            10 minutes, plus 15-30 for the kernel's first build)
# The guest script is bench/vm/protect-table.sh (what each phase runs is described there).
# Prints the host's load average before and after (the figures depend on it under TCG).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${DBCAGE_IOLATENCY:-0}" = 1 ]; then
    tests/vm/build-kernel.sh
    export DBCAGE_VM_KERNEL_DIR=${DBCAGE_VM_CACHE:-/var/cache/dbcage-vm}/kernel-iolatency
fi
exec flock /tmp/dbcage-measure.lock sh -c '
  echo "host load before: $(cut -d" " -f1-3 /proc/loadavg)"
  rc=0
  env DBCAGE_VM_MODULES=null_blk DBCAGE_VM_TIMEOUT=1200 \
    tests/vm/run.sh "${DBCAGE_BIN:-target/release/dbcage}" bench/vm/protect-table.sh || rc=$?
  echo "host load after: $(cut -d" " -f1-3 /proc/loadavg)"
  exit $rc'
