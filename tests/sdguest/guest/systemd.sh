#!/bin/bash
# Issue 19's scenarios with the daemon (`dbcage run`) on a real systemd host, PostgreSQL 15 in
# postgresql@15-main.service, the tenant's limits on the unit:
#   1. status and the metrics read the limits and usage back from the unit's cgroup;
#   2. `systemctl restart`: every postgres process stays in its unit and is limited, sampled
#      every 100 ms; a postmaster started outside systemd (pg_ctl in a login session) is adopted
#      into dbcage-pg.scope by the daemon's event path within 1 s (the rescan is 60 s away);
#   5. kill -9 of the daemon and a restart: nothing killed or moved, no duplicate scope, limits
#      in force;
#   3. 100 daemon-reloads, restarts of an unrelated unit with its own IO limits, and
#      set-property on the database's unit by hand: within 2 s the kernel and the unit's
#      properties are back to the plan, the repairs metric counts exactly the repairs.
# Figures go to $SDGUEST_OUT/figures.txt. Run: tests/sdguest/systemd.sh
set -u
fails=0
pass() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
eq() { if [ "$2" = "$3" ]; then pass "$1 = $3"; else fail "$1: got '$2', want '$3'"; fi; }
has() { case $2 in *"$3"*) pass "$1 mentions '$3'" ;; *) fail "$1: '$2' lacks '$3'" ;; esac; }
figure() { echo "figure: $*"; echo "$*" >>"$SDGUEST_OUT/figures.txt"; }
show() { systemctl show -p "$2" --value "$1"; }
ms() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }
cg_of() { sed -n 's/^0::\(.*\)$/\1/p' "/proc/$1/cgroup" 2>/dev/null; }
metric() { # metric NAME: its value for tenant pg (or without labels)
	local m
	m=$(exec 3<>/dev/tcp/127.0.0.1/9477 && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && cat <&3)
	sed -n "s/^$1\(_total\)\?\({tenant=\"pg\"}\)\? \([0-9.e+]*\)$/\3/p" <<<"$m" | head -n1
}
pg_pids() { pgrep -f '^/usr/lib/postgresql/15/bin/postgres|^postgres: '; }
daemon() { # daemon NAME RESCAN: the daemon as a transient service, waited for until it serves
	systemd-run --quiet --unit="$1" /usr/sbin/dbcage run --rescan-interval "$2"
	for _ in $(seq 100); do [ -n "$(metric dbcage_rescans 2>/dev/null)" ] && return 0; sleep 0.1; done
	fail "daemon $1 did not serve its metrics ($(systemctl is-active "$1")); its log:"
	journalctl -b -u "$1" --no-pager -o cat | tail -n 20 | sed 's/^/  daemon: /'
	echo "RESULT: $fails failure(s)"
	exit 1
}
[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] || { echo "FAIL: this script needs cgroup v2"; exit 1; }
U=postgresql@15-main.service
systemctl start $U
CG=$(show $U ControlGroup)
: >"$SDGUEST_OUT/figures.txt"

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
EOF
chmod 600 /etc/dbcage/dbcage.toml
# A second cluster, started by hand later (outside systemd); made before the daemon runs.
ADHOC=/var/lib/postgresql/dbcage-test-adhoc
cd /
su postgres -c "/usr/lib/postgresql/15/bin/initdb -A trust -D $ADHOC" >/dev/null || fail "initdb"

# ---------------------------------------------------------------- 1. status and metrics
daemon dbcage-test-daemon1 60s
eq "unit quota set by the daemon" "$(show $U CPUQuotaPerSecUSec)" "500ms"
eq "kernel cpu.max of the unit" "$(cat /sys/fs/cgroup$CG/cpu.max)" "50000 100000"
json=$(dbcage status --json | tr -d ' \n')
has "status --json" "$json" "\"units\":[\"$CG\"]"
has "status --json" "$json" '"cpu_quota_cores":0.5'
has "status --json" "$json" '"memory_limit_bytes":536870912'
has "status --json" "$json" '"read_bps":4194304'
n=$(sed -n 's/.*"processes":\([0-9]*\).*/\1/p' <<<"$json")
eq "status counts the unit's processes" "$n" "$(wc -l </sys/fs/cgroup$CG/cgroup.procs)"
out=$(dbcage status)
echo "$out" | sed 's/^/  status: /'
has "status" "$out" "in $U"
case $out in *"NOT LIMITED"*) fail "status says NOT LIMITED" ;; *) pass "status: limited" ;; esac
eq "metric dbcage_cpu_quota_cores" "$(metric dbcage_cpu_quota_cores)" "0.5"
eq "metric dbcage_memory_limit_bytes" "$(metric dbcage_memory_limit_bytes)" "536870912"
eq "metric dbcage_processes" "$(metric dbcage_processes)" "$n"

# ---------------------------------------------------------------- 2. restart, sampled
# Every 100 ms from the restart until 2 s after it returned: each postgres process is in the
# unit, and the unit's cpu.max holds the plan.
OLD=$(show $U MainPID)
systemctl restart $U &
rpid=$!
t0=$(ms)
outside=0 unlimited=0 samples=0 done_at=""
while [ -z "$done_at" ] || [ $(( $(ms) - done_at )) -lt 2000 ]; do
	[ -z "$done_at" ] && ! kill -0 $rpid 2>/dev/null && done_at=$(ms)
	samples=$((samples + 1))
	for p in $(pg_pids); do
		c=$(cg_of "$p")
		[ -z "$c" ] && continue # exited between pgrep and the read
		case $c in "$CG" | "$CG"/*) ;; *) outside=$((outside + 1)); echo "  pid $p in $c" ;; esac
	done
	# Between stop and start the unit has no cgroup (and no process): only a group with
	# processes counts.
	if [ -n "$(cat /sys/fs/cgroup$CG/cgroup.procs 2>/dev/null)" ]; then
		[ "$(cat /sys/fs/cgroup$CG/cpu.max 2>/dev/null)" = "50000 100000" ] || unlimited=$((unlimited + 1))
	fi
	sleep 0.1
done
wait $rpid || fail "systemctl restart"
NEW=$(show $U MainPID)
[ "$NEW" != "$OLD" ] && pass "restart: new postmaster $NEW" || fail "restart kept postmaster $OLD"
figure "restart: systemctl restart took $(( done_at - t0 )) ms; $samples samples at 100 ms, $outside postgres process samples outside $U, $unlimited samples of an unlimited unit"
eq "postgres samples outside the unit during restart" "$outside" "0"
eq "samples with the unit's cpu.max off the plan" "$unlimited" "0"

# A postmaster started by hand in a login session (this guest has no pam_systemd: the
# session's scope is made with systemd-run, as logind would).
t0=$(ms)
systemd-run --quiet --scope --unit=session-dbcagetest.scope --slice=user.slice \
	su postgres -c "/usr/lib/postgresql/15/bin/pg_ctl -D $ADHOC -o '-p 5433 -k /tmp' -l /tmp/dbcage-test-adhoc.log -W start" >/dev/null
pm=""
adopted_ms="" all_ms=""
while [ $(( $(ms) - t0 )) -lt 5000 ]; do
	[ -z "$pm" ] && pm=$(head -n1 "$ADHOC/postmaster.pid" 2>/dev/null)
	if [ -n "$pm" ] && [ -z "$adopted_ms" ] && [ "$(cg_of "$pm")" = /dbcage.slice/dbcage-pg.scope ] &&
		[ "$(cat /sys/fs/cgroup/dbcage.slice/dbcage-pg.scope/cpu.max 2>/dev/null)" = "50000 100000" ]; then
		adopted_ms=$(( $(ms) - t0 ))
	fi
	if [ -n "$adopted_ms" ]; then
		left=0
		for p in $(pgrep -f "D $ADHOC|^postgres: " ); do
			case $(cg_of "$p") in */session-dbcagetest.scope) left=$((left + 1)) ;; esac
		done
		[ $left = 0 ] && { all_ms=$(( $(ms) - t0 )); break; }
	fi
	sleep 0.1
done
figure "pg_ctl in a session scope: postmaster in dbcage-pg.scope with the quota ${adopted_ms:-never} ms after start, all its processes out of the session ${all_ms:-never} ms after start (sampled every 100 ms)"
[ -n "$adopted_ms" ] && [ "$adopted_ms" -le 1000 ] && pass "adopted within 1 s ($adopted_ms ms)" ||
	fail "postmaster $pm not adopted within 1 s (${adopted_ms:-never}; in $(cg_of "$pm"))"
[ -n "$all_ms" ] && pass "every process of the adhoc cluster left the session" || fail "processes left in the session scope"
ready=0
for _ in $(seq 100); do su postgres -c "psql -h /tmp -p 5433 -Atc 'select 1'" >/dev/null 2>&1 && { ready=1; break; }; sleep 0.2; done
eq "adopted cluster answers" "$ready" "1"
json=$(dbcage status --json | tr -d ' \n')
has "status lists both units" "$json" "\"units\":[\"$CG\",\"/dbcage.slice/dbcage-pg.scope\"]"
journalctl -b -u dbcage-test-daemon1 --no-pager -o cat | grep -E 'adopted|unit property' | head -5 | sed 's/^/  daemon: /'

# ---------------------------------------------------------------- 5. kill -9, restart
snapshot() { for p in $(pg_pids | sort -n); do echo "$p $(cg_of "$p")"; done; }
before=$(snapshot)
t0=$(ms)
systemctl kill -s KILL dbcage-test-daemon1
sleep 1
eq "after kill -9: postgres processes and their cgroups" "$(snapshot)" "$before"
daemon dbcage-test-daemon2 1s
figure "kill -9 of the daemon, a new daemon serving: $(( $(ms) - t0 )) ms"
sleep 2
eq "after the new daemon's plans: postgres processes and their cgroups" "$(snapshot)" "$before"
eq "dbcage scopes" "$(systemctl list-units --all --no-legend --plain 'dbcage-*.scope' | awk '{print $1}' | tr '\n' ' ')" "dbcage-pg.scope "
eq "unit quota" "$(show $U CPUQuotaPerSecUSec)" "500ms"
eq "scope quota" "$(show dbcage-pg.scope CPUQuotaPerSecUSec)" "500ms"
eq "repairs after the restart (nothing drifted)" "$(metric dbcage_systemd_repairs)" "0"
systemctl stop dbcage-test-daemon2
eq "after systemctl stop of the daemon" "$(snapshot)" "$before"
eq "postgres active" "$(systemctl is-active $U)" "active"

# ---------------------------------------------------------------- 3. reloads, restarts, set-property
# An unrelated unit with IO limits of its own.
systemd-run --quiet --unit=dbcage-test-other -p "IOReadBandwidthMax=/dev/vdd 1M" sleep 100000
daemon dbcage-test-daemon3 1s
before=$(snapshot)
r0=$(metric dbcage_systemd_repairs)
hand=0 worst=0 kernel_off=0
t0=$(ms)
for i in $(seq 100); do
	systemctl daemon-reload
	[ "$(cat /sys/fs/cgroup$CG/cpu.max)" = "50000 100000" ] || kernel_off=$((kernel_off + 1))
	if [ $((i % 10)) = 0 ]; then
		systemctl restart dbcage-test-other
		systemctl set-property --runtime $U CPUQuota=90%
		hand=$((hand + 1))
		s=$(ms)
		ok=0
		while [ $(( $(ms) - s )) -lt 2000 ]; do
			[ "$(cat /sys/fs/cgroup$CG/cpu.max)" = "50000 100000" ] && [ "$(show $U CPUQuotaPerSecUSec)" = 500ms ] && { ok=1; break; }
			sleep 0.1
		done
		took=$(( $(ms) - s ))
		[ $took -gt $worst ] && worst=$took
		[ $ok = 1 ] || fail "reload $i: set-property not repaired within 2 s (cpu.max $(cat /sys/fs/cgroup$CG/cpu.max))"
	fi
done
total=$(( $(ms) - t0 ))
r1=$(metric dbcage_systemd_repairs)
figure "100 daemon-reloads, 10 restarts of dbcage-test-other, $hand set-property by hand: ${total} ms; worst repair $worst ms; $kernel_off reloads with cpu.max off the plan; repairs metric $r0 -> $r1"
eq "reloads with the kernel off the plan" "$kernel_off" "0"
eq "repairs counted (one property per set-property)" "$(( ${r1:-0} - ${r0:-0} ))" "$hand"
eq "postgres processes and cgroups after the reloads" "$(snapshot)" "$before"
eq "the unrelated unit keeps its own IO limit" "$(show dbcage-test-other IOReadBandwidthMax)" "/dev/vdd 1000000"
eq "dbcage scopes after the reloads" "$(systemctl list-units --all --no-legend --plain 'dbcage-*.scope' | awk '{print $1}' | tr '\n' ' ')" "dbcage-pg.scope "
systemctl stop dbcage-test-daemon3 dbcage-test-other
su postgres -c "/usr/lib/postgresql/15/bin/pg_ctl -D $ADHOC stop -m fast" >/dev/null
cat "$SDGUEST_OUT/figures.txt"
echo "RESULT: $fails failure(s)"
[ $fails = 0 ]
