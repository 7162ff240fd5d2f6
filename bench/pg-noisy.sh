#!/usr/bin/env bash
# Noisy neighbours on real PostgreSQL 15 servers (issue 11), the long form of the integration
# tests in tests/it/pg_bench.rs: two clusters, each on its own loop-backed ext4, B running pgbench
# and A the noise, A governed by dbcage through `preset = "postgres"`.
#   IO:  B's TPC-B-like tps and p99 alone, next to A's bulk inserts free, next to A at
#        write_bps = 8MiB; then A alone with its limit raised live (policy reload).
#   CPU: B's select-only tps with A on cpu 0 and B on cpu 1 (`cpus`) against B alone under the
#        same pinning; A capped at cores = 0.5; nothing limited.
# Each phase runs SECS seconds (default 20). The tests hold the host-wide measure lock
# (/tmp/dbcage-measure.lock) themselves; other load on the host (builds) still skews the CPU
# figures, so note the load average printed at the start and end.
#
# Usage (root, cgroup v1, PostgreSQL 15 from Debian): sudo bench/pg-noisy.sh [SECS] [io|cpu]
# Everything it makes has dbcage-test in its name and is removed by the tests' guards.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
filter=pg_noisy_neighbour_${2:-}
echo "load average before: $(cat /proc/loadavg)"
DBCAGE_PG_BENCH_SECS=$secs cargo test --quiet --test it "$filter" -- --test-threads=1 --nocapture 2>&1 |
  grep -Ev '^20[0-9][0-9]-[0-9-]+T'
echo "load average after: $(cat /proc/loadavg)"
