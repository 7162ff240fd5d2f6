#!/bin/bash
# Harness smoke test: the guest has systemd as PID 1, PostgreSQL 15 running in its unit,
# dbcage installed, the data disks attached, and results come back.
set -u
fail=0
check() { if "$@"; then echo "ok: $*"; else echo "FAIL: $*"; fail=1; fi; }
check test "$(cat /proc/1/comm)" = systemd
check test -d /run/systemd/system
# The test unit runs during boot: join postgres's start job rather than race it.
systemctl start postgresql@15-main.service
check systemctl is-active --quiet postgresql@15-main.service
systemctl status --no-pager postgresql@15-main.service | head -20
check test -x /usr/sbin/dbcage
dbcage --version
for d in $SDGUEST_DATA; do check test -b "$d"; done
check test -f "$SDGUEST_FILES/smoke.sh"
echo "hello from the guest" > "$SDGUEST_OUT/hello.txt"
exit $fail
