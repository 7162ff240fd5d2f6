#!/bin/bash
# Per-device IO properties set through systemd (govern::assert_unit) throttle a unit's direct
# reads on two virtio disks: an instance total of 4 MiB/s split 2 + 2 over /dev/vdc and /dev/vdd
# (what dbcage's equal split gives), measured with dd iflag=direct, one reader per disk, both in
# one service. Unthrottled first, for the ratio (TCG: measure ratios, not absolute times).
set -u
SDBUS=$SDGUEST_FILES/sdbus
fails=0
pass() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
U=dbcage-test-reader.service
MIB=12
# Fill the disks so reads are real (sparse files read as zeros, fast, in the host's cache).
for d in vdc vdd; do dd if=/dev/urandom of=/dev/$d bs=1M count=$MIB oflag=direct status=none; done

# The readers run inside the unit (a oneshot service that waits for a go file), so the limits
# are set through systemd before any byte is read.
# (A script file: systemd-run would expand $VAR in its arguments itself.)
cat >/tmp/dbcage-test-readers.sh <<EOF
#!/bin/bash
while [ ! -e /run/dbcage-test-go ]; do sleep 0.05; done
for d in vdc vdd; do
	( s=\${EPOCHREALTIME/./}
	  dd if=/dev/\$d of=/dev/null bs=256k count=$((MIB * 4)) iflag=direct status=none
	  echo \$(( (\${EPOCHREALTIME/./} - s) / 1000 )) >/tmp/dbcage-test-\$d.ms ) &
done
wait
EOF
chmod 755 /tmp/dbcage-test-readers.sh
start_unit() {
	rm -f /run/dbcage-test-go /tmp/dbcage-test-vd?.ms
	systemctl reset-failed $U 2>/dev/null
	systemd-run --unit=$U --slice=system.slice -p Type=exec -p CollectMode=inactive-or-failed \
		/tmp/dbcage-test-readers.sh 2>&1 | sed 's/^/  systemd-run: /'
	systemctl is-active $U | sed 's/^/  reader unit: /'
}
run_readers() { # prints "vdc_ms vdd_ms"
	touch /run/dbcage-test-go
	local i
	for i in $(seq 600); do [ -s /tmp/dbcage-test-vdc.ms ] && [ -s /tmp/dbcage-test-vdd.ms ] && break; sleep 0.1; done
	echo "$(cat /tmp/dbcage-test-vdc.ms) $(cat /tmp/dbcage-test-vdd.ms)"
	journalctl -b -u $U --no-pager -o cat | tail -5 | sed 's/^/  reader journal: /' >&2
	systemctl stop $U 2>/dev/null
}

start_unit
read -r free_c free_d < <(run_readers)
echo "unthrottled: vdc ${free_c} ms, vdd ${free_d} ms for $MIB MiB each"
start_unit
out=$($SDBUS assert $U "IOReadBandwidthMax=/dev/vdc 2097152, /dev/vdd 2097152")
echo "$out" | sed 's/^/  /'
cg=$(systemctl show -p ControlGroup --value $U)
sed 's/^/  io.max: /' "/sys/fs/cgroup$cg/io.max"
read -r lim_c lim_d < <(run_readers)
echo "throttled 2 MiB/s each: vdc ${lim_c} ms, vdd ${lim_d} ms for $MIB MiB each"
want=$(( MIB * 1000 / 2 ))   # ms at 2 MiB/s
for pair in "vdc $lim_c" "vdd $lim_d"; do
	set -- $pair
	rate=$(awk -v mib=$MIB -v ms="$2" 'BEGIN { printf "%.2f", mib / (ms / 1000) }')
	echo "measured: $1 $rate MiB/s (limit 2.00)"
	# The throttle lets a first slice through; allow -20% / +20% (+1.5 s of TCG start-up).
	if [ "$2" -ge $(( want * 80 / 100 )) ] && [ "$2" -le $(( want * 120 / 100 + 1500 )) ]; then
		pass "$1 read at $rate MiB/s, within the limit's band"
	else
		fail "$1 read $MIB MiB in $2 ms, want about $want ms"
	fi
done
[ "$free_c" -lt $(( want / 2 )) ] && pass "unthrottled reads were at least twice as fast ($free_c ms)" ||
	fail "unthrottled reads took $free_c ms: the disks are too slow for this test to tell"
total=$(awk -v mib=$MIB -v a="$lim_c" -v b="$lim_d" 'BEGIN { m = (a > b ? a : b); printf "%.2f", 2 * mib / (m / 1000) }')
echo "measured: instance total $total MiB/s over both disks (limit 4.00)"
echo "RESULT: $fails failure(s)"
[ $fails = 0 ]
