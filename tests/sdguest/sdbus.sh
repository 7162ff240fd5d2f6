#!/usr/bin/env bash
# dbcage's systemd client (src/systemd/) against systemd 252 in the guest, through
# examples/sdbus: guest/sdbus.sh (the D-Bus calls) and guest/govern.sh (assert/drift, adopt,
# release).
# usage: tests/sdguest/sdbus.sh [v2|v1|all] [SCRIPT...]   (default v2, both scripts)
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -q --example sdbus
mkdir -p target/sdguest
strip --strip-debug -o target/sdguest/sdbus target/debug/examples/sdbus
versions=${1:-v2}
[ "$versions" = all ] && versions="v2 v1"
shift || true
scripts=("$@")
[ ${#scripts[@]} -gt 0 ] || scripts=(sdbus govern)
rc=0
for v in $versions; do
	for s in "${scripts[@]}"; do
		echo "=== $s on $v"
		SDGUEST_CGROUP=$v tests/sdguest/run.sh "tests/sdguest/guest/$s.sh" target/sdguest/sdbus || rc=$?
	done
done
exit $rc
