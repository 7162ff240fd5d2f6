#!/usr/bin/env bash
# dist/dbcage.service as shipped, on cgroup v2 under systemd (tests/sdguest/guest/unit-caps.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -q --bin dbcage
SDGUEST_BINARY=target/debug/dbcage tests/sdguest/run.sh tests/sdguest/guest/unit-caps.sh dist/dbcage.service
