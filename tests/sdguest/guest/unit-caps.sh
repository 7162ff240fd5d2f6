#!/bin/bash
# The packaged unit (dist/dbcage.service, as shipped) on cgroup v2 under systemd: with its
# CapabilityBoundingSet the daemon moves a root-started process into a cpuset-limited group
# (no EPERM); with CAP_SYS_NICE dropped by a drop-in the same move fails, so the capability is
# what makes it work. Run: tests/sdguest/unit-caps.sh
set -u
fails=0
pass() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
eq() { if [ "$2" = "$3" ]; then pass "$1 = $3"; else fail "$1: got '$2', want '$3'"; fi; }

install -m644 "$SDGUEST_FILES/dbcage.service" /etc/systemd/system/dbcage.service
mkdir -p /etc/dbcage
cat >/etc/dbcage/dbcage.toml <<'EOF'
[agent]
metrics = "off"
# this test is about the cgroupfs path's capabilities (the systemd driver moves nothing itself)
manager = "cgroupfs"
[[tenant]]
name = "capt"
match = [{ comm = '^dbcagecapt$' }]
[tenant.cpu]
cpus = "1"
cores = 0.5
EOF
chmod 600 /etc/dbcage/dbcage.toml
cp /bin/sleep /usr/local/bin/dbcagecapt
systemctl daemon-reload

# A root process with every capability, started outside the daemon (here: in this test's unit).
/usr/local/bin/dbcagecapt 1000 &
victim=$!
grep CapEff /proc/$victim/status | sed 's/^/  victim /'

wait_placed() { # wait_placed WANT_SUBSTRING: up to 10 s for the victim's cgroup to contain it
	local i
	for i in $(seq 100); do
		case $(cat /proc/$victim/cgroup) in *"$1"*) return 0 ;; esac
		sleep 0.1
	done
	return 1
}

# --- as shipped
systemctl start dbcage.service || { fail "dbcage did not start"; journalctl -b -u dbcage --no-pager | tail -20; }
eq "dbcage active" "$(systemctl is-active dbcage.service)" "active"
systemctl show -p CapabilityBoundingSet --value dbcage.service | sed 's/^/  bounding set: /'
if wait_placed /dbcage/capt/limited; then pass "victim placed: $(cat /proc/$victim/cgroup)"; else fail "victim not placed: $(cat /proc/$victim/cgroup)"; fi
G=/sys/fs/cgroup$(cut -d: -f3 /proc/$victim/cgroup)
eq "cpuset.cpus.effective of the victim's group" "$(cat $G/cpuset.cpus.effective 2>&1)" "1"
# the quota is on the tenant's group, shared by its limited and exempt leaves
eq "cpu.max of the victim's tenant group" "$(cat $G/../cpu.max 2>&1)" "50000 100000"
eperm=$(journalctl -b -u dbcage --no-pager | grep -ci 'permission denied\|operation not permitted\|EPERM')
eq "EPERM lines in dbcage's journal (shipped caps)" "$eperm" "0"
st=$(dbcage status 2>&1)
echo "$st" | sed 's/^/  status: /'
case $st in *"NOT LIMITED"*) fail "status says NOT LIMITED with the shipped caps" ;; *) pass "status: no NOT LIMITED note" ;; esac
systemctl stop dbcage.service
dbcage release >/dev/null 2>&1 || true
echo $victim >/sys/fs/cgroup/cgroup.procs 2>/dev/null || true

# --- negative control: the same unit without CAP_SYS_NICE
mkdir -p /etc/systemd/system/dbcage.service.d
caps=$(sed -n 's/^CapabilityBoundingSet=//p' /etc/systemd/system/dbcage.service | sed 's/ *CAP_SYS_NICE//')
printf '[Service]\nCapabilityBoundingSet=\nCapabilityBoundingSet=%s\n' "$caps" >/etc/systemd/system/dbcage.service.d/nonice.conf
systemctl daemon-reload
journalctl --rotate >/dev/null 2>&1
since=$(date +%s)
# The move fails, the process stays in a group without cpuset: the daemon must refuse to run.
systemctl start dbcage.service && fail "dbcage started although its tenant's process is not limited" ||
	pass "dbcage refused to start (the unit's start failed)"
systemctl show -p CapabilityBoundingSet --value dbcage.service | sed 's/^/  bounding set: /'
sleep 1
journalctl -b -u dbcage --no-pager --since "@$since" | tail -8 | sed 's/^/  journal: /'
eperm=$(journalctl -b -u dbcage --no-pager --since "@$since" | grep -ci 'permission denied\|operation not permitted\|EPERM')
[ "$eperm" -gt 0 ] && pass "without CAP_SYS_NICE the journal shows EPERM ($eperm lines)" ||
	fail "without CAP_SYS_NICE no EPERM: is the capability still needed on v2?"
refused=$(journalctl -b -u dbcage --no-pager --since "@$since" | grep -c 'without the controllers their limits need')
[ "$refused" -gt 0 ] && pass "the journal says why ($refused lines)" || fail "no refusal in the journal"
journalctl -b -u dbcage --no-pager --since "@$since" | grep -m2 'has no .* controller' | sed 's/^/  journal: /'
systemctl stop dbcage.service
kill $victim
echo "RESULT: $fails failure(s)"
[ $fails = 0 ]
