//! Processes from /proc: pid, ppid, argv, comm, exe, effective uid/gid.
//!
//! Hand-written rather than through the `procfs` crate: that crate parses every field of `stat`
//! and `status` into owned values, and this scan runs on the daemon's hot path over every process
//! of the host; we need six fields. A process that exits while being read is skipped, never an
//! error. Kernel threads (children of kthreadd, pid 2) are left out: they cannot be moved.

use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};

use serde::Serialize;

use crate::hostfs::HostFs;

/// The strings are shared (`Arc`): a rescan keeps most processes from the scan before, and a
/// copy of each one's strings was a fifth of a rescan's CPU at 100,000 processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcInfo {
    pub pid: u32,
    pub ppid: u32,
    /// The kernel's short name (at most 15 bytes), as `ps -o comm` shows it.
    pub comm: Arc<str>,
    /// argv joined by single spaces, as `ps -eo args` shows it.
    pub cmdline: Arc<str>,
    pub exe: Option<Arc<Path>>,
    pub uid: u32,
    pub gid: u32,
    /// Start time in clock ticks since boot: with the pid, it names one process for its life.
    pub start_time: u64,
    /// The systemd unit its cgroup is in (`Fields::unit`; `None` when not read, or in no unit).
    pub unit: Option<Arc<str>>,
}

impl ProcInfo {
    /// The command line read again by the sweep (see `Reuse`); where comm is argv[0]'s name
    /// (`Fields::comm` and `tree` off), that follows it. Unchanged (most swept processes), the
    /// strings it had are kept.
    fn set_cmdline(&mut self, cmdline: String, fields: Fields) {
        if *cmdline == *self.cmdline {
            return;
        }
        if !(fields.comm || fields.tree) {
            self.comm = shared(&comm_from_cmdline(&cmdline));
        }
        self.cmdline = shared(&cmdline);
    }
}

/// Parses /proc/PID/stat: `pid (comm) state ppid ...`; comm may contain spaces and parentheses,
/// so it runs to the *last* `)`.
pub fn parse_stat(text: &str) -> Option<(String, u32, u64)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let mut rest = text.get(close + 2..)?.split_ascii_whitespace();
    // After comm: state, ppid (field 4 of stat(5)), ..., starttime (field 22).
    let ppid = rest.nth(1)?.parse().ok()?;
    let start = rest.nth(17)?.parse().ok()?;
    Some((comm, ppid, start))
}

/// The effective uid and gid from /proc/PID/status (`Uid:\treal\teffective\tsaved\tfs`).
pub fn parse_status_ids(text: &str) -> Option<(u32, u32)> {
    let field = |key: &str| -> Option<u32> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(2)?.parse().ok()
    };
    Some((field("Uid:")?, field("Gid:")?))
}

/// argv as NUL-separated bytes → one string joined by spaces (trailing NULs dropped).
pub fn join_cmdline(raw: &[u8]) -> String {
    let trimmed = raw.strip_suffix(b"\0").unwrap_or(raw);
    let mut s = String::from_utf8_lossy(trimmed).into_owned();
    // Some programs (postgres) overwrite argv in place and pad with NULs or spaces.
    s = s.replace('\0', " ");
    s.trim_end().to_string()
}

/// Which optional fields to read. `status` (uid/gid) and `exe` cost a file read each, and the
/// daemon reads one process per exec on the host: it reads them only when a rule looks at them.
/// Fields not read are `u32::MAX` (ids) and `None` (exe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields {
    pub ids: bool,
    pub exe: bool,
    /// ppid and start time (`stat`, the costliest file to produce): needed when a rule passes
    /// its tenant on to descendants. Without it they are 0, and comm comes from `comm`.
    pub tree: bool,
    /// The kernel's `comm` (a file of its own unless `stat` is read anyway). Without it, comm is
    /// argv[0]'s file name cut to 15 bytes, which is what exec sets it to for most programs:
    /// good for a log line, not for a rule (a rule on comm asks for this).
    pub comm: bool,
    /// The systemd unit (`/proc/PID/cgroup`): a rule with `unit` asks for it.
    pub unit: bool,
}

impl Fields {
    pub const ALL: Fields = Fields {
        ids: true,
        exe: true,
        tree: true,
        comm: true,
        unit: true,
    };

    /// The fields the tenants' rules look at.
    pub fn needed_by(tenants: &[crate::policy::Tenant]) -> Fields {
        let rules = || tenants.iter().flat_map(|t| t.rules.iter().chain(&t.exempt));
        Fields {
            ids: rules().any(|r| r.uid.is_some() || r.gid.is_some()),
            exe: rules().any(|r| r.exe.is_some()),
            tree: rules().any(|r| r.descendants),
            comm: rules().any(|r| r.comm.is_some()),
            unit: rules().any(|r| r.unit.is_some()),
        }
    }
}

/// argv[0]'s file name cut to the kernel's 15 bytes of comm (see `Fields::comm`).
fn comm_from_cmdline(cmdline: &str) -> String {
    let argv0 = cmdline.split(' ').next().unwrap_or("");
    let name = argv0.rsplit('/').next().unwrap_or(argv0);
    let mut end = name.len().min(15);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

/// Gives the processes `wanted` picks the kernel's comm, where a scan without `Fields::comm`
/// took it from argv[0]. A process gone since keeps the name it was scanned with.
pub fn read_exact_comm(
    fs: &HostFs,
    procs: &mut [ProcInfo],
    wanted: impl Fn(&ProcInfo) -> bool,
) -> std::io::Result<()> {
    let mut reader = ProcReader::open(fs)?;
    for p in procs.iter_mut().filter(|p| wanted(p)) {
        if let Some(comm) = reader.comm(p.pid) {
            p.comm = shared(&comm);
        }
    }
    Ok(())
}

/// The kernel's comm of a process (`/proc/PID/comm`), for a log line; `None` if it is gone.
pub fn read_comm(fs: &HostFs, pid: u32) -> Option<String> {
    let text = fs.read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(text.strip_suffix('\n').unwrap_or(&text).to_string())
}

/// Reads one process; `None` if it is gone, or is a kernel thread.
pub fn read_process(fs: &HostFs, pid: u32) -> Option<ProcInfo> {
    read_process_fields(fs, pid, Fields::ALL)
}

/// `read_process`, reading only the optional fields asked for.
pub fn read_process_fields(fs: &HostFs, pid: u32, fields: Fields) -> Option<ProcInfo> {
    ProcReader::open(fs).ok()?.read(pid, fields)
}

/// Reads processes through a descriptor of /proc kept open (`PID/cmdline` relative to it: no
/// walk from `/` for every file), with one buffer for all reads. (A descriptor per process
/// directory costs an extra open and close, which is more than the lookup it saves.)
pub struct ProcReader {
    proc: OwnedFd,
    buf: Vec<u8>,
    /// `PID/FILE`, rebuilt for each file.
    name: String,
    /// Every process's comm from the task iterator, when a scan of many processes took it
    /// (`comms_for`): `comm` then reads /proc only for a process born since.
    comms: Option<Arc<super::tasks::Comms>>,
}

impl ProcReader {
    pub fn open(fs: &HostFs) -> std::io::Result<ProcReader> {
        let proc = rustix::fs::open(
            fs.proc(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(ProcReader {
            proc,
            buf: Vec::with_capacity(4096),
            name: String::with_capacity(24),
            comms: None,
        })
    }

    /// `PID/FILE`, relative to the /proc descriptor.
    fn name(&mut self, pid: u32, file: &str) -> &str {
        use std::fmt::Write;
        self.name.clear();
        let _ = write!(self.name, "{pid}/{file}");
        &self.name
    }

    /// The whole of `/proc/PID/FILE` (see `read_small`); `None` when it cannot be read (the
    /// process is gone).
    pub fn file(&mut self, pid: u32, file: &str) -> Option<&[u8]> {
        self.name(pid, file);
        read_small_at(&self.proc, &self.name, &mut self.buf)
    }

    /// A process's command line alone; `None` when it is gone or has none (a kernel thread, a
    /// process that emptied its argv or is exiting).
    pub fn read_cmdline(&mut self, pid: u32) -> Option<String> {
        let cmdline = join_cmdline(self.file(pid, "cmdline")?);
        (!cmdline.is_empty()).then_some(cmdline)
    }

    /// The kernel's comm of a process (`PID/comm`, or the task iterator's record of it);
    /// `None` when it is gone.
    fn comm(&mut self, pid: u32) -> Option<String> {
        if let Some(name) = self.comms.as_ref().and_then(|c| c.get(pid)) {
            return Some(String::from_utf8_lossy(name).into_owned());
        }
        let raw = self.file(pid, "comm")?;
        Some(String::from_utf8_lossy(raw.strip_suffix(b"\n").unwrap_or(raw)).into_owned())
    }

    /// One process; `None` if it is gone, or is a kernel thread.
    pub fn read(&mut self, pid: u32, fields: Fields) -> Option<ProcInfo> {
        let cmdline = join_cmdline(self.file(pid, "cmdline")?);
        // Kernel threads have no argv: `stat` tells them (children of kthreadd) from a user
        // process that emptied its own. Otherwise `comm` is enough unless the tree is needed.
        let short_comm = if fields.tree || cmdline.is_empty() {
            None
        } else if !fields.comm {
            Some(comm_from_cmdline(&cmdline))
        } else {
            self.comm(pid)
        };
        let (comm, ppid, start_time) = match short_comm {
            Some(comm) => (comm, 0, 0),
            None => {
                let (comm, ppid, start) =
                    parse_stat(std::str::from_utf8(self.file(pid, "stat")?).ok()?)?;
                if pid == 2 || ppid == 2 {
                    return None;
                }
                (comm, ppid, start)
            }
        };
        let (uid, gid) = if fields.ids {
            parse_status_ids(&String::from_utf8_lossy(self.file(pid, "status")?))?
        } else {
            (u32::MAX, u32::MAX)
        };
        let exe = if fields.exe {
            self.name(pid, "exe");
            rustix::fs::readlinkat(&self.proc, self.name.as_str(), Vec::new())
                .ok()
                .map(|p| PathBuf::from(std::ffi::OsString::from_vec(p.into_bytes())).into())
        } else {
            None
        };
        // No cgroup file (a kernel without cgroups, or a process gone since): in no unit.
        let unit = if fields.unit {
            self.file(pid, "cgroup").and_then(|text| {
                crate::unitname::unit_of_proc_cgroup(&String::from_utf8_lossy(text)).map(shared)
            })
        } else {
            None
        };
        Some(ProcInfo {
            pid,
            ppid,
            comm: shared(&comm),
            cmdline: shared(&cmdline),
            exe,
            uid,
            gid,
            start_time,
            unit,
        })
    }
}

/// The strings processes share (their names, command lines and units): one copy of each for
/// all the processes that have it. A host runs many processes of one program (an instance's
/// server processes, a pool's workers, forked children), and at 28,000 processes of one
/// program a copy each was 4 MiB of the daemon's memory.
static SHARED_STRINGS: std::sync::Mutex<StringPool> = std::sync::Mutex::new(StringPool::new());

/// `s` as the pool's copy (see `SHARED_STRINGS`).
fn shared(s: &str) -> Arc<str> {
    SHARED_STRINGS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(s)
}

/// A set of shared strings that forgets those only it still holds: whenever it has doubled
/// since it last looked (an amortised constant cost per string, without a hook in the scans
/// that drop processes), it keeps only the strings some process still has.
struct StringPool {
    strings: Option<std::collections::HashSet<Arc<str>>>,
    /// The size at which the set is next pruned.
    prune_at: usize,
}

impl StringPool {
    /// Pruned first at this size; never below it.
    const MIN_PRUNE_AT: usize = 1024;

    const fn new() -> StringPool {
        StringPool {
            strings: None,
            prune_at: Self::MIN_PRUNE_AT,
        }
    }

    fn get(&mut self, s: &str) -> Arc<str> {
        let strings = self.strings.get_or_insert_with(Default::default);
        if let Some(have) = strings.get(s) {
            return have.clone();
        }
        if strings.len() >= self.prune_at {
            strings.retain(|have| Arc::strong_count(have) > 1);
            self.prune_at = (strings.len() * 2).max(Self::MIN_PRUNE_AT);
        }
        let new: Arc<str> = Arc::from(s);
        strings.insert(new.clone());
        new
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.strings.as_ref().map_or(0, |s| s.len())
    }
}

/// Reads a small /proc file into `buf` with open, read and close only (`std::fs::read` adds a
/// statx per file for a size hint, which /proc cannot give anyway). The /proc files read here
/// (stat, comm, cmdline, status, cgroup) hand over everything they have in one read when the
/// buffer is large enough, so a read that does not fill the buffer is the end: no second read.
pub fn read_small<'b>(path: &std::path::Path, buf: &'b mut Vec<u8>) -> Option<&'b [u8]> {
    let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    read_all(&fd, buf)
}

/// `read_small` of `name` relative to the directory `dir` (a short lookup: no walk from `/`).
pub fn read_small_at<'b>(dir: &OwnedFd, name: &str, buf: &'b mut Vec<u8>) -> Option<&'b [u8]> {
    let fd = rustix::fs::openat(dir, name, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    read_all(&fd, buf)
}

fn read_all<'b>(fd: &OwnedFd, buf: &'b mut Vec<u8>) -> Option<&'b [u8]> {
    buf.clear();
    loop {
        if buf.capacity() - buf.len() < 512 {
            buf.reserve(4096);
        }
        let len = buf.len();
        let spare = buf.capacity() - len;
        // Into the spare capacity (rustix extends the length by what was read): no zeroing of
        // 4 KiB before each small read.
        let n = rustix::io::read(fd, rustix::buffer::spare_capacity(buf)).ok()?;
        debug_assert_eq!(buf.len(), len + n);
        if n < spare {
            return Some(&buf[..]);
        }
    }
}

/// Every user-space process of the host, in pid order.
pub fn scan(fs: &HostFs) -> std::io::Result<Vec<ProcInfo>> {
    scan_fields(fs, Fields::ALL)
}

/// `scan`, reading only the optional fields asked for (see `Fields`).
pub fn scan_fields(fs: &HostFs, fields: Fields) -> std::io::Result<Vec<ProcInfo>> {
    let pids = list_pids(fs)?;
    read_pids(fs, fields, &pids)
}

/// `scan_fields`, with the pids listed but not read as a process: kernel threads, and
/// processes gone before they were read (what `Reuse::skipped` takes).
pub fn scan_listed(fs: &HostFs, fields: Fields) -> std::io::Result<(Vec<ProcInfo>, Vec<u32>)> {
    let pids = list_pids(fs)?;
    let procs = read_pids(fs, fields, &pids)?;
    let skipped = not_read(&pids, &procs);
    Ok((procs, skipped))
}

/// The pids of `listed` (in order) that `read` (in order) has no process for.
fn not_read(listed: &[u32], read: &[ProcInfo]) -> Vec<u32> {
    let mut read = read.iter().map(|p| p.pid).peekable();
    listed
        .iter()
        .copied()
        .filter(|&pid| {
            while read.next_if(|&r| r < pid).is_some() {}
            read.next_if_eq(&pid).is_none()
        })
        .collect()
}

/// The pids of /proc, in order.
fn list_pids(fs: &HostFs) -> std::io::Result<Vec<u32>> {
    let mut pids: Vec<u32> = std::fs::read_dir(fs.proc())?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

/// The pids of `reuse`'s scan, its skipped pids and the changed ones, merged in order, without
/// those whose /proc entry is gone. Only the pids whose presence matters are asked (the
/// changed, the skipped and the `checked` ones): the others are kept until the sweep reads
/// them or the next listing (no exit event is subscribed; at 100,000 processes a check of each
/// would cost some 60 ms every rescan).
fn still_there(fs: &HostFs, reuse: &Reuse) -> std::io::Result<Vec<u32>> {
    use itertools::Itertools as _;
    let asked: Vec<u32> = (reuse.skipped.iter())
        .merge(reuse.changed)
        .merge(reuse.checked)
        .dedup()
        .copied()
        .collect();
    let gone = gone_pids(fs, &asked)?;
    let mut gone = gone.iter().peekable();
    Ok((reuse.previous.iter().map(|p| p.pid))
        .merge(reuse.skipped.iter().copied())
        .merge(reuse.changed.iter().copied())
        .dedup()
        .filter(|&pid| {
            while gone.next_if(|&&g| g < pid).is_some() {}
            gone.next_if_eq(&&pid).is_none()
        })
        .collect())
}

/// Those of `pids` (in order) whose /proc entry is gone, in order.
fn gone_pids(fs: &HostFs, pids: &[u32]) -> std::io::Result<Vec<u32>> {
    if fs.is_real_root() {
        // The host's own /proc: a signal 0 asks the kernel whether the pid is there without a
        // path lookup (ESRCH: gone; EPERM cannot happen as root, and would mean it is there).
        return Ok(pids
            .iter()
            .copied()
            .filter(|&pid| {
                rustix::process::Pid::from_raw(pid as i32).is_none_or(|pid| {
                    matches!(
                        rustix::process::test_kill_process(pid),
                        Err(rustix::io::Errno::SRCH)
                    )
                })
            })
            .collect());
    }
    // A copied tree (tests): the pid's directory.
    let proc = rustix::fs::open(
        fs.proc(),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut name = String::with_capacity(12);
    Ok(pids
        .iter()
        .copied()
        .filter(|pid| {
            use std::fmt::Write as _;
            name.clear();
            let _ = write!(name, "{pid}");
            let (exists, none) = (rustix::fs::Access::EXISTS, rustix::fs::AtFlags::empty());
            rustix::fs::accessat(&proc, name.as_str(), exists, none).is_err()
        })
        .collect())
}

/// Reads these processes (those still there and not kernel threads), in their order. Reading
/// /proc is all syscalls; on a host with thousands of processes two threads halve the time.
fn read_pids(fs: &HostFs, fields: Fields, pids: &[u32]) -> std::io::Result<Vec<ProcInfo>> {
    let mut reader = ProcReader::open(fs)?;
    reader.comms = comms_for(fs, fields, pids.len());
    if pids.len() < 2000 {
        return Ok(pids
            .iter()
            .filter_map(|&p| reader.read(p, fields))
            .collect());
    }
    let mut second_reader = ProcReader::open(fs)?;
    second_reader.comms = reader.comms.clone();
    let (a, b) = pids.split_at(pids.len() / 2);
    Ok(std::thread::scope(|s| {
        let second = s.spawn(|| {
            let r = &mut second_reader;
            b.iter()
                .filter_map(|&p| r.read(p, fields))
                .collect::<Vec<_>>()
        });
        let mut first: Vec<ProcInfo> = a.iter().filter_map(|&p| reader.read(p, fields)).collect();
        first.extend(second.join().expect("proc reader thread"));
        first
    }))
}

/// Where a scan of `count` processes reads their comm from, when the rules need it: the task
/// iterator (`tasks::Comms`) from `tasks::WORTH_IT` processes on, /proc/PID/comm below that,
/// in a fixture tree, or when the iterator cannot load (said at debug level). The environment
/// variable `DBCAGE_COMM_SOURCE` = `proc` or `iterator` decides instead, for tests and
/// benchmarks that compare the two.
fn comms_for(fs: &HostFs, fields: Fields, count: usize) -> Option<Arc<super::tasks::Comms>> {
    // With `tree`, `stat` is read for every process and carries the name.
    if !fields.comm || fields.tree || !fs.is_real_root() {
        return None;
    }
    if !forced_comm_source().unwrap_or(count >= super::tasks::WORTH_IT) {
        return None;
    }
    match super::tasks::Comms::read() {
        Ok(comms) => {
            tracing::debug!("comm of {} processes from the task iterator", comms.len());
            Some(Arc::new(comms))
        }
        Err(why) => {
            tracing::debug!("comm from /proc/PID/comm: {why}");
            None
        }
    }
}

/// `DBCAGE_COMM_SOURCE`, read once: `Some(true)` for `iterator`, `Some(false)` for `proc`,
/// `None` when unset or (with a warning) anything else.
fn forced_comm_source() -> Option<bool> {
    static FORCED: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| match std::env::var("DBCAGE_COMM_SOURCE") {
        Ok(v) if v == "iterator" => Some(true),
        Ok(v) if v == "proc" => Some(false),
        Ok(v) => {
            tracing::warn!(
                "DBCAGE_COMM_SOURCE={v:?} ignored: it takes `iterator` or `proc` (unset: the \
                 task iterator from {} processes on)",
                super::tasks::WORTH_IT
            );
            None
        }
        Err(_) => None,
    })
}

/// What a rescan may take from the scan before it instead of reading /proc again. The process
/// events tell what changed: a fork makes a new process (or a reused pid), an exec a new
/// program, and comm, uid and gid changes have events of their own. What has none is a
/// rewrite of argv in place (PostgreSQL's titles) and, with `Fields::tree`, a new parent when
/// the old one exits (exits are not subscribed): `changed` covers the first for a while after a
/// process's last event, the sweep (every `of`-th pid in turn) all the rest, and a parent that
/// is gone or younger than its child is read again at once. Since argv is all the sweep looks
/// for, a swept process has its `cmdline` read again, not its other files.
///
/// The pid lists are in order and without repeats: a rescan walks them along the pids (a hash
/// lookup for each of 100,000 processes cost more than the walk).
#[derive(Clone)]
pub struct Reuse<'a> {
    /// The scan before, in pid order, read with the same `Fields` (updated into the new one).
    pub previous: Vec<ProcInfo>,
    /// The pids it listed but found no process at (kernel threads, processes gone before
    /// their read): not read again either until an event names them.
    pub skipped: &'a [u32],
    /// Processes to read again: each one with an event in the last rescan periods.
    pub changed: &'a [u32],
    /// Processes read again however quiet they were: those with `pid % of == turn % of`.
    pub sweep: Sweep,
    /// Where the pids come from: a listing of /proc (false), or (true) the scan before's pids,
    /// its skipped ones and the changed ones. The second is for when no event was lost: every
    /// process born since then was named by its fork. Exits are not subscribed, so of the
    /// scan before's pids only the `checked` ones are checked to be there still (with the
    /// changed and skipped ones); the others stay until the sweep reads them or the next
    /// listing finds them gone.
    pub from_events: bool,
    /// The processes of the scan before whose presence matters at every rescan (the daemon's:
    /// those placed in a tenant, which its status and metrics count).
    pub checked: &'a [u32],
}

/// A share of the processes read again at each rescan (see `Reuse`): one in `of`, and one in
/// `checked_of` of the `Reuse::checked` ones (the daemon's placed processes, whose groups a
/// rescan also reads again when it sweeps them: another tool's move of one is found within
/// `checked_of` rescans however many other processes the host has).
#[derive(Debug, Clone, Copy)]
pub struct Sweep {
    pub turn: u64,
    pub of: u32,
    pub checked_of: u32,
}

impl Sweep {
    /// One in `of` of every process, checked or not (the tests' sweep).
    #[cfg(test)]
    pub fn one_in(turn: u64, of: u32) -> Sweep {
        Sweep {
            turn,
            of,
            checked_of: of,
        }
    }

    fn covers(&self, pid: u32, checked: bool) -> bool {
        let of = if checked { self.checked_of } else { self.of };
        of <= 1 || u64::from(pid % of) == self.turn % u64::from(of)
    }
}

/// What `scan_reusing` did: processes listed (or, from the events, known and still there), and
/// read (the rest were kept).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanCount {
    pub listed: usize,
    pub read: usize,
}

/// A scan's result: the processes, the pids listed but not read as one (`Reuse::skipped`), the
/// pids kept from the scan before without any read (no event named them, the sweep did not
/// cover them: a plan may take their groups from its last reading too), and the counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scanned {
    pub procs: Vec<ProcInfo>,
    pub skipped: Vec<u32>,
    /// In order.
    pub unchanged: Vec<u32>,
    pub count: ScanCount,
}

/// `scan_listed`, keeping what `reuse` says has not changed: /proc is listed (or the pids come
/// from the events), and only the processes that are new, changed or swept are read. The scan
/// before (`Reuse::previous`) is updated in place and becomes the result: at 100,000 processes a
/// new list of them all (copies, fresh pages, the old one's free) was a fifth of a rescan.
pub fn scan_reusing(fs: &HostFs, fields: Fields, reuse: Reuse) -> std::io::Result<Scanned> {
    let pids = match reuse.from_events {
        false => list_pids(fs)?,
        true => still_there(fs, &reuse)?,
    };
    // What each pid needs, in one walk along the pids (all lists are in pid order): only what
    // is not kept as it was is noted.
    let mut todo: Vec<(u32, Need)> = Vec::new();
    let mut gone: Vec<usize> = Vec::new();
    let mut unchanged = Vec::with_capacity(pids.len());
    let mut kept_pids = Vec::new();
    let mut unread = Vec::new();
    let mut walk = ReuseWalk::new(&reuse);
    for &pid in &pids {
        let (need, passed) = walk.need(pid);
        gone.extend(passed);
        match need {
            Need::Keep(_) => unchanged.push(pid),
            Need::Read(_) => unread.push(pid),
            Need::Sweep(_) | Need::Skip => {}
        }
        if fields.tree && matches!(need, Need::Keep(_) | Need::Sweep(_)) {
            kept_pids.push(pid);
        }
        if !matches!(need, Need::Keep(_)) {
            todo.push((pid, need));
        }
    }
    gone.extend(walk.rest());
    let mut read = read_pids(fs, fields, &unread)?.into_iter().peekable();
    let mut reader = ProcReader::open(fs)?;
    let Reuse { mut previous, .. } = reuse;
    let mut count = ScanCount {
        listed: pids.len(),
        read: unread.len(),
    };
    let (mut added, mut skipped) = (vec![], vec![]);
    for (pid, need) in todo {
        // The process read now, for those read again (None: gone, or a kernel thread).
        let now = match need {
            Need::Keep(_) => continue,
            Need::Skip => {
                skipped.push(pid);
                continue;
            }
            Need::Sweep(i) => {
                count.read += 1;
                match reader.read_cmdline(pid) {
                    Some(cmdline) => {
                        previous[i].set_cmdline(cmdline, fields);
                        continue;
                    }
                    // Gone, or its argv emptied: read in full (and skipped if gone).
                    None => reader.read(pid, fields),
                }
            }
            Need::Read(_) => read.next_if(|p| p.pid == pid),
        };
        match (now, need) {
            (Some(p), Need::Sweep(i) | Need::Read(Some(i))) => previous[i] = p,
            (Some(p), _) => added.push(p),
            (None, Need::Sweep(i) | Need::Read(Some(i))) => {
                gone.push(i);
                skipped.push(pid);
            }
            (None, _) => skipped.push(pid),
        }
    }
    gone.sort_unstable();
    let mut procs = previous;
    if !gone.is_empty() {
        let mut at = 0;
        let mut gone = gone.iter().peekable();
        procs.retain(|_| {
            let drop = gone.next_if(|&&g| g == at).is_some();
            at += 1;
            !drop
        });
    }
    merge_in(&mut procs, added);
    if fields.tree {
        // A kept process whose parent is gone, or younger than itself (its pid reused), has a
        // new parent (its reaper): read it again.
        let find = |procs: &[ProcInfo], pid: u32| procs.binary_search_by_key(&pid, |p| p.pid).ok();
        let orphans: Vec<u32> = (kept_pids.iter().copied())
            .filter_map(|pid| {
                let p = &procs[find(&procs, pid)?];
                let parent = (p.ppid > 1).then(|| find(&procs, p.ppid))?;
                parent
                    .is_none_or(|i| procs[i].start_time > p.start_time)
                    .then_some(pid)
            })
            .collect();
        if !orphans.is_empty() {
            count.read += orphans.len();
            unchanged.retain(|pid| orphans.binary_search(pid).is_err());
            procs.retain(|p| orphans.binary_search(&p.pid).is_err());
            let read = read_pids(fs, fields, &orphans)?;
            skipped.extend(not_read(&orphans, &read));
            skipped.sort_unstable();
            merge_in(&mut procs, read);
        }
    }
    Ok(Scanned {
        procs,
        skipped,
        unchanged,
        count,
    })
}

/// What a rescan does with one pid (see `ReuseWalk`); the index is the pid's in the scan before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// Kept from the scan before as it was.
    Keep(usize),
    /// Kept, with its command line read again.
    Sweep(usize),
    /// Read in full: new, changed, or named by an event.
    Read(Option<usize>),
    /// Skipped before (a kernel thread) and not named since: skipped again.
    Skip,
}

/// `Reuse`'s lists walked along increasing pids.
struct ReuseWalk<'a> {
    sweep: Sweep,
    previous: &'a [ProcInfo],
    /// The next entry of `previous` not yet walked past.
    at: usize,
    changed: std::iter::Peekable<std::slice::Iter<'a, u32>>,
    skipped: std::iter::Peekable<std::slice::Iter<'a, u32>>,
    checked: std::iter::Peekable<std::slice::Iter<'a, u32>>,
}

impl<'a> ReuseWalk<'a> {
    fn new(reuse: &'a Reuse) -> ReuseWalk<'a> {
        ReuseWalk {
            sweep: reuse.sweep,
            previous: &reuse.previous,
            at: 0,
            changed: reuse.changed.iter().peekable(),
            skipped: reuse.skipped.iter().peekable(),
            checked: reuse.checked.iter().peekable(),
        }
    }

    /// What `pid` needs, and the entries of the scan before walked past (pids not there now);
    /// called with increasing pids.
    fn need(&mut self, pid: u32) -> (Need, std::ops::Range<usize>) {
        fn has(list: &mut std::iter::Peekable<std::slice::Iter<'_, u32>>, pid: u32) -> bool {
            while list.next_if(|&&x| x < pid).is_some() {}
            list.next_if_eq(&&pid).is_some()
        }
        let changed = has(&mut self.changed, pid);
        let was_skipped = has(&mut self.skipped, pid);
        let checked = has(&mut self.checked, pid);
        let from = self.at;
        while self.previous.get(self.at).is_some_and(|p| p.pid < pid) {
            self.at += 1;
        }
        let passed = from..self.at;
        let before = (self.previous.get(self.at).is_some_and(|p| p.pid == pid)).then(|| {
            self.at += 1;
            self.at - 1
        });
        let sweep = self.sweep.covers(pid, checked);
        let need = match before {
            _ if changed => Need::Read(before),
            Some(i) if !sweep => Need::Keep(i),
            Some(i) => Need::Sweep(i),
            None if !sweep && was_skipped => Need::Skip,
            None => Need::Read(None),
        };
        (need, passed)
    }

    /// The entries of the scan before past the last pid walked.
    fn rest(&self) -> std::ops::Range<usize> {
        self.at..self.previous.len()
    }
}

/// Merges `more` (in pid order) into `procs` (in pid order) in place: a few new processes are
/// moved in from the end without a new list.
fn merge_in(procs: &mut Vec<ProcInfo>, more: Vec<ProcInfo>) {
    if more.is_empty() {
        return;
    }
    let old_len = procs.len();
    procs.extend(more);
    if procs[..old_len]
        .last()
        .is_none_or(|p| p.pid < procs[old_len].pid)
    {
        return; // all after the rest (new pids, before the pid numbers wrap)
    }
    // Moving the old ones past the added ones costs their count times the added count: past
    // some (many added after the pid numbers wrapped), a new list is cheaper.
    let first_added = procs[old_len].pid;
    let past = old_len - procs[..old_len].partition_point(|p| p.pid < first_added);
    if past.saturating_mul(procs.len() - old_len) > 4 * old_len {
        let more = procs.split_off(old_len);
        *procs = merge_by_pid(std::mem::take(procs), more);
        return;
    }
    // From the back: each slot takes the larger of the two lists' last ones. The added ones
    // wait at the end, rotated along as the old ones are moved past them.
    let (mut old_end, mut write) = (old_len, procs.len());
    while old_end > 0 && write > old_end {
        let added_last = write - 1;
        // The added ones sit at [old_end, write), in order.
        if procs[old_end - 1].pid > procs[added_last].pid {
            // The old list's last goes to the end of the unmerged part: rotate it past the
            // added ones waiting there.
            procs[old_end - 1..write].rotate_left(1);
            old_end -= 1;
        }
        write -= 1;
    }
}

/// Two lists in pid order as one.
fn merge_by_pid(a: Vec<ProcInfo>, b: Vec<ProcInfo>) -> Vec<ProcInfo> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.pid <= y.pid => a.next(),
            (Some(_), Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, Some(_)) => b.next(),
            (None, None) => break,
        };
        out.extend(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_awkward_comm() {
        let line = "4242 (ora_p0 (x) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 98765 1000 10";
        let (comm, ppid, start) = parse_stat(line).unwrap();
        assert_eq!(comm, "ora_p0 (x) 1");
        assert_eq!(ppid, 1);
        assert_eq!(start, 98765);
    }

    #[test]
    fn status_effective_ids() {
        let text = "Name:\tpostgres\nUid:\t104\t105\t104\t104\nGid:\t110\t111\t110\t110\n";
        assert_eq!(parse_status_ids(text), Some((105, 111)));
    }

    #[test]
    fn cmdline_joined_like_ps() {
        assert_eq!(
            join_cmdline(b"oracleBX1\0(LOCAL=NO)\0"),
            "oracleBX1 (LOCAL=NO)"
        );
        assert_eq!(
            join_cmdline(b"postgres: walwriter   \0\0\0"),
            "postgres: walwriter"
        );
    }

    #[test]
    fn fixture_tree_scan_skips_kernel_threads_and_broken_entries() {
        let dir = tempfile::tempdir().unwrap();
        let fs = HostFs::with_root(dir.path());
        let mk = |pid: u32, ppid: u32, comm: &str, argv: &[u8]| {
            let d = fs.proc().join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            let stat = format!(
                "{pid} ({comm}) S {ppid} 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {} 0 0",
                1000 + pid
            );
            std::fs::write(d.join("stat"), stat).unwrap();
            std::fs::write(d.join("cmdline"), argv).unwrap();
            std::fs::write(
                d.join("status"),
                "Uid:\t0\t1000\t0\t0\nGid:\t0\t1001\t0\t0\n",
            )
            .unwrap();
        };
        mk(1, 0, "init", b"/sbin/init\0");
        mk(2, 0, "kthreadd", b"");
        mk(3, 2, "kworker/0:0", b"");
        mk(77, 1, "ora_pmon_BX1", b"ora_pmon_BX1\0");
        // a process that vanished between readdir and read: only its directory is left
        std::fs::create_dir_all(fs.proc().join("78")).unwrap();
        let procs = scan(&fs).unwrap();
        let pids: Vec<u32> = procs.iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![1, 77]);
        // Without the tree, comm comes from `comm` where there is one, and the kernel threads
        // (no argv) are still told apart by `stat`.
        std::fs::write(fs.proc().join("77/comm"), "ora_pmon_BX1\n").unwrap();
        let light = Fields {
            ids: false,
            exe: false,
            tree: false,
            comm: true,
            unit: false,
        };
        let light_procs = scan_fields(&fs, light).unwrap();
        let got: Vec<(u32, &str, u32)> = light_procs
            .iter()
            .map(|p| (p.pid, p.comm.as_ref(), p.ppid))
            .collect();
        assert_eq!(got, vec![(1, "init", 0), (77, "ora_pmon_BX1", 0)]);
        // Without comm, the name comes from argv[0]: the `comm` file is not consulted.
        std::fs::write(fs.proc().join("77/comm"), "renamed\n").unwrap();
        let lighter = scan_fields(
            &fs,
            Fields {
                comm: false,
                ..light
            },
        )
        .unwrap();
        let got: Vec<&str> = lighter.iter().map(|p| p.comm.as_ref()).collect();
        assert_eq!(got, vec!["init", "ora_pmon_BX1"]);
        assert_eq!(procs[1].uid, 1000);
        assert_eq!(procs[1].gid, 1001);
        assert_eq!(&*procs[1].cmdline, "ora_pmon_BX1");
    }

    #[test]
    fn a_rescan_reads_what_changed_and_its_sweep_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let fs = HostFs::with_root(dir.path());
        let mk = |pid: u32, ppid: u32, start: u64, argv: &str| {
            let d = fs.proc().join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            let stat =
                format!("{pid} (p{pid}) S {ppid} 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 0");
            std::fs::write(d.join("stat"), stat).unwrap();
            std::fs::write(d.join("cmdline"), format!("{argv}\0")).unwrap();
        };
        let tree = Fields {
            ids: false,
            exe: false,
            tree: true,
            comm: false,
            unit: false,
        };
        mk(1, 0, 1, "init");
        mk(2, 0, 1, ""); // kthreadd
        mk(10, 1, 100, "quiet");
        mk(11, 10, 110, "forked");
        mk(13, 40, 130, "child-of-40");
        mk(14, 15, 140, "child-of-15");
        mk(15, 1, 120, "parent-15");
        mk(17, 1, 170, "swept");
        mk(20, 1, 200, "gone-soon");
        mk(40, 1, 90, "parent-40");
        let (previous, skipped) = scan_listed(&fs, tree).unwrap();
        assert_eq!(skipped, vec![2]);
        // What changed without an event: 10 and 17 retitled, 13's parent 40 exited (13 now a
        // child of init), 15 exited and its pid went to a process younger than 14 (14 now a
        // child of init too). With events: 11 exec'd, 30 was forked; 20 is gone.
        mk(10, 1, 100, "quiet-retitled");
        mk(11, 10, 110, "exec'd");
        mk(13, 1, 130, "child-of-40");
        std::fs::remove_dir_all(fs.proc().join("40")).unwrap();
        mk(14, 1, 140, "child-of-15");
        mk(15, 1, 150, "new-15");
        mk(17, 1, 170, "swept-retitled");
        // and 17's comm changed too: that has an event of its own, and none came, so the sweep
        // (which reads argv, the one thing that changes without an event) keeps the old one
        let stat17 = "17 (renamed) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 170 0 0";
        std::fs::write(fs.proc().join("17/stat"), stat17).unwrap();
        std::fs::remove_dir_all(fs.proc().join("20")).unwrap();
        mk(30, 1, 300, "new");
        let changed = [11, 15, 30];
        let every: Vec<u32> = previous.iter().map(|p| p.pid).collect();
        let reuse = Reuse {
            previous: previous.clone(),
            skipped: &skipped,
            changed: &changed,
            sweep: Sweep::one_in(27, 10),
            from_events: false,
            checked: &every,
        };
        let scanned = scan_reusing(&fs, tree, reuse.clone()).unwrap();
        let Scanned {
            procs,
            skipped: now_skipped,
            unchanged,
            count,
        } = scanned.clone();
        assert_eq!(now_skipped, vec![2]);
        // Kept without a read: 1 and 10 (13 and 14 were read again as orphans).
        assert_eq!(unchanged, vec![1, 10]);
        let got: Vec<(u32, u32, &str)> = procs
            .iter()
            .map(|p| (p.pid, p.ppid, p.cmdline.as_ref()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, 0, "init"),
                (10, 1, "quiet"), // kept: no event, not its turn
                (11, 10, "exec'd"),
                (13, 1, "child-of-40"),
                (14, 1, "child-of-15"),
                (15, 1, "new-15"),
                (17, 1, "swept-retitled"),
                (30, 1, "new"),
            ]
        );
        // The same pids from the events instead of a listing of /proc (the scan's, its skipped
        // ones and those the events named, each checked to be there): the same rescan.
        let by_events = Reuse {
            from_events: true,
            ..reuse.clone()
        };
        assert_eq!(scan_reusing(&fs, tree, by_events.clone()).unwrap(), scanned);
        // A process no event named is not seen that way (it comes with the next listing).
        mk(50, 1, 500, "unnamed");
        let unseen = scan_reusing(&fs, tree, by_events.clone()).unwrap().procs;
        assert_eq!(unseen, procs);
        std::fs::remove_dir_all(fs.proc().join("50")).unwrap();
        // Checking only some (the daemon's placed processes): 20 and 40, gone without an event,
        // are kept until the sweep or a listing finds them gone; 13's parent 40 looks alive, so
        // 13 is kept too (its new parent comes with them). The sweep of 20's turn drops it.
        let unchecked = Reuse {
            checked: &[10],
            ..by_events.clone()
        };
        let stale = scan_reusing(&fs, tree, unchecked.clone()).unwrap();
        let pids: Vec<(u32, u32)> = stale.procs.iter().map(|p| (p.pid, p.ppid)).collect();
        assert_eq!(
            pids,
            vec![
                (1, 0),
                (10, 1),
                (11, 10),
                (13, 40),
                (14, 1),
                (15, 1),
                (17, 1),
                (20, 1),
                (30, 1),
                (40, 1)
            ]
        );
        assert_eq!(stale.unchanged, vec![1, 10, 13, 20, 40]);
        let sweeping_20 = Reuse {
            sweep: Sweep::one_in(0, 10),
            ..unchecked.clone()
        };
        let swept = scan_reusing(&fs, tree, sweeping_20.clone()).unwrap();
        assert!(swept.procs.iter().all(|p| p.pid != 20 && p.pid != 40));
        assert_eq!(swept.skipped, vec![2, 20, 40]);
        let p17 = procs.iter().find(|p| p.pid == 17).unwrap();
        assert_eq!((p17.comm.as_ref(), p17.start_time), ("p17", 170));
        // Listed: 1 2 10 11 13 14 15 17 30; read: 11 15 30 in full and 17's cmdline in the
        // first round, 13 and 14 (orphans) in the second; 2 (a kernel thread) is not read again.
        assert_eq!(count, ScanCount { listed: 9, read: 6 });
        // Every pid is swept in turn: with `of` 1 the whole host is read (the swept 13 and 14,
        // whose ppids only a full read corrects, twice).
        let all = Sweep::one_in(0, 1);
        let reuse = Reuse {
            sweep: all,
            ..reuse.clone()
        };
        let Scanned { procs, count, .. } = scan_reusing(&fs, tree, reuse.clone()).unwrap();
        assert_eq!(count.read, 11);
        assert!(procs.iter().any(|p| &*p.cmdline == "quiet-retitled"));
        let got: Vec<(u32, u32)> = procs.iter().map(|p| (p.pid, p.ppid)).collect();
        assert_eq!(
            got,
            vec![
                (1, 0),
                (10, 1),
                (11, 10),
                (13, 1),
                (14, 1),
                (15, 1),
                (17, 1),
                (30, 1)
            ]
        );
        // Without the tree, comm is argv[0]'s name: a swept retitle renames it too.
        let flat = Fields {
            tree: false,
            ..tree
        };
        let (previous, skipped) = scan_listed(&fs, flat).unwrap();
        mk(10, 1, 100, "/usr/bin/titled again");
        let reuse = Reuse {
            previous: previous.clone(),
            skipped: &skipped,
            changed: &[],
            sweep: Sweep::one_in(0, 10),
            from_events: false,
            checked: &every,
        };
        let Scanned { procs, count, .. } = scan_reusing(&fs, flat, reuse.clone()).unwrap();
        let p10 = procs.iter().find(|p| p.pid == 10).unwrap();
        assert_eq!(
            (p10.comm.as_ref(), p10.cmdline.as_ref()),
            ("titled", "/usr/bin/titled again")
        );
        assert_eq!(count, ScanCount { listed: 9, read: 2 }); // 10 and 30 (pid % 10 == 0)
                                                             // The checked processes have a share of their own: 13 (checked) is swept one in 4,
                                                             // 17 (not checked) one in 1,000, so its retitle waits; 1 is the general share's turn.
        mk(13, 1, 130, "/usr/bin/checked retitled");
        mk(17, 1, 170, "/usr/bin/unchecked retitled");
        let reuse = Reuse {
            previous: procs.clone(),
            sweep: Sweep {
                turn: 1,
                of: 1000,
                checked_of: 4,
            },
            from_events: true,
            checked: &[13],
            ..reuse.clone()
        };
        let Scanned { procs, count, .. } = scan_reusing(&fs, flat, reuse.clone()).unwrap();
        let cmdline = |pid: u32| procs.iter().find(|p| p.pid == pid).unwrap().cmdline.clone();
        assert_eq!(&*cmdline(13), "/usr/bin/checked retitled");
        assert_eq!(&*cmdline(17), "swept-retitled");
        assert_eq!(count, ScanCount { listed: 9, read: 2 }); // 1 and 13 (2 is skipped)
    }

    /// `merge_in` as a sort would: new pids after the rest (the fast path), among them (moved
    /// past in place), before them all, and many among them (a new list).
    #[test]
    fn merged_in_place_as_sorted() {
        let proc = |pid: u32| ProcInfo {
            pid,
            ppid: 1,
            comm: format!("p{pid}").into(),
            cmdline: "".into(),
            exe: None,
            uid: 0,
            gid: 0,
            start_time: u64::from(pid),
            unit: None,
        };
        let old: Vec<u32> = (10..400).step_by(3).collect();
        for added in [
            vec![],
            vec![500, 501, 900],
            vec![11, 12, 200, 401],
            vec![1, 2, 3],
            (0..1000).filter(|p| p % 3 != 1).collect::<Vec<u32>>(),
        ] {
            let mut procs: Vec<ProcInfo> = old.iter().map(|&p| proc(p)).collect();
            merge_in(&mut procs, added.iter().map(|&p| proc(p)).collect());
            let mut want: Vec<u32> = old.iter().chain(&added).copied().collect();
            want.sort_unstable();
            let got: Vec<u32> = procs.iter().map(|p| p.pid).collect();
            assert_eq!(got, want, "adding {added:?}");
            assert!(procs.iter().all(|p| *p.comm == format!("p{}", p.pid)));
        }
    }

    #[test]
    fn processes_share_one_copy_of_a_string_and_the_pool_forgets_what_none_holds() {
        // Two processes of one program, read apart, share their strings.
        let a = shared("dbcage-test-shared /usr/lib/postgresql/15/bin/postgres -D /x");
        let b = shared(&String::from(
            "dbcage-test-shared /usr/lib/postgresql/15/bin/postgres -D /x",
        ));
        assert!(Arc::ptr_eq(&a, &b));
        // The pool itself: held strings stay shared across a prune, the others are forgotten
        // when it has doubled, and its size stays bounded by twice what is held.
        let mut pool = StringPool::new();
        let held: Vec<Arc<str>> = (0..10).map(|i| pool.get(&format!("held {i}"))).collect();
        for i in 0..StringPool::MIN_PRUNE_AT * 3 {
            pool.get(&format!("gone {i}"));
            assert!(pool.len() <= StringPool::MIN_PRUNE_AT + 1, "{}", pool.len());
        }
        for (i, h) in held.iter().enumerate() {
            assert!(Arc::ptr_eq(h, &pool.get(&format!("held {i}"))));
        }
        let more: Vec<Arc<str>> = (0..StringPool::MIN_PRUNE_AT * 2)
            .map(|i| pool.get(&format!("more {i}")))
            .collect();
        assert!(pool.len() >= more.len() + held.len());
        assert!(Arc::ptr_eq(&more[0], &pool.get("more 0")));
    }

    #[test]
    fn comm_from_argv0_is_its_file_name_cut_to_15_bytes() {
        assert_eq!(
            comm_from_cmdline("/usr/lib/postgresql/15/bin/postgres -D /data"),
            "postgres"
        );
        assert_eq!(comm_from_cmdline("oracleBX1 (LOCAL=NO)"), "oracleBX1");
        assert_eq!(
            comm_from_cmdline("a-very-long-program-name"),
            "a-very-long-pro"
        );
        // never cut inside a character
        assert_eq!(comm_from_cmdline("ééééééééé"), "ééééééé");
        assert_eq!(comm_from_cmdline(""), "");
    }
}
