#!/usr/bin/env bash
# Boot a real Debian kernel under qemu (TCG, no KVM) with an initramfs holding
# busybox, BINARY (as /bin/dbcage) and GUEST_SCRIPT (as /test.sh), run the
# script against cgroup v2 and exit with the script's exit code.
#
# usage: tests/vm/run.sh BINARY GUEST_SCRIPT [EXTRA_FILE...]
#
# Environment (all optional):
#   DBCAGE_VM_CACHE         cache dir (kernel, base initramfs)  (default /var/cache/dbcage-vm)
#   DBCAGE_VM_TIMEOUT       hard timeout in seconds             (default 300)
#   DBCAGE_VM_BOOT_TIMEOUT  seconds for the kernel to reach /init (default 60; it takes 3-6 s):
#                           past it the boot is stopped and made once more, verbose, and the
#                           run says so (an emulated boot hung once in ~50 CI runs, silent
#                           after the firmware's "Booting from ROM..")
#   DBCAGE_VM_FIRST_BOOT_OPTS  qemu options for the first boot only (to test that retry:
#                           "-S" starts the guest's CPUs stopped, a boot that never gets anywhere)
#                           A run whose guest kernel reports a soft lockup ("watchdog: BUG: soft
#                           lockup", printed after 20+ s with a CPU stuck in the kernel) is stopped
#                           there and made once more the same way, with a warning and the lines
#                           the kernel printed (seen once in ~60 CI runs: both vCPUs stuck under
#                           TCG from 2 s after boot until the 300-s timeout); a second one fails.
#   DBCAGE_VM_KERNEL_PKG    kernel package to use   (default: what linux-image-amd64 depends on)
#   DBCAGE_VM_KERNEL_DIR    boot a kernel built elsewhere instead of a package: a directory with
#                           boot/vmlinuz-KVER, lib/modules/KVER, .complete and optionally vmlinux
#                           (tests/vm/build-kernel.sh makes one with blk-iolatency)
#   DBCAGE_VM_DISKS         number of virtio disks              (default 3, minimum 3)
#   DBCAGE_VM_DISK_SIZE     size of each sparse disk            (default 256M)
#   DBCAGE_VM_NUMA_NODES    NUMA nodes, one vCPU each            (default 2, 1 to 8)
#   DBCAGE_VM_NODE_MEM_MB   memory per NUMA node in MiB         (default 512)
#   DBCAGE_VM_MODULES       extra kernel modules to load in the guest, space separated (e.g. "bfq")
#   DBCAGE_VM_APPEND        extra kernel command line arguments
#   DBCAGE_VM_QEMU_OPTS     extra qemu options (word-split)
#   DBCAGE_VM_PVH=0         boot the compressed vmlinuz instead of the extracted vmlinux (slower)
#   DBCAGE_VM_NO_FIO=1      leave fio (about 85 MB with its libraries) out of the initramfs
#   DBCAGE_VM_KEEP=1        keep the temp dir (initramfs, disks, console log) and print its path
#
# Exit code: the guest script's exit code (from the DBCAGE-VM-EXIT=<n> marker);
# 124 on timeout (or when both boots hung before /init, or both soft-locked); 125 if the marker
# is missing
# (kernel panic, /init died, ...);
# 2 on usage errors; other non-zero values on host-side setup failures.
set -euo pipefail

log() { printf '[dbcage-vm] %s\n' "$*" >&2; }
die() { log "error: $*"; exit "${2:-1}"; }

if [ $# -lt 2 ]; then
    echo "usage: $0 BINARY GUEST_SCRIPT [EXTRA_FILE...]" >&2
    exit 2
fi
BINARY=$1
GUEST_SCRIPT=$2
shift 2
EXTRAS=("$@")
[ -f "$BINARY" ] || die "binary not found: $BINARY" 2
[ -f "$GUEST_SCRIPT" ] || die "guest script not found: $GUEST_SCRIPT" 2
for f in "${EXTRAS[@]}"; do [ -e "$f" ] || die "extra file not found: $f" 2; done

SELF=$(readlink -f "${BASH_SOURCE[0]}")
CACHE=${DBCAGE_VM_CACHE:-/var/cache/dbcage-vm}
TIMEOUT=${DBCAGE_VM_TIMEOUT:-300}
BOOT_TIMEOUT=${DBCAGE_VM_BOOT_TIMEOUT:-60}
NDISKS=${DBCAGE_VM_DISKS:-3}
DISK_SIZE=${DBCAGE_VM_DISK_SIZE:-256M}
NO_FIO=${DBCAGE_VM_NO_FIO:-0}
# Modules loaded in the guest, in this order (dependencies are added first).
MODULES="virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk
         loop dm_mod dm_multipath dm_round_robin ${DBCAGE_VM_MODULES:-}"
[ "$BOOT_TIMEOUT" -ge 1 ] 2>/dev/null || die "DBCAGE_VM_BOOT_TIMEOUT must be a number of seconds >= 1" 2
[ "$NDISKS" -ge 3 ] 2>/dev/null || die "DBCAGE_VM_DISKS must be a number >= 3" 2
NNODES=${DBCAGE_VM_NUMA_NODES:-2}
NODE_MEM=${DBCAGE_VM_NODE_MEM_MB:-512}
{ [ "$NNODES" -ge 1 ] && [ "$NNODES" -le 8 ]; } 2>/dev/null || die "DBCAGE_VM_NUMA_NODES must be a number from 1 to 8" 2
[ "$NODE_MEM" -ge 128 ] 2>/dev/null || die "DBCAGE_VM_NODE_MEM_MB must be a number >= 128" 2

T_START=$(date +%s%N)
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

export DEBIAN_FRONTEND=noninteractive
SUDO=
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo -E"; fi

APT_UPDATED=0
apt_update_once() {
    if [ "$APT_UPDATED" = 0 ]; then
        log "apt-get update"
        $SUDO apt-get update -qq >&2 || log "warning: apt-get update failed"
        APT_UPDATED=1
    fi
}

# ---------------------------------------------------------------- packages
is_static_busybox() { [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; }
ensure_packages() {
    local need=()
    command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
    is_static_busybox || need+=(busybox-static)
    command -v cpio >/dev/null 2>&1 || need+=(cpio)
    command -v xz >/dev/null 2>&1 || need+=(xz-utils)
    command -v zstd >/dev/null 2>&1 || need+=(zstd)
    command -v flock >/dev/null 2>&1 || need+=(util-linux)
    command -v dmsetup >/dev/null 2>&1 || need+=(dmsetup)
    if [ "$NO_FIO" != 1 ]; then command -v fio >/dev/null 2>&1 || need+=(fio); fi
    if [ ${#need[@]} -gt 0 ]; then
        apt_update_once
        log "installing: ${need[*]}"
        # No recommends: qemu-system-x86 would otherwise pull the whole GUI stack.
        $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 \
            || die "apt-get install ${need[*]} failed"
    fi
    is_static_busybox || die "/bin/busybox is not a static busybox (install busybox-static)"
}

# ---------------------------------------------------------------- kernel
# $CACHE/kernel: the extracted linux-image package (boot/, lib/modules/), a
# .complete stamp holding the package name, and vmlinux (uncompressed kernel).
kernel_pkg_name() {
    apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image/{print $2; exit}' || true
}
ensure_kernel() {
    local want=${DBCAGE_VM_KERNEL_PKG:-} dl
    if [ -f "$CACHE/kernel/.complete" ]; then
        if [ -z "$want" ] || [ "$(cat "$CACHE/kernel/.complete")" = "$want" ]; then return 0; fi
    fi
    if [ -z "$want" ]; then
        want=$(kernel_pkg_name)
        if [ -z "$want" ]; then apt_update_once; want=$(kernel_pkg_name); fi
        [ -n "$want" ] || die "cannot determine the kernel package (apt-cache depends linux-image-amd64)"
    fi
    log "downloading kernel package $want into $CACHE"
    dl=$(mktemp -d "$CACHE/download.XXXXXX")
    chmod 755 "$dl"   # apt's _apt user must be able to write there
    if ! ( cd "$dl" && apt-get download "$want" >&2 ); then
        apt_update_once
        ( cd "$dl" && apt-get download "$want" >&2 ) || { rm -rf "$dl"; die "apt-get download $want failed"; }
    fi
    mkdir "$dl/x"
    dpkg -x "$dl"/*.deb "$dl/x" || { rm -rf "$dl"; die "dpkg -x failed"; }
    echo "$want" >"$dl/x/.complete"
    rm -rf "$CACHE/kernel"
    mv "$dl/x" "$CACHE/kernel"
    rm -rf "$dl"
}
# qemu boots the uncompressed vmlinux directly (PVH entry), which skips the
# in-guest decompression of the xz bzImage: that takes ~3 s under TCG.
ensure_vmlinux() {
    local z out=$CACHE/kernel/vmlinux off magic
    [ -s "$out" ] && return 0
    z=$(ls "$CACHE"/kernel/boot/vmlinuz-* 2>/dev/null | head -n1)
    [ -n "$z" ] || return 0
    for magic in xz zstd gzip; do
        case $magic in
            xz)   off=$(LC_ALL=C grep -abo $'\xfd7zXZ' "$z" | head -n1 | cut -d: -f1) ;;
            zstd) off=$(LC_ALL=C grep -abo $'\x28\xb5\x2f\xfd' "$z" | head -n1 | cut -d: -f1) ;;
            gzip) off=$(LC_ALL=C grep -abo $'\x1f\x8b\x08' "$z" | head -n1 | cut -d: -f1) ;;
        esac
        [ -n "$off" ] || continue
        case $magic in
            xz)   tail -c +$((off + 1)) "$z" | xz -dc --single-stream ;;
            zstd) tail -c +$((off + 1)) "$z" | zstd -qdc ;;
            gzip) tail -c +$((off + 1)) "$z" | gzip -dc ;;
        esac >"$out.tmp" 2>/dev/null || true
        if [ "$(head -c 4 "$out.tmp" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ]; then
            mv "$out.tmp" "$out"
            return 0
        fi
    done
    rm -f "$out.tmp"
    log "note: could not extract vmlinux from $z, booting the compressed kernel"
}

# ---------------------------------------------------------------- initramfs
# The initramfs is two concatenated cpio archives (the kernel unpacks both):
# a base (busybox, GNU tools, fio, dmsetup, modules, /init, /etc) cached in
# $CACHE, rebuilt when this script, the installed packages or the kernel
# change; and a per-run overlay (/bin/dbcage, /test.sh, /extra).
declare -A COPIED=()
copy_libs() { # copy_libs ROOT ELF: the ELF's shared libraries, at the same paths
    local root=$1 out lib
    out=$(ldd "$2" 2>/dev/null) || return 0   # static, or not an ELF
    while read -r lib; do
        [ -n "$lib" ] && [ -e "$lib" ] || continue
        [ -n "${COPIED[$root$lib]:-}" ] && continue
        COPIED[$root$lib]=1
        mkdir -p "$root${lib%/*}"
        cp -L "$lib" "$root$lib"
    done < <(printf '%s\n' "$out" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
}
install_bin() { # install_bin ROOT SRC DEST
    mkdir -p "$1${3%/*}"
    rm -f "$1$3"
    cp -L "$2" "$1$3"
    chmod 755 "$1$3"
    copy_libs "$1" "$2"
}
mod_cat() {
    case "$1" in
        *.ko.xz)  xz -dc "$1" ;;
        *.ko.zst) zstd -qdc "$1" ;;
        *.ko.gz)  gzip -dc "$1" ;;
        *)        cat "$1" ;;
    esac
}
make_cpio() { ( cd "$1" && find . -print0 | cpio --null -o -H newc --quiet -R 0:0 ); }

build_base() { # build_base OUT.cpio
    local root t src d m f
    root=$(mktemp -d "$CACHE/base-build.XXXXXX")
    BASE_ROOT=$root
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,lib,lib64,lib/modules,etc,proc,sys,dev,tmp,run,root,extra,var/tmp}
    chmod 755 "$root"
    chmod 1777 "$root/tmp" "$root/var/tmp"

    # busybox with a symlink for each applet
    cp /bin/busybox "$root/bin/busybox"
    local applets
    applets=$(/bin/busybox --list-full)
    mkdir -p $(printf '%s\n' "$applets" | sed -n "s,/[^/]*\$,,p" | sort -u | sed "s,^,$root/,")
    while read -r t; do
        [ -n "$t" ] && { [ -e "$root/$t" ] || [ -L "$root/$t" ] || ln -s /bin/busybox "$root/$t"; }
    done <<<"$applets"

    # GNU tools in place of busybox applets: dd (iflag=direct, status=, rates),
    # date (+%s%N; busybox has no %N), sleep and yes (real binaries: a
    # symlink to them under another name, e.g. ora_p001_BX1, runs fine,
    # whereas busybox dispatches on argv[0] and says "applet not found").
    # Note: Debian's busybox sh is built with FEATURE_SH_STANDALONE, so in a
    # busybox sh script a bare "dd" still runs the applet: use /bin/dd.
    for t in dd date sleep yes; do
        src=$(command -v "$t" || true)
        if [ -n "$src" ] && ldd "$src" >/dev/null 2>&1; then
            install_bin "$root" "$src" "/bin/$t"
            for d in sbin usr/bin usr/sbin; do
                if [ -L "$root/$d/$t" ]; then ln -sf "/bin/$t" "$root/$d/$t"; fi
            done
        fi
    done
    src=$(command -v dmsetup || true)
    [ -n "$src" ] && install_bin "$root" "$src" /sbin/dmsetup
    if [ "$NO_FIO" != 1 ] && command -v fio >/dev/null 2>&1; then
        install_bin "$root" "$(command -v fio)" /usr/bin/fio
    fi

    cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
    cat >"$root/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
    printf 'passwd: files\ngroup: files\n' >"$root/etc/nsswitch.conf"
    echo dbcage-vm >"$root/etc/hostname"
    mknod -m 600 "$root/dev/console" c 5 1 2>/dev/null || true
    mknod -m 666 "$root/dev/null" c 1 3 2>/dev/null || true

    # Kernel modules, dependencies first (from the .ko's "depends=" modinfo
    # field), built-ins skipped, .ko.xz/.ko.zst decompressed (busybox insmod
    # can't read them).
    local -A modfile=() seen=()
    local order=() builtin
    while read -r f; do
        m=${f##*/}; m=${m%%.ko*}; m=${m//-/_}
        modfile[$m]=$f
    done < <(find "$MODDIR/kernel" -name '*.ko*')
    builtin=$(sed 's,.*/,,; s,\.ko$,,; s,-,_,g' "$MODDIR/modules.builtin" 2>/dev/null || true)
    add_module() {
        local m=${1//-/_} f dep
        [ -n "${seen[$m]:-}" ] && return 0
        seen[$m]=1
        if printf '%s\n' "$builtin" | grep -qx "$m"; then log "module $m is built in"; return 0; fi
        f=${modfile[$m]:-}
        [ -n "$f" ] || die "kernel module $m not found in $MODDIR"
        for dep in $(mod_cat "$f" | grep -a -o 'depends=[A-Za-z0-9_,-]*' | head -n1 | cut -d= -f2 | tr ',' ' '); do
            add_module "$dep"
        done
        mod_cat "$f" >"$root/lib/modules/$m.ko"
        order+=("$m")
    }
    for m in $MODULES; do add_module "$m"; done
    printf '%s\n' "${order[@]}" >"$root/etc/modules.order"

    cat >"$root/init" <<'EOF'
#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=dumb
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
echo
echo "dbcage-vm: init started, kernel $(uname -r), uptime $(cut -d' ' -f1 /proc/uptime)s"
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=755 tmpfs /run
hostname -F /etc/hostname
if mount -t cgroup2 -o favordynmods none /sys/fs/cgroup 2>/dev/null; then
    echo "dbcage-vm: cgroup2 mounted with favordynmods"
elif mount -t cgroup2 none /sys/fs/cgroup; then
    echo "dbcage-vm: cgroup2 mounted without favordynmods (option rejected)"
else
    echo "dbcage-vm: ERROR: cannot mount cgroup2"
fi
while read -r m; do
    insmod "/lib/modules/$m.ko" || echo "dbcage-vm: insmod $m failed"
done </etc/modules.order
i=0
while [ ! -b /dev/vda ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
echo "dbcage-vm: ready, $(nproc) cpus, disks: $(cd /sys/block && echo vd*), uptime $(cut -d' ' -f1 /proc/uptime)s"
cd /
/bin/sh /test.sh
rc=$?
echo "DBCAGE-VM-EXIT=$rc"
sync
poweroff -f
sleep 5
EOF
    chmod 755 "$root/init"
    make_cpio "$root" >"$1.tmp.$$"
    mv "$1.tmp.$$" "$1"
    rm -rf "$root"
    BASE_ROOT=
}

# ---------------------------------------------------------------- cache setup
mkdir -p "$CACHE" 2>/dev/null || $SUDO mkdir -p "$CACHE"
[ -w "$CACHE" ] || die "cache dir $CACHE is not writable (set DBCAGE_VM_CACHE)"
BASE_ROOT=
trap 'rm -rf "$BASE_ROOT"' EXIT   # replaced by cleanup() below
(
    # One run at a time installs packages and fills the cache.
    flock 9
    ensure_packages
    if [ -z "${DBCAGE_VM_KERNEL_DIR:-}" ]; then
        ensure_kernel
        ensure_vmlinux
    fi
) 9>>"$CACHE/.lock" || exit $?

KDIR=${DBCAGE_VM_KERNEL_DIR:-$CACHE/kernel}
[ -f "$KDIR/.complete" ] || die "no kernel in $KDIR (no .complete stamp; tests/vm/build-kernel.sh builds one)"
VMLINUZ=$(ls "$KDIR"/boot/vmlinuz-* 2>/dev/null | head -n1)
[ -n "$VMLINUZ" ] || die "no vmlinuz in $KDIR/boot"
KVER=${VMLINUZ##*/vmlinuz-}
MODDIR=$KDIR/lib/modules/$KVER
[ -d "$MODDIR" ] || die "no modules dir $MODDIR"
KIMAGE=$VMLINUZ
if [ "${DBCAGE_VM_PVH:-1}" != 0 ] && [ -s "$KDIR/vmlinux" ]; then KIMAGE=$KDIR/vmlinux; fi
log "kernel $KVER ($(cat "$KDIR/.complete")), booting ${KIMAGE##*/}"

T_BUILD=$(date +%s%N)
KEY=$( { sha256sum "$SELF"; stat -c '%s %Y' /var/lib/dpkg/status /bin/busybox; cat "$KDIR/.complete";
         echo "$MODULES $NO_FIO"; } | sha256sum | cut -c1-16)
# One base per kernel directory, so that runs on two kernels do not rebuild each other's.
KTAG=$(printf '%s' "$KDIR" | sha256sum | cut -c1-8)
BASE=$CACHE/initramfs-base-$KTAG-$KEY.cpio
exec 9>>"$CACHE/.lock"
flock 9
if [ ! -s "$BASE" ]; then
    log "building base initramfs $BASE"
    rm -f "$CACHE"/initramfs-base-"$KTAG"-*.cpio "$CACHE"/initramfs-base-????????????????.cpio
    build_base "$BASE"
fi

# ---------------------------------------------------------------- per-run files
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dbcage-test-vm.XXXXXX")
QPID=
RPID=
cleanup() {
    # Stop qemu (via its timeout wrapper, which passes the signal on) and the
    # console reader and the boot watchdog if we leave early (signal or error).
    if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then
        kill -TERM "$QPID" 2>/dev/null || true
        wait "$QPID" 2>/dev/null || true
    fi
    if [ -n "$RPID" ] && kill -0 "$RPID" 2>/dev/null; then
        kill -TERM "$RPID" 2>/dev/null || true
        wait "$RPID" 2>/dev/null || true
    fi
    if [ -n "${WPID:-}" ]; then kill -TERM "$WPID" 2>/dev/null || true; fi
    if [ "${DBCAGE_VM_KEEP:-0}" = 1 ]; then log "keeping $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

OVL=$WORK/overlay
mkdir -p "$OVL/bin" "$OVL/extra"
install_bin "$OVL" "$BINARY" /bin/dbcage
cp "$GUEST_SCRIPT" "$OVL/test.sh"
chmod 755 "$OVL/test.sh"
for f in "${EXTRAS[@]}"; do
    cp -a "$f" "$OVL/extra/"
    if [ -f "$f" ] && [ -x "$f" ]; then copy_libs "$OVL" "$f"; fi
done
INITRD=$WORK/initramfs.cpio
{ cat "$BASE"; make_cpio "$OVL"; } >"$INITRD"
flock -u 9
exec 9>&-
log "initramfs $(( $(stat -c %s "$INITRD") / 1048576 )) MiB ready in $(ms_since "$T_BUILD") ms"

make_disks() {
    DRIVES=()
    local i
    for i in $(seq 0 $((NDISKS - 1))); do
        rm -f "$WORK/dbcage-test-disk$i.img"
        truncate -s "$DISK_SIZE" "$WORK/dbcage-test-disk$i.img"
        DRIVES+=(-drive "if=virtio,format=raw,file=$WORK/dbcage-test-disk$i.img")
    done
}

# ---------------------------------------------------------------- boot
# No -enable-kvm: KVM hangs on these machines; TCG boots in a few seconds.
# One vCPU per NUMA node (2 nodes with 512 MiB each unless DBCAGE_VM_NUMA_NODES and
# DBCAGE_VM_NODE_MEM_MB say otherwise).
NUMA=()
for i in $(seq 0 $((NNODES - 1))); do
    NUMA+=(-object "memory-backend-ram,id=m$i,size=${NODE_MEM}M" -numa "node,nodeid=$i,cpus=$i,memdev=m$i")
done

LOG=$WORK/console.log
FIFO=$WORK/console.fifo
WPID=
# boot ATTEMPT: one qemu run; sets QRC, BOOT_MS and RUN_MS. A boot that has not reached /init
# within BOOT_TIMEOUT is stopped by a watchdog, which leaves $WORK/boot_hung; one whose kernel
# reports a soft lockup is stopped by it too, and the reader leaves $WORK/soft_lockup.
boot() {
    local attempt=$1 quiet=quiet first_opts=
    # The retry shows the kernel's messages, so that a second hang says where it stopped.
    if [ "$attempt" -gt 1 ]; then quiet="ignore_loglevel"; else first_opts=${DBCAGE_VM_FIRST_BOOT_OPTS:-}; fi
    make_disks
    # shellcheck disable=SC2206
    QEMU=(qemu-system-x86_64 -nographic -no-reboot -nic none
          -smp "$NNODES" -m "$((NNODES * NODE_MEM))M"
          "${NUMA[@]}"
          ${DBCAGE_VM_QEMU_OPTS:-} $first_opts
          -kernel "$KIMAGE" -initrd "$INITRD"
          -append "console=ttyS0 panic=-1 $quiet no_timer_check ${DBCAGE_VM_APPEND:-}"
          "${DRIVES[@]}")
    rm -f "$FIFO" "$WORK/boot_ms" "$WORK/boot_hung" "$WORK/soft_lockup"
    mkfifo "$FIFO"
    : >"$LOG"
    log "booting qemu (timeout ${TIMEOUT}s, /init within ${BOOT_TIMEOUT}s; attempt $attempt)"
    T_BOOT=$(date +%s%N)
    # qemu and the console reader run in the background while we `wait`, so a
    # signal to this script is handled at once (bash defers traps while a
    # foreground pipeline runs) and the trap stops qemu. The reader drops CRs and
    # the terminal escapes the firmware prints (ESC c resets the terminal,
    # ESC[?7l turns off line wrapping), streams the console to stdout and $LOG,
    # and notes when /init starts.
    (
        sed -u -e 's/\r$//' -e 's/\x1bc//g' -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' <"$FIFO" | {
            booted=
            while IFS= read -r line; do
                printf '%s\n' "$line"
                printf '%s\n' "$line" >>"$LOG"
                if [ -z "$booted" ] && [[ $line == *"dbcage-vm: init started"* ]]; then
                    booted=1
                    ms_since "$T_BOOT" >"$WORK/boot_ms"
                fi
                if [[ $line == *"watchdog: BUG: soft lockup"* ]] && [ ! -e "$WORK/soft_lockup" ]; then
                    printf '%s\n' "$line" >"$WORK/soft_lockup"
                fi
            done
        }
    ) &
    RPID=$!
    timeout --kill-after=10 "$TIMEOUT" "${QEMU[@]}" </dev/null >"$FIFO" 2>&1 &
    QPID=$!
    # The watchdog: polls for the reader's marks, and stops qemu (through its timeout wrapper)
    # if /init has not started in time, or once the guest's kernel reported a soft lockup.
    (
        deadline=$(( $(date +%s) + BOOT_TIMEOUT ))
        while kill -0 "$QPID" 2>/dev/null; do
            if [ ! -e "$WORK/boot_ms" ] && [ "$(date +%s)" -ge "$deadline" ]; then
                : >"$WORK/boot_hung"
                kill -TERM "$QPID" 2>/dev/null || true
                exit 0
            fi
            if [ -e "$WORK/soft_lockup" ]; then
                kill -TERM "$QPID" 2>/dev/null || true
                exit 0
            fi
            sleep 0.2
        done
    ) &
    WPID=$!
    set +e
    wait "$QPID"
    QRC=$?
    wait "$RPID"
    kill "$WPID" 2>/dev/null
    wait "$WPID" 2>/dev/null
    set -e
    QPID=
    RPID=
    WPID=
    RUN_MS=$(ms_since "$T_BOOT")
    BOOT_MS=$(cat "$WORK/boot_ms" 2>/dev/null || echo "?")
    log "qemu exit $QRC; qemu start to /init ${BOOT_MS} ms; qemu total ${RUN_MS} ms; whole run $(ms_since "$T_START") ms"
}

boot 1
# One retry, verbose, for a guest that hung: before /init, or in a soft lockup after it.
hung=
if [ -e "$WORK/boot_hung" ]; then
    hung="the guest did not reach /init within ${BOOT_TIMEOUT}s (it takes 3-6 s here)"
elif [ -e "$WORK/soft_lockup" ]; then
    hung="the guest's kernel reported a soft lockup: $(cat "$WORK/soft_lockup")"
fi
if [ -n "$hung" ]; then
    log "warning: $hung; its console ended with:"
    tail -n 12 "$LOG" | sed 's/^/[dbcage-vm]   | /' >&2
    log "warning: booting once more, with the kernel's messages (a second hang fails the run)"
    boot 2
    if [ -e "$WORK/boot_hung" ] || [ -e "$WORK/soft_lockup" ]; then
        log "error: the guest hung again (no /init within ${BOOT_TIMEOUT}s, or a soft lockup)"
        exit 124
    fi
fi

MARK=$(grep -a -o 'DBCAGE-VM-EXIT=[0-9]*' "$LOG" 2>/dev/null | tail -n1 | cut -d= -f2 || true)
if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
    log "error: timed out after ${TIMEOUT}s"
    exit 124
fi
if [ -z "$MARK" ]; then
    log "error: no DBCAGE-VM-EXIT marker in the guest output (kernel panic or /init died?)"
    exit 125
fi
log "guest script exit code $MARK"
exit "$MARK"
