# What building dbcage needs on Debian, for scripts/demo.sh and scripts/test.sh (sourced, not
# run): clang compiles the eBPF program (src/iolat/bpf/); libbpf, vendored by libbpf-sys, needs a
# C compiler, libelf, zlib, pkg-config and make. Without them a fresh machine's first `cargo
# build` stops in libbpf-sys's build script ("libelf.h: No such file or directory").

# Appends the Debian packages of what is missing to the array `missing`.
add_missing_build_deps() {
  local pair
  for pair in cc:gcc clang:clang pkg-config:pkg-config make:make; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
  done
  [ -e /usr/include/libelf.h ] || missing+=(libelf-dev)
  [ -e /usr/include/zlib.h ] || missing+=(zlib1g-dev)
}

# Installs the given Debian packages with apt (nothing when none is given).
apt_install() {
  [ $# -gt 0 ] || return 0
  echo "installing: $*"
  DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null
}
