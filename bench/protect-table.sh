#!/usr/bin/env bash
# Issue 24's measured table: IO protection by weights (iocost) against hard caps and against no
# control, on a disk of fixed capacity (null_blk, 2 ms timer, 8 tags) in the cgroup v2 VM.
# usage: cargo build --release && bench/protect-table.sh   (about 4 minutes under TCG)
# The guest script is bench/vm/protect-table.sh (what each phase runs is described there).
set -euo pipefail
cd "$(dirname "$0")/.."
exec flock /tmp/dbcage-measure.lock env DBCAGE_VM_MODULES=null_blk DBCAGE_VM_TIMEOUT=600 \
  tests/vm/run.sh target/release/dbcage bench/vm/protect-table.sh
