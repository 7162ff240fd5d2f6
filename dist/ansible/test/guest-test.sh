#!/bin/bash
# Runs inside the Debian 12 guest with systemd as PID 1 (as /root/test.sh, started by
# sdguest-test.service): applies the dbcage role three times with ansible-playbook on the guest
# itself and checks what each run did. Prints ANSIBLE-ROLE: PASS or ANSIBLE-ROLE: FAIL <why>.
echo "SDGUEST: BEGIN"
cd /root/dbcage-ansible || exit 1
export ANSIBLE_STDOUT_CALLBACK=default ANSIBLE_LOCALHOST_WARNING=false ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0
export ANSIBLE_ROLES_PATH=/root/dbcage-ansible/roles HOME=/root
fail() { echo "ANSIBLE-ROLE: FAIL $*"; journalctl -u dbcage --no-pager | tail -30; echo "SDGUEST: END"; exit 1; }

# One run: its output in run-N.log; prints the names of the tasks (and handlers) that changed
# something, read from ansible-core's default output ("TASK [role : name]" / "RUNNING HANDLER
# [role : name]" headers, then "changed: [localhost]").
apply() {
  local n=$1; shift
  local t0=$SECONDS
  ansible-playbook -i localhost, -c local site.yml -e @test/vars.yml "$@" > run-$n.log 2>&1
  local rc=$?
  echo "run $n: ansible-playbook rc=$rc in $((SECONDS - t0)) s; $(grep -o 'ok=.*' run-$n.log | tr -s ' ')" >&2
  [ $rc = 0 ] || { tail -40 run-$n.log >&2; return 1; }
  python3 - run-$n.log <<'PY'
import re, sys
task = None
for line in open(sys.argv[1]):
    m = re.match(r"(?:TASK|RUNNING HANDLER) \[(?:[^:\]]+ : )?(.*)\] \*", line)
    if m:
        task = m.group(1)
    elif line.startswith("changed: [localhost]"):
        print(task)
PY
}

# The tenant's group, wherever the daemon keeps it (dbcage/TENANT on a plain v2 root, or a unit
# systemd manages).
tenant_dir() { find /sys/fs/cgroup -maxdepth 4 -type d -name 'dbcage-test-ansible*' | head -1; }
kernel_cpu_max() { cat "$(tenant_dir)/cpu.max" 2>/dev/null; }
placed() { grep -q dbcage-test-ansible "/proc/$1/cgroup"; }
main_pid() { systemctl show -p MainPID --value dbcage; }

# 1: install, write the policy and the drop-in, enable and start.
echo "guest: $(uname -r), systemd $(systemctl --version | head -1 | cut -d' ' -f2), $(ansible-playbook --version | head -1)"
changed=$(apply 1) || fail "first run failed"
echo "run 1 changed: $(echo "$changed" | tr '\n' ';')"
echo "$changed" | grep -qx "Install dbcage from the copied package" || fail "run 1 did not install the package"
systemctl is-active --quiet dbcage || fail "dbcage is not active after run 1"
systemctl is-enabled --quiet dbcage || fail "dbcage is not enabled after run 1"
[ "$(kernel_cpu_max)" = "50000 100000" ] || fail "cpu.max after run 1 is '$(kernel_cpu_max)', not '50000 100000'"
[ "$(cat "$(tenant_dir)/cpu.weight")" = 200 ] || fail "the drop-in's cpu.weight is not in force"
# A process the policy matches is placed.
bash -c 'exec -a dbcage-test-ansible-sleeper sleep 600' &
sleeper=$!
for i in $(seq 50); do placed $sleeper && break; sleep 0.2; done
placed $sleeper || fail "the sleeper was not placed: $(cat /proc/$sleeper/cgroup)"
pid1=$(main_pid)

# 2: the same again: nothing changes (idempotence), the daemon is neither reloaded nor restarted.
changed=$(apply 2) || fail "second run failed"
[ -z "$changed" ] || fail "run 2 changed: $changed"
[ "$(main_pid)" = "$pid1" ] || fail "run 2 restarted dbcage"
echo "run 2 changed nothing"

# 3: one limit changes: the policy is rewritten and dbcage reloaded (same process), nothing else.
reloads_before=$(journalctl -u dbcage --no-pager | grep -c "policy reloaded")
sed 's/cores: 0.5/cores: 0.25/' test/vars.yml > /root/vars-3.yml
changed=$(apply 3 -e @/root/vars-3.yml) || fail "third run failed"
echo "run 3 changed: $(echo "$changed" | tr '\n' ';')"
expected=$'Write the policy (validated by dbcage check before it replaces the old one)\nreload dbcage'
[ "$changed" = "$expected" ] || fail "run 3 changed more or less than the policy and a reload: $changed"
[ "$(main_pid)" = "$pid1" ] || fail "run 3 restarted dbcage instead of reloading it"
for i in $(seq 50); do [ "$(kernel_cpu_max)" = "25000 100000" ] && break; sleep 0.2; done
[ "$(kernel_cpu_max)" = "25000 100000" ] || fail "cpu.max after run 3 is '$(kernel_cpu_max)', not '25000 100000'"
reloads_after=$(journalctl -u dbcage --no-pager | grep -c "policy reloaded")
[ "$reloads_after" = $((reloads_before + 1)) ] || fail "expected one reload, the journal shows $((reloads_after - reloads_before))"
placed $sleeper || fail "the sleeper left its group"

# 4: a policy dbcage check refuses is not written: the run fails, the old file stays, no reload.
cp /etc/dbcage/dbcage.toml /root/policy-before
sed 's/cores: 0.5/cores: 0/' test/vars.yml > /root/vars-4.yml
if apply 4 -e @/root/vars-4.yml >/dev/null 2>&1; then fail "run 4 accepted cpu.cores = 0"; fi
cmp -s /etc/dbcage/dbcage.toml /root/policy-before || fail "run 4 replaced the policy with an invalid one"
[ "$(kernel_cpu_max)" = "25000 100000" ] || fail "cpu.max changed after the refused run 4"
grep -q "cpu.cores" run-4.log || fail "run 4's failure does not name cpu.cores: $(tail -5 run-4.log)"
echo "run 4 refused cpu.cores = 0 at the validate step: $(grep -o 'cpu.cores[^"]*' run-4.log | head -1)"

kill $sleeper
echo "ANSIBLE-ROLE: PASS"
echo "SDGUEST: END"
