//! `dbcage iolat`: the kernel-side IO latency histograms (eBPF) counted against what fio
//! issued, on a raw loop device (no file system, so nothing but the two workloads reaches it).

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// Starts `dbcage iolat ARGS --json` and returns once its program is attached (its three
/// or four bpf links are open), so that workloads started after this are counted whole.
fn start_iolat(t: &Tenancy, args: &[&str]) -> Child {
    let mut cmd = Command::new(DBCAGE);
    cmd.arg("-c")
        .arg(&t.policy)
        .arg("iolat")
        .args(args)
        .arg("--json")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = Child::spawn(cmd, "dbcage iolat");
    let attached = wait_until(Duration::from_secs(30), || {
        let links = std::fs::read_dir(format!("/proc/{}/fd", child.pid))
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        std::fs::read_link(e.path())
                            .is_ok_and(|l| l.to_string_lossy() == "anon_inode:bpf_link")
                    })
                    .count()
            })
            .unwrap_or(0);
        links >= 3
    });
    assert!(
        attached,
        "dbcage iolat did not attach its program within 30 s"
    );
    child
}

/// Runs fio inside a tenant (`dbcage exec`) and returns its job's JSON.
fn fio_in(t: &Tenancy, tenant: &str, args: &[&str]) -> std::process::Child {
    Command::new(DBCAGE)
        .arg("-c")
        .arg(&t.policy)
        .args(["exec", tenant, "--", "fio", "--output-format=json"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start fio")
}

fn fio_job(child: std::process::Child) -> serde_json::Value {
    let out = child.wait_with_output().expect("fio");
    assert!(
        out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("fio JSON: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    v["jobs"][0].clone()
}

/// The `dbcage iolat --json` rows as (tenant, op) -> count.
fn counts(rows: &serde_json::Value) -> BTreeMap<(String, String), u64> {
    rows.as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                (
                    r["tenant"].as_str().unwrap().to_string(),
                    r["op"].as_str().unwrap().to_string(),
                ),
                r["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn finish_iolat(mut iolat: Child) -> (serde_json::Value, String) {
    let (status, out, err) = iolat.finish_output(Duration::from_secs(120));
    assert!(status.success(), "dbcage iolat: {status}: {err}");
    let rows = serde_json::from_str(&out).unwrap_or_else(|e| panic!("iolat JSON ({e}): {out}"));
    (rows, err)
}

#[test]
fn iolat_counts_each_request_in_the_tenant_that_issued_it() {
    if skip() {
        return;
    }
    let _m = measure_lock();
    let disk = RawDisk::new(512);
    let t = Tenancy::new(
        "iolat",
        &format!(
            "[[tenant]]\nname = \"reader\"\nmatch = [{{ cmdline = \"{r}\" }}]\n\n[[tenant]]\nname = \"writer\"\nmatch = [{{ cmdline = \"{w}\" }}]\n",
            r = name_rule(&format!("dbcage-test-nomatch-r{}", sid())),
            w = name_rule(&format!("dbcage-test-nomatch-w{}", sid())),
        ),
    );
    t.ok(&["apply"]);
    let iolat = start_iolat(&t, &["--duration", "12s", "--device", &disk.dev]);
    let started = Instant::now();
    // Direct 4 KiB reads in one tenant; buffered 4 KiB writes each followed by fsync in the
    // other (the page cache in between: the writer's fsync writes them back in its own blkcg).
    let reader = fio_in(
        &t,
        "reader",
        &[
            "--name=dbcage-test-read",
            &format!("--filename={}", disk.dev),
            "--rw=randread",
            "--direct=1",
            "--bs=4k",
            "--size=200M",
            "--runtime=3",
            "--time_based",
        ],
    );
    let writer = fio_in(
        &t,
        "writer",
        &[
            "--name=dbcage-test-write",
            &format!("--filename={}", disk.dev),
            "--rw=randwrite",
            "--bs=4k",
            "--fsync=1",
            "--offset=256M",
            "--size=200M",
            "--runtime=3",
            "--time_based",
        ],
    );
    let (r, w) = (fio_job(reader), fio_job(writer));
    assert!(
        started.elapsed() < Duration::from_secs(11),
        "the workloads ran past dbcage iolat's 12 s window ({:?}); the machine is too busy",
        started.elapsed()
    );
    let (rows, _) = finish_iolat(iolat);
    let got = counts(&rows);
    let n = |tenant: &str, op: &str| *got.get(&(tenant.into(), op.into())).unwrap_or(&0);
    let reads = r["read"]["total_ios"].as_u64().unwrap();
    let writes = w["write"]["total_ios"].as_u64().unwrap();
    let fsyncs = w["sync"]["total_ios"].as_u64().unwrap();
    println!(
        "fio issued: reader {reads} reads; writer {writes} writes, {fsyncs} fsyncs\n\
         dbcage iolat on {}: {got:?}",
        disk.name()
    );
    assert!(
        reads > 500 && writes > 50,
        "too little IO to judge: {reads} reads, {writes} writes"
    );
    let within = |what: &str, counted: u64, issued: u64| {
        let ratio = counted as f64 / issued as f64;
        assert!(
            (0.99..=1.01).contains(&ratio),
            "{what}: {counted} counted for {issued} issued ({:.2}%)",
            ratio * 100.0
        );
    };
    within("reader's reads", n("reader", "read"), reads);
    within("writer's writes", n("writer", "write"), writes);
    within(
        "writer's flushes (one per fsync)",
        n("writer", "flush"),
        fsyncs,
    );
    // Nothing of the writer's in the reader's tenant, and of the reader's reads at most 1% in
    // the writer's (which may read a page back itself).
    assert_eq!(n("reader", "write") + n("reader", "flush"), 0, "{got:?}");
    assert!(
        (n("writer", "read") as f64) < reads as f64 * 0.01,
        "writer has {} reads: {got:?}",
        n("writer", "read")
    );
}

#[test]
fn iolat_shows_the_throttle_wait_at_200_iops() {
    if skip() {
        return;
    }
    let _m = measure_lock();
    let disk = RawDisk::new(256);
    let t = Tenancy::new(
        "iolat-thr",
        &format!(
            "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"{}\" }}]\nstorage = [\"{}\"]\n\n[tenant.io]\nread_iops = 200\n",
            name_rule(&format!("dbcage-test-nomatch-{}", sid())),
            disk.dev
        ),
    );
    t.ok(&["apply"]);
    let iolat = start_iolat(
        &t,
        &[
            "db",
            "--duration",
            "8s",
            "--device",
            &disk.dev,
            "--op",
            "read",
        ],
    );
    let job = fio_job(fio_in(
        &t,
        "db",
        &[
            "--name=dbcage-test-thr",
            &format!("--filename={}", disk.dev),
            "--rw=randread",
            "--direct=1",
            "--bs=4k",
            "--iodepth=1",
            "--size=200M",
            "--runtime=4",
            "--time_based",
        ],
    ));
    let (rows, stderr) = finish_iolat(iolat);
    let reads = job["read"]["total_ios"].as_u64().unwrap();
    let iops = reads as f64 / 4.0;
    println!("fio: {reads} reads, {iops:.0}/s; dbcage iolat: {rows:#}\n{stderr}");
    assert!(
        (150.0..=230.0).contains(&iops),
        "the limit did not hold: {iops:.0} IOPS"
    );
    let row = &rows[0];
    // The bar for attribution is 99%; CI once counted 800 of 801 here (not explained:
    // see the stop-17 note), every other run all of them.
    let counted = row["count"].as_u64().unwrap_or(0);
    assert!(
        counted <= reads && counted * 100 >= reads * 99,
        "{counted} of fio's {reads} reads counted (at least 99% expected): {rows:#}"
    );
    if stderr.contains("throttle's wait is not measured") {
        // This host's kernel refuses fentry programs (see the stderr printed above); the
        // histogram then starts at the block layer's queue and cannot hold the wait. The rate
        // and the count above were still checked; the shape is checked in tests/vm/iolat.sh.
        cannot_run("the kernel refuses fentry programs");
        return;
    }
    // Seed 000's shape: most requests pass at the device's speed, and a peak of waits of at
    // least one IOPS period (5 ms) holds most of the time (measured in the v2 VM: p50 158 us,
    // p99 94 ms, 82% of the time in the throttle).
    let p50 = row["p50_s"].as_f64().unwrap();
    let p99 = row["p99_s"].as_f64().unwrap();
    let share = row["throttled_share"].as_f64().unwrap();
    assert!(share > 0.5, "only {share:.2} of the time in the throttle");
    assert!(
        p99 >= 0.004 && p99 >= 10.0 * p50,
        "no peak of throttle waits: p50 {p50} s, p99 {p99} s"
    );
}
