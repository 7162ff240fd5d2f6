//! Integration tests against the real kernel: dbcage builds cgroups under the test process's
//! own cgroups, places processes the tests start, and the tests measure what the kernel then
//! does (IO throughput, IOPS, cpu time, OOM kills).
//!
//! They need root, and the tools scripts/test.sh installs. They run on the host's own cgroup
//! version: the v1 controllers where they are mounted, else cgroup v2, where the test process
//! must start alone in a cgroup of its own, which it makes the tests' delegated parent
//! (`common::cgroups`; tests/sdguest/it.sh runs them so in a Debian 12 systemd guest). A test
//! that cannot run here fails and names what it could not run, unless tests/it/skips.rs
//! declares that skip (with a reason a user would accept); each skip is also recorded in
//! `target/tmp/it-skips.tsv`, which scripts/test.sh lists after the run. Run them with `cargo test --test it -- --test-threads=2 --nocapture` to see the
//! measured figures. Everything they create has `dbcage-test` in its name and is removed by
//! guards even when a test fails (see `common`).

mod balance;
mod common;
mod control;
mod cpu_mem;
mod daemon;
mod import;
mod iolat;
mod lifecycle;
mod mysql;
mod observe;
mod package;
mod pg;
mod pg_bench;
mod pg_repl;
mod postgres;
mod presets;
mod probe;
mod service_caps;
mod skips;
mod throttle;
mod web;
