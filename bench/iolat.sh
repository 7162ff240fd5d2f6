#!/usr/bin/env bash
# IO latency histograms (issue 25): what the eBPF program costs per IO, and how its percentiles
# compare with fio's own completion latency. Holds /tmp/dbcage-measure.lock throughout.
#
#   sudo bench/iolat.sh                       # build first: cargo build --release
#   sudo ROUNDS=6 SECS=5 DBCAGE=target/debug/dbcage bench/iolat.sh
#
# Overhead: a raw loop device over a sparse file (reads never leave the page cache, so the
# device is as fast as this host gets: the program's cost is the largest share it can be),
# fio 4 KiB random direct reads, one job at depth 1, ROUNDS rounds of a pair: without and
# with `dbcage iolat` loaded, the order flipped each round. Per round IOPS; at the end the
# median of each side, the throughput loss and the cost per IO (1/IOPS with - 1/IOPS
# without), and the median of the rounds' own losses with a 95% bootstrap interval. Then one more round
# with `dbcage iolat --cost`: the kernel times each run of the program (steadier than the
# throughput on a busy host, where rounds vary by more than the program costs; kept out of the
# rounds above because the statistics add about 55 ns per run of their own).
# Accuracy: the same loop device with --direct-io=on over a file filled with data, so reads go
# to the disk below; fio's clat p50/p99 against `dbcage iolat`'s p50/p99 for the same reads
# (run at nice -20 so that fio's wake-up is not what is measured on a busy host).
set -euo pipefail
cd "$(dirname "$0")/.."
DBCAGE=${DBCAGE:-target/release/dbcage}
ROUNDS=${ROUNDS:-6}
SECS=${SECS:-5}
[ -x "$DBCAGE" ] || { echo "build first: cargo build --release (or DBCAGE=...)" >&2; exit 2; }

# shellcheck source=bench/lib.sh
. bench/lib.sh
work=$(mktemp -d /tmp/dbcage-test-bench-iolat.XXXXXX)
root=dbcage-test-bench-iolat-$$
loop=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  [ -n "${iolat_pid:-}" ] && kill "$iolat_pid" 2>/dev/null && wait "$iolat_pid" 2>/dev/null
  [ -n "$loop" ] && losetup -d "$loop"
  "$DBCAGE" -c "$work/dbcage.toml" release --all >/dev/null 2>&1 || true
  remove_root "$root" # what release left (a build that failed, a run stopped mid-apply)
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
# bash runs the EXIT trap on a signal only when the signal is trapped
trap 'exit 130' INT TERM HUP
exec 9>/tmp/dbcage-measure.lock
flock 9

cat >"$work/dbcage.toml" <<TOML
[agent]
parent = "self"
root = "$root"

[[tenant]]
name = "bench"
match = [{ cmdline = "^dbcage-test-nomatch( |\$)" }]
TOML
"$DBCAGE" -c "$work/dbcage.toml" apply >/dev/null

truncate -s 1G "$work/dbcage-test.img"
loop=$(losetup --find --show "$work/dbcage-test.img")
fio_iops() {
  "$DBCAGE" -c "$work/dbcage.toml" exec bench -- fio --name=b --filename="$loop" --rw=randread \
    --direct=1 --bs=4k --size=512M --runtime="$SECS" --time_based --output-format=json \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["read"]["iops"])'
}
start_iolat() { # start_iolat SECONDS ARGS...: returns once the program is attached
  local d=$1
  shift
  "$DBCAGE" -c "$work/dbcage.toml" iolat --duration "${d}s" "$@" >"$work/iolat.out" 2>"$work/iolat.err" &
  iolat_pid=$!
  for _ in $(seq 300); do
    [ "$(ls -l /proc/$iolat_pid/fd 2>/dev/null | grep -c 'anon_inode:bpf_link')" -ge 3 ] && return 0
    sleep 0.1
  done
  echo "dbcage iolat did not attach: $(cat "$work/iolat.err")" >&2
  exit 1
}

echo "== overhead: $loop (page cache), fio randread 4k direct depth 1, ${SECS}s x $ROUNDS rounds each side"
without=()
with=()
with_round() { # one fio round with the program loaded
  start_iolat $((SECS + 30))
  fio_iops
  kill "$iolat_pid"; wait "$iolat_pid" 2>/dev/null || true; iolat_pid=""
}
# The first fio round of a run gives a third of the others' IOPS (seen with and without the
# program, and after reading the whole file first): one round that is not counted.
fio_iops >/dev/null
for r in $(seq "$ROUNDS"); do
  # Each round's order flips (without-with, with-without): a host getting busier or quieter
  # over the run then weighs on both sides alike instead of on whichever ran second.
  if [ $((r % 2)) -eq 1 ]; then
    a=$(fio_iops); b=$(with_round)
  else
    b=$(with_round); a=$(fio_iops)
  fi
  printf 'round %d: without %.0f IOPS, with %.0f IOPS (load %s)\n' "$r" "$a" "$b" "$(cut -d' ' -f1 /proc/loadavg)"
  without+=("$a")
  with+=("$b")
done
python3 - "${without[*]}" "${with[*]}" <<'PY'
import random, statistics, sys
wo = [float(x) for x in sys.argv[1].split()]
wi = [float(x) for x in sys.argv[2].split()]
a, b = statistics.median(wo), statistics.median(wi)
print(f"median: without {a:.0f} IOPS, with {b:.0f} IOPS: {100 * (a - b) / a:+.2f}% throughput loss, "
      f"{(1 / b - 1 / a) * 1e6:+.3f} us per IO")
# Each round pairs two neighbouring measurements: the loss per round, its median and a 95%
# bootstrap interval of that median (resampling rounds), which says whether the figure is
# the program's or the host's noise.
loss = sorted(100 * (x - y) / x for x, y in zip(wo, wi))
rng = random.Random(25)
meds = sorted(statistics.median(rng.choices(loss, k=len(loss))) for _ in range(2000))
print(f"paired: median loss {statistics.median(loss):+.2f}% over {len(loss)} rounds, "
      f"95% interval {meds[50]:+.2f}% .. {meds[1949]:+.2f}%")
PY
start_iolat $((SECS + 30)) --cost
fio_iops >/dev/null
kill "$iolat_pid"; wait "$iolat_pid" 2>/dev/null || true; iolat_pid=""
grep -o 'program cost: .*' "$work/iolat.out" || echo "program cost: not reported: $(cat "$work/iolat.err")"

echo "== accuracy: $loop with --direct-io=on over a filled file, fio clat vs dbcage iolat"
dd if=/dev/urandom of="$loop" bs=1M count=512 oflag=direct status=none
losetup --direct-io=on "$loop"
echo 3 >/proc/sys/vm/drop_caches
name=${loop#/dev/}
start_iolat $((SECS + 5)) bench --device "$loop" --op read --json
"$DBCAGE" -c "$work/dbcage.toml" exec bench -- nice -n -20 fio --name=a --filename="$loop" \
  --rw=randread --direct=1 --bs=4k --size=512M --runtime="$SECS" --time_based \
  --output-format=json >"$work/fio.json"
wait "$iolat_pid"
iolat_pid=""
python3 - "$work/fio.json" "$work/iolat.out" "$name" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]["read"]
pct = job["clat_ns"]["percentile"]
print(f"fio:         {job['total_ios']} reads, clat p50 {pct['50.000000'] / 1e3:.1f} us, p99 {pct['99.000000'] / 1e3:.1f} us")
for r in json.load(open(sys.argv[2])):
    print(f"dbcage iolat: {r['count']} reads, p50 {r['p50_s'] * 1e6:.1f} us, p99 {r['p99_s'] * 1e6:.1f} us "
          f"(p50 {100 * (r['p50_s'] * 1e9 / pct['50.000000'] - 1):+.1f}%, p99 {100 * (r['p99_s'] * 1e9 / pct['99.000000'] - 1):+.1f}%)")
PY
