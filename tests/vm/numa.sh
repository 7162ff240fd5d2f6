#!/bin/sh
# Seed 002's consolidation on a four-node NUMA guest (run by tests/vm/run.sh, busybox sh):
#   cargo build --release --bin dbcage --example memtouch
#   DBCAGE_VM_NUMA_NODES=4 DBCAGE_VM_NODE_MEM_MB=768 \
#       tests/vm/run.sh target/release/dbcage tests/vm/numa.sh target/release/examples/memtouch
# Four tenants with numa = "auto" (1 core, memory.max 384 MiB each) on four nodes of one cpu and
# 768 MiB: apply puts each on a node of its own (cpuset.mems and cpuset.cpus.effective), then a
# memory-touching instance per tenant (examples/memtouch, 192 MiB, started in the tenant with
# `dbcage exec` as cgexec does in the seed) keeps >= 95% of its memory on its node, counted three
# ways: this script's own sum over /proc/PID/numa_maps, `dbcage status --json`'s
# numa_local_share, and the kernel's per-cgroup memory.numa_stat (anon). Then moving a running
# tenant to another node: without --migrate-memory it stays and plan says how much would move;
# with it, its pages follow (>= 95% on the new node, the time it took); tenants whose nodes change
# while they run stay put until restarted, and the new instances start on the new nodes (also
# under the daemon, for an instance restarted outside any group). Then: a
# tenant too big for one node gets two and the others still fit; a set larger than the host is
# refused by check with the numbers. Then seed 002's live CPU swap through the daemon (section 8).
# Emulation has no remote-memory cost, so no performance is measured: locality is the figure.
# Prints PASS/FAIL lines and "N passed, N failed"; exits non-zero when a check failed.

CG=/sys/fs/cgroup
ROOT=$CG/dbcage-test
MEMTOUCH=/extra/memtouch
TOUCH_MIB=192
P=0
F=0
pass() { echo "PASS $*"; P=$((P + 1)); }
fail() { echo "FAIL $*"; F=$((F + 1)); }
info() { echo "INFO $*"; }
now_ns() { /bin/date +%s%N; }
ge() { awk -v v="$1" -v lo="$2" 'BEGIN { exit !(v + 0 >= lo + 0) }'; }
# numa_share NODE PID...: "local_bytes total_bytes" of these processes' numa_maps
numa_share() {
    node=$1
    shift
    for pid in "$@"; do cat "/proc/$pid/numa_maps" 2>/dev/null; done | awk -v own="$node" '
        { kb = 4
          for (i = 1; i <= NF; i++) if ($i ~ /^kernelpagesize_kB=/) { split($i, a, "="); kb = a[2] }
          for (i = 1; i <= NF; i++) if ($i ~ /^N[0-9]+=/) {
              split(substr($i, 2), a, "="); b = a[2] * kb * 1024; total += b; if (a[1] == own) local += b } }
        END { printf "%d %d\n", local, total }'
}
# numa_stat_share FILE NODE: "local_bytes total_bytes" of the anon line of a memory.numa_stat
numa_stat_share() {
    awk -v own="N$2" '$1 == "anon" { for (i = 2; i <= NF; i++) { split($i, a, "="); t += a[2]; if (a[1] == own) l += a[2] } }
        END { printf "%d %d\n", l, t }' "$1"
}
pct() { awk -v l="$1" -v t="$2" 'BEGIN { if (t > 0) printf "%.1f", 100 * l / t; else print 0 }'; }
mib() { echo $(($1 / 1048576)); }

NODES=$(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l)
echo "=== dbcage NUMA placement: kernel $(uname -r), $(nproc) cpus, $NODES nodes"
for d in /sys/devices/system/node/node*; do
    info "${d##*/}: cpus $(cat "$d/cpulist"), $(awk '/MemTotal/ { t = $4 } /MemFree/ { f = $4 } END { printf "MemTotal %d MiB, MemFree %d MiB", t / 1024, f / 1024 }' "$d/meminfo")"
done
info "numa_balancing: $(cat /proc/sys/kernel/numa_balancing 2>/dev/null || echo absent)"
if [ "$NODES" -ne 4 ] || [ ! -x "$MEMTOUCH" ]; then
    fail setup "needs 4 NUMA nodes (DBCAGE_VM_NUMA_NODES=4; got $NODES) and $MEMTOUCH (examples/memtouch as an extra file)"
    echo "$P passed, $F failed"
    exit 1
fi

TENANTS="ORA1 ORA2 ORA3 ORA4"
policy() { # policy MEMORY_MAX_OF_ORA1 [EXTRA_TENANT_TOML]
    {
        echo '[agent]'
        echo 'parent = "root"'
        echo 'root = "dbcage-test"'
        echo 'metrics = "off"'
        for t in $TENANTS; do
            max=384MiB
            [ "$t" = ORA1 ] && max=$1
            echo
            echo '[[tenant]]'
            echo "name = \"$t\""
            echo "match = [{ comm = '^ora_[a-z0-9]{4}_$t\$' }]"
            echo '[tenant.cpu]'
            echo 'cores = 1'
            echo 'numa = "auto"'
            echo '[tenant.memory]'
            echo "max = \"$max\""
        done
        [ -n "${2:-}" ] && printf '%s\n' "$2"
    } >/tmp/numa.toml
}
D="/bin/dbcage -c /tmp/numa.toml"
policy 384MiB

# (1) placement: check passes, plan says why, apply gives each tenant a node of its own
out=$($D check 2>&1)
rc=$?
echo "$out" | sed 's/^/INFO check | /'
if [ $rc -eq 0 ]; then pass check "exit 0"; else fail check "exit $rc"; fi
plan=$($D plan 2>&1)
echo "$plan" | grep "numa" | sed 's/^/INFO plan | /'
n=$(echo "$plan" | grep -c 'holds it alone')
if [ "$n" -eq 4 ]; then pass plan_reasons "4 tenants each 'holds it alone'"; else fail plan_reasons "$n of 4 placed alone: $plan"; fi
out=$($D apply 2>&1)
rc=$?
[ $rc -eq 0 ] || echo "$out" | sed 's/^/INFO apply | /'
seen=""
ok=1
for t in $TENANTS; do
    mems=$(cat $ROOT/$t/cpuset.mems.effective 2>/dev/null)
    cpus=$(cat $ROOT/$t/cpuset.cpus.effective 2>/dev/null)
    node_cpus=$(cat /sys/devices/system/node/node$mems/cpulist 2>/dev/null)
    info "$t: cpuset.mems.effective=$mems cpuset.cpus.effective=$cpus (node $mems has cpus $node_cpus)"
    case "$mems" in [0-9]) ;; *) ok=0 ;; esac
    [ -n "$node_cpus" ] && [ "$cpus" = "$node_cpus" ] || ok=0
    case " $seen " in *" $mems "*) ok=0 ;; esac
    seen="$seen $mems"
    eval "NODE_$t=$mems"
done
PLACED=0
if [ $rc -eq 0 ] && [ $ok = 1 ]; then
    PLACED=1
    pass placement "apply exit 0; each tenant alone on one node:$seen"
else
    fail placement "apply exit $rc; nodes per tenant:$seen (want 4 distinct single nodes, cpus those of the node)"
fi

# (2) an instance per tenant touches 192 MiB inside its group
mkdir -p /tmp/x
for t in $TENANTS; do
    ln -sf $MEMTOUCH "/tmp/x/ora_pmon_$t"
    $D exec "$t" -- "/tmp/x/ora_pmon_$t" $TOUCH_MIB >"/tmp/touch.$t" 2>&1 &
done
T0=$(now_ns)
for i in $(seq 1 600); do
    ready=0
    for t in $TENANTS; do grep -q touched "/tmp/touch.$t" 2>/dev/null && ready=$((ready + 1)); done
    [ $ready -eq 4 ] && break
    /bin/sleep 0.2
done
info "4 x $TOUCH_MIB MiB touched in $((($(now_ns) - T0) / 1000000)) ms ($ready of 4 ready)"
/bin/sleep 2
for d in /sys/devices/system/node/node*; do
    info "${d##*/} after: $(awk '/MemFree/ { printf "MemFree %d MiB", $4 / 1024 }' "$d/meminfo")"
done

# (3) locality, three ways
st=$($D status --json --interval 0 2>&1)
for t in $TENANTS; do
    eval "node=\$NODE_$t"
    pids=$(cat $ROOT/$t/limited/cgroup.procs $ROOT/$t/exempt/cgroup.procs 2>/dev/null)
    set -- $(numa_share "$node" $pids)
    maps_local=$1 maps_total=$2
    set -- $(numa_stat_share $ROOT/$t/memory.numa_stat "$node")
    stat_local=$1 stat_total=$2
    share=$(echo "$st" | tr -d ' \n' | sed 's/},{/}\n{/g' | grep "\"name\":\"$t\"" | sed -n 's/.*"numa_local_share":\([0-9.e-]*\).*/\1/p')
    mp=$(pct "$maps_local" "$maps_total")
    sp=$(pct "$stat_local" "$stat_total")
    fig="node $node: numa_maps $mp% of $(mib "$maps_total") MiB, memory.numa_stat anon $sp% of $(mib "$stat_total") MiB, status numa_local_share ${share:-none}"
    if [ "$(mib "$maps_total")" -ge $TOUCH_MIB ] && [ "$(mib "$stat_total")" -ge $TOUCH_MIB ] &&
        ge "$mp" 95 && ge "$sp" 95 && [ -n "$share" ] && ge "$share" 0.95; then
        pass "locality_$t" "$fig"
    else
        fail "locality_$t" "$fig (want >= 95% each, over >= $TOUCH_MIB MiB)"
    fi
done
$D status --interval 0 2>&1 | sed 's/^/INFO status | /'

# (4) moving a running tenant: ORA2 to ORA4's node, ORA4 (stopped) to ORA2's. Without the flag
# ORA2 stays and plan says how much would move; with --migrate-memory its pages follow.
stop() { # stop TENANT: end its instance, wait until its groups are empty
    for p in $(cat $ROOT/$1/limited/cgroup.procs 2>/dev/null); do kill "$p" 2>/dev/null; done
    for i in $(seq 1 100); do [ -z "$(cat $ROOT/$1/limited/cgroup.procs)" ] && break; /bin/sleep 0.1; done
}
start() { # start TENANT: an instance touching TOUCH_MIB in it; waits until touched
    : >"/tmp/touch.$1"
    $D exec "$1" -- "/tmp/x/ora_pmon_$1" $TOUCH_MIB >"/tmp/touch.$1" 2>&1 &
    sp=$!
    for i in $(seq 1 600); do
        grep -q touched "/tmp/touch.$1" && break
        kill -0 $sp 2>/dev/null || break # exec failed
        /bin/sleep 0.2
    done
}
pinned() { # pinned ORA1_NODE ORA2_NODE ORA3_NODE ORA4_NODE [EXTRA]: the four pinned
    {
        echo '[agent]'
        echo 'parent = "root"'
        echo 'root = "dbcage-test"'
        echo 'metrics = "off"'
        i=0
        for t in $TENANTS; do
            i=$((i + 1))
            eval "n=\$$i"
            echo
            echo '[[tenant]]'
            echo "name = \"$t\""
            echo "match = [{ comm = '^ora_[a-z0-9]{4}_$t\$' }]"
            echo '[tenant.cpu]'
            echo "numa_nodes = [$n]"
            echo '[tenant.memory]'
            echo 'max = "384MiB"'
        done
    } >/tmp/numa.toml
}
maps_pct() { # maps_pct TENANT NODE: share of its processes' numa_maps on NODE
    set -- $(numa_share "$2" $(cat $ROOT/$1/limited/cgroup.procs 2>/dev/null))
    pct "$1" "$2"
}
moves() {
stop ORA4
pinned "$NODE_ORA1" "$NODE_ORA4" "$NODE_ORA3" "$NODE_ORA2"
plan=$($D plan 2>&1)
echo "$plan" | grep -i "memory\|warning" | sed 's/^/INFO plan | /'
would=$(echo "$plan" | sed -n 's/.*tenant `ORA2`: its memory nodes change .*(\([0-9.]*\)MiB of their memory is on nodes outside.*/\1/p')
out=$($D apply 2>&1)
rc=$?
m2=$(cat $ROOT/ORA2/cpuset.mems)
m4=$(cat $ROOT/ORA4/cpuset.mems)
if [ $rc -eq 0 ] && [ "$m2" = "$NODE_ORA2" ] && [ "$m4" = "$NODE_ORA2" ] && [ -n "$would" ] && ge "$would" $((TOUCH_MIB * 9 / 10)); then
    pass move_held "without the flag ORA2 keeps node $m2 (plan: ${would} MiB would move); ORA4, stopped, is on $m4 at once"
else
    fail move_held "apply exit $rc, ORA2 mems [$m2] (want $NODE_ORA2), ORA4 mems [$m4] (want $NODE_ORA2), would move [$would] MiB: $out"
fi
plan=$($D plan --migrate-memory 2>&1)
echo "$plan" | grep "memory moves" | sed 's/^/INFO plan --migrate-memory | /'
T0=$(now_ns)
out=$($D apply --migrate-memory 2>&1)
rc=$?
T1=$(now_ns)
echo "$out" | sed 's/^/INFO apply --migrate-memory | /'
m2=$(cat $ROOT/ORA2/cpuset.mems)
share=$(maps_pct ORA2 "$NODE_ORA4")
for i in $(seq 1 60); do ge "$share" 95 && break; /bin/sleep 0.5; share=$(maps_pct ORA2 "$NODE_ORA4"); done
T2=$(now_ns)
set -- $(numa_stat_share $ROOT/ORA2/memory.numa_stat "$NODE_ORA4")
sp=$(pct "$1" "$2")
if [ $rc -eq 0 ] && [ "$m2" = "$NODE_ORA4" ] && ge "$share" 95 && ge "$sp" 95 && echo "$out" | grep -q "tenant ORA2: memory moves from nodes $NODE_ORA2 to $NODE_ORA4"; then
    pass move_migrated "ORA2 on node $m2: numa_maps $share%, numa_stat anon $sp% there; apply took $(((T1 - T0) / 1000000)) ms, >= 95% $(((T2 - T0) / 1000000)) ms after it began"
else
    fail move_migrated "apply exit $rc, ORA2 mems [$m2], numa_maps $share%, numa_stat $sp% on node $NODE_ORA4: $out"
fi
out=$($D apply 2>&1)
if echo "$out" | grep -q "^nothing to do"; then pass move_idempotent "then: nothing to do"; else fail move_idempotent "$out"; fi

# (5) restart: ORA1 and ORA3 swap nodes; both run, so both stay until restarted, and the new
# instances start on the new nodes
pinned "$NODE_ORA3" "$NODE_ORA4" "$NODE_ORA1" "$NODE_ORA2"
out=$($D apply 2>&1)
held=$(echo "$out" | grep -c "its memory nodes change")
m1=$(cat $ROOT/ORA1/cpuset.mems)
m3=$(cat $ROOT/ORA3/cpuset.mems)
if [ "$held" -eq 2 ] && [ "$m1" = "$NODE_ORA1" ] && [ "$m3" = "$NODE_ORA3" ]; then
    pass restart_held "running ORA1 and ORA3 keep nodes $m1 and $m3"
else
    fail restart_held "$held warnings, ORA1 [$m1], ORA3 [$m3]: $out"
fi
stop ORA1
stop ORA3
$D apply >/dev/null 2>&1
m1=$(cat $ROOT/ORA1/cpuset.mems)
m3=$(cat $ROOT/ORA3/cpuset.mems)
start ORA1
start ORA3
start ORA4
/bin/sleep 1
s1=$(maps_pct ORA1 "$NODE_ORA3")
s3=$(maps_pct ORA3 "$NODE_ORA1")
s4=$(maps_pct ORA4 "$NODE_ORA2")
if [ "$m1" = "$NODE_ORA3" ] && [ "$m3" = "$NODE_ORA1" ] && ge "$s1" 95 && ge "$s3" 95 && ge "$s4" 95; then
    pass restart_moved "restarted ORA1 on node $m1 ($s1%), ORA3 on node $m3 ($s3%), ORA4 started on node $NODE_ORA2 ($s4%)"
else
    fail restart_moved "ORA1 mems [$m1] $s1% on $NODE_ORA3, ORA3 mems [$m3] $s3% on $NODE_ORA1, ORA4 $s4% on $NODE_ORA2"
fi

    # (5b) the same under the daemon: ORA1 (running on ORA3's old node) is to go back to its
    # first node; the daemon keeps it while it runs, and when it restarts outside any group (as
    # a service would) the daemon writes the new nodes before it moves the new process in
    pinned "$NODE_ORA1" "$NODE_ORA4" "$NODE_ORA1" "$NODE_ORA2"
    $D run --rescan-interval 1h 2>/tmp/run.log &
    dpid=$!
    for i in $(seq 1 300); do grep -q 'dbcage running' /tmp/run.log && break; /bin/sleep 0.1; done
    m1=$(cat $ROOT/ORA1/cpuset.mems)
    stop ORA1
    : >/tmp/touch.ORA1
    "/tmp/x/ora_pmon_ORA1" $TOUCH_MIB >/tmp/touch.ORA1 2>&1 &
    for i in $(seq 1 600); do grep -q touched /tmp/touch.ORA1 && break; /bin/sleep 0.2; done
    /bin/sleep 1
    m1_after=$(cat $ROOT/ORA1/cpuset.mems)
    s1=$(maps_pct ORA1 "$NODE_ORA1")
    n1=$(wc -l <$ROOT/ORA1/limited/cgroup.procs)
    kill "$dpid" 2>/dev/null
    wait "$dpid" 2>/dev/null
    if [ "$m1" = "$NODE_ORA3" ] && [ "$m1_after" = "$NODE_ORA1" ] && [ "$n1" -eq 1 ] && ge "$s1" 95; then
        pass daemon_restart "the daemon kept running ORA1 on node $m1, and wrote node $m1_after when the restarted instance appeared, before moving it in ($s1% of its memory there)"
    else
        fail daemon_restart "ORA1 mems while running [$m1] (want $NODE_ORA3), after its restart [$m1_after] (want $NODE_ORA1), $n1 processes in it, $s1% on node $NODE_ORA1"
        tail -n 20 /tmp/run.log
    fi
}
if [ $PLACED = 1 ]; then
    moves
else
    fail moves "not run: the placement above failed, so there is no node of each tenant to move from"
fi
for t in $TENANTS; do stop $t; done
wait 2>/dev/null

# (6) a tenant too big for one node gets two, and the others still fit (placed afresh: the
# groups left by the moves above would keep ORA1 and ORA2 on their nodes, see section 8)
$D release --all >/dev/null 2>&1
TENANTS="ORA1 ORA2"
policy 384MiB '
[[tenant]]
name = "BIG"
match = [{ comm = "^ora_[a-z0-9]{4}_BIG$" }]
[tenant.cpu]
numa = "auto"
[tenant.memory]
max = "1GiB"'
plan=$($D plan 2>&1)
rc=$?
echo "$plan" | grep "numa" | sed 's/^/INFO plan | /'
big=$(echo "$plan" | grep -c 'nodes [0-9][,-][0-9] (needs 0 cores and 1GiB of memory; no single node holds it')
alone=$(echo "$plan" | grep -c 'holds it alone')
if [ $rc -eq 0 ] && [ "$big" -ge 1 ] && [ "$alone" -eq 2 ]; then
    pass spill "BIG (1 GiB) on two nodes, ORA1 and ORA2 each alone on another"
else
    fail spill "plan exit $rc, BIG on two nodes: $big, alone: $alone"
fi

# (7) a set larger than the host: check refuses it, naming the tenant, its needs and each node
TENANTS="ORA1 ORA2 ORA3 ORA4"
policy 2GiB
out=$($D check 2>&1)
rc=$?
echo "$out" | sed 's/^/INFO check | /'
if [ $rc -ne 0 ] && echo "$out" | grep -q 'cannot place it: it needs' &&
    echo "$out" | grep -q 'node 0: ' && echo "$out" | grep -q 'node 3: '; then
    pass refused "check exit $rc, names the tenant's needs and every node"
else
    fail refused "check exit $rc: $out"
fi

# (8) seed 002's live CPU swap under numa = "auto", through the daemon: ORA1 (2 cores, two nodes)
# and ORA2 (1 core, one node) exchange CPU counts with instances running in all four tenants.
# One `set` for both (a refused one changes neither; --dry-run changes nothing and says who
# moves); placement is sticky: ORA1 keeps one of its nodes, ORA2 keeps its node and adds the one
# ORA1 left, ORA3 and ORA4 (half a core each, sharing the fourth node) do not move. The cpus
# change at once; ORA2's memory nodes grow at once (nothing to move); ORA1's memory stays on its
# two nodes until its instance restarts, or until `set ORA1 cpu.migrate_memory=true`.
SWAP_MIB=64
swap_policy() {
    {
        echo '[agent]'
        echo 'parent = "root"'
        echo 'root = "dbcage-test"'
        echo 'metrics = "off"'
        for tc in ORA1:2 ORA2:1 ORA3:0.5 ORA4:0.5; do
            echo
            echo '[[tenant]]'
            echo "name = \"${tc%%:*}\""
            echo "match = [{ comm = '^ora_[a-z0-9]{4}_${tc%%:*}\$' }]"
            echo '[tenant.cpu]'
            echo "cores = ${tc#*:}"
            echo 'numa = "auto"'
            echo '[tenant.memory]'
            echo 'max = "256MiB"'
        done
    } >/tmp/numa.toml
}
expand() { # expand LIST: "0-2,5" -> "0 1 2 5"
    echo "$1" | tr ',' '\n' | awk -F- 'NF == 2 { for (i = $1; i <= $2; i++) printf "%d ", i; next } NF { printf "%d ", $1 }'
}
node_cpus() { # node_cpus NODES: the cpus of these nodes, expanded
    for n in $(expand "$1"); do expand "$(cat /sys/devices/system/node/node$n/cpulist)"; done |
        tr ' ' '\n' | sort -n | tr '\n' ' ' | sed 's/^ *//'
}
in_list() { case " $2 " in *" $1 "*) return 0 ;; esac; return 1; }
swap() {
    swap_policy
    $D release --all >/dev/null 2>&1
    out=$($D apply 2>&1) || { fail swap_setup "apply: $out"; return; }
    for t in ORA1 ORA2 ORA3 ORA4; do
        eval "M0_$t=\$(cat $ROOT/$t/cpuset.mems)"
        eval "C0_$t=\$(cat $ROOT/$t/cpuset.cpus)"
        eval "info \"$t before: mems \$M0_$t cpus \$C0_$t\""
        : >"/tmp/touch.$t"
        $D exec "$t" -- "/tmp/x/ora_pmon_$t" $SWAP_MIB >"/tmp/touch.$t" 2>&1 &
    done
    for i in $(seq 1 600); do
        ready=0
        for t in ORA1 ORA2 ORA3 ORA4; do grep -q touched "/tmp/touch.$t" 2>/dev/null && ready=$((ready + 1)); done
        [ $ready -eq 4 ] && break
        /bin/sleep 0.2
    done
    for t in ORA1 ORA2 ORA3 ORA4; do eval "PID_$t=\$(cat $ROOT/$t/limited/cgroup.procs | head -n 1)"; done
    if [ "$(expand "$M0_ORA1" | wc -w)" -ne 2 ] || [ "$(expand "$M0_ORA2" | wc -w)" -ne 1 ] || [ $ready -ne 4 ]; then
        fail swap_setup "ORA1 on [$M0_ORA1] (want 2 nodes), ORA2 on [$M0_ORA2] (want 1), $ready of 4 instances ready"
        return
    fi
    $D run --rescan-interval 1h 2>/tmp/run.log &
    dpid=$!
    for i in $(seq 1 300); do grep -q 'dbcage running' /tmp/run.log && break; /bin/sleep 0.1; done

    # more cores than the host has: refused whole, with the numbers, and nothing changes
    out=$($D set ORA1 cpu.cores=3 ORA2 cpu.cores=2 2>&1)
    rc=$?
    echo "$out" | sed 's/^/INFO set (too big) | /'
    if [ $rc -ne 0 ] && echo "$out" | grep -q 'cannot place it: it needs' && echo "$out" | grep -q 'nothing was changed' &&
        [ "$(cat $ROOT/ORA1/cpuset.cpus)" = "$C0_ORA1" ] && [ "$(cat $ROOT/ORA1/cpu.max)" = "200000 100000" ]; then
        pass swap_refused "set exit $rc, the needs and each node named, ORA1 unchanged"
    else
        fail swap_refused "set exit $rc, ORA1 cpus [$(cat $ROOT/ORA1/cpuset.cpus)] cpu.max [$(cat $ROOT/ORA1/cpu.max)]: $out"
    fi
    out=$($D set ORA1 cpu.cores=1 ORA2 cpu.cores=2 --dry-run 2>&1)
    rc=$?
    echo "$out" | sed 's/^/INFO set --dry-run | /'
    # how much would move depends on where memtouch's first touch put its pages (any amount)
    would=$(echo "$out" | sed -n "s/.*tenant \`ORA1\`: NUMA nodes $M0_ORA1 -> [0-9]*: cpus now; its memory (\(.*\) outside nodes [0-9]*) stays on nodes $M0_ORA1 until the instance restarts.*/\1/p")
    if [ $rc -eq 0 ] && echo "$out" | grep -q "tenant \`ORA2\`: NUMA nodes $M0_ORA2 -> .*no memory moves" &&
        [ -n "$would" ] && echo "$out" | grep -q 'dry run: nothing was changed' &&
        [ "$(cat $ROOT/ORA1/cpuset.cpus)" = "$C0_ORA1" ] && [ "$(cat $ROOT/ORA2/cpuset.cpus)" = "$C0_ORA2" ]; then
        pass swap_dry_run "says ORA1 moves ($would would move) and ORA2 grows; nothing changed"
    else
        fail swap_dry_run "exit $rc, would [$would], ORA1 cpus [$(cat $ROOT/ORA1/cpuset.cpus)] ORA2 cpus [$(cat $ROOT/ORA2/cpuset.cpus)]: $out"
    fi
    T0=$(now_ns)
    out=$($D set ORA1 cpu.cores=1 ORA2 cpu.cores=2 2>&1)
    rc=$?
    T1=$(now_ns)
    echo "$out" | sed 's/^/INFO set | /'
    for t in ORA1 ORA2 ORA3 ORA4; do
        eval "M1_$t=\$(cat $ROOT/$t/cpuset.mems)"
        eval "C1_$t=\$(cat $ROOT/$t/cpuset.cpus)"
        eval "info \"$t after: mems \$M1_$t cpus \$C1_$t cpu.max \$(cat $ROOT/$t/cpu.max)\""
    done
    # ORA1: one of its two nodes' cpus, its memory nodes as they were (held until restart)
    kept=""
    for n in $(expand "$M0_ORA1"); do [ "$(expand "$C1_ORA1")" = "$(node_cpus "$n")" ] && kept=$n; done
    # ORA2: two nodes, its old one among them, the cpus of those nodes, and ORA1's other node
    ok2=0
    if [ "$(expand "$M1_ORA2" | wc -w)" -eq 2 ] && in_list "$M0_ORA2" "$(expand "$M1_ORA2")" &&
        [ "$(expand "$C1_ORA2")" = "$(node_cpus "$M1_ORA2")" ] && [ -n "$kept" ] && ! in_list "$kept" "$(expand "$M1_ORA2")"; then
        ok2=1
    fi
    if [ $rc -eq 0 ] && [ -n "$kept" ] && [ "$M1_ORA1" = "$M0_ORA1" ] && [ $ok2 = 1 ] &&
        [ "$(cat $ROOT/ORA1/cpu.max)" = "100000 100000" ] && [ "$(cat $ROOT/ORA2/cpu.max)" = "200000 100000" ]; then
        pass swap_placed "in $(((T1 - T0) / 1000000)) ms: ORA1 cpus $C0_ORA1 -> $C1_ORA1 (kept node $kept; memory nodes stay $M1_ORA1 until restart), ORA2 nodes $M0_ORA2 -> $M1_ORA2 cpus $C1_ORA2; cpu.max 1 and 2 cores"
    else
        fail swap_placed "set exit $rc: ORA1 mems [$M1_ORA1] cpus [$C1_ORA1] (kept [$kept]), ORA2 mems [$M1_ORA2] cpus [$C1_ORA2], cpu.max [$(cat $ROOT/ORA1/cpu.max)] [$(cat $ROOT/ORA2/cpu.max)]: $out"
        tail -n 20 /tmp/run.log
    fi
    if [ "$M1_ORA3" = "$M0_ORA3" ] && [ "$C1_ORA3" = "$C0_ORA3" ] && [ "$M1_ORA4" = "$M0_ORA4" ] && [ "$C1_ORA4" = "$C0_ORA4" ] &&
        ! echo "$out" | grep -q 'tenant `ORA[34]`: NUMA nodes'; then
        pass swap_untouched "ORA3 and ORA4 kept nodes $M1_ORA3 and $M1_ORA4, cpus $C1_ORA3 and $C1_ORA4"
    else
        fail swap_untouched "ORA3 [$M0_ORA3 -> $M1_ORA3, $C0_ORA3 -> $C1_ORA3], ORA4 [$M0_ORA4 -> $M1_ORA4, $C0_ORA4 -> $C1_ORA4]"
    fi
    stayed=""
    for t in ORA1 ORA2 ORA3 ORA4; do
        eval "pid=\$PID_$t"
        if kill -0 "$pid" 2>/dev/null && grep -qx "$pid" $ROOT/$t/limited/cgroup.procs &&
            grep -q "^0::/dbcage-test/$t/limited\$" "/proc/$pid/cgroup"; then
            stayed="$stayed $t:$pid"
        fi
    done
    if [ "$(echo $stayed | wc -w)" -eq 4 ]; then
        pass swap_processes "each instance still runs in its tenant's group:$stayed"
    else
        fail swap_processes "still in their groups:$stayed (want ORA1-ORA4)"
    fi
    # and ORA1's memory follows its cpus when asked, under the daemon
    out=$($D set ORA1 cpu.migrate_memory=true 2>&1)
    rc=$?
    m1=$(cat $ROOT/ORA1/cpuset.mems)
    share=$(maps_pct ORA1 "$kept")
    if [ $rc -eq 0 ] && [ -n "$kept" ] && [ "$m1" = "$kept" ] && ge "$share" 95; then
        pass swap_migrated "set ORA1 cpu.migrate_memory=true: memory nodes $M1_ORA1 -> $m1, $share% of its memory on node $kept"
    else
        fail swap_migrated "set exit $rc, ORA1 mems [$m1] (want [$kept]), $share% on node $kept: $out"
    fi
    kill "$dpid" 2>/dev/null
    wait "$dpid" 2>/dev/null
    for t in ORA1 ORA2 ORA3 ORA4; do stop $t; done
}
if [ $PLACED = 1 ]; then
    T_SWAP=$(now_ns)
    swap
    info "live swap section: $((($(now_ns) - T_SWAP) / 1000000)) ms"
else
    fail swap "not run: the placement above failed"
fi

$D release --all >/dev/null 2>&1
echo "$P passed, $F failed"
[ "$F" -eq 0 ]
