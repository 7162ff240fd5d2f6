#!/bin/bash
# Issue 19's scenarios with the daemon (`dbcage run`) on a real systemd host, PostgreSQL 15 in
# postgresql@15-main.service, the tenant's limits on the unit:
#   1. status and the metrics read the limits and usage back from the unit's cgroup;
#   2. `systemctl restart`: every postgres process stays in its unit and is limited, sampled
#      every 100 ms; a postmaster started outside systemd (pg_ctl in a login session) is adopted
#      into dbcage-pg.scope by the daemon's event path within 1 s (the rescan is 60 s away);
#   5. kill -9 of the daemon and a restart: nothing killed or moved, no duplicate scope, limits
#      in force;
#   3. 100 daemon-reloads (the number in $SDGUEST_FILES/reloads), restarts of an unrelated unit with its own IO limits, and
#      set-property on the database's unit by hand: within 2 s the kernel and the unit's
#      properties are back to the plan, the repairs metric counts exactly the repairs;
#   and a tenant matched by `unit = "postgresql@15-main.service"` alone is governed in place;
#   `release` gives a unit with its own CPUQuota/MemoryMax its unit file's values back;
#   exempt leaves in a delegated unit (v2); MariaDB (mariadb.service) under the mysql preset,
#   governed in place, through a restart under the daemon, released.
# With the package installed (tests/sdguest/systemd.sh DEB puts package.sh in $SDGUEST_FILES),
# scenario 6 (guest/package.sh: the packaged unit, `systemctl enable --now dbcage`) runs first.
# On cgroup v2, or v1 (SDGUEST_CGROUP=v1): the same checks, the kernel files read from the
# unit's groups in the v1 hierarchies.
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
# cgroup v2, or v1 (SDGUEST_CGROUP=v1: systemd.unified_cgroup_hierarchy=0, RHEL 7/8 style,
# systemd also manages the cpu, memory and blkio hierarchies). A process's unit is its
# name=systemd group on v1 (its 0:: line on v2); the CPU quota is cpu.max on v2 and
# cpu.cfs_quota_us/cpu.cfs_period_us in the unit's group of the cpu hierarchy on v1.
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
procs_in() { cat "$SD$1/cgroup.procs" 2>/dev/null; }
scrape() { # the daemon's metrics endpoint's answer (text format)
	(exec 3<>/dev/tcp/127.0.0.1/9477 && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && cat <&3)
}
metric() { # metric NAME: its value for tenant pg (or without labels)
	local m
	m=$(scrape)
	sed -n "s/^$1\(_total\)\?\({tenant=\"pg\"}\)\? \([0-9.e+]*\)$/\3/p" <<<"$m" | head -n1
}
pg_pids() { pgrep -f '^/usr/lib/postgresql/15/bin/postgres|^postgres: '; }
daemon() { # daemon NAME RESCAN: the daemon as a transient service, waited for until it serves
	# Type=notify: systemd-run returns once the daemon said it is ready (its first plan applied).
	systemd-run --quiet --unit="$1" -p Type=notify /usr/sbin/dbcage run --rescan-interval "$2"
	for _ in $(seq 100); do [ -n "$(metric dbcage_rescans 2>/dev/null)" ] && return 0; sleep 0.1; done
	fail "daemon $1 did not serve its metrics ($(systemctl is-active "$1")); its log:"
	journalctl -b -u "$1" --no-pager -o cat | tail -n 20 | sed 's/^/  daemon: /'
	echo "RESULT: $fails failure(s)"
	exit 1
}
# The sampler: every 100 ms, every process of one executable (by /proc/PID/exe) and its cgroup; a sample
# is good when the cgroup is one the pattern allows and its CPU quota (as quota_of) holds the plan. In perl
# (the guest has it for postgresql-common): a fork per process and sample under TCG would take
# seconds, not 100 ms. Runs until FILE exists (and at most 120 s); prints
#   samples=N bad=N (process samples not good) pids=N late_ms=MAX (first seen -> first good,
#   over the processes not good when first seen; "never" when one alive at the end never was)
#   never=PIDS (alive at the end, never good)
cat >/usr/local/bin/dbcage-test-sample <<'PERL'
#!/usr/bin/perl
use strict; use warnings; use Time::HiRes qw(time sleep);
my ($exe_want, $allow, $want, $stop) = @ARGV;
my $v1 = !-e "/sys/fs/cgroup/cgroup.controllers";
sub readf { my $v = ""; if (open(my $m, "<", $_[0])) { $v = <$m> // ""; chomp $v; } return $v; }
my (%seen, %good, %late, %alive);
my ($samples, $bad) = (0, 0);
my $t0 = time;
while (!-e $stop && time - $t0 < 120) {
	my $now = time;
	$samples++;
	%alive = ();
	opendir(my $d, "/proc") or die;
	for my $pid (grep { /^\d+$/ } readdir $d) {
		my $exe = readlink("/proc/$pid/exe") // next;
		next unless $exe eq $exe_want;
		open(my $f, "<", "/proc/$pid/cgroup") or next;
		# the unit: the 0:: line (v2), or the name=systemd one on v1 (hybrid hosts have both)
		my ($cg) = reverse map { /^(?:0:|\d+:name=systemd):(.*)$/ ? $1 : () } <$f>;
		next unless defined $cg;
		my $max = "";
		if ($v1) {
			my ($q, $p) = (readf("/sys/fs/cgroup/cpu$cg/cpu.cfs_quota_us"), readf("/sys/fs/cgroup/cpu$cg/cpu.cfs_period_us"));
			$max = ($q eq "-1" ? "max" : $q) . " $p" if $q ne "" && $p ne "";
		} else {
			$max = readf("/sys/fs/cgroup$cg/cpu.max");
		}
		my $ok = $cg =~ /$allow/ && $max eq $want;
		$alive{$pid} = 1;
		$seen{$pid} //= $now;
		if ($ok) { $good{$pid} //= $now; } else { $bad++; $late{$pid} = 1; print "  sample: pid $pid in $cg (cpu.max '$max')\n" if $bad <= 5; }
	}
	closedir $d;
	my $left = 0.1 - (time - $now);
	sleep($left) if $left > 0;
}
my $late_ms = 0;
for my $pid (keys %late) {
	next unless defined $good{$pid};
	my $ms = int(($good{$pid} - $seen{$pid}) * 1000 + 0.5);
	$late_ms = $ms if $ms > $late_ms;
}
my @never = sort { $a <=> $b } grep { !defined $good{$_} } keys %alive;
$late_ms = "never" if @never; # alive at the end and never good: no latency to speak of
printf "samples=%d bad=%d pids=%d late_ms=%d never=%s\n", $samples, $bad, scalar(keys %seen), $late_ms, join(",", @never);
PERL
chmod 755 /usr/local/bin/dbcage-test-sample
field() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$2"; }

echo "cgroup v$V"
U=postgresql@15-main.service
PG=/usr/lib/postgresql/15/bin/postgres
systemctl start $U
CG=$(show $U ControlGroup)
: >"$SDGUEST_OUT/figures.txt"
if [ -e "$SDGUEST_FILES/package.sh" ]; then
	echo "---------------- 6. the packaged .deb (guest/package.sh)"
	bash "$SDGUEST_FILES/package.sh" || fail "scenario 6, the packaged .deb: its FAIL lines are above"
	echo "---------------- 1-5 with the daemon as transient units"
fi

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
cp /bin/sleep /usr/local/bin/dbcageadhoc
chmod 600 /etc/dbcage/dbcage.toml
# A second cluster, started by hand later (outside systemd); made before the daemon runs.
ADHOC=/var/lib/postgresql/dbcage-test-adhoc
cd /
su postgres -c "/usr/lib/postgresql/15/bin/initdb -A trust -D $ADHOC" >/dev/null || fail "initdb"

# ---------------------------------------------------------------- 1. status and metrics
daemon dbcage-test-daemon1 60s
eq "unit quota set by the daemon" "$(show $U CPUQuotaPerSecUSec)" "500ms"
eq "kernel cpu.max of the unit" "$(quota_of $CG)" "50000 100000"
# The instance total (4 MiB/s over vdc and vdd) split per device, and the memory limit, in the
# unit's own groups: systemd writes io.max and memory.max on v2, blkio and memory.limit_in_bytes
# in its groups of the v1 hierarchies.
VDC=$(cat /sys/block/vdc/dev)
eq "kernel memory limit of the unit (v$V)" "$(mem_of $CG)" "536870912"
if [ $V = 2 ]; then
	has "kernel io.max of the unit" "$(cat /sys/fs/cgroup$CG/io.max)" "$VDC rbps=2097152"
else
	has "kernel blkio.throttle.read_bps_device of the unit" "$(cat /sys/fs/cgroup/blkio$CG/blkio.throttle.read_bps_device 2>&1)" "$VDC 2097152"
fi
json=$(dbcage status --json | tr -d ' \n')
has "status --json" "$json" "\"units\":[\"$CG\"]"
has "status --json" "$json" '"cpu_quota_cores":0.5'
has "status --json" "$json" '"memory_limit_bytes":536870912'
has "status --json" "$json" '"read_bps":4194304'
n=$(sed -n 's/.*"name":"pg","units":\[[^]]*\],"processes":\([0-9]*\).*/\1/p' <<<"$json")
eq "status counts the unit's processes" "$n" "$(procs_in $CG | wc -l)"
out=$(dbcage status)
echo "$out" | sed 's/^/  status: /'
has "status" "$out" "in $U"
case $out in *"NOT LIMITED"*) fail "status says NOT LIMITED" ;; *) pass "status: limited" ;; esac
eq "metric dbcage_cpu_quota_cores" "$(metric dbcage_cpu_quota_cores)" "0.5"
eq "metric dbcage_memory_limit_bytes" "$(metric dbcage_memory_limit_bytes)" "536870912"
eq "metric dbcage_processes" "$(metric dbcage_processes)" "$n"
# The instance total holds on the disks, measured: a shell joins the unit's group (in the io
# hierarchy) and reads 4 MiB directly from vdc and from vdd at once; each disk's 2 MiB/s share
# of the 4 MiB/s total binds (unlimited, a direct reader gets 4.7-8.4 MiB/s here under TCG).
if [ $V = 2 ]; then UIO=/sys/fs/cgroup$CG; else UIO=/sys/fs/cgroup/blkio$CG; fi
reads=$(bash -c "echo \$\$ >$UIO/cgroup.procs || exit 1
for d in vdc vdd; do ( s=\${EPOCHREALTIME/./}; dd if=/dev/\$d of=/dev/null bs=64k count=64 iflag=direct status=none; echo \$d \$(( (\${EPOCHREALTIME/./} - s) / 1000 )) ) & done
wait") || fail "joining $UIO to read"
total=0
for d in vdc vdd; do
	t=$(sed -n "s/^$d \([0-9]*\)$/\1/p" <<<"$reads")
	r=$(( 4096 * 1000 / (${t:-0} > 0 ? ${t:-0} : 1) ))
	total=$((total + r))
	if [ -n "$t" ] && [ $r -le 2600 ]; then pass "direct reads from $d in $U: $r KiB/s (share 2048)"; else fail "direct reads from $d in $U: ${r} KiB/s in ${t:-?} ms (share 2048 KiB/s)"; fi
done
figure "direct reads of 4 MiB from vdc and vdd at once in $U (4 MiB/s over both): $(tr '\n' ' ' <<<"$reads")ms, $total KiB/s together"
# Those reads' latency is the tenant's: under systemd its processes are in the unit's cgroup (no
# group of dbcage's exists), which the IO latency histograms must count as pg's.
m=$(scrape)
for d in vdc vdd; do
	dev=$(cat /sys/block/$d/dev)
	c=$(sed -n "s/^dbcage_io_latency_seconds_count{tenant=\"pg\",device=\"$dev\",name=\"$d\",op=\"read\"} \([0-9]*\).*/\1/p" <<<"$m")
	if [ "${c:-0}" -ge 64 ]; then
		pass "dbcage_io_latency_seconds_count of pg's reads from $d: $c (64 direct reads in $U)"
	else
		fail "dbcage_io_latency_seconds_count of pg's reads from $d: ${c:-none} (64 direct reads in $U); the daemon's word on the program: $(journalctl -b -u dbcage-test-daemon1 --no-pager -o cat | grep -m1 'IO latency')"
	fi
done

# ---------------------------------------------------------------- 2. restart, sampled
# Every 100 ms from the restart until 2 s after it returned: each postgres process is in the
# unit, and the unit's cpu.max holds the plan.
OLD=$(show $U MainPID)
rm -f /tmp/dbcage-test-stop
dbcage-test-sample $PG "^$CG\$" "50000 100000" /tmp/dbcage-test-stop >/tmp/dbcage-test-restart &
sampler=$!
t0=$(ms)
systemctl restart $U || fail "systemctl restart"
took=$(( $(ms) - t0 ))
sleep 2
touch /tmp/dbcage-test-stop
wait $sampler
r=$(tail -n1 /tmp/dbcage-test-restart)
cat /tmp/dbcage-test-restart
NEW=$(show $U MainPID)
[ "$NEW" != "$OLD" ] && pass "restart: new postmaster $NEW" || fail "restart kept postmaster $OLD"
figure "restart of $U (systemctl restart took $took ms), sampled every 100 ms: $r"
eq "postgres process samples outside the unit or unlimited" "$(field bad "$r")" "0"
eq "postgres processes never limited" "$(field never "$r")" ""

# A postmaster started by hand in a login session (this guest has no pam_systemd: the
# session's scope is made with systemd-run, as logind would). The daemon's rescan is 60 s away:
# only its event path can adopt it within the bound.
rm -f /tmp/dbcage-test-stop
dbcage-test-sample $PG "^($CG|/dbcage.slice/dbcage-pg.scope)\$" "50000 100000" /tmp/dbcage-test-stop >/tmp/dbcage-test-adopt &
sampler=$!
systemd-run --quiet --scope --unit=session-dbcagetest.scope --slice=user.slice \
	su postgres -c "/usr/lib/postgresql/15/bin/pg_ctl -D $ADHOC -o '-p 5433 -k /tmp' -l /tmp/dbcage-test-adhoc.log -w start" >/dev/null ||
	fail "pg_ctl start"
sleep 2
touch /tmp/dbcage-test-stop
wait $sampler
r=$(tail -n1 /tmp/dbcage-test-adopt)
cat /tmp/dbcage-test-adopt
figure "pg_ctl start in a login session, sampled every 100 ms (late_ms: first seen outside -> in dbcage-pg.scope under the quota): $r"
# The first adoption starts the tenant's scope: systemd's StartTransientUnit job, which under
# TCG took 0.6-1.6 s from the postmaster's start (the journal's "Started dbcage-pg.scope");
# bound 3 s here. Adoption into a running scope is held to the issue's 1 s below.
late=$(field late_ms "$r")
[ -n "$late" ] && [ "$late" -le 3000 ] && pass "adopted with its scope started within 3 s ($late ms)" || fail "first adoption took ${late:-?} ms (bound 3000)"
eq "adhoc processes never adopted" "$(field never "$r")" ""
[ "$(procs_in /user.slice/session-dbcagetest.scope)" = "" ] &&
	pass "nothing left in the session scope" || fail "processes left in the session scope"
# Into a running scope: a process of tenant adhoc from one session starts dbcage-adhoc.scope,
# then one from another session joins it (AttachProcessesToUnit) within 1 s.
systemd-run --quiet --scope --unit=session-dbcagetest1.scope --slice=user.slice /usr/local/bin/dbcageadhoc 1000 &
for _ in $(seq 50); do systemctl is-active --quiet dbcage-adhoc.scope && break; sleep 0.1; done
eq "dbcage-adhoc.scope" "$(systemctl is-active dbcage-adhoc.scope)" "active"
rm -f /tmp/dbcage-test-stop
dbcage-test-sample /usr/local/bin/dbcageadhoc "^/dbcage.slice/dbcage-adhoc.scope\$" "20000 100000" /tmp/dbcage-test-stop >/tmp/dbcage-test-attach &
sampler=$!
systemd-run --quiet --scope --unit=session-dbcagetest2.scope --slice=user.slice /usr/local/bin/dbcageadhoc 1001 &
sleep 3
touch /tmp/dbcage-test-stop
wait $sampler
r=$(tail -n1 /tmp/dbcage-test-attach)
cat /tmp/dbcage-test-attach
figure "a process started in a login session joins its tenant's running scope, sampled every 100 ms: $r"
late=$(field late_ms "$r")
[ -n "$late" ] && [ "$late" -le 1000 ] && pass "adopted into the running scope within 1 s ($late ms)" || fail "adoption into the running scope took ${late:-?} ms (bound 1000)"
eq "adhoc processes never adopted" "$(field never "$r")" ""
pkill -x dbcageadhoc
sleep 1
ready=0
for _ in $(seq 100); do su postgres -c "psql -h /tmp -p 5433 -Atc 'select 1'" >/dev/null 2>&1 && { ready=1; break; }; sleep 0.2; done
eq "adopted cluster answers" "$ready" "1"
json=$(dbcage status --json | tr -d ' \n')
has "status lists the unit" "$json" "\"units\":[\"$CG\",\"/dbcage.slice/dbcage-pg.scope\"]"
journalctl -b -u dbcage-test-daemon1 --no-pager -o cat | grep -E 'adopted|unit property' | sed 's/^/  daemon: /'

# ---------------------------------------------------------------- 5. kill -9, restart
# Each long-lived postgres process with its cgroup and title. Autovacuum and parallel workers
# come and go by themselves (the launcher starts a worker per database every naptime): a new
# one, or one gone, says nothing about dbcage (a run under load saw a worker appear in the
# adopted cluster's scope between two snapshots).
snapshot() {
	local p title
	for p in $(pg_pids | sort -n); do
		title=$(cat /proc/"$p"/cmdline 2>/dev/null | tr '\0' ' ')
		[ -n "$title" ] || continue
		case $title in *"autovacuum worker"* | *"parallel worker"*) continue ;; esac
		echo "$p $(cg_of "$p") ${title% }"
	done
}
before=$(snapshot)
t0=$(ms)
systemctl kill -s KILL dbcage-test-daemon1
sleep 1
eq "after kill -9: postgres processes and their cgroups" "$(snapshot)" "$before"
daemon dbcage-test-daemon2 1s
figure "kill -9 of the daemon, a new daemon serving: $(( $(ms) - t0 )) ms"
sleep 2
eq "after the new daemon's plans: postgres processes and their cgroups" "$(snapshot)" "$before"
eq "dbcage scopes" "$(systemctl list-units --all --no-legend --plain 'dbcage-*.scope' | awk '$3 != "inactive" {print $1}' | tr '\n' ' ')" "dbcage-pg.scope "
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
RELOADS=$(cat "$SDGUEST_FILES/reloads" 2>/dev/null || echo 100)
for i in $(seq "$RELOADS"); do
	systemctl daemon-reload
	[ "$(quota_of $CG)" = "50000 100000" ] || kernel_off=$((kernel_off + 1))
	if [ $((i % 5)) = 0 ]; then
		systemctl restart dbcage-test-other
		systemctl set-property --runtime $U CPUQuota=90%
		hand=$((hand + 1))
		s=$(ms)
		ok=0
		while [ $(( $(ms) - s )) -lt 2000 ]; do
			[ "$(quota_of $CG)" = "50000 100000" ] && [ "$(show $U CPUQuotaPerSecUSec)" = 500ms ] && { ok=1; break; }
			sleep 0.1
		done
		took=$(( $(ms) - s ))
		[ $took -gt $worst ] && worst=$took
		[ $ok = 1 ] || fail "reload $i: set-property not repaired within 2 s (quota $(quota_of $CG))"
	fi
done
total=$(( $(ms) - t0 ))
r1=$(metric dbcage_systemd_repairs)
figure "$RELOADS daemon-reloads, $hand restarts of dbcage-test-other, $hand set-property by hand: ${total} ms; worst repair $worst ms; $kernel_off reloads with cpu.max off the plan; repairs metric $r0 -> $r1"
eq "reloads with the kernel off the plan" "$kernel_off" "0"
eq "repairs counted (one property per set-property)" "$(( ${r1:-0} - ${r0:-0} ))" "$hand"
eq "postgres processes and cgroups after the reloads" "$(snapshot)" "$before"
# A limit by hand on a device the plan does not name (vdb: the results disk, never read here):
# systemd merges a device list into the unit's, so the repair must clear the list and set the
# plan's, once (not again at every rescan).
want_io=$(show $U IOReadBandwidthMax | tr '\n' ' ')
r0=$(metric dbcage_systemd_repairs)
systemctl set-property --runtime $U "IOReadBandwidthMax=/dev/vdb 1M"
s=$(ms)
ok=0
while [ $(( $(ms) - s )) -lt 2000 ]; do
	[ "$(show $U IOReadBandwidthMax | tr '\n' ' ')" = "$want_io" ] && { ok=1; break; }
	sleep 0.1
done
figure "IOReadBandwidthMax on a device the plan does not name, set by hand: repaired in $(( $(ms) - s )) ms"
eq "a foreign device's IO limit removed within 2 s (IOReadBandwidthMax)" "$(show $U IOReadBandwidthMax | tr '\n' ' ')" "$want_io"
sleep 3
eq "repairs for the foreign device's limit (one, not one per rescan)" "$(( $(metric dbcage_systemd_repairs) - r0 ))" "1"
eq "the unrelated unit keeps its own IO limit" "$(show dbcage-test-other IOReadBandwidthMax)" "/dev/vdd 1000000"
eq "dbcage scopes after the reloads" "$(systemctl list-units --all --no-legend --plain 'dbcage-*.scope' | awk '$3 != "inactive" {print $1}' | tr '\n' ' ')" "dbcage-pg.scope "
systemctl stop dbcage-test-daemon3 dbcage-test-other
su postgres -c "/usr/lib/postgresql/15/bin/pg_ctl -D $ADHOC stop -m fast" >/dev/null

# ---------------------------------------------------------------- unit = (issue 19's policy key)
# A tenant matched by its unit alone (no exe, cmdline or comm rule): the daemon governs the
# unit in place (its properties hold this policy's limits, the kernel's too), status counts
# every process in the unit, nothing is adopted, and after a restart the new processes are
# the tenant's and limited.
t0=$(ms)
cat >/etc/dbcage/dbcage.toml <<EOF
[agent]
metrics = "127.0.0.1:9477"
[[tenant]]
name = "pgunit"
match = [{ unit = "$U" }]
[tenant.cpu]
cores = 0.3
[tenant.memory]
max = "256MiB"
EOF
out=$(dbcage check 2>&1)
echo "$out" | sed 's/^/  check: /'
has "check" "$out" "systemd units: $U (policy: unit = $U)"
# No cpus in this policy: nothing to report as not applied (on v1, where systemd has no cpuset,
# a tenant that does not pin was once told its cpuset could not be set).
case $out in *"not applied through systemd"*) fail "check reports a limit not applied for a tenant without one" ;; *) pass "check: nothing reported as not applied" ;; esac
daemon dbcage-test-daemon4 60s
eq "unit = : unit quota" "$(show $U CPUQuotaPerSecUSec)" "300ms"
eq "unit = : unit memory max" "$(show $U MemoryMax)" "268435456"
eq "unit = : kernel cpu.max of the unit" "$(quota_of $CG)" "30000 100000"
unit_count() { # status's units and process count of tenant pgunit
	dbcage status --json | tr -d ' \n' | sed -n 's/.*"name":"pgunit","units":\(\[[^]]*\]\),"processes":\([0-9]*\).*/\1 \2/p'
}
# status and the unit's cgroup.procs are read at different moments, and postgres starts short-
# lived children of its own (an autovacuum worker, a new postmaster's children after a restart;
# CI once counted 6 against 7): they must agree within 5 s, not in one sample.
status_agrees() { # status_agrees WHAT: status's units and count equal the unit's, within 5 s
	local n want
	for _ in $(seq 10); do
		want="[\"$CG\"] $(procs_in $CG | wc -l)"
		n=$(unit_count)
		[ "$n" = "$want" ] && break
		sleep 0.5
	done
	echo "  status: $n"
	eq "$1" "$n" "$want"
}
status_agrees "unit = : status lists the unit and counts its processes"
systemctl restart $U || fail "systemctl restart (unit =)"
eq "unit = : kernel cpu.max after a restart" "$(quota_of $CG)" "30000 100000"
status_agrees "unit = : status after a restart"
eq "unit = : nothing adopted" "$(systemctl list-units --all --no-legend --plain 'dbcage-pgunit.scope' | awk '$3 != "inactive"' | wc -l)" "0"
systemctl stop dbcage-test-daemon4
figure "unit = section (check, a daemon, a restart of $U): $(( $(ms) - t0 )) ms"

# ---------------------------------------------------------------- release: the unit file's own settings back
# A unit whose file sets its own CPUQuota and MemoryMax, governed by `dbcage apply` (lower
# limits), then `dbcage release --all`: systemd and the kernel hold the unit file's values
# again, no runtime drop-in of dbcage's properties is left in /run/systemd/system.control (a
# property set back to a default at runtime would be one, masking the file's values until
# reboot), the process runs on in its unit; dbcage-adhoc.scope (a sleeper from a session,
# adopted by the apply) is left running with its process, and release says so.
t0=$(ms)
O=dbcage-test-own.service
cat >/etc/systemd/system/$O <<'EOF'
[Service]
ExecStart=/bin/sleep infinity
CPUQuota=200%
MemoryMax=300M
EOF
# A new unit file needs no daemon-reload: systemd loads it when the start names it.
systemctl start $O
OCG=$(show $O ControlGroup)
opid=$(show $O MainPID)
cat >/etc/dbcage/dbcage.toml <<EOF
[[tenant]]
name = "own"
match = [{ unit = "$O" }]
[tenant.cpu]
cores = 0.4
[tenant.memory]
max = "128MiB"
[[tenant]]
name = "adhoc"
match = [{ comm = '^dbcageadhoc\$' }]
[tenant.cpu]
cores = 0.2
EOF
systemd-run --quiet --scope --unit=session-dbcagetest9.scope --slice=user.slice /usr/local/bin/dbcageadhoc 600 </dev/null >/dev/null 2>&1 &
for _ in $(seq 50); do systemctl is-active --quiet session-dbcagetest9.scope && break; sleep 0.1; done
out=$(dbcage apply 2>&1) || fail "apply ($O): $out"
eq "release: governed quota" "$(show $O CPUQuotaPerSecUSec)" "400ms"
eq "release: governed kernel quota" "$(quota_of $OCG)" "40000 100000"
eq "release: governed kernel memory" "$(mem_of $OCG)" "134217728"
t1=$(ms)
out=$(dbcage release --all 2>&1) || fail "release --all: $out"
t1=$(( $(ms) - t1 ))
echo "$out" | sed 's/^/  release: /'
eq "release: the unit file's quota back" "$(show $O CPUQuotaPerSecUSec)" "2s"
eq "release: the unit file's MemoryMax back" "$(show $O MemoryMax)" "314572800"
eq "release: kernel quota is the unit file's" "$(quota_of $OCG)" "200000 100000"
eq "release: kernel memory is the unit file's" "$(mem_of $OCG)" "314572800"
eq "release: runtime drop-ins left for $O" "$(ls /run/systemd/system.control/$O.d 2>/dev/null | tr '\n' ' ')" ""
eq "release: $O still runs its process in its unit" "$(show $O MainPID) $(cg_of $opid)" "$opid $OCG"
has "release output" "$out" "dbcage-adhoc.scope has systemd's defaults and is left running"
eq "release: the scope's quota" "$(show dbcage-adhoc.scope CPUQuotaPerSecUSec)" "infinity"
eq "release: the scope is still running" "$(systemctl is-active dbcage-adhoc.scope)" "active"
systemctl stop $O
pkill -x dbcageadhoc
figure "release section (a unit with its own limits: apply, release --all, checks): $(( $(ms) - t0 )) ms, of which release --all (a manager reload) $t1 ms"

# ---------------------------------------------------------------- exempt leaves in a delegated unit
# The tenant's WAL writer is exempt and the tenant has an IO limit: the unit's properties would
# bind the WAL writer too. `check` says so and names `dbcage systemd-setup`; that writes the
# Delegate=yes drop-in and reloads systemd; the next plan makes `limited` and `exempt` leaves
# inside the unit's cgroup (io hierarchy), moves the unit's processes into them (none leaves
# the unit: systemd counts them all), puts the IO limit on `limited` and clears the unit's IO
# property. Measured: direct reads from `limited` hold the limit, from `exempt` they do not.
# After `systemctl restart` the daemon puts the new processes into their leaves; `release`
# brings them back to the unit's own group and removes the leaves. cgroup v2 only: on v1
# `check` says why there are no leaves.
t0=$(ms)
if [ $V = 2 ]; then IOD=/sys/fs/cgroup; else IOD=/sys/fs/cgroup/blkio; fi
io_cg_of() { sed -n 's/^0::\(.*\)$/\1/p; s/^[0-9]*:blkio:\(.*\)$/\1/p' "/proc/$1/cgroup" 2>/dev/null | tail -n1; }
main_pids() { pgrep -f '^/usr/lib/postgresql/15/bin/postgres -D /var/lib/postgresql/15/main|^postgres: 15/main: ' | sort -n; }
walwriter() { pgrep -f '^postgres: 15/main: walwriter'; }
cat >/etc/dbcage/dbcage.toml <<'POLICY'
[agent]
metrics = "127.0.0.1:9477"
[[tenant]]
name = "pg"
match = [{ exe = "/usr/lib/postgresql/15/bin/postgres", descendants = true }]
exempt = [{ exe = "/usr/lib/postgresql/15/bin/postgres", cmdline = '^postgres: 15/main: walwriter' }]
storage = ["/dev/vdc"]
[tenant.io]
read_bps = "1MiB"
[tenant.cpu]
cores = 0.5
POLICY
DROP=/etc/systemd/system/$U.d/50-dbcage-delegate.conf
out=$(dbcage check 2>&1)
echo "$out" | grep 'not applied' | sed 's/^/  check: /'
has "check before systemd-setup" "$out" "exempt processes in $U run under its IO limits"
if [ $V = 1 ]; then
	# cgroup v1: no leaves in a unit (systemd moves a unit's processes back into its group of
	# each hierarchy when it sets the unit up again), said as such; nothing for systemd-setup.
	has "check on v1" "$out" "dbcage makes that leaf on cgroup v2 only"
	out=$(dbcage systemd-setup 2>&1) || fail "systemd-setup on v1: $out"
	has "systemd-setup on v1" "$out" "nothing to write"
	[ -e "$DROP" ] && fail "systemd-setup wrote $DROP on v1"
else
has "check before systemd-setup" "$out" 'run `dbcage systemd-setup`'
out=$(dbcage systemd-setup --dry-run 2>&1) || fail "systemd-setup --dry-run: $out"
has "systemd-setup --dry-run" "$out" "tenant pg: $U: would write $DROP"
if [ -e "$DROP" ]; then fail "a dry run wrote $DROP"; else pass "a dry run writes nothing"; fi
out=$(dbcage systemd-setup 2>&1) || fail "systemd-setup: $out"
echo "$out" | sed 's/^/  systemd-setup: /'
has "systemd-setup" "$out" "wrote $DROP"
eq "Delegate after systemd-setup" "$(show $U Delegate)" "yes"
out=$(dbcage systemd-setup 2>&1)
has "systemd-setup again (the unit is delegated now)" "$out" "nothing to write"
# Until the leaves can be made, the plan says why: on v2 a unit whose cgroup offers its
# subgroups no io (started before Delegate=yes) needs a restart; on v1 a unit with no blkio
# group yet gets one from systemd when the plan sets its IO properties, and the next plan
# makes the leaves. Both are followed here, as an admin would, and counted.
restarted=no applies=0
for _ in 1 2 3; do
	w=$(dbcage plan 2>&1 | grep 'not applied')
	[ -z "$w" ] && break
	echo "$w" | sed 's/^/  plan: /'
	case $w in *"restart $U"*) restarted=yes; systemctl restart $U ;; esac
	dbcage apply >/dev/null 2>&1 || fail "apply before the leaves"
	applies=$((applies + 1))
done
figure "delegated unit on cgroup v$V: $applies apply before the plan could make the leaves, restart needed: $restarted"
out=$(dbcage apply 2>&1) || fail "apply with the delegated unit: $out"
echo "$out" | sed 's/^/  apply: /' | head -n 20
W=$(walwriter)
eq "the WAL writer's io group" "$(io_cg_of "$W")" "$CG/exempt"
bad=0 n=0
for p in $(main_pids); do
	[ "$p" = "$W" ] && continue
	n=$((n + 1))
	[ "$(io_cg_of "$p")" = "$CG/limited" ] || { bad=$((bad + 1)); echo "  pid $p in $(io_cg_of "$p")"; }
	case $(cg_of "$p") in "$CG" | "$CG/limited") ;; *) bad=$((bad + 1)); echo "  pid $p left its unit: $(cg_of "$p")" ;; esac
done
eq "postgres processes outside the limited leaf (of $n)" "$bad" "0"
eq "systemd counts every postgres process in the unit (TasksCurrent)" "$(show $U TasksCurrent)" "$(main_pids | wc -l)"
eq "the unit's own IO property is cleared" "$(show $U IOReadBandwidthMax)" ""
if [ $V = 2 ]; then
	has "io.max of the limited leaf" "$(cat $IOD$CG/limited/io.max)" "$VDC rbps=1048576"
	eq "io.max of the exempt leaf" "$(cat $IOD$CG/exempt/io.max)" ""
	eq "io.max of the unit" "$(cat $IOD$CG/io.max)" ""
else
	eq "blkio read limit of the limited leaf" "$(cat $IOD$CG/limited/blkio.throttle.read_bps_device)" "$VDC 1048576"
	eq "blkio read limit of the exempt leaf" "$(cat $IOD$CG/exempt/blkio.throttle.read_bps_device)" ""
fi
eq "kernel cpu quota of the unit (its property)" "$(quota_of $CG)" "50000 100000"
out=$(dbcage plan 2>&1)
case $out in *"not applied"*) fail "plan still says not applied: $out" ;; *) pass "plan: nothing left not applied" ;; esac
# Direct reads of 2 MiB from each leaf (a shell joins the leaf, then execs dd).
read_in() { # read_in LEAF SKIP_MIB: prints the rate in KiB/s
	local s e
	s=$(ms)
	bash -c "echo \$\$ >$IOD$CG/$1/cgroup.procs && exec dd if=/dev/vdc of=/dev/null bs=64k count=32 skip=$(($2 * 16)) iflag=direct status=none" || { echo 0; return; }
	e=$(( $(ms) - s ))
	echo $(( 2048 * 1000 / (e > 0 ? e : 1) ))
}
lim=$(read_in limited 0)
ex=$(read_in exempt 8)
figure "direct reads of 2 MiB from the delegated unit's leaves (limit 1 MiB/s on limited): limited $lim KiB/s, exempt $ex KiB/s"
if [ "$lim" -gt 0 ] && [ "$lim" -le 1300 ]; then pass "the limited leaf holds the limit ($lim KiB/s)"; else fail "the limited leaf read $lim KiB/s (limit 1024)"; fi
if [ "$ex" -ge $((lim * 3)) ]; then pass "the exempt leaf reads past the limit ($ex KiB/s)"; else fail "the exempt leaf read $ex KiB/s, not 3x the limited leaf's $lim"; fi
# A restart under the daemon: the new processes reach their leaves.
daemon dbcage-test-daemon5 60s
systemctl restart $U
s=$(ms)
ok=0
while [ $(( $(ms) - s )) -lt 5000 ]; do
	W=$(walwriter)
	if [ -n "$W" ] && [ "$(io_cg_of "$W")" = "$CG/exempt" ]; then
		left=0
		for p in $(main_pids); do [ "$p" = "$W" ] || [ "$(io_cg_of "$p")" = "$CG/limited" ] || left=$((left + 1)); done
		[ $left = 0 ] && { ok=1; break; }
	fi
	sleep 0.1
done
took=$(( $(ms) - s ))
figure "systemctl restart of the delegated $U: every new process in its leaf $took ms after the restart returned (restart needed after systemd-setup: $restarted)"
if [ $ok = 1 ] && [ $took -le 3000 ]; then pass "restarted processes in their leaves within 3 s ($took ms)"; else fail "restarted processes not in their leaves within 3 s (ok=$ok, $took ms)"; fi
if [ $V = 2 ]; then f=io.max; else f=blkio.throttle.read_bps_device; fi
has "limited leaf after the restart" "$(cat $IOD$CG/limited/$f)" "$VDC"
# Someone lifts the limited leaf's IO limit by hand: the daemon watches the leaf, writes the
# plan's limit back within 2 s, logs the old value and counts the repair.
r0=$(metric dbcage_systemd_repairs)
echo "$VDC rbps=max" >$IOD$CG/limited/io.max
s=$(ms)
ok=0
while [ $(( $(ms) - s )) -lt 5000 ]; do
	case $(cat $IOD$CG/limited/io.max) in *"$VDC rbps=1048576"*) ok=1; break ;; esac
	sleep 0.1
done
took=$(( $(ms) - s ))
figure "io.max of the delegated unit's limited leaf lifted by hand: the plan's limit back in $took ms"
if [ $ok = 1 ] && [ $took -le 2000 ]; then pass "the leaf's limit written back within 2 s ($took ms)"; else fail "the leaf's limit not back within 2 s (ok=$ok, $took ms): $(cat $IOD$CG/limited/io.max)"; fi
sleep 1
eq "repairs counted for the leaf's io.max (one)" "$(( $(metric dbcage_systemd_repairs) - ${r0:-0} ))" "1"
has "the daemon's log names the leaf's file" "$(journalctl -b -u dbcage-test-daemon5 --no-pager -o cat | grep 'differs from the plan')" "$CG/limited/io.max"
systemctl stop dbcage-test-daemon5
before=$(main_pids | tr '\n' ' ')
out=$(dbcage release pg 2>&1) || fail "release pg: $out"
echo "$out" | sed 's/^/  release: /'
has "release output" "$out" "back from dbcage's leaves to their unit's own group"
if [ -d $IOD$CG/limited ] || [ -d $IOD$CG/exempt ]; then fail "leaves left after release: $(ls $IOD$CG)"; else pass "release removed the leaves"; fi
eq "after release: the postgres processes" "$(main_pids | tr '\n' ' ')" "$before"
bad=0
for p in $(main_pids); do [ "$(io_cg_of "$p")" = "$CG" ] || bad=$((bad + 1)); done
eq "after release: processes outside the unit's own group" "$bad" "0"
eq "postgres active after release" "$(systemctl is-active $U)" "active"
rm -f "$DROP"
systemctl daemon-reload
fi
figure "delegated-unit section (check, systemd-setup, apply, reads, a restart, release): $(( $(ms) - t0 )) ms"

# ---------------------------------------------------------------- exempt leaves in dbcage's own scope
# A tenant started outside systemd (a login session) with an IO limit and an exempt process: the
# adoption starts dbcage-scoped.scope (Delegate=yes) with both processes in its own group, and
# the plan after it (run by `apply` before it returns) makes `limited` and `exempt` leaves inside
# the scope, moves them in, puts the IO limit on `limited` and clears the scope's IO property.
# Measured: direct reads from `limited` hold the limit, from `exempt` they do not. Under the
# daemon, processes started later go straight into their leaf (AttachProcessesToUnit with the
# leaf as subgroup). `release` brings them back to the scope's own group. cgroup v2 only: on v1
# `check` says why there are no leaves.
t0=$(ms)
SC=dbcage-scoped.scope
SCG=/dbcage.slice/$SC
cp /bin/sleep /usr/local/bin/dbcagescoped
cp /bin/sleep /usr/local/bin/dbcagescopelog
cat >/etc/dbcage/dbcage.toml <<'POLICY'
[agent]
metrics = "127.0.0.1:9477"
[[tenant]]
name = "scoped"
match = [{ comm = '^dbcagescoped$' }, { comm = '^dbcagescopelog$' }]
exempt = [{ comm = '^dbcagescopelog$' }]
storage = ["/dev/vdc"]
[tenant.io]
read_bps = "1MiB"
[tenant.cpu]
cores = 0.5
POLICY
newest() { pgrep -n -x "$1"; }
session() { # session N: a login session's scope running dbcagescoped and dbcagescopelog; sets L, E
	local l0 e0
	l0=$(newest dbcagescoped) e0=$(newest dbcagescopelog)
	systemd-run --quiet --scope --unit="session-dbcagescoped$1.scope" --slice=user.slice \
		bash -c '/usr/local/bin/dbcagescoped 100000 & exec /usr/local/bin/dbcagescopelog 100000' &
	for _ in $(seq 100); do
		L=$(newest dbcagescoped) E=$(newest dbcagescopelog)
		[ -n "$L" ] && [ -n "$E" ] && [ "$L" != "$l0" ] && [ "$E" != "$e0" ] && return 0
		sleep 0.05
	done
	fail "session $1 did not start its two processes"
}
session 1
L1=$L E1=$E
out=$(dbcage apply 2>&1) || fail "apply with a tenant in a login session: $out"
echo "$out" | sed 's/^/  apply: /' | head -n 20
if [ $V = 1 ]; then
	eq "v1: dbcagescoped adopted into its scope" "$(cg_of "$L1")" "$SCG"
	out=$(dbcage check 2>&1)
	has "check on v1" "$out" "exempt processes in $SC run under its IO limits"
	has "check on v1" "$out" "dbcage makes that leaf on cgroup v2 only"
else
	has "apply" "$out" "then, the scopes' leaves for the adopted processes"
	eq "dbcagescoped's cgroup" "$(cg_of "$L1")" "$SCG/limited"
	eq "dbcagescopelog's cgroup (exempt)" "$(cg_of "$E1")" "$SCG/exempt"
	eq "nothing in the scope's own group" "$(procs_in "$SCG")" ""
	eq "$SC IOReadBandwidthMax (on the leaf instead)" "$(show $SC IOReadBandwidthMax)" ""
	eq "$SC CPUQuotaPerSecUSec" "$(show $SC CPUQuotaPerSecUSec)" "500ms"
	eq "$SC Delegate" "$(show $SC Delegate)" "yes"
	has "io.max of the scope's limited leaf" "$(cat /sys/fs/cgroup$SCG/limited/io.max)" "$VDC rbps=1048576"
	eq "io.max of the scope's exempt leaf" "$(cat /sys/fs/cgroup$SCG/exempt/io.max)" ""
	out=$(dbcage plan 2>&1)
	case $out in *"not applied"*) fail "plan says not applied: $out" ;; *) pass "plan: nothing left not applied" ;; esac
	case $out in *"adopt"* | *"move"*) fail "plan after apply still has steps: $out" ;; *) pass "plan after apply: nothing to do" ;; esac
	read_from() { # read_from GROUP SKIP_MIB: 2 MiB of direct reads from a process in GROUP, in KiB/s
		local s e
		s=$(ms)
		bash -c "echo \$\$ >/sys/fs/cgroup$1/cgroup.procs && exec dd if=/dev/vdc of=/dev/null bs=64k count=32 skip=$(($2 * 16)) iflag=direct status=none" || { echo 0; return; }
		e=$(( $(ms) - s ))
		echo $(( 2048 * 1000 / (e > 0 ? e : 1) ))
	}
	lim=$(read_from "$SCG/limited" 16)
	ex=$(read_from "$SCG/exempt" 24)
	figure "direct reads of 2 MiB from dbcage's scope's leaves (limit 1 MiB/s on limited): limited $lim KiB/s, exempt $ex KiB/s"
	if [ "$lim" -gt 0 ] && [ "$lim" -le 1300 ]; then pass "the scope's limited leaf holds the limit ($lim KiB/s)"; else fail "the scope's limited leaf read $lim KiB/s (limit 1024)"; fi
	if [ "$ex" -ge $((lim * 3)) ]; then pass "the scope's exempt leaf reads past the limit ($ex KiB/s)"; else fail "the scope's exempt leaf read $ex KiB/s, not 3x the limited leaf's $lim"; fi
	# Under the daemon: a second session's processes go straight into their leaves, sampled
	# every 100 ms from their start (the leaves have no cpu.max: io is their only controller).
	daemon dbcage-test-daemon7 60s
	rm -f /tmp/dbcage-test-stop7
	dbcage-test-sample /usr/local/bin/dbcagescoped "^$SCG/limited\$" "" /tmp/dbcage-test-stop7 >/tmp/dbcage-test-scoped-l &
	sl=$!
	dbcage-test-sample /usr/local/bin/dbcagescopelog "^$SCG/exempt\$" "" /tmp/dbcage-test-stop7 >/tmp/dbcage-test-scoped-e &
	se=$!
	session 2
	for _ in $(seq 50); do
		[ "$(cg_of "$L")" = "$SCG/limited" ] && [ "$(cg_of "$E")" = "$SCG/exempt" ] && break
		sleep 0.1
	done
	sleep 0.5
	touch /tmp/dbcage-test-stop7
	wait $sl $se
	rl=$(tail -n1 /tmp/dbcage-test-scoped-l) re=$(tail -n1 /tmp/dbcage-test-scoped-e)
	echo "  sampled limited: $rl"
	echo "  sampled exempt: $re"
	figure "a login session's new processes into dbcage's scope's leaves (daemon, event path; two AttachProcessesToUnit calls, one per leaf): limited $(field late_ms "$rl") ms, exempt $(field late_ms "$re") ms after first seen"
	for r in "$rl" "$re"; do
		late=$(field late_ms "$r")
		[ -n "$late" ] && [ "$late" != never ] && [ "$late" -le 1500 ] && pass "a new process in its scope leaf within 1.5 s ($late ms)" || fail "a new process not in its scope leaf within 1.5 s: $r"
	done
	eq "the second session's processes in their leaves" "$(cg_of "$L") $(cg_of "$E")" "$SCG/limited $SCG/exempt"
	eq "nothing in the scope's own group under the daemon" "$(procs_in "$SCG")" ""
	systemctl stop dbcage-test-daemon7
	out=$(dbcage release scoped 2>&1) || fail "release scoped: $out"
	echo "$out" | sed 's/^/  release: /'
	has "release output" "$out" "back from dbcage's leaves to their unit's own group"
	if [ -d /sys/fs/cgroup$SCG/limited ] || [ -d /sys/fs/cgroup$SCG/exempt ]; then fail "scope leaves left after release"; else pass "release removed the scope's leaves"; fi
	eq "after release: dbcagescoped's cgroup" "$(cg_of "$L1")" "$SCG"
	eq "after release: the scope runs on" "$(systemctl is-active $SC)" "active"
fi
for p in $(pgrep -x dbcagescoped) $(pgrep -x dbcagescopelog); do kill "$p"; done
for _ in $(seq 50); do systemctl is-active --quiet $SC || break; sleep 0.1; done
rm -f /usr/local/bin/dbcagescoped /usr/local/bin/dbcagescopelog
figure "dbcage's-scope section (adoption, leaves, reads, the daemon, release): $(( $(ms) - t0 )) ms"

# ---------------------------------------------------------------- the demand split on a unit's properties
# io.split = "demand" under systemd: the balancer's per-device shares become the unit's
# IOReadBandwidthMax at its own interval (500 ms), not at the next rescan (10 min here), and are
# not counted as repairs of drift. One reader of vdc in a unit of its own (tenant matched by
# unit =): vdc's share of the 4 MiB/s total grows past the equal 2 MiB/s, vdd's falls, the sum
# stays within the total, and the kernel holds the unit's value.
t0=$(ms)
R=dbcage-test-reader.service
cat >/etc/dbcage/dbcage.toml <<EOF
[agent]
metrics = "127.0.0.1:9477"
[[tenant]]
name = "rd"
match = [{ unit = "$R" }]
storage = ["/dev/vdc", "/dev/vdd"]
[tenant.io]
read_bps = "4MiB"
split = "demand"
EOF
systemd-run --quiet --unit=$R bash -c 'while :; do dd if=/dev/vdc of=/dev/null bs=64k count=256 iflag=direct status=none; done'
RCG=$(show $R ControlGroup)
share() { show $R IOReadBandwidthMax | sed -n "s|^$1 \([0-9]*\)$|\1|p"; }
daemon dbcage-test-daemon8 600s
r0=$(metric dbcage_systemd_repairs)
s=$(ms)
ok=0
while [ $(( $(ms) - s )) -lt 30000 ]; do
	c=$(share /dev/vdc) d=$(share /dev/vdd)
	if [ -n "$c" ] && [ -n "$d" ] && [ "$c" -gt 2097152 ] && [ "$d" -lt 2097152 ]; then ok=1; break; fi
	sleep 0.2
done
took=$(( $(ms) - s ))
figure "io.split = demand on $R: vdc/vdd shares ${c:-?}/${d:-?} B/s of 4 MiB/s on the unit's IOReadBandwidthMax $took ms after the daemon was ready"
if [ $ok = 1 ]; then pass "the unit's per-device shares follow the reader ($c on vdc, $d on vdd)"; else fail "the unit's shares did not follow the reader within 30 s: $(show $R IOReadBandwidthMax | tr '\n' ' ')"; fi
if [ $(( ${c:-0} + ${d:-0} )) -le 4194304 ]; then pass "the shares sum within the total"; else fail "the shares sum past the total: $c + $d"; fi
eq "rescans while the shares moved (only the first plan)" "$(metric dbcage_rescans)" "0"
# The kernel holds the unit's value (read until both agree: the split may move in between).
kernel=""
for _ in $(seq 15); do
	want=$(share /dev/vdc)
	if [ $V = 2 ]; then
		kernel=$(grep "^$VDC " /sys/fs/cgroup$RCG/io.max | sed -n 's/.* rbps=\([0-9]*\) .*/\1/p')
	else
		kernel=$(sed -n "s/^$VDC \([0-9]*\)$/\1/p" /sys/fs/cgroup/blkio$RCG/blkio.throttle.read_bps_device)
	fi
	[ -n "$want" ] && [ "$kernel" = "$want" ] && break
	sleep 0.2
done
eq "the kernel's read limit on vdc for the reader's unit" "$kernel" "$want"
eq "rebalances counted as repairs" "$(( $(metric dbcage_systemd_repairs) - ${r0:-0} ))" "0"
systemctl stop dbcage-test-daemon8
systemctl stop $R
dbcage release rd >/dev/null 2>&1 || true
figure "demand-split section: $(( $(ms) - t0 )) ms"

# ---------------------------------------------------------------- MariaDB under the mysql preset
# mariadb.service (MariaDB 10.11, Debian's package) governed by `preset = "mysql"`: the server is
# found from its pid file; its limits go on the unit (CPUQuota, MemoryMax, and the IO limits on
# the disk of its datadir) and reach the kernel; `systemctl status` lists the server in its unit;
# the server's threads are in the unit's group (it is moved as a process, never by thread); a
# restart under the daemon keeps the new server in its unit and limited; `release` gives the
# unit systemd's defaults back and leaves the server running.
t0=$(ms)
M=mariadb.service
if systemctl start $M; then pass "systemctl start $M"; else fail "systemctl start $M"; journalctl -b -u $M --no-pager -o cat | tail -n 20 | sed 's/^/  mariadb: /'; fi
figure "systemctl start $M (TCG): $(( $(ms) - t0 )) ms"
MCG=$(show $M ControlGroup)
VDA=$(cat /sys/block/vda/dev)
maria_pid() { cat /run/mysqld/mysqld.pid 2>/dev/null; }
cat >/etc/dbcage/dbcage.toml <<'POLICY'
[agent]
metrics = "127.0.0.1:9477"
[[tenant]]
name = "maria"
preset = "mysql"
datadir = "/var/lib/mysql"
pid_file = "/run/mysqld/mysqld.pid"
[tenant.io]
read_bps = "3MiB"
write_bps = "2MiB"
[tenant.cpu]
cores = 0.3
[tenant.memory]
max = "400MiB"
POLICY
out=$(dbcage check 2>&1) || fail "check with the mysql preset: $out"
out=$(dbcage apply 2>&1) || fail "apply with MariaDB: $out"
echo "$out" | sed 's/^/  apply: /' | head -n 10
maria_limited() { # maria_limited WHEN: the server in its unit, the unit and the kernel hold the plan
	local w=$1 p=$2 t bad=0
	eq "$w: mariadbd's cgroup" "$(cg_of "$p")" "$MCG"
	for t in /proc/"$p"/task/*; do
		[ "$(sed -n 's/^0::\(.*\)$/\1/p; s/^[0-9]*:name=systemd:\(.*\)$/\1/p' "$t/cgroup" 2>/dev/null | tail -n1)" = "$MCG" ] || bad=$((bad + 1))
	done
	eq "$w: mariadbd threads outside $M (of $(ls /proc/"$p"/task | wc -l))" "$bad" "0"
	eq "$w: $M CPUQuotaPerSecUSec" "$(show $M CPUQuotaPerSecUSec)" "300ms"
	eq "$w: $M MemoryMax" "$(show $M MemoryMax)" "419430400"
	eq "$w: $M IOReadBandwidthMax" "$(show $M IOReadBandwidthMax)" "/dev/vda 3145728"
	eq "$w: $M IOWriteBandwidthMax" "$(show $M IOWriteBandwidthMax)" "/dev/vda 2097152"
	eq "$w: kernel cpu quota of $M" "$(quota_of "$MCG")" "30000 100000"
	eq "$w: kernel memory limit of $M" "$(mem_of "$MCG")" "419430400"
	if [ $V = 2 ]; then
		has "$w: kernel io.max of $M" "$(cat "/sys/fs/cgroup$MCG/io.max")" "$VDA rbps=3145728 wbps=2097152"
	else
		eq "$w: kernel blkio read limit of $M" "$(cat "/sys/fs/cgroup/blkio$MCG/blkio.throttle.read_bps_device" 2>&1)" "$VDA 3145728"
		eq "$w: kernel blkio write limit of $M" "$(cat "/sys/fs/cgroup/blkio$MCG/blkio.throttle.write_bps_device" 2>&1)" "$VDA 2097152"
	fi
}
mp=$(maria_pid)
[ -n "$mp" ] || fail "no mariadbd pid in /run/mysqld/mysqld.pid"
maria_limited "apply" "$mp"
has "systemctl status $M" "$(systemctl status $M --no-pager -l 2>&1)" "$mp /usr/sbin/mariadbd"
out=$(dbcage status 2>&1)
echo "$out" | sed 's/^/  status: /'
has "status" "$out" "in $M"
case $out in *"NOT LIMITED"*) fail "status says NOT LIMITED" ;; *) pass "status: limited" ;; esac
maria_status() { # maria_status WHEN: status reads tenant maria from its unit (the server, and
	# any helper the unit runs next to it: Debian's debian-start after a start)
	local json n
	json=$(dbcage status --json | tr -d ' \n')
	has "$1: status --json" "$json" "\"name\":\"maria\",\"units\":[\"$MCG\"]"
	n=$(sed -n 's/.*"name":"maria","units":\[[^]]*\],"processes":\([0-9]*\).*/\1/p' <<<"$json")
	[ "${n:-0}" -ge 1 ] && pass "$1: status counts $n process(es) in $M" || fail "$1: status counts '${n}' processes in $M"
}
maria_status "apply"
# A restart under the daemon: the new server is in its unit and limited at once (the unit's
# runtime properties outlive its processes); the daemon sees it come (pid file, fork, exec).
daemon dbcage-test-daemon6 60s
t1=$(ms)
systemctl restart $M || fail "systemctl restart $M"
figure "systemctl restart $M (TCG): $(( $(ms) - t1 )) ms"
np=$(maria_pid)
[ -n "$np" ] && [ "$np" != "$mp" ] && pass "a new mariadbd after the restart ($mp -> $np)" || fail "no new mariadbd after the restart ($mp -> '$np')"
maria_limited "after the restart" "$np"
maria_status "after the restart"
eq "repairs after the restart (nothing drifted)" "$(metric dbcage_systemd_repairs)" "0"
systemctl stop dbcage-test-daemon6
out=$(dbcage release maria 2>&1) || fail "release maria: $out"
echo "$out" | sed 's/^/  release: /'
eq "after release: $M CPUQuotaPerSecUSec" "$(show $M CPUQuotaPerSecUSec)" "infinity"
eq "after release: $M IOReadBandwidthMax" "$(show $M IOReadBandwidthMax)" ""
eq "after release: $M MemoryMax" "$(show $M MemoryMax)" "infinity"
eq "after release: mariadbd still runs in its unit" "$(maria_pid) $(cg_of "$np")" "$np $MCG"
systemctl stop $M
figure "MariaDB section (start, apply, checks, a restart under the daemon, release): $(( $(ms) - t0 )) ms"
cat "$SDGUEST_OUT/figures.txt"
echo "RESULT: $fails failure(s)"
[ $fails = 0 ]
