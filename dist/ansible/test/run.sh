#!/bin/bash
# Tests the Ansible role for real: applies it to a Debian 12 guest with systemd as PID 1 under
# qemu (the systemd guest vendored in tests/sdguest/make_and_boot.sh), with
# ansible-playbook inside the guest (connection local: Debian's ansible-core and python3-apt are
# put into the guest's root with a chroot apt-get, since the guest has no network), three times:
# install + start, the same again (nothing may change), one limit changed (only the policy and a
# reload). See guest-test.sh for the checks.
#
# usage: dist/ansible/test/run.sh DBCAGE.deb     (from the project's root; root needed)
# env:   WORK (default /tmp/dbcage-test-sdguest-ansible), SDGUEST (the guest script)
set -euo pipefail
cd "$(dirname "$0")/../../.."
deb=${1:?usage: $0 DBCAGE.deb}
S=${SDGUEST:-$(realpath tests/sdguest/make_and_boot.sh)}
export WORK=${WORK:-/tmp/dbcage-test-sdguest-ansible}
R=$WORK/root
[ -d "$R/usr" ] || "$S" rootfs
# The guest has no network: what the role's apt task would fetch for the .deb's dependencies
# (libelf1 for the eBPF loader) is put into its root here too.
if ! chroot "$R" sh -c 'command -v ansible-playbook && python3 -c "import apt" && dpkg -s libelf1' >/dev/null 2>&1; then
  echo "run.sh: installing ansible-core, python3-apt and the package's dependencies into the guest root (chroot apt-get)"
  cp /etc/resolv.conf "$R/etc/resolv.conf"
  mount --bind /proc "$R/proc"
  trap 'umount "$R/proc"' EXIT
  chroot "$R" sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ansible-core python3-apt procps libelf1 zlib1g' >/dev/null
  umount "$R/proc"
  trap - EXIT
fi
rm -rf "$R/root/dbcage-ansible"
mkdir -p "$R/root/dbcage-ansible"
cp -r dist/ansible/site.yml dist/ansible/roles dist/ansible/test "$R/root/dbcage-ansible/"
cp "$deb" "$R/root/dbcage-ansible/dbcage.deb"
# A guest from an earlier run must not have dbcage installed already.
rm -f "$R/usr/sbin/dbcage"
start=$(date +%s)
rc=0
TEST_SCRIPT=dist/ansible/test/guest-test.sh BOOT_TIMEOUT=${BOOT_TIMEOUT:-1200} MEM=${MEM:-1536} \
  "$S" configure kernel image boot || rc=$?
log=$(ls -t "$WORK"/boot-*.log | head -1)
grep -E "run [0-9]|ANSIBLE-ROLE" "$log" || true
echo "run.sh: $(( $(date +%s) - start )) s; log: $log"
grep -q "ANSIBLE-ROLE: PASS" "$log" && [ $rc = 0 ]
