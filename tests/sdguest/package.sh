#!/usr/bin/env bash
# Issue 19's scenario 6 alone: the packaged .deb installed with dpkg in the systemd guest and
# started with `systemctl enable --now dbcage`, stopped, started, upgraded (tests/sdguest/guest/package.sh).
# usage: tests/sdguest/package.sh [DEB]   (default: scripts/build-deb.sh)
#   SDGUEST_CGROUP   v2 (default) or v1 (a RHEL 7/8 style host: systemd.unified_cgroup_hierarchy=0;
#                    the pinned tenant's cpus are then reported as not applied)
# scripts/test.sh runs it in the same guest boot as the other scenarios: tests/sdguest/systemd.sh DEB.
# Exit code: the guest script's; 125 when the guest did not boot or finish (a failure, never a skip).
set -euo pipefail
cd "$(dirname "$0")/../.."
deb=${1:-$(scripts/build-deb.sh)}
SDGUEST_CGROUP=${SDGUEST_CGROUP:-v2} SDGUEST_DEB=$deb tests/sdguest/run.sh tests/sdguest/guest/package.sh "$deb"
