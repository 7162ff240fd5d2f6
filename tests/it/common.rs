//! Helpers for the integration tests: guards that undo everything a test creates (loop disks,
//! mounts, cgroups, processes, temp dirs) even when the test panics, and readers of /proc.
//!
//! Everything a test creates has `dbcage-test` in its name. Cgroups are nested under the test
//! process's own cgroup in each hierarchy (`[agent] parent = "self"`), never elsewhere.
//!
//! The tests run against the host's own cgroup version (`cgroup_version`): the v1 controllers
//! where they are mounted (v1 and hybrid hosts), else the unified v2 hierarchy. On v2 the test
//! process must start alone in its cgroup (a delegated subtree: `systemd-run --scope -p
//! Delegate=yes`, or a group made for it); it moves itself into a leaf of it
//! (`dbcage-test-runner`) and the policies name that cgroup as their parent, so the tenants'
//! groups sit beside the runner, as the no-internal-process rule wants. Which file holds a limit
//! and how its value reads come from the crate's drivers (`Knob`), not from `if v1` in a test.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub const DBCAGE: &str = env!("CARGO_BIN_EXE_dbcage");
pub const IOLOAD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/ioload.py");

/// The controllers dbcage drives (v1 names).
pub const CONTROLLERS: [&str; 5] = ["blkio", "cpu", "cpuacct", "cpuset", "memory"];
/// The controllers every tenant has groups in (`cgroup::coverage::grouped_by_policy`).
pub const ALWAYS_GROUPED: [&str; 3] = ["blkio", "cpu", "cpuacct"];

/// Tests that measure throughput or cpu time (and the ones that load the machine with many
/// processes) hold this for their whole run, so they never overlap.
/// The in-process lock is paired with `flock` on a host-wide file, so that test runs from other
/// checkouts (or `flock /tmp/dbcage-measure.lock bench/...`) do not overlap either.
static MEASURE: Mutex<()> = Mutex::new(());

pub struct MeasureGuard {
    // Field order: the host lock is released before the in-process one.
    _host: nix::fcntl::Flock<std::fs::File>,
    _local: MutexGuard<'static, ()>,
}

pub const HOST_MEASURE_LOCK: &str = "/tmp/dbcage-measure.lock";

pub fn measure_lock() -> MeasureGuard {
    let local = MEASURE.lock().unwrap_or_else(|e| e.into_inner());
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(HOST_MEASURE_LOCK)
        .expect("open the host-wide measure lock");
    let host = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("flock the host-wide measure lock");
    MeasureGuard {
        _host: host,
        _local: local,
    }
}

/// A command that runs dbcage behind `wrapper` (`["strace", "-f"]`, `["unshare", "--pid"]`;
/// empty: dbcage itself).
pub fn dbcage_behind(wrapper: &[&str]) -> Command {
    match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(DBCAGE);
            c
        }
        None => Command::new(DBCAGE),
    }
}

/// True when the test cannot run here and that is declared in `skips::DECLARED` (it prints and
/// records why); panics, naming what could not run, when it cannot run and that is not
/// declared. It needs root and the controllers dbcage drives, all on v1 or all on v2.
pub fn skip() -> bool {
    if !nix::unistd::Uid::effective().is_root() {
        return cannot_run("needs root");
    }
    match cgroups() {
        Ok(_) => false,
        Err(why) => cannot_run(why),
    }
}

/// A test that covers a feature only cgroup v1 has (a v1 file format, cgconfig): true (the
/// caller returns) on a v2 host, where that skip is declared in `skips.rs` with its reason.
pub fn skip_unless_v1(feature: &str) -> bool {
    skip() || (cgroup_version() == Version::V2 && cannot_run(&format!("cgroup v1 only: {feature}")))
}

/// Where each skip is recorded (one line: test, `declared` or `UNDECLARED`, reason), so that
/// `scripts/test.sh` can list them after the run: the test binary's output hides them.
pub const SKIP_LOG: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/it-skips.tsv");

/// The running test's name (libtest names each test's thread after it).
pub fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("(unnamed test)")
        .to_string()
}

/// The test cannot run here because of `reason`. Returns true (the caller returns) when
/// `skips::DECLARED` allows that test to skip for that reason; otherwise panics: a test that
/// does not run is a failure unless declared. Either way it prints and records the skip in
/// `SKIP_LOG`.
pub fn cannot_run(reason: &str) -> bool {
    let test = test_name();
    let declared = crate::skips::declared(&test, reason);
    let line = format!(
        "{test}\t{}\t{reason}\n",
        if declared.is_some() {
            "declared"
        } else {
            "UNDECLARED"
        }
    );
    // Best effort: an unprivileged run may not write the target dir; the panic still names it.
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(SKIP_LOG)
    {
        let _ = std::io::Write::write_all(&mut f, line.as_bytes());
    }
    match declared {
        Some(why) => {
            println!("skipped (declared: {why}): {reason}");
            true
        }
        None => panic!(
            "{test} could not run: {reason} (a skip is a failure unless declared in tests/it/skips.rs)"
        ),
    }
}

/// A tag unique to this test process and call: `T<pid><letters>` (letters, so that no tag is a
/// prefix of another one followed by a word character).
pub fn sid() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let mut n = N.fetch_add(1, Ordering::SeqCst);
    let mut letters = String::new();
    loop {
        letters.insert(0, (b'a' + (n % 26) as u8) as char);
        n /= 26;
        if n == 0 {
            break;
        }
        n -= 1;
    }
    format!("T{}{letters}", std::process::id())
}

/// A process name (`comm`, at most 15 characters) unique to this test process and call:
/// `prefix` (at most 8 characters) + this pid in base 36 (5 digits) + a counter (2 digits).
pub fn comm_tag(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    fn base36(mut n: usize, width: usize) -> String {
        let mut out = vec![b'0'; width];
        for slot in out.iter_mut().rev() {
            *slot = b"0123456789abcdefghijklmnopqrstuvwxyz"[n % 36];
            n /= 36;
        }
        String::from_utf8(out).unwrap()
    }
    assert!(prefix.len() <= 8, "comm prefix {prefix} is too long");
    let n = N.fetch_add(1, Ordering::SeqCst);
    format!(
        "{prefix}{}{}",
        base36(std::process::id() as usize, 5),
        base36(n, 2)
    )
}

/// A regex (as TOML string content) that matches exactly the processes named `name ...`.
pub fn name_rule(name: &str) -> String {
    format!("^{name}( |$)")
}

/// The system python (a pyenv shim would re-exec and lose argv[0]).
pub fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

/// Polls `f` every 10 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `setpriv` and its arguments (ending in `--`) that run a command without the capabilities
/// `drop` (e.g. `"-net_admin"`, `"-bpf,-perfmon"`): out of the bounding, inheritable and ambient
/// sets, so that not even a root process gets them back at exec.
pub fn setpriv_without(drop: &str) -> Vec<String> {
    vec![
        "setpriv".into(),
        format!("--bounding-set={drop}"),
        format!("--inh-caps={drop}"),
        format!("--ambient-caps={drop}"),
        "--".into(),
    ]
}

/// The effective capabilities of `pid` (`CapEff` in /proc/PID/status).
pub fn cap_eff(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).expect("CapEff is hex"))
        .expect("CapEff in /proc/PID/status")
}

// ---------------------------------------------------------------------------------------------
// cgroups

pub use dbcage::cgroup::Version;

/// The cgroups the tests drive on this host, found once per test process.
#[derive(Debug)]
pub enum Cgroups {
    /// Every controller on its own (or a co-mounted) v1 hierarchy.
    V1,
    /// The unified hierarchy: `base` is the cgroup (path and directory) the test process
    /// started in, which it made its tests' parent; it runs in `base/dbcage-test-runner`.
    V2 {
        mount_point: PathBuf,
        base: String,
        base_dir: PathBuf,
    },
}

/// The leaf the test process moves itself into on v2 (and where cleanup puts stray processes).
pub const RUNNER: &str = "dbcage-test-runner";

/// The controllers the tests need on v2.
const V2_CONTROLLERS: [&str; 4] = ["cpuset", "cpu", "io", "memory"];

/// The cgroups of this host (see `Cgroups`), or why the tests cannot run here.
pub fn cgroups() -> Result<&'static Cgroups, &'static str> {
    static FOUND: std::sync::OnceLock<Result<Cgroups, String>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(find_cgroups)
        .as_ref()
        .map_err(|e| e.as_str())
}

/// The version the tests drive here (panics where `skip()` would have failed).
pub fn cgroup_version() -> Version {
    match cgroups().expect("the tests' cgroups") {
        Cgroups::V1 => Version::V1,
        Cgroups::V2 { .. } => Version::V2,
    }
}

fn find_cgroups() -> Result<Cgroups, String> {
    let v1 = v1_hierarchies();
    if CONTROLLERS.iter().all(|c| v1.contains_key(*c)) {
        return Ok(Cgroups::V1);
    }
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let Some(mount_point) = text.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split(' ').next() != Some("cgroup2") {
            return None;
        }
        left.split(' ').nth(4).map(PathBuf::from)
    }) else {
        let missing: Vec<&str> = CONTROLLERS
            .into_iter()
            .filter(|c| !v1.contains_key(*c))
            .collect();
        return Err(format!(
            "needs the cgroup v1 controllers {} mounted, or a cgroup v2 hierarchy",
            missing.join(", ")
        ));
    };
    let available =
        std::fs::read_to_string(mount_point.join("cgroup.controllers")).unwrap_or_default();
    if let Some(c) = V2_CONTROLLERS
        .iter()
        .find(|c| !available.split_whitespace().any(|a| a == **c))
    {
        if !v1.is_empty() {
            return Err(format!(
                "a hybrid host with only some controllers on v1 ({}); the {c} controller is on neither",
                v1.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        return Err(format!(
            "needs the cgroup v2 {c} controller (the root's cgroup.controllers: `{}`)",
            available.trim()
        ));
    }
    // The process's own v2 group (`0::/path`).
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        .ok_or("no cgroup v2 line in /proc/self/cgroup")?;
    let base_dir = mount_point.join(own.trim_start_matches('/'));
    let me = std::process::id();
    let others: Vec<u32> = procs_in(&base_dir)
        .into_iter()
        .filter(|p| *p != me)
        .collect();
    if !others.is_empty() {
        return Err(format!(
            "on cgroup v2 the test process must be alone in its cgroup {own} (it becomes the \
             tests' delegated parent; processes {others:?} are there too): start it as \
             `systemd-run --scope -p Delegate=yes TEST-BINARY` or from a cgroup of its own"
        ));
    }
    // No internal processes: the test process leaves for a leaf before dbcage enables
    // controllers in this group's subtree_control.
    let runner = base_dir.join(RUNNER);
    match std::fs::create_dir(&runner) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("creating {}: {e}", runner.display())),
    }
    std::fs::write(runner.join("cgroup.procs"), me.to_string())
        .map_err(|e| format!("moving the test process into {}: {e}", runner.display()))?;
    Ok(Cgroups::V2 {
        mount_point,
        base: own,
        base_dir,
    })
}

/// A mounted hierarchy: its mount point and the cgroup path mounted there.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    pub mount_point: PathBuf,
    pub mount_root: String,
}

/// v1 controller name → its hierarchy, for the controllers dbcage drives.
fn v1_hierarchies() -> BTreeMap<String, Hierarchy> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 5 || r.len() < 3 || r[0] != "cgroup" {
            continue;
        }
        for opt in r[2].split(',') {
            if CONTROLLERS.contains(&opt) {
                out.entry(opt.to_string()).or_insert(Hierarchy {
                    mount_point: PathBuf::from(l[4]),
                    mount_root: l[3].to_string(),
                });
            }
        }
    }
    out
}

/// Controller (by its v1 name, as the tests name them) → the hierarchy it is driven through:
/// its v1 hierarchy, or on v2 the unified one for all of them.
pub fn hierarchies() -> BTreeMap<String, Hierarchy> {
    match cgroups() {
        Ok(Cgroups::V2 { mount_point, .. }) => CONTROLLERS
            .iter()
            .map(|c| {
                (
                    c.to_string(),
                    Hierarchy {
                        mount_point: mount_point.clone(),
                        mount_root: "/".into(),
                    },
                )
            })
            .collect(),
        _ => v1_hierarchies(),
    }
}

/// /proc/PID/cgroup as controller → cgroup path (co-mounted controllers each get the line's
/// path; on v2 every controller gets the unified path). Empty if the process is gone.
pub fn proc_cgroups(pid: u32) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mut out = BTreeMap::new();
    let v2 = matches!(cgroups(), Ok(Cgroups::V2 { .. }));
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if v2 {
            if ctrls.is_empty() {
                for c in CONTROLLERS {
                    out.insert(c.to_string(), path.to_string());
                }
            }
            continue;
        }
        for c in ctrls.split(',').filter(|c| !c.is_empty()) {
            out.insert(c.to_string(), path.to_string());
        }
    }
    out
}

pub fn own_cgroups() -> BTreeMap<String, String> {
    proc_cgroups(std::process::id())
}

/// The directory of a cgroup path in a controller's hierarchy.
pub fn cgroup_dir(controller: &str, cgroup_path: &str) -> PathBuf {
    let h = &hierarchies()[controller];
    let root = h.mount_root.trim_end_matches('/');
    let rel = cgroup_path.strip_prefix(root).unwrap_or(cgroup_path);
    h.mount_point.join(rel.trim_start_matches('/'))
}

/// The directory of this test process's own cgroup in a controller's hierarchy.
pub fn own_dir(controller: &str) -> PathBuf {
    cgroup_dir(controller, &own_cgroups()[controller])
}

/// The cgroup the tests' root groups are made in: the test process's own group in each v1
/// hierarchy; on v2 the group it started in (its parent now).
pub fn parent_dir(controller: &str) -> PathBuf {
    match cgroups() {
        Ok(Cgroups::V2 { base_dir, .. }) => base_dir.clone(),
        _ => own_dir(controller),
    }
}

/// The cgroup path of `parent_dir` (what the tests' groups' paths start with).
pub fn parent_path(controller: &str) -> String {
    match cgroups() {
        Ok(Cgroups::V2 { base, .. }) => base.clone(),
        _ => own_cgroups()[controller].clone(),
    }
}

/// `parent_path` of every controller (the tests' name: v1's).
pub fn parent_paths() -> BTreeMap<String, String> {
    CONTROLLERS
        .iter()
        .map(|c| (c.to_string(), parent_path(c)))
        .collect()
}

/// The per-device read bytes/s limits in force on a group (`MAJ:MIN` → bytes/s), read from the
/// kernel by this host's file: v1 `blkio.throttle.read_bps_device` (`MAJ:MIN N`), v2 `io.max`
/// (`MAJ:MIN rbps=N wbps=...`; `max` is no limit and left out).
pub fn read_bps_limits(group: &Path) -> BTreeMap<String, u64> {
    let v2 = cgroup_version() == Version::V2;
    let file = if v2 {
        dbcage::cgroup::v2::IO_MAX
    } else {
        dbcage::cgroup::v1::READ_BPS
    };
    std::fs::read_to_string(group.join(file))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (dev, rest) = l.split_once(' ')?;
            let value = if v2 {
                rest.split_whitespace()
                    .find_map(|kv| kv.strip_prefix("rbps="))?
            } else {
                rest.trim()
            };
            Some((dev.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// Bytes read per device so far by a group and its children: v1
/// `blkio.throttle.io_service_bytes_recursive` (`MAJ:MIN Read N`), v2 `io.stat` (`rbytes=N`).
pub fn read_bytes(group: &Path) -> BTreeMap<String, u64> {
    let v2 = cgroup_version() == Version::V2;
    let file = if v2 {
        "io.stat"
    } else {
        "blkio.throttle.io_service_bytes_recursive"
    };
    std::fs::read_to_string(group.join(file))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let bytes = if v2 {
                f.iter().find_map(|kv| kv.strip_prefix("rbytes="))?
            } else if f.len() == 3 && f[1] == "Read" {
                f[2]
            } else {
                return None;
            };
            Some((f[0].to_string(), bytes.parse().ok()?))
        })
        .collect()
}

/// Where cleanup puts processes left in a test's groups: on v2 the runner leaf (a parent with
/// controllers enabled takes no processes).
fn refuge_dir(controller: &str) -> PathBuf {
    match cgroups() {
        Ok(Cgroups::V2 { base_dir, .. }) => base_dir.join(RUNNER),
        _ => own_dir(controller),
    }
}

/// A limit as the kernel holds it, in the file the driver of this host's cgroup version uses
/// (the crate's own file names, so that the tests and the product cannot drift apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Knob {
    /// v1 cpu.cfs_quota_us (period 100 ms), v2 cpu.max.
    CpuQuota,
    /// v1 cpu.shares, v2 cpu.weight.
    CpuWeight,
    /// cpuset.cpus on both.
    Cpus,
    /// v1 memory.limit_in_bytes, v2 memory.max.
    MemMax,
    /// v1 memory.soft_limit_in_bytes, v2 memory.high.
    MemHigh,
}

impl Knob {
    /// The controller (v1 name) whose hierarchy holds it.
    pub fn controller(self) -> &'static str {
        match self {
            Knob::CpuQuota | Knob::CpuWeight => "cpu",
            Knob::Cpus => "cpuset",
            Knob::MemMax | Knob::MemHigh => "memory",
        }
    }

    /// Its file name on this host.
    pub fn file(self) -> &'static str {
        use dbcage::cgroup::{v1, v2};
        let v2 = cgroup_version() == Version::V2;
        match self {
            Knob::CpuQuota if v2 => v2::CPU_MAX,
            Knob::CpuQuota => v1::CFS_QUOTA,
            Knob::CpuWeight if v2 => v2::CPU_WEIGHT,
            Knob::CpuWeight => v1::SHARES,
            Knob::Cpus => v2::CPUS,
            Knob::MemMax if v2 => v2::MEM_MAX,
            Knob::MemMax => v1::MEM_LIMIT,
            Knob::MemHigh if v2 => v2::MEM_HIGH,
            Knob::MemHigh => v1::MEM_SOFT,
        }
    }
}

/// What the kernel file of `Knob::CpuQuota` holds for a quota of `cores`.
pub fn cpu_quota_text(cores: f64) -> String {
    match cgroup_version() {
        Version::V2 => dbcage::cgroup::v2::cpu_max(Some(cores)),
        Version::V1 => ((cores * 100_000.0).round() as i64).to_string(),
    }
}

/// What the kernel file of `Knob::CpuWeight` holds for a weight (100 is the default).
pub fn cpu_weight_text(weight: u32) -> String {
    match cgroup_version() {
        Version::V2 => weight.to_string(),
        Version::V1 => dbcage::cgroup::v1::weight_to_shares(weight).to_string(),
    }
}

pub fn procs_in(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Removes a directory tree of cgroups depth-first. Processes still inside (only ever the
/// test's own) are moved to `parent` first, which is inside the test's own cgroup.
fn remove_cgroup_tree(dir: &Path, parent: &Path) {
    if !dir.is_dir() {
        return;
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path(), parent);
            }
        }
    }
    for _ in 0..100 {
        for pid in procs_in(dir) {
            let _ = std::fs::write(parent.join("cgroup.procs"), pid.to_string());
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    eprintln!("cleanup: could not remove {}", dir.display());
}

/// A `dbcage-test-*` cgroup the test makes itself (in one hierarchy, under the test's own
/// group there); removed on drop, its processes moved to `parent` first, also when the test
/// fails.
pub struct TestGroup {
    pub dir: PathBuf,
    parent: PathBuf,
}

impl TestGroup {
    /// Makes `parent/name` (`name` must contain `dbcage-test`).
    pub fn new(parent: &Path, name: &str) -> TestGroup {
        assert!(name.contains("dbcage-test"), "{name}");
        let dir = parent.join(name);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        TestGroup {
            dir,
            parent: parent.to_path_buf(),
        }
    }
}

impl Drop for TestGroup {
    fn drop(&mut self) {
        remove_cgroup_tree(&self.dir, &self.parent);
    }
}

// ---------------------------------------------------------------------------------------------
// the policy and the binary

/// A policy in a `dbcage-test-*` temp dir with its own root group `dbcage-test-<tag>` under the
/// test's own cgroups. Dropping it runs `release --all` and removes whatever is left.
pub struct Tenancy {
    _dir: tempfile::TempDir,
    pub policy: PathBuf,
    pub root: String,
}

impl Tenancy {
    /// `body` is the policy without its `[agent]` table, which this adds.
    pub fn new(tag: &str, body: &str) -> Tenancy {
        let dir = tempfile::Builder::new()
            .prefix("dbcage-test-")
            .tempdir()
            .expect("temp dir");
        let t = Tenancy {
            policy: dir.path().join("dbcage.toml"),
            root: format!("dbcage-test-{tag}-{}", std::process::id()),
            _dir: dir,
        };
        t.set_policy(body);
        t
    }

    /// The full text written for `body`, `[agent]` table first.
    pub fn policy_text(&self, body: &str) -> String {
        // On v2 the parent is the group the test process started in (it runs in a leaf of it),
        // and the groups are dbcage's own even where systemd manages the host.
        let parent = match cgroups() {
            Ok(Cgroups::V2 { base, .. }) => format!("{base:?}\nmanager = \"cgroupfs\""),
            _ => "\"self\"".into(),
        };
        format!(
            "[agent]\nparent = {parent}\nroot = \"{}\"\n\n{body}",
            self.root
        )
    }

    /// The policy's `dbcage-test-*` temp dir (removed with the Tenancy).
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    pub fn set_policy(&self, body: &str) {
        std::fs::write(&self.policy, self.policy_text(body)).expect("write policy");
    }

    /// Runs `dbcage -c POLICY ARGS...`.
    pub fn run(&self, args: &[&str]) -> Output {
        Command::new(DBCAGE)
            .arg("-c")
            .arg(&self.policy)
            .args(args)
            .env_remove("DBCAGE_CONFIG")
            .output()
            .expect("run dbcage")
    }

    /// Runs it, asserts exit 0, returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "dbcage {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let text = self.ok(args);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?}: bad JSON ({e}):\n{text}"))
    }

    pub fn root_dir(&self, controller: &str) -> PathBuf {
        parent_dir(controller).join(&self.root)
    }

    /// `knob`'s file in `tenant`'s group (where the drivers write it).
    pub fn knob_path(&self, tenant: &str, knob: Knob) -> PathBuf {
        self.tenant_dir(knob.controller(), tenant).join(knob.file())
    }

    /// The raw text of `knob`'s file in `tenant`'s group.
    pub fn knob(&self, tenant: &str, knob: Knob) -> String {
        let f = self.knob_path(tenant, knob);
        std::fs::read_to_string(&f)
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
            .trim()
            .to_string()
    }

    pub fn tenant_dir(&self, controller: &str, tenant: &str) -> PathBuf {
        self.root_dir(controller).join(tenant)
    }

    pub fn leaf_dir(&self, controller: &str, tenant: &str, leaf: &str) -> PathBuf {
        self.tenant_dir(controller, tenant).join(leaf)
    }

    /// The controllers `tenant` has groups in, where its processes are checked: dbcage makes a
    /// tenant's groups only in the hierarchies its settings use, blkio, cpu and cpuacct always
    /// (never an empty list, so a check over it cannot pass for want of groups), cpuset and
    /// memory when its group is there (it pins cpus or nodes; it has a memory setting).
    pub fn grouped(&self, tenant: &str) -> Vec<&'static str> {
        CONTROLLERS
            .iter()
            .copied()
            .filter(|c| ALWAYS_GROUPED.contains(c) || self.tenant_dir(c, tenant).is_dir())
            .collect()
    }

    /// A string that a process's cgroup path contains once it is in `tenant`'s `leaf`.
    /// The cgroup layout dbcage finds for this policy on this host: tenants' limits read back
    /// through it go through the driver of each hierarchy, whatever its cgroup version.
    pub fn layout(&self) -> dbcage::cgroup::Layout {
        let path = dbcage::policy::PolicyPath::new(&self.policy, Default::default());
        dbcage::engine::layout_for(&path)
            .unwrap_or_else(|e| panic!("the layout for {}: {e:#}", self.policy.display()))
            .1
    }

    pub fn marker(&self, tenant: &str, leaf: &str) -> String {
        format!("/{}/{tenant}/{leaf}", self.root)
    }
}

impl Drop for Tenancy {
    fn drop(&mut self) {
        if !CONTROLLERS.iter().any(|c| self.root_dir(c).exists()) {
            return; // nothing was created (an invalid policy, or released already)
        }
        let out = self.run(&["release", "--all"]);
        if !out.status.success() {
            eprintln!(
                "cleanup: dbcage release --all: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        for c in CONTROLLERS {
            remove_cgroup_tree(&self.root_dir(c), &refuge_dir(c));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// processes

/// A child process that is killed (by its pid) and reaped when dropped.
pub struct Child {
    inner: std::process::Child,
    pub pid: u32,
    pub name: String,
    done: Option<ExitStatus>,
}

impl Child {
    pub fn spawn(mut cmd: Command, name: &str) -> Child {
        let inner = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {name}: {e}"));
        Child {
            pid: inner.id(),
            inner,
            name: name.to_string(),
            done: None,
        }
    }

    /// `program args...` with argv[0] = `name`, stdout and stderr captured.
    pub fn named(name: &str, program: &str, args: &[&str]) -> Child {
        let mut cmd = Command::new(program);
        cmd.arg0(name)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Child::spawn(cmd, name)
    }

    /// ioload.py with argv[0] = `name`.
    pub fn ioload(name: &str, args: &[&str]) -> Child {
        let mut all = vec![IOLOAD];
        all.extend_from_slice(args);
        Child::named(name, python(), &all)
    }

    /// Waits for the process to exit and returns its status and stdout (panics after timeout,
    /// with its stderr).
    pub fn finish(&mut self, timeout: Duration) -> (ExitStatus, String) {
        let (status, out, err) = self.finish_output(timeout);
        if !err.trim().is_empty() {
            eprintln!("{} stderr: {}", self.name, err.trim());
        }
        (status, out)
    }

    /// Like `finish`, returning stdout and stderr.
    pub fn finish_output(&mut self, timeout: Duration) -> (ExitStatus, String, String) {
        let end = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.inner.try_wait().expect("try_wait") {
                break s;
            }
            if Instant::now() > end {
                panic!(
                    "{} (pid {}) did not finish in {timeout:?}",
                    self.name, self.pid
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.done = Some(status);
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut s) = self.inner.stdout.take() {
            let _ = s.read_to_string(&mut out);
        }
        if let Some(mut s) = self.inner.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        (status, out, err)
    }

    /// Finishes an ioload run that must succeed and returns its JSON line.
    pub fn load_result(&mut self, timeout: Duration) -> serde_json::Value {
        let (status, out) = self.finish(timeout);
        assert!(
            status.success(),
            "{} exited with {status}: {out}",
            self.name
        );
        let line = out.lines().last().unwrap_or("");
        serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{}: bad output ({e}): {out}", self.name))
    }

    pub fn alive(&mut self) -> bool {
        self.done.is_none() && matches!(self.inner.try_wait(), Ok(None))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.done.is_none() {
            let _ = self.inner.kill();
            let _ = self.inner.wait();
        }
    }
}

/// utime + stime of a process, in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    let rest: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .collect();
    // rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    rest[11].parse::<u64>().unwrap() + rest[12].parse::<u64>().unwrap()
}

pub fn clock_ticks() -> u64 {
    let out = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .expect("getconf");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("CLK_TCK")
}

/// A field of /proc/PID/status, e.g. `Cpus_allowed_list`.
pub fn status_field(pid: u32, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

// ---------------------------------------------------------------------------------------------
// disks

fn sh(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "{program} {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// An ext4 file system on a loop device over a sparse file, mounted in a `dbcage-test-*` temp
/// dir. Dropping it unmounts and detaches; a half-built one undoes what was done.
pub struct LoopDisk {
    pub dir: tempfile::TempDir,
    /// `/dev/loopN`, once attached.
    pub dev: Option<String>,
    pub mount: PathBuf,
    mounted: bool,
}

impl LoopDisk {
    pub fn new(size_mib: u64) -> LoopDisk {
        let dir = tempfile::Builder::new()
            .prefix("dbcage-test-disk-")
            .tempdir()
            .expect("temp dir");
        let mut d = LoopDisk {
            mount: dir.path().join("dbcage-test-mnt"),
            dir,
            dev: None,
            mounted: false,
        };
        let img = d.dir.path().join("dbcage-test.img");
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(size_mib << 20))
            .expect("sparse image");
        let img = img.to_string_lossy().into_owned();
        let dev = sh("losetup", &["--find", "--show", &img]).expect("losetup");
        d.dev = Some(dev.clone());
        sh("mkfs.ext4", &["-q", "-F", &dev]).expect("mkfs.ext4");
        std::fs::create_dir(&d.mount).expect("mount dir");
        sh("mount", &[&dev, &d.mount.to_string_lossy()]).expect("mount");
        d.mounted = true;
        d
    }

    pub fn dev(&self) -> &str {
        self.dev.as_deref().unwrap()
    }

    /// `MAJ:MIN` of the loop device.
    pub fn devnum(&self) -> String {
        let rdev = std::fs::metadata(self.dev()).expect("stat dev").rdev();
        format!(
            "{}:{}",
            nix::sys::stat::major(rdev),
            nix::sys::stat::minor(rdev)
        )
    }

    /// Kernel name (`loop3`).
    pub fn name(&self) -> String {
        self.dev().trim_start_matches("/dev/").to_string()
    }

    pub fn mount_str(&self) -> String {
        self.mount.to_string_lossy().into_owned()
    }

    /// Writes a file of `mib` MiB through to the disk (O_DIRECT), so reads of it hit the device.
    pub fn fill(&self, name: &str, mib: u64) -> String {
        let path = self.mount.join(name).to_string_lossy().into_owned();
        sh(
            "dd",
            &[
                "if=/dev/zero",
                &format!("of={path}"),
                "bs=1M",
                &format!("count={mib}"),
                "oflag=direct",
                "conv=fsync",
                "status=none",
            ],
        )
        .expect("dd");
        path
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        if self.mounted {
            let m = self.mount_str();
            let ok = (0..50).any(|_| {
                sh("umount", &[&m]).is_ok() || {
                    std::thread::sleep(Duration::from_millis(100));
                    false
                }
            });
            if !ok {
                eprintln!("cleanup: could not unmount {m}; detaching lazily");
                let _ = sh("umount", &["-l", &m]);
            }
        }
        if let Some(dev) = &self.dev {
            if let Err(e) = sh("losetup", &["-d", dev]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

/// Throughput in MiB/s from an ioload result.
pub fn mib_per_s(r: &serde_json::Value) -> f64 {
    r["bytes"].as_f64().unwrap() / r["seconds"].as_f64().unwrap() / (1 << 20) as f64
}

pub fn iops(r: &serde_json::Value) -> f64 {
    r["ios"].as_f64().unwrap() / r["seconds"].as_f64().unwrap()
}

/// Asserts `value` is within `[want*(1-below), want*(1+above)]`.
pub fn assert_near(what: &str, value: f64, want: f64, below: f64, above: f64) {
    let (lo, hi) = (want * (1.0 - below), want * (1.0 + above));
    assert!(
        (lo..=hi).contains(&value),
        "{what}: measured {value:.3}, expected {want} (from {lo:.3} to {hi:.3})"
    );
}

// ---------------------------------------------------------------------------------------------
// the daemon

/// `dbcage -c POLICY run --stats-out FILE ARGS...` (with `--metrics off` unless ARGS set it) as
/// a child, started and waited for until it logs that it runs. Dropping it stops it (SIGCONT, then SIGTERM by pid; SIGKILL if it does not
/// exit within 5 s) before the borrowed Tenancy releases and removes the groups.
pub struct Daemon<'a> {
    /// Borrowed so that the Tenancy (and its cleanup) outlives the daemon.
    _tenancy: &'a Tenancy,
    inner: std::process::Child,
    pub pid: u32,
    log: std::sync::Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
    pub stats_path: PathBuf,
    status: Option<ExitStatus>,
}

impl<'a> Daemon<'a> {
    pub fn start(t: &'a Tenancy, args: &[&str]) -> Daemon<'a> {
        Daemon::start_wrapped(t, &[], args)
    }

    /// Runs it under `wrapper` (a program and its arguments, e.g. `setpriv ... --`) and waits
    /// until it says it runs (after its first apply).
    pub fn start_wrapped(t: &'a Tenancy, wrapper: &[&str], args: &[&str]) -> Daemon<'a> {
        Daemon::start_within(t, wrapper, args, Duration::from_secs(15))
    }

    /// Like `start_wrapped`, waiting up to `timeout` for it to run (a first apply that has
    /// hundreds of processes to move).
    pub fn start_within(
        t: &'a Tenancy,
        wrapper: &[&str],
        args: &[&str],
        timeout: Duration,
    ) -> Daemon<'a> {
        let mut d = Daemon::spawn(t, wrapper, args);
        let ready = wait_until(timeout, || d.log().contains("dbcage running") || !d.alive());
        assert!(
            ready && d.alive(),
            "dbcage run did not start (exit {:?}); its log:\n{}",
            d.status,
            d.log()
        );
        d
    }

    /// Starts it without waiting for anything (a test that stops it in its first apply).
    pub fn spawn(t: &'a Tenancy, wrapper: &[&str], args: &[&str]) -> Daemon<'a> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let stats_path = t.dir().join(format!(
            "dbcage-test-stats-{}.json",
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let mut cmd = dbcage_behind(wrapper);
        cmd.arg("-c")
            .arg(&t.policy)
            .arg("run")
            .arg("--stats-out")
            .arg(&stats_path)
            .args(args)
            // No metrics endpoint unless asked for: parallel daemons on a shared host would
            // contend for the default port.
            .args(if args.contains(&"--metrics") {
                &[][..]
            } else {
                &["--metrics", "off"][..]
            })
            .env_remove("DBCAGE_CONFIG")
            .env_remove("DBCAGE_LOG")
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut inner = cmd.spawn().expect("spawning dbcage run");
        let log = std::sync::Arc::new(Mutex::new(String::new()));
        let stderr = inner.stderr.take().expect("stderr");
        let sink = log.clone();
        let reader = std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut l = sink.lock().unwrap_or_else(|e| e.into_inner());
                l.push_str(&line);
                l.push('\n');
            }
        });
        Daemon {
            _tenancy: t,
            pid: inner.id(),
            inner,
            log,
            reader: Some(reader),
            stats_path,
            status: None,
        }
    }

    /// Everything it has written to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until its log contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        wait_until(timeout, || self.log().contains(needle))
    }

    pub fn alive(&mut self) -> bool {
        if self.status.is_none() {
            if let Ok(Some(s)) = self.inner.try_wait() {
                self.status = Some(s);
            }
        }
        self.status.is_none()
    }

    /// Sends `sig` to it, by pid, if it has not exited (and been reaped) yet.
    /// Writes `body` as the tenancy's policy, sends SIGHUP and waits until the daemon logs the
    /// reload (panics with its log otherwise).
    pub fn reload_with(&mut self, t: &Tenancy, body: &str) {
        let before = self.log().matches("policy reloaded").count();
        t.set_policy(body);
        self.signal(nix::sys::signal::Signal::SIGHUP);
        assert!(
            wait_until(Duration::from_secs(10), || self
                .log()
                .matches("policy reloaded")
                .count()
                > before),
            "the daemon did not reload:\n{}",
            self.log()
        );
    }

    pub fn signal(&mut self, sig: nix::sys::signal::Signal) {
        if self.alive() {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid as i32), sig)
                .unwrap_or_else(|e| panic!("kill -{sig} {}: {e}", self.pid));
        }
    }

    /// Waits up to `timeout` for it to exit; its status once it has.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_until(timeout, || !self.alive());
        if self.status.is_some() {
            if let Some(r) = self.reader.take() {
                let _ = r.join(); // stderr is closed: the log is complete
            }
        }
        self.status
    }

    /// SIGTERM, then waits up to `timeout`: its exit status and how long it took.
    pub fn stop(&mut self, timeout: Duration) -> (Option<ExitStatus>, Duration) {
        let t0 = Instant::now();
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let status = self.wait_exit(timeout);
        (status, t0.elapsed())
    }

    /// SIGKILL, and reaps it.
    pub fn kill(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        assert!(
            self.wait_exit(Duration::from_secs(5)).is_some(),
            "dbcage run (pid {}) survived SIGKILL",
            self.pid
        );
    }

    /// The statistics it wrote when it stopped.
    pub fn stats(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(&self.stats_path)
            .unwrap_or_else(|e| panic!("{}: {e}; log:\n{}", self.stats_path.display(), self.log()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("stats: {e}: {text}"))
    }
}

impl Drop for Daemon<'_> {
    fn drop(&mut self) {
        if self.alive() {
            use nix::sys::signal::Signal;
            let pid = nix::unistd::Pid::from_raw(self.pid as i32);
            let _ = nix::sys::signal::kill(pid, Signal::SIGCONT);
            let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
            if self.wait_exit(Duration::from_secs(5)).is_none() {
                eprintln!(
                    "cleanup: dbcage run (pid {}) ignored SIGTERM; killing it",
                    self.pid
                );
                let _ = self.inner.kill();
                let _ = self.inner.wait();
            }
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// A raw loop device over a sparse file in a `dbcage-test-*` temp dir (no file system: an ASM
/// disk, a device to probe or trace), detached when dropped.
pub struct RawDisk {
    _dir: tempfile::TempDir,
    pub img: PathBuf,
    pub dev: String,
}

impl RawDisk {
    pub fn new(size_mib: u64) -> RawDisk {
        let dir = tempfile::Builder::new()
            .prefix("dbcage-test-raw-")
            .tempdir()
            .expect("temp dir");
        let img = dir.path().join("dbcage-test-raw.img");
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(size_mib << 20))
            .expect("sparse image");
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&img)
            .output()
            .expect("losetup");
        assert!(out.status.success(), "losetup: {out:?}");
        RawDisk {
            _dir: dir,
            img,
            dev: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        }
    }

    /// The kernel's name of the device (`loop3`).
    pub fn name(&self) -> String {
        self.dev.trim_start_matches("/dev/").to_string()
    }

    /// Blocks the image file holds (what was written through the device).
    pub fn blocks(&self) -> u64 {
        std::fs::metadata(&self.img).expect("image").blocks()
    }
}

impl Drop for RawDisk {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}
