#!/usr/bin/env bash
# Issue 8's classification-latency storm, side by side in one invocation:
#   1. kernel-baseline: the bench moves each child itself (cgroup.procs write), the kernel's floor;
#      kernel-baseline-4h: the same into cpu, cpuacct, cpuset and blkio one after the other;
#   2. cgrulesengd (libcgroup, Debian's cgroup-tools) with the equivalent cgrules.conf;
#   3. dbcage run (skipped with a message when this build has no `run`).
# Every side runs the same storm (benches/storm.rs): children named like seed processes
# (ora_pNNN_BX1, `oracleBX1 (LOCAL=NO)`) measure from their own start how long until
# /proc/self/cgroup shows the tenant's group in the cpu hierarchy.
#
# Usage (root, cgroup v1 cpu and cpuacct hierarchies):
#   sudo bench/run-storm.sh
# Environment: RATES (default 50,500,2000 execs/s), DURATION (s per rate, default 3),
#   SIDES (default baseline,baseline4,cgrulesengd,dbcage), STORM_ARGS (more bench options, e.g.
#   "--spawners 1 --long-ms 500"; `storm --help` lists them), DBCAGE_BIN (the dbcage to test;
#   default the target/release/dbcage this script builds),
#   STORM_RESULTS (a file to append the JSON lines to; by default they are only printed),
#   CLASSIFIER_NICE (default -10, as dist/dbcage.service sets it: both classifiers run at this
#   nice value, so neither is starved by the storm it classifies),
#   DBCAGE_RUN_ARGS (more `dbcage run` options, e.g. "--event-buffer 16384" to force event
#   overruns and show that the rescan recovers them),
#   TENANTS (default 1: the policy's tenants; the storm's BX1 comes last, after TENANTS-1 tenants
#   of two rules each that match nothing the storm runs),
#   OTHER_COMM (default 1: the second rule of those tenants is a `comm` rule, as an Oracle
#   policy's, so the daemon reads each new process's /proc/PID/comm besides its cmdline; 0: a
#   `cmdline` rule, so that only the number of rules differs from TENANTS=1, whose BX1 has
#   `cmdline` rules only),
#   DBCAGE_OLD_BIN (with SIDES containing dbcage-old: another dbcage build, e.g. the one before a
#   change, run the same way right after the dbcage side; each logs its time to ready),
#   BX1_LIMITS (1: the storm's tenant gets a cpu weight, a memory limit and an IO limit on the
#   disk behind /, so its processes move into blkio, cpu, cpuacct and memory, as a governed
#   instance's do; cgrulesengd's rules then name the same four hierarchies and its groups get
#   the values dbcage's plan gives BX1's (copied from a `dbcage apply` of the same policy);
#   default 0: no limits, three hierarchies for dbcage, cpu and cpuacct for cgrulesengd),
#   FAVORDYNMODS (1: mount the controller-less named v1 hierarchy dbcage-test-favordynmods with
#   the favordynmods option at /run/dbcage-test-favordynmods for the whole run, as
#   `agent.favordynmods` would: the option is global to cgroup_threadgroup_rwsem, so every side
#   runs with it; unmounted on exit, pass or fail, and checked gone; if a cgroup mount has the
#   option already, nothing is mounted and the run says so),
#   STORM_REPEAT (default 1: with N, the dbcage side runs N times in a row, a freshly started
#   daemon each time, its storm right after the daemon classified its first probe; the summary
#   at the end counts children never placed per storm),
#   PARENT_MATCH (0, 1 or alternate; default 0: the storm's forking parent renames itself
#   (comm) to stormlsnr_BX1, which a comm rule of BX1 matches, right before it starts to spawn,
#   so the daemon moves the parent while it forks (issue 23's escape); alternate: the 1st, 3rd,
#   ... of the STORM_REPEAT storms; the rule is in the policy whenever PARENT_MATCH is not 0).
#
# Everything it makes has dbcage-test in its name and is removed on exit, also on failure:
# /tmp/dbcage-test-storm-run-XXXX, the cgroups dbcage-test-storm-cgred/BX1/limited (cpu,
# cpuacct; with BX1_LIMITS=1 also blkio and memory), dbcage-test-storm-baseline (cpu, cpuacct,
# cpuset, blkio; never memory), dbcage's dbcage-test-storm root and, with FAVORDYNMODS=1, the
# mount /run/dbcage-test-favordynmods.
#
# cgrulesengd 2.0 has no option for the rules file: it reads /etc/cgrules.conf (and
# /etc/cgrules.d). So that nothing is written to /etc, it runs in a private mount namespace with
# a read-only overlay on /etc whose top layer holds our cgrules.conf (and the empty cgconfig.conf,
# cgconfig.d and cgrules.d it also insists on), and a private tmpfs on /run
# for its cgred.socket. Its rules name only the storm's process names.
set -euo pipefail

RATES=${RATES:-50,500,2000}
DURATION=${DURATION:-3}
SIDES=${SIDES:-baseline,baseline4,cgrulesengd,dbcage}
CLASSIFIER_NICE=${CLASSIFIER_NICE:--10}
STORM_ARGS=${STORM_ARGS:-}
REPO=$(cd "$(dirname "$0")/.." && pwd)
CG=/sys/fs/cgroup
# shellcheck source=bench/lib.sh
. "$REPO/bench/lib.sh"

die() { echo "run-storm: $*" >&2; exit 1; }
note() { echo "== $*"; }

[ "$(id -u)" = 0 ] || die "run as root (it creates cgroups and runs cgrulesengd)"
if [ ! -e "$CG/cpu/cgroup.procs" ] || [ ! -e "$CG/cpuacct/cgroup.procs" ]; then
    die "needs the cgroup v1 cpu and cpuacct hierarchies at $CG/cpu and $CG/cpuacct"
fi

# Our own cgroup in a v1 hierarchy (the cpu one is where the storm's children start and where
# dbcage's parent = "self" puts its root).
self_cg() {
    local p
    p=$(awk -F: -v h="$1" '{ n = split($2, c, ","); for (i = 1; i <= n; i++) if (c[i] == h) print $3 }' /proc/self/cgroup)
    echo "${p%/}"
}
SELF_CPU=$(self_cg cpu)
grep -Eq '^[0-9]+:([^:]*,)?cpu(,[^:]*)?:' /proc/self/cgroup || die "no cpu line in /proc/self/cgroup"

W=$(mktemp -d /tmp/dbcage-test-storm-run-XXXX)
STARTED=()       # pids we started, stopped by the trap
POLICY="$W/dbcage-test-storm.toml"
CGRED_GROUP=dbcage-test-storm-cgred
# cgrulesengd's hierarchies: those dbcage moves the storm's processes into.
CGRED_HIERS=(cpu cpuacct)
[ "${BX1_LIMITS:-0}" = 1 ] && CGRED_HIERS+=(blkio memory)
CGRED_DIRS=()    # its top group in each, below this shell's own group there (as dbcage's root)
for h in "${CGRED_HIERS[@]}"; do
    [ -e "$CG/$h/cgroup.procs" ] || die "BX1_LIMITS=1 needs the v1 $h hierarchy at $CG/$h"
    CGRED_DIRS+=("$CG/$h$(self_cg "$h")/$CGRED_GROUP")
done
FDM_DIR=/run/dbcage-test-favordynmods   # FAVORDYNMODS=1: its mount point (and hierarchy name)
FDM_MOUNTED=0
PARENT_COMM=stormlsnr_BX1
BASE_GROUP="$CG/cpu$SELF_CPU/dbcage-test-storm-baseline"
# The 4-hierarchy baseline: the same move into cpu, cpuacct, cpuset and blkio (dbcage moves into
# every hierarchy; memory is left out here, its groups sit inside the supervisor's subtree).
BASE4=()
for h in cpu cpuacct cpuset blkio; do
    if [ -e "$CG/$h/cgroup.procs" ]; then
        BASE4+=("$CG/$h$(self_cg "$h")/dbcage-test-storm-baseline")
    fi
done

stop_pid() { # pid signal: signal, wait up to 5 s, then SIGKILL
    local pid=$1 sig=${2:-TERM}
    kill -0 "$pid" 2>/dev/null || return 0
    kill -"$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
        sleep 0.1
    done
    echo "run-storm: pid $pid did not stop on SIG$sig; sending SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# Remove one of our cgroup trees depth-first. Leftover processes go back to the tree's parent,
# except in memory (dbcage's memory groups sit inside the supervisor's subtree), where nothing is
# moved: the storm's children end by themselves within ~2.5 s, so we wait for them.
cleanup() {
    local rc=$? pid d
    trap - EXIT INT TERM
    for pid in "${STARTED[@]}"; do stop_pid "$pid" TERM; done
    if [ -f "$POLICY" ] && [ -x "${DBCAGE_BIN:-$REPO/target/release/dbcage}" ]; then
        "${DBCAGE_BIN:-$REPO/target/release/dbcage}" -c "$POLICY" release --all >/dev/null 2>&1 || true
    fi
    for d in "${CGRED_DIRS[@]}"; do remove_tree "$d"; done
    remove_tree "$BASE_GROUP"
    for d in "${BASE4[@]}"; do remove_tree "$d"; done
    # dbcage's root, wherever parent = "self" put it, if release left it.
    remove_root dbcage-test-storm
    if [ "$FDM_MOUNTED" = 1 ]; then
        if mountpoint -q "$FDM_DIR"; then
            umount "$FDM_DIR" || umount -l "$FDM_DIR" || echo "run-storm: could not unmount $FDM_DIR" >&2
        fi
        rmdir "$FDM_DIR" 2>/dev/null || true
        if grep -q "name=dbcage-test-favordynmods" /proc/self/mountinfo || [ -e "$FDM_DIR" ]; then
            echo "run-storm: $FDM_DIR is still mounted or present" >&2
            rc=1
        else
            note "favordynmods: $FDM_DIR unmounted and removed; cgroup mounts with the option now: $(fdm_mounts | wc -l)"
        fi
    fi
    rm -rf "$W"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------------
note "setup"
side() { case ",$SIDES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
if side cgrulesengd && ! command -v cgrulesengd >/dev/null; then
    note "installing cgroup-tools"
    DEBIAN_FRONTEND=noninteractive apt-get install -y cgroup-tools >/dev/null ||
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y cgroup-tools >/dev/null; }
fi
if pgrep -x cgrulesengd >/dev/null; then
    die "a cgrulesengd is already running (pid $(pgrep -x cgrulesengd | tr '\n' ' ')); it would classify the storm too"
fi

# The storm's names are the tenant's names: a BX1 process of someone else's would be classified
# too (and counted in the classifier's CPU), so say so.
if others=$(pgrep -a -f '^(ora_p[0-9a-z]{3}_BX1|oracleBX1)' 2>/dev/null); then
    echo "run-storm: warning: processes with the storm's names are running and would be classified too:" >&2
    echo "$others" >&2
fi

# The cgroup mounts whose super options have favordynmods: mount point and options.
fdm_mounts() {
    awk '{ for (i = 7; i <= NF; i++) if ($i == "-") {
               if ($(i + 1) ~ /^cgroup2?$/ && $(i + 3) ~ /(^|,)favordynmods(,|$)/) print $5, $(i + 3)
               break } }' /proc/self/mountinfo
}
if [ "${FAVORDYNMODS:-0}" = 1 ]; then
    if grep -q "name=dbcage-test-favordynmods" /proc/self/mountinfo; then
        die "a hierarchy named dbcage-test-favordynmods is mounted already (another run?)"
    fi
    if fdm=$(fdm_mounts | head -n1) && [ -n "$fdm" ]; then
        note "favordynmods: $fdm has the option already; nothing mounted"
    else
        mkdir "$FDM_DIR"
        FDM_MOUNTED=1
        mount -t cgroup -o none,name=dbcage-test-favordynmods,favordynmods cgroup "$FDM_DIR" ||
            die "could not mount the favordynmods hierarchy at $FDM_DIR (Linux 6.0 or later needed)"
        note "favordynmods: mounted $(fdm_mounts)"
    fi
fi

cd "$REPO"
cargo build --release --quiet
# The storm bench's own artifact (the build may also report the dbcage binary after it).
BENCH=$(cargo bench --bench storm --no-run --message-format=json 2>/dev/null |
    grep '"kind":\["bench"\]' | grep '"name":"storm"' |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n1)
[ -x "$BENCH" ] || die "could not build the storm bench"
note "bench: $BENCH; rates $RATES execs/s for ${DURATION}s each; cpu cgroup of this shell: ${SELF_CPU:-/}"

storm() { # name expect [extra args...]
    local name=$1 expect=$2
    shift 2
    # shellcheck disable=SC2086
    "$BENCH" --rates "$RATES" --duration "$DURATION" --name "$name" --expect "$expect" \
        --tmpdir "$W" --json-out "$W/results.jsonl" $STORM_ARGS "$@" | tee "$W/table-$name.txt"
}
wait_ready() { # expect
    "$BENCH" --wait-ready 15 --expect "$1" --tmpdir "$W"
}

# ---------------------------------------------------------------------------------------------
if side baseline; then
    note "kernel baseline: the bench writes each child's pid into $BASE_GROUP/cgroup.procs"
    storm kernel-baseline "" --baseline "$BASE_GROUP"
fi
if side baseline4; then
    note "kernel baseline, 4 hierarchies: the bench writes each pid into ${BASE4[*]}"
    b4=()
    for d in "${BASE4[@]}"; do b4+=(--baseline "$d"); done
    storm kernel-baseline-4h "" "${b4[@]}"
fi

# ---------------------------------------------------------------------------------------------
# The policy: TENANTS-1 tenants whose two rules each (cmdline and comm; two cmdline rules with
# OTHER_COMM=0) match nothing the storm runs, then BX1, the storm's tenant, last (so every
# other tenant's rules are tried first).
write_policy() {
    local i
    {
        printf '[agent]\nparent = "self"\nroot = "dbcage-test-storm"\n'
        for i in $(seq 2 "${TENANTS:-1}"); do
            printf '\n[[tenant]]\nname = "T%04d"\n' "$i"
            if [ "${OTHER_COMM:-1}" = 1 ]; then
                printf "match = [{ cmdline = '^ora_p[0-9a-z]{3}_T%04d( |\$)' }, { comm = '^oracleT%04d\$' }]\n" "$i" "$i"
            else
                printf "match = [{ cmdline = '^ora_p[0-9a-z]{3}_T%04d( |\$)' }, { cmdline = '^oracleT%04d( |\$)' }]\n" "$i" "$i"
            fi
        done
        printf '\n[[tenant]]\nname = "BX1"\n'
        if [ "${PARENT_MATCH:-0}" = 0 ]; then
            printf "match = [{ cmdline = '^ora_p[0-9a-z]{3}_BX1' }, { cmdline = '^oracleBX1' }]\n"
        else
            printf "match = [{ cmdline = '^ora_p[0-9a-z]{3}_BX1' }, { cmdline = '^oracleBX1' }, { comm = '^%s\$' }]\n" "$PARENT_COMM"
        fi
        if [ "${BX1_LIMITS:-0}" = 1 ]; then
            printf 'storage = ["/"]\n[tenant.io]\nread_bps = "1GiB"\n'
            printf '[tenant.cpu]\nweight = 200\n[tenant.memory]\nmax = "8GiB"\n'
        fi
    } >"$POLICY"
}
if side cgrulesengd; then
    note "cgrulesengd ($(dpkg-query -W -f '${Version}' cgroup-tools 2>/dev/null || echo '?'))"
    # cgrulesengd 2.0 also insists on /etc/cgconfig.conf and /etc/cgconfig.d (templates): empty.
    mkdir -p "$W/etc/cgconfig.d" "$W/etc/cgrules.d"
    echo "# no templates" >"$W/etc/cgconfig.conf"
    # Its groups mirror dbcage's for BX1 (root, BX1, BX1/limited) in the hierarchies dbcage
    # moves BX1's processes into; with BX1_LIMITS=1 they get the values dbcage's plan writes
    # for BX1 (`dbcage plan --json` of the same policy, fresh: only what differs from a new
    # group's defaults), each in the mirrored group, in the plan's order.
    CGRED_LEAF=$CGRED_GROUP/BX1/limited
    for d in "${CGRED_DIRS[@]}"; do mkdir -p "$d/BX1/limited"; done
    if [ "${BX1_LIMITS:-0}" = 1 ]; then
        write_policy
        "${DBCAGE_BIN:-$REPO/target/release/dbcage}" -c "$POLICY" plan --json >"$W/cgred-plan.json"
        python3 - "$W/cgred-plan.json" "$CG" "${CGRED_HIERS[@]}" >"$W/cgred-values.txt" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
hiers = tuple(f"{sys.argv[2]}/{h}/" for h in sys.argv[3:])
for w in plan["steps"]:
    if w.get("action") != "write":
        continue
    path = w["path"]
    # Only the hierarchies cgrulesengd moves into (dbcage's root in cpuset is not one).
    if "/dbcage-test-storm/" not in path or not path.startswith(hiers):
        continue
    rel = path.split("/dbcage-test-storm/", 1)[1]
    if rel.count("/") and not rel.startswith("BX1/"):
        continue  # another tenant's
    print(path.replace("/dbcage-test-storm/", "/dbcage-test-storm-cgred/", 1) + "\t" + w["value"])
PY
        [ -s "$W/cgred-values.txt" ] || die "dbcage's plan for BX1 has no values (BX1_LIMITS=1); plan in $W/cgred-plan.json"
        while IFS=$'\t' read -r f v; do
            printf '%s' "$v" >"$f" || die "writing $v into $f"
            note "cgrulesengd's groups: $f = $v"
        done <"$W/cgred-values.txt"
    fi
    {
        echo "# dbcage storm bench: the storm's process names only, one line per hierarchy"
        # shellcheck disable=SC2086 # STORM_ARGS is a list of options (--names N)
        "$BENCH" --print-names $STORM_ARGS | while read -r n; do
            lead="*:$n"
            for h in "${CGRED_HIERS[@]}"; do
                echo "$lead $h $(self_cg "$h")/$CGRED_LEAF"
                lead="%"
            done
        done
    } >"$W/etc/cgrules.conf"
    # shellcheck disable=SC2016 # $1 is expanded by the inner sh
    unshare --mount --propagation private -- sh -c '
        mount -t overlay dbcage-test-storm-etc -o "lowerdir=$1/etc:/etc" /etc &&
        mount -t tmpfs dbcage-test-storm-run /run &&
        exec nice -n "$2" cgrulesengd -n -f "$1/cgrulesengd.log"' sh "$W" "$CLASSIFIER_NICE" &
    CGRED_PID=$!
    STARTED+=("$CGRED_PID")
    if wait_ready "$SELF_CPU/$CGRED_LEAF"; then
        [ "$(cat "/proc/$CGRED_PID/comm" 2>/dev/null)" = cgrulesengd ] ||
            die "pid $CGRED_PID is not cgrulesengd"
        storm cgrulesengd "$SELF_CPU/$CGRED_LEAF" --classifier-pid "$CGRED_PID"
    else
        echo "run-storm: cgrulesengd never classified a probe; its log:" >&2
        cat "$W/cgrulesengd.log" >&2 || true
    fi
    stop_pid "$CGRED_PID" TERM
    if [ -s "$W/cgrulesengd.log" ]; then
        note "cgrulesengd log (notices and errors, last 5 lines)"
        tail -n5 "$W/cgrulesengd.log"
    fi
    for d in "${CGRED_DIRS[@]}"; do remove_tree "$d"; done
fi

# ---------------------------------------------------------------------------------------------
DBCAGE_STATS=""
dbcage_side() { # name binary [storm args...]
    local name=$1 DBCAGE=$2 t0 ready_ms
    shift 2
    if ! "$DBCAGE" run --help >/dev/null 2>&1; then
        note "$name: this build has no \`dbcage run\` (\`$DBCAGE run --help\` failed); skipping it"
        return 0
    fi
    note "$name: $DBCAGE run (${TENANTS:-1} tenants)"
    write_policy
    "$DBCAGE" -c "$POLICY" check >/dev/null
    # Its log (one line per move at info level) goes to a file, not into the tables.
    t0=$(date +%s%N)
    # shellcheck disable=SC2086 # DBCAGE_RUN_ARGS is a list of options
    nice -n "$CLASSIFIER_NICE" "$DBCAGE" -c "$POLICY" run --stats-out "$W/$name-stats.json" ${DBCAGE_RUN_ARGS:-} 2>"$W/$name-run.log" &
    DB_PID=$!
    STARTED+=("$DB_PID")
    # Time to ready: from the launch to its "dbcage running" line (logged right before it
    # tells systemd it is ready).
    ready_ms=""
    for _ in $(seq 3000); do
        if grep -q 'dbcage running' "$W/$name-run.log" 2>/dev/null; then
            ready_ms=$((($(date +%s%N) - t0) / 1000000))
            break
        fi
        kill -0 "$DB_PID" 2>/dev/null || break
        sleep 0.005
    done
    note "$name: ready after ${ready_ms:-?} ms; RSS then $(awk '/^VmRSS/ { print $2, $3 }' "/proc/$DB_PID/status" 2>/dev/null)"
    echo "{\"name\":\"$name\",\"tenants\":${TENANTS:-1},\"ready_ms\":${ready_ms:-null}}" >>"$W/results.jsonl"
    if wait_ready "$SELF_CPU/dbcage-test-storm/BX1/limited"; then
        storm "$name" "$SELF_CPU/dbcage-test-storm/BX1/limited" --classifier-pid "$DB_PID" "$@"
    else
        echo "run-storm: $name never classified a probe" >&2
    fi
    stop_pid "$DB_PID" TERM
    note "$name log: $(grep -c ' move ' "$W/$name-run.log" || true) move lines," \
        "$(grep -c 'not logged one by one' "$W/$name-run.log" || true) summaries of moves past 20/s;" \
        "warnings and errors (last 5):"
    grep -E ' (WARN|ERROR) ' "$W/$name-run.log" | tail -n5 || true
    "$DBCAGE" -c "$POLICY" release --all >/dev/null || true
    if [ -s "$W/$name-stats.json" ]; then
        DBCAGE_STATS+="$name: $(cat "$W/$name-stats.json")"$'\n'
    else
        DBCAGE_STATS+="$name: (no --stats-out file)"$'\n'
    fi
}
# The storm's parent matches BX1 (a comm rule) in storm number $1 of STORM_REPEAT?
parent_matches() {
    case "${PARENT_MATCH:-0}" in
        0) return 1 ;;
        1) return 0 ;;
        alternate) [ $(($1 % 2)) = 1 ] ;;
        *) die "PARENT_MATCH=$PARENT_MATCH: 0, 1 or alternate" ;;
    esac
}
if side dbcage; then
    if [ "${STORM_REPEAT:-1}" = 1 ]; then
        if parent_matches 1; then
            dbcage_side dbcage "${DBCAGE_BIN:-$REPO/target/release/dbcage}" --parent-comm "$PARENT_COMM"
        else
            dbcage_side dbcage "${DBCAGE_BIN:-$REPO/target/release/dbcage}"
        fi
    else
        for i in $(seq "$STORM_REPEAT"); do
            if parent_matches "$i"; then
                dbcage_side "dbcage-$i-pm" "${DBCAGE_BIN:-$REPO/target/release/dbcage}" --parent-comm "$PARENT_COMM"
            else
                dbcage_side "dbcage-$i" "${DBCAGE_BIN:-$REPO/target/release/dbcage}"
            fi
        done
    fi
fi
# The build before a change, side by side in the same run: DBCAGE_OLD_BIN=path SIDES=...,dbcage-old
if side dbcage-old; then
    [ -x "${DBCAGE_OLD_BIN:-}" ] || die "SIDES has dbcage-old but DBCAGE_OLD_BIN (${DBCAGE_OLD_BIN:-unset}) is not an executable"
    dbcage_side dbcage-old "$DBCAGE_OLD_BIN"
fi

# ---------------------------------------------------------------------------------------------
echo
note "side by side (delay: ms from the child's own start until /proc/self/cgroup shows the group;"
echo "   never: no record or not classified within 2 s; >=50ms: of those, lived 50 ms or more;"
echo "   exec p99: the parent's spawn call to the child's main, ms (it includes any time the child"
echo "   was held by a cgroup move in flight); x2g: exec-to-group, from the parent's spawn() returning"
echo "   (it returns once the child's exec succeeded) to the child seeing the group (JSON: exec_to_group_*,"
echo "   and spawn_to_group_* from before the fork); cpu us/pr and HWM: the classifier's utime+stime per spawned process"
echo "   and VmHWM; move p99: the baseline's own cgroup.procs write, start to end; host%: the whole"
echo "   host's CPU busy share during the rate (this host is shared: read the figures with it))"
for f in "$W"/table-*.txt; do
    [ -f "$f" ] || continue
    grep -v '^{' "$f"
    echo
done
if [ -n "$DBCAGE_STATS" ]; then
    note "dbcage --stats-out"
    printf '%s' "$DBCAGE_STATS"
fi
note "JSON lines"
cat "$W/results.jsonl" 2>/dev/null || true
if [ "${STORM_REPEAT:-1}" != 1 ] && [ -f "$W/results.jsonl" ]; then
    note "children never placed per storm (STORM_REPEAT=$STORM_REPEAT, PARENT_MATCH=${PARENT_MATCH:-0}; pm: the forking parent matched BX1)"
    python3 - "$W/results.jsonl" "$W" <<'PY'
import json, sys, os
rows = [json.loads(l) for l in open(sys.argv[1]) if '"rate_target"' in l]
rows = [r for r in rows if r["classifier"].startswith("dbcage")]
tot = {}
for r in rows:
    name = r["classifier"]
    pm = name.endswith("-pm")
    st = {}
    try:
        st = json.load(open(os.path.join(sys.argv[2], name + "-stats.json")))
    except (OSError, ValueError):
        pass
    fdm = st.get("forked_during_move", "?")
    print(f"{name:14} rate {r['rate_target']:5} spawned {r['spawned']:5} records {r['records']:5} "
          f"never {r['never']:3} (lived >=50 ms: {r['never_lived_50ms']}) x2g p99 {r['exec_to_group_p99_ms']} ms "
          f"cpu {r['classifier_cpu_us_per_proc'] or 0:.0f} us/proc forked_during_move {fdm}")
    t = tot.setdefault(pm, [0, 0, 0, 0, 0])
    t[0] += 1; t[1] += r["spawned"]; t[2] += r["records"]; t[3] += r["never"]
    t[4] += fdm if isinstance(fdm, int) else 0
for pm, t in sorted(tot.items()):
    print(f"{'parent matches' if pm else 'parent does not match'}: {t[0]} storms, {t[1]} spawned, "
          f"{t[2]} records, {t[3]} never placed, {t[4]} moved as forked during their parent's move")
PY
fi
if [ -n "${STORM_RESULTS:-}" ] && [ -f "$W/results.jsonl" ]; then
    cat "$W/results.jsonl" >>"$STORM_RESULTS"
fi
