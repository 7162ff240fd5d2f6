//! `preset = "mysql"` with a real MariaDB server (Debian's mariadb-server): its own datadir on a
//! loop-backed ext4, started by the test on a Unix socket (no TCP), found by the preset from its
//! default pid file `<datadir>/<hostname>.pid`. mariadbd serves each connection on a thread of
//! its one process; a sysbench read load on many connections must then be held to the tenant's
//! read limit, which only happens when every thread is in the group (seed 000 wrote PIDs to
//! `tasks`, which moves one thread). The threads' own /proc/PID/task/TID/cgroup are checked too.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn found(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn sh_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Sectors read from a block device so far (/sys/block/NAME/stat, field 3).
fn sectors_read(name: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap();
    text.split_whitespace().nth(2).unwrap().parse().unwrap()
}

fn sysbench(socket: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("sysbench");
    c.args([
        "--db-driver=mysql",
        "--mysql-user=root",
        &format!("--mysql-socket={}", socket.display()),
        "--mysql-db=sbtest",
    ])
    .args(args)
    .stdin(Stdio::null());
    c
}

/// Every thread of `pid` and the blkio cgroup it is in.
fn thread_groups(pid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let tid: u32 = e.file_name().to_string_lossy().parse().unwrap();
        let text = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        let blkio = text
            .lines()
            .find_map(|l| {
                let mut p = l.splitn(3, ':');
                let (_, c, path) = (p.next()?, p.next()?, p.next()?);
                c.split(',').any(|c| c == "blkio").then(|| path.to_string())
            })
            .unwrap_or_default();
        out.push((tid, blkio));
    }
    out
}

#[test]
fn mysql_preset_holds_a_real_mariadb_to_its_read_limit_on_every_thread() {
    if skip() {
        return;
    }
    if !found("mariadbd") || !found("mariadb-install-db") || !found("sysbench") {
        cannot_run("needs mariadb-server and sysbench (scripts/test.sh installs them)");
        return;
    }
    let _m = measure_lock();
    let disk = LoopDisk::new(1024);
    let datadir = disk.mount.join("dbcage-test-mysql");
    std::fs::create_dir(&datadir).unwrap();
    let socket = datadir.join("dbcage-test.sock");
    let t0 = Instant::now();
    sh_ok(
        Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", datadir.display()))
            .args([
                "--user=root",
                "--skip-test-db",
                "--auth-root-authentication-method=socket",
            ]),
        "mariadb-install-db",
    );
    // A small buffer pool and O_DIRECT: the load's reads go to the disk, not to memory.
    let mut server = Command::new("mariadbd");
    server
        .arg("--no-defaults")
        .arg(format!("--datadir={}", datadir.display()))
        .arg(format!("--socket={}", socket.display()))
        .arg(format!(
            "--log-error={}",
            datadir.join("dbcage-test.err").display()
        ))
        .args([
            "--user=root",
            "--skip-networking",
            "--innodb-buffer-pool-size=8M",
            "--innodb-flush-method=O_DIRECT",
            "--innodb-log-file-size=16M",
            "--thread-handling=one-thread-per-connection",
            "--max-connections=64",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut server = Child::spawn(server, "mariadbd");
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let pid_file: PathBuf = datadir.join(format!("{}.pid", hostname.trim()));
    let up = wait_until(Duration::from_secs(60), || {
        socket.exists() && pid_file.exists()
    });
    assert!(
        up && server.alive(),
        "mariadbd did not start:\n{}",
        std::fs::read_to_string(datadir.join("dbcage-test.err")).unwrap_or_default()
    );
    sh_ok(
        Command::new("mariadb")
            .arg(format!("--socket={}", socket.display()))
            .args(["-u", "root", "-e", "CREATE DATABASE sbtest"]),
        "create database",
    );
    // ~60 MiB of rows: far more than the 8 MiB buffer pool.
    let table = ["--tables=1", "--table-size=250000"];
    sh_ok(
        sysbench(&socket, &table).args(["oltp_read_only", "prepare"]),
        "sysbench prepare",
    );
    println!(
        "mariadb up and loaded in {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    let body = format!(
        "[[tenant]]\nname = \"shop\"\npreset = \"mysql\"\ndatadir = \"{}\"\n\n[tenant.io]\nread_bps = \"4MiB\"\n",
        datadir.display()
    );
    let t = Tenancy::new("mysql", &body);
    let marker = t.marker("shop", "limited");

    // The load: 16 connections of random point selects, each served by a thread of mariadbd.
    // Returns MiB/s read from the disk, sysbench's query line, and mariadbd's threads (with
    // their blkio group) seen halfway through.
    let run = |secs: u32| {
        let start = sectors_read(&disk.name());
        let begun = Instant::now();
        let child = sysbench(
            &socket,
            &[
                table[0],
                table[1],
                "--threads=16",
                &format!("--time={secs}"),
                "--rand-type=uniform",
                "oltp_point_select",
                "run",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sysbench");
        std::thread::sleep(Duration::from_secs(u64::from(secs) / 2));
        let threads = thread_groups(server.pid);
        let out = child.wait_with_output().expect("sysbench");
        assert!(out.status.success(), "sysbench run: {out:?}");
        let secs = begun.elapsed().as_secs_f64();
        let mib = (sectors_read(&disk.name()) - start) as f64 * 512.0 / (1 << 20) as f64 / secs;
        let qps = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.trim_start().starts_with("queries:"))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default();
        (mib, qps, threads)
    };
    let (free, free_q, _) = run(4);
    println!(
        "unlimited: {free:.2} MiB/s read from {} ({free_q})",
        disk.name()
    );

    t.ok(&["apply"]);
    let pid = server.pid;
    assert!(
        proc_cgroups(pid)["blkio"].contains(&marker),
        "mariadbd {pid} is not placed: {:?}",
        proc_cgroups(pid)
    );
    let (limited, qps, threads) = run(10);
    let outside: Vec<&(u32, String)> = threads
        .iter()
        .filter(|(_, g)| !g.contains(&marker))
        .collect();
    println!(
        "read_bps 4MiB: {limited:.2} MiB/s read from {} ({qps}); mid-load {} threads of mariadbd, {} outside {marker}",
        disk.name(),
        threads.len(),
        outside.len()
    );
    assert!(
        threads.len() > 16,
        "mariadbd should have a thread per connection and more: {threads:?}"
    );
    assert!(outside.is_empty(), "threads outside {marker}: {outside:?}");
    assert!(
        free > 8.0,
        "the unlimited load should read well above the limit: {free:.2} MiB/s"
    );
    assert_near(
        "mariadb read MiB/s under read_bps 4MiB",
        limited,
        4.0,
        0.25,
        0.10,
    );
    // status agrees: the tenant's one device carries the limit.
    let status = t.json(&["status", "--json"]);
    let dev = status["tenants"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == disk.name().as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{} not in status: {status:#}", disk.name()));
    assert_eq!(dev["read_bps_limit"], 4 << 20, "{dev:#}");

    // Stop the server cleanly before the disk goes.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = server.finish(Duration::from_secs(60));
}
