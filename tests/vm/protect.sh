#!/bin/sh
# Guest-side checks of [tenant.io] weight and latency_target on cgroup v2 (run by
# tests/vm/run.sh, busybox sh):
#   cargo build --release && tests/vm/run.sh target/release/dbcage tests/vm/protect.sh
# - check names vdb when iocost is off on it, and says nothing once it is on;
# - apply writes io.weight on the tenant groups and the weights bind: two direct sequential
#   readers of vdb (fio, libaio, 1 MiB, queue depth 4) at weights 100 and 300 read within +-10%
#   of 1:3 (io.stat of each tenant over 10 s, after 4 s);
# - latency_target becomes the tenant's io.latency line on vdb, and is cleared when removed; on
#   a kernel without blk-iolatency (Debian's: CONFIG_BLK_CGROUP_IOLATENCY is not set, so the
#   guest's) check says so, apply succeeds and writes nothing for it.
# Prints PASS/FAIL lines and "N passed, N failed"; exits non-zero when a check failed.

CG=/sys/fs/cgroup
ROOT=$CG/dbcage-test
P=0
F=0
pass() { echo "PASS $*"; P=$((P + 1)); }
fail() { echo "FAIL $*"; F=$((F + 1)); }
info() { echo "INFO $*"; }
now_ns() { /bin/date +%s%N; }
in_range() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v + 0 >= lo + 0 && v + 0 <= hi + 0) }'; }
devkey() {
    v=$(grep "^$2 " "$1" 2>/dev/null | tr ' ' '\n' | grep "^$3=" | cut -d= -f2)
    echo "${v:-0}"
}
VDB=$(cat /sys/class/block/vdb/dev)
echo "=== dbcage io.weight / io.latency: kernel $(uname -r), vdb=$VDB"

policy() { # policy LOW_EXTRA HIGH_EXTRA: two tenants on vdb, extra [tenant.io] lines each
    cat >/tmp/protect.toml <<EOF
[agent]
parent = "root"
root = "dbcage-test"
metrics = "off"

[[tenant]]
name = "low"
match = [{ cmdline = "^dbcage-test-low" }]
storage = ["/dev/vdb"]
[tenant.io]
$1

[[tenant]]
name = "high"
match = [{ cmdline = "^dbcage-test-high" }]
storage = ["/dev/vdb"]
[tenant.io]
$2
EOF
}
D="/bin/dbcage -c /tmp/protect.toml"

if [ ! -e $CG/io.cost.qos ]; then
    fail iocost "this kernel has no $CG/io.cost.qos (CONFIG_BLK_CGROUP_IOCOST): nothing to test"
    echo "$P passed, $F failed"
    exit 1
fi
policy "weight = 100" "weight = 300"

# (1) iocost off on vdb: check says so, naming the disk and the fix
out=$($D check 2>&1)
echo "$out" | sed 's/^/INFO | /'
if echo "$out" | grep -q "io.weight = 300 has no effect on $VDB: iocost is not enabled" &&
    echo "$out" | grep -q "$VDB enable=1"; then
    pass check_iocost_off "check names $VDB and the io.cost.qos line that enables it"
else
    fail check_iocost_off "no warning naming $VDB"
fi

# (2) iocost on (the kernel's default model for the disk): no warning
echo "$VDB enable=1" >$CG/io.cost.qos
info "io.cost.qos: $(grep "^$VDB " $CG/io.cost.qos)"
info "io.cost.model: $(grep "^$VDB " $CG/io.cost.model)"
out=$($D check 2>&1)
if echo "$out" | grep -q "io.weight"; then
    fail check_iocost_on "still warns: $out"
else
    pass check_iocost_on "no io.weight warning with iocost on $VDB"
fi

out=$($D apply 2>&1)
rc=$?
echo "$out" | sed 's/^/INFO | /'
wl=$(sed -n 's/^default //p' $ROOT/low/io.weight 2>/dev/null)
wh=$(sed -n 's/^default //p' $ROOT/high/io.weight 2>/dev/null)
if [ $rc -eq 0 ] && [ "$wl" = 100 ] && [ "$wh" = 300 ]; then
    pass apply_weight "io.weight default low=$wl high=$wh"
else
    fail apply_weight "apply exit $rc, io.weight low=[$wl] high=[$wh]"
fi
out=$($D apply 2>&1)
if echo "$out" | grep -q "^nothing to do"; then pass idempotent "second apply: nothing to do"; else fail idempotent "$out"; fi
$D status 2>&1 | sed 's/^/INFO | /'

# (3) two direct readers, one per tenant, on separate halves of vdb; both start together and
# run past the measurement (killed after it)
reader() { # reader TENANT OFFSET
    ln -sf "$(command -v fio)" "/tmp/dbcage-test-$1"
    $D exec "$1" -- "/tmp/dbcage-test-$1" --name="dbcage-test-$1" --filename=/dev/vdb \
        --rw=read --bs=1M --direct=1 --ioengine=libaio --iodepth=4 --offset="$2" \
        --size=128M --time_based --runtime=60 >/dev/null 2>&1 &
    echo $!
}
RL=$(reader low 0)
RH=$(reader high 128M)
/bin/sleep 4
l0=$(devkey $ROOT/low/io.stat "$VDB" rbytes)
h0=$(devkey $ROOT/high/io.stat "$VDB" rbytes)
t0=$(now_ns)
/bin/sleep 10
l1=$(devkey $ROOT/low/io.stat "$VDB" rbytes)
h1=$(devkey $ROOT/high/io.stat "$VDB" rbytes)
t1=$(now_ns)
kill "$RL" "$RH" 2>/dev/null
pkill_children() { for p in $(cat $ROOT/low/limited/cgroup.procs $ROOT/high/limited/cgroup.procs 2>/dev/null); do kill "$p" 2>/dev/null; done; }
pkill_children
wait 2>/dev/null
low=$(awk -v b="$((l1 - l0))" -v ns="$((t1 - t0))" 'BEGIN { printf "%.2f", b / 1048576 / (ns / 1e9) }')
high=$(awk -v b="$((h1 - h0))" -v ns="$((t1 - t0))" 'BEGIN { printf "%.2f", b / 1048576 / (ns / 1e9) }')
ratio=$(awk -v l="$low" -v h="$high" 'BEGIN { if (l > 0) printf "%.2f", h / l; else print 0 }')
if in_range "$ratio" 2.7 3.3; then
    pass weight_ratio "low (100) $low MiB/s, high (300) $high MiB/s: 1:$ratio (want 1:3 +-10%)"
else
    fail weight_ratio "low (100) $low MiB/s, high (300) $high MiB/s: 1:$ratio (want 1:2.7-3.3)"
fi

# (4) latency_target: the tenant's io.latency line on vdb, read back by status; cleared when
# the key goes. dbcage-test exists now, so dbcage can tell whether the kernel has io.latency.
policy "weight = 100" "weight = 300
latency_target = \"20ms\""
if [ -e $ROOT/high/io.latency ]; then
    $D apply >/dev/null 2>&1
    lat=$(cat $ROOT/high/io.latency 2>&1)
    if [ "$lat" = "$VDB target=20000" ]; then pass latency_set "io.latency [$lat]"; else fail latency_set "io.latency [$lat], want [$VDB target=20000]"; fi
    st=$($D status --json --interval 0 high 2>&1)
    if echo "$st" | tr -d ' \n' | grep -q "\"io_weight\":300" && echo "$st" | tr -d ' \n' | grep -q "\"$VDB\":20000"; then
        pass status_readback "status --json shows io_weight 300 and $VDB's 20000 us target"
    else
        fail status_readback "$st"
    fi
    policy "" ""
    $D apply >/dev/null 2>&1
    lat=$(cat $ROOT/high/io.latency 2>&1)
    wh=$(sed -n 's/^default //p' $ROOT/high/io.weight 2>/dev/null)
    if [ -z "$lat" ] && [ "$wh" = 100 ]; then pass undone "io.latency empty, io.weight back to 100"; else fail undone "io.latency [$lat], io.weight [$wh]"; fi
else
    info "this kernel has no io.latency (CONFIG_BLK_CGROUP_IOLATENCY not set): checking that dbcage says so and writes nothing"
    out=$($D check 2>&1)
    echo "$out" | grep "latency" | sed 's/^/INFO | /'
    if echo "$out" | grep -q "io.latency_target = 20ms has no effect on this host: its kernel has no blk-iolatency"; then
        pass latency_unsupported_check "check says the kernel has no blk-iolatency"
    else
        fail latency_unsupported_check "$out"
    fi
    plan=$($D plan 2>&1)
    out=$($D apply 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && ! echo "$plan" | grep -q "high/io.latency"; then
        pass latency_unsupported_apply "apply exit 0, nothing planned for io.latency"
    else
        fail latency_unsupported_apply "apply exit $rc: $out"
    fi
    st=$($D status --json --interval 0 high 2>&1)
    if echo "$st" | tr -d ' \n' | grep -q "\"io_weight\":300"; then
        pass status_readback "status --json shows io_weight 300"
    else
        fail status_readback "$st"
    fi
    policy "" ""
    $D apply >/dev/null 2>&1
    wh=$(sed -n 's/^default //p' $ROOT/high/io.weight 2>/dev/null)
    if [ "$wh" = 100 ]; then pass undone "io.weight back to 100"; else fail undone "io.weight [$wh]"; fi
fi

$D release --all >/dev/null 2>&1
echo "$VDB enable=0" >$CG/io.cost.qos
echo "$P passed, $F failed"
[ "$F" -eq 0 ]
