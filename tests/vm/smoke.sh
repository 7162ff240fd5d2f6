#!/bin/sh
# Guest-side smoke test for the cgroup v2 test VM (run by tests/vm/run.sh,
# busybox sh). Checks the environment the dbcage VM tests rely on and probes
# which block device types io.max accepts.
#   tests/vm/run.sh /bin/true tests/vm/smoke.sh
# Prints "PASS name detail" / "FAIL name detail" per check, "INFO ..." for
# facts, and closes with "N passed, N failed".

CG=/sys/fs/cgroup
P=0
F=0
pass() { echo "PASS $*"; P=$((P + 1)); }
fail() { echo "FAIL $*"; F=$((F + 1)); }
info() { echo "INFO $*"; }
check() { # check NAME DETAIL CMD... : PASS if CMD succeeds
    n=$1 d=$2
    shift 2
    if "$@" >/dev/null 2>&1; then pass "$n" "$d"; else fail "$n" "$d"; fi
}

# busybox sh runs its own applet for a bare "dd"/"date"/"sleep" even when
# PATH has another binary first (FEATURE_SH_STANDALONE), so call the GNU
# tools that run.sh installs by absolute path.
DD=/bin/dd
[ -x /bin/dd ] && /bin/dd --version >/dev/null 2>&1 || DD="busybox dd"
now_ns() {
    t=$(/bin/date +%s%N 2>/dev/null)
    case "$t" in
        *N* | "") awk '{printf "%d\n", $1 * 1000000000}' /proc/uptime ;;
        *) echo "$t" ;;
    esac
}
# devnum NAME -> MAJ:MIN of /sys/class/block/NAME
devnum() { cat "/sys/class/block/$1/dev" 2>/dev/null; }
# cgwrite FILE VALUE -> prints "ok" or the kernel's error text; returns its status
cgwrite() {
    # echo, not printf: busybox's printf builtin fails silently, echo reports
    # "sh: write error: <errno text>".
    err=$( { echo "$2" >"$1"; } 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then echo ok; else echo "${err##*: }"; fi
    return $rc
}
# run_in CGROUP CMD... : run CMD as a process inside the cgroup
run_in() {
    _g=$1
    shift
    sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$CG/$_g" "$@"
}
# timed_dd CGROUP dd-args... -> prints elapsed milliseconds (or "err")
timed_dd() {
    g=$1
    shift
    t0=$(now_ns)
    if run_in "$g" $DD "$@" 2>/dev/null; then
        echo $((($(now_ns) - t0) / 1000000))
    else
        echo err
    fi
}
mibs() { awk -v b="$1" -v ms="$2" 'BEGIN { if (ms + 0 > 0) printf "%.1f", b / 1048576 / (ms / 1000); else print "inf" }'; }
# throttle_check NAME CGROUP MIN_MS MAX_MS BYTES dd-args...
throttle_check() {
    n=$1 g=$2 lo=$3 hi=$4 bytes=$5
    shift 5
    ms=$(timed_dd "$g" "$@")
    if [ "$ms" = err ]; then
        fail "$n" "dd $* failed"
    elif [ "$ms" -ge "$lo" ] && [ "$ms" -le "$hi" ]; then
        pass "$n" "$((bytes / 1048576)) MiB in ${ms} ms = $(mibs "$bytes" "$ms") MiB/s"
    else
        fail "$n" "$((bytes / 1048576)) MiB in ${ms} ms = $(mibs "$bytes" "$ms") MiB/s (expected ${lo}-${hi} ms)"
    fi
}
NOLIMIT="rbps=max wbps=max riops=max wiops=max"

echo "=== dbcage VM smoke test: kernel $(uname -r), $(nproc) cpus"

# ---------------------------------------------------------------- cgroup2
line=$(grep ' /sys/fs/cgroup cgroup2 ' /proc/mounts)
if [ -n "$line" ]; then pass cgroup2_mounted "$line"; else fail cgroup2_mounted "no cgroup2 at $CG"; fi
case "$line" in
    *favordynmods*) info "favordynmods: accepted by mount (shown in /proc/mounts)" ;;
    *) info "favordynmods: not in mount options" ;;
esac
# Remount probes: can favordynmods be switched at run time, and which other
# cgroup2 mount options (the ones systemd uses) does the kernel accept?
mopts() { awk '$2 == "/sys/fs/cgroup" && $3 == "cgroup2" {print $4}' /proc/mounts; }
r=$(mount -o remount none $CG 2>&1) && r=ok
info "remount without options: $r -> $(mopts)"
for o in favordynmods nsdelegate memory_recursiveprot memory_localevents; do
    r=$(mount -o remount,$o none $CG 2>&1) && r=ok
    info "remount -o $o: $r -> $(mopts)"
done
mount -o remount,favordynmods none $CG 2>/dev/null
case "$(mopts)" in
    *favordynmods*) pass favordynmods_remount "back to $(mopts)" ;;
    *) fail favordynmods_remount "could not restore favordynmods: $(mopts)" ;;
esac
ctrls=$(cat $CG/cgroup.controllers 2>/dev/null)
info "cgroup.controllers: $ctrls"
for c in cpu cpuset io memory; do
    case " $ctrls " in
        *" $c "*) pass "controller_$c" "available" ;;
        *) fail "controller_$c" "missing from cgroup.controllers" ;;
    esac
done

# ---------------------------------------------------------------- NUMA
nodes=$(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l)
detail=""
for n in /sys/devices/system/node/node[0-9]*; do
    [ -d "$n" ] || continue
    mem=$(awk '/MemTotal/ {print $4}' "$n/meminfo")
    detail="$detail ${n##*/}:cpus=$(cat "$n/cpulist"),mem=$((mem / 1024))MiB"
done
if [ "$nodes" -eq 2 ]; then pass numa_nodes "2 nodes:$detail"; else fail numa_nodes "$nodes nodes:$detail"; fi
info "root cpuset.cpus.effective=$(cat $CG/cpuset.cpus.effective 2>/dev/null) cpuset.mems.effective=$(cat $CG/cpuset.mems.effective 2>/dev/null)"

# ---------------------------------------------------------------- disks
for d in vda vdb vdc; do
    if [ -b /dev/$d ] && [ -n "$(devnum $d)" ]; then
        pass "disk_$d" "/dev/$d $(devnum $d) $(($(cat /sys/class/block/$d/size) / 2048)) MiB sched=$(cat /sys/block/$d/queue/scheduler)"
    else
        fail "disk_$d" "/dev/$d missing"
    fi
done
VDA=$(devnum vda)
VDB=$(devnum vdb)
VDC=$(devnum vdc)

# ---------------------------------------------------------------- tools
check tool_gnu_dd "$DD iflag=direct works ($($DD --version 2>/dev/null | head -n1))" \
    $DD if=/dev/vda of=/dev/null iflag=direct bs=64k count=1
t=$(/bin/date +%s%N)
case "$t" in *N* | "") fail tool_date_ns "/bin/date +%s%N gives $t" ;; *) pass tool_date_ns "/bin/date +%s%N works" ;; esac
info "bare 'dd' in busybox sh is: $(type dd) (applets win over PATH)"
if command -v fio >/dev/null 2>&1; then
    check tool_fio "$(fio --version 2>&1)" fio --version
else
    info "fio not in the initramfs"
fi
if [ "$(id -u nobody 2>/dev/null)" = 65534 ]; then
    pass user_nobody "$(id nobody)"
else
    fail user_nobody "id nobody: $(id nobody 2>&1)"
fi
# A symlink to a real (non-busybox) binary runs under the symlink's name.
# (/bin/sleep is GNU sleep; a symlink to a busybox applet would fail with
# "applet not found" because busybox dispatches on argv[0].)
ln -sf /bin/sleep /tmp/ora_p001_BX1
/tmp/ora_p001_BX1 30 &
pid=$!
sleep 0.2
comm=$(cat /proc/$pid/comm 2>/dev/null)
kill $pid 2>/dev/null
wait $pid 2>/dev/null
if [ "$comm" = ora_p001_BX1 ]; then pass proc_name_symlink "comm=$comm"; else fail proc_name_symlink "comm=$comm"; fi

# ---------------------------------------------------------------- cgroup setup
mkdir -p $CG/smoke
check cgroup_create "$CG/smoke" test -f $CG/smoke/cgroup.procs
r=$(cgwrite $CG/cgroup.subtree_control "+io +cpu +memory +cpuset")
if [ "$r" = ok ]; then
    pass subtree_control "root subtree_control: $(cat $CG/cgroup.subtree_control); smoke/cgroup.controllers: $(cat $CG/smoke/cgroup.controllers)"
else
    fail subtree_control "$r"
fi
r=$(cgwrite $CG/smoke/cpuset.cpus 1)
r2=$(cgwrite $CG/smoke/cpuset.mems 1)
allowed=$(run_in smoke grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status | tr -s '\t\n' ' ')
case "$allowed" in
    "Cpus_allowed_list: 1 Mems_allowed_list: 1 ") pass cpuset_node1 "$allowed" ;;
    *) fail cpuset_node1 "write cpus=$r mems=$r2; $allowed" ;;
esac
cgwrite $CG/smoke/cpuset.cpus "" >/dev/null
cgwrite $CG/smoke/cpuset.mems "" >/dev/null
r=$(cgwrite $CG/smoke/memory.max 64M)
v=$(cat $CG/smoke/memory.max)
if [ "$v" = 67108864 ]; then pass memory_max "64M -> $v"; else fail memory_max "write: $r, read: $v"; fi
cgwrite $CG/smoke/memory.max max >/dev/null
r=$(cgwrite $CG/smoke/cpu.max "50000 100000")
v=$(cat $CG/smoke/cpu.max)
if [ "$v" = "50000 100000" ]; then pass cpu_max "$v"; else fail cpu_max "write: $r, read: $v"; fi
cgwrite $CG/smoke/cpu.max "max 100000" >/dev/null

# ---------------------------------------------------------------- io.max on virtio
ms=$(timed_dd "" if=/dev/vda of=/dev/null iflag=direct bs=64k count=256)
info "unthrottled direct read /dev/vda: 16 MiB in ${ms} ms = $(mibs 16777216 "$ms") MiB/s"
ms=$(timed_dd "" if=/dev/zero of=/dev/vdb oflag=direct bs=64k count=256)
info "unthrottled direct write /dev/vdb: 16 MiB in ${ms} ms = $(mibs 16777216 "$ms") MiB/s"

r=$(cgwrite $CG/smoke/io.max "$VDA rbps=4194304")
if [ "$r" = ok ]; then pass iomax_write_vda "$VDA rbps=4194304 -> io.max: $(cat $CG/smoke/io.max)"; else fail iomax_write_vda "$r"; fi
throttle_check iomax_rbps_vda smoke 600 2000 4194304 if=/dev/vda of=/dev/null iflag=direct bs=64k count=64
cgwrite $CG/smoke/io.max "$VDA $NOLIMIT" >/dev/null

r=$(cgwrite $CG/smoke/io.max "$VDA riops=100")
[ "$r" = ok ] || fail iomax_riops_write "$r"
ms=$(timed_dd smoke if=/dev/vda of=/dev/null iflag=direct bs=4k count=100)
if [ "$ms" != err ] && [ "$ms" -ge 600 ] && [ "$ms" -le 2000 ]; then
    pass iomax_riops_vda "100 x 4k reads at riops=100 in ${ms} ms"
else
    fail iomax_riops_vda "100 x 4k reads at riops=100 in ${ms} ms (expected 600-2000 ms)"
fi
cgwrite $CG/smoke/io.max "$VDA $NOLIMIT" >/dev/null

r=$(cgwrite $CG/smoke/io.max "$VDB wbps=4194304")
[ "$r" = ok ] || fail iomax_wbps_write "$r"
throttle_check iomax_wbps_vdb smoke 600 2000 4194304 if=/dev/zero of=/dev/vdb oflag=direct bs=64k count=64
cgwrite $CG/smoke/io.max "$VDB $NOLIMIT" >/dev/null

if command -v fio >/dev/null 2>&1; then
    # Judge fio by its own bandwidth figure: its start-up (dynamic linking of
    # ~60 libraries) takes over a second under TCG.
    cgwrite $CG/smoke/io.max "$VDA rbps=8388608" >/dev/null
    t0=$(now_ns)
    out=$(run_in smoke fio --name=smoke --filename=/dev/vda --rw=read --bs=64k --direct=1 \
        --size=8M --ioengine=psync --minimal 2>&1)
    rc=$?
    ms=$((($(now_ns) - t0) / 1000000))
    # terse v3: field 7 = read bandwidth KiB/s, field 9 = read runtime ms
    bw=$(printf '%s\n' "$out" | awk -F';' 'NF > 9 {print $7; exit}')
    rt=$(printf '%s\n' "$out" | awk -F';' 'NF > 9 {print $9; exit}')
    if [ $rc -eq 0 ] && [ -n "$bw" ] && [ "$bw" -ge 6144 ] && [ "$bw" -le 10240 ]; then
        pass fio_rbps_vda "8 MiB at rbps=8 MiB/s: fio bw=${bw} KiB/s, io runtime ${rt} ms, ${ms} ms wall incl. fio start-up"
    else
        fail fio_rbps_vda "rc=$rc bw=${bw} KiB/s runtime=${rt} ms wall=${ms} ms (expected 6144-10240 KiB/s)"
        printf '%s\n' "$out" | tail -n 5
    fi
    cgwrite $CG/smoke/io.max "$VDA $NOLIMIT" >/dev/null
fi

# ---------------------------------------------------------------- device-type probes
# probe_dev LABEL DEVNAME: can io.max be written for it, and is it enforced?
probe_dev() {
    label=$1 dev=$2
    mm=$(devnum "$dev")
    if [ -z "$mm" ]; then
        fail "iomax_$label" "no /sys/class/block/$dev"
        return
    fi
    r=$(cgwrite $CG/smoke/io.max "$mm rbps=4194304")
    if [ "$r" = ok ]; then
        info "io.max on $label (/dev/$dev $mm): ACCEPTED"
        pass "iomax_$label" "accepted for /dev/$dev $mm"
        throttle_check "iomax_${label}_enforced" smoke 600 2000 4194304 \
            if=/dev/$dev of=/dev/null iflag=direct bs=64k count=64
        cgwrite $CG/smoke/io.max "$mm $NOLIMIT" >/dev/null
    else
        info "io.max on $label (/dev/$dev $mm): REJECTED: $r"
        pass "iomax_$label" "probe done, kernel rejected /dev/$dev $mm: $r"
    fi
}

# iocost_probe LABEL DEVNAME: does io.cost.qos (and so per-device io.weight) work?
iocost_probe() {
    mm=$(devnum "$2")
    [ -n "$mm" ] || return
    r=$(cgwrite $CG/io.cost.qos "$mm enable=1")
    info "io.cost.qos enable=1 on $1 (/dev/$2 $mm): $r"
    [ "$r" = ok ] && cgwrite $CG/io.cost.qos "$mm enable=0" >/dev/null
}

# A partition on a virtio disk: write an MBR with one partition (start 2048,
# 131072 sectors = 64 MiB) to /dev/vdc and re-read the table.
printf '\000\040\041\000\203\376\377\377\000\010\000\000\000\000\002\000' |
    dd of=/dev/vdc bs=1 seek=446 conv=notrunc 2>/dev/null
printf '\125\252' | dd of=/dev/vdc bs=1 seek=510 conv=notrunc 2>/dev/null
sync
blockdev --rereadpt /dev/vdc 2>/dev/null || partprobe /dev/vdc 2>/dev/null
i=0
while [ ! -b /dev/vdc1 ] && [ $i -lt 30 ]; do sleep 0.1; i=$((i + 1)); done
probe_dev partition vdc1
if [ -b /dev/vdc1 ]; then
    cgwrite $CG/smoke/io.max "$VDC rbps=4194304" >/dev/null
    ms=$(timed_dd smoke if=/dev/vdc1 of=/dev/null iflag=direct bs=64k count=64)
    info "io.max on whole disk vdc only, 4 MiB direct read from /dev/vdc1: ${ms} ms = $(mibs 4194304 "$ms") MiB/s"
    cgwrite $CG/smoke/io.max "$VDC $NOLIMIT" >/dev/null
fi
dd if=/dev/zero of=/dev/vdc bs=512 count=1 conv=notrunc 2>/dev/null
sync
blockdev --rereadpt /dev/vdc 2>/dev/null

# Partition-less loop device backed by a tmpfs file.
if command -v losetup >/dev/null 2>&1 && [ -e /dev/loop-control ]; then
    truncate -s 64M /tmp/loop0.img
    LOOP=$(losetup -f)
    if losetup "$LOOP" /tmp/loop0.img; then
        probe_dev loop "${LOOP##*/}"
        iocost_probe loop "${LOOP##*/}"
        # Also a partition of a loop device (losetup -P).
        cp /tmp/loop0.img /tmp/loop1.img
        printf '\000\040\041\000\203\376\377\377\000\010\000\000\000\000\001\000' |
            dd of=/tmp/loop1.img bs=1 seek=446 conv=notrunc 2>/dev/null
        printf '\125\252' | dd of=/tmp/loop1.img bs=1 seek=510 conv=notrunc 2>/dev/null
        LOOP1=$(losetup -f)
        if losetup -P "$LOOP1" /tmp/loop1.img; then
            i=0
            while [ ! -b "${LOOP1}p1" ] && [ $i -lt 30 ]; do sleep 0.1; i=$((i + 1)); done
            probe_dev loop_partition "${LOOP1##*/}p1"
            losetup -d "$LOOP1"
        else
            info "losetup -P failed"
        fi
        losetup -d "$LOOP"
    else
        fail iomax_loop "losetup $LOOP failed"
    fi
    rm -f /tmp/loop0.img /tmp/loop1.img
    # Loop device on top of /dev/vdc: does a limit on vdc apply to I/O through
    # the loop device? (loop reads its backing device buffered, so the page
    # cache is dropped first.)
    LOOP=$(losetup -f)
    if losetup "$LOOP" /dev/vdc; then
        echo 3 >/proc/sys/vm/drop_caches
        cgwrite $CG/smoke/io.max "$VDC rbps=4194304" >/dev/null
        ms=$(timed_dd smoke if=$LOOP of=/dev/null iflag=direct bs=64k count=64)
        info "io.max on vdc only, 4 MiB direct read through $LOOP (backed by /dev/vdc): ${ms} ms = $(mibs 4194304 "$ms") MiB/s"
        cgwrite $CG/smoke/io.max "$VDC $NOLIMIT" >/dev/null
        losetup -d "$LOOP"
    fi
else
    info "no losetup / loop device: loop probe skipped"
fi

# device-mapper linear target over /dev/vdb (first 128 MiB).
if command -v dmsetup >/dev/null 2>&1 && [ -e /dev/mapper/control ]; then
    if out=$(dmsetup --noudevsync create dbcage-smoke --table "0 262144 linear $VDB 0" 2>&1); then
        dm=""
        for d in /sys/block/dm-*; do
            [ "$(cat "$d/dm/name" 2>/dev/null)" = dbcage-smoke ] && dm=${d##*/}
        done
        [ -b "/dev/$dm" ] || mknod "/dev/$dm" b $(devnum "$dm" | tr ':' ' ')
        probe_dev dm_linear "$dm"
        # Does a limit on the underlying disk apply to I/O submitted through dm?
        cgwrite $CG/smoke/io.max "$VDB rbps=4194304" >/dev/null
        ms=$(timed_dd smoke if=/dev/$dm of=/dev/null iflag=direct bs=64k count=64)
        info "io.max on underlying vdb only, 4 MiB direct read through /dev/$dm: ${ms} ms = $(mibs 4194304 "$ms") MiB/s"
        cgwrite $CG/smoke/io.max "$VDB $NOLIMIT" >/dev/null
        iocost_probe dm_linear "$dm"
        dmsetup --noudevsync remove dbcage-smoke >/dev/null 2>&1
    else
        fail iomax_dm_linear "dmsetup create failed: $out"
    fi
    # Request-based dm: a one-path dm-multipath device over /dev/vdb (the
    # usual layout for ASM disks on SAN).
    if out=$(dmsetup --noudevsync create dbcage-mpath \
        --table "0 262144 multipath 0 0 1 1 round-robin 0 1 1 $VDB 1000" 2>&1); then
        dm=""
        for d in /sys/block/dm-*; do
            [ "$(cat "$d/dm/name" 2>/dev/null)" = dbcage-mpath ] && dm=${d##*/}
        done
        [ -b "/dev/$dm" ] || mknod "/dev/$dm" b $(devnum "$dm" | tr ':' ' ')
        info "dm-multipath /dev/$dm: queue/scheduler=$(cat /sys/block/$dm/queue/scheduler 2>/dev/null)"
        probe_dev dm_multipath "$dm"
        cgwrite $CG/smoke/io.max "$VDB rbps=4194304" >/dev/null
        ms=$(timed_dd smoke if=/dev/$dm of=/dev/null iflag=direct bs=64k count=64)
        info "io.max on underlying vdb only, 4 MiB direct read through multipath /dev/$dm: ${ms} ms = $(mibs 4194304 "$ms") MiB/s"
        cgwrite $CG/smoke/io.max "$VDB $NOLIMIT" >/dev/null
        iocost_probe dm_multipath "$dm"
        dmsetup --noudevsync remove dbcage-mpath >/dev/null 2>&1
    else
        info "dm-multipath create failed: $out"
    fi
else
    info "no dmsetup or /dev/mapper/control: dm probe skipped"
fi

# A MAJ:MIN with no block device behind it (8:0 = sda, absent here).
r=$(cgwrite $CG/smoke/io.max "8:0 rbps=4194304")
info "io.max on a nonexistent device (8:0): $r"

# ---------------------------------------------------------------- iocost facts (informational)
r=$(cgwrite $CG/smoke/io.weight "$VDA 200")
info "io.weight '$VDA 200' before io.cost.qos enable: $r"
r=$(cgwrite $CG/io.cost.qos "$VDA enable=1")
info "io.cost.qos '$VDA enable=1': $r"
r=$(cgwrite $CG/smoke/io.weight "$VDA 200")
info "io.weight '$VDA 200' after io.cost.qos enable: $r ($(tr '\n' ';' <$CG/smoke/io.weight))"
cgwrite $CG/io.cost.qos "$VDA enable=0" >/dev/null
r=$(cgwrite $CG/smoke/io.weight "default 100")
info "io.weight 'default 100': $r"

rmdir $CG/smoke 2>/dev/null || info "could not rmdir $CG/smoke"

echo "$P passed, $F failed"
[ "$F" -eq 0 ]
