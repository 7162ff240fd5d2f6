#!/usr/bin/env bash
# Runs every test of dbcage: formatting, lints, unit tests, the real-kernel integration tests
# (root: cgroup v1 on this host, loop devices, fio; then the same tests on cgroup v2 in the systemd
# guest, tests/sdguest/it.sh), and in a qemu VM the cgroup v2 smoke run and
# dbcage's v2 scenarios (tests/vm/scenarios.sh), a quick run of the storm on v2 (tests/vm/storm.sh),
# and issue 19's scenarios on a systemd host in a guest (tests/sdguest/systemd.sh, with the .deb).
# Installs what the tests need with apt on a fresh Debian machine.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for pair in fio:fio promtool:prometheus curl:curl openssl:openssl mkfs.ext4:e2fsprogs losetup:mount /usr/bin/python3:python3 qemu-system-x86_64:qemu-system-x86 busybox:busybox-static tmux:tmux debootstrap:debootstrap man:man-db systemd-analyze:systemd mariadbd:mariadb-server sysbench:sysbench cgconfigparser:cgroup-tools /usr/lib/postgresql/15/bin/pgbench:postgresql-15 /usr/lib/postgresql/15/bin/pg_basebackup:postgresql-client-15 useradd:passwd gpasswd:passwd setpriv:util-linux; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
/usr/bin/python3 -c 'import prometheus_client' 2>/dev/null || missing+=(python3-prometheus-client)
# shellcheck source=scripts/build-deps.sh
. scripts/build-deps.sh
add_missing_build_deps
apt_install "${missing[@]}"

if ! cargo deb --version >/dev/null 2>&1; then
  echo "installing cargo-deb (cargo install cargo-deb --locked; a few minutes)"
  cargo install cargo-deb --locked --quiet
fi

# Each step's wall time, printed when the next one starts and at the end (where CI's time goes).
step_name=""
step_began=$SECONDS
step() {
  [ -n "$step_name" ] && echo "   ($((SECONDS - step_began)) s: $step_name)"
  step_name=$1
  step_began=$SECONDS
  echo "== $1"
}
trap '[ -n "$step_name" ] && echo "   ($((SECONDS - step_began)) s: $step_name; $SECONDS s in all)"' EXIT

step "cargo fmt --check"
cargo fmt --check
step "cargo clippy"
cargo clippy --all-targets --quiet -- -D warnings
step "monitoring mixin: rules and their unit tests (every alert fires and does not)"
promtool check rules dist/mixin/rules.yml dist/mixin/alerts.yml
promtool test rules dist/mixin/tests.yml
step "unit tests"
cargo test --lib --quiet
step "Debian package (tests/it/package.rs installs it into a debootstrap root)"
DBCAGE_DEB=$(scripts/build-deb.sh)
export DBCAGE_DEB
step "the Ansible role on the Debian 12 systemd guest (3 runs + a refused one; 10-18 min under TCG)"
dist/ansible/test/run.sh "$DBCAGE_DEB"
step "integration tests on this host's kernel (root)"
# A test that cannot run fails unless tests/it/skips.rs declares the skip; every skip, declared
# or not, is recorded in target/tmp/it-skips.tsv and listed here.
skip_log=target/tmp/it-skips.tsv
rm -f "$skip_log"
it_status=0
cargo test --test it --quiet -- --test-threads=1 || it_status=$?
echo "== skipped integration tests (test, declared?, reason)"
if [ -s "$skip_log" ]; then
  sort "$skip_log" | sed 's/\t/  /g'
else
  echo "(none)"
fi
if grep -q $'\tUNDECLARED\t' "$skip_log" 2>/dev/null; then
  echo "undeclared skips above: install what they need, or declare them in tests/it/skips.rs" >&2
  exit 1
fi
[ "$it_status" -eq 0 ] || exit "$it_status"
step "integration tests on cgroup v2: the same test binary in the Debian 12 systemd guest (~8 min under TCG)"
# tests/it reads the cgroup version it runs on; in the guest it runs in a delegated scope and
# expects the v2 driver's files. Prints the guest's skips (and what is left out of the v2 run,
# with why) and fails on a failed test or an undeclared skip.
tests/sdguest/it.sh
step "cgroup v2 in a VM"
cargo build --release --quiet
tests/vm/run.sh target/release/dbcage tests/vm/smoke.sh
tests/vm/run.sh target/release/dbcage tests/vm/scenarios.sh
tests/vm/run.sh target/release/dbcage tests/vm/observe.sh
# Issue 25: per-tenant IO latency histograms on v2 (attribution with writeback charged to the
# writer, the throttle's wait, accuracy against fio and the throughput the program costs, both on
# null_blk disks).
DBCAGE_VM_MODULES=null_blk tests/vm/run.sh target/release/dbcage tests/vm/iolat.sh
# Issue 24: io.weight under iocost on a virtio disk (two readers at weights 100 and 300: 1:3 +-10%),
# check's reasons where iocost or blk-iolatency is missing.
tests/vm/run.sh target/release/dbcage tests/vm/protect.sh
# The same on a kernel with blk-iolatency, which no Debian kernel package enables (Debian's 6.1
# source, defconfig plus what the tests need, built once into the VM cache: 15-30 min the first
# time, then nothing): latency_target's io.latency line written, read back and cleared, and the
# target protecting a reader against a flood on a null_blk disk.
tests/vm/build-kernel.sh
DBCAGE_VM_KERNEL_DIR=/var/cache/dbcage-vm/kernel-iolatency DBCAGE_VM_MODULES=null_blk \
  tests/vm/run.sh target/release/dbcage tests/vm/protect.sh
# Issue 26: seed 002's consolidation on four NUMA nodes (numa = "auto", each tenant on its own
# node, >= 95% of each one's memory there by numa_maps and memory.numa_stat), and its live CPU
# swap between two auto tenants with one `dbcage set` through the daemon (section 8, 6-14 s).
# memtouch needs only std: rustc builds it in a second, where `cargo build --release --example`
# would first build every dev-dependency in release.
mkdir -p target/release/examples
rustc -O --edition 2021 -o target/release/examples/memtouch examples/memtouch.rs
DBCAGE_VM_NUMA_NODES=4 DBCAGE_VM_NODE_MEM_MB=768 \
  tests/vm/run.sh target/release/dbcage tests/vm/numa.sh target/release/examples/memtouch
# Issue 24: `dbcage iocost` (proposal, --apply, --revert, refusal of another owner's values, dm
# members) and the protection guard (a PSI trigger lowers a donor's io.weight under a real flood,
# restores it once quiet).
DBCAGE_VM_MODULES=null_blk tests/vm/run.sh target/release/dbcage tests/vm/iocost.sh
# The flood (32 synchronous readers) holds the protected tenant's stall share at about four times
# the trigger's 10%; the guard lowers within 3-6 s of its start; then the same with
# protect_lever = "caps" on the disk's io.max (~2.5 min per run).
DBCAGE_VM_MODULES=null_blk tests/vm/run.sh target/release/dbcage tests/vm/guard.sh
# Issue 8's storm on v2, quick: favordynmods on and off at 10 execs/s (~45 s); checks dbcage's
# "mounted without favordynmods" notice and that the option removes the move's grace-period wait.
bench/run-storm-vm.sh BASE_RATES=10 DBCAGE_RATES=10 DURATION=2 FORK_ROUNDS=1
step "a systemd host in a guest (Debian 12, systemd 252 as PID 1, PostgreSQL 15; qemu/TCG)"
# Issue 19's scenarios with the daemon governing postgresql@15-main.service through systemd:
# status and metrics read from the unit, restart sampled every 100 ms, adoption of processes
# started in a login session (into a running scope within 1 s), kill -9 and restart of the
# daemon, daemon-reloads with drift repaired and counted, exempt leaves in a delegated unit, and
# a delegated leaf's io.max lifted by hand and written back (~0.5 s), the demand split on a
# unit's per-device IO properties (~20 s), and MariaDB's mariadb.service under the mysql preset
# (start, limits, a restart under the daemon, release: ~100 s under TCG, most of it MariaDB's own
# start and stop). A guest that does not
# boot or finish fails (exit 125).
# 15 daemon-reloads rather than the issue's 100 (2-4.5 s each under TCG): the step's budget is
# 6 min (measured with a warm layer cache: 15 reloads 2.5 min, 30 reloads 5.7 min under heavier
# load; a cold cache adds ~3 min once: debootstrap and the packages layer).
# Given the package, the same boot first runs scenario 6 (tests/sdguest/guest/package.sh): the
# .deb installed with dpkg, `systemctl enable --now dbcage` with the hardened unit as shipped
# (no EPERM, both tenants limited in the kernel and on their units), stop, start, and an upgrade
# (dpkg -i while it runs restarts it); the scenarios after it use the package's binary. Measured
# warm: the step 3.3 min, scenario 6's part of it 52 s.
SDGUEST_RELOADS=15 tests/sdguest/systemd.sh "$DBCAGE_DEB"
# The same on a cgroup v1 systemd host (systemd.unified_cgroup_hierarchy=0, RHEL 7/8 style:
# systemd also manages the cpu, memory and blkio hierarchies), scenario 6 included: the package's
# unit started with `systemctl enable --now dbcage`, stopped, started, upgraded, its limits on the
# units and in their v1 groups; the pinned tenant's cpus are reported as not applied (systemd has
# no cpuset on v1) by check, plan, the journal and status, and the daemon starts regardless. Then
# scenarios 1-5 with the package's binary: restart sampled, adoption, kill -9, reloads and drift.
# Measured warm on the 2-core host: the step 8.1 min (with the MariaDB section), scenario 6's
# part of it 2.0 min (the same step with the bare binary, without scenario 6: 6.3 min).
SDGUEST_CGROUP=v1 SDGUEST_RELOADS=15 tests/sdguest/systemd.sh "$DBCAGE_DEB"
