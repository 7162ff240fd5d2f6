#!/usr/bin/env bash
# dbcage under systemd in the guest (tests/sdguest/guest/driver.sh).
# usage: tests/sdguest/driver.sh [v2|v1|all]   (default v2)
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -q --bin dbcage
versions=${1:-v2}
[ "$versions" = all ] && versions="v2 v1"
rc=0
for v in $versions; do
	echo "=== driver on $v"
	SDGUEST_CGROUP=$v SDGUEST_BINARY=target/debug/dbcage tests/sdguest/run.sh tests/sdguest/guest/driver.sh || rc=$?
done
exit $rc
