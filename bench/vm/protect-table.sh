#!/bin/sh
# Guest side of bench/protect-table.sh (issue 24's measured table; busybox sh, cgroup v2):
# protection against caps on a disk of fixed capacity. null_blk with a 2 ms timer and 8 tags
# (4000 IOPS at most, the same in every run). Two tenants: B (the one to protect) reads 4 KiB at
# random at queue depth 32; A is idle, reads the same way, or floods 4 KiB random writes at depth
# 32. Each depth is 32 tasks doing synchronous IO (fio psync, numjobs 32), as a database's
# backends do: each IO waits in the kernel, where blk-mq's tag allocation and blk-iolatency see
# it. (Until 2026-11-29 each was one libaio task 32 deep: its io_submit blocks on a tag with the
# rest of its IOs still queued in fio, so the kernel saw about 9 of them, blk-mq's wakeups, which
# go to a waiting task, gave the flood about as many tags as the reader, and a latency target set
# from fio's figures was never missed in the kernel.) Configurations, each applied with
# `dbcage apply`:
#   none    no IO keys;
#   caps    A's write_iops and read_iops capped at a tenth of B's solo IOPS without control;
#   caps3, caps5, caps20, caps50  the same cap at a third, a fifth, a twentieth and a fiftieth
#           (only the flood phases: B's IOPS and p99 and A's IOPS while A floods), to find the
#           loosest cap that protects B as much as the weights do (the tighter two since
#           2026-11-29: with B at the top of the weight range no cap of a tenth or looser did);
#   weights `dbcage iocost --destructive --apply` on the disk, io.weight A 100, B 10000: B
#           the one to protect at the top of the range, A at the default (systemd's IOWeight
#           has the same range and default). Under contention B gets 99% of what iocost issues
#           (vrate x the probe's model), and the probe's model drifts 3-13% from what fio
#           gets minutes later in this CPU-bound guest: at 75:925 (92.5%, the bench until
#           2026-11-29, 100:900 before) B kept >= 90% of its solo only when the drift was
#           small (8 of 12 runs). The split is judged at 100:300 (split3);
#   sched   the same after `dbcage iocost --destructive --apply --queue`, which gives the disk
#           the mq-deadline scheduler and 64 requests before measuring it (with no scheduler it
#           has 8, one per tag: a tenant 32 deep waits for a request, and iocost takes more than
#           5% of time waiting as saturation whatever its QoS line says). Until 2026-11-29 the
#           bench wrote mq-deadline and 128 requests by hand, then ran `dbcage iocost --apply`.
# On a kernel with blk-iolatency (tests/vm/build-kernel.sh's; bench/protect-table.sh boots it
# with DBCAGE_IOLATENCY=1), two more, before iocost is turned on and with it:
#   latency B's latency_target at 1.25x its p90 alone without control (blk-iolatency judges a
#           fast disk by the share of requests that miss the target: more than a tenth, so the
#           p90), no weights, iocost off;
#   latwt   the weights (A 100, B 10000 under iocost) plus that latency target;
#   schedlat  sched plus that latency target.
# For each: B alone (IOPS, p99), A alone (IOPS), A flooding while B reads (both), A and B both
# reading (split), and iocost's vrate (the root's io.stat, 7 s into each phase). For none, the
# three caps, sched (and schedlat) also B light: its 32 tasks rate-limited to a quarter of B's
# solo IOPS without control, under A's flood (and alone, but for caps3, caps5, caps20 and caps50): B at depth 32
# saturates the disk, so the flood phase cannot show what weights leave A that a cap does not.
# sched (and schedlat) also split both reading at 100:300 (split3: see there), where the split
# is judged. `dbcage iocost` probes with its default 2 s steps, as a user runs it (until
# 2026-11-29 the bench used 500 ms steps, and the 90%-of-best knee moved between 8 and 16 in
# flight from run to run). Each phase runs fio for 8 s (SECONDS_PER_PHASE) after 2 s of ramp.
# Prints a table, then issue 24's targets as PASS/FAIL lines, and "N passed, N failed". The
# targets' baselines are the issue's: B's and A's solo figures are those without control (a
# tenant alone on the disk), and the weights' work conservation is A's throughput while
# flooding, against A flooding under the loosest cap of the sweep that protects B as much (B
# reading flat out: at least the IOPS the weights left it; B light: at least 90% of what it asks
# at no higher p99).
CG=/sys/fs/cgroup
ROOT=$CG/dbcage-test
WA=100
WB=10000
# each phase's measured seconds (after 2 s of ramp); bench/protect-table.sh rewrites this line
# when DBCAGE_TABLE_SECONDS is set
SECONDS_PER_PHASE=8
P=0
F=0
pass() { echo "PASS $*"; P=$((P + 1)); }
fail() { echo "FAIL $*"; F=$((F + 1)); }
rmmod null_blk 2>/dev/null
if ! insmod /lib/modules/null_blk.ko nr_devices=1 queue_mode=2 gb=1 bs=4096 irqmode=2 \
    completion_nsec=2000000 hw_queue_depth=8 2>/dev/null; then
    fail null_blk "no null_blk (run with DBCAGE_VM_MODULES=null_blk)"
    echo "$P passed, $F failed"
    exit 1
fi
i=0
while [ ! -b /dev/nullb0 ] && [ $i -lt 50 ]; do /bin/sleep 0.1; i=$((i + 1)); done
echo "=== protection vs caps: kernel $(uname -r), nullb0=$(cat /sys/class/block/nullb0/dev)"
D="/bin/dbcage -c /tmp/table.toml"
policy() { # policy A_IO_LINES B_IO_LINES
    cat >/tmp/table.toml <<EOF2
[agent]
parent = "root"
root = "dbcage-test"
metrics = "off"

[[tenant]]
name = "a"
match = [{ cmdline = "^dbcage-test-a" }]
storage = ["/dev/nullb0"]
[tenant.io]
$1

[[tenant]]
name = "b"
match = [{ cmdline = "^dbcage-test-b" }]
storage = ["/dev/nullb0"]
[tenant.io]
$2
EOF2
    out=$($D apply 2>&1) || { echo "apply failed: $out"; exit 1; }
}
ln -sf "$(command -v fio)" /tmp/dbcage-test-a
ln -sf "$(command -v fio)" /tmp/dbcage-test-b
job() { # job TENANT RW OFFSET OUT [FIO_OPTION]
    $D exec "$1" -- "/tmp/dbcage-test-$1" --name="dbcage-test-$1" --filename=/dev/nullb0 --rw="$2" \
        --bs=4k --direct=1 --ioengine=psync --numjobs=32 --group_reporting --offset="$3" --size=256M \
        --time_based --ramp_time=2 --runtime=$SECONDS_PER_PHASE --output-format=terse --terse-version=3 $5 >"$4" 2>&1
}
riops() { cut -d';' -f8 "$1" | cut -d. -f1; }
wiops() { cut -d';' -f49 "$1" | cut -d. -f1; }
rp99_ms() { cut -d';' -f30 "$1" | sed 's/.*=//' | awk '{ printf "%.1f", $1 / 1000 }'; }
rp90_ms() { cut -d';' -f28 "$1" | sed 's/.*=//' | awk '{ printf "%.1f", $1 / 1000 }'; }
NB=$(cat /sys/class/block/nullb0/dev)
vrate() { # the root's iocost vrate for the disk now, "-" when iocost is off
    v=$(grep "^$NB " $CG/io.stat 2>/dev/null | tr ' ' '\n' | sed -n 's/^cost.vrate=//p' | cut -d. -f1)
    echo "${v:--}"
}
sample() { # sample FILE: vrate 7 s into a phase (2 s ramp + 5 s), in the background
    (/bin/sleep 7; vrate >"$1") &
}
measure() { # measure CONFIG [flood]: sets <CONFIG>_* variables through eval
    c=$1
    if [ "$2" != flood ]; then
        sample /tmp/v1
        job b randread 0 /tmp/b1
        eval "${c}_b_solo=$(riops /tmp/b1) ${c}_b_solo_p99=$(rp99_ms /tmp/b1) ${c}_b_solo_p90=$(rp90_ms /tmp/b1)"
        sample /tmp/v2
        job a randwrite 256M /tmp/a1
        eval "${c}_a_solo=$(wiops /tmp/a1)"
    else
        eval "${c}_b_solo=- ${c}_b_solo_p99=- ${c}_a_solo=-"
        echo - >/tmp/v1
        echo - >/tmp/v2
    fi
    sample /tmp/v3
    job b randread 0 /tmp/b2 &
    j=$!
    job a randwrite 256M /tmp/a2
    wait $j
    eval "${c}_b_flood=$(riops /tmp/b2) ${c}_b_flood_p99=$(rp99_ms /tmp/b2) ${c}_a_flood=$(wiops /tmp/a2)"
    if [ "$2" != flood ]; then
        sample /tmp/v4
        job b randread 0 /tmp/b3 &
        j=$!
        job a randread 256M /tmp/a3
        wait $j
        eval "${c}_b_both=$(riops /tmp/b3) ${c}_a_both=$(riops /tmp/a3)"
    else
        eval "${c}_b_both=- ${c}_a_both=-"
        echo - >/tmp/v4
    fi
    wait
    eval "${c}_vrate=\"$(cat /tmp/v1) / $(cat /tmp/v2) / $(cat /tmp/v3) / $(cat /tmp/v4)\""
}
# measure_light CONFIG: B at a quarter of its solo IOPS without control (its 32 tasks rate
# limited), alone and under A's flood: what a protecting configuration leaves A when B does not
# need the whole disk (a cap, set for B's peak, leaves A the same as when B reads flat out)
measure_light() { # measure_light CONFIG [flood]: flood, only the phase under A's flood
    c=$1
    if [ "$2" != flood ]; then
        job b randread 0 /tmp/bl1 "--rate_iops=$light_per_task"
        eval "${c}_bl_solo=$(riops /tmp/bl1) ${c}_bl_solo_p99=$(rp99_ms /tmp/bl1)"
    else
        eval "${c}_bl_solo=- ${c}_bl_solo_p99=-"
    fi
    job b randread 0 /tmp/bl2 "--rate_iops=$light_per_task" &
    j=$!
    job a randwrite 256M /tmp/al2
    wait $j
    eval "${c}_bl_flood=$(riops /tmp/bl2) ${c}_bl_flood_p99=$(rp99_ms /tmp/bl2) ${c}_al_flood=$(wiops /tmp/al2)"
}
# split3 CONFIG: both reading at weights 100:300 (the issue's example ratio), under the same
# iocost settings: at WA:WB B's 32 tasks cannot always use their share (B is held by its own
# depth, and iocost lends what it leaves to A), so the steep split shows the lending as much as
# the weights
split3() { # split3 CONFIG [B_IO_LINES]: B_IO_LINES, B's keys besides its weight
    policy "weight = 100" "weight = 300
$2"
    job b randread 0 /tmp/b3 &
    j=$!
    job a randread 256M /tmp/a3
    wait $j
    eval "${1}_b_both3=$(riops /tmp/b3) ${1}_a_both3=$(riops /tmp/a3)"
}
light_row() { # light_row CONFIG
    eval "echo \"$1 | \$${1}_bl_solo | \$${1}_bl_solo_p99 | \$${1}_bl_flood | \$${1}_bl_flood_p99 | \$${1}_al_flood\""
}
row() { # row CONFIG
    eval "echo \"$1 | \$${1}_b_solo | \$${1}_b_solo_p99 | \$${1}_b_flood | \$${1}_b_flood_p99 | \$${1}_a_solo | \$${1}_a_flood | \$${1}_a_both : \$${1}_b_both | \$${1}_vrate\""
}

policy "" ""
measure none
light_per_task=$((none_b_solo / 4 / 32))
[ "$light_per_task" -ge 1 ] || light_per_task=1
light=$((light_per_task * 32))
measure_light none
cap=$((none_b_solo / 10))
cap5=$((none_b_solo / 5))
cap3=$((none_b_solo / 3))
cap20=$((none_b_solo / 20))
cap50=$((none_b_solo / 50))
policy "read_iops = $cap
write_iops = $cap" ""
measure caps
measure_light caps
# the rest of the sweep: the flood phases only
for n in 5 3 20 50; do
    eval "c=\$cap$n"
    policy "read_iops = $c
write_iops = $c" ""
    measure caps$n flood
    measure_light caps$n flood
done
HAS_IOLAT=0
if [ -e $ROOT/b/io.latency ]; then
    HAS_IOLAT=1
    # B protected at 1.25x its own p90 alone without control, rounded up to a whole ms
    target=$(awk -v p="$none_b_solo_p90" 'BEGIN { p *= 1.25; t = int(p); if (t < p) t++; if (t < 1) t = 1; print t }')
    policy "" "latency_target = \"${target}ms\""
    echo "INFO | b's io.latency: $(cat $ROOT/b/io.latency)"
    measure latency
fi
policy "" ""
/bin/dbcage iocost /dev/nullb0 --destructive --apply 2>&1 | sed 's/^/INFO | /'
policy "weight = $WA" "weight = $WB"
measure weights
if [ $HAS_IOLAT = 1 ]; then
    policy "weight = $WA" "weight = $WB
latency_target = \"${target}ms\""
    measure latwt
fi
# the same with requests for every IO the tenants keep in flight
/bin/dbcage iocost /dev/nullb0 --destructive --apply --queue 2>&1 | sed 's/^/INFO | /'
echo "INFO | nullb0: scheduler $(cat /sys/block/nullb0/queue/scheduler), nr_requests $(cat /sys/block/nullb0/queue/nr_requests)"
measure sched
measure_light sched
split3 sched
if [ $HAS_IOLAT = 1 ]; then
    policy "weight = $WA" "weight = $WB
latency_target = \"${target}ms\""
    measure schedlat
    measure_light schedlat
    split3 schedlat "latency_target = \"${target}ms\""
fi
/bin/dbcage iocost /dev/nullb0 --revert --force >/dev/null 2>&1
$D release --all >/dev/null 2>&1

echo
echo "config | B solo IOPS | B solo p99 ms | B IOPS, A flooding | B p99 ms, A flooding | A solo IOPS | A IOPS flooding | A : B IOPS both reading | vrate % B solo / A solo / flood / both"
for c in none caps caps5 caps3 caps20 caps50; do row $c; done
[ $HAS_IOLAT = 1 ] && row latency
row weights
[ $HAS_IOLAT = 1 ] && row latwt
row sched
[ $HAS_IOLAT = 1 ] && row schedlat
echo "(caps, caps3, caps5, caps20, caps50: A read_iops = write_iops = $cap, $cap3, $cap5, $cap20, $cap50 (a tenth, a third, a fifth, a twentieth, a fiftieth of B solo without control); weights: A $WA, B $WB under dbcage iocost's model and qos; sched: the same after dbcage iocost --apply --queue, which gave the disk mq-deadline and 64 requests)"
[ $HAS_IOLAT = 1 ] && echo "(latency: B's latency_target ${target}ms (B's p90 alone without control: $none_b_solo_p90 ms), iocost off; latwt, schedlat: weights, sched plus that target)"
echo

pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.0f", 100 * a / b; else print 0 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print 0 }'; }
judge_split() { # judge_split NAME A_IOPS B_IOPS A_WEIGHT B_WEIGHT: B:A within +-10% of the weights
    s=$(ratio "$2" "$3")
    want=$(awk -v a="$4" -v b="$5" 'BEGIN { r = b / a; printf "1:%.2f (1:%.2f-%.2f)", r, 0.9 * r, 1.1 * r }')
    line="both reading at $4:$5: A $2, B $3 IOPS, 1:$s (want $want)"
    if awk -v s="$s" -v a="$4" -v b="$5" 'BEGIN { r = b / a; exit !(s >= 0.9 * r && s <= 1.1 * r) }'; then pass "$1" "$line"; else fail "$1" "$line"; fi
}
# loosest_cap TEST: sets k to the loosest cap of the sweep for which `TEST CAP` succeeds; fails,
# with k the tightest, when none does
loosest_cap() {
    for k in caps3 caps5 caps caps20 caps50; do
        "$1" $k && return 0
    done
    return 1
}
# protects_b CAP: B reading flat out got at least $b_flood IOPS under A's flood with that cap
protects_b() {
    eval "xb=\$${1}_b_flood"
    [ "$xb" -ge "$b_flood" ]
}
# protects_b_light CAP: B light got >= 90% of what it asks at a p99 no higher than $bp
protects_b_light() {
    eval "xb=\$${1}_bl_flood xp=\$${1}_bl_flood_p99"
    [ "$(pct "$xb" "$light")" -ge 90 ] && awk -v x="$xp" -v p="$bp" 'BEGIN { exit !(x <= p) }'
}
targets() { # targets CONFIG: issue 24's targets for one protecting configuration
    c=$1
    eval "a_solo=\$${c}_a_solo b_solo=\$${c}_b_solo b_flood=\$${c}_b_flood b_flood_p99=\$${c}_b_flood_p99 a_flood=\$${c}_a_flood a_both=\$${c}_a_both b_both=\$${c}_b_both"
    r=$(pct "$a_solo" "$none_a_solo")
    if [ "$r" -ge 95 ]; then pass "$c a_alone" "A alone: $a_solo IOPS, $r% of its solo IOPS without control ($none_a_solo; caps: $caps_a_solo)"; else fail "$c a_alone" "A alone: $a_solo IOPS, $r% of its solo IOPS without control ($none_a_solo; want >= 95%)"; fi
    # the split is judged at 100:300 (split3): at WA:WB B's 32 tasks are held by their own
    # depth short of B's share, and iocost lends A what B leaves
    case $c in latency) w="no weights" ;; *) w="weights $WA:$WB; the split is judged at 100:300, in split3" ;; esac
    echo "INFO $c split: both reading, A $a_both, B $b_both IOPS, 1:$(ratio "$a_both" "$b_both") ($w)"
    # B's solo is B alone on the disk without control, not B alone under the weights
    r=$(pct "$b_flood" "$none_b_solo")
    p=$(awk -v f="$b_flood_p99" -v s="$none_b_solo_p99" 'BEGIN { if (s > 0) printf "%.2f", f / s; else print 99 }')
    same=$(pct "$b_flood" "$b_solo")
    if [ "$r" -ge 90 ] && awk -v p="$p" 'BEGIN { exit !(p <= 2) }'; then pass "$c b_protected" "A flooding: B $b_flood IOPS, $r% of its solo IOPS without control ($none_b_solo), p99 ${p}x ($b_flood_p99 against $none_b_solo_p99 ms) ($same% of B alone under the weights)"; else fail "$c b_protected" "A flooding: B $b_flood IOPS, $r% of its solo IOPS without control ($none_b_solo; want >= 90%), p99 ${p}x ($b_flood_p99 against $none_b_solo_p99 ms; want <= 2x) ($same% of B alone under the weights)"; fi
    # the loosest cap of the sweep that leaves B at least the IOPS the weights left it
    how="the loosest cap that protects B as much"
    loosest_cap protects_b || how="no cap of the sweep protects B as much; against the tightest, which leaves B less and A more than a cap that would"
    eval "ka=\$${k}_a_flood kb=\$${k}_b_flood"
    r=$(pct "$a_flood" "$ka")
    if [ "$r" -ge 150 ]; then pass "$c work_conserving" "A flooding: $a_flood IOPS (B $b_flood), under $k ($how; B $kb): $ka; $r%"; else fail "$c work_conserving" "A flooding: $a_flood IOPS (B $b_flood), under $k ($how; B $kb): $ka; $r% (want >= 150%)"; fi
}
[ $HAS_IOLAT = 1 ] && targets latency
targets weights
[ $HAS_IOLAT = 1 ] && targets latwt
targets sched
judge_split "sched split3" "$sched_a_both3" "$sched_b_both3" 100 300
if [ $HAS_IOLAT = 1 ]; then
    targets schedlat
    judge_split "schedlat split3" "$schedlat_a_both3" "$schedlat_b_both3" 100 300
fi

echo
echo "B light: B's 32 tasks asking $light IOPS together (a quarter of B solo without control), alone and while A floods"
echo "config | B IOPS alone | B p99 ms alone | B IOPS, A flooding | B p99 ms, A flooding | A IOPS flooding"
for c in none caps caps5 caps3 caps20 caps50; do light_row $c; done
light_row sched
[ $HAS_IOLAT = 1 ] && light_row schedlat
echo
# light_targets CONFIG: the flood target where B leaves capacity. B keeps >= 90% of what it
# asks, and A gets >= 1.5x what it gets under the loosest cap of the sweep that protects B light
# as much (B at >= 90% of what it asks, its p99 no higher than under CONFIG): the issue's "hard-cap
# configuration that gives B the same protection". B's p99 against its light p99 alone without
# control is printed, not judged (the issue's p99 <= 2x is B's at depth 32, judged in b_protected)
light_targets() {
    c=$1
    eval "bf=\$${c}_bl_flood bp=\$${c}_bl_flood_p99 af=\$${c}_al_flood"
    r=$(pct "$bf" "$light")
    how="the loosest cap that protects B light as much"
    loosest_cap protects_b_light || how="no cap of the sweep protects B light as much; against the tightest"
    eval "ka=\$${k}_al_flood kb=\$${k}_bl_flood kp=\$${k}_bl_flood_p99"
    w=$(pct "$af" "$ka")
    alone=$(awk -v f="$bp" -v s="$none_bl_solo_p99" 'BEGIN { if (s > 0) printf "%.2f", f / s; else print 99 }')
    line="B light under A's flood: $bf of $light IOPS ($r%), p99 $bp ms (${alone}x its $none_bl_solo_p99 alone without control); A $af IOPS, $w% of $k's $ka ($how: B $kb IOPS, p99 $kp ms)"
    if [ "$r" -ge 90 ] && [ "$w" -ge 150 ]; then
        pass "$c light_work_conserving" "$line"
    else
        fail "$c light_work_conserving" "$line (want >= 90%, >= 150%)"
    fi
}
light_targets sched
[ $HAS_IOLAT = 1 ] && light_targets schedlat
rmmod null_blk 2>/dev/null
echo "$P passed, $F failed"
[ "$F" -eq 0 ]
