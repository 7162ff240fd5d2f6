//! Compiles the IO latency eBPF program (src/iolat/bpf/iolat.bpf.c) with clang (through
//! libbpf-cargo, which supplies libbpf's headers); src/iolat/loader.rs embeds the object. The object carries CO-RE relocations, so the one binary
//! runs on any kernel with BTF; no kernel headers or vmlinux.h of the build host are used.

use std::path::PathBuf;

const SOURCE: &str = "src/iolat/bpf/iolat.bpf.c";

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let include = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"))
        .join("src/iolat/bpf");
    let mut builder = libbpf_cargo::SkeletonBuilder::new();
    builder.source(SOURCE).clang_args([
        std::ffi::OsString::from("-I"),
        include.into_os_string(),
        "-Wall".into(),
    ]);
    if let Some(clang) = std::env::var_os("DBCAGE_CLANG") {
        builder.clang(clang);
    }
    builder.obj(out.join("iolat.bpf.o"));
    if let Err(e) = builder.build() {
        panic!(
            "building the eBPF program {SOURCE}: {e:#}\n\
             It needs clang (apt-get install clang; or set DBCAGE_CLANG to a clang binary) and, \
             for the vendored libbpf, libelf-dev, zlib1g-dev and pkg-config."
        );
    }
    println!("cargo:rerun-if-changed=src/iolat/bpf");
    println!("cargo:rerun-if-env-changed=DBCAGE_CLANG");
}
