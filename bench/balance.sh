#!/usr/bin/env bash
# Issue 7 side by side: io.split = "equal" vs "demand" on 3 loop disks (see bench/balance.py).
# Usage (root): bench/balance.sh [balance.py options, e.g. --only one,moving --total-mib 12]
# DBCAGE_BIN: the dbcage to test (default: target/release/dbcage, built here).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${DBCAGE_BIN:-}" ]]; then
    cargo build --release --quiet
    DBCAGE_BIN=target/release/dbcage
fi
exec python3 bench/balance.py --dbcage "$DBCAGE_BIN" "$@"
