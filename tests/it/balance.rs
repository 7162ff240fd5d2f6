//! `io.split = "demand"`: the daemon moves a tenant's IO total to the disks that use it.
//! Three loop disks, a 12 MiB/s read total. Measured from the tenant's own counters
//! (v1 `blkio.throttle.io_service_bytes_recursive`, v2 `io.stat` of its `limited` leaf), while a
//! thread reads the three read-bps limits (v1 `blkio.throttle.read_bps_device`, v2 `io.max`) about every millisecond and checks that
//! their sum never exceeds the total and that no device is ever without a line (unlimited).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;

const TOTAL: u64 = 12 << 20;
const LOAD_TIMEOUT: Duration = Duration::from_secs(90);

struct Disks {
    disks: Vec<LoopDisk>,
    files: Vec<String>,
}

fn three_disks() -> Disks {
    let disks: Vec<LoopDisk> = (0..3).map(|_| LoopDisk::new(256)).collect();
    let files = disks
        .iter()
        .map(|d| d.fill("dbcage-test-read.dat", 64))
        .collect();
    Disks { disks, files }
}

fn policy(d: &Disks, name: &str, split: &str) -> String {
    let storage: Vec<String> = d
        .disks
        .iter()
        .map(|x| format!("\"{}\"", x.mount_str()))
        .collect();
    format!(
        "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"{}\" }}]\nstorage = [{}]\n\n[tenant.io]\nread_bps = \"12MiB\"\nsplit = \"{split}\"\n",
        name_rule(name),
        storage.join(", ")
    )
}

/// Reads the limits about every millisecond until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Sampled>,
}

/// What a `Sampler` saw.
#[derive(Debug, Default)]
struct Sampled {
    samples: usize,
    /// The largest sum of the three limits.
    max_sum: u64,
    /// How often the limits changed between two samples.
    changes: usize,
    /// Samples where a device had no limit line (that device was unlimited).
    unlimited: usize,
    /// The first such sample's lines.
    first_unlimited: Option<BTreeMap<String, u64>>,
}

impl Sampled {
    /// Fails, with the figures, when a device was ever unlimited or the sum ever exceeded the
    /// total.
    fn assert_within_total(&self) {
        assert!(
            self.unlimited == 0,
            "{} of {} samples had a device without a limit line (unlimited); first: {:?}",
            self.unlimited,
            self.samples,
            self.first_unlimited
        );
        assert!(
            self.max_sum <= TOTAL,
            "sum of limits {} > total {TOTAL}",
            self.max_sum
        );
    }
}

impl Sampler {
    fn start(leaf: PathBuf, devs: Vec<String>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut out = Sampled::default();
            let mut last: Option<Vec<u64>> = None;
            while !s.load(Ordering::Relaxed) {
                let l = read_bps_limits(&leaf);
                out.samples += 1;
                let vals: Vec<u64> = devs
                    .iter()
                    .map(|d| l.get(d).copied().unwrap_or(0))
                    .collect();
                if vals.contains(&0) {
                    out.unlimited += 1;
                    out.first_unlimited.get_or_insert(l);
                } else {
                    out.max_sum = out.max_sum.max(vals.iter().sum());
                    if last.as_ref().is_some_and(|p| *p != vals) {
                        out.changes += 1;
                    }
                    last = Some(vals);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            out
        });
        Sampler { stop, handle }
    }

    fn finish(self) -> Sampled {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().expect("sampler")
    }
}

/// Per-second read rates of `dev` (MiB/s) over `secs` seconds, sampled every 250 ms as 1 s
/// windows; returns (seconds since start, rate) pairs.
fn rates(leaf: &Path, dev: &str, secs: f64) -> Vec<(f64, f64)> {
    let start = Instant::now();
    let mut hist: Vec<(f64, u64)> = Vec::new();
    let mut out = Vec::new();
    while start.elapsed().as_secs_f64() < secs {
        let t = start.elapsed().as_secs_f64();
        let b = read_bytes(leaf).get(dev).copied().unwrap_or(0);
        hist.push((t, b));
        if let Some(&(t0, b0)) = hist.iter().rev().find(|(t0, _)| t - t0 >= 0.99) {
            out.push((t, (b - b0) as f64 / (t - t0) / (1 << 20) as f64));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    out
}

/// Removes the daemon's published decisions (`/run/dbcage/<root>.balance.json`) when dropped.
struct Published(PathBuf);

impl Drop for Published {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn published(t: &Tenancy) -> Published {
    Published(PathBuf::from(format!(
        "/run/dbcage/{}.balance.json",
        t.root
    )))
}

fn reader(name: &str, marker: &str, file: &str, secs: &str) -> Child {
    Child::ioload(
        name,
        &[
            "--marker",
            marker,
            "--duration",
            secs,
            "--bs",
            "65536",
            "read",
            file,
        ],
    )
}

#[test]
fn balance_demand_gives_one_busy_disk_the_total_and_equal_a_third() {
    if skip() {
        return;
    }
    let _m = measure_lock();
    let d = three_disks();
    let name = format!("ora_bal_{}", sid());
    let t = Tenancy::new("balance", &policy(&d, &name, "equal"));
    let marker = t.marker("db", "limited");
    let leaf = t.leaf_dir("blkio", "db", "limited");
    let devs: Vec<String> = d.disks.iter().map(|x| x.devnum()).collect();

    // equal: the baseline, a third of the total on the one busy disk
    let mut one = reader(&name, &marker, &d.files[0], "5");
    t.ok(&["apply"]);
    let r = one.load_result(LOAD_TIMEOUT);
    let equal = mib_per_s(&r);
    println!(
        "equal: one busy disk of 3 gets {equal:.2} MiB/s = {:.1}% of 12 MiB/s",
        equal / 12.0 * 100.0
    );
    assert_near("equal, one disk", equal, 4.0, 0.1, 0.1);

    // demand: the daemon follows the load
    t.set_policy(&policy(&d, &name, "demand"));
    let _published = published(&t);
    let daemon = Daemon::start(&t, &[]);
    let sampler = Sampler::start(leaf.clone(), devs.clone());
    let mut one = reader(&name, &marker, &d.files[0], "10");
    assert!(wait_until(Duration::from_secs(10), || procs_in(&leaf)
        .contains(&one.pid)));
    let start = Instant::now();
    let series = rates(&leaf, &devs[0], 9.0);
    let r = one.load_result(LOAD_TIMEOUT);
    let sampled = sampler.finish();
    let Sampled {
        samples,
        max_sum,
        changes,
        ..
    } = sampled;
    let reached = series
        .iter()
        .find(|(_, r)| *r >= 0.95 * 12.0)
        .map(|(t, _)| *t);
    let tail: Vec<f64> = series
        .iter()
        .filter(|(t, _)| *t >= 5.0)
        .map(|x| x.1)
        .collect();
    let tail_avg = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
    println!(
        "demand: one busy disk reaches 95% of the total after {reached:?} s (since placed, {:.1} s ago); last 4 s {tail_avg:.2} MiB/s = {:.1}%; whole run {:.2} MiB/s; limits sampled {samples} times, max sum {max_sum} (total {TOTAL}), {changes} changes",
        start.elapsed().as_secs_f64(),
        tail_avg / 12.0 * 100.0,
        mib_per_s(&r)
    );
    let status = t.json(&["status", "--json"]);
    let dev0 = status["tenants"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["device"] == devs[0].as_str())
        .cloned()
        .unwrap_or_default();
    println!("status of the busy disk: {}", dev0["balance"]);
    assert_eq!(
        dev0["balance"]["read_bps"]["reason"], "demand",
        "{status:#}"
    );
    assert!(samples > 1000, "only {samples} samples");
    sampled.assert_within_total();
    assert!(reached.is_some_and(|s| s <= 4.0), "{series:?}");
    assert!(tail_avg >= 0.95 * 12.0, "{series:?}");

    // A stopped daemon takes its published shares with it; the limits stay in the kernel.
    let kept = read_bps_limits(&leaf);
    drop(daemon);
    assert!(
        !_published.0.exists(),
        "{} outlived the daemon",
        _published.0.display()
    );
    let status = t.json(&["status", "--json"]);
    assert!(
        status["tenants"][0]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["balance"].is_null()),
        "status still shows balance decisions: {status:#}"
    );
    assert_eq!(
        read_bps_limits(&leaf),
        kept,
        "the limits changed when the daemon stopped"
    );
}

#[test]
fn balance_redistribution_never_exceeds_the_total() {
    if skip() {
        return;
    }
    let _m = measure_lock();
    let d = three_disks();
    let name = format!("ora_bal_{}", sid());
    let t = Tenancy::new("balmove", &policy(&d, &name, "demand"));
    let marker = t.marker("db", "limited");
    let leaf = t.leaf_dir("blkio", "db", "limited");
    let devs: Vec<String> = d.disks.iter().map(|x| x.devnum()).collect();
    let _published = published(&t);
    let _daemon = Daemon::start(&t, &[]);
    let sampler = Sampler::start(leaf.clone(), devs.clone());
    // the load moves A → B → C → A every 4 s
    let mut last_limits = Vec::new();
    for (i, disk) in [0usize, 1, 2, 0].into_iter().enumerate() {
        let mut r = reader(&name, &marker, &d.files[disk], "4");
        let res = r.load_result(LOAD_TIMEOUT);
        let l = read_bps_limits(&leaf);
        let on: u64 = l.get(&devs[disk]).copied().unwrap_or(0);
        println!(
            "phase {i}: load on disk {disk}: {:.2} MiB/s; its limit at the end {:.2} MiB/s",
            mib_per_s(&res),
            on as f64 / (1 << 20) as f64
        );
        last_limits.push(on);
    }
    let sampled = sampler.finish();
    let Sampled {
        samples,
        max_sum,
        changes,
        unlimited,
        ..
    } = sampled;
    println!(
        "limits sampled {samples} times, {changes} changes, max sum {max_sum} (total {TOTAL}), {unlimited} samples with a device unlimited"
    );
    sampled.assert_within_total();
    assert!(samples > 5000, "only {samples} samples");
    assert!(changes >= 4, "the limits did not move ({changes} changes)");
    assert!(
        last_limits.iter().all(|l| *l as f64 >= 0.9 * TOTAL as f64),
        "{last_limits:?}"
    );
}
