//! `dbcage probe` against fio on the same loop device and file, `dbcage verify` on a throttled
//! tenant, Ctrl-C, the plot, and every bad input (each with exit 2 and nothing written).
//!
//! A loop device over a file on this host's (virtual) disk is fast and noisy: back-to-back runs
//! of fio alone differ by 2x. So the fio comparison runs both tools inside one tenant whose
//! blkio throttle makes the device steady, each started with `dbcage exec` into the same
//! `limited` leaf, with the same settings (direct=1, ioengine=psync, numjobs=N threads, bs, rw,
//! runtime, and a 1 s warm-up that neither counts: fio's ramp_time, dbcage's --ramp, so that
//! the throttle's initial burst is left out of both).

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn probe(args: &[&str]) -> Output {
    Command::new(DBCAGE)
        .arg("probe")
        .args(args)
        .env_remove("DBCAGE_CONFIG")
        .output()
        .expect("run dbcage probe")
}

/// Asserts exit 2 and that stderr contains every one of `needles`; returns stderr.
fn bad(args: &[&str], needles: &[&str]) -> String {
    let out = probe(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(2),
        "probe {args:?} should fail with exit 2; stdout: {} stderr: {err}",
        String::from_utf8_lossy(&out.stdout)
    );
    for n in needles {
        assert!(err.contains(n), "probe {args:?}: `{n}` not in: {err}");
    }
    println!("probe {args:?} -> {}", err.trim());
    err
}

fn have_fio() -> bool {
    Command::new("fio")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The one step of a `probe --json` run: (IOPS, MiB/s, mean latency in µs).
fn dbcage_figures(json: &serde_json::Value) -> (f64, f64, f64) {
    let s = &json["steps"][0];
    (
        s["iops"].as_f64().unwrap(),
        s["mib_s"].as_f64().unwrap(),
        s["latency_us"]["mean"].as_f64().unwrap(),
    )
}

/// fio's JSON, group-reported: (IOPS, MiB/s, mean completion latency in µs) of reads.
fn fio_figures(json: &serde_json::Value) -> (f64, f64, f64) {
    let r = &json["jobs"][0]["read"];
    (
        r["iops"].as_f64().unwrap(),
        r["bw_bytes"].as_f64().unwrap() / (1 << 20) as f64,
        r["clat_ns"]["mean"].as_f64().unwrap() / 1000.0,
    )
}

fn within(what: &str, ours: f64, theirs: f64, tol: f64) {
    let dev = (ours - theirs) / theirs;
    assert!(
        dev.abs() <= tol,
        "{what}: dbcage {ours:.2}, fio {theirs:.2} ({:+.1}%, allowed ±{:.0}%)",
        dev * 100.0,
        tol * 100.0
    );
}

/// Runs `args` (dbcage probe or fio) inside tenant `db` of `t`, or directly without one, and
/// parses its JSON output.
fn run_json(t: Option<&Tenancy>, args: &[&str]) -> serde_json::Value {
    match t {
        Some(t) => t.json(&[&["exec", "db", "--"], args].concat()),
        None => {
            let out = Command::new(args[0])
                .args(&args[1..])
                .env_remove("DBCAGE_CONFIG")
                .output()
                .unwrap_or_else(|e| panic!("run {}: {e}", args[0]));
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e})"))
        }
    }
}

/// IOPS, MiB/s, mean latency in µs.
type Figures = (f64, f64, f64);

/// What to measure: the same settings for dbcage probe and fio.
struct Job<'a> {
    target: &'a str,
    rw: &'a str,
    bs: &'a str,
    jobs: usize,
    /// More fio options (how the jobs split a file).
    extra: &'a [&'a str],
    secs: u64,
    /// Run both under this (e.g. `chrt -f 10`).
    wrapper: &'a [&'a str],
}

impl Job<'_> {
    fn probe_args(&self) -> Vec<String> {
        let mut a: Vec<String> = self.wrapper.iter().map(|s| s.to_string()).collect();
        a.extend(
            [
                DBCAGE,
                "probe",
                self.target,
                "--rw",
                self.rw,
                "--bs",
                self.bs,
                "--jobs",
                &self.jobs.to_string(),
                "--step-time",
                &format!("{}s", self.secs),
                "--ramp",
                "1s",
                "--json",
            ]
            .map(String::from),
        );
        a
    }

    fn fio_args(&self) -> Vec<String> {
        let mut a: Vec<String> = self.wrapper.iter().map(|s| s.to_string()).collect();
        a.extend([
            "fio".to_string(),
            "--name=dbcage-test".into(),
            format!("--filename={}", self.target),
            "--direct=1".into(),
            "--ioengine=psync".into(),
            "--thread".into(),
            format!("--numjobs={}", self.jobs),
            format!("--rw={}", self.rw),
            format!("--bs={}", self.bs),
            format!("--runtime={}", self.secs),
            "--ramp_time=1".into(),
            "--time_based".into(),
            "--group_reporting".into(),
            "--output-format=json".into(),
        ]);
        a.extend(self.extra.iter().map(|s| s.to_string()));
        a
    }

    /// dbcage's figures, inside tenant `db` of `t` or without a tenant.
    fn ours(&self, t: Option<&Tenancy>) -> Figures {
        let args = self.probe_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        dbcage_figures(&run_json(t, &args))
    }

    /// fio's figures, the same way.
    fn theirs(&self, t: Option<&Tenancy>) -> Figures {
        let args = self.fio_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fio_figures(&run_json(t, &args))
    }
}

/// Runs fio and dbcage probe with the same settings inside tenant `db` and compares them.
fn compare(t: &Tenancy, what: &str, target: &str, rw: &str, bs: &str, jobs: usize, extra: &[&str]) {
    let secs = 3;
    let job = Job {
        target,
        rw,
        bs,
        jobs,
        extra,
        secs,
        wrapper: &[],
    };
    let (oi, om, ol) = job.ours(Some(t));
    let (fi, fm, fl) = job.theirs(Some(t));
    println!(
        "{what} ({rw} bs={bs} numjobs={jobs} {secs}s): dbcage {oi:.0} IOPS {om:.2} MiB/s mean {ol:.0}us | fio {fi:.0} IOPS {fm:.2} MiB/s mean clat {fl:.0}us"
    );
    within(&format!("{what} IOPS"), oi, fi, 0.10);
    within(&format!("{what} MiB/s"), om, fm, 0.10);
    within(&format!("{what} mean latency"), ol, fl, 0.15);
}

#[test]
fn probe_agrees_with_fio_on_a_loop_device_and_a_file() {
    if skip() {
        return;
    }
    if !have_fio() {
        cannot_run("needs fio (scripts/test.sh installs it)");
        return;
    }
    let _m = measure_lock();
    let disk = LoopDisk::new(512);
    let file = disk.fill("dbcage-test-probe.dat", 128);
    let t = Tenancy::new(
        "probe-fio",
        &format!(
            "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"{}\" }}]\nstorage = [\"{}\"]\n\n[tenant.io]\nread_iops = 1200\nread_bps = \"24MiB\"\n",
            name_rule(&format!("dbcage-test-none-{}", sid())),
            disk.mount_str()
        ),
    );
    // Random 4k reads of the whole device: the IOPS limit binds (1200 x 4k = 4.7 MiB/s).
    compare(&t, "loop device", disk.dev(), "randread", "4k", 4, &[]);
    // Sequential 64k reads of a file, each job in its own half as dbcage's workers are: the
    // bytes limit binds (24 MiB/s = 384 IOPS).
    compare(
        &t,
        "file",
        &file,
        "read",
        "64k",
        2,
        &["--size=64m", "--offset_increment=64m"],
    );
}

/// Without any limit: 4 KiB random reads at depth 1 of a 128 MiB file on this host's disk
/// (where the issue saw 33,240 vs 29,165 IOPS, 14% apart, in one run). Measured alone, either
/// tool swings by 3x from run to run on a loaded 2-core host, so both run under SCHED_FIFO
/// (`chrt -f 10`: the IO path, not the wait for a cpu, is measured; at depth 1 they sleep on
/// each IO and cannot starve the host) in three fio, probe, probe, fio rounds (drift between
/// rounds cancels); the median of the rounds' dbcage/fio ratios must be within 20% for IOPS and
/// mean latency. One retry before failing.
#[test]
fn probe_agrees_with_fio_without_a_limit() {
    if skip() {
        return;
    }
    if !have_fio() {
        cannot_run("needs fio (scripts/test.sh installs it)");
        return;
    }
    let _m = measure_lock();
    let dir = tempfile::Builder::new()
        .prefix("dbcage-test-probe-")
        .tempdir()
        .unwrap();
    let file = dir.path().join("dbcage-test-probe.dat");
    let ok = Command::new("dd")
        .arg("if=/dev/urandom")
        .arg(format!("of={}", file.display()))
        .args(["bs=1M", "count=128", "oflag=direct", "status=none"])
        .status()
        .unwrap();
    assert!(ok.success(), "dd wrote no test file");
    let job = Job {
        target: file.to_str().unwrap(),
        rw: "randread",
        bs: "4k",
        jobs: 1,
        extra: &[],
        secs: 1,
        wrapper: &["chrt", "-f", "10"],
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let attempt = || -> Result<String, String> {
        let mut rounds = Vec::new();
        for _ in 0..3 {
            let f1 = job.theirs(None);
            let (o1, o2) = (job.ours(None), job.ours(None));
            let f2 = job.theirs(None);
            rounds.push((
                (o1.0 + o2.0) / (f1.0 + f2.0),
                (o1.2 + o2.2) / (f1.2 + f2.2),
                o1,
                f1,
            ));
        }
        let iops = median(rounds.iter().map(|r| r.0).collect());
        let lat = median(rounds.iter().map(|r| r.1).collect());
        let text = format!(
            "no limit, randread 4k depth 1, median dbcage/fio of 3 rounds: IOPS x{iops:.3}, mean latency x{lat:.3}; rounds (IOPS ratio, latency ratio, first probe, first fio): {rounds:.2?}"
        );
        if (iops - 1.0).abs() <= 0.20 && (lat - 1.0).abs() <= 0.20 {
            Ok(text)
        } else {
            Err(text)
        }
    };
    let result = attempt().or_else(|first| {
        println!("{first}\nretrying once");
        attempt().map_err(|second| format!("{first}\nretry: {second}"))
    });
    match result {
        Ok(text) => println!("{text}"),
        Err(text) => panic!("dbcage probe and fio disagree without a limit (allowed: IOPS and latency ±20%):\n{text}"),
    }
}

#[test]
fn verify_reports_a_throttled_tenants_limits() {
    if skip() {
        return;
    }
    let _m = measure_lock();
    let disk = LoopDisk::new(512);
    let t = Tenancy::new(
        "verify",
        &format!(
            "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"{}\" }}]\nstorage = [\"{}\"]\n\n[tenant.io]\nread_bps = \"16MiB\"\nread_iops = 800\nwrite_bps = \"8MiB\"\n",
            name_rule(&format!("dbcage-test-none-{}", sid())),
            disk.mount_str()
        ),
    );
    let wfile = disk.mount.join("dbcage-test-verify.dat");
    let w = wfile.to_string_lossy().into_owned();
    let r = t.json(&[
        "verify",
        "db",
        "--step-time",
        "3s",
        "--write",
        &w,
        "--write-size",
        "64MiB",
        "--json",
    ]);
    let checks = r["checks"].as_array().expect("checks");
    let kinds: Vec<&str> = checks
        .iter()
        .map(|c| c["limit"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["read_bps", "read_iops", "write_bps"], "{r:#}");
    for c in checks {
        println!(
            "verify {} {}: configured {} achieved {:.0} ({:+.1}%) with {} bs {} x{}",
            c["name"],
            c["limit"],
            c["configured"],
            c["achieved"].as_f64().unwrap_or(0.0),
            c["deviation"].as_f64().unwrap_or(f64::NAN) * 100.0,
            c["rw"],
            c["bs"],
            c["parallelism"]
        );
        assert_eq!(c["device"], disk.devnum().as_str());
        assert_eq!(c["pass"], true, "{c:#}");
        assert!(c["deviation"].as_f64().unwrap().abs() <= 0.10, "{c:#}");
    }
    assert_eq!(checks[0]["configured"], 16 << 20);
    assert_eq!(checks[2]["target"], w.as_str());
    // The probe ran inside the tenant: the limited leaf's counters saw its reads and writes.
    let status = t.json(&["status", "--json"]);
    let dev = &status["tenants"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == disk.devnum().as_str())
        .cloned()
        .expect("device in status");
    assert!(dev["read_bytes"].as_u64().unwrap() > 40 << 20, "{dev:#}");
    assert!(dev["write_bytes"].as_u64().unwrap() > 16 << 20, "{dev:#}");

    // Without --write, the write limit is listed as not checked; text output has the table.
    // (Pass or fail is asserted above on 3 s steps; 1 s ones are too short to hold ±10%.)
    let out = t.run(&["verify", "db", "--step-time", "1s"]);
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{out}");
    assert!(
        out.contains("configured") && out.contains("read_bps"),
        "{out}"
    );
    assert!(
        out.contains("16.00MiB/s") && out.contains("800 IO/s"),
        "{out}"
    );
    assert!(out.contains("write_bps: not checked"), "{out}");
}

#[test]
fn probe_a_new_file_with_histogram_plot_and_json() {
    if skip() {
        return;
    }
    let _m = measure_lock();
    let disk = LoopDisk::new(256);
    let f = disk.mount.join("dbcage-test-new.dat");
    let fs = f.to_string_lossy().into_owned();
    let svg = disk.mount.join("dbcage-test.svg");
    let svg_s = svg.to_string_lossy().into_owned();
    let out = probe(&[
        &fs,
        "--size",
        "32MiB",
        "--bs",
        "4k,64k",
        "--jobs-max",
        "2",
        "--step-time",
        "300ms",
        "--histogram",
        "--plot",
        &svg_s,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    // LoopDisk's loop device reads its image through the page cache: said, on stderr.
    let err = String::from_utf8_lossy(&out.stderr);
    let loop_name = disk.dev().trim_start_matches("/dev/");
    assert!(
        err.contains(&format!(
            "warning: {loop_name} reads {} through the page cache (/sys/block/{loop_name}/loop/dio is 0)",
            disk.dir.path().join("dbcage-test.img").display()
        )),
        "{err}"
    );
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 32 << 20);
    // Written through, not fallocated: the file has real blocks.
    assert!(std::fs::metadata(&f).unwrap().blocks() * 512 >= 32 << 20);
    assert!(text.contains(
        "RANGE {min ≤ e < max}  DURATION (s)       %   CALLS  MEAN (ms)   MIN (ms)   MAX (ms)"
    ));
    assert_eq!(text.matches("TOTAL (14)").count(), 4, "{text}");
    assert!(
        text.contains("knee at bs 4k") && text.contains("knee at bs 64k"),
        "{text}"
    );
    let plot = std::fs::read_to_string(&svg).expect("plot written");
    assert!(
        plot.contains("<svg") && plot.contains("jobs (threads"),
        "{plot}"
    );

    // The existing file is reused as it is; JSON has every step with its percentiles.
    let out = probe(&[
        &fs,
        "--rw",
        "randwrite",
        "--bs",
        "4k",
        "--jobs",
        "1,3",
        "--step-time",
        "300ms",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let steps = j["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[1]["parallelism"], 3);
    for s in steps {
        let l = &s["latency_us"];
        let p = |k: &str| l[k].as_f64().unwrap();
        assert!(s["ios"].as_u64().unwrap() > 0);
        assert!(p("min") <= p("p50") && p("p50") <= p("p99") && p("p99") <= p("p99_9"));
        assert!(p("p99_9") <= p("max") * 1.001, "{l}");
        assert_eq!(s["histogram"].as_array().unwrap().len(), 14);
    }
    assert_eq!(j["target"]["kind"], "file");
    assert_eq!(j["rw"], "randwrite");
    // The knee is there (a missing field would read as null) and is the one the steps give:
    // the last parallelism before the first p99 at or over the target.
    let target = j["latency_target_us"]
        .as_f64()
        .unwrap_or_else(|| panic!("no latency_target_us in {j:#}"));
    let knee = j["knees"][0]
        .as_object()
        .unwrap_or_else(|| panic!("no knee in {j:#}"));
    let p99 = |s: &serde_json::Value| s["latency_us"]["p99"].as_f64().unwrap();
    let want = match steps.iter().position(|s| p99(s) >= target) {
        Some(0) => serde_json::Value::Null,
        Some(i) => steps[i - 1]["parallelism"].clone(),
        None => steps[steps.len() - 1]["parallelism"].clone(),
    };
    assert_eq!(
        knee.get("parallelism"),
        Some(&want),
        "knee {knee:?} for p99s {:?} and target {target} us",
        steps.iter().map(p99).collect::<Vec<_>>()
    );
}

#[test]
fn ctrl_c_stops_cleanly_and_prints_what_was_measured() {
    if skip() {
        return;
    }
    let _m = measure_lock();
    let raw = RawDisk::new(64);
    let child = Command::new(DBCAGE)
        .args([
            "probe",
            &raw.dev,
            "--bs",
            "4k",
            "--jobs-max",
            "4",
            "--step-time",
            "5s",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let start = Instant::now();
    let out = child.wait_with_output().unwrap();
    let waited = start.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(waited < Duration::from_secs(2), "took {waited:?} to stop");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["interrupted"], true);
    let steps = j["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "{j:#}");
    assert_eq!(steps[0]["interrupted"], true);
    let secs = steps[0]["seconds"].as_f64().unwrap();
    assert!((1.0..2.5).contains(&secs), "step ran {secs}s");
    println!("interrupted after {secs:.2}s with {} IOs", steps[0]["ios"]);
}

#[test]
fn bad_input_is_refused_with_exit_2_and_nothing_written() {
    if skip() {
        return;
    }
    let disk = LoopDisk::new(128);
    let dir = disk.mount_str();

    // A missing target without --size: not created.
    let missing = format!("{dir}/dbcage-test-missing.dat");
    bad(&[&missing], &[&missing, "does not exist", "--size"]);
    assert!(!Path::new(&missing).exists());
    // A directory, a character device.
    bad(&[&dir], &[&dir, "is a directory", "block device"]);
    bad(&["/dev/null"], &["/dev/null", "character device"]);
    // A block size that is not a multiple of the logical block size (512 on loop devices).
    bad(
        &[&missing, "--size", "8MiB", "--bs", "1000"],
        &["--bs", "1000", "logical block size", "512"],
    );
    assert!(!Path::new(&missing).exists());
    bad(
        &[&missing, "--size", "8MiB", "--bs", "4x"],
        &["--bs", "`4x`"],
    );
    bad(
        &[&missing, "--size", "8MiB", "--bs", "16m"],
        &["--bs 16MiB", "--size"],
    );
    bad(
        &[&missing, "--size", "8MiB", "--plot", "out.png"],
        &["out.png", ".svg"],
    );
    assert!(!Path::new(&missing).exists());

    // tmpfs: a new file there, and an existing one.
    let shm = format!("/dev/shm/dbcage-test-{}.dat", sid());
    bad(&[&shm, "--size", "8MiB"], &[&shm, "tmpfs", "direct IO"]);
    assert!(!Path::new(&shm).exists());
    std::fs::write(&shm, vec![7u8; 1 << 20]).unwrap();
    let e = probe(&[&shm, "--rw", "write", "--bs", "4k"]);
    let _ = std::fs::remove_file(&shm);
    assert_eq!(e.status.code(), Some(2), "{e:?}");
    assert!(String::from_utf8_lossy(&e.stderr).contains("tmpfs"));

    // Writes to a device: refused without --destructive, and on a mounted device even with it.
    let raw = RawDisk::new(32);
    bad(&[&raw.dev, "--rw", "write"], &[&raw.dev, "--destructive"]);
    assert_eq!(raw.blocks(), 0, "the sparse image was written to");
    bad(
        &[disk.dev(), "--rw", "randwrite", "--destructive"],
        &[disk.dev(), "is mounted on", &dir, "unmount"],
    );
    // An unmounted device of our own may be written with --destructive.
    let out = probe(&[
        &raw.dev,
        "--rw",
        "write",
        "--destructive",
        "--bs",
        "64k",
        "--jobs",
        "1",
        "--step-time",
        "200ms",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        raw.blocks() > 0,
        "the destructive write did not reach the image"
    );

    // A file larger --size than it holds.
    let small = disk.fill("dbcage-test-small.dat", 1);
    bad(&[&small, "--size", "2MiB"], &[&small, "less than --size"]);
    // verify: an unknown tenant.
    let t = Tenancy::new(
        "probe-bad",
        &format!(
            "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"^dbcage-test-none$\" }}]\nstorage = [\"{dir}\"]\n"
        ),
    );
    let out = t.run(&["verify", "nosuch"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no tenant named `nosuch`"));
    let out = t.run(&["verify", "db"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no IO limits"));
}
