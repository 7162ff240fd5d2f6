#!/bin/bash
# The integration-test binary (tests/it) on this cgroup v2 host under systemd: it runs in a
# scope of its own with Delegate=yes (the delegated subtree common.rs needs on v2), with the
# dbcage binary and ioload.py at the absolute paths compiled into it. Its output, the skip log
# and the list of tests come back in $SDGUEST_OUT.
set -u
F=$SDGUEST_FILES
# DBCAGE_BIN IOLOAD TARGET_TMP: the host checkout's paths.
. "$F/it-paths.env"
mkdir -p "$(dirname "$DBCAGE_BIN")" "$(dirname "$IOLOAD")" "$TARGET_TMP"
install -m755 "$F/dbcage" "$DBCAGE_BIN"
install -m644 "$F/ioload.py" "$IOLOAD"
rm -f "$TARGET_TMP/it-skips.tsv"
# Loop disks (LoopDisk, RawDisk in common.rs).
loop=$(ls "$F"/loop.ko* 2>/dev/null | head -n1)
if [ -n "$loop" ]; then insmod "$loop"; else modprobe loop; fi || echo "no loop module: the disk tests will fail"
mapfile -t filters <"$F/it-filters"
echo "cgroup: $(stat -fc %T /sys/fs/cgroup); controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
echo "kernel $(uname -r), $(nproc) cpus, $(free -m | awk '/Mem:/ {print $2}') MiB"
"$F/it" --list "${filters[@]}" 2>/dev/null | sed -n 's/: test$//p' >"$SDGUEST_OUT/it-tests.txt"
echo "running $(wc -l <"$SDGUEST_OUT/it-tests.txt") tests: ${filters[*]}"
start=$(date +%s)
# The scope holds only the test binary (systemd-run execs it), as common.rs requires.
systemd-run --scope -p Delegate=yes -p TasksMax=infinity --unit="dbcage-test-it-$$" --quiet \
	"$F/it" "${filters[@]}" --test-threads=1 --nocapture
rc=$?
echo "IT-SECONDS=$(($(date +%s) - start)) rc=$rc"
cp "$TARGET_TMP/it-skips.tsv" "$SDGUEST_OUT/" 2>/dev/null || true
exit $rc
