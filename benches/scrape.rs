//! Cost of one metrics scrape (and of one `status` sample, the same reader) with 50 tenants
//! over 8 devices each, on the real kernel: `cargo bench --bench scrape` (root, cgroup v1 or v2).
//!
//! It attaches 8 loop devices (sparse `dbcage-test` files), applies a policy of 50 tenants whose
//! storage is all 8 devices with read and write limits, renders the exposition 200 times, and
//! reports the time per scrape (p50, p99, max) and the heap allocated per scrape (a counting
//! allocator). Everything is released and detached at the end, also on panic and on SIGINT,
//! SIGTERM and SIGHUP (`common::trap_signals`).

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use dbcage::cgroup::{Layout, Setup};
use dbcage::hostfs::HostFs;
use dbcage::inventory::MountTable;
use dbcage::metrics::{render_as, Format, Shared};

mod common;

struct Counting;
static ALLOCATED: AtomicU64 = AtomicU64::new(0);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: AllocLayout) -> *mut u8 {
        ALLOCATED.fetch_add(l.size() as u64, Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: AllocLayout) {
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const TENANTS: usize = 50;
const DEVICES: usize = 8;
const SCRAPES: usize = 200;

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the scrape benchmark needs root");
        return;
    }
    common::trap_signals("scrape");
    // Each thing made is removed when its guard drops (the last made first), or at a signal.
    let dir = tempfile::Builder::new()
        .prefix("dbcage-test-scrape-")
        .tempdir()
        .unwrap();
    let path = dir.path().to_path_buf();
    let _remove_dir = common::on_exit(move || drop(dir));
    let policy_file = path.join("dbcage.toml");
    let mut loops = Vec::new();
    let mut _detach = Vec::new();
    for i in 0..DEVICES {
        let img = path.join(format!("dbcage-test-{i}.img"));
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(64 << 20))
            .unwrap();
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&img)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let detached = dev.clone();
        // Dropped in the order made: detached after the groups are released.
        _detach.insert(
            0,
            common::on_exit(move || {
                let _ = Command::new("losetup").args(["-d", &detached]).output();
            }),
        );
        loops.push(dev);
    }
    let storage = loops
        .iter()
        .map(|l| format!("\"{l}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let mut policy = format!(
        "[agent]\nparent = \"self\"\nroot = \"dbcage-test-scrape-{}\"\n",
        std::process::id()
    );
    for t in 0..TENANTS {
        policy.push_str(&format!(
            "\n[[tenant]]\nname = \"t{t:02}\"\nmatch = [{{ cmdline = \"^dbcage-test-nothing-{t}$\" }}]\nstorage = [{storage}]\n[tenant.io]\nread_bps = \"80MiB\"\nwrite_iops = 800\n[tenant.cpu]\ncores = 1\n[tenant.memory]\nmax = \"1GiB\"\n"
        ));
    }
    std::fs::write(&policy_file, &policy).unwrap();
    let released = policy_file.clone();
    let _release = common::on_exit(move || {
        let _ = Command::new(env!("CARGO_BIN_EXE_dbcage"))
            .arg("-c")
            .arg(&released)
            .args(["release", "--all"])
            .output();
    });
    let out = Command::new(env!("CARGO_BIN_EXE_dbcage"))
        .arg("-c")
        .arg(&policy_file)
        .arg("apply")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let fs = HostFs::default();
    let loaded = dbcage::policy::load(&policy_file, &dbcage::policy::SystemAccounts).unwrap();
    let setup = Setup::detect(&fs, &MountTable::read(&fs).unwrap()).unwrap();
    let layout = Layout::new(setup, &loaded.policy.agent).unwrap();
    let shared = Arc::new(Shared::new(fs, loaded.policy, layout));

    // Both formats: the text format 0.0.4 (the default) and OpenMetrics (what Prometheus asks for).
    for format in [Format::OpenMetrics, Format::Text004] {
        let first = render_as(&shared, format);
        let series = first.lines().filter(|l| !l.starts_with('#')).count();
        let mut times = Vec::with_capacity(SCRAPES);
        let (bytes0, count0) = (
            ALLOCATED.load(Ordering::Relaxed),
            ALLOCATIONS.load(Ordering::Relaxed),
        );
        for _ in 0..SCRAPES {
            let start = Instant::now();
            let text = render_as(&shared, format);
            times.push(start.elapsed());
            std::hint::black_box(text);
        }
        let bytes = (ALLOCATED.load(Ordering::Relaxed) - bytes0) / SCRAPES as u64;
        let count = (ALLOCATIONS.load(Ordering::Relaxed) - count0) / SCRAPES as u64;
        times.sort();
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{format:?} scrape of {TENANTS} tenants x {DEVICES} devices ({series} series, {} bytes of text): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {SCRAPES} scrapes; {count} allocations, {:.0} KiB allocated per scrape",
            first.len(),
            ms(times[SCRAPES / 2]),
            ms(times[SCRAPES * 99 / 100]),
            ms(times[SCRAPES - 1]),
            bytes as f64 / 1024.0
        );
        println!(
            "{{\"format\":\"{format:?}\",\"tenants\":{TENANTS},\"devices\":{DEVICES},\"series\":{series},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"max_ms\":{:.3},\"allocations\":{count},\"allocated_bytes\":{bytes}}}",
            ms(times[SCRAPES / 2]),
            ms(times[SCRAPES * 99 / 100]),
            ms(times[SCRAPES - 1])
        );
    }
}
