#!/bin/sh
# Guest-side checks of what users read on cgroup v2 (run by tests/vm/run.sh, busybox sh):
#   cargo build --release && tests/vm/run.sh target/release/dbcage tests/vm/observe.sh
# - status --json counts the bytes fio read inside a tenant within 2%;
# - verify measures a tenant's read_bps and read_iops limits within 10%.
# Prints PASS/FAIL lines and "N passed, N failed"; exits non-zero when a check failed.

P=0
F=0
pass() { echo "PASS $*"; P=$((P + 1)); }
fail() { echo "FAIL $*"; F=$((F + 1)); }
in_range() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v + 0 >= lo + 0 && v + 0 <= hi + 0) }'; }

cat > /tmp/policy.toml <<'POL'
[agent]
parent = "root"
root = "dbcage-test"
metrics = "off"

[[tenant]]
name = "db"
match = [{ cmdline = "^ora_p001_OBS" }]
storage = ["/dev/vdb"]
[tenant.io]
read_bps = "8MiB"
read_iops = 300
POL
D="/bin/dbcage -c /tmp/policy.toml"
$D apply >/dev/null 2>&1 || { echo "FAIL apply"; $D apply; }

read_bytes() { $D status --json --interval 0 db | grep '"read_bytes"' | head -1 | tr -dc '0-9'; }

# (1) status against fio: fio runs inside the tenant from its first instant.
if command -v fio >/dev/null 2>&1; then
    before=$(read_bytes)
    out=$($D exec db -- fio --name=dbcage-test --filename=/dev/vdb --rw=read --bs=64k --direct=1 \
        --ioengine=psync --size=24M --output-format=json 2>/dev/null)
    fio_bytes=$(echo "$out" | grep '"io_bytes"' | head -1 | tr -dc '0-9')
    after=$(read_bytes)
    seen=$((after - before))
    ratio=$(awk -v a="$seen" -v b="$fio_bytes" 'BEGIN { if (b > 0) printf "%.4f", a / b; else print 0 }')
    if in_range "$ratio" 0.98 1.02; then
        pass status_vs_fio "status counted $seen bytes, fio read $fio_bytes: ratio $ratio"
    else
        fail status_vs_fio "status counted $seen bytes, fio read $fio_bytes: ratio $ratio"
    fi
else
    fail status_vs_fio "fio is not in the VM"
fi

# (2) verify: the kernel holds each limit within 10%.
v=$($D verify db --step-time 3s 2>&1)
rc=$?
echo "$v" | sed 's/^/INFO | /'
if [ $rc -eq 0 ]; then pass verify "read_bps and read_iops within tolerance"; else fail verify "exit $rc"; fi

$D release --all >/dev/null 2>&1
echo "$P passed, $F failed"
[ "$F" -eq 0 ]
