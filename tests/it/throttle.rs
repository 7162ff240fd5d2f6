//! IO limits measured on two loop disks: the instance total split equally over the tenant's
//! devices, IOPS, fsync'd writes, and the exempt leaf.

use std::time::Duration;

use crate::common::*;

/// How long each load runs, and how long a test waits for it at most.
const LOAD_SECS: &str = "5";
const LOAD_TIMEOUT: Duration = Duration::from_secs(60);

/// Two 512 MiB disks, each with a 256 MiB file written through to the device.
struct Disks {
    a: LoopDisk,
    b: LoopDisk,
    file_a: String,
    file_b: String,
}

fn two_disks() -> Disks {
    let a = LoopDisk::new(512);
    let b = LoopDisk::new(512);
    let file_a = a.fill("dbcage-test-read.dat", 256);
    let file_b = b.fill("dbcage-test-read.dat", 256);
    Disks {
        a,
        b,
        file_a,
        file_b,
    }
}

/// One tenant `db` on both disks with the given `[tenant.io]` lines; `exempt` adds an exempt rule.
fn io_policy(d: &Disks, limited: &str, exempt: Option<&str>, io: &str) -> String {
    let exempt = exempt
        .map(|e| format!("exempt = [{{ cmdline = \"{}\" }}]\n", name_rule(e)))
        .unwrap_or_default();
    format!(
        "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"{}\" }}]\n{exempt}storage = [\"{}\", \"{}\"]\n\n[tenant.io]\n{io}\n",
        name_rule(limited),
        d.a.mount_str(),
        d.b.mount_str()
    )
}

fn device<'a>(status: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    let devices = status["tenants"][0]["devices"]
        .as_array()
        .expect("devices array");
    devices
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("device {name} not in status: {status:#}"))
}

#[test]
fn throttle_read_bps_split_over_two_disks() {
    if skip() {
        return;
    }
    let _m = measure_lock();
    let d = two_disks();
    let name = format!("ora_p001_{}", sid());
    let t = Tenancy::new("bps", &io_policy(&d, &name, None, "read_bps = \"8MiB\""));
    let marker = t.marker("db", "limited");

    // One process reading disk A only: it gets A's share, half the total.
    let mut one = Child::ioload(
        &name,
        &[
            "--marker",
            &marker,
            "--duration",
            LOAD_SECS,
            "read",
            &d.file_a,
        ],
    );
    t.ok(&["apply"]);
    let status = t.json(&["status", "--json"]);
    // Devices with usage but no limit may be listed too (python reading its modules).
    let limited: Vec<&serde_json::Value> = status["tenants"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| !d["read_bps_limit"].is_null())
        .collect();
    assert_eq!(limited.len(), 2, "two limited devices expected: {status:#}");
    for disk in [&d.a, &d.b] {
        let dev = device(&status, &disk.name());
        assert_eq!(dev["device"], disk.devnum().as_str());
        assert_eq!(dev["read_bps_limit"], 4_194_304, "{dev:#}");
    }
    let r = one.load_result(LOAD_TIMEOUT);
    let single = mib_per_s(&r);
    println!(
        "read_bps 8MiB over 2 disks: one disk {single:.2} MiB/s ({} bytes in {:.2}s)",
        r["bytes"], r["seconds"]
    );
    assert_near("one-disk read MiB/s", single, 4.0, 0.10, 0.10);

    // One process per disk at once: each gets its own disk's share (half), together the total.
    // (One process reading both disks in turn would read them equally whatever the split.)
    let mut readers: Vec<Child> = [&d.file_a, &d.file_b]
        .iter()
        .map(|file| {
            Child::ioload(
                &name,
                &[
                    "--marker",
                    &marker,
                    "--duration",
                    LOAD_SECS,
                    "read",
                    file.as_str(),
                ],
            )
        })
        .collect();
    t.ok(&["apply"]);
    let per: Vec<f64> = readers
        .iter_mut()
        .map(|r| mib_per_s(&r.load_result(LOAD_TIMEOUT)))
        .collect();
    let total: f64 = per.iter().sum();
    println!(
        "read_bps 8MiB over 2 disks: both disks at once {total:.2} MiB/s (A {:.2}, B {:.2})",
        per[0], per[1]
    );
    assert_near(
        "disk A's share of 8 MiB/s (read MiB/s)",
        per[0],
        4.0,
        0.10,
        0.10,
    );
    assert_near(
        "disk B's share of 8 MiB/s (read MiB/s)",
        per[1],
        4.0,
        0.10,
        0.10,
    );
    assert_near("two-disk aggregate read MiB/s", total, 8.0, 0.10, 0.10);

    let status = t.json(&["status", "--json"]);
    for disk in [&d.a, &d.b] {
        let dev = device(&status, &disk.name());
        assert!(
            dev["read_bytes"].as_u64().unwrap() > 0,
            "no reads counted on {}: {dev:#}",
            disk.name()
        );
    }
}

#[test]
fn throttle_read_iops() {
    if skip() {
        return;
    }
    let _m = measure_lock();
    let d = two_disks();
    let name = format!("ora_p001_{}", sid());
    let t = Tenancy::new("iops", &io_policy(&d, &name, None, "read_iops = 200"));
    let mut p = Child::ioload(
        &name,
        &[
            "--marker",
            &t.marker("db", "limited"),
            "--duration",
            LOAD_SECS,
            "--bs",
            "4096",
            "randread",
            &d.file_a,
        ],
    );
    t.ok(&["apply"]);
    let status = t.json(&["status", "--json"]);
    for disk in [&d.a, &d.b] {
        assert_eq!(device(&status, &disk.name())["read_iops_limit"], 100);
    }
    let r = p.load_result(LOAD_TIMEOUT);
    let got = iops(&r);
    println!(
        "read_iops 200 over 2 disks: one disk {got:.1} IOPS ({} reads of 4 KiB in {:.2}s)",
        r["ios"], r["seconds"]
    );
    assert_near("one-disk 4 KiB read IOPS", got, 100.0, 0.10, 0.10);
}

#[test]
fn throttle_write_fsync() {
    if skip() {
        return;
    }
    let _m = measure_lock();
    let d = two_disks();
    let target = d.a.fill("dbcage-test-write.dat", 32);
    let name = format!("ora_p001_{}", sid());
    let t = Tenancy::new("write", &io_policy(&d, &name, None, "write_bps = \"8MiB\""));

    let out = t.run(&["check"]);
    assert!(out.status.success());
    // Warnings go to stderr, the report to stdout. v1 limits only direct and fsync'd writes,
    // and check says so; v2's io.max binds buffered writes too (writeback is charged).
    let check = String::from_utf8_lossy(&out.stderr);
    let passes_buffered = cgroup_version() == Version::V1;
    assert_eq!(
        passes_buffered,
        t.layout().setup.write_limits_pass_buffered_writes(),
        "the io driver's notion of buffered writes"
    );
    assert_eq!(
        check.contains("warning:") && check.contains("buffered writes"),
        passes_buffered,
        "check should warn on stderr that write limits pass buffered writes exactly on v1:\n{check}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("warning:"));

    let mut p = Child::ioload(
        &name,
        &[
            "--marker",
            &t.marker("db", "limited"),
            "--duration",
            LOAD_SECS,
            "--bs",
            "65536",
            "--span",
            &(32u64 << 20).to_string(),
            "write",
            &target,
        ],
    );
    t.ok(&["apply"]);
    let r = p.load_result(LOAD_TIMEOUT);
    let got = mib_per_s(&r);
    println!(
        "write_bps 8MiB over 2 disks: 64 KiB writes + fsync on one disk {got:.2} MiB/s ({} writes in {:.2}s)",
        r["ios"], r["seconds"]
    );
    assert_near("one-disk fsync'd write MiB/s", got, 4.0, 0.15, 0.10);

    let status = t.json(&["status", "--json"]);
    let dev = device(&status, &d.a.name());
    assert_eq!(dev["write_bps_limit"], 4_194_304);
    assert!(dev["write_bytes"].as_u64().unwrap() > 0, "{dev:#}");
}

#[test]
fn exempt_leaf_is_free() {
    if skip() {
        return;
    }
    let _m = measure_lock();
    let d = two_disks();
    let sid = sid();
    let limited = format!("ora_p001_{sid}");
    let exempt = format!("ora_lgwr_{sid}");
    let t = Tenancy::new(
        "exempt",
        &io_policy(&d, &limited, Some(&exempt), "read_bps = \"8MiB\""),
    );
    let mut slow = Child::ioload(
        &limited,
        &[
            "--marker",
            &t.marker("db", "limited"),
            "--duration",
            LOAD_SECS,
            "read",
            &d.file_a,
        ],
    );
    let mut free = Child::ioload(
        &exempt,
        &[
            "--marker",
            &t.marker("db", "exempt"),
            "--duration",
            LOAD_SECS,
            "read",
            &d.file_a,
        ],
    );
    let plan = t.json(&["plan", "--json"]);
    let moves: Vec<&serde_json::Value> = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["action"] == "move")
        .collect();
    let leaf_of = |pid: u32| {
        moves
            .iter()
            .find(|s| s["pid"] == pid)
            .map(|s| s["leaf"].as_str().unwrap().to_string())
    };
    assert_eq!(leaf_of(slow.pid).as_deref(), Some("limited"), "{plan:#}");
    assert_eq!(leaf_of(free.pid).as_deref(), Some("exempt"), "{plan:#}");

    t.ok(&["apply"]);
    let fast = free.load_result(LOAD_TIMEOUT);
    let held = slow.load_result(LOAD_TIMEOUT);
    let (fast_rate, held_rate) = (mib_per_s(&fast), mib_per_s(&held));
    println!(
        "exempt leaf: exempt process {fast_rate:.1} MiB/s, limited process at the same time {held_rate:.2} MiB/s (limit 4 MiB/s per disk)"
    );
    assert!(
        fast["cgroup"].as_str().unwrap().ends_with("/db/exempt"),
        "{fast}"
    );
    assert!(
        fast_rate > 3.0 * 4.0,
        "the exempt process read only {fast_rate:.2} MiB/s"
    );
    assert_near(
        "limited read MiB/s beside exempt",
        held_rate,
        4.0,
        0.10,
        0.10,
    );
}
