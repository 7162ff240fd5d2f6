#!/usr/bin/env bash
# Run a test script inside a real systemd host: Debian 12 with systemd 252 as PID 1, booted
# under qemu/TCG (no KVM) by make_and_boot.sh (next to this file), with extra Debian packages
# (PostgreSQL 15 by default), dbcage (a binary or the .deb) and the given files installed.
# The guest's results directory and its journal come back to the host.
#
# usage: tests/sdguest/run.sh GUEST_SCRIPT [FILE...]
#
# In the guest, GUEST_SCRIPT runs as root from a oneshot unit (output on the console, also in
# $SDGUEST_OUT/test.log) with:
#   SDGUEST_FILES   directory holding the FILEs (copied with their modes)
#   SDGUEST_OUT     directory whose contents come back to the host
#   SDGUEST_DATA    the extra data disks, space separated (/dev/vdc /dev/vdd ...)
# and its exit code becomes this script's exit code.
#
# Environment (all optional):
#   SDGUEST_WORK        cache + run dir (default /var/tmp/dbcage-test-sdguest; must contain
#                       "dbcage-test"); layers are rebuilt when their inputs change
#   SDGUEST_PACKAGES    Debian packages added to the guest root (default "postgresql-15
#                       mariadb-server procps libelf1 zlib1g": dbcage links libelf and zlib;
#                       mariadb.service is left disabled, the tests that use it start it)
#   SDGUEST_BINARY      a dbcage binary installed as /usr/sbin/dbcage
#   SDGUEST_DEB         a .deb installed with dpkg -i (e.g. from scripts/build-deb.sh)
#   SDGUEST_CGROUP      v2 (default) or v1 (systemd.unified_cgroup_hierarchy=0)
#   SDGUEST_DATA_DISKS  number of empty data disks (default 2, 256M each)
#   SDGUEST_MEM SDGUEST_SMP SDGUEST_NUMA   guest memory (MiB, default 1024), vCPUs (2), NUMA=1
#   SDGUEST_TIMEOUT     kill qemu after this many seconds (default 600)
#   SDGUEST_RESULTS     host dir for the results (default $SDGUEST_WORK/results/<time>)
#
# Exit code: the guest script's; 125 when the guest did not print "SDGUEST: END" (it died,
# hung or the wrapper failed); 2 on usage errors; other non-zero values on host-side failures.
set -euo pipefail

log() { printf '[sdguest %(%T)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit "${2:-1}"; }

[ $# -ge 1 ] || { sed -n '2,/^set -euo/{/^#/p}' "$0" >&2; exit 2; }
SCRIPT=$1
shift
FILES=("$@")
[ -f "$SCRIPT" ] || die "guest script not found: $SCRIPT" 2
for f in "${FILES[@]}"; do [ -e "$f" ] || die "file not found: $f" 2; done

HERE=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
MAB=$HERE/make_and_boot.sh
WORK=${SDGUEST_WORK:-/var/tmp/dbcage-test-sdguest}
case $WORK in *dbcage-test*) ;; *) die "SDGUEST_WORK must contain 'dbcage-test': $WORK" 2 ;; esac
PACKAGES=${SDGUEST_PACKAGES-postgresql-15 mariadb-server procps libelf1 zlib1g}
BINARY=${SDGUEST_BINARY:-}
DEB=${SDGUEST_DEB:-}
CGROUP=${SDGUEST_CGROUP:-v2}
case $CGROUP in v2) UNIFIED=1 ;; v1) UNIFIED=0 ;; *) die "SDGUEST_CGROUP must be v1 or v2" 2 ;; esac
NDATA=${SDGUEST_DATA_DISKS:-2}
[ -z "$BINARY" ] || [ -x "$BINARY" ] || die "SDGUEST_BINARY is not an executable: $BINARY" 2
[ -z "$DEB" ] || [ -f "$DEB" ] || die "SDGUEST_DEB not found: $DEB" 2
mkdir -p "$WORK"
WORK=$(readlink -f "$WORK")
RESULTS=${SDGUEST_RESULTS:-$WORK/results/$(date +%Y%m%d-%H%M%S)}

# Stage timings, printed at the end (and on failure).
declare -a TIMES=()
T0=${EPOCHREALTIME/./}
stage_start() { STAGE=$1; TS=${EPOCHREALTIME/./}; log "$STAGE ..."; }
stage_end() {
	local ms=$(( (${EPOCHREALTIME/./} - TS) / 1000 ))
	TIMES+=("$(printf '%-10s %7d ms %s' "$STAGE" "$ms" "${1:-}")")
}
print_times() {
	log "stage times (total $(( (${EPOCHREALTIME/./} - T0) / 1000 )) ms):"
	local t
	for t in "${TIMES[@]}"; do printf '    %s\n' "$t" >&2; done
}

# Mounts made for chroot package installs; undone on any exit.
MOUNTED=()
cleanup() {
	local m
	for m in "${MOUNTED[@]}"; do umount -l "$m" 2>/dev/null || true; done
	print_times
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# One harness run at a time per work dir (layers are shared).
exec 8>>"$WORK/.lock"
flock 8

key_of() { sha256sum | cut -c1-16; }

# ---------------------------------------------------------------- base: debootstrap + kernel
stage_start base
BASE_KEY=$(sha256sum "$MAB" | key_of)
if [ "$(cat "$WORK/base/.key" 2>/dev/null)" != "$BASE_KEY" ]; then
	rm -rf "$WORK/base"
	mkdir -p "$WORK/base"
	WORK=$WORK/base "$MAB" rootfs kernel >&2
	echo "$BASE_KEY" >"$WORK/base/.key"
	stage_end "built"
else
	stage_end "cached"
fi

# ---------------------------------------------------------------- packages layer
stage_start packages
PKG_KEY=$( { echo "$BASE_KEY"; echo "$PACKAGES"; sed -n '/^install_packages()/,/^}/p' "$0"; } | key_of)
install_packages() { # install_packages ROOT PKG...
	local r=$1
	shift
	# Nothing may start inside the chroot (postinst scripts would start postgres).
	printf '#!/bin/sh\nexit 101\n' >"$r/usr/sbin/policy-rc.d"
	chmod 755 "$r/usr/sbin/policy-rc.d"
	mount -t proc proc "$r/proc" && MOUNTED+=("$r/proc")
	cp /etc/resolv.conf "$r/etc/resolv.conf" 2>/dev/null || true
	chroot "$r" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
	chroot "$r" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2
	chroot "$r" apt-get clean
	# MariaDB would start at every boot (~10 s and 100+ MiB under TCG): the tests that govern it
	# start it themselves.
	if [ -e "$r/lib/systemd/system/mariadb.service" ]; then chroot "$r" systemctl disable -q mariadb.service; fi
	umount "$r/proc" && MOUNTED=()
	rm -f "$r/usr/sbin/policy-rc.d"
}
# One layer per package list (pkgs-KEY), so that scripts with different lists (postgres for the
# systemd tests, python3 and gcc for tests/it) do not rebuild each other's; the least recently
# used beyond three are removed.
PKGS=$WORK/pkgs-$PKG_KEY
if [ "$(cat "$PKGS/.key" 2>/dev/null)" != "$PKG_KEY" ]; then
	rm -rf "$PKGS" "$PKGS.new"
	mkdir -p "$PKGS.new"
	cp -a "$WORK/base/root" "$PKGS.new/root"
	# shellcheck disable=SC2086
	[ -z "$PACKAGES" ] || install_packages "$PKGS.new/root" $PACKAGES
	echo "$PKG_KEY" >"$PKGS.new/.key"
	mv "$PKGS.new" "$PKGS"
	stage_end "built: ${PACKAGES:-none} ($(du -sh "$PKGS/root" | cut -f1))"
else
	stage_end "cached: ${PACKAGES:-none}"
fi
touch "$PKGS/.key"
# shellcheck disable=SC2012
ls -t "$WORK"/pkgs-*/.key 2>/dev/null | tail -n +4 | xargs -r -n1 dirname | xargs -r rm -rf

# ---------------------------------------------------------------- per-run root
stage_start root
RUN=$WORK/run
rm -rf "$RUN"
mkdir -p "$RUN"
# Hard links: a copy of the 600-800 MB tree in metadata only. Every directory a run writes into
# (configure's files in /etc and /root, dpkg's state and logs) is copied for real, so that no
# write reaches the cached layer through a shared inode.
cp -al "$PKGS/root" "$RUN/root"
for d in etc root var/lib/dpkg var/log usr/sbin; do
	rm -rf "${RUN:?}/root/$d"
	cp -a "$PKGS/root/$d" "$RUN/root/$d"
done
# The kernel, its modules and the initrd are shared with the base layer.
for k in vmlinux initrd.img kroot; do [ -e "$WORK/base/$k" ] && ln -s "$WORK/base/$k" "$RUN/$k"; done
R=$RUN/root
G=$R/root/sdguest
mkdir -p "$G/files" "$G/out"
install -m755 "$SCRIPT" "$G/test"
for f in "${FILES[@]}"; do cp -a "$f" "$G/files/"; done
# Debug info stripped: a debug build is ~10x larger and would slow the image stage.
if [ -n "$BINARY" ]; then install -m755 "$BINARY" "$R/usr/sbin/dbcage" && strip --strip-debug "$R/usr/sbin/dbcage"; fi
if [ -n "$DEB" ]; then
	cp "$DEB" "$R/tmp/dbcage.deb"
	printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d"
	chmod 755 "$R/usr/sbin/policy-rc.d"
	chroot "$R" env DEBIAN_FRONTEND=noninteractive dpkg -i /tmp/dbcage.deb >&2 ||
		die "dpkg -i $DEB failed in the guest root"
	rm -f "$R/usr/sbin/policy-rc.d" "$R/tmp/dbcage.deb"
fi
data=""
for ((i = 0; i < NDATA; i++)); do data+="${data:+ }/dev/vd$(printf "\\x$(printf %x $((99 + i)))")"; done
# The wrapper the guest's test unit runs: it must always reach "SDGUEST: END" and power off.
cat >"$RUN/wrapper.sh" <<EOF
#!/bin/bash
export SDGUEST_FILES=/root/sdguest/files SDGUEST_OUT=/root/sdguest/out SDGUEST_DATA="$data"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
echo "SDGUEST: BEGIN uptime=\$(cut -d' ' -f1 /proc/uptime) cgroup=\$(stat -fc %T /sys/fs/cgroup)"
cd /root/sdguest
/root/sdguest/test 2>&1 | tee "\$SDGUEST_OUT/test.log"
rc=\${PIPESTATUS[0]}
echo "SDGUEST: RC=\$rc uptime=\$(cut -d' ' -f1 /proc/uptime)"
journalctl -b --no-pager -o short-monotonic >"\$SDGUEST_OUT/journal.txt" 2>&1
systemctl list-units --failed --no-legend --plain >"\$SDGUEST_OUT/failed-units.txt" 2>&1
echo "\$rc" >"\$SDGUEST_OUT/rc"
# Results go back as a tar written raw to the results disk (the root disk's writes are discarded).
if tar -C "\$SDGUEST_OUT" -cf /dev/vdb . && sync; then echo "SDGUEST: END rc=\$rc"
else echo "SDGUEST: RESULTS-WRITE-FAILED"; fi
EOF
chmod 755 "$RUN/wrapper.sh"
stage_end "$(du -sh "$R" | cut -f1)"

# ---------------------------------------------------------------- configure + image + boot
stage_start image
export WORK=$RUN TEST_SCRIPT=$RUN/wrapper.sh UNIFIED DISK2=1 DATA_DISKS=$NDATA
export MEM=${SDGUEST_MEM:-1024} SMP=${SDGUEST_SMP:-2} NUMA=${SDGUEST_NUMA:-0}
export BOOT_TIMEOUT=${SDGUEST_TIMEOUT:-600}
"$MAB" configure image >&2
stage_end "$(du -h "$RUN/disk.img" | cut -f1) allocated"

stage_start boot
rm -f "$RUN/disk2.img"
truncate -s 256M "$RUN/disk2.img"
brc=0
"$MAB" boot >&2 || brc=$?
CONSOLE=$(ls -t "$RUN"/boot-*.log | head -n1)
stage_end "console $CONSOLE"

stage_start results
mkdir -p "$RESULTS"
cp "$CONSOLE" "$RESULTS/console.log"
if ! grep -q 'SDGUEST: END' "$CONSOLE"; then
	tail -n 40 "$CONSOLE" >&2
	die "the guest did not print 'SDGUEST: END' (boot rc=$brc); console: $RESULTS/console.log" 125
fi
tar -C "$RESULTS" -xf "$RUN/disk2.img" || die "cannot read the results tar from $RUN/disk2.img" 125
rc=$(cat "$RESULTS/rc")
stage_end "$RESULTS"
log "guest script exit code $rc; results in $RESULTS (test.log, journal.txt, console.log)"
exit "$rc"
