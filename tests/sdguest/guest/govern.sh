#!/bin/bash
# systemd::govern against systemd 252 (driven through examples/sdbus): a unit governed in place
# (first apply, idempotence, drift after `set-property` by hand, daemon-reloads and a restart),
# processes started outside systemd adopted into dbcage-TENANT.scope, and release.
# Run: tests/sdguest/govern.sh [v2|v1|all]
set -u
SDBUS=$SDGUEST_FILES/sdbus
fails=0
pass() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
eq() { if [ "$2" = "$3" ]; then pass "$1 = $3"; else fail "$1: got '$2', want '$3'"; fi; }
has() { case $2 in *"$3"*) pass "$1 mentions '$3'" ;; *) fail "$1: '$2' lacks '$3'" ;; esac; }
show() { systemctl show -p "$2" --value "$1"; }
ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }
repairs() { sed -n 's/^repairs=//p' <<<"$1"; }
V2=0; [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && V2=1
cpu_quota() { # the unit's cpu quota as the kernel holds it, in µs per 100 ms period
	if [ $V2 = 1 ]; then cut -d' ' -f1 "/sys/fs/cgroup$1/cpu.max"; else cat "/sys/fs/cgroup/cpu$1/cpu.cfs_quota_us"; fi
}

U=postgresql@15-main.service
systemctl start $U
PLAN=(CPUQuotaPerSecUSec=500000 CPUWeight=50 MemoryMax=536870912 "IOReadBandwidthMax=/dev/vdc 1048576, /dev/vdd 2097152"
	"IOWriteBandwidthMax=/dev/vdc 524288")
[ $V2 = 1 ] && PLAN+=(AllowedCPUs=1 MemoryHigh=402653184)

# --- first apply, then nothing to do
t0=$(ms)
out=$($SDBUS assert $U "${PLAN[@]}") || fail "assert: $out"
echo "timing: first assert $(( $(ms) - t0 )) ms"
eq "first apply sets every property" "$(repairs "$out")" "${#PLAN[@]}"
out=$($SDBUS assert $U "${PLAN[@]}")
eq "second assert repairs nothing" "$(repairs "$out")" "0"
CG=$(show $U ControlGroup)
eq "kernel quota" "$(cpu_quota "$CG")" "50000"

# --- drift: someone else's set-property, repaired
total=0
systemctl set-property --runtime $U CPUQuota=90% CPUWeight=200
eq "hand-set quota reached the kernel" "$(cpu_quota "$CG")" "90000"
t0=$(ms)
out=$($SDBUS assert $U "${PLAN[@]}")
echo "timing: drift repair $(( $(ms) - t0 )) ms"
echo "$out" | sed 's/^/  /'
eq "set-property drift repaired" "$(repairs "$out")" "2"
total=$((total + $(repairs "$out")))
has "repair names what changed" "$out" "repaired CPUQuotaPerSecUSec=500000 (was CPUQuotaPerSecUSec=900000)"
eq "kernel quota back" "$(cpu_quota "$CG")" "50000"
eq "show quota back" "$(show $U CPUQuotaPerSecUSec)" "500ms"

# --- daemon-reload: runtime properties live in /run/systemd/system.control and survive
t0=$(ms)
for i in $(seq 10); do systemctl daemon-reload; done
echo "timing: 10 daemon-reloads $(( $(ms) - t0 )) ms"
out=$($SDBUS assert $U "${PLAN[@]}")
eq "after 10 daemon-reloads nothing to repair" "$(repairs "$out")" "0"
eq "kernel quota after reloads" "$(cpu_quota "$CG")" "50000"

# --- restart: the new processes start in the unit with the limits
OLD=$(show $U MainPID)
systemctl restart $U
NEW=$(show $U MainPID)
[ "$OLD" != "$NEW" ] && pass "restart made a new main pid ($OLD -> $NEW)" || fail "restart kept pid $OLD"
kill -0 "$OLD" 2>/dev/null && fail "old main pid $OLD survived the restart" || pass "old main pid gone"
eq "new main pid in the unit" "$($SDBUS unit-of "$NEW" | grep ^bus=)" "bus=$U"
eq "kernel quota after restart" "$(cpu_quota "$CG")" "50000"
out=$($SDBUS assert $U "${PLAN[@]}")
eq "after restart nothing to repair" "$(repairs "$out")" "0"
n=$(systemctl status --no-pager $U | grep -c 'postgres')
[ "$n" -ge 4 ] && pass "systemctl status lists $n postgres processes" || fail "status lists $n postgres processes"

# --- adopt processes started outside systemd (this script's unit is shared: they are not its)
sleep 1000 &
a=$!
t0=$(ms)
out=$($SDBUS adopt dbcage-test-pg $a -- CPUQuotaPerSecUSec=200000 MemoryMax=268435456)
echo "timing: adopt (new scope) $(( $(ms) - t0 )) ms"
eq "first adopt starts the scope" "$out" "adopted=Started"
sleep 1000 &
b=$!
t0=$(ms)
out=$($SDBUS adopt dbcage-test-pg $b -- CPUQuotaPerSecUSec=200000 MemoryMax=268435456)
echo "timing: adopt (attach) $(( $(ms) - t0 )) ms"
eq "second adopt joins it" "$out" "adopted=Attached"
S=dbcage-dbcage-test-pg.scope
SCG=$(show $S ControlGroup)
eq "scope cgroup" "$SCG" "/dbcage.slice/$S"
for p in $a $b; do eq "pid $p in the scope" "$($SDBUS unit-of $p | grep ^bus=)" "bus=$S"; done
eq "scope kernel quota" "$(cpu_quota "$SCG")" "20000"
status=$(systemctl status --no-pager $S)
has "systemctl status of the scope" "$status" "$a"
has "systemctl status of the scope" "$status" "$b"

# --- release: defaults back, every process keeps running where it is
$SDBUS release $U "${PLAN[@]}" || fail "release $U"
eq "released quota" "$(show $U CPUQuotaPerSecUSec)" "infinity"
eq "released read limits" "$(show $U IOReadBandwidthMax)" ""
eq "postgres still running after release" "$(systemctl is-active $U)" "active"
eq "postgres main pid unchanged" "$(show $U MainPID)" "$NEW"
$SDBUS release $S CPUQuotaPerSecUSec=200000 MemoryMax=268435456 || fail "release $S"
eq "released scope quota" "$(show $S CPUQuotaPerSecUSec)" "infinity"
for p in $a $b; do
	kill -0 $p 2>/dev/null && pass "pid $p still running after release" || fail "pid $p ended by release"
	eq "pid $p still in the scope" "$($SDBUS unit-of $p | grep ^bus=)" "bus=$S"
done
kill $a $b
wait 2>/dev/null
echo "drift repairs counted: $total"
echo "RESULT: $fails failure(s)"
[ $fails = 0 ]
