//! The daemon's memory of dbcage's groups between two plans: the control files it read last
//! time, kept valid by inotify, so that a rescan rereads only the groups someone wrote to.
//!
//! A write to a cgroup control file raises IN_MODIFY on its directory (kernfs files go through
//! `vfs_write` like any other), and mkdir, rmdir and rename of a group raise IN_CREATE,
//! IN_DELETE and IN_MOVED_* on its parent; so a group whose directory saw no event since it
//! was read holds what was read. At 1,000 tenants that is some 9,000 groups and 11,000 files a
//! plan would otherwise open and read: about half of an idle rescan's CPU.
//!
//! What the kernel changes without a write is not seen by inotify: on v2 a child's control
//! files appear and vanish with its parent's `cgroup.subtree_control` (a write to the parent:
//! the whole subtree is read again), v1 cpusets shrink when a CPU goes offline, and a disk that
//! vanishes takes its lines out of the IO files. For those, everything is read again after
//! `FULL_SWEEP`, after an overrun of the event queue, when dbcage's parent group changes, and
//! whenever the owner asks (`forget_all`: the daemon does after a plan's write failed).
//!
//! The watch also keeps what the last plan concluded from these groups (`Settled`): the
//! tenants it had nothing to do for. A walk says which tenants' groups it read again
//! (`Snapshot::tenants_read`), and the next plan works out only those, and the ones whose
//! settings changed; all of it is dropped with the cache.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::inotify::{self, ReadFlags, WatchFlags};

use super::{GroupDirs, GroupFiles, GroupPath};

/// Everything is read again at least this often, whatever the events said.
pub const FULL_SWEEP: Duration = Duration::from_secs(300);

/// A walk lists the subgroups of the groups above this depth below dbcage's root (the root
/// and the tenants' groups; a leaf's subgroups are not dbcage's).
pub(super) const LISTED_DEPTH: usize = 2;

/// How often the daemon's writes make it take in the queued events (see
/// `absorb_events_if_due`).
const ABSORB_EVERY: Duration = Duration::from_millis(250);

/// Events on a group directory that make its listing (and its files) stale.
const LISTING: ReadFlags = ReadFlags::CREATE
    .union(ReadFlags::DELETE)
    .union(ReadFlags::MOVED_FROM)
    .union(ReadFlags::MOVED_TO)
    .union(ReadFlags::DELETE_SELF)
    .union(ReadFlags::MOVE_SELF);

/// How fresh a group directory's cached reading is, as the walk sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Its files and its list of subgroups are as read last time.
    Fresh,
    /// Its subgroups are as listed last time, its files must be read again.
    FilesStale,
    /// Never read, or its subgroups changed: read everything.
    Unknown,
}

/// The cache: the group files and directories of the last reading, the inotify watches that
/// keep them valid, and what the events since said is stale.
#[derive(Debug)]
pub struct GroupWatch {
    inotify: OwnedFd,
    /// Watch descriptor → the directory it watches.
    watched: HashMap<i32, GroupPath>,
    /// Watch descriptors of dbcage's parent groups, and the name of dbcage's root in them: an
    /// event there about the root or a file its groups inherit from makes everything stale.
    parents: HashMap<i32, std::ffi::OsString>,
    /// dbcage's root in each hierarchy the walks start from (their subgroups and those groups'
    /// subgroups are listed: a group not among them is not there).
    roots: Vec<PathBuf>,
    /// Group directories read and watched, and the files read in them (what the last snapshot
    /// had; only dbcage's own groups, not the parent's or the hierarchy root's files).
    pub(super) dirs: GroupDirs,
    pub(super) files: GroupFiles,
    /// Directories whose subgroups changed since they were read.
    listing_stale: HashSet<GroupPath>,
    /// Directories written to since they were read: their files and their subgroups' files.
    subtree_stale: HashSet<GroupPath>,
    /// Directories that could not be watched (no watches left): read every time.
    unwatched: HashSet<GroupPath>,
    swept_at: Option<Instant>,
    absorbed_at: Instant,
    /// Files of the last snapshot outside dbcage's groups (the parent's, the hierarchy root's).
    pub(super) extra: Vec<PathBuf>,
    /// The groups of the processes the last snapshot read (`Snapshot::proc_dirs`), except those
    /// its plan moved: a rescan takes them again for the processes it kept unread (no event
    /// named them, the sweep did not cover them). Nothing tells of a process moved by another
    /// tool: the sweep reads each again in turn.
    pub(super) proc_dirs: HashMap<u32, super::ProcDirs>,
    /// What the last walk read outside dbcage's groups (see `outside_changed`).
    outside: Option<Outside>,
    /// The tenants the last plan from this watch's groups had nothing to write for (see
    /// `Settled`).
    pub settled: Settled,
    /// What the walks did, for tests and benchmarks: groups read in full, groups whose files
    /// were read again, groups taken from the cache.
    pub stats: WatchStats,
}

/// The daemon's group watch as the metrics endpoint reads it: the control files of a group the
/// last walk read, while no event says it changed since (`Freshness::Fresh`) and the last full
/// sweep is less than `FULL_SWEEP` ago (a value the kernel changes without an event, a device's
/// limit line gone with the device, is read again by then). At 1,000 tenants that is 6 of a
/// scrape's 12 files a tenant on v1 (the IO limits and the cpu quota), a third of its CPU.
#[derive(Debug)]
pub struct WatchedFiles(pub std::sync::Arc<std::sync::Mutex<GroupWatch>>);

impl crate::hostfs::KnownFiles for WatchedFiles {
    fn refresh(&self) {
        GroupWatch::lock(&self.0).absorb_events();
    }

    fn known_group(&self, dir: &Path) -> Option<crate::hostfs::KnownGroup> {
        let mut w = GroupWatch::lock(&self.0);
        if !w.swept_lately() || w.freshness(dir) != Freshness::Fresh {
            return None;
        }
        let files = w.files.group(dir)?.to_vec();
        w.stats.groups_known += 1;
        Some(files)
    }

    fn absent(&self, dir: &Path) -> bool {
        let mut w = GroupWatch::lock(&self.0);
        let Some(parent) = dir.parent() else {
            return false;
        };
        // Only the listings above `LISTED_DEPTH` are read, and a subgroup made since its
        // parent's listing was read makes that listing stale.
        let listed = w.roots.iter().any(|r| {
            parent
                .strip_prefix(r)
                .is_ok_and(|below| below.components().count() < LISTED_DEPTH)
        });
        let absent = w.swept_lately()
            && listed
            && !w.dirs.contains(dir)
            && w.freshness(parent) != Freshness::Unknown;
        if absent {
            w.stats.groups_known_absent += 1;
        }
        absent
    }
}

/// The files outside dbcage's groups a walk reads every time (the parent's, the hierarchy
/// root's), sorted, the parent's cpus and memory nodes, and whether the kernel has io.latency.
type Outside = (
    Vec<(PathBuf, Box<str>)>,
    Option<crate::kernel::CpuSet>,
    Option<crate::kernel::CpuSet>,
    Option<bool>,
);

/// The tenants a plan had nothing to do for (no group to make, no value to write, no group to
/// remove), with the settings and the hierarchies with groups (`Layout::grouped`) it planned
/// them with. While a tenant's groups hold what was read (`Snapshot::tenants_read`) and its
/// settings stay the same, the next plan has nothing to do for it either and need not work it
/// out again: at 1,000 tenants that is some 20,000 files' wanted values built and compared at
/// every rescan, a third of it.
#[derive(Debug, Default)]
pub struct Settled {
    by_name: HashMap<String, (crate::cgroup::model::TenantSettings, Vec<bool>)>,
}

impl Settled {
    /// Whether the tenant was settled with these settings and grouped hierarchies.
    pub fn holds(
        &self,
        name: &str,
        settings: &crate::cgroup::model::TenantSettings,
        grouped: &[bool],
    ) -> bool {
        self.by_name
            .get(name)
            .is_some_and(|(s, g)| s == settings && g == grouped)
    }

    /// A plan had nothing to do for the tenant, planned with these settings and hierarchies.
    pub fn settle(
        &mut self,
        name: &str,
        settings: &crate::cgroup::model::TenantSettings,
        grouped: &[bool],
    ) {
        if !self.holds(name, settings, grouped) {
            (self.by_name).insert(name.to_string(), (settings.clone(), grouped.to_vec()));
        }
    }

    /// A plan had something to do for the tenant.
    pub fn unsettle(&mut self, name: &str) {
        self.by_name.remove(name);
    }

    /// Forgets the tenants the policy's `names` do not name, once there are more than it has
    /// (after a reload that dropped some). An entry of a dropped tenant is never wrong (it
    /// says what its groups, as cached, hold), only kept memory: the names are not hashed at
    /// every plan for it.
    pub fn keep_named<'n>(&mut self, names: impl ExactSizeIterator<Item = &'n str>) {
        if self.by_name.len() > names.len() {
            let names: HashSet<&str> = names.collect();
            self.by_name.retain(|n, _| names.contains(n.as_str()));
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct WatchStats {
    pub read: u64,
    pub reread_files: u64,
    pub cached: u64,
    pub overruns: u64,
    pub sweeps: u64,
    /// Processes whose groups a snapshot took from the last one (see `GroupWatch::keep`).
    pub proc_dirs_kept: u64,
    /// Tenants a plan knew had nothing to do in their groups without working it out again
    /// (see `Settled`), summed over the plans.
    pub tenants_settled: u64,
    /// Groups whose control files the metrics endpoint took from the watch instead of reading
    /// them (see `WatchedFiles`).
    pub groups_known: u64,
    /// Groups the metrics endpoint knew were not there without opening them (a tenant's group
    /// in a hierarchy its settings do not use).
    pub groups_known_absent: u64,
}

impl GroupWatch {
    pub fn new() -> std::io::Result<GroupWatch> {
        let inotify =
            inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC)?;
        Ok(GroupWatch {
            inotify,
            watched: HashMap::new(),
            parents: HashMap::new(),
            roots: Vec::new(),
            dirs: GroupDirs::default(),
            files: GroupFiles::default(),
            listing_stale: HashSet::new(),
            subtree_stale: HashSet::new(),
            unwatched: HashSet::new(),
            swept_at: None,
            absorbed_at: Instant::now(),
            extra: Vec::new(),
            proc_dirs: HashMap::new(),
            outside: None,
            settled: Settled::default(),
            stats: WatchStats::default(),
        })
    }

    /// The daemon's shared watch, locked (a panic elsewhere while it was held leaves nothing
    /// half-done that matters: at worst a walk reads more than it needed).
    pub fn lock(shared: &std::sync::Mutex<GroupWatch>) -> std::sync::MutexGuard<'_, GroupWatch> {
        shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Drops every cached reading: the next walk reads everything (watches are made anew).
    pub fn forget_all(&mut self) {
        for wd in self.watched.keys().chain(self.parents.keys()) {
            let _ = inotify::remove_watch(&self.inotify, *wd);
        }
        self.watched.clear();
        self.parents.clear();
        self.roots.clear();
        self.dirs.clear();
        self.files.clear();
        self.listing_stale.clear();
        self.subtree_stale.clear();
        self.unwatched.clear();
        self.swept_at = None;
        self.proc_dirs.clear();
        self.outside = None;
        self.settled = Settled::default();
    }

    /// A write to `path` (a control file or a group) failed: no event will say what the kernel
    /// holds there, so the group (and its parent's list of subgroups) is read again next time.
    pub fn failed(&mut self, path: &Path) {
        self.listing_stale.insert(path.into());
        if let Some(parent) = path.parent() {
            self.listing_stale.insert(parent.into());
        }
    }

    /// Before a walk: takes in the events since the last one (or forgets everything when the
    /// queue overran or the full sweep is due) and watches dbcage's parent groups.
    pub(super) fn begin(&mut self, parents: &[PathBuf], root_name: &str) {
        if self.swept_at.is_some_and(|t| t.elapsed() >= FULL_SWEEP) {
            self.stats.sweeps += 1;
            self.forget_all();
        }
        self.absorb_events();
        if self.swept_at.is_none() {
            self.swept_at = Some(Instant::now());
            self.roots = parents.iter().map(|p| p.join(root_name)).collect();
            // Modify (v2's subtree_control, a cpuset) and mkdir/rmdir of dbcage's root.
            for p in parents {
                if let Ok(wd) =
                    inotify::add_watch(&self.inotify, p.as_path(), WatchFlags::MODIFY | dir_flags())
                {
                    self.parents.insert(wd, root_name.into());
                }
            }
        }
    }

    /// Takes in the queued events if the last time was `ABSORB_EVERY` ago or more. The daemon
    /// calls it after its own writes and moves (each raises an event: a storm of 500 execs a
    /// second in five hierarchies queues 2,500 a second), so that the queue
    /// (fs.inotify.max_queued_events, 16,384 by default) does not overrun between two rescans.
    pub fn absorb_events_if_due(&mut self) {
        if self.absorbed_at.elapsed() >= ABSORB_EVERY {
            self.absorb_events();
        }
    }

    /// Takes in the events queued since the last call.
    fn absorb_events(&mut self) {
        self.absorbed_at = Instant::now();
        let mut buf = [std::mem::MaybeUninit::uninit(); 8192];
        let mut forgotten: HashSet<PathBuf> = HashSet::new();
        let mut parent_changed = false;
        let mut overran = false;
        // The reader refills its buffer from the descriptor as it goes.
        let mut reader = inotify::Reader::new(&self.inotify, &mut buf);
        // Until WOULDBLOCK: none left (a read error too: the next walk reads them).
        while let Ok(ev) = reader.next() {
            let flags = ev.events();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                overran = true;
                continue;
            }
            let wd = ev.wd();
            if let Some(root) = self.parents.get(&wd) {
                // Not every event in the parent (on `parent = "root"` it is the hierarchy's
                // root, where other tools make their groups and move processes): the root
                // made, removed or renamed, and what the groups inherit.
                let name = ev.file_name().map(|n| n.to_bytes()).unwrap_or_default();
                use std::os::unix::ffi::OsStrExt as _;
                parent_changed |= name == root.as_bytes()
                    || name == b"cgroup.subtree_control"
                    || name.starts_with(b"cpuset.")
                    || flags.intersects(ReadFlags::DELETE_SELF | ReadFlags::MOVE_SELF);
                continue;
            }
            let Some(dir) = self.watched.get(&wd) else {
                continue;
            };
            if flags.contains(ReadFlags::IGNORED) {
                let dir = dir.to_path_buf();
                self.watched.remove(&wd);
                forgotten.insert(dir);
                continue;
            }
            if flags.intersects(LISTING) {
                self.listing_stale.insert(dir.clone());
                // A subgroup removed or renamed: its watch and everything below it go (the
                // kernel keeps a watched cgroup's inode alive until its watch is removed).
                if flags.intersects(ReadFlags::DELETE | ReadFlags::MOVED_FROM) {
                    if let Some(name) = ev.file_name() {
                        use std::os::unix::ffi::OsStrExt as _;
                        let name = std::ffi::OsStr::from_bytes(name.to_bytes());
                        forgotten.insert(dir.join(name));
                    }
                }
            }
            if flags.contains(ReadFlags::MODIFY) {
                self.subtree_stale.insert(dir.clone());
            }
        }
        if overran {
            self.stats.overruns += 1;
        }
        if overran || parent_changed {
            self.forget_all();
            return;
        }
        if !forgotten.is_empty() {
            self.forget_under(&forgotten);
        }
    }

    /// Removes the watches and cached readings of these directories and their subgroups.
    fn forget_under(&mut self, gone: &HashSet<PathBuf>) {
        let under = |p: &Path| p.ancestors().any(|a| gone.contains(a));
        let mut drop_wds = Vec::new();
        for (wd, dir) in &self.watched {
            if under(dir) {
                drop_wds.push(*wd);
            }
        }
        for wd in drop_wds {
            let _ = inotify::remove_watch(&self.inotify, wd);
            self.watched.remove(&wd);
        }
        self.dirs.retain(|d| !under(d));
        self.files.retain_groups(|d| !under(d));
        self.unwatched.retain(|d| !under(d));
    }

    /// How a directory found by the walk stands.
    /// Whether the last full sweep is less than `FULL_SWEEP` ago (what the kernel changes
    /// without an event is as read).
    fn swept_lately(&self) -> bool {
        self.swept_at.is_some_and(|t| t.elapsed() < FULL_SWEEP)
    }

    pub(super) fn freshness(&self, dir: &Path) -> Freshness {
        if !self.dirs.contains(dir)
            || self.listing_stale.contains(dir)
            || self.unwatched.contains(dir)
        {
            Freshness::Unknown
        } else if !self.subtree_stale.is_empty()
            && dir.ancestors().any(|a| self.subtree_stale.contains(a))
        {
            Freshness::FilesStale
        } else {
            Freshness::Fresh
        }
    }

    /// When no cached group under `root` (or `root`) needs reading again (see `freshness`: no
    /// event since, no group unwatched) and `root` was read before: how many groups the walk
    /// would take from the cache (a walk stops at depth 2, so that is all cached under it).
    pub(super) fn all_fresh_under(&self, root: &Path) -> Option<u64> {
        let nothing_stale = self.listing_stale.is_empty()
            && self.subtree_stale.is_empty()
            && self.unwatched.is_empty();
        (nothing_stale && self.dirs.contains(root))
            .then(|| 1 + self.dirs.under(root).count() as u64)
    }

    /// Watches a directory about to be read (before its files are read: a write between the
    /// two is then seen at the next walk).
    pub(super) fn watch(&mut self, dir: &GroupPath) {
        if self.dirs.contains(dir) && !self.unwatched.contains(&**dir) {
            return; // watched since its first reading; only its listing was stale
        }
        match inotify::add_watch(&self.inotify, &**dir, WatchFlags::MODIFY | dir_flags()) {
            Ok(wd) => {
                self.watched.insert(wd, dir.clone());
                self.unwatched.remove(&**dir);
            }
            Err(_) => {
                // ENOSPC (fs.inotify.max_user_watches) or a group gone: read it every time.
                self.unwatched.insert(dir.clone());
            }
        }
    }

    /// After a walk: the events taken in are answered.
    pub(super) fn end(&mut self) {
        self.listing_stale.clear();
        self.subtree_stale.clear();
    }

    /// Whether what a walk read outside dbcage's groups (in `snap` before it takes the watch's
    /// groups: the parent's and the hierarchy root's files, the parent's cpus and nodes) differs
    /// from the last walk's, or there was none. No event tells of all of it (a cpu taken
    /// offline shrinks the parent's cpuset, a grandparent's write its controllers), and every
    /// tenant's plan may depend on it. Remembers it for the next walk. The processes in the
    /// parent (cgroup v2 reads its `cgroup.procs`, for a warning) come and go with every
    /// process started there, and no tenant's files depend on them: not compared.
    pub(super) fn outside_changed(&mut self, snap: &super::Snapshot) -> bool {
        let mut files: Vec<(PathBuf, Box<str>)> = (snap.files.values())
            .filter(|(p, _)| p.file_name() != Some(std::ffi::OsStr::new(super::PROCS)))
            .map(|(p, v)| (p, Box::from(v)))
            .collect();
        files.sort_unstable();
        let now = (
            files,
            snap.parent_cpus.clone(),
            snap.parent_mems.clone(),
            snap.io_latency,
        );
        let changed = self.outside.as_ref() != Some(&now);
        self.outside = Some(now);
        changed
    }

    /// Takes back the groups a snapshot of `Snapshot::read_watched` lent (without them the
    /// next walk reads everything), and its processes' groups but those of `moved` (the
    /// processes its plan moves: where they end up is read next time).
    pub fn keep(&mut self, snap: &mut super::Snapshot, moved: &[u32]) {
        self.dirs = std::mem::take(&mut snap.dirs);
        self.files = std::mem::take(&mut snap.files);
        for k in self.extra.drain(..) {
            self.files.remove(&k);
        }
        self.proc_dirs = std::mem::take(&mut snap.proc_dirs);
        for pid in moved {
            self.proc_dirs.remove(pid);
        }
    }

    /// The groups kept (see `keep`) of those of `pids` that are in `unchanged` (both in order);
    /// the rest of what was kept is dropped (read again if asked for).
    pub(super) fn take_proc_dirs(
        &mut self,
        pids: &[u32],
        unchanged: &[u32],
    ) -> HashMap<u32, super::ProcDirs> {
        let mut kept = std::mem::take(&mut self.proc_dirs);
        let mut out = HashMap::new();
        if kept.is_empty() || unchanged.is_empty() {
            return out;
        }
        for &pid in pids {
            if unchanged.binary_search(&pid).is_ok() {
                if let Some(dirs) = kept.remove(&pid) {
                    out.insert(pid, dirs);
                }
            }
        }
        self.stats.proc_dirs_kept += out.len() as u64;
        out
    }

    /// Number of directories watched now.
    pub fn watches(&self) -> usize {
        self.watched.len()
    }
}

fn dir_flags() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::ONLYDIR
}

#[cfg(test)]
mod tests {
    //! The watch's bookkeeping on a plain directory tree under /tmp (any file system raises
    //! the events cgroupfs raises for writes, mkdir and rmdir; the daemon's test in tests/it
    //! runs on the kernel's cgroups).
    use super::*;
    use crate::cgroup::{read_groups, Snapshot, Watched};
    use itertools::Itertools as _;
    use std::fs;

    const FILES: [&str; 2] = ["cpu.max", "memory.max"];

    struct Tree {
        _tmp: tempfile::TempDir,
        parent: PathBuf,
        root: PathBuf,
    }

    fn tree() -> Tree {
        let tmp = tempfile::Builder::new()
            .prefix("dbcage-test-watch")
            .tempdir()
            .unwrap();
        let parent = tmp.path().to_path_buf();
        let root = parent.join("dbcage");
        for t in ["a", "b"] {
            for leaf in ["", "limited", "exempt"] {
                let dir = root.join(t).join(leaf);
                fs::create_dir_all(&dir).unwrap();
                for f in FILES {
                    fs::write(dir.join(f), "max\n").unwrap();
                }
            }
        }
        Tree {
            _tmp: tmp,
            parent,
            root,
        }
    }

    /// One walk as `Snapshot::read_watched` makes it; what it did.
    fn walk(w: &mut GroupWatch, t: &Tree) -> WatchStats {
        walk_noting(w, t).0
    }

    /// `walk`, and the tenants it read groups of (`Snapshot::tenants_read`), sorted.
    fn walk_noting(w: &mut GroupWatch, t: &Tree) -> (WatchStats, Option<Vec<String>>) {
        let before = w.stats;
        w.begin(std::slice::from_ref(&t.parent), "dbcage");
        let mut snap = Snapshot::default();
        let mut tenants_read = Some(HashSet::new());
        let watched = Watched {
            watch: &mut *w,
            tenants_read: &mut tenants_read,
        };
        let files = [FILES.to_vec(), FILES.to_vec(), FILES.to_vec()];
        read_groups(&t.root, &files, &mut snap, Some(watched), &mut Vec::new());
        w.end();
        let read = tenants_read.map(|r| r.into_iter().sorted().collect());
        (walk_stats(w, before), read)
    }

    fn walk_stats(w: &GroupWatch, before: WatchStats) -> WatchStats {
        WatchStats {
            read: w.stats.read - before.read,
            reread_files: w.stats.reread_files - before.reread_files,
            cached: w.stats.cached - before.cached,
            overruns: w.stats.overruns - before.overruns,
            sweeps: w.stats.sweeps - before.sweeps,
            proc_dirs_kept: w.stats.proc_dirs_kept - before.proc_dirs_kept,
            tenants_settled: 0,
            groups_known: 0,
            groups_known_absent: 0,
        }
    }

    fn value<'a>(w: &'a GroupWatch, path: &Path) -> Option<&'a str> {
        w.files.get(path)
    }

    fn counts(read: u64, reread_files: u64, cached: u64) -> WatchStats {
        WatchStats {
            read,
            reread_files,
            cached,
            ..WatchStats::default()
        }
    }

    /// A watch shared as the daemon shares it, and the metrics endpoint's view of it.
    fn shared_watch() -> (std::sync::Arc<std::sync::Mutex<GroupWatch>>, WatchedFiles) {
        let shared = std::sync::Arc::new(std::sync::Mutex::new(GroupWatch::new().unwrap()));
        (shared.clone(), WatchedFiles(shared))
    }

    #[test]
    fn a_scrape_knows_the_files_of_groups_no_event_named_since() {
        use crate::hostfs::KnownFiles as _;
        let t = tree();
        let (shared, known) = shared_watch();
        let a = t.root.join("a");
        let file = |dir: &Path, name: &str| {
            let group = known.known_group(dir)?;
            let (_, text) = group.into_iter().find(|(n, _)| n == name)?;
            Some(text.into_string())
        };
        // Nothing read yet.
        known.refresh();
        assert_eq!(file(&a, "cpu.max"), None);
        walk(&mut GroupWatch::lock(&shared), &t);
        known.refresh();
        assert_eq!(file(&a, "cpu.max").as_deref(), Some("max\n"));
        assert_eq!(
            file(&a.join("limited"), "memory.max").as_deref(),
            Some("max\n")
        );
        // Not a file the walk reads (counters never are), not a group of dbcage's.
        assert_eq!(file(&a, "cpu.stat"), None);
        assert_eq!(file(&t.parent, "cpu.max"), None);
        // Written since the walk: not known (read from the file) until the next walk.
        fs::write(a.join("limited/cpu.max"), "50000 100000\n").unwrap();
        known.refresh();
        assert_eq!(file(&a.join("limited"), "cpu.max"), None);
        assert_eq!(
            file(&a, "cpu.max").as_deref(),
            Some("max\n"),
            "its parent is still as read"
        );
        assert_eq!(file(&t.root.join("b"), "cpu.max").as_deref(), Some("max\n"));
        walk(&mut GroupWatch::lock(&shared), &t);
        assert_eq!(
            file(&a.join("limited"), "cpu.max").as_deref(),
            Some("50000 100000\n")
        );
        // A full sweep overdue (the daemon not walking): nothing known.
        GroupWatch::lock(&shared).swept_at = Some(Instant::now() - FULL_SWEEP);
        assert_eq!(file(&a, "cpu.max"), None);
    }

    #[test]
    fn a_scrape_knows_the_groups_the_walk_did_not_find() {
        use crate::hostfs::KnownFiles as _;
        let t = tree();
        let (shared, known) = shared_watch();
        let c = t.root.join("c");
        known.refresh();
        assert!(!known.absent(&c), "nothing walked yet");
        walk(&mut GroupWatch::lock(&shared), &t);
        known.refresh();
        assert!(known.absent(&c));
        assert!(known.absent(&t.root.join("a/other")));
        assert!(!known.absent(&t.root.join("a")));
        assert!(!known.absent(&t.root.join("a/limited")));
        // Below the depth whose listings the walks read, or outside dbcage's root: not known.
        assert!(!known.absent(&t.root.join("a/limited/deeper")));
        assert!(!known.absent(&t.parent.join("other")));
        // Made since the walk: its parent's listing is stale until the next walk.
        fs::create_dir(&c).unwrap();
        known.refresh();
        assert!(!known.absent(&c));
        assert!(!known.absent(&t.root.join("d")));
        walk(&mut GroupWatch::lock(&shared), &t);
        assert!(!known.absent(&c));
        assert!(known.absent(&t.root.join("d")));
        // A reader's open of a group known absent fails as the open would, without the open.
        let kept = crate::hostfs::KeptDirs::new();
        kept.know(std::sync::Arc::new(WatchedFiles(shared.clone())));
        let before = GroupWatch::lock(&shared).stats.groups_known_absent;
        let d = crate::hostfs::OpenDir::kept(t.root.join("d"), &kept);
        let err = d.read("cpu.max").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(
            GroupWatch::lock(&shared).stats.groups_known_absent,
            before + 1
        );
        // A full sweep overdue (the daemon not walking): nothing known.
        GroupWatch::lock(&shared).swept_at = Some(Instant::now() - FULL_SWEEP);
        assert!(!known.absent(&t.root.join("d")));
    }

    #[test]
    fn rereads_only_what_changed() {
        let t = tree();
        let mut w = GroupWatch::new().unwrap();
        // root, a, b and their two leaves each
        assert_eq!(walk(&mut w, &t), counts(7, 0, 0));
        assert_eq!(w.dirs.len(), 7);
        assert_eq!(w.watches(), 7);
        assert_eq!(
            walk_noting(&mut w, &t),
            (counts(0, 0, 7), Some(vec![])),
            "nothing changed, no tenant's groups read"
        );

        // A write in a's group: a and its leaves are read again for their files, the rest not.
        let a_max = t.root.join("a/cpu.max");
        fs::write(&a_max, "50000 100000\n").unwrap();
        assert_eq!(
            walk_noting(&mut w, &t),
            (counts(0, 3, 4), Some(vec!["a".into()]))
        );
        assert_eq!(value(&w, &a_max), Some("50000 100000\n"));
        assert_eq!(walk(&mut w, &t), counts(0, 0, 7));
        // A write in one of b's leaves: b's groups read.
        fs::write(t.root.join("b/limited/cpu.max"), "max\n").unwrap();
        assert_eq!(
            walk_noting(&mut w, &t),
            (counts(0, 1, 6), Some(vec!["b".into()]))
        );

        // A leaf removed: its parent is listed again, the leaf and its files are gone.
        let gone = t.root.join("b/exempt");
        for f in FILES {
            fs::remove_file(gone.join(f)).unwrap();
        }
        fs::remove_dir(&gone).unwrap();
        let (s, tenants_read) = walk_noting(&mut w, &t);
        assert_eq!(s.read, 1, "b listed again: {s:?}");
        assert_eq!(tenants_read, Some(vec!["b".into()]));
        assert!(!w.dirs.contains(gone.as_path()));
        assert!(FILES.iter().all(|f| value(&w, &gone.join(f)).is_none()));
        assert_eq!(w.watches(), 6, "the removed leaf's watch is removed too");

        // A new group: read in full, then from the watch.
        let new = t.root.join("c");
        fs::create_dir(&new).unwrap();
        fs::write(new.join("cpu.max"), "max\n").unwrap();
        let (s, tenants_read) = walk_noting(&mut w, &t);
        assert_eq!(
            (s.read, s.cached),
            (2, 5),
            "root listed again, c read: {s:?}"
        );
        assert_eq!(
            tenants_read, None,
            "the root read: no group known unchanged"
        );
        assert_eq!(value(&w, &new.join("cpu.max")), Some("max\n"));
        assert!(value(&w, &new.join("memory.max")).is_none());
        assert_eq!(walk(&mut w, &t), counts(0, 0, 7));

        // A failed write: that group is read again although no event came.
        w.failed(&t.root.join("a/limited/cpu.max"));
        let (s, tenants_read) = walk_noting(&mut w, &t);
        assert_eq!((s.read, s.cached), (1, 6), "a/limited read: {s:?}");
        assert_eq!(tenants_read, Some(vec!["a".into()]));
    }

    #[test]
    fn the_parent_resets_only_for_what_groups_inherit() {
        let t = tree();
        let mut w = GroupWatch::new().unwrap();
        walk(&mut w, &t);
        // Another tool's group and file beside dbcage's root: no effect.
        fs::create_dir(t.parent.join("other")).unwrap();
        fs::write(t.parent.join("cgroup.procs"), "1\n").unwrap();
        assert_eq!(walk(&mut w, &t), counts(0, 0, 7));
        // What dbcage's groups inherit from the parent: everything is read again.
        fs::write(t.parent.join("cgroup.subtree_control"), "+cpu\n").unwrap();
        assert_eq!(walk(&mut w, &t), counts(7, 0, 0));
        assert_eq!(walk(&mut w, &t), counts(0, 0, 7));
        fs::write(t.parent.join("cpuset.cpus"), "0\n").unwrap();
        assert_eq!(walk(&mut w, &t), counts(7, 0, 0));
    }

    /// What the plans take from outside dbcage's groups, compared from one walk to the next:
    /// a changed value (or the first walk) says so, the parent's processes do not.
    #[test]
    fn outside_files_are_compared_except_the_parents_processes() {
        let t = tree();
        let mut w = GroupWatch::new().unwrap();
        let outside = |controllers: &str, procs: &str, cpus: &str| {
            let mut snap = Snapshot::default();
            (snap.files).insert(t.parent.join("cgroup.controllers"), controllers.into());
            (snap.files).insert(t.parent.join(crate::cgroup::PROCS), procs.into());
            snap.parent_cpus = Some(cpus.parse().unwrap());
            snap
        };
        assert!(
            w.outside_changed(&outside("cpu io\n", "1\n", "0-1")),
            "first walk"
        );
        assert!(!w.outside_changed(&outside("cpu io\n", "1\n", "0-1")));
        assert!(
            !w.outside_changed(&outside("cpu io\n", "1\n7\n", "0-1")),
            "procs"
        );
        assert!(
            w.outside_changed(&outside("cpu\n", "1\n7\n", "0-1")),
            "controllers"
        );
        assert!(
            w.outside_changed(&outside("cpu\n", "1\n7\n", "0")),
            "a cpu gone"
        );
        assert!(!w.outside_changed(&outside("cpu\n", "1\n7\n", "0")));
    }

    #[test]
    fn forgets_everything_on_request_and_keeps_no_watch() {
        let t = tree();
        let mut w = GroupWatch::new().unwrap();
        walk(&mut w, &t);
        w.forget_all();
        assert_eq!(w.watches(), 0);
        assert!(w.dirs.is_empty() && w.files.is_empty());
        assert_eq!(walk(&mut w, &t), counts(7, 0, 0));
    }
}
