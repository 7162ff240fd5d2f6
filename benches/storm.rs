//! Classification-latency storm (issue 8, "Performance, measured against the peer in the same run").
//!
//! `cargo bench --bench storm -- [OPTIONS]` (harness = false). The bench binary has two roles:
//!
//! * CHILD: started through a link named like a seed process (`ora_p001_BX1`, `oracleBX1`; a hard
//!   link to a copy of this binary, so that comm, argv[0] and /proc/PID/exe all carry the name)
//!   with `DBCAGE_STORM_CHILD=1`. At the very top of `main` it reads CLOCK_MONOTONIC, then polls
//!   /proc/self/cgroup until the `cpu` controller's line (cgroup v1) or, on a pure cgroup v2 host,
//!   the `0::` line shows exactly the expected group (`DBCAGE_STORM_EXPECT`) or a deadline passes, appends one line to `DBCAGE_STORM_OUT` (O_APPEND), lives
//!   `DBCAGE_STORM_EXTRA_MS` longer and exits.
//! * PARENT: spawns such children at set rates for a set duration, mixing short-lived (exit as
//!   soon as classified) and long-lived ones, reaps them, and reports per rate p50/p99/max delay,
//!   the processes never classified, and the classifier's CPU time and peak RSS. `--baseline`
//!   moves each child into a cgroup itself (writing cgroup.procs) to show the kernel's own cost.
//! * FORK COST (`--fork-cost N`): times N fork+exit+wait and N spawn+exec+wait cycles, to show
//!   what a cgroup mount option such as `favordynmods` costs every fork and exit on the host.
//!
//! Every object it creates has `dbcage-test` in its name and is removed on the way out.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;

mod common;

const ENV_CHILD: &str = "DBCAGE_STORM_CHILD";
const ENV_EXPECT: &str = "DBCAGE_STORM_EXPECT";
const ENV_OUT: &str = "DBCAGE_STORM_OUT";
const ENV_EXTRA_MS: &str = "DBCAGE_STORM_EXTRA_MS";
const ENV_DEADLINE_MS: &str = "DBCAGE_STORM_DEADLINE_MS";
const ENV_T0: &str = "DBCAGE_STORM_T0";
const ENV_KIND: &str = "DBCAGE_STORM_KIND";
/// Which line of /proc/self/cgroup the child reads: `cpu`, `v2` or `auto` (see [`Line`]).
const ENV_LINE: &str = "DBCAGE_STORM_LINE";
/// Set for the `--fork-cost` exec cycles: the process exits at once.
const ENV_NOP: &str = "DBCAGE_STORM_NOP";

fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn main() -> ExitCode {
    // The child's clock starts here, before anything else.
    let start = mono_ns();
    if std::env::var_os(ENV_NOP).is_some() {
        return ExitCode::SUCCESS;
    }
    if std::env::var_os(ENV_CHILD).is_some() {
        return child(start);
    }
    match parent() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("storm: {e}");
            ExitCode::from(2)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Child

/// Which line of /proc/self/cgroup tells a child's group.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Line {
    /// The v1 `cpu` controller's line (`N:cpu,cpuacct:/path`).
    Cpu,
    /// The cgroup v2 line (`0::/path`).
    V2,
    /// The `cpu` line if there is one, else the `0::` line (a pure v2 host has only that).
    Auto,
}

impl Line {
    fn parse(s: &str) -> Result<Line, String> {
        match s {
            "cpu" => Ok(Line::Cpu),
            "v2" => Ok(Line::V2),
            "auto" => Ok(Line::Auto),
            _ => Err(format!("`{s}`: expected cpu, v2 or auto")),
        }
    }
    fn as_str(self) -> &'static str {
        match self {
            Line::Cpu => "cpu",
            Line::V2 => "v2",
            Line::Auto => "auto",
        }
    }
}

/// Is the group of `line` in /proc/self/cgroup's `text` exactly `expect`?
fn in_group(text: &[u8], expect: &[u8], line: Line) -> bool {
    let mut v2: Option<&[u8]> = None;
    for l in text.split(|b| *b == b'\n') {
        let mut parts = l.splitn(3, |b| *b == b':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == b"0" && ctrls.is_empty() {
            v2 = Some(path);
            continue;
        }
        if line != Line::V2 && ctrls.split(|b| *b == b',').any(|c| c == b"cpu") {
            return path == expect;
        }
    }
    line != Line::Cpu && v2 == Some(expect)
}

/// The checks of [`in_group`] on the layouts of /proc/self/cgroup this bench meets (harness =
/// false: they run at every start of the parent and alone with `--self-test`).
fn self_test() {
    // cgroup v1 (hybrid: a `0::` line as well): the cpu line decides in `auto`.
    let t = b"4:memory:/x\n2:cpuacct:/\n1:cpu:/dbcage-test-storm/BX1/limited\n0::/\n";
    for line in [Line::Cpu, Line::Auto] {
        assert!(in_group(t, b"/dbcage-test-storm/BX1/limited", line));
        assert!(!in_group(t, b"/dbcage-test-storm/BX1", line));
        assert!(in_group(b"3:cpu,cpuacct:/a/BX1\n", b"/a/BX1", line));
        assert!(!in_group(b"2:cpuacct:/a/BX1\n1:cpu:/\n", b"/a/BX1", line));
        // The cpu line is not where expected: the v2 line does not stand in for it.
        assert!(!in_group(b"1:cpu:/\n0::/a/BX1\n", b"/a/BX1", line));
    }
    assert!(!in_group(t, b"/", Line::Cpu));
    // Hybrid host, asked for the unified hierarchy: only the `0::` line counts.
    assert!(in_group(t, b"/", Line::V2));
    assert!(!in_group(t, b"/dbcage-test-storm/BX1/limited", Line::V2));
    // Pure cgroup v2: one `0::` line, with or without a trailing newline.
    let v2 = b"0::/dbcage-test-storm/BX1/limited\n";
    for line in [Line::V2, Line::Auto] {
        assert!(in_group(v2, b"/dbcage-test-storm/BX1/limited", line));
        assert!(in_group(b"0::/a/BX1", b"/a/BX1", line));
        assert!(!in_group(v2, b"/dbcage-test-storm/BX1", line));
        assert!(!in_group(v2, b"/dbcage-test-storm/BX1/limited/x", line));
        assert!(!in_group(b"0::/\n", b"/a/BX1", line));
        assert!(!in_group(b"", b"/a/BX1", line));
    }
    assert!(!in_group(v2, b"/dbcage-test-storm/BX1/limited", Line::Cpu));
    // A v1 named hierarchy (`1:name=systemd:/x`) is neither the cpu nor the v2 line.
    assert!(!in_group(b"1:name=systemd:/a/BX1\n", b"/a/BX1", Line::Auto));
    // The cgroup2 mount a --baseline group lives on.
    let mi = "22 1 0:21 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,favordynmods\n\
              23 22 0:22 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
    assert_eq!(
        cgroup2_mount(mi, Path::new("/sys/fs/cgroup/dbcage-test-b")),
        Some((PathBuf::from("/sys/fs/cgroup"), PathBuf::from("/")))
    );
    assert_eq!(cgroup2_mount(mi, Path::new("/sys/fs/cgroupx/a")), None);
    let hybrid = "30 25 0:26 /sub /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
    assert_eq!(
        cgroup2_mount(hybrid, Path::new("/sys/fs/cgroup/unified/dbcage-test-b")),
        Some((
            PathBuf::from("/sys/fs/cgroup/unified"),
            PathBuf::from("/sub")
        ))
    );
    assert_eq!(
        cgroup2_mount(hybrid, Path::new("/sys/fs/cgroup/cpu/dbcage-test-b")),
        None
    );
}

/// The cgroup2 mount that holds `dir` (the longest mount point above it) from /proc/self/mountinfo
/// text: (mount point, the mount's root within the hierarchy).
fn cgroup2_mount(mountinfo: &str, dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let mut best: Option<(PathBuf, PathBuf)> = None;
    for l in mountinfo.lines() {
        let Some((pre, post)) = l.split_once(" - ") else {
            continue;
        };
        if post.split_whitespace().next() != Some("cgroup2") {
            continue;
        }
        let f: Vec<&str> = pre.split_whitespace().collect();
        let (Some(root), Some(mp)) = (f.get(3), f.get(4)) else {
            continue;
        };
        // mountinfo escapes blanks as \040: cgroup mount points here have none.
        let mp = PathBuf::from(mp);
        if dir.starts_with(&mp)
            && dir != mp
            && best
                .as_ref()
                .is_none_or(|(b, _)| mp.as_os_str().len() > b.as_os_str().len())
        {
            best = Some((mp, PathBuf::from(root)));
        }
    }
    best
}

fn child(start: u64) -> ExitCode {
    let expect = std::env::var(ENV_EXPECT).unwrap_or_default();
    let out = std::env::var_os(ENV_OUT);
    let num = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let extra_ms = num(ENV_EXTRA_MS, 0);
    let deadline_ns = num(ENV_DEADLINE_MS, 2000) * 1_000_000;
    let t0 = num(ENV_T0, 0);
    let kind = std::env::var(ENV_KIND).unwrap_or_else(|_| "s".into());
    let which = std::env::var(ENV_LINE)
        .ok()
        .and_then(|v| Line::parse(&v).ok())
        .unwrap_or(Line::Auto);
    let mut buf = [0u8; 4096];
    let mut polls = 0u64;
    let mut first_poll = 0u64;
    let mut seen: Option<u64> = None;
    if let Ok(f) = File::open("/proc/self/cgroup") {
        loop {
            // A seq_file re-generates its text on every read from offset 0.
            let n = f.read_at(&mut buf, 0).unwrap_or(0);
            let now = mono_ns();
            polls += 1;
            if polls == 1 {
                first_poll = now - start;
            }
            if in_group(&buf[..n], expect.as_bytes(), which) {
                seen = Some(now - start);
                break;
            }
            let waited = now - start;
            if waited >= deadline_ns {
                break;
            }
            // Steps of 5% of the time waited so far (50 us to 1 ms) for the first 20 ms, then of
            // 10% (2 to 100 ms): fine where the targets are, and cheap for children that wait
            // long, so that a storm of them does not starve the classifier it measures.
            let step_us = if waited < 20_000_000 {
                (waited / 20_000).clamp(50, 1000)
            } else {
                (waited / 10_000).clamp(2000, 100_000)
            };
            std::thread::sleep(Duration::from_micros(step_us));
        }
    }
    let lived = mono_ns() - start;
    // One line: pid kind delay_ns|never first_poll_ns spawn_to_start_ns polls lived_ns seen_at_ns
    let line = format!(
        "{} {} {} {} {} {} {} {}\n",
        std::process::id(),
        kind,
        seen.map(|d| d.to_string())
            .unwrap_or_else(|| "never".into()),
        first_poll,
        if t0 > 0 { start.saturating_sub(t0) } else { 0 },
        polls,
        lived + extra_ms * 1_000_000,
        seen.map(|d| start + d).unwrap_or(0),
    );
    if let Some(out) = out {
        if let Ok(mut f) = OpenOptions::new().append(true).open(out) {
            let _ = f.write_all(line.as_bytes());
        }
    }
    if extra_ms > 0 {
        std::thread::sleep(Duration::from_millis(extra_ms));
    }
    ExitCode::SUCCESS
}

// ---------------------------------------------------------------------------------------------
// Parent

struct Opts {
    rates: Vec<u64>,
    duration: Duration,
    classifier_pid: Option<u32>,
    name: String,
    expect: String,
    long_every: u64,
    long_ms: u64,
    deadline_ms: u64,
    names: usize,
    pause: Duration,
    json_out: Option<PathBuf>,
    tmpdir: PathBuf,
    baseline: Vec<PathBuf>,
    wait_ready: Option<Duration>,
    print_names: bool,
    symlinks: bool,
    spawners: usize,
    max_alive: usize,
    max_lag_ms: u64,
    line: Line,
    watch_ms: u64,
    fork_cost: Option<u64>,
    exec_cycles: Option<u64>,
    self_test: bool,
    parent_comm: Option<String>,
}

const USAGE: &str = "\
usage: cargo bench --bench storm -- [OPTIONS]
  --rates 50,500,2000        execs per second, one run each (default 50,500,2000)
  --duration SECS            length of each run (default 3)
  --classifier-pid PID       the classifier's pid: CPU time and peak RSS are read from /proc/PID
  --name NAME                label of the classifier in the table and JSON (default classifier)
  --expect PATH              cgroup path a classified child must show (default
                             /dbcage-test-storm/BX1/limited)
  --cgroup-line cpu|v2|auto  the line of /proc/self/cgroup the children read: the v1 cpu
                             controller's, the cgroup v2 `0::` line, or auto (default: the cpu
                             line if there is one, else the `0::` line; a --baseline group on a
                             cgroup2 mount sets v2 unless a cpu group is given too)
  --long-every N             every Nth child lives --long-ms more after it is classified (default 2)
  --long-ms MS               extra lifetime of long-lived children (default 200)
  --deadline-ms MS           a child gives up polling after this long (default 2000)
  --names N                  number of ora_pNNN_BX1 names used, plus oracleBX1 (default 8)
  --pause SECS               quiet time between rates (default 1)
  --spawners N               threads that spawn the children, sharing one schedule (default 2)
  --max-alive N              never more than N children alive at once (default 500)
  --max-lag-ms MS            a slot this late is skipped rather than caught up (default 50)
  --json-out FILE            append the JSON lines to FILE as well
  --tmpdir DIR               where the dbcage-test-storm-XXXX directory is made (default /tmp)
  --baseline CGROUP_DIR      no classifier: the bench moves each child into this cgroup itself
                             (created and removed by the bench; name must hold dbcage-test): a
                             group under /sys/fs/cgroup/cpu/ (v1) or on a cgroup2 mount. Repeat it
                             to move into groups of other v1 hierarchies too, in the order given
                             (never memory); the move time is that of all the writes
  --wait-ready SECS          only spawn probe children until one is classified (exit 0) or SECS
                             pass (exit 1)
  --print-names              print the process names the storm uses, one per line, and exit
  --watch-ms MS              after each spawn the spawning thread itself polls /proc/PID/cgroup
                             (every 50 us, up to MS ms) until the child shows the group: an
                             exec-to-group free of the child's own start-up (ld.so, main); it
                             counts from spawn() returning, i.e. from exec's point of no return,
                             before the kernel has loaded the program and sent the exec event
                             (JSON watch_x2g_*). For slow machines (an emulated VM) at low rates:
                             it holds up that thread's next spawn (default 0: off)
  --fork-cost N              no storm: time N fork+exit+wait cycles and N spawn+exec+wait
                             cycles (of this binary, which exits at once) and print per-cycle
                             mean/p50/p99/max in microseconds (--name labels the run)
  --exec-cycles M            with --fork-cost: M spawn+exec+wait cycles instead of N
  --parent-comm NAME         right before each rate's first spawn the bench renames itself (its
                             comm, prctl PR_SET_NAME; at most 15 bytes) to NAME, so that a
                             classifier with a `comm` rule for NAME moves the forking parent
                             itself while it spawns: children forked during that move must be
                             placed too (issue 23's escape). The children's names do not change
  --self-test                run the checks of the /proc/self/cgroup and mountinfo parsers, exit
  --symlinks                 name the children by symlinks to the bench binary instead of hard
                             links to a copy (cgrulesengd cannot match symlinked names)";

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        rates: vec![50, 500, 2000],
        duration: Duration::from_secs(3),
        classifier_pid: None,
        name: "classifier".into(),
        expect: "/dbcage-test-storm/BX1/limited".into(),
        long_every: 2,
        long_ms: 200,
        deadline_ms: 2000,
        names: 8,
        pause: Duration::from_secs(1),
        json_out: None,
        tmpdir: PathBuf::from("/tmp"),
        baseline: Vec::new(),
        wait_ready: None,
        print_names: false,
        symlinks: false,
        spawners: 2,
        max_alive: 500,
        max_lag_ms: 50,
        line: Line::Auto,
        watch_ms: 0,
        fork_cost: None,
        exec_cycles: None,
        self_test: false,
        parent_comm: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .ok_or_else(|| format!("{a} needs a value\n{USAGE}"))
        };
        let secs = |s: String| {
            s.parse::<f64>()
                .map(Duration::from_secs_f64)
                .map_err(|e| format!("{s}: {e}"))
        };
        let int = |s: String| s.parse::<u64>().map_err(|e| format!("{s}: {e}"));
        match a.as_str() {
            // cargo bench passes --bench to harness = false targets.
            "--bench" => {}
            "--rates" => {
                o.rates = val()?
                    .split(',')
                    .map(|r| r.trim().parse::<u64>().map_err(|e| format!("{r}: {e}")))
                    .collect::<Result<_, _>>()?
            }
            "--duration" => o.duration = secs(val()?)?,
            "--classifier-pid" => o.classifier_pid = Some(int(val()?)? as u32),
            "--name" => o.name = val()?,
            "--expect" => o.expect = val()?,
            "--long-every" => o.long_every = int(val()?)?,
            "--long-ms" => o.long_ms = int(val()?)?,
            "--deadline-ms" => o.deadline_ms = int(val()?)?,
            "--names" => o.names = int(val()?)?.clamp(1, 1000) as usize,
            "--pause" => o.pause = secs(val()?)?,
            "--json-out" => o.json_out = Some(val()?.into()),
            "--tmpdir" => o.tmpdir = val()?.into(),
            "--baseline" => o.baseline.push(val()?.into()),
            "--wait-ready" => o.wait_ready = Some(secs(val()?)?),
            "--print-names" => o.print_names = true,
            "--symlinks" => o.symlinks = true,
            "--spawners" => o.spawners = int(val()?)?.clamp(1, 64) as usize,
            "--max-alive" => o.max_alive = int(val()?)?.max(1) as usize,
            "--max-lag-ms" => o.max_lag_ms = int(val()?)?,
            "--cgroup-line" => o.line = Line::parse(&val()?).map_err(|e| format!("{a}: {e}"))?,
            "--watch-ms" => o.watch_ms = int(val()?)?,
            "--fork-cost" => o.fork_cost = Some(int(val()?)?.max(1)),
            "--exec-cycles" => o.exec_cycles = Some(int(val()?)?.max(1)),
            "--self-test" => o.self_test = true,
            "--parent-comm" => {
                let c = val()?;
                if c.is_empty() || c.len() > 15 || c.contains('\0') {
                    return Err(format!("--parent-comm {c:?}: 1 to 15 bytes, no NUL"));
                }
                o.parent_comm = Some(c);
            }
            "-h" | "--help" => return Err(USAGE.into()),
            _ => return Err(format!("unknown argument `{a}`\n{USAGE}")),
        }
    }
    if o.rates.contains(&0) {
        return Err("rates must be positive".into());
    }
    Ok(o)
}

/// Seed-style names: ora_p000_BX1 .. and oracleBX1 (started as `oracleBX1 (LOCAL=NO)`).
fn seed_names(n: usize) -> Vec<String> {
    let mut v: Vec<String> = (0..n).map(|i| format!("ora_p{i:03}_BX1")).collect();
    v.push("oracleBX1".into());
    v
}

/// A group made by `--baseline`, removed when the guard drops (or at a signal): leftover
/// processes go back to the parent, then the group is removed.
fn remove_baseline_group(dir: PathBuf) -> common::Guard {
    common::on_exit(move || {
        let parent = dir.parent().map(|p| p.join("cgroup.procs"));
        for _ in 0..50 {
            if let (Ok(s), Some(parent)) = (
                std::fs::read_to_string(dir.join("cgroup.procs")),
                parent.as_ref(),
            ) {
                for pid in s.split_whitespace() {
                    let _ = std::fs::write(parent, pid);
                }
            }
            if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("storm: could not remove {}", dir.display());
    })
}

fn reap(block: bool) -> usize {
    let mut n = 0;
    loop {
        let mut status = 0;
        let flags = if block { 0 } else { libc::WNOHANG };
        // SAFETY: waitpid on any child of ours.
        let r = unsafe { libc::waitpid(-1, &mut status, flags) };
        if r <= 0 {
            return n;
        }
        n += 1;
        if block {
            return n;
        }
    }
}

#[derive(Default, Clone, Copy)]
struct ProcSample {
    cpu_ticks: u64,
    sched_ns: u64,
    hwm_kib: u64,
    rss_kib: u64,
}

fn sample(pid: u32) -> Option<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the `(comm)`: state is field 3; utime, stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let mut sched_ns = 0;
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in rd.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                sched_ns += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    Some(ProcSample {
        cpu_ticks: utime + stime,
        sched_ns,
        hwm_kib: kib("VmHWM:"),
        rss_kib: kib("VmRSS:"),
    })
}

/// (busy, total) jiffies of the whole host from /proc/stat's `cpu` line.
fn host_cpu() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

fn loadavg1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

fn clk_tck() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

struct Spawner<'a> {
    links: Vec<PathBuf>,
    names: Vec<String>,
    expect: &'a str,
    out: &'a Path,
    deadline_ms: u64,
    line: Line,
}

impl Spawner<'_> {
    /// Start child `i` (its name and lifetime class are chosen by `i`).
    /// Returns the pid and the time spawn() returned: the child's exec had succeeded by then
    /// (std waits for it), so that time stands for "exec done" within scheduling noise.
    fn spawn(&self, i: u64, long: bool, extra_ms: u64) -> std::io::Result<(u32, u64)> {
        let k = (i as usize) % self.links.len();
        let mut cmd = Command::new(&self.links[k]);
        cmd.arg0(&self.names[k]);
        if self.names[k].starts_with("oracle") {
            cmd.arg("(LOCAL=NO)");
        }
        cmd.env(ENV_CHILD, "1")
            .env(ENV_EXPECT, self.expect)
            .env(ENV_OUT, self.out)
            .env(ENV_EXTRA_MS, if long { extra_ms } else { 0 }.to_string())
            .env(ENV_DEADLINE_MS, self.deadline_ms.to_string())
            .env(ENV_KIND, if long { "l" } else { "s" })
            .env(ENV_LINE, self.line.as_str())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        cmd.env(ENV_T0, mono_ns().to_string());
        let child = cmd.spawn()?;
        Ok((child.id(), mono_ns()))
        // The Child is dropped without waiting: `reap` collects every exit with waitpid(-1).
    }
}

/// What one spawner thread did in one rate.
struct ThreadOut {
    spawned: u64,
    failures: u64,
    moves: Histogram<u64>,
    move_errors: u64,
    skipped: u64,
    /// (pid, time spawn() returned) per child.
    execs: Vec<(u32, u64)>,
    /// `--watch-ms`: spawn() returning to the parent's read of /proc/PID/cgroup showing the group.
    watched: Histogram<u64>,
    watch_missed: u64,
    /// (reads of /proc/PID/cgroup, ns spent watching)
    watch_polls: (u64, u64),
}

struct Record {
    pid: u32,
    polls: u64,
    seen_at_ns: u64,
    kind_long: bool,
    delay_ns: Option<u64>,
    spawn_to_start_ns: u64,
    lived_ns: u64,
}

fn read_records(path: &Path) -> Vec<Record> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() != 8 {
                return None;
            }
            Some(Record {
                pid: f[0].parse().ok()?,
                polls: f[5].parse().ok()?,
                seen_at_ns: f[7].parse().ok()?,
                kind_long: f[1] == "l",
                delay_ns: f[2].parse().ok(),
                spawn_to_start_ns: f[4].parse().ok()?,
                lived_ns: f[6].parse().ok()?,
            })
        })
        .collect()
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1_000, 60_000_000_000, 3).expect("histogram bounds")
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

#[derive(serde::Serialize)]
struct RateResult {
    classifier: String,
    rate_target: u64,
    rate_achieved: f64,
    duration_s: f64,
    spawned: u64,
    skipped_slots: u64,
    spawn_failures: u64,
    records: usize,
    classified: usize,
    never: usize,
    never_lived_50ms: usize,
    /// Children already in the group at their first poll: moved during exec or start-up.
    in_group_at_first_poll: usize,
    long_lived: usize,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    max_ms: Option<f64>,
    long_p99_ms: Option<f64>,
    spawn_to_start_p50_ms: Option<f64>,
    spawn_to_start_p99_ms: Option<f64>,
    exec_to_group_p50_ms: Option<f64>,
    exec_to_group_p99_ms: Option<f64>,
    exec_to_group_max_ms: Option<f64>,
    spawn_to_group_p50_ms: Option<f64>,
    spawn_to_group_p99_ms: Option<f64>,
    host_cpu_busy_pct: f64,
    host_loadavg_1m: f64,
    classifier_pid: Option<u32>,
    classifier_cpu_ms: Option<f64>,
    classifier_cpu_us_per_proc: Option<f64>,
    classifier_sched_cpu_us_per_proc: Option<f64>,
    classifier_peak_rss_kib: Option<u64>,
    classifier_rss_kib: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    move_write_p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    move_write_p99_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    move_write_max_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    move_write_errors: Option<u64>,
    /// `--watch-ms`: exec-to-group seen from outside (the spawning thread polls /proc/PID/cgroup
    /// right after spawn() returns), free of the child's own start-up time.
    #[serde(skip_serializing_if = "Option::is_none")]
    watch_x2g_p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    watch_x2g_p99_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    watch_x2g_max_ms: Option<f64>,
    /// Children the watch did not see in the group within --watch-ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    watch_missed: Option<u64>,
    /// The watch's resolution: its time spent over its reads of /proc/PID/cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    watch_poll_interval_us: Option<f64>,
    /// `--parent-comm`: the name the forking parent took right before the rate's first spawn.
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_comm: Option<String>,
}

fn pct(h: &Histogram<u64>, q: f64) -> Option<f64> {
    (!h.is_empty()).then(|| ms(h.value_at_quantile(q)))
}

fn parent() -> Result<ExitCode, String> {
    let mut o = parse_args()?;
    self_test();
    if o.self_test {
        println!("storm: self-test passed");
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(n) = o.fork_cost {
        return fork_cost(n, &o);
    }
    let names = seed_names(o.names);
    if o.print_names {
        for n in &names {
            println!("{n}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // From here on it makes things (the links' directory, --baseline groups): removed when their
    // guards drop, or at a signal.
    common::trap_signals("storm");
    let dir = tempfile::Builder::new()
        .prefix("dbcage-test-storm-")
        .tempdir_in(&o.tmpdir)
        .map_err(|e| format!("temp dir in {}: {e}", o.tmpdir.display()))?
        .keep();
    let removed = dir.clone();
    let _dir_guard = common::on_exit(move || {
        let _ = std::fs::remove_dir_all(removed);
    });
    // Hard links to a private copy by default: cgrulesengd resolves a symlinked executable to its
    // target (realpath) and would never see the seed name; with a hard link /proc/PID/exe, comm
    // and argv[0] all carry it. `--symlinks` links straight to the bench binary instead.
    let target = if o.symlinks {
        exe.clone()
    } else {
        let copy = dir.join("dbcage-test-storm-child");
        std::fs::copy(&exe, &copy).map_err(|e| format!("copy {}: {e}", exe.display()))?;
        copy
    };
    let mut links = Vec::new();
    for n in &names {
        let l = dir.join(n);
        let r = if o.symlinks {
            std::os::unix::fs::symlink(&target, &l)
        } else {
            std::fs::hard_link(&target, &l)
        };
        r.map_err(|e| format!("{}: {e}", l.display()))?;
        links.push(l);
    }

    // The --baseline groups made, each with the guard that removes it (dropped at the end).
    let mut baseline: Vec<(PathBuf, common::Guard)> = Vec::new();
    let expect = if o.baseline.is_empty() {
        o.expect.clone()
    } else {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
        let (mut cpu_expect, mut v2_expect) = (None, None);
        for bdir in &o.baseline {
            let name = bdir.file_name().map(|n| n.to_string_lossy().into_owned());
            if !name.is_some_and(|n| n.contains("dbcage-test")) {
                return Err("--baseline: the group's name must contain `dbcage-test`".into());
            }
            if bdir.components().any(|c| c.as_os_str() == "..") {
                return Err(format!("--baseline {}: no `..` please", bdir.display()));
            }
            // A group on a cgroup2 mount (a pure v2 host, or a hybrid host's unified hierarchy):
            // the child sees it on its `0::` line, as the path below the hierarchy's root.
            if let Some((mp, root)) = cgroup2_mount(&mountinfo, bdir) {
                if v2_expect.is_some() {
                    return Err("--baseline: only one group on a cgroup2 mount".into());
                }
                let rel = bdir.strip_prefix(&mp).map_err(|e| e.to_string())?;
                std::fs::create_dir(bdir).map_err(|e| format!("mkdir {}: {e}", bdir.display()))?;
                baseline.push((bdir.clone(), remove_baseline_group(bdir.clone())));
                v2_expect = Some(root.join(rel).display().to_string());
                continue;
            }
            let rel = bdir.strip_prefix("/sys/fs/cgroup").map_err(|_| {
                "--baseline: give a group under /sys/fs/cgroup/HIERARCHY/ or on a cgroup2 mount"
            })?;
            let hier = rel.components().next().map(|c| c.as_os_str().to_owned());
            let hier = hier.unwrap_or_default().to_string_lossy().into_owned();
            if hier == "memory" || hier == "unified" || hier == "systemd" {
                return Err(format!("--baseline: not in the {hier} hierarchy"));
            }
            std::fs::create_dir(bdir).map_err(|e| format!("mkdir {}: {e}", bdir.display()))?;
            baseline.push((bdir.clone(), remove_baseline_group(bdir.clone())));
            if hier == "cpuset" {
                // A new v1 cpuset group is empty: give it its parent's cpus and mems.
                let parent = bdir.parent().ok_or("--baseline: no parent")?;
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    let v = std::fs::read_to_string(parent.join(f)).map_err(|e| e.to_string())?;
                    std::fs::write(bdir.join(f), v.trim())
                        .map_err(|e| format!("{}: {e}", bdir.join(f).display()))?;
                }
            }
            if hier == "cpu" {
                let r = rel.strip_prefix("cpu").map_err(|e| e.to_string())?;
                cpu_expect = Some(format!("/{}", r.display()));
            }
        }
        // The cpu group decides when there is one (v1, as before); else the cgroup2 group.
        match (cpu_expect, v2_expect) {
            (Some(e), _) => {
                if o.line == Line::Auto {
                    o.line = Line::Cpu;
                }
                e
            }
            (None, Some(e)) => {
                if o.line == Line::Auto {
                    o.line = Line::V2;
                }
                e
            }
            (None, None) => {
                return Err(
                    "--baseline: one group must be under /sys/fs/cgroup/cpu/ or on a cgroup2 mount"
                        .into(),
                )
            }
        }
    };

    if let Some(wait) = o.wait_ready {
        let out = dir.join("ready.log");
        File::create(&out).map_err(|e| e.to_string())?;
        let sp = Spawner {
            links,
            names,
            expect: &expect,
            out: &out,
            deadline_ms: 300,
            line: o.line,
        };
        let t = std::time::Instant::now();
        let mut i = 0;
        while t.elapsed() < wait {
            sp.spawn(i, false, 0).map_err(|e| e.to_string())?;
            i += 1;
            reap(true);
            if read_records(&out).iter().any(|r| r.delay_ns.is_some()) {
                println!(
                    "ready: a probe was classified after {:.1}s ({} probes)",
                    t.elapsed().as_secs_f64(),
                    i
                );
                return Ok(ExitCode::SUCCESS);
            }
        }
        println!("not ready: no probe classified within {wait:?}");
        return Ok(ExitCode::FAILURE);
    }

    let tck = clk_tck();
    let mut results = Vec::new();
    for (ri, &rate) in o.rates.iter().enumerate() {
        if ri > 0 {
            std::thread::sleep(o.pause);
        }
        let out = dir.join(format!("rate-{rate}.log"));
        File::create(&out).map_err(|e| e.to_string())?;
        let sp = Spawner {
            links: links.clone(),
            names: names.clone(),
            expect: &expect,
            out: &out,
            deadline_ms: o.deadline_ms,
            line: o.line,
        };
        let before = o.classifier_pid.and_then(sample);
        let total = (rate as f64 * o.duration.as_secs_f64()).round() as u64;
        let period_ns = 1_000_000_000 / rate;
        let procs_file = if baseline.is_empty() {
            None
        } else {
            let files: Result<Vec<File>, String> = baseline
                .iter()
                .map(|(g, _)| {
                    OpenOptions::new()
                        .write(true)
                        .open(g.join("cgroup.procs"))
                        .map_err(|e| format!("open cgroup.procs: {e}"))
                })
                .collect();
            Some(files?)
        };
        if let Some(c) = &o.parent_comm {
            set_comm(c)?;
        }
        let host_before = host_cpu();
        let t_begin = mono_ns();
        let threads = o.spawners.max(1);
        let done = AtomicUsize::new(0);
        let live = AtomicUsize::new(0);
        let mut reaped = 0usize;
        // Each spawner thread takes every `threads`-th slot of one shared schedule.
        let per_thread: Vec<ThreadOut> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|k| {
                    let (sp, procs_file, done, live) = (&sp, procs_file.as_ref(), &done, &live);
                    let (long_every, long_ms) = (o.long_every, o.long_ms);
                    let (max_alive, max_lag_ns) = (o.max_alive, o.max_lag_ms * 1_000_000);
                    let watch_ns = o.watch_ms * 1_000_000;
                    scope.spawn(move || {
                        let (mut spawned, mut failures, mut moves, mut move_errors) =
                            (0u64, 0u64, hist(), 0u64);
                        let mut skipped = 0u64;
                        let (mut watched, mut watch_missed) = (hist(), 0u64);
                        let mut watch_polls = (0u64, 0u64);
                        let mut execs = Vec::new();
                        let mut i = k as u64;
                        while i < total {
                            let due = t_begin + i * period_ns;
                            let mut now = mono_ns();
                            if now < due {
                                std::thread::sleep(Duration::from_nanos(due - now));
                            }
                            // Never more than --max-alive children at once.
                            while live.load(Ordering::SeqCst) >= max_alive && now < due + max_lag_ns
                            {
                                std::thread::sleep(Duration::from_micros(200));
                                now = mono_ns();
                            }
                            // A slot more than --max-lag-ms late is skipped, not caught up
                            // with a burst: the storm stays at the rate the host can take.
                            if mono_ns() > due + max_lag_ns {
                                skipped += 1;
                                i += threads as u64;
                                continue;
                            }
                            let long = long_every > 0 && i % long_every == long_every - 1;
                            match sp.spawn(i, long, long_ms) {
                                Ok((pid, t_exec)) => {
                                    spawned += 1;
                                    execs.push((pid, t_exec));
                                    live.fetch_add(1, Ordering::SeqCst);
                                    if let Some(files) = procs_file {
                                        let a = mono_ns();
                                        let r = files.iter().try_for_each(|f| {
                                            f.write_at(pid.to_string().as_bytes(), 0).map(|_| ())
                                        });
                                        let b = mono_ns();
                                        match r {
                                            Ok(_) => {
                                                let _ = moves.record(b - a);
                                            }
                                            Err(_) => move_errors += 1,
                                        }
                                    }
                                    if watch_ns > 0 {
                                        let w0 = mono_ns();
                                        let r = watch(
                                            pid,
                                            sp.expect,
                                            sp.line,
                                            t_exec,
                                            watch_ns,
                                            &mut watch_polls.0,
                                        );
                                        watch_polls.1 += mono_ns() - w0;
                                        match r {
                                            Some(d) => {
                                                let _ = watched.record(d.max(1_000));
                                            }
                                            None => watch_missed += 1,
                                        }
                                    }
                                }
                                Err(e) => {
                                    failures += 1;
                                    if failures <= 3 {
                                        eprintln!("storm: spawn failed: {e}");
                                    }
                                }
                            }
                            i += threads as u64;
                        }
                        done.fetch_add(1, Ordering::SeqCst);
                        ThreadOut {
                            spawned,
                            failures,
                            moves,
                            move_errors,
                            skipped,
                            execs,
                            watched,
                            watch_missed,
                            watch_polls,
                        }
                    })
                })
                .collect();
            // Reap while the spawners run.
            while done.load(Ordering::SeqCst) < threads {
                let n = reap(false);
                reaped += n;
                live.fetch_sub(n.min(live.load(Ordering::SeqCst)), Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(1));
            }
            handles
                .into_iter()
                .map(|h| h.join().expect("spawner thread"))
                .collect()
        });
        let (mut spawned, mut failures, mut moves, mut move_errors) = (0u64, 0u64, hist(), 0u64);
        let mut skipped = 0u64;
        let (mut watched, mut watch_missed) = (hist(), 0u64);
        let mut watch_polls = (0u64, 0u64);
        let mut exec_at = std::collections::HashMap::new();
        for t in per_thread {
            skipped += t.skipped;
            let _ = watched.add(&t.watched);
            watch_missed += t.watch_missed;
            watch_polls.0 += t.watch_polls.0;
            watch_polls.1 += t.watch_polls.1;
            spawned += t.spawned;
            failures += t.failures;
            move_errors += t.move_errors;
            let _ = moves.add(&t.moves);
            exec_at.extend(t.execs);
        }
        let host_after = host_cpu();
        let t_end = mono_ns();
        while reaped < spawned as usize {
            let n = reap(true);
            if n == 0 {
                break;
            }
            reaped += n;
        }
        let after = o.classifier_pid.and_then(sample);
        let elapsed = (t_end - t_begin) as f64 / 1e9;

        let recs = read_records(&out);
        let (mut all, mut long_h, mut s2s, mut s2g, mut x2g) =
            (hist(), hist(), hist(), hist(), hist());
        let (mut never, mut never50, mut long_n, mut at_first) = (0, 0, 0, 0);
        for r in &recs {
            if r.kind_long {
                long_n += 1;
            }
            let _ = s2s.record(r.spawn_to_start_ns.max(1_000));
            match r.delay_ns {
                Some(d) => {
                    if r.polls == 1 {
                        at_first += 1;
                    }
                    let _ = all.record(d.max(1_000));
                    let _ = s2g.record((d + r.spawn_to_start_ns).max(1_000));
                    if let Some(t) = exec_at.get(&r.pid) {
                        let _ = x2g.record(r.seen_at_ns.saturating_sub(*t).max(1_000));
                    }
                    if r.kind_long {
                        let _ = long_h.record(d.max(1_000));
                    }
                }
                None => {
                    never += 1;
                    if r.lived_ns >= 50_000_000 {
                        never50 += 1;
                    }
                }
            }
        }
        let cpu = match (before, after) {
            (Some(b), Some(a)) => Some((
                (a.cpu_ticks - b.cpu_ticks) as f64 * 1e3 / tck as f64,
                (a.sched_ns.saturating_sub(b.sched_ns)) as f64 / 1e3,
                a.hwm_kib,
                a.rss_kib,
            )),
            _ => None,
        };
        let per = |v: f64| {
            if spawned > 0 {
                v / spawned as f64
            } else {
                0.0
            }
        };
        let res = RateResult {
            classifier: o.name.clone(),
            rate_target: rate,
            rate_achieved: spawned as f64 / elapsed.max(1e-9),
            duration_s: elapsed,
            spawned,
            skipped_slots: skipped,
            spawn_failures: failures,
            records: recs.len(),
            classified: recs.len() - never,
            never,
            never_lived_50ms: never50,
            in_group_at_first_poll: at_first,
            long_lived: long_n,
            p50_ms: pct(&all, 0.5),
            p99_ms: pct(&all, 0.99),
            max_ms: (!all.is_empty()).then(|| ms(all.max())),
            long_p99_ms: pct(&long_h, 0.99),
            spawn_to_start_p50_ms: pct(&s2s, 0.5),
            spawn_to_start_p99_ms: pct(&s2s, 0.99),
            exec_to_group_p50_ms: pct(&x2g, 0.5),
            exec_to_group_p99_ms: pct(&x2g, 0.99),
            exec_to_group_max_ms: (!x2g.is_empty()).then(|| ms(x2g.max())),
            spawn_to_group_p50_ms: pct(&s2g, 0.5),
            spawn_to_group_p99_ms: pct(&s2g, 0.99),
            host_cpu_busy_pct: 100.0 * (host_after.0 - host_before.0) as f64
                / (host_after.1 - host_before.1).max(1) as f64,
            host_loadavg_1m: loadavg1(),
            classifier_pid: o.classifier_pid,
            classifier_cpu_ms: cpu.map(|c| c.0),
            classifier_cpu_us_per_proc: cpu.map(|c| per(c.0 * 1e3)),
            classifier_sched_cpu_us_per_proc: cpu.map(|c| per(c.1)),
            classifier_peak_rss_kib: cpu.map(|c| c.2),
            classifier_rss_kib: cpu.map(|c| c.3),
            move_write_p50_ms: procs_file.as_ref().and_then(|_| pct(&moves, 0.5)),
            move_write_p99_ms: procs_file.as_ref().and_then(|_| pct(&moves, 0.99)),
            move_write_max_ms: procs_file
                .as_ref()
                .and_then(|_| (!moves.is_empty()).then(|| ms(moves.max()))),
            move_write_errors: procs_file.as_ref().map(|_| move_errors),
            watch_x2g_p50_ms: (o.watch_ms > 0).then(|| pct(&watched, 0.5)).flatten(),
            watch_x2g_p99_ms: (o.watch_ms > 0).then(|| pct(&watched, 0.99)).flatten(),
            watch_x2g_max_ms: (o.watch_ms > 0 && !watched.is_empty()).then(|| ms(watched.max())),
            watch_missed: (o.watch_ms > 0).then_some(watch_missed),
            watch_poll_interval_us: (o.watch_ms > 0 && watch_polls.0 > 0)
                .then(|| watch_polls.1 as f64 / watch_polls.0 as f64 / 1e3),
            parent_comm: o.parent_comm.clone(),
        };
        if o.classifier_pid.is_some() && after.is_none() {
            eprintln!(
                "storm: the classifier (pid {}) is gone",
                o.classifier_pid.unwrap_or(0)
            );
        }
        results.push(res);
    }
    drop(baseline);

    print_table(&results);
    let mut json = String::new();
    for r in &results {
        json.push_str(&serde_json::to_string(r).map_err(|e| e.to_string())?);
        json.push('\n');
    }
    emit_json(&o, &json)?;
    Ok(ExitCode::SUCCESS)
}

/// `--parent-comm`: renames the calling thread (the main thread: the spawner threads started
/// after it inherit the name), which the kernel reports as a comm event of the process.
fn set_comm(name: &str) -> Result<(), String> {
    let c = std::ffi::CString::new(name).map_err(|e| format!("--parent-comm: {e}"))?;
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes, which `c` is.
    let r = unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr() as libc::c_ulong, 0, 0, 0) };
    if r != 0 {
        return Err(format!(
            "prctl(PR_SET_NAME, {name}): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// `--watch-ms`: from `t_exec` (spawn() returned) until /proc/PID/cgroup shows `expect`, polled
/// every 50 us for at most `limit_ns`; None if it never did (or the child is gone: a child exits
/// only after it saw the group itself, or at its deadline).
/// Also counts the reads into `polls`, so that the mean interval between them (the watch's
/// resolution: sleeps are coarser on an emulated machine) can be reported.
fn watch(
    pid: u32,
    expect: &str,
    line: Line,
    t_exec: u64,
    limit_ns: u64,
    polls: &mut u64,
) -> Option<u64> {
    let f = File::open(format!("/proc/{pid}/cgroup")).ok()?;
    let mut buf = [0u8; 4096];
    loop {
        let n = f.read_at(&mut buf, 0).ok()?;
        let now = mono_ns();
        *polls += 1;
        if n == 0 {
            return None;
        }
        if in_group(&buf[..n], expect.as_bytes(), line) {
            return Some(now.saturating_sub(t_exec));
        }
        if now - t_exec > limit_ns {
            return None;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// `--fork-cost N`: what a fork and an exit cost here, so that a cgroup mount option that moves
/// work onto them (`favordynmods`: the thread-group lock's reader side, taken by every fork and
/// exit, stays on its slow path) can be compared on and off with the same binary. Runs in the
/// bench process before it starts any thread: the forked child only calls `_exit`.
fn fork_cost(n: u64, o: &Opts) -> Result<ExitCode, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let ns_hist =
        || Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds");
    let (mut fork_call, mut cycle, mut spawn) = (ns_hist(), ns_hist(), ns_hist());
    let warmup = (n / 20).clamp(5, 100);
    let m = o.exec_cycles.unwrap_or(n);
    let exec_warmup = (m / 20).clamp(2, 100);
    for i in 0..warmup + n {
        let a = mono_ns();
        // SAFETY: the child calls only _exit (async-signal-safe); no other thread runs here.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: _exit ends the child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        if pid < 0 {
            return Err(format!("fork: {}", std::io::Error::last_os_error()));
        }
        let b = mono_ns();
        let mut status = 0;
        // SAFETY: waiting for the child we just forked.
        if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
            return Err(format!(
                "waitpid {pid}: {}",
                std::io::Error::last_os_error()
            ));
        }
        let c = mono_ns();
        if i >= warmup {
            let _ = fork_call.record(b - a);
            let _ = cycle.record(c - a);
        }
    }
    for i in 0..exec_warmup + m {
        let a = mono_ns();
        let st = Command::new(&exe)
            .env(ENV_NOP, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("spawn {}: {e}", exe.display()))?;
        let b = mono_ns();
        if !st.success() {
            return Err(format!("{} exited with {st}", exe.display()));
        }
        if i >= exec_warmup {
            let _ = spawn.record(b - a);
        }
    }
    let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1e3;
    let row = |what: &str, h: &Histogram<u64>| {
        println!(
            "{:<22} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
            what,
            h.mean() / 1e3,
            us(h, 0.5),
            us(h, 0.99),
            h.max() as f64 / 1e3
        );
    };
    println!(
        "fork cost: {}, {n} fork cycles after {warmup} not counted, {m} exec cycles after {exec_warmup} \
         (microseconds per cycle)",
        o.name
    );
    println!(
        "{:<22} {:>9} {:>9} {:>9} {:>9}",
        "cycle", "mean", "p50", "p99", "max"
    );
    row("fork() in the parent", &fork_call);
    row("fork+_exit+waitpid", &cycle);
    row("spawn+exec+exit+wait", &spawn);
    let json = serde_json::json!({
        "fork_cost": o.name,
        "cycles": n,
        "exec_cycles": m,
        "fork_call_mean_us": fork_call.mean() / 1e3,
        "fork_call_p50_us": us(&fork_call, 0.5),
        "fork_call_p99_us": us(&fork_call, 0.99),
        "fork_exit_wait_mean_us": cycle.mean() / 1e3,
        "fork_exit_wait_p50_us": us(&cycle, 0.5),
        "fork_exit_wait_p99_us": us(&cycle, 0.99),
        "fork_exit_wait_max_us": cycle.max() as f64 / 1e3,
        "spawn_exec_wait_mean_us": spawn.mean() / 1e3,
        "spawn_exec_wait_p50_us": us(&spawn, 0.5),
        "spawn_exec_wait_p99_us": us(&spawn, 0.99),
        "spawn_exec_wait_max_us": spawn.max() as f64 / 1e3,
    })
    .to_string()
        + "\n";
    emit_json(o, &json)?;
    Ok(ExitCode::SUCCESS)
}

fn print_table(results: &[RateResult]) {
    let f = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into());
    let Some(first) = results.first() else {
        return;
    };
    println!(
        "classifier: {} (delay = child's own start to /proc/self/cgroup showing the group, ms)",
        first.classifier
    );
    println!(
        "{:>6} {:>8} {:>6} {:>8} {:>8} {:>8} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>5}",
        "rate",
        "achieved",
        "procs",
        "p50",
        "p99",
        "max",
        "never",
        ">=50ms",
        "exec p99",
        "x2g p50",
        "x2g p99",
        "cpu us/pr",
        "HWM KiB",
        "move p99",
        "host%"
    );
    for r in results {
        println!(
            "{:>6} {:>8.0} {:>6} {:>8} {:>8} {:>8} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>5.0}",
            r.rate_target,
            r.rate_achieved,
            r.spawned,
            f(r.p50_ms),
            f(r.p99_ms),
            f(r.max_ms),
            r.never + (r.spawned as usize).saturating_sub(r.records),
            r.never_lived_50ms,
            f(r.spawn_to_start_p99_ms),
            f(r.exec_to_group_p50_ms),
            f(r.exec_to_group_p99_ms),
            r.classifier_cpu_us_per_proc
                .map(|v| format!("{v:.1}"))
                .unwrap_or_else(|| "-".into()),
            r.classifier_peak_rss_kib
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into()),
            f(r.move_write_p99_ms),
            r.host_cpu_busy_pct,
        );
    }
}

/// Prints JSON lines and appends them to `--json-out` if given.
fn emit_json(o: &Opts, json: &str) -> Result<(), String> {
    print!("{json}");
    if let Some(p) = &o.json_out {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .map_err(|e| format!("{}: {e}", p.display()))?;
        f.write_all(json.as_bytes()).map_err(|e| e.to_string())?;
    }
    Ok(())
}
