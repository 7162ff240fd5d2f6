#!/bin/sh
# Guest-side checks of [tenant.io] weight and latency_target on cgroup v2 (run by
# tests/vm/run.sh, busybox sh):
#   cargo build --release && tests/vm/run.sh target/release/dbcage tests/vm/protect.sh
# - check names vdb when iocost is off on it, and says nothing once it is on;
# - apply writes io.weight on the tenant groups and the weights bind: two direct sequential
#   readers of vdb (fio, libaio, 1 MiB, queue depth 4) at weights 100 and 300 read within +-10%
#   of 1:3 (io.stat of each tenant over 10 s, after 4 s);
# - latency_target becomes the tenant's io.latency line on vdb, and is cleared when removed; on
#   a kernel without blk-iolatency (Debian's: CONFIG_BLK_CGROUP_IOLATENCY is not set) check says
#   so, apply succeeds and writes nothing for it.
# - on a kernel with blk-iolatency (tests/vm/build-kernel.sh's, whose release ends in
#   -dbcage-iolatency; scripts/test.sh runs this script on it too, with
#   DBCAGE_VM_MODULES=null_blk), the target protects: on a null_blk disk with a 10 ms timer and
#   8 tags (800 IOPS), B reads at random 4 deep (its mean latency alone is the timer's), A
#   floods random writes from 16 tasks. Without a target B's mean latency is >= 1.8x its solo
#   figure; with B's latency_target at twice its solo mean, blk-iolatency cuts A's queue depth:
#   B's mean stays within the target and <= 0.75x its mean without one, and A still writes (it
#   is throttled, never stopped).
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

policy() { # policy LOW_EXTRA HIGH_EXTRA [DISK]: two tenants on DISK (vdb), extra [tenant.io] lines each
    disk=${3:-/dev/vdb}
    cat >/tmp/protect.toml <<EOF
[agent]
parent = "root"
root = "dbcage-test"
metrics = "off"

[[tenant]]
name = "low"
match = [{ cmdline = "^dbcage-test-low" }]
storage = ["$disk"]
[tenant.io]
$1

[[tenant]]
name = "high"
match = [{ cmdline = "^dbcage-test-high" }]
storage = ["$disk"]
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
case $(uname -r) in
    *-dbcage-iolatency) IOLAT_KERNEL=1 ;;
    *) IOLAT_KERNEL=0 ;;
esac
if [ $IOLAT_KERNEL = 1 ] && [ ! -e $ROOT/high/io.latency ]; then
    fail iolatency_kernel "kernel $(uname -r) was built with blk-iolatency but $ROOT/high/io.latency is missing"
fi
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

# (5) the latency target protects (a kernel with blk-iolatency only)
if [ -e $ROOT/high/io.latency ] || [ $IOLAT_KERNEL = 1 ]; then
    rmmod null_blk 2>/dev/null # run.sh loads it with its defaults
    if ! insmod /lib/modules/null_blk.ko nr_devices=1 queue_mode=2 gb=1 bs=4096 irqmode=2 \
        completion_nsec=10000000 hw_queue_depth=8 2>/dev/null; then
        fail null_blk "no null_blk on a kernel with blk-iolatency (run with DBCAGE_VM_MODULES=null_blk, as scripts/test.sh does)"
        echo "$P passed, $F failed"
        exit 1
    fi
    i=0
    while [ ! -b /dev/nullb0 ] && [ $i -lt 50 ]; do /bin/sleep 0.1; i=$((i + 1)); done
    NB=$(cat /sys/class/block/nullb0/dev)
    lat_policy() { # lat_policy HIGH_IO_LINES: low floods, high reads, both on nullb0
        policy "" "$1" /dev/nullb0
        out=$($D apply 2>&1) || fail lat_apply "apply: $out"
    }
    # nb_job TENANT RW DEPTH SECONDS OUT [JOBS]: fio on nullb0 in the tenant (JOBS synchronous
    # writers when given, else one libaio job DEPTH deep), terse v3 output. A flood is many
    # tasks: blk-mq hands a freed tag to one waiting task, not to one waiting request, so one
    # task 32 deep gets a freed tag about as often as the reader 4 deep does.
    nb_job() {
        if [ -n "$6" ]; then engine="--ioengine=psync --numjobs=$6 --group_reporting"; else engine="--ioengine=libaio --iodepth=$3"; fi
        $D exec "$1" -- "/tmp/dbcage-test-$1" --name="dbcage-test-$1" --filename=/dev/nullb0 \
            --rw="$2" --bs=4k --direct=1 $engine --size=512M \
            --time_based --ramp_time=2 --runtime="$4" --output-format=terse --terse-version=3 >"$5" 2>&1
    }
    # terse v3: field 8 read IOPS, 40 read total latency mean (us: submission and completion,
    # so the wait for a tag inside io_submit counts), 49 write IOPS
    r_iops() { cut -d';' -f8 "$1" | cut -d. -f1; }
    r_mean_ms() { cut -d';' -f40 "$1" | awk '{ printf "%.2f", $1 / 1000 }'; }
    w_iops() { cut -d';' -f49 "$1" | cut -d. -f1; }
    lat_policy ""
    nb_job high randread 4 5 /tmp/solo
    solo=$(r_mean_ms /tmp/solo)
    nb_job high randread 4 6 /tmp/flood0 &
    j=$!
    nb_job low randwrite 1 6 /tmp/a0 16
    wait $j
    flood0=$(r_mean_ms /tmp/flood0)
    # the target: twice B's solo mean, in whole ms
    target=$(awk -v s="$solo" 'BEGIN { t = int(2 * s + 0.5); if (t < 1) t = 1; print t }')
    lat_policy "latency_target = \"${target}ms\""
    info "io.latency of high: $(cat $ROOT/high/io.latency)"
    nb_job high randread 4 8 /tmp/flood1 &
    j=$!
    nb_job low randwrite 1 8 /tmp/a1 16
    wait $j
    flood1=$(r_mean_ms /tmp/flood1)
    info "io.stat of low: $(grep "^$NB " $ROOT/low/io.stat)"
    info "io.stat of high: $(grep "^$NB " $ROOT/high/io.stat)"
    a0=$(w_iops /tmp/a0)
    a1=$(w_iops /tmp/a1)
    line="B alone $(r_iops /tmp/solo) IOPS at a mean $solo ms; A flooding: without a target B $(r_iops /tmp/flood0) IOPS at $flood0 ms (A $a0 IOPS), with latency_target ${target}ms B $(r_iops /tmp/flood1) IOPS at $flood1 ms (A $a1 IOPS)"
    if awk -v f="$flood0" -v s="$solo" 'BEGIN { exit !(f >= 1.8 * s) }'; then
        pass lat_flood_hurts "$line: without a target the flood costs B >= 1.8x its solo mean"
    else
        fail lat_flood_hurts "$line: without a target the flood should cost B >= 1.8x its solo mean"
    fi
    if awk -v f="$flood1" -v f0="$flood0" -v t="$target" 'BEGIN { exit !(f <= t && f <= 0.75 * f0) }' &&
        [ "${a1:-0}" -gt 0 ]; then
        pass lat_protects "$line: B's mean within its target and <= 0.75x of its mean without one, A still writing"
    else
        fail lat_protects "$line: want B's mean <= the target and <= 0.75x its mean without one, and A > 0 IOPS"
    fi
    lat_policy ""
    lat=$(cat $ROOT/high/io.latency 2>&1)
    if [ -z "$lat" ]; then pass lat_cleared "io.latency empty once the key goes"; else fail lat_cleared "io.latency [$lat]"; fi
    $D release --all >/dev/null 2>&1
    rmmod null_blk 2>/dev/null
fi
echo "$P passed, $F failed"
[ "$F" -eq 0 ]
