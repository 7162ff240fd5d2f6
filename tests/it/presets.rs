//! Presets on the real kernel: an Oracle instance's process tree with the real process names
//! (retitled the way Oracle retitles its processes: argv rewritten in place, comm truncated to
//! 15 characters), its "ASM disks" as raw loop devices found by a glob or by an asmcmd, and the
//! IO total measured across them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;

const LOAD_SECS: &str = "5";
const LOAD_TIMEOUT: Duration = Duration::from_secs(60);

/// A directory of symlinks named like ASMLib's /dev/oracleasm/disks (`BX1_DISK1` -> loopN).
fn asm_dir(links: &[(String, &RawDisk)]) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("dbcage-test-asm-")
        .tempdir()
        .expect("temp dir");
    for (name, d) in links {
        std::os::unix::fs::symlink(&d.dev, dir.path().join(name)).expect("symlink");
    }
    dir
}

/// A process whose command line is `title`: perl rewrites its argv in place and sets comm to
/// the title's first 15 bytes, as Oracle does for its processes. It sleeps until killed.
fn titled(title: &str) -> Child {
    // The argv area must be long enough for the title: pad the script.
    let script = format!("$0 = shift; sleep 600; # {}", "x".repeat(title.len() + 16));
    let mut cmd = Command::new("perl");
    cmd.args(["-e", &script, title])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let c = Child::spawn(cmd, title);
    let ok = wait_until(Duration::from_secs(10), || {
        std::fs::read(format!("/proc/{}/cmdline", c.pid)).is_ok_and(|raw| {
            let s = String::from_utf8_lossy(&raw).replace('\0', " ");
            s.trim_end() == title
        })
    });
    assert!(ok, "perl did not retitle itself to `{title}`");
    c
}

fn blkio_path(pid: u32) -> String {
    proc_cgroups(pid).get("blkio").cloned().unwrap_or_default()
}

fn limits_of(t: &Tenancy, tenant: &str) -> String {
    std::fs::read_to_string(
        t.leaf_dir("blkio", tenant, "limited")
            .join("blkio.throttle.read_bps_device"),
    )
    .or_else(|_| {
        std::fs::read_to_string(
            t.tenant_dir("blkio", tenant)
                .join("blkio.throttle.read_bps_device"),
        )
    })
    .unwrap_or_default()
}

#[test]
fn oracle_preset_places_the_instance_and_holds_its_total_across_the_asm_disks() {
    if skip() {
        return;
    }
    let _m = measure_lock();
    // A SID unique to this run, long enough that `ora_pmon_<SID>` (16+ bytes) is truncated in
    // comm, and another instance whose SID it is a prefix of.
    let sid = format!("{}DB", sid());
    let other = format!("{sid}0");
    let disks: Vec<RawDisk> = (0..4).map(|_| RawDisk::new(256)).collect();
    let links: Vec<(String, &RawDisk)> = vec![
        (format!("{sid}_DISK1"), &disks[0]),
        (format!("{sid}_DISK2"), &disks[1]),
        (format!("{sid}_DISK3"), &disks[2]),
        (format!("{other}_DISK1"), &disks[3]),
    ];
    let asm = asm_dir(&links);
    let glob = format!("{}/{sid}_*", asm.path().display());
    let body = format!(
        "[[tenant]]\nname = \"{sid}\"\npreset = \"oracle\"\nsid = \"{sid}\"\nasm_disks = \"{glob}\"\n\n[tenant.io]\nread_bps = \"12MiB\"\n"
    );
    let t = Tenancy::new("oracle", &body);

    // The instance's processes, the other instance's, the shared listener, and tools.
    let limited = [
        format!("ora_pmon_{sid}"),
        format!("ora_smon_{sid}"),
        format!("ora_dbw0_{sid}"),
        format!("ora_ckpt_{sid}"),
        format!("ora_mmon_{sid}"),
        format!("ora_p00a_{sid}"),
        format!("ora_j000_{sid}"),
        format!("oracle{sid} (LOCAL=NO)"),
        format!("oracle{sid} (LOCAL=YES)"),
        format!("oracle{sid} (DESCRIPTION=(LOCAL=YES)(ADDRESS=(PROTOCOL=beq)))"),
    ];
    let exempt = [format!("ora_lgwr_{sid}"), format!("ora_lg00_{sid}")];
    let outside = [
        format!("ora_pmon_{other}"),
        format!("ora_lgwr_{other}"),
        format!("oracle{other} (LOCAL=NO)"),
        "/u01/app/oracle/product/19.0.0/dbhome_1/bin/tnslsnr LISTENER -inherit".to_string(),
        format!("tnslsnr LISTENER_{sid} -inherit"),
        format!("tail -f /u01/app/oracle/diag/rdbms/x/{sid}/trace/alert_{sid}.log"),
    ];
    let procs: Vec<(Child, Option<&str>)> = limited
        .iter()
        .map(|n| (titled(n), Some("limited")))
        .chain(exempt.iter().map(|n| (titled(n), Some("exempt"))))
        .chain(outside.iter().map(|n| (titled(n), None)))
        .collect();
    // comm really is truncated (the preset must not rely on it).
    assert!(limited[0].len() > 15);
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", procs[0].0.pid)).unwrap();
    assert_eq!(comm.trim(), &limited[0][..15]);

    // The load: two parallel query slaves reading all three disks in turn, and the log writer
    // reading one disk (exempt: not throttled).
    let marker = t.marker(&sid, "limited");
    let files: Vec<String> = (1..=3)
        .map(|i| format!("{}/{sid}_DISK{i}", asm.path().display()))
        .collect();
    let load = |name: String, marker: &str, files: &[String]| {
        let mut args = vec!["--marker", marker, "--duration", LOAD_SECS, "read"];
        args.extend(files.iter().map(String::as_str));
        Child::ioload(&name, &args)
    };
    let mut p0 = load(format!("ora_p000_{sid}"), &marker, &files);
    let mut p1 = load(format!("ora_p001_{sid}"), &marker, &files);
    let mut lgwr = load(
        format!("ora_lg01_{sid}"),
        &t.marker(&sid, "exempt"),
        &files[..1],
    );

    t.ok(&["apply"]);

    // Placement: every process where the preset says, nothing else in the tenant.
    let mut report = Vec::new();
    for (c, want) in &procs {
        let path = blkio_path(c.pid);
        let got = ["limited", "exempt"]
            .into_iter()
            .find(|l| path.contains(&t.marker(&sid, l)));
        report.push(format!(
            "{:<70} -> {}",
            c.name,
            got.unwrap_or("(not placed)")
        ));
        assert_eq!(got, *want, "{} is in {path}", c.name);
    }
    println!("placement:\n  {}", report.join("\n  "));

    // The three disks of the glob are limited, 12 MiB/s / 3 each; the other instance's is not.
    let status = t.json(&["status", "--json"]);
    let limited_devs: Vec<(String, u64)> = status["tenants"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| !d["read_bps_limit"].is_null())
        .map(|d| {
            (
                d["name"].as_str().unwrap().to_string(),
                d["read_bps_limit"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut want: Vec<(String, u64)> = disks[..3].iter().map(|d| (d.name(), 4 << 20)).collect();
    want.sort();
    let mut got = limited_devs.clone();
    got.sort();
    assert_eq!(got, want, "limited devices: {status:#}");

    let r0 = p0.load_result(LOAD_TIMEOUT);
    let r1 = p1.load_result(LOAD_TIMEOUT);
    let rl = lgwr.load_result(LOAD_TIMEOUT);
    let (a, b, l) = (mib_per_s(&r0), mib_per_s(&r1), mib_per_s(&rl));
    println!(
        "oracle preset, read_bps 12MiB over 3 ASM disks: p000 {a:.2} + p001 {b:.2} = {:.2} MiB/s; lg01 (exempt) {l:.2} MiB/s",
        a + b
    );
    assert_near("instance total read MiB/s", a + b, 12.0, 0.12, 0.10);
    assert!(
        l > 24.0,
        "the exempt log writer should not be throttled: {l:.2} MiB/s"
    );
}

/// A stand-in for asmcmd: prints the disks listed in `list` (one per line), as
/// `asmcmd lsdsk -G DG --suppressheader` does, after checking it was called that way.
fn fake_asmcmd(dir: &Path, group: &str, list: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let path = bin.join("asmcmd");
    let script = format!(
        "#!/bin/sh\n[ \"$1 $2 $3 $4\" = \"lsdsk -G {group} --suppressheader\" ] || {{ echo \"ASMCMD-9999: unexpected arguments: $*\"; exit 1; }}\n[ \"$ORACLE_SID\" = \"+ASM\" ] || {{ echo \"ORACLE_SID=$ORACLE_SID\" >&2; exit 1; }}\ncat {}\n",
        list.display()
    );
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

#[test]
fn oracle_preset_follows_the_asm_diskgroup_through_asmcmd() {
    if skip() {
        return;
    }
    let sid = sid();
    let disks: Vec<RawDisk> = (0..3).map(|_| RawDisk::new(64)).collect();
    let links: Vec<(String, &RawDisk)> = disks
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("DATA{i}"), d))
        .collect();
    let asm = asm_dir(&links);
    let body = format!(
        "[[tenant]]\nname = \"{sid}\"\npreset = \"oracle\"\nsid = \"{sid}\"\nasm_diskgroup = \"DATA\"\nasm_diskstring = \"{}/*\"\n\n[tenant.io]\nread_bps = \"12MiB\"\n",
        asm.path().display()
    );
    let t = Tenancy::new("asmcmd", &body);
    let list = t.dir().join("dbcage-test-lsdsk.txt");
    let bin = fake_asmcmd(t.dir(), "DATA", &list);
    let path_env = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let apply = || {
        Command::new(DBCAGE)
            .arg("-c")
            .arg(&t.policy)
            .arg("apply")
            .env("PATH", &path_env)
            .env_remove("ORACLE_SID")
            .env_remove("DBCAGE_CONFIG")
            .output()
            .unwrap()
    };
    let disk_line = |i: usize| format!("{}/DATA{i}\n", asm.path().display());
    let pmon = titled(&format!("ora_pmon_{sid}"));

    // Two disks in the group: 6 MiB/s each.
    std::fs::write(&list, disk_line(0) + &disk_line(1)).unwrap();
    let out = apply();
    assert!(out.status.success(), "apply: {out:?}");
    assert!(blkio_path(pmon.pid).contains(&t.marker(&sid, "limited")));
    let lim = limits_of(&t, &sid);
    let want2: Vec<String> = disks[..2]
        .iter()
        .map(|d| format!("{} {}", devnum(&d.dev), 6 << 20))
        .collect();
    for w in &want2 {
        assert!(lim.contains(w), "want `{w}` in:\n{lim}");
    }
    println!("asmcmd lists 2 disks:\n{lim}");

    // A third disk joins the diskgroup: the total is divided again.
    std::fs::write(&list, disk_line(0) + &disk_line(1) + &disk_line(2)).unwrap();
    let out = apply();
    assert!(out.status.success(), "apply: {out:?}");
    let lim = limits_of(&t, &sid);
    for d in &disks {
        let w = format!("{} {}", devnum(&d.dev), 4 << 20);
        assert!(lim.contains(&w), "want `{w}` in:\n{lim}");
    }
    println!("asmcmd lists 3 disks:\n{lim}");

    // A disk outside the diskstring, and asmcmd failing, are errors that name the diskgroup.
    std::fs::write(&list, "/dev/sda\n").unwrap();
    let out = apply();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("diskgroup DATA") && err.contains("does not match"),
        "{err}"
    );
    std::fs::write(
        &list,
        "ASMCMD-8001: diskgroup 'DATA' does not exist or is not mounted\n",
    )
    .unwrap();
    let out = apply();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("ASMCMD-8001"),
        "{err}"
    );
}

fn devnum(dev: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(dev).unwrap().rdev();
    format!(
        "{}:{}",
        nix::sys::stat::major(rdev),
        nix::sys::stat::minor(rdev)
    )
}

/// The listener script: `tnslsnr LISTENER -inherit` (python reading the file `LISTENER`), which
/// waits for the file `go`, then forks and execs one dedicated server per SID given in `sids`,
/// exactly as a listener starts them: argv `oracle<SID> (LOCAL=NO)` (python reading the file
/// `(LOCAL=NO)`, which sleeps). Writes the children's PIDs to `children`.
const LISTENER: &str = r#"
import os, time
while not os.path.exists("go"):
    time.sleep(0.02)
pids = []
for sid in open("sids").read().split():
    pid = os.fork()
    if pid == 0:
        os.execv(os.environ["DBCAGE_TEST_PYTHON"], ["oracle" + sid, "(LOCAL=NO)"])
    pids.append(pid)
open("children.tmp", "w").write(" ".join(map(str, pids)))
os.rename("children.tmp", "children")
time.sleep(600)
"#;

#[test]
fn a_shared_listener_stays_out_and_its_sessions_go_to_their_instances() {
    if skip() {
        return;
    }
    let (a, b) = (format!("{}A", sid()), format!("{}B", sid()));
    let tenant =
        |s: &str| format!("[[tenant]]\nname = \"{s}\"\npreset = \"oracle\"\nsid = \"{s}\"\n\n");
    let t = Tenancy::new("listener", &(tenant(&a) + &tenant(&b)));
    let dir = t.dir().join("dbcage-test-listener");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("LISTENER"), LISTENER).unwrap();
    std::fs::write(dir.join("(LOCAL=NO)"), "import time\ntime.sleep(600)\n").unwrap();
    std::fs::write(dir.join("sids"), format!("{a} {b} {a}")).unwrap();
    let mut cmd = Command::new(python());
    use std::os::unix::process::CommandExt;
    cmd.arg0("tnslsnr")
        .args(["LISTENER", "-inherit"])
        .current_dir(&dir)
        .env("DBCAGE_TEST_PYTHON", python())
        .stdin(Stdio::null());
    let listener = Child::spawn(cmd, "tnslsnr");

    let _d = Daemon::start(&t, &[]);
    std::fs::write(dir.join("go"), "").unwrap();
    assert!(wait_until(Duration::from_secs(10), || dir
        .join("children")
        .exists()));
    let children: Vec<u32> = std::fs::read_to_string(dir.join("children"))
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    // Reap-free cleanup: the children die with a SIGKILL by pid at the end.
    struct Kill(Vec<u32>);
    impl Drop for Kill {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*p as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let _kill = Kill(children.clone());
    let want = [&a, &b, &a];
    for (pid, sid) in children.iter().zip(want) {
        let marker = t.marker(sid, "limited");
        let placed = wait_until(Duration::from_secs(5), || {
            blkio_path(*pid).contains(&marker)
        });
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
            .unwrap_or_default()
            .replace('\0', " ");
        assert!(
            placed,
            "session {pid} `{}` not in {marker}: {}",
            cmdline.trim(),
            blkio_path(*pid)
        );
        println!("session {pid} `{}` -> {marker}", cmdline.trim());
    }
    let lpath = blkio_path(listener.pid);
    assert!(
        !lpath.contains(&t.root),
        "the shared listener was placed: {lpath}"
    );
    println!("listener {} stays in {lpath}", listener.pid);
}

#[test]
fn the_daemon_divides_the_total_again_when_the_diskgroup_gains_a_disk() {
    if skip() {
        return;
    }
    let sid = sid();
    let disks: Vec<RawDisk> = (0..3).map(|_| RawDisk::new(64)).collect();
    let links: Vec<(String, &RawDisk)> = disks[..2]
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("DATA{i}"), d))
        .collect();
    let asm = asm_dir(&links);
    let body = format!(
        "[[tenant]]\nname = \"{sid}\"\npreset = \"oracle\"\nsid = \"{sid}\"\nasm_diskgroup = \"DATA\"\nasm_diskstring = \"{}/DATA*\"\n\n[tenant.io]\nread_bps = \"12MiB\"\n",
        asm.path().display()
    );
    let t = Tenancy::new("asmd", &body);
    let list = t.dir().join("dbcage-test-lsdsk.txt");
    let bin = fake_asmcmd(t.dir(), "DATA", &list);
    let disk_line = |i: usize| format!("{}/DATA{i}\n", asm.path().display());
    std::fs::write(&list, disk_line(0) + &disk_line(1)).unwrap();
    let path_env = format!(
        "PATH={}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let _pmon = titled(&format!("ora_pmon_{sid}"));
    let d = Daemon::start_wrapped(&t, &["env", "-u", "ORACLE_SID", &path_env], &[]);
    let has = |n: usize, each: u64| {
        let lim = limits_of(&t, &sid);
        disks[..n]
            .iter()
            .all(|d| lim.contains(&format!("{} {each}", devnum(&d.dev))))
            && lim.lines().count() == n
    };
    assert!(
        wait_until(Duration::from_secs(10), || has(2, 6 << 20)),
        "two disks at 6 MiB/s each expected:\n{}",
        limits_of(&t, &sid)
    );
    // A new LUN appears and ASM adds it to the group: asmcmd lists it, the daemon (woken by
    // the new device node) asks again and divides the total by three. (The time is mostly the
    // daemon's rescan of /proc on a busy host.)
    std::fs::write(&list, disk_line(0) + &disk_line(1) + &disk_line(2)).unwrap();
    let start = std::time::Instant::now();
    std::os::unix::fs::symlink(&disks[2].dev, asm.path().join("DATA2")).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || has(3, 4 << 20)),
        "three disks at 4 MiB/s each expected:\n{}",
        limits_of(&t, &sid)
    );
    println!(
        "daemon: diskgroup grew from 2 to 3 disks, limits re-divided in {:.0} ms:\n{}",
        start.elapsed().as_secs_f64() * 1000.0,
        limits_of(&t, &sid)
    );
    drop(d);
}
