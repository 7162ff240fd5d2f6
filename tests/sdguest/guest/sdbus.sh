#!/bin/bash
# dbcage's systemd client (src/systemd/, driven through examples/sdbus) against systemd 252:
# every call is checked against `systemctl show` and the kernel's cgroup files.
# Run: tests/sdguest/sdbus.sh (builds the example and boots the guest).
set -u
SDBUS=$SDGUEST_FILES/sdbus
fails=0
pass() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
eq() { # eq WHAT GOT WANT
	if [ "$2" = "$3" ]; then pass "$1 = $3"; else fail "$1: got '$2', want '$3'"; fi
}
has() { # has WHAT TEXT NEEDLE
	case $2 in *"$3"*) pass "$1 mentions '$3'" ;; *) fail "$1: '$2' lacks '$3'" ;; esac
}
show() { systemctl show -p "$2" --value "$1"; }
ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }
V2=0; [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && V2=1

eq "detect" "$($SDBUS detect)" "systemd=true"

U=postgresql@15-main.service
systemctl start $U
MAIN=$(show $U MainPID)
CG=$(show $U ControlGroup)
out=$($SDBUS unit-of "$MAIN")
has "unit-of $MAIN (bus)" "$out" "bus=$U"
has "unit-of $MAIN (/proc)" "$out" "proc=$U"
has "show ControlGroup" "$($SDBUS show $U)" "ControlGroup=$CG"

# --- SetUnitProperties(runtime) -> systemctl show and the kernel agree
VDC=$(cat /sys/block/vdc/dev)
VDD=$(cat /sys/block/vdd/dev)
t0=$(ms)
if [ $V2 = 1 ]; then
	$SDBUS set $U CPUQuotaPerSecUSec=500000 CPUWeight=50 MemoryMax=268435456 MemoryHigh=201326592 \
		MemoryLow=1048576 MemorySwapMax=0 "IOReadBandwidthMax=/dev/vdc 1048576" \
		"IOWriteIOPSMax=/dev/vdd 50" AllowedCPUs=1 || fail "set on $U"
else
	$SDBUS set $U CPUQuotaPerSecUSec=500000 CPUWeight=50 MemoryMax=268435456 \
		"IOReadBandwidthMax=/dev/vdc 1048576" "IOWriteIOPSMax=/dev/vdd 50" || fail "set on $U"
fi
echo "timing: set-properties $(( $(ms) - t0 )) ms"
eq "show CPUQuotaPerSecUSec" "$(show $U CPUQuotaPerSecUSec)" "500ms"
eq "show CPUWeight" "$(show $U CPUWeight)" "50"
eq "show MemoryMax" "$(show $U MemoryMax)" "268435456"
eq "show IOReadBandwidthMax" "$(show $U IOReadBandwidthMax)" "/dev/vdc 1048576"
eq "show IOWriteIOPSMax" "$(show $U IOWriteIOPSMax)" "/dev/vdd 50"
mine=$($SDBUS show $U)
has "sdbus show" "$mine" "CPUQuotaPerSecUSec=500000"
has "sdbus show" "$mine" "IOReadBandwidthMax=/dev/vdc 1048576"
K=/sys/fs/cgroup$CG
if [ $V2 = 1 ]; then
	eq "show MemoryHigh" "$(show $U MemoryHigh)" "201326592"
	eq "show MemoryLow" "$(show $U MemoryLow)" "1048576"
	eq "show MemorySwapMax" "$(show $U MemorySwapMax)" "0"
	eq "show AllowedCPUs" "$(show $U AllowedCPUs)" "1"
	has "sdbus show" "$mine" "AllowedCPUs=1"
	eq "kernel cpu.max" "$(cat $K/cpu.max)" "50000 100000"
	eq "kernel cpu.weight" "$(cat $K/cpu.weight)" "50"
	eq "kernel memory.max" "$(cat $K/memory.max)" "268435456"
	eq "kernel memory.high" "$(cat $K/memory.high)" "201326592"
	eq "kernel memory.low" "$(cat $K/memory.low)" "1048576"
	eq "kernel memory.swap.max" "$(cat $K/memory.swap.max)" "0"
	eq "kernel cpuset.cpus" "$(cat $K/cpuset.cpus)" "1"
	has "kernel io.max" "$(cat $K/io.max)" "$VDC rbps=1048576 wbps=max riops=max wiops=max"
	has "kernel io.max" "$(cat $K/io.max)" "$VDD rbps=max wbps=max riops=max wiops=50"
else
	eq "kernel cpu.cfs_quota_us" "$(cat /sys/fs/cgroup/cpu$CG/cpu.cfs_quota_us)" "50000"
	eq "kernel memory.limit_in_bytes" "$(cat /sys/fs/cgroup/memory$CG/memory.limit_in_bytes)" "268435456"
	has "kernel blkio read_bps" "$(cat /sys/fs/cgroup/blkio$CG/blkio.throttle.read_bps_device)" "$VDC 1048576"
fi
# the runtime drop-in is where systemd keeps them
ls /run/systemd/system.control/$U.d/ | sed 's/^/  drop-in: /'

# --- errors name the unit, the property and systemd's error
err=$($SDBUS set nosuch-dbcage-test.service CPUWeight=5 2>&1) && fail "set on a missing unit succeeded"
has "missing unit error" "$err" "nosuch-dbcage-test.service"
has "missing unit error" "$err" "org.freedesktop.systemd1.NoSuchUnit"
has "missing unit error" "$err" "CPUWeight=5"
# (CPUWeight=0 is "idle" since systemd 252; 10001 is out of range)
err=$($SDBUS set $U CPUWeight=10001 2>&1) && fail "CPUWeight=10001 accepted"
has "out-of-range error" "$err" "CPUWeight=10001"
has "out-of-range error" "$err" "org.freedesktop.DBus.Error.InvalidArgs"
eq "refused call changed nothing" "$(show $U CPUWeight)" "50"

# --- reset to systemd's defaults (what release does)
$SDBUS set $U CPUQuotaPerSecUSec=infinity "CPUWeight=[not set]" MemoryMax=infinity \
	IOReadBandwidthMax= IOWriteIOPSMax= || fail "reset"
eq "reset CPUQuotaPerSecUSec" "$(show $U CPUQuotaPerSecUSec)" "infinity"
eq "reset IOReadBandwidthMax" "$(show $U IOReadBandwidthMax)" ""
if [ $V2 = 1 ]; then
	$SDBUS set $U MemoryHigh=infinity MemoryLow=0 MemorySwapMax=infinity AllowedCPUs= || fail "reset v2"
	# systemd disables a controller no unit in the subtree needs: the file goes, or shows the default
	eq "reset kernel cpu.max" "$(cat $K/cpu.max 2>/dev/null || echo 'max 100000')" "max 100000"
	eq "reset kernel cpu.weight" "$(cat $K/cpu.weight 2>/dev/null || echo 100)" "100"
	eq "reset kernel memory.max" "$(cat $K/memory.max 2>/dev/null || echo max)" "max"
	eq "reset kernel io.max" "$(cat $K/io.max)" ""
else
	eq "reset kernel cpu.cfs_quota_us" "$(cat /sys/fs/cgroup/cpu$CG/cpu.cfs_quota_us 2>/dev/null || echo -1)" "-1"
fi
eq "postgres still in its unit" "$($SDBUS unit-of "$MAIN" | grep '^bus=')" "bus=$U"

# --- adopting processes started outside systemd into dbcage-TENANT.scope
sleep 1000 &
a=$!
sleep 1000 &
b=$!
t0=$(ms)
out=$($SDBUS scope dbcage-test-t1 $a $b -- MemoryMax=134217728 CPUWeight=20) || fail "scope: $out"
echo "timing: start-scope (incl. exec of sdbus) $(( $(ms) - t0 )) ms; $out"
S=dbcage-dbcage-test-t1.scope
eq "scope active" "$(systemctl is-active $S)" "active"
eq "scope slice" "$(show $S Slice)" "dbcage.slice"
eq "scope Delegate" "$(show $S Delegate)" "yes"
eq "scope MemoryMax" "$(show $S MemoryMax)" "134217728"
SCG=$(show $S ControlGroup)
eq "scope cgroup" "$SCG" "/dbcage.slice/$S"
for p in $a $b; do
	has "pid $p cgroup" "$(cat /proc/$p/cgroup)" "/dbcage.slice/$S"
	eq "pid $p unit (bus)" "$($SDBUS unit-of $p | grep '^bus=')" "bus=$S"
done
status=$(systemctl status --no-pager $S)
has "systemctl status" "$status" "$a"
has "systemctl status" "$status" "$b"
if [ $V2 = 1 ]; then
	eq "scope kernel memory.max" "$(cat /sys/fs/cgroup$SCG/memory.max)" "134217728"
	# Delegate=yes: the scope's subtree is ours; a leaf with controllers can be made below it.
	mkdir /sys/fs/cgroup$SCG/limited && echo $b >/sys/fs/cgroup$SCG/limited/cgroup.procs &&
		echo $a >/sys/fs/cgroup$SCG/limited/cgroup.procs &&
		echo +memory >/sys/fs/cgroup$SCG/cgroup.subtree_control || fail "delegated subtree not writable"
	has "delegated leaf controllers" "$(cat /sys/fs/cgroup$SCG/limited/cgroup.controllers)" "memory"
	eq "pid in the leaf still in the scope" "$($SDBUS unit-of $b | grep '^bus=')" "bus=$S"
fi
err=$($SDBUS scope dbcage-test-t1 $a 2>&1) && fail "a second scope of the same name started"
has "duplicate scope error" "$err" "org.freedesktop.systemd1.UnitExists"
err=$($SDBUS scope dbcage-test-t2 999999 2>&1) && fail "scope of a missing pid started"
has "missing pid error" "$err" "dbcage-dbcage-test-t2.scope"
echo "  $err"
t0=$(ms)
$SDBUS stop $S || fail "stop $S"
echo "timing: stop-scope (incl. exec of sdbus) $(( $(ms) - t0 )) ms"
eq "scope gone after stop" "$(systemctl is-active $S)" "inactive"
sleep 0.2
kill -0 $a 2>/dev/null && fail "pid $a survived the scope's stop" || pass "stop ended the scope's processes"
$SDBUS reset-failed $S 2>&1 | grep -q NoSuchUnit && pass "reset-failed of a gone unit: NoSuchUnit" ||
	pass "reset-failed accepted"
wait 2>/dev/null

# --- what zbus's blocking API brings into a process
th=$($SDBUS threads)
echo "$th" | sed 's/^/  threads: /'
echo "$th" >"$SDGUEST_OUT/threads.txt"

echo "RESULT: $fails failure(s)"
[ $fails = 0 ]
