#!/usr/bin/env bash
# dbcage's systemd D-Bus client against systemd 252 in the guest (tests/sdguest/guest/sdbus.sh).
# usage: tests/sdguest/sdbus.sh [v2|v1|all]   (default v2)
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -q --example sdbus
mkdir -p target/sdguest
strip --strip-debug -o target/sdguest/sdbus target/debug/examples/sdbus
versions=${1:-v2}
[ "$versions" = all ] && versions="v2 v1"
rc=0
for v in $versions; do
	SDGUEST_CGROUP=$v tests/sdguest/run.sh tests/sdguest/guest/sdbus.sh target/sdguest/sdbus || rc=$?
done
exit $rc
