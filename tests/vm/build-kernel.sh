#!/usr/bin/env bash
# Build a kernel with blk-iolatency (CONFIG_BLK_CGROUP_IOLATENCY) for the VM, which no Debian
# kernel package enables: Debian's own 6.1 source (linux-source-6.1), the upstream x86_64
# defconfig plus kvm_guest.config plus the options below, so that `[tenant.io] latency_target`
# can be tested on a real io.latency. It is used only where io.latency is the point
# (scripts/test.sh runs tests/vm/protect.sh on it as well as on Debian's kernel); every other
# VM test boots Debian's kernel, as users run.
#
# usage: tests/vm/build-kernel.sh [OUT_DIR]
#   OUT_DIR defaults to $DBCAGE_VM_CACHE/kernel-iolatency (/var/cache/dbcage-vm/kernel-iolatency)
#   and gets the layout tests/vm/run.sh reads from DBCAGE_VM_KERNEL_DIR: boot/vmlinuz-KVER,
#   vmlinux (PVH entry), lib/modules/KVER, and a .complete stamp. A stamp naming this script's
#   hash means the kernel is built: the script then exits at once. A build takes 15-30 minutes
#   on 2 cores; the tree is built under /var/tmp and removed afterwards.
set -euo pipefail

log() { printf '[dbcage-kbuild] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

SELF=$(readlink -f "${BASH_SOURCE[0]}")
CACHE=${DBCAGE_VM_CACHE:-/var/cache/dbcage-vm}
OUT=${1:-$CACHE/kernel-iolatency}
STAMP="dbcage-iolatency $(sha256sum "$SELF" | cut -c1-16)"
if [ -f "$OUT/.complete" ] && [ "$(cat "$OUT/.complete")" = "$STAMP" ]; then
    log "kernel in $OUT is built ($STAMP)"
    exit 0
fi

# The options the tests need, on top of x86_64_defconfig and kvm_guest.config. Everything the
# VM's /init loads as a module is built in, except null_blk (the tests load it with their own
# parameters).
FRAGMENT='
CONFIG_LOCALVERSION="-dbcage-iolatency"
CONFIG_LOCALVERSION_AUTO=n
CONFIG_PVH=y
CONFIG_DEBUG_INFO_NONE=y
CONFIG_MODULES=y
CONFIG_NUMA=y
CONFIG_CGROUPS=y
CONFIG_MEMCG=y
CONFIG_CPUSETS=y
CONFIG_CGROUP_SCHED=y
CONFIG_FAIR_GROUP_SCHED=y
CONFIG_CFS_BANDWIDTH=y
CONFIG_CGROUP_PIDS=y
CONFIG_CGROUP_FREEZER=y
CONFIG_PSI=y
CONFIG_BLK_CGROUP=y
CONFIG_BLK_CGROUP_IOLATENCY=y
CONFIG_BLK_CGROUP_IOCOST=y
CONFIG_BLK_DEV_THROTTLING=y
CONFIG_MQ_IOSCHED_DEADLINE=y
CONFIG_IOSCHED_BFQ=y
CONFIG_BFQ_GROUP_IOSCHED=y
CONFIG_CONNECTOR=y
CONFIG_PROC_EVENTS=y
CONFIG_UNIX=y
CONFIG_VIRTIO_PCI=y
CONFIG_VIRTIO_BLK=y
CONFIG_BLK_DEV_LOOP=y
CONFIG_MD=y
CONFIG_BLK_DEV_DM=y
CONFIG_DM_MULTIPATH=y
CONFIG_BLK_DEV_NULL_BLK=m
CONFIG_EXT4_FS=y
CONFIG_TMPFS=y
CONFIG_DEVTMPFS=y
CONFIG_BLK_DEV_INITRD=y
CONFIG_SERIAL_8250=y
CONFIG_SERIAL_8250_CONSOLE=y
'

export DEBIAN_FRONTEND=noninteractive
need=()
for t in bison:bison flex:flex bc:bc make:make gcc:gcc; do
    command -v "${t%%:*}" >/dev/null 2>&1 || need+=("${t#*:}")
done
[ -e /usr/include/libelf.h ] || need+=(libelf-dev)
[ -e /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
[ -e /usr/src/linux-source-6.1.tar.xz ] || need+=(linux-source-6.1)
if [ ${#need[@]} -gt 0 ]; then
    log "installing: ${need[*]}"
    apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 \
        || { apt-get update -qq >&2 || true; apt-get install -y -qq --no-install-recommends "${need[@]}" >&2; } \
        || die "apt-get install ${need[*]} failed"
fi
SRC_VERSION=$(dpkg-query -W -f '${Version}' linux-source-6.1 2>/dev/null || echo unknown)

BUILD=$(mktemp -d /var/tmp/dbcage-test-kbuild.XXXXXX)
trap 'rm -rf "$BUILD"' EXIT
T0=$(date +%s)
log "unpacking linux-source-6.1 $SRC_VERSION into $BUILD"
tar -C "$BUILD" -xJf /usr/src/linux-source-6.1.tar.xz
TREE=$BUILD/linux-source-6.1
[ -d "$TREE" ] || die "no linux-source-6.1 directory in the tarball"
cd "$TREE"
printf '%s\n' "$FRAGMENT" >"$BUILD/dbcage.config"
make -s x86_64_defconfig >&2
scripts/kconfig/merge_config.sh -m .config kernel/configs/kvm_guest.config "$BUILD/dbcage.config" >&2
make -s olddefconfig >&2
# Every option asked for must have survived olddefconfig (a dependency can drop one silently).
while IFS= read -r line; do
    case $line in
        CONFIG_*=n) grep -qx "# ${line%=n} is not set" .config || die ".config has $(grep "^${line%=n}=" .config) where $line was asked for" ;;
        CONFIG_*) grep -qxF "$line" .config || die ".config lacks $line (it has: $(grep "${line%%=*}[= ]" .config || echo nothing))" ;;
    esac
done <<<"$FRAGMENT"
log "building ($(nproc) jobs)"
make -s -j"$(nproc)" bzImage modules >&2
KVER=$(make -s kernelrelease)
STAGE=$BUILD/out
mkdir -p "$STAGE/boot"
make -s modules_install INSTALL_MOD_PATH="$STAGE" INSTALL_MOD_STRIP=1 >&2
cp arch/x86/boot/bzImage "$STAGE/boot/vmlinuz-$KVER"
cp .config "$STAGE/boot/config-$KVER"
cp vmlinux "$STAGE/vmlinux"
strip --strip-debug "$STAGE/vmlinux" 2>/dev/null || true
echo "linux-source-6.1 $SRC_VERSION" >"$STAGE/source"
echo "$STAMP" >"$STAGE/.complete"
rm -rf "$OUT"
mkdir -p "${OUT%/*}"
mv "$STAGE" "$OUT"
log "kernel $KVER built into $OUT in $(( $(date +%s) - T0 )) s"
