#!/usr/bin/env bash
# The integration tests (tests/it) on cgroup v2 for real: the same test binary as on this host,
# run in the Debian 12 systemd guest (tests/sdguest/run.sh; systemd 252 as PID 1, the unified
# hierarchy, kernel 6.1, qemu/TCG) as root, in a delegated scope. The tests read the cgroup
# version themselves (tests/it/common.rs) and expect the v2 driver's files and values.
#
# usage: tests/sdguest/it.sh [FILTER...]   (libtest filters; default: the tests CI runs on v2)
#
# Prints the guest's skips like scripts/test.sh does for the host run and fails on a failed
# test or an undeclared skip. Results (it output, it-skips.tsv, it-tests.txt, the journal) land
# in $SDGUEST_RESULTS (default: a new dir under the sdguest work dir).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

# What runs on v2 in CI (about the budget CI gives this step; see the README's table).
DEFAULT_FILTERS=(throttle:: cpu_mem:: lifecycle:: control:: daemon:: balance:: import::)
if [ $# -gt 0 ]; then filters=("$@"); else filters=("${DEFAULT_FILTERS[@]}"); fi

TARGET=$(cargo metadata --format-version 1 --no-deps |
	python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
cargo build --quiet --bin dbcage
BIN=$(cargo test --quiet --test it --no-run --message-format=json |
	python3 -c 'import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it" and m.get("executable"):
        print(m["executable"])')
[ -x "$BIN" ] || { echo "it.sh: no integration-test binary" >&2; exit 1; }

stage=$(mktemp -d /tmp/dbcage-test-it-v2.XXXXXX)
trap 'rm -rf "$stage"' EXIT
# Debug info stripped: the guest image is built from these.
strip --strip-debug -o "$stage/it" "$BIN"
strip --strip-debug -o "$stage/dbcage" "$TARGET/debug/dbcage"
cp tests/it/ioload.py "$stage/"
printf 'DBCAGE_BIN=%q\nIOLOAD=%q\nTARGET_TMP=%q\n' \
	"$TARGET/debug/dbcage" "$ROOT/tests/it/ioload.py" "$TARGET/tmp" >"$stage/it-paths.env"
printf '%s\n' "${filters[@]}" >"$stage/it-filters"
# The tests make loop disks; the guest has no /lib/modules (400 MB): its kernel's loop.ko from
# the harness's base layer goes in instead, or on a first run (no base layer yet) the modules.
work=${SDGUEST_WORK:-/var/tmp/dbcage-test-sdguest}
loop=$(find "$work/base/kroot/lib/modules" -path '*/kernel/drivers/block/loop.ko*' 2>/dev/null | head -n1)
if [ -n "$loop" ]; then cp "$loop" "$stage/"; else export GUEST_MODULES=1; fi

results=${SDGUEST_RESULTS:-$work/results/it-$(date +%Y%m%d-%H%M%S)}
rc=0
SDGUEST_PACKAGES="procps python3 e2fsprogs libelf1 zlib1g gcc libc6-dev" SDGUEST_MEM=${SDGUEST_MEM:-1536} \
	SDGUEST_DATA_DISKS=0 SDGUEST_TIMEOUT=${SDGUEST_TIMEOUT:-900} SDGUEST_RESULTS=$results \
	tests/sdguest/run.sh tests/sdguest/guest/it.sh "$stage"/* || rc=$?

log=$results/test.log
echo "== integration tests on cgroup v2 (systemd guest): $(grep -c . "$results/it-tests.txt" 2>/dev/null || echo 0) selected (${filters[*]})"
grep -E '^test result:|^IT-SECONDS=' "$log" 2>/dev/null || echo "(no test result: see $results)"
grep -E '^test .* FAILED$|^    [a-z_]+::[a-z_0-9]+$' "$log" 2>/dev/null | sort -u || true
echo "== skipped integration tests on cgroup v2 (test, declared?, reason)"
skips=$results/it-skips.tsv
if [ -s "$skips" ]; then sort "$skips" | sed 's/\t/  /g'; else echo "(none)"; fi
if grep -q $'\tUNDECLARED\t' "$skips" 2>/dev/null; then
	echo "undeclared skips on v2 above: make the test run on v2, or declare it in tests/it/skips.rs" >&2
	exit 1
fi
exit "$rc"
