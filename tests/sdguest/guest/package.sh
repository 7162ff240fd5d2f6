#!/bin/bash
# Issue 19's scenario 6: the packaged .deb (scripts/build-deb.sh), installed with dpkg in the
# guest root (SDGUEST_DEB), started as an admin would: a policy in /etc/dbcage, then
# `systemctl enable --now dbcage`. The hardened unit as shipped must work under systemd on
# cgroup v2, and on v1 (SDGUEST_CGROUP=v1: systemd.unified_cgroup_hierarchy=0, RHEL 7/8 style,
# systemd also manages the cpu, memory and blkio hierarchies):
#   - postgresql@15-main.service, governed by the postgres preset, and a second tenant that pins
#     cpus and has a memory limit, whose process was started in a login session (adopted into
#     dbcage-pinned.scope): both limited, in the kernel files and in `systemctl show`;
#   - no EPERM (or any other permission error) in dbcage's journal, no "NOT LIMITED" in status (v2);
#   - on v1 the pinned tenant's cpus cannot be applied (systemd has no cpuset there): the daemon
#     still starts and limits its quota and memory, and check, plan, the journal and status say
#     the cpus are not applied and why (status: NOT LIMITED for cpuset on that tenant alone);
#   - `systemctl stop dbcage` leaves both running, in their units, limited;
#   - `systemctl start dbcage` converges again: nothing moved, one scope, nothing to repair;
#   - `dpkg -i` of the package while it runs (an upgrade) restarts the daemon, and the same holds.
# Ends with `systemctl disable --now dbcage` and `dbcage release --all`, so that a script run after it
# in the same guest (guest/systemd.sh) starts from a host without dbcage's limits.
# Run: tests/sdguest/package.sh [DEB], or first in tests/sdguest/systemd.sh DEB.
set -u
fails=0
pass() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
eq() { if [ "$2" = "$3" ]; then pass "$1 = $3"; else fail "$1: got '$2', want '$3'"; fi; }
has() { case $2 in *"$3"*) pass "$1 mentions '$3'" ;; *) fail "$1: '$2' lacks '$3'" ;; esac; }
show() { systemctl show -p "$2" --value "$1"; }
# cgroup v2, or v1: a process's unit is its name=systemd group on v1 (its 0:: line on v2); the
# kernel's values are in the unit's groups of the v1 cpu, memory and blkio hierarchies there
# (as guest/systemd.sh reads them).
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then V=2 SD=/sys/fs/cgroup; else V=1 SD=/sys/fs/cgroup/systemd; fi
cg_of() { sed -n 's/^0::\(.*\)$/\1/p; s/^[0-9]*:name=systemd:\(.*\)$/\1/p' "/proc/$1/cgroup" 2>/dev/null | tail -n1; }
quota_of() { # quota_of CGROUP: its CPU quota as cpu.max says it ("50000 100000", "max 100000")
	if [ $V = 2 ]; then cat "/sys/fs/cgroup$1/cpu.max" 2>&1; return; fi
	local q
	q=$(cat "/sys/fs/cgroup/cpu$1/cpu.cfs_quota_us" 2>&1)
	[ "$q" = -1 ] && q=max
	echo "$q $(cat "/sys/fs/cgroup/cpu$1/cpu.cfs_period_us" 2>&1)"
}
mem_of() { # mem_of CGROUP: its memory limit in bytes (memory.max, v1 memory.limit_in_bytes)
	if [ $V = 2 ]; then cat "/sys/fs/cgroup$1/memory.max" 2>&1; else cat "/sys/fs/cgroup/memory$1/memory.limit_in_bytes" 2>&1; fi
}
read_bps_of() { # read_bps_of CGROUP: its read bandwidth limits as "MAJ:MIN BYTES" lines
	if [ $V = 2 ]; then sed -n 's/^\([0-9:]*\) rbps=\([0-9]*\).*/\1 \2/p' "/sys/fs/cgroup$1/io.max" 2>&1
	else cat "/sys/fs/cgroup/blkio$1/blkio.throttle.read_bps_device" 2>&1; fi
}
# What dbcage says of the pinned tenant's cpus on v1 (check, plan, the daemon's log).
CPUS_V1="tenant pinned: not applied through systemd: cpu.cpus / numa_nodes: systemd has no cpuset on cgroup v1"
ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }
figure() { echo "figure: $*"; [ -z "${SDGUEST_OUT:-}" ] || echo "$*" >>"$SDGUEST_OUT/figures.txt"; }
metric() { # metric NAME TENANT: its value (or without labels when TENANT is empty)
	local m
	m=$(exec 3<>/dev/tcp/127.0.0.1/9478 && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && cat <&3)
	sed -n "s/^$1\(_total\)\?\(${2:+\{tenant=\"$2\"\}}\)\? \([0-9.e+]*\)$/\3/p" <<<"$m" | head -n1
}
pg_pids() { pgrep -f '^/usr/lib/postgresql/15/bin/postgres|^postgres: '; }
# Every long-lived postgres process and the dbcagepinned process with its cgroup and title:
# nothing may be killed or moved. Autovacuum and parallel workers come and go by themselves (a
# run failed "after the upgrade" on a worker that had started since the snapshot before).
snapshot() {
	local p title
	for p in $(pg_pids) $(pgrep -x dbcagepinned); do
		title=$(cat /proc/"$p"/cmdline 2>/dev/null | tr '\0' ' ')
		[ -n "$title" ] || continue
		case $title in *"autovacuum worker"* | *"parallel worker"*) continue ;; esac
		echo "$p $(cg_of "$p") ${title% }"
	done | sort -n
}
# Permission errors in dbcage's journal since $1 (epoch s): the unit's sandbox or capabilities.
denials() {
	journalctl -b -u dbcage.service --no-pager -o cat --since "@$1" |
		grep -iE 'permission denied|operation not permitted|EPERM|EACCES|access denied|read-only file system'
}

echo "cgroup v$V"
U=postgresql@15-main.service
PIN=dbcage-pinned.scope

# ---------------------------------------------------------------- the package as installed
eq "dpkg status of dbcage" "$(dpkg-query -W -f='${Status}' dbcage 2>&1)" "install ok installed"
eq "packaged unit file" "$(systemctl show -p FragmentPath --value dbcage.service)" "/lib/systemd/system/dbcage.service"
# The package starts and enables nothing: the admin writes the policy first.
eq "dbcage enabled after install" "$(systemctl is-enabled dbcage.service 2>&1)" "disabled"
eq "dbcage active after install" "$(systemctl is-active dbcage.service 2>&1)" "inactive"
eq "/etc/dbcage mode" "$(stat -c '%a %U' /etc/dbcage)" "700 root"
eq "/etc/dbcage/dbcage.toml mode" "$(stat -c '%a %U' /etc/dbcage/dbcage.toml)" "600 root"

systemctl start $U || fail "systemctl start $U"
CG=$(show $U ControlGroup)
DATA=/var/lib/postgresql/15/main
VDA=$(cat /sys/block/vda/dev)

# The admin's policy (over the example the package installed).
cat >/etc/dbcage/dbcage.toml <<EOF
[agent]
metrics = "127.0.0.1:9478"

[[tenant]]
name = "pg15main"
preset = "postgres"
data_dir = "$DATA"
[tenant.io]
read_bps = "4MiB"
[tenant.cpu]
cores = 0.5
[tenant.memory]
max = "512MiB"

[[tenant]]
name = "pinned"
match = [{ comm = '^dbcagepinned$' }]
[tenant.cpu]
cpus = "1"
cores = 0.25
[tenant.memory]
max = "64MiB"
EOF
out=$(dbcage check 2>&1) || fail "dbcage check: $out"
echo "$out" | sed 's/^/  check: /'
has "check" "$out" "cgroup manager: systemd"
if [ $V = 1 ]; then
	has "check on v1" "$out" "$CPUS_V1"
	has "plan on v1" "$(dbcage plan 2>&1)" "$CPUS_V1"
fi

# The second tenant's process, started from a login session before the daemon (this guest has
# no pam_systemd: the session's scope is made with systemd-run, as logind would).
cp /bin/sleep /usr/local/bin/dbcagepinned
systemd-run --quiet --scope --unit=session-dbcagepkg.scope --slice=user.slice \
	/usr/local/bin/dbcagepinned 100000 &
for _ in $(seq 50); do pin=$(pgrep -x dbcagepinned) && break; sleep 0.1; done
[ -n "${pin:-}" ] || fail "dbcagepinned did not start"

# ---------------------------------------------------------------- enable --now
since=$(date +%s)
t0=$(ms)
systemctl enable --now dbcage.service || fail "systemctl enable --now dbcage"
figure "systemctl enable --now dbcage (Type=notify: returns after the first plan is applied): $(( $(ms) - t0 )) ms"
eq "dbcage active" "$(systemctl is-active dbcage.service)" "active"
eq "dbcage enabled" "$(systemctl is-enabled dbcage.service)" "enabled"
journalctl -b -u dbcage.service --no-pager -o cat | tail -n 20 | sed 's/^/  journal: /'
d=$(denials "$since")
[ -z "$d" ] && pass "no permission errors in dbcage's journal" || { fail "permission errors in dbcage's journal:"; echo "$d" | sed 's/^/  /'; }
if [ $V = 1 ]; then
	has "dbcage's journal on v1" "$(journalctl -b -u dbcage.service --no-pager -o cat --since "@$since")" "$CPUS_V1"
fi
# The first adoption waits for systemd's StartTransientUnit job: up to 5 s for the scope.
for _ in $(seq 50); do [ "$(cg_of "$pin")" = "/dbcage.slice/$PIN" ] && break; sleep 0.1; done

check_limited() { # check_limited WHEN: both tenants limited, in the kernel and on their units
	local w=$1 p c bad=0
	# postgres: every process in its unit, the unit's properties and cgroup files hold the plan.
	# (A process that exited between pgrep and the read has no cgroup left to judge.)
	for p in $(pg_pids); do
		c=$(cg_of "$p")
		[ -z "$c" ] || [ "$c" = "$CG" ] || { bad=$((bad + 1)); echo "  pid $p in $c"; }
	done
	eq "$w: postgres processes outside $U" "$bad" "0"
	eq "$w: $U CPUQuotaPerSecUSec" "$(show $U CPUQuotaPerSecUSec)" "500ms"
	eq "$w: $U MemoryMax" "$(show $U MemoryMax)" "536870912"
	eq "$w: $U IOReadBandwidthMax" "$(show $U IOReadBandwidthMax)" "/dev/vda 4194304"
	eq "$w: kernel cpu quota of $U (v$V)" "$(quota_of $CG)" "50000 100000"
	eq "$w: kernel memory limit of $U (v$V)" "$(mem_of $CG)" "536870912"
	has "$w: kernel read bps limit of $U (v$V)" "$(read_bps_of $CG)" "$VDA 4194304"
	# pinned: adopted into its scope, cpus (v2), quota and memory there.
	eq "$w: cgroup of dbcagepinned" "$(cg_of "$pin")" "/dbcage.slice/$PIN"
	eq "$w: $PIN MemoryMax" "$(show $PIN MemoryMax)" "67108864"
	eq "$w: $PIN CPUQuotaPerSecUSec" "$(show $PIN CPUQuotaPerSecUSec)" "250ms"
	eq "$w: kernel memory limit of $PIN (v$V)" "$(mem_of /dbcage.slice/$PIN)" "67108864"
	eq "$w: kernel cpu quota of $PIN (v$V)" "$(quota_of /dbcage.slice/$PIN)" "25000 100000"
	if [ $V = 2 ]; then
		eq "$w: $PIN AllowedCPUs" "$(show $PIN AllowedCPUs)" "1"
		eq "$w: kernel cpuset.cpus.effective of $PIN" "$(cat /sys/fs/cgroup/dbcage.slice/$PIN/cpuset.cpus.effective 2>&1)" "1"
		eq "$w: dbcagepinned's allowed cpus" "$(sed -n 's/^Cpus_allowed_list:\s*//p' /proc/$pin/status)" "1"
	else
		# Not applied (said by check, plan, the journal and status): nothing set, nothing half done.
		eq "$w: $PIN AllowedCPUs (v1: not applied)" "$(show $PIN AllowedCPUs)" ""
		eq "$w: dbcagepinned's allowed cpus (v1: not applied)" "$(sed -n 's/^Cpus_allowed_list:\s*//p' /proc/$pin/status)" "$(cat /sys/devices/system/cpu/online)"
	fi
	eq "$w: dbcage scopes" "$(systemctl list-units --all --no-legend --plain 'dbcage-*.scope' | awk '$3 != "inactive" {print $1}' | tr '\n' ' ')" "$PIN "
}
check_limited "enable --now"
# status: no NOT LIMITED note on v2; on v1 the pinned tenant's line says its cpuset is not
# limited, and why (a user must see that its cpus are not applied), postgres's says nothing.
status_notes() { # status_notes WHEN OUT
	local pg pinned
	pg=$(grep '^pg15main ' <<<"$2")
	pinned=$(grep '^pinned ' <<<"$2")
	case $pg in *"NOT LIMITED"*) fail "$1: status says NOT LIMITED for pg15main" ;; *) pass "$1: status: no NOT LIMITED note for pg15main" ;; esac
	if [ $V = 2 ]; then
		case $pinned in *"NOT LIMITED"*) fail "$1: status says NOT LIMITED for pinned" ;; *) pass "$1: status: no NOT LIMITED note for pinned" ;; esac
	else
		eq "$1: status of pinned on v1" "$(grep -o 'NOT LIMITED[^)]*)' <<<"$pinned")" \
			"NOT LIMITED, no controller (limited: cpuset: systemd has no cpuset on cgroup v1)"
	fi
}
out=$(dbcage status 2>&1)
echo "$out" | sed 's/^/  status: /'
status_notes "enable --now" "$out"
has "status" "$out" "in $U"
has "status" "$out" "in $PIN"
has "status" "$out" "daemon: running"
eq "nothing left in the session scope" "$(cat $SD/user.slice/session-dbcagepkg.scope/cgroup.procs 2>/dev/null)" ""

# ---------------------------------------------------------------- stop: databases stay limited
before=$(snapshot)
echo "$before" | sed 's/^/  before stop: /'
systemctl stop dbcage.service || fail "systemctl stop dbcage"
eq "dbcage after stop" "$(systemctl is-active dbcage.service)" "inactive"
sleep 1
eq "after stop: postgres and dbcagepinned processes and their cgroups" "$(snapshot)" "$before"
eq "after stop: $U" "$(systemctl is-active $U)" "active"
eq "after stop: $PIN" "$(systemctl is-active $PIN)" "active"
check_limited "after stop"

# ---------------------------------------------------------------- start again: converges
since=$(date +%s)
t0=$(ms)
systemctl start dbcage.service || fail "systemctl start dbcage"
figure "systemctl start dbcage again: $(( $(ms) - t0 )) ms"
sleep 2
eq "after start: postgres and dbcagepinned processes and their cgroups" "$(snapshot)" "$before"
check_limited "start again"
eq "repairs after the start (nothing drifted)" "$(metric dbcage_systemd_repairs '')" "0"
d=$(denials "$since")
[ -z "$d" ] && pass "no permission errors after the start again" || { fail "permission errors after the start again:"; echo "$d" | sed 's/^/  /'; }
status_notes "after start" "$(dbcage status 2>&1)"

# ---------------------------------------------------------------- upgrade: dpkg -i while running
# An upgrade (here the same package again) restarts a running daemon, so that the new binary
# runs (stopping leaves every limit in place, as above); nothing is moved or killed.
deb=$(ls "$SDGUEST_FILES"/*.deb 2>/dev/null | head -n1)
if [ -z "$deb" ]; then
	fail "no .deb in $SDGUEST_FILES for the upgrade check"
else
	old_pid=$(show dbcage.service MainPID)
	since=$(date +%s)
	t0=$(ms)
	DEBIAN_FRONTEND=noninteractive dpkg -i --force-confold "$deb" >/tmp/dbcage-test-dpkg.log 2>&1 ||
		{ fail "dpkg -i (upgrade)"; sed 's/^/  dpkg: /' /tmp/dbcage-test-dpkg.log; }
	figure "dpkg -i of the package over itself, dbcage running: $(( $(ms) - t0 )) ms"
	eq "after the upgrade: dbcage" "$(systemctl is-active dbcage.service)" "active"
	new_pid=$(show dbcage.service MainPID)
	[ "$new_pid" != "$old_pid" ] && pass "the upgrade restarted the daemon ($old_pid -> $new_pid)" ||
		fail "the upgrade left the old daemon ($old_pid) running the replaced binary"
	eq "after the upgrade: policy kept" "$(grep -c pg15main /etc/dbcage/dbcage.toml)" "1"
	sleep 2
	eq "after the upgrade: postgres and dbcagepinned processes and their cgroups" "$(snapshot)" "$before"
	check_limited "after the upgrade"
	eq "repairs after the upgrade (nothing drifted)" "$(metric dbcage_systemd_repairs '')" "0"
	d=$(denials "$since")
	[ -z "$d" ] && pass "no permission errors after the upgrade" || { fail "permission errors after the upgrade:"; echo "$d" | sed 's/^/  /'; }
fi

# ---------------------------------------------------------------- leave the host as found
systemctl disable --now dbcage.service >/dev/null 2>&1 || fail "systemctl disable --now dbcage"
kill "$pin"
out=$(dbcage release --all 2>&1) || fail "dbcage release --all: $out"
echo "$out" | sed 's/^/  release: /'
for _ in $(seq 50); do systemctl is-active --quiet $PIN || break; sleep 0.1; done
eq "after release: $U CPUQuotaPerSecUSec" "$(show $U CPUQuotaPerSecUSec)" "infinity"
eq "after release: $U" "$(systemctl is-active $U)" "active"
rm -f /usr/local/bin/dbcagepinned
echo "RESULT: $fails failure(s)"
[ $fails = 0 ]
