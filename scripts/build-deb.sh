#!/usr/bin/env bash
# Builds the Debian package of dbcage: release binary, man pages (dbcage(8) and one per
# subcommand, generated from the CLI definition; dbcage.toml(5) from man/), bash/zsh/fish
# completions, then `cargo deb`. Prints the path of the .deb on the last line.
# Needs cargo-deb: `cargo install cargo-deb --locked` (installed here when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo deb --version >/dev/null 2>&1; then
  echo "installing cargo-deb (cargo install cargo-deb --locked; a few minutes)" >&2
  cargo install cargo-deb --locked --quiet >&2
fi
command -v gzip >/dev/null || { echo "build-deb.sh: gzip is missing" >&2; exit 1; }
# The eBPF program (src/iolat/bpf/) is compiled by clang; libbpf needs libelf and zlib headers.
for need in clang pkg-config /usr/include/libelf.h /usr/include/zlib.h; do
  command -v "$need" >/dev/null 2>&1 || [ -e "$need" ] || {
    echo "build-deb.sh: $need is missing: apt-get install clang pkg-config libelf-dev zlib1g-dev" >&2
    exit 1
  }
done

cargo build --release --quiet >&2
out=target/dbcage-deb
rm -rf "$out"
mkdir -p "$out/man8" "$out/man5" "$out/completions"
target/release/dbcage generate-man "$out/man8" >/dev/null
target/release/dbcage generate-completions "$out/completions" >/dev/null
cp man/dbcage.toml.5 "$out/man5/"
# -n: no name or timestamp in the gzip header, so the package builds reproducibly.
gzip -9n "$out"/man8/*.8 "$out"/man5/*.5

deb=$(cargo deb --no-build --strip --quiet 2>&1 | tail -n 1)
case "$deb" in
  *.deb) [ -f "$deb" ] || { echo "build-deb.sh: cargo deb reported $deb, which does not exist" >&2; exit 1; } ;;
  *) echo "build-deb.sh: cargo deb failed: $deb" >&2; exit 1 ;;
esac
echo "$deb"
