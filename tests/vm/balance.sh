#!/bin/sh
# Guest script (busybox sh) for issue 7 on cgroup v2: io.split = "equal" vs "demand" over the
# VM's three disks (vda, vdb, vdc, scratch images), for each of the four keys in turn (KEYS
# below): a 12 MiB/s read_bps or write_bps total, or 300 read_iops or write_iops, the daemon
# (`dbcage run`) placing O_DIRECT dd streams (64 KiB for bps, 4 KiB for iops; two per busy disk,
# so the throttle and not the emulated cpu sets the pace). About a minute per key.
#   cargo build --release && tests/vm/run.sh target/release/dbcage tests/vm/balance.sh
# Per split: the share of the total achieved with the load on one disk (io.stat rbytes over 4 s
# after 3 s), then the load moves to another disk: the time until a 1-s window on it reaches 95%
# of the total; a background loop reads io.max as fast as the shell can (no forks) and keeps the
# largest per-device sum of rbps. Prints a table and PASS/FAIL lines.

CG=/sys/fs/cgroup
LEAF=$CG/dbcage-test/db/limited
KEYS=${KEYS:-read_bps write_bps read_iops write_iops}
P=0
F=0
pass() { echo "PASS $*"; P=$((P + 1)); }
fail() { echo "FAIL $*"; F=$((F + 1)); }
now_ns() { /bin/date +%s%N; }
rbytes() { # rbytes DEV: the counter of the key being balanced (io.stat field $STAT)
    v=$(grep "^$1 " "$LEAF/io.stat" 2>/dev/null | tr ' ' '\n' | grep "^$STAT=" | cut -d= -f2)
    echo "${v:-0}"
}
DEVS="vda vdb vdc"
for d in $DEVS; do eval "N_$d=$(cat /sys/class/block/$d/dev)"; done
echo "=== dbcage balance (v2): kernel $(uname -r), vda=$N_vda vdb=$N_vdb vdc=$N_vdc"

mkdir -p /tmp/w /tmp/x
ln -sf /bin/dd /tmp/x/ora_bal_rd
reader() { # reader DISK SKIP: an O_DIRECT stream named ora_bal_rd for the key, print its pid
    case $KEY in
    read_*) /tmp/x/ora_bal_rd if=/dev/$1 of=/dev/null bs=$BS iflag=direct count=100000 skip=$2 >/dev/null 2>&1 & ;;
    *) /tmp/x/ora_bal_rd if=/dev/zero of=/dev/$1 bs=$BS oflag=direct count=100000 seek=$2 >/dev/null 2>&1 & ;;
    esac
    echo $!
}

sampler() { # reads io.max until /tmp/stop exists; writes "samples max" to /tmp/samples
    n=0
    max=0
    while [ ! -e /tmp/stop ]; do
        s=0
        k=0
        while read -r dev rest; do
            r=${rest#*$MAXKEY=}
            r=${r%% *}
            if [ "$r" != max ]; then
                s=$((s + r))
                k=$((k + 1))
            fi
        done <"$LEAF/io.max"
        if [ "$k" = 3 ]; then
            n=$((n + 1))
            [ "$s" -gt "$max" ] && max=$s
        fi
    done 2>/dev/null
    echo "$n $max" >/tmp/samples
}

# first_95 DEV SECONDS: samples every 0.25 s; prints the seconds until a 1-s window reaches 95%
first_95() {
    t0=$(now_ns)
    hist=""
    while :; do
        t=$(now_ns)
        el=$(((t - t0) / 1000000))
        [ "$el" -gt $(($2 * 1000)) ] && { echo never; return; }
        b=$(rbytes "$1")
        hist="$hist $t:$b"
        for h in $hist; do
            ht=${h%%:*}
            hb=${h#*:}
            if [ $((t - ht)) -ge 990000000 ] && [ $((t - ht)) -le 1300000000 ]; then
                ok=$(awk -v b=$((b - hb)) -v ns=$((t - ht)) -v tot=$TOTAL 'BEGIN { print (b / (ns / 1e9) >= 0.95 * tot) ? 1 : 0 }')
                if [ "$ok" = 1 ]; then
                    awk -v ms="$el" 'BEGIN { printf "%.2f\n", ms / 1000 }'
                    return
                fi
            fi
        done
        /bin/sleep 0.25
    done
}

share() { # share DEV SECONDS -> share of TOTAL in %
    b0=$(rbytes "$1")
    t0=$(now_ns)
    /bin/sleep "$2"
    b1=$(rbytes "$1")
    t1=$(now_ns)
    awk -v b=$((b1 - b0)) -v ns=$((t1 - t0)) -v tot=$TOTAL 'BEGIN { printf "%.1f", 100 * b / (ns / 1e9) / tot }'
}

for KEY in $KEYS; do
    case $KEY in
    read_bps) STAT=rbytes MAXKEY=rbps TOTAL=12582912 BS=64k ;;
    write_bps) STAT=wbytes MAXKEY=wbps TOTAL=12582912 BS=64k ;;
    read_iops) STAT=rios MAXKEY=riops TOTAL=300 BS=4k ;;
    write_iops) STAT=wios MAXKEY=wiops TOTAL=300 BS=4k ;;
    esac
    for split in equal demand; do
        cat >/tmp/dbcage.toml <<EOF
    [agent]
    root = "dbcage-test"
    parent = "root"
    metrics = "off"

    [[tenant]]
    name = "db"
    match = [{ comm = '^ora_bal_rd\$' }]
    storage = ["/dev/vda", "/dev/vdb", "/dev/vdc"]
    [tenant.io]
    $KEY = $TOTAL
    split = "$split"
EOF
        /bin/dbcage -c /tmp/dbcage.toml run >/tmp/daemon-$split.log 2>&1 &
        D=$!
        /bin/sleep 2
        rm -f /tmp/stop /tmp/samples
        sampler &
        S=$!
        A1=$(reader vda 0)
        A2=$(reader vda 2000)
        /bin/sleep 3
        one=$(share "$N_vda" 4)
        B1=$(reader vdb 0)
        B2=$(reader vdb 2000)
        kill "$A1" "$A2" 2>/dev/null
        rec=$(first_95 "$N_vdb" 10)
        moved=$(share "$N_vdb" 3)
        kill "$B1" "$B2" 2>/dev/null
        : >/tmp/stop
        wait "$S"
        read -r n max </tmp/samples
        kill "$D"
        wait "$D"
        echo "RESULT key=$KEY split=$split one=$one% after_move=$moved% recovery_s=$rec limit_samples=$n max_sum=$max total=$TOTAL"
        eval "ONE_$split=$one MOVED_$split=$moved REC_$split=$rec N_$split=$n MAX_$split=$max"
        if [ "$n" -gt 100 ] && [ "$max" -le "$TOTAL" ]; then
            pass "$KEY sum-within-total split=$split samples=$n max=$max"
        else
            fail "$KEY sum-within-total split=$split samples=$n max=$max"
        fi
        [ "$split" = demand ] && grep -i "warn\|error" /tmp/daemon-$split.log | head -5
    done

    echo
    echo "cgroup v2 (VM), 3 disks, total $TOTAL $KEY, floor 1% (the default)"
    echo "load          equal   demand   recovery(demand)   max sum (equal/demand) / total"
    echo "one disk      $ONE_equal%   $ONE_demand%"
    echo "moved         $MOVED_equal%   $MOVED_demand%   $REC_demand s   $MAX_equal / $MAX_demand / $TOTAL"
    awk -v v="$ONE_demand" 'BEGIN { exit !(v >= 95) }' && pass "$KEY demand-one-disk $ONE_demand%" || fail "$KEY demand-one-disk $ONE_demand%"
    awk -v v="$MOVED_demand" 'BEGIN { exit !(v >= 95) }' && pass "$KEY demand-after-move $MOVED_demand%" || fail "$KEY demand-after-move $MOVED_demand%"
    case "$REC_demand" in
    never) fail "$KEY recovery never" ;;
    *) awk -v v="$REC_demand" 'BEGIN { exit !(v <= 3) }' && pass "$KEY recovery $REC_demand s" || fail "$KEY recovery $REC_demand s" ;;
    esac
    /bin/dbcage -c /tmp/dbcage.toml release --all >/dev/null 2>&1
done
/bin/dbcage -c /tmp/dbcage.toml release --all >/dev/null 2>&1
echo "$P passed, $F failed"
[ "$F" = 0 ]
