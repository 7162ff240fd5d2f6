//! Cost of the daemon's full process scan (its safety net, run every 30 s and after lost
//! events) on the real host: `cargo bench --bench scan -- [--procs N] [--runs R]`.
//!
//! With `--procs N` (default 10,000) it first starts that many `sleep` processes of its own
//! (in one process group it ends by PID when done, also on panic), so the host holds about N
//! more processes; then it scans /proc `--runs` times (default 20) for each set of fields the
//! rules may need (see `procs::Fields`: cmdline and comm only; plus ppid for `descendants`;
//! plus the systemd unit for `unit =`; everything) and prints wall time min/p50/max, processes read, and CPU time per scan
//! (CLOCK_PROCESS_CPUTIME_ID: both reader threads included).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dbcage::hostfs::HostFs;
use dbcage::inventory::procs::{scan_fields, Fields};

struct Sleepers(Vec<Child>);

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

/// CPU time of this process, all threads (CLOCK_PROCESS_CPUTIME_ID).
fn cpu_time() -> Duration {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .expect("clock_gettime");
    Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32)
}

fn main() {
    let mut procs = 10_000usize;
    let mut runs = 20usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--procs" => procs = args.next().and_then(|v| v.parse().ok()).expect("--procs N"),
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).expect("--runs R"),
            "--bench" => {}
            "--help" | "-h" => {
                println!("cargo bench --bench scan -- [--procs N (10000)] [--runs R (20)]");
                return;
            }
            other => panic!("unknown argument {other}"),
        }
    }
    let mut sleepers = Sleepers(Vec::with_capacity(procs));
    for _ in 0..procs {
        match Command::new("sleep")
            .arg("600")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
        {
            Ok(c) => sleepers.0.push(c),
            Err(e) => {
                eprintln!("started {} sleepers, then: {e}", sleepers.0.len());
                break;
            }
        }
    }
    let fs = HostFs::default();
    let sets = [
        (
            "cmdline (no comm rule)",
            Fields {
                ids: false,
                exe: false,
                tree: false,
                comm: false,
                unit: false,
            },
        ),
        (
            "cmdline+comm",
            Fields {
                ids: false,
                exe: false,
                tree: false,
                comm: true,
                unit: false,
            },
        ),
        (
            "+ppid (descendants)",
            Fields {
                ids: false,
                exe: false,
                tree: true,
                comm: true,
                unit: false,
            },
        ),
        (
            "cmdline+comm+unit",
            Fields {
                ids: false,
                exe: false,
                tree: false,
                comm: true,
                unit: true,
            },
        ),
        ("all (uid/gid, exe)", Fields::ALL),
    ];
    println!(
        "scan of /proc, {} extra sleepers, {runs} runs per field set",
        sleepers.0.len()
    );
    println!(
        "{:<22} {:>8} {:>9} {:>9} {:>9} {:>10}",
        "fields", "procs", "min ms", "p50 ms", "max ms", "cpu ms"
    );
    for (label, fields) in sets {
        let mut walls = Vec::with_capacity(runs);
        let mut n = 0;
        let cpu0 = cpu_time();
        for _ in 0..runs {
            let t = Instant::now();
            let got = scan_fields(&fs, fields).expect("scan /proc");
            walls.push(t.elapsed());
            n = got.len();
        }
        let cpu = (cpu_time() - cpu0) / runs as u32;
        walls.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{label:<22} {n:>8} {:>9.1} {:>9.1} {:>9.1} {:>10.1}",
            ms(walls[0]),
            ms(walls[walls.len() / 2]),
            ms(walls[walls.len() - 1]),
            ms(cpu)
        );
    }
}
