#!/bin/sh
# Guest-side checks of `dbcage iolat` on cgroup v2 (run by tests/vm/run.sh, busybox sh):
#   cargo build --release && tests/vm/run.sh target/release/dbcage tests/vm/iolat.sh
# On Debian's 6.1 kernel (BTF, ftrace direct calls) the submission hook loads, so the wait in
# the throttle is measured. Checks: attribution (direct reads in one tenant, buffered writes
# with fsync in another, on one disk: >= 99% of what fio issued in the right tenant; on v2
# writeback is charged to the pages' owner), the throttle's shape at read_iops = 200 and depth
# 1 (most of the time spent waiting in the throttle, a p99 of at least one IOPS period and
# ten times the p50: seed 000's fast bulk under a peak of waits), accuracy on a null_blk disk
# with a 10 ms timer (p50 within 10% of the timer, p99 between it and fio's p99; fio's clat
# percentiles printed beside), and what the program costs on the fastest disk (null_blk
# completing at once): the kernel's timing of it <= 25% of a request's time under TCG, the
# throughput not halved (2% on real hardware: bench/iolat.sh).
# Needs DBCAGE_VM_MODULES=null_blk (scripts/test.sh sets it).
# Prints PASS/FAIL/INFO lines and "N passed, N failed"; exits non-zero when a check failed.

P=0
F=0
pass() { echo "PASS $*"; P=$((P + 1)); }
fail() { echo "FAIL $*"; F=$((F + 1)); }
info() { echo "INFO $*"; }
in_range() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v + 0 >= lo + 0 && v + 0 <= hi + 0) }'; }
# secs 79µs|1.2ms|2.0s -> seconds
secs() { echo "$1" | awk '{ v = $1 + 0; if ($1 ~ /µs$/) v /= 1e6; else if ($1 ~ /ms$/) v /= 1e3; print v }'; }
# fio_ios FILE N: the Nth "total_ios" of a fio JSON report (1 read, 2 write, 4 sync)
fio_ios() { grep -o '"total_ios" : [0-9]*' "$1" | sed -n "${2}p" | awk '{ print $3 }'; }
# fio_pct FILE PCT: the first clat percentile PCT (e.g. 50.000000) in microseconds
fio_pct() { grep -A40 '"clat_ns"' "$1" | grep -o "\"$2\" : [0-9]*" | head -1 | awk '{ print $3 / 1000 }'; }
# row FILE TENANT DEVICE OP: the summary line of `dbcage iolat`
row() { awk -v t="$2" -v d="$3" -v o="$4" '$1 == t && $2 == d && $3 == o' "$1"; }
# start_iolat OUT ARGS...: run `dbcage iolat` in the background and wait until its program is
# attached (3 or more bpf links open)
start_iolat() {
    out=$1
    shift
    dbcage -c /tmp/iolat.toml iolat "$@" >"$out" 2>"$out.err" &
    IOLAT=$!
    i=0
    while [ $i -lt 600 ]; do
        n=0
        for fd in /proc/$IOLAT/fd/*; do
            [ "$(readlink "$fd" 2>/dev/null)" = "anon_inode:bpf_link" ] && n=$((n + 1))
        done
        [ $n -ge 3 ] && return 0
        /bin/sleep 0.1
        i=$((i + 1))
    done
    echo "FAIL dbcage iolat did not attach in 60 s: $(cat "$out.err")"
    exit 1
}

echo "=== dbcage iolat on v2: kernel $(uname -r), $(nproc) cpus"
for d in vdb vdc; do info "$d write_cache: $(cat /sys/block/$d/queue/write_cache)"; done
cat >/tmp/iolat.toml <<'TOML'
[agent]
root = "dbcage-test"

[[tenant]]
name = "reader"
match = [{ cmdline = "^dbcage-test-nomatch-r( |$)" }]

[[tenant]]
name = "writer"
match = [{ cmdline = "^dbcage-test-nomatch-w( |$)" }]

[[tenant]]
name = "thr"
match = [{ cmdline = "^dbcage-test-nomatch-t( |$)" }]
storage = ["/dev/vdc"]

[tenant.io]
read_iops = 200
TOML
dbcage -c /tmp/iolat.toml apply || { echo "FAIL apply"; exit 1; }

# 1. attribution on vdb
start_iolat /tmp/attr.txt --duration 40s --device vdb
dbcage -c /tmp/iolat.toml exec reader -- fio --name=r --filename=/dev/vdb --rw=randread \
    --direct=1 --bs=4k --size=100M --runtime=8 --time_based --output-format=json >/tmp/r.json &
RPID=$!
dbcage -c /tmp/iolat.toml exec writer -- fio --name=w --filename=/dev/vdb --rw=randwrite \
    --bs=4k --fsync=1 --offset=128M --size=100M --runtime=8 --time_based \
    --output-format=json >/tmp/w.json
wait $RPID
wait $IOLAT
cat /tmp/attr.txt.err
cat /tmp/attr.txt
grep -q "not measured" /tmp/attr.txt.err && fail "throttle-hook: the kernel refused the submission hook" \
    || pass "throttle-hook: the submission hook loaded (the throttle's wait is measured)"
reads=$(fio_ios /tmp/r.json 1)
writes=$(fio_ios /tmp/w.json 2)
fsyncs=$(fio_ios /tmp/w.json 4)
got_r=$(row /tmp/attr.txt reader vdb read | awk '{ print $4 }')
got_w=$(row /tmp/attr.txt writer vdb write | awk '{ print $4 }')
got_f=$(row /tmp/attr.txt writer vdb flush | awk '{ print $4 }')
wrong=$(awk '$1 == "reader" && $2 == "vdb" && ($3 == "write" || $3 == "flush") { s += $4 } END { print s + 0 }' /tmp/attr.txt)
info "fio issued: $reads reads; $writes writes, $fsyncs fsyncs. counted: reader reads ${got_r:-0}, writer writes ${got_w:-0}, flushes ${got_f:-0}; reader's writes/flushes $wrong"
r_ratio=$(awk -v a="${got_r:-0}" -v b="$reads" 'BEGIN { print a / b }')
w_ratio=$(awk -v a="${got_w:-0}" -v b="$writes" 'BEGIN { print a / b }')
in_range "$r_ratio" 0.99 1.01 && pass "attribution-reads ${got_r:-0}/$reads" || fail "attribution-reads ${got_r:-0}/$reads"
in_range "$w_ratio" 0.99 1.01 && pass "attribution-writeback ${got_w:-0}/$writes" || fail "attribution-writeback ${got_w:-0}/$writes"
if [ "$(cat /sys/block/vdb/queue/write_cache)" = "write back" ]; then
    f_ratio=$(awk -v a="${got_f:-0}" -v b="$fsyncs" 'BEGIN { print a / b }')
    in_range "$f_ratio" 0.99 1.01 && pass "attribution-flush ${got_f:-0}/$fsyncs" || fail "attribution-flush ${got_f:-0}/$fsyncs"
else
    info "vdb has no volatile write cache: the block layer completes fsync's flushes before queueing them (nothing to count)"
fi
[ "$wrong" -eq 0 ] && pass "attribution-none-misplaced" || fail "attribution-none-misplaced $wrong"

# 2. the throttle's shape: 200 read IOPS, depth 1, on vdc
start_iolat /tmp/thr.txt --duration 30s --device vdc --op read
dbcage -c /tmp/iolat.toml exec thr -- fio --name=t --filename=/dev/vdc --rw=randread \
    --direct=1 --bs=4k --size=100M --runtime=8 --time_based --output-format=json >/tmp/t.json
wait $IOLAT
cat /tmp/thr.txt
line=$(row /tmp/thr.txt thr vdc read)
p50=$(secs "$(echo "$line" | awk '{ print $7 }')")
p99=$(secs "$(echo "$line" | awk '{ print $8 }')")
share=$(echo "$line" | awk '{ print $9 + 0 }')
iops=$(awk -v n="$(fio_ios /tmp/t.json 1)" 'BEGIN { print n / 8 }')
info "throttled: fio $iops IOPS; histogram p50 ${p50}s p99 ${p99}s, ${share}% of the time in the throttle"
in_range "$iops" 150 230 && pass "throttle-rate $iops" || fail "throttle-rate $iops"
# Seed 000's shape: most requests pass at the device's speed, a peak of waits at least one
# IOPS period (5 ms) long holds most of the time.
in_range "$share" 50 100 && pass "throttle-share ${share}%" || fail "throttle-share ${share}%"
awk -v a="$p50" -v b="$p99" 'BEGIN { exit !(b >= 0.004 && b >= 10 * a) }' \
    && pass "throttle-peak p50 ${p50}s p99 ${p99}s" || fail "throttle-peak p50 ${p50}s p99 ${p99}s"

# 3. Accuracy: the histogram against the request's known time, no limit. A null_blk disk whose
# requests complete on a timer 10 ms after they are queued is a device with a fixed service
# time: the histogram's p50 must be within 10% of it, and its p99 no lower than it and no higher
# than fio's own p99 (+10%: the histogram's eighths of a slot). fio's clat percentiles are
# printed beside it. They are the issue's reference, but under TCG they carry fio's emulated
# syscall and wake-up: on a virtio disk the histogram read p50 31% below fio; on this null_blk
# disk fio's p50 stood 0.3-1.5 ms above the timer and its p99 2-4 ms above the histogram's, more
# on some boots than others (2026-11-27: fio p50 10.9-11.5 ms for the 10-ms timer, the
# histogram's 10.03-10.22 ms), so a within-10%-of-fio check judged the emulator, not the program.
start_iolat /tmp/acc.txt --duration 30s --device vdb --op read --stage total
dbcage -c /tmp/iolat.toml exec reader -- fio --name=a --filename=/dev/vdb --rw=randread \
    --direct=1 --bs=4k --size=100M --runtime=8 --time_based --output-format=json >/tmp/a.json
wait $IOLAT
line=$(row /tmp/acc.txt reader vdb read)
info "virtio (TCG): fio clat p50 $(fio_pct /tmp/a.json 50.000000)us p99 $(fio_pct /tmp/a.json 99.000000)us; dbcage iolat p50 $(echo "$line" | awk '{ print $7 }') p99 $(echo "$line" | awk '{ print $8 }')"

# null_blk NAME PARAMS...: (re)load null_blk with one disk, /dev/nullb0
null_blk() {
    rmmod null_blk 2>/dev/null
    insmod /lib/modules/null_blk.ko nr_devices=1 queue_mode=2 gb=1 bs=4096 "$@" \
        || { fail "null_blk: insmod $*"; return 1; }
    i=0
    while [ ! -b /dev/nullb0 ] && [ $i -lt 50 ]; do /bin/sleep 0.1; i=$((i + 1)); done
    [ -b /dev/nullb0 ]
}
# within A B PCT: A is within PCT percent of B
within() { awk -v a="$1" -v b="$2" -v p="$3" 'BEGIN { d = a / b - 1; if (d < 0) d = -d; exit !(b > 0 && d * 100 <= p) }'; }
# pct_off A B: how far A is from B, in percent of B (signed)
pct_off() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.1f%%", (a / b - 1) * 100 }'; }

# Up to three tries: on a busy host the emulated CPU is sometimes not run for milliseconds; each
# try is reported.
timer_us=10000
if null_blk irqmode=2 completion_nsec=$((timer_us * 1000)); then
    try=1
    while :; do
        start_iolat /tmp/nacc.txt --duration 30s --device nullb0 --op read --stage total
        dbcage -c /tmp/iolat.toml exec reader -- fio --name=n --filename=/dev/nullb0 --rw=randread \
            --direct=1 --bs=4k --runtime=10 --time_based --output-format=json >/tmp/n.json
        kill -INT $IOLAT 2>/dev/null
        wait $IOLAT
        line=$(row /tmp/nacc.txt reader nullb0 read)
        f50=$(fio_pct /tmp/n.json 50.000000)
        f99=$(fio_pct /tmp/n.json 99.000000)
        h50=$(awk -v s="$(secs "$(echo "$line" | awk '{ print $7 }')")" 'BEGIN { print s * 1e6 }')
        h99=$(awk -v s="$(secs "$(echo "$line" | awk '{ print $8 }')")" 'BEGIN { print s * 1e6 }')
        info "null_blk ${timer_us} us timer, try $try: dbcage iolat p50 ${h50}us p99 ${h99}us ($(echo "$line" | awk '{ print $4 }') requests); fio clat p50 ${f50}us p99 ${f99}us (histogram $(pct_off "$h50" "$f50") / $(pct_off "$h99" "$f99") of fio's)"
        if within "$h50" "$timer_us" 10 && in_range "$h99" "$timer_us" "$(awk -v f="$f99" 'BEGIN { print f * 1.1 }')"; then
            pass "accuracy p50 ${h50}us for a ${timer_us}us device (within 10%), p99 ${h99}us between it and fio's p99 ${f99}us"
            break
        fi
        if [ $try -ge 3 ]; then
            fail "accuracy p50 ${h50}us for a ${timer_us}us device (want within 10%), p99 ${h99}us (want ${timer_us}us .. fio's p99 ${f99}us + 10%), in 3 tries"
            break
        fi
        try=$((try + 1))
    done
fi

# 4. Overhead: null_blk completing in the submitter's context (irqmode=0, no delay: the fastest
# disk this guest has, so the program's cost is the largest share it can be), fio 4 KiB random
# direct reads at depth 1. Judged by the kernel's own timing of the program (BPF run statistics,
# a round of its own) as a share of the time a request takes without it, both in guest time, so
# the host's speed cancels out. Throughput under TCG scatters too much to judge 2% (pairs of the
# same run from -21% to +44% on a quiet host, -74% to +45% in one CI run): five rounds of
# without-with-with-without (drift within a round cancels), the median loss printed and bounded
# only against a gross failure. The issue's 2% is judged on the host (bench/iolat.sh).
if null_blk irqmode=0; then
    fio_iops() {
        dbcage -c /tmp/iolat.toml exec reader -- fio --name=o --filename=/dev/nullb0 \
            --rw=randread --direct=1 --bs=4k --runtime=3 --time_based --output-format=json >/tmp/o.json
        awk -v n="$(fio_ios /tmp/o.json 1)" 'BEGIN { printf "%d", n / 3 }'
    }
    off=""
    on=""
    for round in 1 2 3 4 5; do
        a=$(fio_iops)
        start_iolat /tmp/ov.txt --duration 60s --device nullb0
        b=$(fio_iops)
        c=$(fio_iops)
        kill -INT $IOLAT 2>/dev/null
        wait $IOLAT
        d=$(fio_iops)
        off="$off $((a + d))"
        on="$on $((b + c))"
    done
    # median N...: the middle one of an odd count
    median() { echo "$@" | awk '{ for (i = 1; i <= NF; i++) v[i] = $i + 0
        for (i = 1; i <= NF; i++) for (j = i + 1; j <= NF; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
        print v[int((NF + 1) / 2)] }'; }
    losses=$(echo "$off|$on" | awk -F'|' '{ n = split($1, a, " "); split($2, b, " ");
        for (i = 1; i <= n; i++) printf "%.2f ", (1 - b[i] / a[i]) * 100 }')
    # shellcheck disable=SC2086 # word splitting wanted: one number per round
    loss=$(median $losses)
    # shellcheck disable=SC2086
    without=$(($(median $off) / 2))
    info "overhead: IOPS per round without (two runs):$off, with (two runs):$on: median loss ${loss}%"
    start_iolat /tmp/ov.txt --duration 60s --device nullb0 --cost
    fio_iops >/dev/null
    kill -INT $IOLAT 2>/dev/null
    wait $IOLAT
    grep "program cost" /tmp/ov.txt | sed 's/^/INFO /'
    per_io=$(grep -o '; [0-9]* ns per completed request' /tmp/ov.txt | awk '{ print $2 }')
    # Per request without the program: 1e9 / IOPS ns. On the host the program takes 291 ns of a
    # loop device's 33 us request (0.9%, bench/iolat.sh); under TCG 6.1-9.4% (1.5 us at 57,000
    # IOPS, 5.1 us at 17,600, 5.2 us at 18,000, 4.3 us at 14,200), so the bound catches a program
    # 2.5 times as costly.
    share=$(awk -v c="$per_io" -v n="$without" 'BEGIN { if (c == "" || n <= 0) print "none"; else printf "%.1f", c * n / 1e7 }')
    if [ "$share" = none ]; then
        fail "overhead-cost no per-request cost (${per_io:-none} ns) or throughput ($without IOPS)"
    else
        in_range "$share" 0.01 25 && pass "overhead-cost ${per_io} ns per request = ${share}% of a request's time at $without IOPS (<= 25% under TCG)" \
            || fail "overhead-cost ${per_io} ns per request = ${share}% of a request's time at $without IOPS (> 25% under TCG)"
    fi
    awk -v l="$loss" 'BEGIN { exit !(l <= 50) }' && pass "overhead-throughput median loss ${loss}% (<= 50% under TCG: not halved)" \
        || fail "overhead-throughput median loss ${loss}% (> 50% under TCG): without$off, with$on"
fi
rmmod null_blk 2>/dev/null

dbcage -c /tmp/iolat.toml release --all >/dev/null 2>&1
echo "$P passed, $F failed"
[ "$F" -eq 0 ]
