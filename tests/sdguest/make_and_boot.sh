#!/bin/bash
# Vendored from the team's shared systemd-guest recipe (../shared/systemd-guest/) so that CI has
# it; local changes: DATA_DISKS, UNIFIED. tests/sdguest/run.sh drives it (see tests/sdguest/README.md).
#
# make_and_boot.sh - build a minimal Debian 12 (bookworm) guest with systemd as
# PID 1 and boot it under QEMU with plain TCG (no KVM), scriptably: with
# TEST=1 a unit in the guest runs /root/test.sh, prints to the serial console
# and powers the guest off, so qemu exits by itself.
#
# usage: make_and_boot.sh [STAGE...]   stages run in the order given, e.g.
#        make_and_boot.sh configure image boot   (after changing files in $WORK/root)
#   all       rootfs + configure + kernel + image + boot (default)
#   rootfs    debootstrap into $WORK/root (skipped when it already exists)
#   configure write units/scripts/masks into $WORK/root (idempotent)
#   kernel    $WORK/vmlinux (uncompressed, PVH boot) + $WORK/initrd.img (small)
#   image     $WORK/disk.img = mkfs.ext4 -d $WORK/root (no loop mount)
#   boot      run qemu; console log with host timestamps in $WORK/boot-*.log
#   clean     rm -rf $WORK
#
# environment (defaults in brackets):
#   WORK=/tmp/sdguest        work dir (root/, disk.img, logs)
#   KVER=                  kernel version (default: what Debian's linux-image-amd64 depends on);
#                          taken from /boot and /lib/modules when there, else the package is
#                          downloaded with apt and unpacked (never installed) into $WORK/kroot
#   MIRROR=<from /etc/apt/sources.list.d/debian.sources or sources.list>
#   IMG_SIZE=2G            root image size (sparse)
#   TEST=1                 1: autorun /root/test.sh then power off; 0: login shell
#                          on ttyS0 (root, empty password; quit qemu with Ctrl-A x)
#   TEST_SCRIPT=           host file to install as /root/test.sh (default: built-in)
#   FAST=1                 1: uncompressed vmlinux (PVH) + small initrd + quiet
#                          cmdline; 0: /boot/vmlinuz + /boot/initrd.img as-is
#   MINI_INITRD=1          1: busybox initrd built here (fastest); 0: mkinitramfs MODULES=list
#   GUEST_MODULES=0        1: copy /lib/modules/$KVER into the guest (+400 MB) so that
#                          modprobe works inside (null_blk, loop, ...); 0: none there
#   NUMA=0                 1: two NUMA nodes (cpu0+512M, cpu1+512M)
#   DISK2=0                1: attach a second virtio disk ($WORK/disk2.img, 256M)
#   DATA_DISKS=0           N: attach N more sparse virtio disks ($WORK/data<i>.img, DATA_DISK_SIZE
#                          each, after disk2 when DISK2=1), recreated empty on every boot
#   DATA_DISK_SIZE=256M
#   MEM=1024 SMP=2         guest memory (MiB) and vCPUs
#   PERSIST=0              1: boot writes go to disk.img; 0: -snapshot style (discarded)
#   APPEND_EXTRA=          extra kernel cmdline words
#   UNIFIED=1              systemd.unified_cgroup_hierarchy=UNIFIED (0: cgroup v1, RHEL 7/8 style)
#   KERNEL= INITRD=        override the kernel / initrd file passed to qemu
#   BOOT_TIMEOUT=300       kill qemu after this many seconds
#   BEGIN_TIMEOUT=150      a test boot whose script has not begun (SDGUEST: BEGIN) after this
#                          many seconds (it takes 9-15 s) is stopped and made once more, with
#                          the kernel's messages, and says so; a second such boot fails
#   FIRST_BOOT_OPTS=       qemu options for the first test boot only (to see that retry:
#                          "-S" starts the guest's CPUs stopped)
set -euo pipefail

WORK=${WORK:-/tmp/sdguest}
KVER=${KVER:-}
IMG_SIZE=${IMG_SIZE:-2G}
TEST=${TEST:-1}
FAST=${FAST:-1}
NUMA=${NUMA:-0}
DISK2=${DISK2:-0}
DATA_DISKS=${DATA_DISKS:-0}
DATA_DISK_SIZE=${DATA_DISK_SIZE:-256M}
MEM=${MEM:-1024}
SMP=${SMP:-2}
PERSIST=${PERSIST:-0}
APPEND_EXTRA=${APPEND_EXTRA:-}
UNIFIED=${UNIFIED:-1}
BOOT_TIMEOUT=${BOOT_TIMEOUT:-300}
BEGIN_TIMEOUT=${BEGIN_TIMEOUT:-150}
TEST_SCRIPT=${TEST_SCRIPT:-}
MINI_INITRD=${MINI_INITRD:-1}
GUEST_MODULES=${GUEST_MODULES:-0}
case $WORK in "" | /) echo "refusing WORK='$WORK'" >&2; exit 1 ;; esac
ROOT=$WORK/root
KROOT=$WORK/kroot

# Host tools the stages use (a fresh Debian machine has none of them).
need_tools() {
	local pkgs=() pair
	for pair in qemu-system-x86_64:qemu-system-x86 debootstrap:debootstrap busybox:busybox-static \
		cpio:cpio modprobe:kmod xz:xz-utils mkfs.ext4:e2fsprogs; do
		command -v "${pair%%:*}" >/dev/null 2>&1 || pkgs+=("${pair#*:}")
	done
	[ ${#pkgs[@]} -eq 0 ] && return 0
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null 2>&1 ||
		{ apt-get update -q >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null; }
}
need_tools
if [ -z "$KVER" ]; then
	pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
	[ -n "$pkg" ] || { apt-get update -q >/dev/null; pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}'); }
	KVER=${pkg#linux-image-}
fi
# The kernel and its modules: the host's if it has this version, else the package unpacked in $KROOT.
if [ -r "/boot/vmlinuz-$KVER" ] && [ -d "/lib/modules/$KVER" ]; then KROOT=""; fi
ensure_kernel_pkg() {
	[ -z "$KROOT" ] && return 0
	[ -r "$KROOT/lib/modules/$KVER/modules.dep" ] && return 0
	local d; d=$(mktemp -d); chmod 755 "$d"
	(cd "$d" && apt-get download -q "linux-image-$KVER" >/dev/null 2>&1) ||
		{ apt-get update -q >/dev/null; (cd "$d" && apt-get download -q "linux-image-$KVER" >/dev/null); } ||
		die "cannot download linux-image-$KVER"
	mkdir -p "$KROOT"; dpkg -x "$d"/*.deb "$KROOT"; rm -rf "$d"
	depmod -b "$KROOT" "$KVER"   # the package leaves modules.dep to its postinst
}

log() { printf '[%(%T)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

detect_mirror() {
	local u=""
	if [ -r /etc/apt/sources.list.d/debian.sources ]; then
		u=$(awk '/^URIs:/ && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
	fi
	if [ -z "$u" ] && [ -r /etc/apt/sources.list ]; then
		u=$(awk '/^deb / && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^(https?|file):/) {print $i; exit}}' /etc/apt/sources.list)
	fi
	[ -n "$u" ] || { echo "no Debian mirror in the apt sources: set MIRROR=URL" >&2; return 1; }
	echo "$u"
}
MIRROR=${MIRROR:-$(detect_mirror)}

# ---------------------------------------------------------------- rootfs
do_rootfs() {
	if [ -e "$ROOT/etc/debian_version" ]; then log "rootfs: $ROOT exists, skipping"; return; fi
	command -v debootstrap >/dev/null || apt-get install -y debootstrap
	mkdir -p "$WORK"
	log "rootfs: debootstrap bookworm from $MIRROR"
	local t0=$SECONDS
	debootstrap --variant=minbase --include=systemd,systemd-sysv,udev,kmod,dbus,busybox-static \
		bookworm "$ROOT" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 \
		|| { tail -20 "$WORK/debootstrap.log"; die "debootstrap failed"; }
	chroot "$ROOT" apt-get clean
	log "rootfs: done in $((SECONDS - t0)) s, $(du -sh "$ROOT" | cut -f1)"
}

# ---------------------------------------------------------------- guest files
write_default_test() {
	cat <<'EOF'
#!/bin/bash
# Default guest test: systemd + cgroup v2 probes. Output goes to the console.
say() { echo "SDGUEST: $*"; }
run() { echo "SDGUEST\$ $*"; "$@" 2>&1 | sed 's/^/  /'; }
say "BEGIN uptime=$(cut -d' ' -f1 /proc/uptime)"
# boot timeline on the guest clock (s since kernel start): initramfs /init, root mounted, systemd start
t_init=$(dmesg | awk -F'[][]' '/Run \/init/ {gsub(/ /, "", $2); print $2; exit}')
t_root=$(dmesg | awk -F'[][]' '/EXT4-fs \(vda\): mounted/ {gsub(/ /, "", $2); print $2; exit}')
t_sd=$(systemctl show -p UserspaceTimestampMonotonic --value | awk '{printf "%.2f", $1/1e6}')
say "timeline: initramfs=${t_init} rootmount=${t_root} systemd=${t_sd} test=$(cut -d' ' -f1 /proc/uptime)"
run systemctl --version
run cat /proc/cmdline
run cat /proc/self/cgroup
run stat -fc %T /sys/fs/cgroup
run cat /sys/fs/cgroup/cgroup.controllers
run cat /sys/fs/cgroup/cgroup.subtree_control

say "--- transient unit in test.slice with IOReadBandwidthMax"
run systemd-run --unit=probe --slice=test.slice -p IOReadBandwidthMax="/dev/vda 1M" sleep 30
run systemctl show -p ControlGroup,Slice,IOReadBandwidthMax probe.service
run cat /sys/fs/cgroup/test.slice/cgroup.subtree_control
run cat /sys/fs/cgroup/test.slice/probe.service/io.max
run systemctl set-property --runtime probe.service CPUQuota=50%
run cat /sys/fs/cgroup/test.slice/probe.service/cpu.max
run systemctl set-property --runtime test.slice MemoryMax=200M
run cat /sys/fs/cgroup/test.slice/memory.max
run ls /run/systemd/transient/ /run/systemd/system.control/
run systemctl stop probe.service

say "--- Delegate=yes unit (sdguest-deleg.service runs /root/deleg.sh)"
run systemctl start sdguest-deleg.service
run journalctl -b -u sdguest-deleg.service --no-pager -o cat
run systemctl show -p Delegate,DelegateControllers,Result sdguest-deleg.service

say "--- NUMA / disks"
for n in /sys/devices/system/node/node*; do
	echo "  $(basename "$n"): cpus=$(cat "$n/cpulist") $(awk '/MemTotal/ {print $4, $5}' "$n/meminfo")"
done
run cat /sys/fs/cgroup/cpuset.cpus.effective /sys/fs/cgroup/cpuset.mems.effective
for b in /sys/block/vd*; do echo "  $(basename "$b") dev=$(cat "$b/dev") size=$(( $(cat "$b/size") / 2048 ))MiB"; done
run systemctl list-units --failed --no-legend --plain
say "END uptime=$(cut -d' ' -f1 /proc/uptime)"
EOF
}

do_configure() {
	[ -e "$ROOT/etc/debian_version" ] || die "no rootfs in $ROOT (run: $0 rootfs)"
	log "configure: $ROOT"
	local R=$ROOT s
	echo sdguest-guest > "$R/etc/hostname"
	printf '127.0.0.1 localhost\n127.0.1.1 sdguest-guest\n' > "$R/etc/hosts"
	echo '/dev/vda / ext4 rw,relatime 0 0' > "$R/etc/fstab"
	chroot "$R" passwd -d root >/dev/null          # serial console login without password

	if [ "$GUEST_MODULES" = 1 ] && [ ! -e "$R/lib/modules/$KVER/modules.dep" ]; then
		mkdir -p "$R/lib/modules"; ensure_kernel_pkg; cp -a "$KROOT/lib/modules/$KVER" "$R/lib/modules/"
	fi

	# test payload
	if [ -n "$TEST_SCRIPT" ]; then install -m755 "$TEST_SCRIPT" "$R/root/test.sh"
	else write_default_test > "$R/root/test.sh"; chmod 755 "$R/root/test.sh"; fi

	cat > "$R/root/deleg.sh" <<'EOF'
#!/bin/bash
# Runs as sdguest-deleg.service (Delegate=yes): create child cgroups in our own
# subtree, move ourselves into one, enable controllers for the children.
set -e
cg=$(awk -F: '$1=="0" {print $3}' /proc/self/cgroup)
base=/sys/fs/cgroup$cg
echo "start cgroup: $cg"
echo "delegated controllers: $(cat "$base/cgroup.controllers")"
mkdir "$base/supervisor" "$base/worker1"
echo $$ > "$base/supervisor/cgroup.procs"
echo "after move: $(cat /proc/self/cgroup)"
echo "+cpu +memory +io +pids" > "$base/cgroup.subtree_control"
echo "subtree_control now: $(cat "$base/cgroup.subtree_control")"
echo "50000 100000" > "$base/worker1/cpu.max"
echo "worker1 cpu.max: $(cat "$base/worker1/cpu.max")"
sleep 60 & w=$!
echo $w > "$base/worker1/cgroup.procs"
echo "worker1 cgroup.procs: $(cat "$base/worker1/cgroup.procs")"
systemd-cgls --no-pager "$cg" | sed 's/^/  /'
kill $w; wait $w 2>/dev/null || true
echo "DELEGATION-OK"
EOF
	chmod 755 "$R/root/deleg.sh"

	cat > "$R/etc/systemd/system/sdguest-deleg.service" <<'EOF'
[Unit]
Description=sdguest Delegate=yes probe

[Service]
Type=oneshot
Slice=test.slice
Delegate=yes
ExecStart=/root/deleg.sh
EOF

	# Autorun unit: only when "sdguest.test" is on the kernel command line.
	# Success/FailureAction belong in [Unit]; TTYPath=/dev/console avoids
	# waiting for udev's dev-ttyS0.device; ordered before the serial getty
	# because agetty vhangup()s the tty.
	cat > "$R/etc/systemd/system/sdguest-test.service" <<'EOF'
[Unit]
Description=sdguest autorun test (/root/test.sh, then power off)
ConditionKernelCommandLine=sdguest.test
Before=serial-getty@ttyS0.service getty.target
SuccessAction=poweroff
FailureAction=poweroff

[Service]
Type=oneshot
ExecStart=/root/test.sh
StandardOutput=tty
StandardError=tty
TTYPath=/dev/console
TTYReset=no
TTYVHangup=no
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
EOF
	ln -sf /etc/systemd/system/sdguest-test.service "$R/etc/systemd/system/multi-user.target.wants/sdguest-test.service"

	# Volatile journal: no flush to disk at boot.
	mkdir -p "$R/etc/systemd/journald.conf.d"
	printf '[Journal]\nStorage=volatile\n' > "$R/etc/systemd/journald.conf.d/sdguest.conf"

	# Boot-time diet: mask units that only cost time in a throwaway test VM.
	for s in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer \
		e2scrub_reap.service fstrim.timer systemd-tmpfiles-clean.timer getty@tty1.service \
		modprobe@configfs.service modprobe@dm_mod.service modprobe@drm.service \
		modprobe@efi_pstore.service modprobe@fuse.service modprobe@loop.service \
		sys-kernel-debug.mount sys-kernel-tracing.mount sys-kernel-config.mount \
		sys-fs-fuse-connections.mount dev-hugepages.mount \
		proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount systemd-binfmt.service \
		systemd-pstore.service systemd-random-seed.service systemd-journal-flush.service \
		systemd-update-utmp.service systemd-update-utmp-runlevel.service \
		systemd-journal-catalog-update.service systemd-update-done.service ldconfig.service \
		systemd-hwdb-update.service systemd-firstboot.service systemd-machine-id-commit.service \
		systemd-sysusers.service; do
		ln -sfn /dev/null "$R/etc/systemd/system/$s"
	done
	rm -f "$R/etc/systemd/system/getty.target.wants/getty@tty1.service" \
		"$R/etc/systemd/system/multi-user.target.wants/e2scrub_reap.service" \
		"$R/etc/systemd/system/timers.target.wants/"*.timer
	# Generators not needed here (no LUKS/verity/GPT autodiscovery/SysV scripts).
	mkdir -p "$R/etc/systemd/system-generators"
	for g in systemd-cryptsetup-generator systemd-gpt-auto-generator systemd-hibernate-resume-generator \
		systemd-integritysetup-generator systemd-rc-local-generator systemd-run-generator \
		systemd-system-update-generator systemd-sysv-generator systemd-veritysetup-generator; do
		ln -sfn /dev/null "$R/etc/systemd/system-generators/$g"
	done
}

# ---------------------------------------------------------------- kernel/initrd
do_kernel() {
	ensure_kernel_pkg
	local vmlinuz=$KROOT/boot/vmlinuz-$KVER
	[ -r "$vmlinuz" ] || die "no $vmlinuz"
	if [ ! -s "$WORK/vmlinux" ]; then
		# The bzImage wraps an xz-compressed ELF vmlinux with a PVH entry note;
		# qemu can boot that ELF directly and skip the slow in-guest decompression.
		log "kernel: extracting uncompressed vmlinux"
		local off
		off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$vmlinuz" | awk -F: 'NR==1 {print $1}') || true
		[ -n "$off" ] || die "no xz payload in $vmlinuz"
		tail -c +$((off + 1)) "$vmlinuz" | xz -dc --single-stream > "$WORK/vmlinux.tmp" 2>/dev/null || true
		head -c4 "$WORK/vmlinux.tmp" | grep -q ELF || die "vmlinux extraction failed"
		mv "$WORK/vmlinux.tmp" "$WORK/vmlinux"
	fi
	if [ ! -s "$WORK/initrd.img" ]; then
		if [ "$MINI_INITRD" = 1 ]; then build_mini_initrd; else build_mkinitramfs; fi
		log "kernel: initrd $(du -h "$WORK/initrd.img" | cut -f1)"
	fi
}

# Tiny initramfs: static busybox + the modules needed for virtio-blk + ext4,
# and a short /init that mounts root and switch_root's to systemd. Saves the
# ~2-3 s (TCG) that initramfs-tools' udev coldplug costs.
build_mini_initrd() {
	log "kernel: building mini initrd (busybox + virtio_blk + ext4)"
	local d=$WORK/mini-initrd bb="" m
	[ -n "$WORK" ] || die "WORK is empty"
	for m in "$ROOT/usr/bin/busybox" "$ROOT/bin/busybox" /usr/bin/busybox /bin/busybox; do
		if [ -x "$m" ] && file -L "$m" | grep -q 'statically linked'; then bb=$m; break; fi
	done
	[ -n "$bb" ] || die "need a static busybox (apt-get install busybox-static)"
	rm -rf "$d"; mkdir -p "$d"/{bin,dev,proc,sys,newroot}
	cp "$bb" "$d/bin/busybox"
	: > "$d/modules"
	# (--show-depends takes one module per call; extra words would be parameters)
	for m in $(for x in virtio_pci virtio_blk ext4; do modprobe ${KROOT:+-d "$KROOT"} -S "$KVER" --show-depends "$x"; done |
		awk '$1 == "insmod" && !seen[$2]++ {print $2}'); do
		mkdir -p "$d$(dirname "$m")"; cp "$m" "$d$m"; echo "$m" >> "$d/modules"
	done
	cat > "$d/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules); do insmod "$m" 2>/dev/null; done   # crc32c-intel fails w/o SSE4.2: fine
root=/dev/vda fstype=ext4 opts=rw
for a in $(cat /proc/cmdline); do
	case $a in root=*) root=${a#root=} ;; rootfstype=*) fstype=${a#rootfstype=} ;; ro) opts=ro ;; esac
done
i=0; while [ ! -b "$root" ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i + 1)); done
if ! mount -t "$fstype" -o "$opts" "$root" /newroot; then
	echo "mini-initrd: cannot mount $root; dropping to a shell"; exec sh
fi
umount /sys /proc
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
INIT
	chmod 755 "$d/init"
	(cd "$d" && find . | cpio -o -H newc --quiet) > "$WORK/initrd.img.tmp"
	mv "$WORK/initrd.img.tmp" "$WORK/initrd.img"
}

# Alternative: initramfs-tools with MODULES=list (about 7 MB, ~2 s slower under TCG).
build_mkinitramfs() {
	log "kernel: building small initrd with mkinitramfs (MODULES=list)"
	command -v mkinitramfs >/dev/null || apt-get install -y initramfs-tools
	rm -rf "$WORK/irconf"; mkdir -p "$WORK/irconf"/{conf.d,hooks,scripts}
	cp /etc/initramfs-tools/initramfs.conf "$WORK/irconf/" 2>/dev/null || : > "$WORK/irconf/initramfs.conf"
	sed -i '/^MODULES=/d; /^COMPRESS=/d' "$WORK/irconf/initramfs.conf"
	printf 'MODULES=list\nCOMPRESS=zstd\n' >> "$WORK/irconf/initramfs.conf"
	printf 'virtio_pci\nvirtio_blk\next4\n' > "$WORK/irconf/modules"
	mkinitramfs -d "$WORK/irconf" -o "$WORK/initrd.img" "$KVER"
}

# ---------------------------------------------------------------- image
do_image() {
	[ -e "$ROOT/etc/debian_version" ] || die "no rootfs in $ROOT"
	log "image: $WORK/disk.img ($IMG_SIZE, mkfs.ext4 -d)"
	local t0=${EPOCHREALTIME/./}
	rm -f "$WORK/disk.img"
	truncate -s "$IMG_SIZE" "$WORK/disk.img"
	mkfs.ext4 -q -F -L sdguest-root -d "$ROOT" "$WORK/disk.img"
	log "image: done in $(( (${EPOCHREALTIME/./} - t0) / 1000 )) ms, $(du -h "$WORK/disk.img" | cut -f1) allocated"
}

# ---------------------------------------------------------------- boot
do_boot() {
	[ -s "$WORK/disk.img" ] || die "no $WORK/disk.img (run: $0 image)"
	local kernel initrd append snap=on
	[ "$PERSIST" = 1 ] && snap=off
	append="console=ttyS0 no_timer_check root=/dev/vda rw systemd.unified_cgroup_hierarchy=$UNIFIED"
	if [ "$FAST" = 1 ]; then
		do_kernel
		kernel=$WORK/vmlinux initrd=$WORK/initrd.img
		append+=" quiet systemd.show_status=error"
	else
		kernel=$KROOT/boot/vmlinuz-$KVER initrd=/boot/initrd.img-$KVER
	fi
	kernel=${KERNEL:-$kernel} initrd=${INITRD:-$initrd}
	[ "$TEST" = 1 ] && append+=" sdguest.test"
	[ -n "$APPEND_EXTRA" ] && append+=" $APPEND_EXTRA"

	local -a q=(qemu-system-x86_64 -machine pc -m "$MEM" -smp "$SMP"
		-nodefaults -no-user-config -display none -serial mon:stdio -no-reboot
		-kernel "$kernel" -initrd "$initrd" -append "$append"
		-drive "file=$WORK/disk.img,if=virtio,format=raw,snapshot=$snap")
	if [ "$DISK2" = 1 ]; then
		[ -e "$WORK/disk2.img" ] || truncate -s 256M "$WORK/disk2.img"
		q+=(-drive "file=$WORK/disk2.img,if=virtio,format=raw")
	fi
	local i
	for ((i = 0; i < DATA_DISKS; i++)); do
		rm -f "$WORK/data$i.img"; truncate -s "$DATA_DISK_SIZE" "$WORK/data$i.img"
		q+=(-drive "file=$WORK/data$i.img,if=virtio,format=raw")
	done
	if [ "$NUMA" = 1 ]; then
		local half=$((MEM / 2))
		q+=(-object "memory-backend-ram,id=m0,size=${half}M" -object "memory-backend-ram,id=m1,size=$((MEM - half))M"
			-numa node,nodeid=0,cpus=0,memdev=m0 -numa node,nodeid=1,cpus=1,memdev=m1)
	fi

	if [ "$TEST" != 1 ]; then
		log "boot: ${q[*]}"
		exec "${q[@]}"
	fi
	local attempt
	for attempt in 1 2; do
		if [ "$attempt" = 2 ]; then
			# The retry shows the kernel's messages, so that a second hang says where it stopped.
			local k
			for k in "${!q[@]}"; do
				[ "${q[$k]}" = -append ] && q[k+1]="${q[k+1]/ quiet/} ignore_loglevel"
			done
		fi
		local -a first=()
		# shellcheck disable=SC2206
		[ "$attempt" = 1 ] && first=(${FIRST_BOOT_OPTS:-})
		boot_once "$attempt" "${q[@]}" "${first[@]}" && return 0
		[ -e "$WORK/begin_hung" ] || return 1
		log "boot: warning: the guest's test script had not begun after ${BEGIN_TIMEOUT}s (it takes 9-15 s)"
		[ "$attempt" = 1 ] && log "boot: warning: booting once more, with the kernel's messages (a boot that hangs twice fails)"
	done
	log "boot: error: the guest's test script had not begun after ${BEGIN_TIMEOUT}s, twice"
	return 1
}

# boot_once ATTEMPT QEMU-COMMAND...: one test boot, its console timestamped into a log. A
# watchdog stops qemu (through its timeout wrapper) when the test script has not begun within
# BEGIN_TIMEOUT, and leaves $WORK/begin_hung.
boot_once() {
	local attempt=$1
	shift
	local logf
	logf=$WORK/boot-$(date +%Y%m%d-%H%M%S)-$attempt.log
	log "boot: $*"
	log "boot: console log -> $logf (attempt $attempt)"
	rm -f "$WORK/begin_hung" "$WORK/qemu.pid"
	: >"$logf"
	# Timestamp every console line relative to qemu start (host clock).
	local t0=${EPOCHREALTIME/./}
	{
		timeout "$BOOT_TIMEOUT" "$@" < /dev/null 2>&1 &
		echo $! >"$WORK/qemu.pid"
		wait $!
		echo "QEMU-EXIT rc=$?"
	} |
	while IFS= read -r line; do
		local d=$(( ${EPOCHREALTIME/./} - t0 ))
		printf '%4d.%02d %s\n' $((d / 1000000)) $(( (d % 1000000) / 10000 )) "${line//$'\r'/}"
	done | tee "$logf" &
	local ppid=$! deadline=$(( $(date +%s) + BEGIN_TIMEOUT )) qpid=
	while kill -0 "$ppid" 2>/dev/null && ! grep -q 'SDGUEST: BEGIN' "$logf"; do
		if [ "$(date +%s)" -ge "$deadline" ]; then
			qpid=$(cat "$WORK/qemu.pid" 2>/dev/null || true)
			: >"$WORK/begin_hung"
			[ -n "$qpid" ] && kill -TERM "$qpid" 2>/dev/null
			break
		fi
		sleep 0.5
	done
	wait "$ppid" || true
	local first end
	first=$(awk '/SDGUEST: BEGIN/ {print $1; exit}' "$logf")
	end=$(awk '/QEMU-EXIT/ {print $1 " (" $NF ")"; exit}' "$logf")
	log "boot: qemu start -> first test line: ${first:-n/a} s; -> qemu exit: ${end:-n/a} s"
	[ ! -e "$WORK/begin_hung" ] && grep -q 'QEMU-EXIT rc=0' "$logf" && grep -q 'SDGUEST: END' "$logf"
}

[ $# -gt 0 ] || set -- all
for stage in "$@"; do
	case $stage in
		rootfs) do_rootfs ;;
		configure) do_configure ;;
		kernel) do_kernel ;;
		image) do_image ;;
		boot) do_boot ;;
		all) do_rootfs; do_configure; do_kernel; do_image; do_boot ;;
		clean) rm -rf "$WORK" ;;
		*) sed -n '2,/^set -euo/{/^#/p}' "$0"; exit 2 ;;
	esac
done
