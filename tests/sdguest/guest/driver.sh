#!/bin/bash
# dbcage under systemd (agent.manager = "auto" detects it): PostgreSQL 15 in its unit governed
# in place (limits as runtime unit properties, the instance-total IO split as per-device
# properties, no process moved out of the unit), a process started outside systemd adopted
# into dbcage-adhoc.scope, drift after set-property repaired by `apply` and by the daemon
# (with its metric), restart and stop of the database, the daemon stopped: nothing killed.
# Run: tests/sdguest/driver.sh [v2|v1]
set -u
fails=0
pass() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
eq() { if [ "$2" = "$3" ]; then pass "$1 = $3"; else fail "$1: got '$2', want '$3'"; fi; }
has() { case $2 in *"$3"*) pass "$1 mentions '$3'" ;; *) fail "$1: '$2' lacks '$3'" ;; esac; }
show() { systemctl show -p "$2" --value "$1"; }
ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }
unit_of() { sed -n 's/^0::\(.*\)$/\1/p; s/^1:name=systemd:\(.*\)$/\1/p' "/proc/$1/cgroup" | head -n1; }
V2=0; [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && V2=1
U=postgresql@15-main.service
systemctl start $U

mkdir -p /etc/dbcage
cat >/etc/dbcage/dbcage.toml <<'EOF'
[agent]
metrics = "127.0.0.1:9477"
[[tenant]]
name = "pg"
match = [{ exe = "/usr/lib/postgresql/15/bin/postgres", descendants = true }]
storage = ["/dev/vdc", "/dev/vdd"]
[tenant.io]
read_bps = "4MiB"
[tenant.cpu]
cores = 0.5
[tenant.memory]
max = "512MiB"
[[tenant]]
name = "adhoc"
match = [{ comm = '^dbcageadhoc$' }]
[tenant.cpu]
cores = 0.2
EOF
chmod 600 /etc/dbcage/dbcage.toml
cp /bin/sleep /usr/local/bin/dbcageadhoc
# Started from a login session (this guest has no pam_systemd: a session scope made by hand).
systemd-run --quiet --scope --unit=session-dbcagetest.scope --slice=user.slice /usr/local/bin/dbcageadhoc 1000 &
adhoc=$!
# ... and one in this test's own service, which runs other processes: never moved, not governed.
/usr/local/bin/dbcageadhoc 1000 &
shared=$!
sleep 1
PG_PIDS=$(systemctl show -p ControlGroup --value $U | xargs -I{} cat /sys/fs/cgroup{}/cgroup.procs 2>/dev/null ||
	pgrep -f /usr/lib/postgresql/15/bin/postgres)
[ $V2 = 1 ] || PG_PIDS=$(pgrep -f 'postgres')

out=$(dbcage check 2>&1)
echo "$out" | sed 's/^/  check: /'
has "check" "$out" "cgroup manager: systemd (agent.manager = \"auto\")"
out=$(dbcage plan 2>&1)
echo "$out" | sed 's/^/  plan: /'
has "plan" "$out" "set-property $U CPUQuotaPerSecUSec=500000"
has "plan" "$out" "adopt pids [$adhoc] into dbcage-adhoc.scope"
has "plan" "$out" "pids [$shared] run in sdguest-test.service, which also runs processes of no tenant: not governed"

t0=$(ms)
out=$(dbcage apply 2>&1) || fail "apply: $out"
echo "timing: apply $(( $(ms) - t0 )) ms"
echo "$out" | sed 's/^/  apply: /'
eq "unit CPUQuotaPerSecUSec" "$(show $U CPUQuotaPerSecUSec)" "500ms"
eq "unit MemoryMax" "$(show $U MemoryMax)" "536870912"
eq "unit IOReadBandwidthMax (4 MiB split over 2 disks)" "$(show $U IOReadBandwidthMax | tr '\n' ' ')" "/dev/vdc 2097152 /dev/vdd 2097152 "
CG=$(show $U ControlGroup)
if [ $V2 = 1 ]; then
	eq "kernel cpu.max" "$(cat /sys/fs/cgroup$CG/cpu.max)" "50000 100000"
	has "kernel io.max" "$(cat /sys/fs/cgroup$CG/io.max)" "$(cat /sys/block/vdc/dev) rbps=2097152"
else
	eq "kernel cfs_quota_us" "$(cat /sys/fs/cgroup/cpu$CG/cpu.cfs_quota_us)" "50000"
fi
for p in $(pgrep -f /usr/lib/postgresql/15/bin/postgres; pgrep -f 'postgres: '); do
	case $(unit_of $p) in *"$U"*) ;; *) fail "postgres pid $p left its unit: $(unit_of $p)" ;; esac
done
pass "every postgres process is in $U"
eq "adhoc adopted" "$(unit_of $adhoc)" "/dbcage.slice/dbcage-adhoc.scope"
eq "scope quota" "$(show dbcage-adhoc.scope CPUQuotaPerSecUSec)" "200ms"
eq "process in a shared service left there" "$(unit_of $shared)" "/system.slice/sdguest-test.service"
eq "scope Delegate" "$(show dbcage-adhoc.scope Delegate)" "yes"
[ -e /sys/fs/cgroup/dbcage ] || [ -e /sys/fs/cgroup/cpu/dbcage ] && fail "dbcage made its own cgroup tree" ||
	pass "no /sys/fs/cgroup/dbcage: dbcage wrote no cgroup of its own"
out=$(dbcage plan 2>&1)
has "second plan" "$out" "no changes"

# --- drift: set-property by someone else, repaired by apply
systemctl set-property --runtime $U CPUQuota=90%
out=$(dbcage apply 2>&1)
eq "drift repaired by apply" "$(show $U CPUQuotaPerSecUSec)" "500ms"

# --- the daemon: drift repaired within its rescan, counted in dbcage_systemd_repairs
systemd-run --unit=dbcage-test-daemon /usr/sbin/dbcage run --rescan-interval 1s >/dev/null 2>&1
sleep 4
systemctl set-property --runtime $U CPUQuota=80% CPUWeight=300
t0=$(ms)
ok=0
for i in $(seq 100); do
	[ "$(show $U CPUQuotaPerSecUSec)" = 500ms ] && [ "$(show $U CPUWeight)" = "[not set]" ] && { ok=1; break; }
	sleep 0.1
done
echo "timing: daemon repaired set-property drift in $(( $(ms) - t0 )) ms"
eq "daemon repaired the drift" "$ok" "1"
metrics=$(exec 3<>/dev/tcp/127.0.0.1/9477; printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3; cat <&3)
echo "$metrics" | grep dbcage_systemd_repairs | sed 's/^/  metric: /'
n=$(echo "$metrics" | sed -n 's/^dbcage_systemd_repairs_total[{}]* \([0-9]*\).*/\1/p')
[ "${n:-0}" -ge 2 ] && pass "dbcage_systemd_repairs_total = $n" || fail "dbcage_systemd_repairs_total = '$n'"
t0=$(ms)
for i in $(seq 10); do systemctl daemon-reload; done
echo "timing: 10 daemon-reloads $(( $(ms) - t0 )) ms"
sleep 2
eq "after 10 daemon-reloads" "$(show $U CPUQuotaPerSecUSec)" "500ms"

# --- restart and stop of the database with the daemon running
OLD=$(show $U MainPID)
systemctl restart $U
NEW=$(show $U MainPID)
kill -0 $OLD 2>/dev/null && fail "old postgres $OLD survived restart" || pass "restart ended the old postmaster"
sleep 2
eq "new postmaster in its unit" "$(unit_of $NEW)" "$CG"
eq "quota after restart" "$(show $U CPUQuotaPerSecUSec)" "500ms"
systemctl stop $U
left=$(pgrep -f /usr/lib/postgresql/15/bin/postgres | wc -l)
eq "postgres processes left after stop" "$left" "0"
systemctl start $U

# --- the daemon stopped: nothing killed, nothing moved
systemctl stop dbcage-test-daemon
sleep 1
eq "postgres active after the daemon stopped" "$(systemctl is-active $U)" "active"
kill -0 $adhoc && pass "adopted process still running" || fail "adopted process gone"
eq "adopted process still in its scope" "$(unit_of $adhoc)" "/dbcage.slice/dbcage-adhoc.scope"
journalctl -b -u dbcage-test-daemon --no-pager -o cat | grep -E 'unit property|adopted|manages' | head -8 | sed 's/^/  daemon: /'
# --- release: systemd's defaults back, every process left where it is
out=$(dbcage release --all 2>&1) || fail "release: $out"
echo "$out" | sed 's/^/  release: /'
eq "released unit quota" "$(show $U CPUQuotaPerSecUSec)" "infinity"
eq "released unit IO" "$(show $U IOReadBandwidthMax)" ""
eq "released scope quota" "$(show dbcage-adhoc.scope CPUQuotaPerSecUSec)" "infinity"
eq "postgres active after release" "$(systemctl is-active $U)" "active"
eq "adopted process still in its scope after release" "$(unit_of $adhoc)" "/dbcage.slice/dbcage-adhoc.scope"
for p in $(pgrep -f /usr/lib/postgresql/15/bin/postgres); do
	case $(unit_of $p) in *"$U"*) ;; *) fail "postgres pid $p outside its unit at the end: $(unit_of $p)" ;; esac
done
kill $adhoc $shared
echo "RESULT: $fails failure(s)"
[ $fails = 0 ]
