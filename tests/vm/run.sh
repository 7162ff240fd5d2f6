#!/usr/bin/env bash
# Boot a real Debian kernel under qemu (TCG, no KVM) with an initramfs holding
# busybox, BINARY (as /bin/dbcage) and GUEST_SCRIPT (as /test.sh), run the
# script against cgroup v2 and exit with the script's exit code.
#
# usage: tests/vm/run.sh BINARY GUEST_SCRIPT [EXTRA_FILE...]
#
# Environment (all optional):
#   DBCAGE_VM_CACHE         kernel cache dir            (default /var/cache/dbcage-vm)
#   DBCAGE_VM_TIMEOUT       hard timeout in seconds     (default 300)
#   DBCAGE_VM_KERNEL_PKG    kernel package to use       (default: what linux-image-amd64 depends on)
#   DBCAGE_VM_DISKS         number of virtio disks      (default 3, minimum 3)
#   DBCAGE_VM_DISK_SIZE     size of each sparse disk    (default 256M)
#   DBCAGE_VM_MODULES       extra kernel modules to load in the guest, space separated (e.g. "bfq")
#   DBCAGE_VM_APPEND        extra kernel command line arguments
#   DBCAGE_VM_NO_FIO=1      do not put fio (about 85 MB with its libraries) into the initramfs
#   DBCAGE_VM_KEEP=1        keep the temp dir (initramfs, disks, log) and print its path
#
# Exit code: the guest script's exit code (from the DBCAGE-VM-EXIT=<n> marker);
# 124 on timeout; 125 if the marker is missing (kernel panic, /init died, ...);
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

CACHE=${DBCAGE_VM_CACHE:-/var/cache/dbcage-vm}
TIMEOUT=${DBCAGE_VM_TIMEOUT:-300}
NDISKS=${DBCAGE_VM_DISKS:-3}
DISK_SIZE=${DBCAGE_VM_DISK_SIZE:-256M}
[ "$NDISKS" -ge 3 ] 2>/dev/null || die "DBCAGE_VM_DISKS must be a number >= 3" 2

T_START=$(date +%s%N)
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

SUDO=
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 && SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive

APT_UPDATED=0
apt_update_once() {
    if [ "$APT_UPDATED" = 0 ]; then
        log "apt-get update"
        $SUDO apt-get update -qq >&2 || log "warning: apt-get update failed"
        APT_UPDATED=1
    fi
}

# ---------------------------------------------------------------- packages
is_static_busybox() {
    [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1
}
ensure_packages() {
    local need=()
    command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
    is_static_busybox || need+=(busybox-static)
    command -v cpio >/dev/null 2>&1 || need+=(cpio)
    command -v xz >/dev/null 2>&1 || need+=(xz-utils)
    command -v zstd >/dev/null 2>&1 || need+=(zstd)
    command -v timeout >/dev/null 2>&1 || need+=(coreutils)
    command -v flock >/dev/null 2>&1 || need+=(util-linux)
    command -v dmsetup >/dev/null 2>&1 || need+=(dmsetup)
    if [ "${DBCAGE_VM_NO_FIO:-0}" != 1 ]; then
        command -v fio >/dev/null 2>&1 || need+=(fio)
    fi
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
# $CACHE/kernel holds the extracted linux-image package (boot/ and lib/modules/)
# and a .complete stamp containing the package name.
ensure_kernel() {
    $SUDO mkdir -p "$CACHE"
    local want=${DBCAGE_VM_KERNEL_PKG:-}
    if [ -f "$CACHE/kernel/.complete" ]; then
        if [ -z "$want" ] || [ "$(cat "$CACHE/kernel/.complete")" = "$want" ]; then
            return 0
        fi
    fi
    if [ -z "$want" ]; then
        want=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image/{print $2; exit}' || true)
        if [ -z "$want" ]; then
            apt_update_once
            want=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image/{print $2; exit}' || true)
        fi
        [ -n "$want" ] || die "cannot determine the kernel package (apt-cache depends linux-image-amd64)"
    fi
    log "downloading kernel package $want into $CACHE"
    local dl
    dl=$($SUDO mktemp -d "$CACHE/download.XXXXXX")
    $SUDO chmod 755 "$dl"
    ( cd "$dl" && $SUDO apt-get download "$want" >&2 2>/dev/null ) || {
        apt_update_once
        ( cd "$dl" && $SUDO apt-get download "$want" >&2 )
    } || { $SUDO rm -rf "$dl"; die "apt-get download $want failed"; }
    $SUDO mkdir "$dl/x"
    $SUDO dpkg -x "$dl"/*.deb "$dl/x" || { $SUDO rm -rf "$dl"; die "dpkg -x failed"; }
    echo "$want" | $SUDO tee "$dl/x/.complete" >/dev/null
    $SUDO rm -rf "$CACHE/kernel"
    $SUDO mv "$dl/x" "$CACHE/kernel"
    $SUDO rm -rf "$dl"
}

mkdir -p "$CACHE" 2>/dev/null || $SUDO mkdir -p "$CACHE"
(
    # Serialize concurrent runs while installing / populating the cache.
    flock 9
    ensure_packages
    ensure_kernel
) 9>>"$CACHE/.lock" || exit $?

KDIR=$CACHE/kernel
VMLINUZ=$(ls "$KDIR"/boot/vmlinuz-* 2>/dev/null | head -n1)
[ -n "$VMLINUZ" ] || die "no vmlinuz in $KDIR/boot"
KVER=${VMLINUZ##*/vmlinuz-}
MODDIR=$KDIR/lib/modules/$KVER
[ -d "$MODDIR" ] || die "no modules dir $MODDIR"
log "kernel $KVER ($(cat "$KDIR/.complete"))"

# ---------------------------------------------------------------- temp dir
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dbcage-test-vm.XXXXXX")
QPID=
RPID=
cleanup() {
    # Stop qemu (via its timeout wrapper, which forwards the signal) and the
    # output reader if we are leaving early (signal or error).
    if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then
        kill -TERM "$QPID" 2>/dev/null || true
        wait "$QPID" 2>/dev/null || true
    fi
    if [ -n "$RPID" ] && kill -0 "$RPID" 2>/dev/null; then
        kill -TERM "$RPID" 2>/dev/null || true
        wait "$RPID" 2>/dev/null || true
    fi
    if [ "${DBCAGE_VM_KEEP:-0}" = 1 ]; then
        log "keeping $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
ROOT=$WORK/root
mkdir -p "$ROOT"/{bin,sbin,usr/bin,usr/sbin,lib,lib64,etc,proc,sys,dev,tmp,run,root,extra,var/tmp}
chmod 1777 "$ROOT/tmp" "$ROOT/var/tmp"

# ---------------------------------------------------------------- initramfs
declare -A COPIED=()
copy_libs() { # copy the shared libraries of ELF $1 to the same paths in $ROOT
    local out lib
    out=$(ldd "$1" 2>/dev/null) || return 0   # static or not an ELF: nothing to do
    while read -r lib; do
        [ -n "$lib" ] && [ -e "$lib" ] || continue
        [ -n "${COPIED[$lib]:-}" ] && continue
        COPIED[$lib]=1
        mkdir -p "$ROOT$(dirname "$lib")"
        cp -L "$lib" "$ROOT$lib"
    done < <(printf '%s\n' "$out" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')
}
install_bin() { # install_bin SRC DEST_PATH_IN_GUEST
    mkdir -p "$ROOT$(dirname "$2")"
    rm -f "$ROOT$2"
    cp -L "$1" "$ROOT$2"
    chmod 755 "$ROOT$2"
    copy_libs "$1"
}

T_BUILD=$(date +%s%N)
# busybox with an applet symlink for every applet it has
cp /bin/busybox "$ROOT/bin/busybox"
while read -r applet; do
    [ -n "$applet" ] || continue
    [ -e "$ROOT/$applet" ] || [ -L "$ROOT/$applet" ] && continue
    mkdir -p "$ROOT/$(dirname "$applet")"
    ln -s /bin/busybox "$ROOT/$applet"
done < <(/bin/busybox --list-full)

# GNU tools that replace busybox applets: dd (status=, iflag=direct, rates),
# date (+%s%N, busybox lacks %N), sleep and yes (real binaries, so a symlink
# with another name, e.g. ora_p001_BX1, still works: busybox dispatches on
# argv[0] and would fail with "applet not found").
# Note: busybox sh (Debian's is built with FEATURE_SH_STANDALONE) still runs
# its own applet for a bare "dd" in a script; call /bin/dd to get GNU dd.
for t in dd date sleep yes; do
    src=$(command -v "$t" || true)
    if [ -n "$src" ] && ldd "$src" >/dev/null 2>&1; then
        install_bin "$src" "/bin/$t"
        for d in sbin usr/bin usr/sbin; do
            if [ -L "$ROOT/$d/$t" ]; then ln -sf "/bin/$t" "$ROOT/$d/$t"; fi
        done
    fi
done
for t in dmsetup; do
    src=$(command -v "$t" || true)
    [ -n "$src" ] && install_bin "$src" "/sbin/$t"
done
if [ "${DBCAGE_VM_NO_FIO:-0}" != 1 ] && command -v fio >/dev/null 2>&1; then
    install_bin "$(command -v fio)" /usr/bin/fio
fi

install_bin "$BINARY" /bin/dbcage
cp "$GUEST_SCRIPT" "$ROOT/test.sh"
chmod 755 "$ROOT/test.sh"
for f in "${EXTRAS[@]}"; do
    cp -a "$f" "$ROOT/extra/"
    if [ -f "$f" ] && [ -x "$f" ]; then copy_libs "$f"; fi
done

cat >"$ROOT/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$ROOT/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
echo 'passwd: files
group: files' >"$ROOT/etc/nsswitch.conf"
echo dbcage-vm >"$ROOT/etc/hostname"
mknod -m 600 "$ROOT/dev/console" c 5 1 2>/dev/null || true
mknod -m 666 "$ROOT/dev/null" c 1 3 2>/dev/null || true

# Kernel modules: resolve dependencies from the .ko "depends=" modinfo field,
# skip built-ins, decompress .ko.xz / .ko.zst (busybox insmod can't).
declare -A MODFILE=()
while read -r f; do
    b=${f##*/}; b=${b%%.ko*}; b=${b//-/_}
    MODFILE[$b]=$f
done < <(find "$MODDIR/kernel" -name '*.ko*')
BUILTIN=$(sed 's,.*/,,; s,\.ko$,,; s,-,_,g' "$MODDIR/modules.builtin" 2>/dev/null || true)
declare -A MODSEEN=()
MODORDER=()
mod_decompress() { # mod_decompress SRC > stdout
    case "$1" in
        *.ko.xz)  xz -dc "$1" ;;
        *.ko.zst) zstd -qdc "$1" ;;
        *.ko.gz)  gzip -dc "$1" ;;
        *)        cat "$1" ;;
    esac
}
add_module() {
    local m=${1//-/_} f deps d
    [ -n "${MODSEEN[$m]:-}" ] && return 0
    MODSEEN[$m]=1
    if printf '%s\n' "$BUILTIN" | grep -qx "$m"; then
        log "module $m is built in"
        return 0
    fi
    f=${MODFILE[$m]:-}
    [ -n "$f" ] || die "kernel module $m not found in $MODDIR"
    deps=$(mod_decompress "$f" | grep -a -o 'depends=[A-Za-z0-9_,-]*' | head -n1 | cut -d= -f2 | tr ',' ' ')
    for d in $deps; do add_module "$d"; done
    mkdir -p "$ROOT/lib/modules"
    mod_decompress "$f" >"$ROOT/lib/modules/$m.ko"
    MODORDER+=("$m")
}
for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk \
         loop dm_mod dm_multipath dm_round_robin ${DBCAGE_VM_MODULES:-}; do
    add_module "$m"
done
printf '%s\n' "${MODORDER[@]}" >"$ROOT/etc/modules.order"

cat >"$ROOT/init" <<'EOF'
#!/bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=dumb
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
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
chmod 755 "$ROOT/init"

INITRD=$WORK/initramfs.cpio
( cd "$ROOT" && find . -print0 | cpio --null -o -H newc --quiet -R 0:0 ) >"$INITRD"
log "initramfs $(( $(stat -c %s "$INITRD") / 1024 / 1024 )) MiB built in $(ms_since "$T_BUILD") ms"

# ---------------------------------------------------------------- disks
DRIVES=()
for i in $(seq 0 $((NDISKS - 1))); do
    truncate -s "$DISK_SIZE" "$WORK/dbcage-test-disk$i.img"
    DRIVES+=(-drive "if=virtio,format=raw,file=$WORK/dbcage-test-disk$i.img")
done

# ---------------------------------------------------------------- boot
# No -enable-kvm: KVM hangs on these machines, TCG boots in a few seconds.
# 2 vCPUs on 2 NUMA nodes, 512 MiB each.
QEMU=(qemu-system-x86_64 -nographic -no-reboot -nic none
      -smp 2 -m 1G
      -object memory-backend-ram,id=m0,size=512M
      -object memory-backend-ram,id=m1,size=512M
      -numa node,nodeid=0,cpus=0,memdev=m0
      -numa node,nodeid=1,cpus=1,memdev=m1
      ${DBCAGE_VM_QEMU_OPTS:-}
      -kernel "$VMLINUZ" -initrd "$INITRD"
      -append "console=ttyS0 panic=-1 quiet ${DBCAGE_VM_APPEND:-}"
      "${DRIVES[@]}")

LOG=$WORK/console.log
log "booting qemu (timeout ${TIMEOUT}s)"
T_BOOT=$(date +%s%N)
# qemu and the output reader run in the background and we `wait` for them,
# so that a signal to this script is handled at once (bash defers traps while
# a foreground pipeline runs) and the trap can stop qemu.
# The reader strips CRs and the terminal escapes the firmware prints (ESC c
# resets the terminal, ESC[?7l turns off line wrapping), streams the console
# to stdout and to $LOG, and notes when /init starts.
FIFO=$WORK/console.fifo
mkfifo "$FIFO"
: >"$LOG"
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
        done
    }
) &
RPID=$!
timeout --kill-after=10 "$TIMEOUT" "${QEMU[@]}" </dev/null >"$FIFO" 2>&1 &
QPID=$!
set +e
wait "$QPID"
QRC=$?
wait "$RPID"
set -e
QPID=
RPID=
RUN_MS=$(ms_since "$T_BOOT")
BOOT_MS=$(cat "$WORK/boot_ms" 2>/dev/null || echo "?")

MARK=$(grep -a -o 'DBCAGE-VM-EXIT=[0-9]*' "$LOG" 2>/dev/null | tail -n1 | cut -d= -f2 || true)
log "qemu exit $QRC; boot to /init ${BOOT_MS} ms; qemu total ${RUN_MS} ms; whole run $(ms_since "$T_START") ms"
if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
    log "error: timed out after ${TIMEOUT}s"
    exit 124
fi
if [ -z "$MARK" ]; then
    log "error: no DBCAGE-VM-EXIT marker in guest output (kernel panic or /init died?)"
    exit 125
fi
log "guest script exit code $MARK"
exit "$MARK"
