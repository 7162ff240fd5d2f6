//! A thousand tenants on the real host (issue 23): `dbcage apply` with nothing to do, `dbcage
//! status`, one metrics scrape and the daemon's periodic rescan, for this build and, side by side
//! in the same run, an older one (`DBCAGE_OLD_BIN`), as the host's process count grows.
//!
//! `cargo bench --bench thousand -- [--tenants 1000] [--per-tenant 3] [--procs 10000,20000,28000]
//! [--runs 3] [--rescan-window 8]` (root; cgroup v1 or v2).
//!
//! It writes bench/run-storm.sh's 1,000-tenant policy (two rules each, a `cmdline` and a `comm`;
//! `parent = "self"`, root `dbcage-test-thousand-PID`, so memory groups sit under this process's
//! own memory cgroup), forks `--per-tenant` sleepers per tenant named `oracleTNNNN` (their `comm`
//! rule matches) and idle sleepers (`dbcage-test-idl`) up to each `--procs` total, then for each
//! build, alternating, `--runs` times: `apply` (the first apply of the run does the work; the
//! timed ones have nothing to do), `status --interval 0` (one sample: the default interval
//! sleeps 1 s between two), and a daemon (`dbcage run`) whose metrics endpoint
//! is scraped over HTTP (its first scrape, which opens the groups the endpoint keeps open, on
//! its own as "cold"; then ten more) and whose rescans (`--rescan-interval 1s`) are counted by its own
//! `dbcage_rescans` counter. CPU is user+system: of the command (`getrusage` of the waited
//! child), or of the daemon over all its threads (`/proc/PID/stat`, 10-ms ticks: hence several
//! scrapes and a window of rescans, divided). The daemon's CPU while idle (no scrape, no
//! rescan) is measured first and taken off.
//!
//! Sleepers are forked (no exec) and die with this process (`PR_SET_PDEATHSIG`); they, the
//! daemon, the groups (`release --all`, then any group left) are all removed at the end, also on
//! panic, and on SIGINT, SIGTERM and SIGHUP (`common::trap_signals`). The sleepers need free memory
//! (about 100 KiB each) and pids (`kernel.pid_max`): the bench refuses a `--procs` that leaves
//! fewer than 2,000 pids or 2 GiB of memory to the host.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

/// The sleepers: children of a spawner forked at the start, while this process is small (a
/// fork copies the parent's page tables, and `status` walks every member's with smaps_rollup),
/// in a process group of its own; they die with it (`PR_SET_PDEATHSIG`), and it with this
/// process.
struct Sleepers {
    to: std::fs::File,
    from: std::io::BufReader<std::fs::File>,
    count: usize,
    /// Ends them all (`end_sleepers`).
    _end: common::Guard,
}

/// Sets the parent-death signal and, if the parent is already gone, exits.
fn die_with(parent: libc::pid_t) {
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != parent {
            libc::_exit(0);
        }
    }
}

impl Sleepers {
    /// Forks the spawner. Call it before any thread but the signal one (`common::trap_signals`,
    /// which only waits in sigwait and holds no lock a fork could copy held).
    fn start() -> Sleepers {
        use std::io::BufRead as _;
        use std::os::fd::FromRawFd as _;
        let pipe = || {
            let mut fds = [0; 2];
            assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
            unsafe {
                (
                    std::fs::File::from_raw_fd(fds[0]),
                    std::fs::File::from_raw_fd(fds[1]),
                )
            }
        };
        let (orders_r, orders_w) = pipe();
        let (done_r, mut done_w) = pipe();
        let bench = unsafe { libc::getpid() };
        let spawner = unsafe { libc::fork() };
        assert!(spawner >= 0, "fork: {}", std::io::Error::last_os_error());
        if spawner == 0 {
            // The spawner: "COUNT NAME" orders, one line each, answered "ok" once forked.
            die_with(bench);
            unsafe { libc::setpgid(0, 0) };
            let me = unsafe { libc::getpid() };
            drop((orders_w, done_r));
            for line in std::io::BufReader::new(orders_r).lines() {
                let Ok(line) = line else { break };
                let Some((count, name)) = line.split_once(' ') else {
                    break;
                };
                let name = std::ffi::CString::new(name).unwrap();
                for _ in 0..count.parse::<usize>().unwrap_or(0) {
                    if unsafe { libc::fork() } == 0 {
                        die_with(me);
                        unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
                        loop {
                            unsafe { libc::pause() };
                        }
                    }
                }
                let _ = writeln!(done_w, "ok");
            }
            unsafe { libc::_exit(0) };
        }
        drop((orders_r, done_w));
        Sleepers {
            to: orders_w,
            from: std::io::BufReader::new(done_r),
            count: 0,
            _end: common::on_exit(move || end_sleepers(spawner)),
        }
    }

    /// `count` more sleepers named `comm`.
    fn add(&mut self, count: usize, comm: &str) {
        use std::io::BufRead as _;
        writeln!(self.to, "{count} {comm}").unwrap();
        let mut answer = String::new();
        self.from.read_line(&mut answer).unwrap();
        assert_eq!(answer.trim(), "ok", "the spawner stopped");
        self.count += count;
    }
}

/// Kills the spawner's process group and waits until it is empty.
fn end_sleepers(spawner: libc::pid_t) {
    unsafe {
        libc::kill(-spawner, libc::SIGKILL);
        libc::waitpid(spawner, std::ptr::null_mut(), 0);
    }
    // Its children, reparented, are reaped by init: wait until the group is empty.
    let start = Instant::now();
    while unsafe { libc::kill(-spawner, 0) } == 0 && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The daemon, if one runs: stopped (`stop`) when the guard drops.
struct Fixture {
    dir: PathBuf,
    policy: PathBuf,
    daemon: Option<common::Guard>,
}

/// The policy's directory and groups, released at the end, with the layout read up front so
/// that nothing depends on the policy file then.
struct Groups {
    dir: PathBuf,
    /// Releases the groups (`release_groups`), then removes the directory.
    _release: common::Guard,
}

impl Groups {
    fn new(dir: tempfile::TempDir, policy: PathBuf) -> Groups {
        let fs = dbcage::hostfs::HostFs::default();
        let loaded = dbcage::policy::load(&policy, &dbcage::policy::SystemAccounts).unwrap();
        let mounts = dbcage::inventory::MountTable::read(&fs).unwrap();
        let setup = dbcage::cgroup::Setup::detect(&fs, &mounts).unwrap();
        let layout = dbcage::cgroup::Layout::new(setup, &loaded.policy.agent).unwrap();
        let tenants: Vec<String> = loaded
            .policy
            .tenants
            .iter()
            .map(|t| t.name.clone())
            .collect();
        Groups {
            dir: dir.path().to_path_buf(),
            _release: common::on_exit(move || {
                release_groups(&policy, &layout, &tenants);
                drop(dir);
            }),
        }
    }
}

/// `dbcage release --all`, then whatever it left, in every hierarchy.
fn release_groups(policy: &Path, layout: &dbcage::cgroup::Layout, tenants: &[String]) {
    let out = Command::new(env!("CARGO_BIN_EXE_dbcage"))
        .arg("-c")
        .arg(policy)
        .args(["release", "--all"])
        .output();
    if !out.as_ref().is_ok_and(|o| o.status.success()) {
        eprintln!("thousand: release --all failed: {out:?}");
    }
    for t in tenants {
        let _ = dbcage::cgroup::release_tenant(layout, t);
    }
    if let Err(e) = dbcage::cgroup::remove_root(layout) {
        eprintln!("thousand: groups left behind: {e}");
    }
}

fn ticks_per_second() -> f64 {
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

/// utime + stime of a process, all its threads (live and gone), in seconds.
fn process_cpu(pid: u32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(close) = text.rfind(')') else {
        return 0.0;
    };
    let f: Vec<&str> = text[close + 2..].split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
    ticks as f64 / ticks_per_second()
}

/// user+system time of the children waited for so far, in seconds.
fn children_cpu() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Runs `bin -c policy ARGS` to the end: (wall, cpu) in ms; panics on failure.
fn timed(bin: &Path, policy: &Path, args: &[&str]) -> (f64, f64) {
    let cpu0 = children_cpu();
    let start = Instant::now();
    let out = Command::new(bin)
        .arg("-c")
        .arg(policy)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run dbcage");
    let wall = start.elapsed().as_secs_f64() * 1000.0;
    let cpu = (children_cpu() - cpu0) * 1000.0;
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    (wall, cpu)
}

/// One GET of /metrics: (wall ms, body).
fn scrape(addr: &str) -> (f64, String) {
    let start = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the metrics endpoint");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    let wall = start.elapsed().as_secs_f64() * 1000.0;
    assert!(body.starts_with("HTTP/1.1 200"), "scrape: {body:.200}");
    (wall, body)
}

/// A counter's value (`NAME_total` or, in the text format 0.0.4, `NAME`).
fn counter(body: &str, name: &str) -> u64 {
    body.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(name)?;
            rest.strip_prefix("_total ").or(rest.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in the scrape")) as u64
}

struct DaemonFigures {
    ready_ms: f64,
    /// The median wall time and the mean CPU of the scrapes after the first.
    scrape_wall: f64,
    scrape_cpu: f64,
    /// The first scrape's CPU: it opens every group the endpoint then keeps open.
    cold_scrape_cpu: f64,
    rescan_cpu: f64,
    rescans: u64,
    /// The rescanning daemon's resident memory at the end of its window.
    rss_mib: f64,
}

/// Starts `bin run`, measures its idle CPU, its first scrape, `scrapes` scrapes after it and
/// the rescans of a window.
fn daemon(fx: &mut Fixture, bin: &Path, scrapes: usize, window: Duration) -> DaemonFigures {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let log = fx.dir.join("run.log");
    let start = Instant::now();
    let child = Command::new(bin)
        .arg("-c")
        .arg(&fx.policy)
        .args(["run", "--rescan-interval", "1h", "--metrics", &addr])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("dbcage run");
    let pid = child.id();
    fx.daemon = Some(common::on_exit(move || stop(child)));
    let ready_ms = loop {
        if std::fs::read_to_string(&log).is_ok_and(|t| t.contains("dbcage running")) {
            break start.elapsed().as_secs_f64() * 1000.0;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the daemon was not ready in 120 s: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    // Its endpoint may come up just after the ready line.
    while std::net::TcpStream::connect(&addr).is_err() {
        std::thread::sleep(Duration::from_millis(5));
    }
    // Idle: no rescan due (1 h), no scrape.
    std::thread::sleep(Duration::from_secs(1));
    let (c0, t0) = (process_cpu(pid), Instant::now());
    std::thread::sleep(Duration::from_secs(3));
    let idle_per_s = (process_cpu(pid) - c0) / t0.elapsed().as_secs_f64();
    let (c0, t0) = (process_cpu(pid), Instant::now());
    scrape(&addr);
    let cold_scrape_cpu =
        ((process_cpu(pid) - c0) - idle_per_s * t0.elapsed().as_secs_f64()) * 1000.0;
    let mut walls = Vec::new();
    let (c0, t0) = (process_cpu(pid), Instant::now());
    for _ in 0..scrapes {
        walls.push(scrape(&addr).0);
    }
    let scrape_cpu = ((process_cpu(pid) - c0) - idle_per_s * t0.elapsed().as_secs_f64())
        / scrapes as f64
        * 1000.0;
    walls.sort_by(f64::total_cmp);
    let scrape_wall = walls[walls.len() / 2];
    drop(fx.daemon.take());

    // The rescans: a second daemon that rescans every second.
    let start = Instant::now();
    let child = Command::new(bin)
        .arg("-c")
        .arg(&fx.policy)
        .args(["run", "--rescan-interval", "1s", "--metrics", &addr])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("dbcage run");
    let pid = child.id();
    fx.daemon = Some(common::on_exit(move || stop(child)));
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(start.elapsed() < Duration::from_secs(120), "no endpoint");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_secs(2));
    let r0 = counter(&scrape(&addr).1, "dbcage_rescans");
    let (c0, t0) = (process_cpu(pid), Instant::now());
    std::thread::sleep(window);
    let (c1, t1) = (process_cpu(pid), t0.elapsed().as_secs_f64());
    let rescans = counter(&scrape(&addr).1, "dbcage_rescans") - r0;
    let rescan_cpu = ((c1 - c0) - idle_per_s * t1) / rescans.max(1) as f64 * 1000.0;
    let rss_mib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?.to_owned();
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(f64::NAN, |kib| kib / 1024.0);
    drop(fx.daemon.take());
    DaemonFigures {
        ready_ms,
        scrape_wall,
        scrape_cpu,
        cold_scrape_cpu,
        rescan_cpu,
        rescans,
        rss_mib,
    }
}

/// SIGTERM (the daemon's own stop), then waits.
fn stop(mut daemon: Child) {
    unsafe { libc::kill(daemon.id() as libc::pid_t, libc::SIGTERM) };
    let _ = daemon.wait();
}

fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

fn main() {
    let mut tenants = 1000usize;
    let mut per_tenant = 3usize;
    let mut levels = vec![10_000usize, 20_000, 28_000];
    let mut runs = 3usize;
    let mut window = 8u64;
    let mut hold = 0u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--tenants" => tenants = value().parse().expect("--tenants N"),
            "--per-tenant" => per_tenant = value().parse().expect("--per-tenant N"),
            "--procs" => {
                levels = value()
                    .split(',')
                    .map(|v| v.parse().expect("--procs N,N,..."))
                    .collect()
            }
            "--runs" => runs = value().parse().expect("--runs R"),
            "--rescan-window" => window = value().parse().expect("--rescan-window SECONDS"),
            "--hold" => hold = value().parse().expect("--hold SECONDS"),
            "--bench" => {}
            "--help" | "-h" => {
                println!("cargo bench --bench thousand -- [--tenants 1000] [--per-tenant 3] [--procs 10000,20000,28000] [--runs 3] [--rescan-window 8] [--hold SECONDS (before measuring, for a profiler)]\nDBCAGE_OLD_BIN=PATH adds an older build, measured alternately with this one.");
                return;
            }
            other => panic!("unknown argument {other}"),
        }
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the thousand-tenant benchmark needs root");
        std::process::exit(1);
    }
    common::trap_signals("thousand");
    let mut builds = vec![("new", PathBuf::from(env!("CARGO_BIN_EXE_dbcage")))];
    if let Ok(old) = std::env::var("DBCAGE_OLD_BIN") {
        builds.push(("old", PathBuf::from(old)));
    }

    let pid_max: usize = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let running = std::fs::read_dir("/proc")
        .unwrap()
        .filter(|e| {
            e.as_ref().is_ok_and(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.parse::<u32>().is_ok())
            })
        })
        .count();
    let top = *levels.iter().max().unwrap();
    let extra = top.saturating_sub(running);
    assert!(
        running + extra + 2000 <= pid_max,
        "--procs {top} leaves fewer than 2,000 of kernel.pid_max ({pid_max}) to the host"
    );
    assert!(
        mem_available_kib() > extra as u64 * 100 + (2 << 20),
        "--procs {top}: {} KiB available, the sleepers need about {} KiB and the host 2 GiB",
        mem_available_kib(),
        extra * 100
    );

    // Forked first, while this process is small. On a panic the groups go first (`release`
    // moves the sleepers out to this process's groups), then the sleepers.
    let mut sleepers = Sleepers::start();
    let dir = tempfile::Builder::new()
        .prefix("dbcage-test-thousand-")
        .tempdir()
        .unwrap();
    let policy = dir.path().join("dbcage.toml");
    // bench/run-storm.sh's write_policy, with its own root.
    let mut text = format!(
        "[agent]\nparent = \"self\"\nroot = \"dbcage-test-thousand-{}\"\n",
        std::process::id()
    );
    for i in 2..=tenants {
        text.push_str(&format!(
            "\n[[tenant]]\nname = \"T{i:04}\"\nmatch = [{{ cmdline = '^ora_p[0-9a-z]{{3}}_T{i:04}( |$)' }}, {{ comm = '^oracleT{i:04}$' }}]\n"
        ));
    }
    text.push_str("\n[[tenant]]\nname = \"BX1\"\nmatch = [{ cmdline = '^ora_p[0-9a-z]{3}_BX1' }, { cmdline = '^oracleBX1' }]\n");
    std::fs::write(&policy, text).unwrap();

    let groups = Groups::new(dir, policy.clone());
    for i in 2..=tenants {
        sleepers.add(per_tenant, &format!("oracleT{i:04}"));
    }
    let mut fx = Fixture {
        dir: groups.dir.clone(),
        policy,
        daemon: None,
    };
    // The first apply does the work (groups, moves); the timed ones find nothing to do.
    let (wall, cpu) = timed(&builds[0].1, &fx.policy, &["apply"]);
    println!(
        "{tenants} tenants, {} of their processes: first apply {wall:.0} ms ({cpu:.0} ms CPU)",
        sleepers.count
    );
    println!(
        "{:>7} {:>5} {:>3}  {:>14} {:>14} {:>14} {:>5} {:>9} {:>14} {:>10} {:>8}",
        "procs",
        "build",
        "run",
        "apply wall/cpu",
        "status wall/cpu",
        "scrape wall/cpu",
        "cold",
        "ready ms",
        "rescan cpu ms",
        "(rescans)",
        "rss MiB"
    );
    for &level in &levels {
        let now = std::fs::read_dir("/proc")
            .unwrap()
            .filter(|e| {
                e.as_ref().is_ok_and(|e| {
                    e.file_name()
                        .to_str()
                        .is_some_and(|n| n.parse::<u32>().is_ok())
                })
            })
            .count();
        sleepers.add(level.saturating_sub(now), "dbcage-test-idl");
        if hold > 0 && level == levels[0] {
            // For a profiler: the policy and the first level's processes stay this long before
            // the measurements.
            println!(
                "holding {hold} s at {level} processes: policy {}",
                fx.policy.display()
            );
            std::thread::sleep(Duration::from_secs(hold));
        }
        for run in 1..=runs {
            for (name, bin) in &builds {
                let apply = timed(bin, &fx.policy, &["apply"]);
                let status = timed(bin, &fx.policy, &["status", "--interval", "0"]);
                let d = daemon(&mut fx, bin, 10, Duration::from_secs(window));
                println!(
                    "{level:>7} {name:>5} {run:>3}  {:>6.0} / {:>5.0} {:>6.0} / {:>5.0} {:>6.1} / {:>5.1} {:>5.0} {:>9.0} {:>14.1} {:>10} {:>8.1}",
                    apply.0, apply.1, status.0, status.1, d.scrape_wall, d.scrape_cpu, d.cold_scrape_cpu, d.ready_ms, d.rescan_cpu, d.rescans, d.rss_mib
                );
                println!(
                    "{{\"procs\":{level},\"build\":\"{name}\",\"run\":{run},\"apply_wall_ms\":{:.1},\"apply_cpu_ms\":{:.1},\"status_wall_ms\":{:.1},\"status_cpu_ms\":{:.1},\"scrape_wall_ms\":{:.2},\"scrape_cpu_ms\":{:.2},\"cold_scrape_cpu_ms\":{:.1},\"ready_ms\":{:.0},\"rescan_cpu_ms\":{:.2},\"rescans\":{},\"rss_mib\":{:.1}}}",
                    apply.0, apply.1, status.0, status.1, d.scrape_wall, d.scrape_cpu, d.cold_scrape_cpu, d.ready_ms, d.rescan_cpu, d.rescans, d.rss_mib
                );
            }
        }
    }
    drop(fx);
    drop(sleepers);
    drop(groups);
}
