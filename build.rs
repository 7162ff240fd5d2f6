//! Compiles the eBPF programs with clang (through libbpf-cargo, which supplies libbpf's
//! headers): the IO latency histograms (src/iolat/bpf/iolat.bpf.c, embedded by
//! src/iolat/loader.rs) and the task iterator (src/inventory/bpf/tasks.bpf.c, embedded by
//! src/inventory/tasks.rs). The objects carry CO-RE relocations, so the one binary
//! runs on any kernel with BTF; no kernel headers or vmlinux.h of the build host are used.

use std::path::PathBuf;

/// (source, object in OUT_DIR). Both include src/iolat/bpf/kernel_types.h.
const PROGRAMS: [(&str, &str); 2] = [
    ("src/iolat/bpf/iolat.bpf.c", "iolat.bpf.o"),
    ("src/inventory/bpf/tasks.bpf.c", "tasks.bpf.o"),
];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let include = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"))
        .join("src/iolat/bpf");
    for (source, object) in PROGRAMS {
        let mut builder = libbpf_cargo::SkeletonBuilder::new();
        builder.source(source).clang_args([
            std::ffi::OsString::from("-I"),
            include.clone().into_os_string(),
            "-Wall".into(),
        ]);
        if let Some(clang) = std::env::var_os("DBCAGE_CLANG") {
            builder.clang(clang);
        }
        builder.obj(out.join(object));
        if let Err(e) = builder.build() {
            panic!(
                "building the eBPF program {source}: {e:#}\n\
                 It needs clang (apt-get install clang; or set DBCAGE_CLANG to a clang binary) \
                 and, for the vendored libbpf, libelf-dev, zlib1g-dev and pkg-config."
            );
        }
    }
    println!("cargo:rerun-if-changed=src/iolat/bpf");
    println!("cargo:rerun-if-changed=src/inventory/bpf");
    println!("cargo:rerun-if-env-changed=DBCAGE_CLANG");
}
