#!/usr/bin/env bash
# Installs what dbcage needs, builds it, and runs it on examples/dbcage.toml against this host:
# check, plan, apply, a throttled reader in tenant DEMO measured through `status`, then release.
# Run as root. Leaves nothing behind (the demo groups are released at the end).
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1; }
if ! need cargo; then
  echo "cargo is missing: install Rust (https://rustup.rs) or Debian's cargo package" >&2
  exit 1
fi
[ "$(id -u)" = 0 ] || { echo "run as root: dbcage writes cgroups" >&2; exit 1; }
# shellcheck source=scripts/build-deps.sh
. scripts/build-deps.sh
missing=()
need python3 || missing+=(python3)
add_missing_build_deps
apt_install "${missing[@]}"

cargo build --release --quiet
bin=$PWD/target/release/dbcage
# dbcage reads only policies that root owns and nobody else may write (a checkout may be a
# user's): run on a root-owned copy.
policy_dir=$(mktemp -d /tmp/dbcage-demo.XXXXXX)
policy=$policy_dir/dbcage.toml
install -m 0600 examples/dbcage.toml "$policy"
data=/var/tmp/dbcage-demo.dat
reader=""

cleanup() {
  [ -n "$reader" ] && kill "$reader" 2>/dev/null && wait "$reader" 2>/dev/null
  "$bin" -c "$policy" release --all >/dev/null 2>&1 || true
  rm -f "$data"
  rm -rf "$policy_dir"
}
trap cleanup EXIT

echo "== dbcage check"
"$bin" -c "$policy" check
echo
echo "== a reader that looks like an Oracle parallel slave of DEMO (O_DIRECT reads)"
dd if=/dev/zero of="$data" bs=1M count=512 oflag=direct status=none
# the reader rereads the file until stopped; dd children inherit its group
bash -c "exec -a ora_p001_DEMO bash -c 'while :; do dd if=$data of=/dev/null bs=1M iflag=direct status=none; done'" &
reader=$!
echo
echo "== dbcage plan"
"$bin" -c "$policy" plan
echo
echo "== dbcage apply"
"$bin" -c "$policy" apply
echo
echo "== dbcage apply (again: nothing to do)"
"$bin" -c "$policy" apply
echo
echo "== measured: DEMO's read rate as status measures it, over 3 s (limit 50 MiB/s)"
# status samples the counters twice, --interval apart, and divides by the time between its own
# samples. (Dividing two separate status calls' counters by 3 s overstated the rate by a third:
# each call also waits its default 1 s interval.) It starts 1 s after apply: the reader's first
# reads under the new limit come in a slice of their own.
sleep 1
"$bin" -c "$policy" status DEMO --json --interval 3s |
  python3 -c 'import json,sys; r=json.load(sys.stdin)["tenants"][0]["io"]["rates"]["read_bytes_per_second"]; print(f"DEMO read {r/1048576:.1f} MiB/s")'
echo
echo "== dbcage status -v"
"$bin" -c "$policy" status -v
echo
echo "== dbcage release --all"
kill "$reader" 2>/dev/null || true; wait "$reader" 2>/dev/null || true; reader=""
"$bin" -c "$policy" release --all
