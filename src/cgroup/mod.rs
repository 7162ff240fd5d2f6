//! Cgroup hierarchies: which controller is driven through which version, where dbcage's groups
//! live, and what the kernel has there now.
//!
//! Detection is per controller (hybrid hosts exist: these machines mount v1 controllers beside
//! an empty cgroup2), and each hierarchy has its driver (`driver::Driver`: `v1::V1`, `v2::V2`).
//! The drivers are the only code that knows control-file names and versions; `read` gives the
//! rest of the program a tenant's limits and usage through them; `apply::write_file` is the
//! only code that writes under /sys/fs/cgroup.
//! Kernel references: Documentation/admin-guide/cgroup-v1/*.rst, cgroup-v2.rst.

pub mod apply;
pub mod coverage;
pub mod delegated;
pub mod driver;
pub mod model;
pub mod read;
pub mod stats;
pub mod systemd;
pub mod v1;
pub mod v2;
pub mod values;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::classify::Leaf;
use crate::hostfs::HostFs;
use crate::inventory::MountTable;
use crate::policy::{Agent, ParentSpec};
pub use values::{GroupDirs, GroupFiles, GroupPath};
pub use watch::GroupWatch;

/// The controllers dbcage drives. `Cpuacct` exists only on v1 (v2 reports cpu time in cpu.stat).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Controller {
    Io,
    Cpu,
    Cpuacct,
    Cpuset,
    Memory,
}

pub const CONTROLLERS: [Controller; 5] = [
    Controller::Io,
    Controller::Cpu,
    Controller::Cpuacct,
    Controller::Cpuset,
    Controller::Memory,
];

impl Controller {
    pub fn v1_name(self) -> &'static str {
        match self {
            Controller::Io => "blkio",
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
            Controller::Cpuset => "cpuset",
            Controller::Memory => "memory",
        }
    }
    pub fn v2_name(self) -> Option<&'static str> {
        match self {
            Controller::Io => Some("io"),
            Controller::Cpu => Some("cpu"),
            Controller::Cpuacct => None,
            Controller::Cpuset => Some("cpuset"),
            Controller::Memory => Some("memory"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Version {
    #[serde(rename = "v1")]
    V1,
    #[serde(rename = "v2")]
    V2,
}

impl Version {
    /// The driver that writes this version's files.
    pub fn driver(self) -> &'static dyn driver::Driver {
        match self {
            Version::V1 => &v1::V1,
            Version::V2 => &v2::V2,
        }
    }
}

/// One mounted hierarchy and the controllers dbcage drives through it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hierarchy {
    pub version: Version,
    pub mount_point: PathBuf,
    /// The cgroup path mounted at `mount_point` (`/` unless inside a container).
    pub mount_root: String,
    pub controllers: Vec<Controller>,
    /// Every controller name in the mount options (v1) — used to read /proc/PID/cgroup.
    pub mount_controllers: Vec<String>,
    /// Where this process itself is, relative to the hierarchy root.
    pub own_path: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Setup {
    pub hierarchies: Vec<Hierarchy>,
    /// Controllers found on no hierarchy (the kernel lacks them or they are not mounted).
    pub missing: Vec<Controller>,
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing `{value}` to {path}: {source}{hint}")]
    Write {
        path: PathBuf,
        value: String,
        source: std::io::Error,
        hint: String,
    },
    #[error("creating cgroup {path}: {source}")]
    Mkdir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("removing cgroup {path}: {source}")]
    Rmdir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} reads back `{got}` after writing `{wanted}`")]
    Readback {
        path: PathBuf,
        wanted: String,
        got: String,
    },
    #[error("{0}")]
    Layout(String),
    /// A systemd call of the systemd driver (the unit, properties and systemd's error inside).
    #[error("{0}")]
    Systemd(#[from] crate::systemd::Error),
}

impl CgroupError {
    /// The OS error number of a failed write (ESRCH: the process moved has exited; EBUSY: a
    /// v2 group that holds processes cannot enable controllers for its children).
    pub fn write_errno(&self) -> Option<i32> {
        match self {
            CgroupError::Write { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// The file or group the error is about, if it is one.
    pub fn path(&self) -> Option<&Path> {
        match self {
            CgroupError::Read { path, .. }
            | CgroupError::Write { path, .. }
            | CgroupError::Mkdir { path, .. }
            | CgroupError::Rmdir { path, .. }
            | CgroupError::Readback { path, .. } => Some(path),
            CgroupError::Layout(_) | CgroupError::Systemd(_) => None,
        }
    }
}

/// One line of /proc/PID/cgroup (`ID:controllers:path`), borrowed from its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcCgroupLine<'a> {
    /// Comma-separated (`cpu,cpuacct`, `name=systemd`); empty on the v2 line (`0::path`).
    pub controllers: &'a str,
    pub path: &'a str,
}

impl ProcCgroupLine<'_> {
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.controllers.split(',').filter(|n| !n.is_empty())
    }
}

/// /proc/PID/cgroup: `ID:controllers:path` per hierarchy (`0::path` for v2). Borrowed: the
/// daemon reads this file for every placed process in every plan, and owned strings per
/// controller name were some 40 allocations a process.
pub fn parse_proc_cgroup(text: &str) -> Vec<ProcCgroupLine<'_>> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let _id = parts.next()?;
            Some(ProcCgroupLine {
                controllers: parts.next()?,
                path: parts.next()?,
            })
        })
        .collect()
}

impl Hierarchy {
    /// The driver that expresses limits in this hierarchy.
    pub fn driver(&self) -> &'static dyn driver::Driver {
        self.version.driver()
    }

    /// The line of /proc/PID/cgroup that belongs to this hierarchy.
    fn pick<'a>(&self, lines: &[ProcCgroupLine<'a>]) -> Option<&'a str> {
        lines
            .iter()
            .find(|l| match self.version {
                Version::V2 => l.controllers.is_empty(),
                Version::V1 => l
                    .names()
                    .any(|n| self.mount_controllers.iter().any(|m| m == n)),
            })
            .map(|l| l.path)
    }

    /// A process's group directory in this hierarchy, from the text of its /proc/PID/cgroup.
    pub fn group_dir(&self, proc_cgroup: &str) -> Option<PathBuf> {
        self.pick(&parse_proc_cgroup(proc_cgroup))
            .and_then(|p| self.dir_of(p))
    }

    /// A cgroup path (relative to the hierarchy root) as a directory on this host.
    pub fn dir_of(&self, cgroup_path: &str) -> Option<PathBuf> {
        let root = self.mount_root.trim_end_matches('/');
        let rel = if root.is_empty() {
            Some(cgroup_path)
        } else {
            cgroup_path.strip_prefix(root)
        }?;
        if !(rel.is_empty() || rel.starts_with('/')) {
            return None;
        }
        Some(self.mount_point.join(rel.trim_start_matches('/')))
    }
}

impl Setup {
    pub fn detect(fs: &HostFs, mounts: &MountTable) -> Result<Setup, CgroupError> {
        let own_text =
            fs.read_to_string("/proc/self/cgroup")
                .map_err(|source| CgroupError::Read {
                    path: "/proc/self/cgroup".into(),
                    source,
                })?;
        let own = parse_proc_cgroup(&own_text);
        let mut hierarchies: Vec<Hierarchy> = Vec::new();
        let mut claimed = BTreeSet::new();
        // v1 first: a controller bound to a v1 hierarchy is unavailable to v2.
        for m in mounts.mounts.iter().filter(|m| m.fstype == "cgroup") {
            let names: Vec<String> = m
                .super_options
                .iter()
                .filter(|o| !matches!(o.as_str(), "rw" | "ro"))
                .cloned()
                .collect();
            let controllers: Vec<Controller> = CONTROLLERS
                .iter()
                .copied()
                .filter(|c| names.iter().any(|n| n == c.v1_name()))
                .collect();
            if controllers.is_empty() || hierarchies.iter().any(|h| h.mount_controllers == names) {
                continue; // a named hierarchy (name=systemd), or the same hierarchy mounted twice
            }
            claimed.extend(controllers.iter().copied());
            let mut h = Hierarchy {
                version: Version::V1,
                mount_point: fs.path(&m.mount_point),
                mount_root: m.root.clone(),
                controllers,
                mount_controllers: names,
                own_path: String::new(),
            };
            h.own_path = h.pick(&own).unwrap_or("/").to_string();
            hierarchies.push(h);
        }
        if let Some(m) = mounts.mounts.iter().find(|m| m.fstype == "cgroup2") {
            let mp = fs.path(&m.mount_point);
            let available =
                crate::hostfs::read_text(mp.join("cgroup.controllers")).unwrap_or_default();
            let controllers: Vec<Controller> = CONTROLLERS
                .iter()
                .copied()
                .filter(|c| !claimed.contains(c))
                .filter(|c| {
                    c.v2_name()
                        .is_some_and(|n| available.split_whitespace().any(|a| a == n))
                })
                .collect();
            if !controllers.is_empty() {
                claimed.extend(controllers.iter().copied());
                let mut h = Hierarchy {
                    version: Version::V2,
                    mount_point: mp,
                    mount_root: m.root.clone(),
                    controllers,
                    mount_controllers: Vec::new(),
                    own_path: String::new(),
                };
                h.own_path = h.pick(&own).unwrap_or("/").to_string();
                hierarchies.push(h);
            }
        }
        // On v2, cpu time comes from cpu.stat; cpuacct is not missing there.
        let v2_cpu = hierarchies
            .iter()
            .any(|h| h.version == Version::V2 && h.controllers.contains(&Controller::Cpu));
        let missing = CONTROLLERS
            .iter()
            .copied()
            .filter(|c| !(claimed.contains(c) || (*c == Controller::Cpuacct && v2_cpu)))
            .collect();
        Ok(Setup {
            hierarchies,
            missing,
        })
    }

    pub fn hierarchy_of(&self, c: Controller) -> Option<usize> {
        self.hierarchies
            .iter()
            .position(|h| h.controllers.contains(&c))
    }

    /// The hierarchy of a controller and its driver.
    pub fn driver_of(&self, c: Controller) -> Option<(usize, &'static dyn driver::Driver)> {
        self.hierarchy_of(c)
            .map(|h| (h, self.hierarchies[h].driver()))
    }

    /// The drivers in use, each once, in hierarchy order.
    pub fn drivers(&self) -> Vec<&'static dyn driver::Driver> {
        let mut out: Vec<&'static dyn driver::Driver> = Vec::new();
        for h in &self.hierarchies {
            let d = h.driver();
            if !out.iter().any(|x| x.name() == d.name()) {
                out.push(d);
            }
        }
        out
    }

    /// Whether IO write limits here pass buffered writes (they bind only O_DIRECT and fsync'd
    /// writes: v1).
    pub fn write_limits_pass_buffered_writes(&self) -> bool {
        self.driver_of(Controller::Io)
            .is_some_and(|(_, d)| !d.limits_buffered_writes())
    }

    /// `io=v1 cpu=v1 ...` for status output.
    pub fn describe(&self) -> String {
        self.controller_drivers()
            .iter()
            .map(|(c, v)| format!("{c}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Controller → the driver that serves it (`v1`, `v2`) or `missing`, in the order of
    /// `CONTROLLERS` (what `describe` prints, and `status --json` gives as an object).
    pub fn controller_drivers(&self) -> Vec<(&'static str, &'static str)> {
        let mut out = Vec::new();
        for c in CONTROLLERS {
            let v = match self.hierarchy_of(c) {
                Some(i) => self.hierarchies[i].driver().name(),
                None if self.missing.contains(&c) => "missing",
                None => continue,
            };
            out.push((c.v1_name(), v));
        }
        out
    }
}

/// Where dbcage's groups are in each hierarchy: `<parent>/<root>/<tenant>/{limited,exempt}`.
#[derive(Debug, Clone, Serialize)]
pub struct Layout {
    pub root_name: String,
    /// Indexed like `Setup::hierarchies`.
    pub parents: Vec<PathBuf>,
    pub setup: Setup,
    /// Under systemd: per tenant, the cgroups of the units that govern its processes in place
    /// (as /proc/PID/cgroup names them, its own units before its scope), from the plan
    /// (`Plan::units`). The readers (`read.rs`) read these instead of dbcage's own groups,
    /// which do not exist there. Empty under cgroupfs.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub units: BTreeMap<String, Vec<String>>,
}

impl Layout {
    pub fn new(setup: Setup, agent: &Agent) -> Result<Layout, CgroupError> {
        let mut parents = Vec::new();
        for h in &setup.hierarchies {
            let cg = match &agent.parent {
                ParentSpec::HierarchyRoot => h.mount_root.clone(),
                ParentSpec::OwnCgroup => h.own_path.clone(),
                ParentSpec::Path(p) => p.clone(),
            };
            let dir = h.dir_of(&cg).ok_or_else(|| {
                CgroupError::Layout(format!(
                    "the parent cgroup {cg} is not visible in the {} hierarchy mounted at {} (it shows only {})",
                    h.controllers.iter().map(|c| c.v1_name()).collect::<Vec<_>>().join(","),
                    h.mount_point.display(),
                    h.mount_root
                ))
            })?;
            parents.push(dir);
        }
        Ok(Layout {
            root_name: agent.root_name.clone(),
            parents,
            setup,
            units: BTreeMap::new(),
        })
    }

    pub fn root_dir(&self, h: usize) -> PathBuf {
        self.parents[h].join(&self.root_name)
    }
    pub fn tenant_dir(&self, h: usize, tenant: &str) -> PathBuf {
        self.root_dir(h).join(tenant)
    }
    /// Whether `dir` is `leaf_dir(h, tenant, leaf)` (compared without building it: a plan asks
    /// for every placed process in every hierarchy).
    pub fn is_leaf_dir(&self, dir: &Path, h: usize, tenant: &str, leaf: Leaf) -> bool {
        use std::ffi::OsStr;
        let names = [OsStr::new(tenant), OsStr::new(leaf.dir())];
        let want = Path::new(&self.root_name).iter().chain(names);
        dir.strip_prefix(&self.parents[h])
            .is_ok_and(|rest| rest.iter().eq(want))
    }

    pub fn leaf_dir(&self, h: usize, tenant: &str, leaf: Leaf) -> PathBuf {
        // One allocation, with room for the `cgroup.procs` a move appends (the daemon builds
        // these per event).
        let parent = self.parents[h].as_os_str().len();
        let mut dir = PathBuf::with_capacity(parent + self.root_name.len() + tenant.len() + 32);
        dir.push(&self.parents[h]);
        dir.push(&self.root_name);
        dir.push(tenant);
        dir.push(leaf.dir());
        dir
    }
    /// The file a process is moved into a leaf with.
    pub fn leaf_procs(&self, h: usize, tenant: &str, leaf: Leaf) -> PathBuf {
        procs_file(&self.leaf_dir(h, tenant, leaf))
    }
    pub fn dir(&self, h: usize, group: &GroupRef) -> PathBuf {
        match group {
            GroupRef::Parent => self.parents[h].clone(),
            GroupRef::Root => self.root_dir(h),
            GroupRef::Tenant(t) => self.tenant_dir(h, t),
            GroupRef::Leaf(t, l) => self.leaf_dir(h, t, *l),
        }
    }

    /// Per hierarchy (indexed like `Setup::hierarchies`), whether a tenant has groups there: a
    /// v1 hierarchy only when one of its controllers is one the tenant is grouped by
    /// (`coverage::grouped_by_policy`), the v2 hierarchy always (one tree for all controllers).
    pub fn grouped(&self, t: &crate::policy::Tenant) -> Vec<bool> {
        let want = coverage::grouped_by_policy(t);
        self.setup
            .hierarchies
            .iter()
            .map(|h| h.version == Version::V2 || h.controllers.iter().any(|c| want.contains(c)))
            .collect()
    }

    /// Tenant names that have groups under the root in any hierarchy.
    pub fn existing_tenants(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for h in 0..self.setup.hierarchies.len() {
            if let Ok(entries) = std::fs::read_dir(self.root_dir(h)) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        out.insert(e.file_name().to_string_lossy().into_owned());
                    }
                }
            }
        }
        out
    }
}

/// Reads dbcage's groups in one hierarchy (the root, its tenants and their leaves) and, in each,
/// the managed `files` of its depth (`Driver::managed_files_by_depth`): into `snap`, or with a
/// watch, into the watch's cache, rereading only the groups the events since its last walk
/// named.
///
/// Each group is opened once and its files are read relative to it (`openat`, then one read:
/// every managed file is one seq_file record), and its subgroups listed through the same
/// descriptor: with 1,000 tenants that is some 9,000 groups and 11,000 files in every plan, and
/// a walk from `/` plus a `statx` per file was most of their cost.
fn read_groups(
    root: &Path,
    files: &[Vec<&'static str>; 3],
    snap: &mut Snapshot,
    watched: Option<Watched>,
    buf: &mut Vec<u8>,
) {
    use rustix::fs::{Mode, OFlags};
    use watch::Freshness;
    let (mut watch, mut tenants_read) = match watched {
        Some(w) => (Some(w.watch), Some(w.tenants_read)),
        None => (None, None),
    };
    if let Some(w) = watch.as_deref_mut() {
        // Nothing written, made or removed since the last walk (an idle host's rescans): every
        // group is as cached, without visiting each (9,000 at 1,000 tenants on v1).
        if let Some(cached) = w.all_fresh_under(root) {
            w.stats.cached += cached;
            return;
        }
    }
    let mut visited = values::GroupSet::default();
    // (group, depth, whether a listing of this walk found it a directory)
    let mut stack: Vec<(GroupPath, usize, bool)> = vec![(GroupPath::from(root), 0, false)];
    while let Some((dir, depth, listed_now)) = stack.pop() {
        let freshness = watch
            .as_deref()
            .map_or(Freshness::Unknown, |w| w.freshness(&dir));
        if freshness != Freshness::Fresh {
            if let Some(read) = tenants_read.as_deref_mut() {
                note_read(read, &dir, depth);
            }
        }
        let dirs = match watch.as_deref() {
            Some(w) => &w.dirs,
            None => &snap.dirs,
        };
        if freshness != Freshness::Unknown && depth < watch::LISTED_DEPTH {
            stack.extend(dirs.children(&dir).map(|d| (d.clone(), depth + 1, false)));
        }
        if freshness == Freshness::Fresh {
            if let Some(w) = watch.as_deref_mut() {
                w.stats.cached += 1;
            }
            visited.insert(dir);
            continue;
        }
        let wanted = &files[depth.min(2)];
        // A leaf with no file to read at its depth (v1's cpu and cpuacct leaves), just listed
        // by its parent as a directory, is not opened: 2,000 opens an apply at 1,000 tenants
        // per such hierarchy. Any other group is: not there, or not a directory, nothing under it.
        let fd = if wanted.is_empty() && depth >= watch::LISTED_DEPTH && listed_now {
            None
        } else {
            match rustix::fs::open(
                &*dir,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => Some(fd),
                Err(_) => continue,
            }
        };
        if let Some(w) = watch.as_deref_mut() {
            // Watched before its files are read: a write in between is seen next time.
            w.watch(&dir);
            if freshness == Freshness::Unknown {
                w.stats.read += 1;
            } else {
                w.stats.reread_files += 1;
            }
        }
        let (dirs, values) = match watch.as_deref_mut() {
            Some(w) => (&mut w.dirs, &mut w.files),
            None => (&mut snap.dirs, &mut snap.files),
        };
        let read: Vec<values::FileValue> = match &fd {
            Some(fd) => (wanted.iter())
                .filter_map(|f| {
                    let raw = crate::inventory::procs::read_small_at(fd, f, buf)?;
                    let text = std::str::from_utf8(raw).ok()?;
                    Some((std::borrow::Cow::Borrowed(*f), Box::from(text)))
                })
                .collect(),
            None => Vec::new(),
        };
        values.set_group(dir.clone(), read);
        let listed = freshness == Freshness::Unknown && depth < watch::LISTED_DEPTH;
        if let (true, Some(fd)) = (listed, &fd) {
            if let Ok(entries) = rustix::fs::Dir::read_from(fd) {
                for e in entries.flatten() {
                    let name = e.file_name().to_bytes();
                    // Unknown (a file system without d_type): its own open tells.
                    let is_dir = e.file_type() == rustix::fs::FileType::Directory;
                    let dir_or_unknown = is_dir || e.file_type() == rustix::fs::FileType::Unknown;
                    if dir_or_unknown && name != b"." && name != b".." {
                        use std::os::unix::ffi::OsStrExt as _;
                        let sub = dir.join(std::ffi::OsStr::from_bytes(name));
                        // Known before (its listing was stale, not it): the path kept.
                        let sub = dirs
                            .get(sub.as_path())
                            .cloned()
                            .unwrap_or_else(|| sub.into());
                        stack.push((sub, depth + 1, is_dir));
                    }
                }
            }
        }
        dirs.insert(dir.clone());
        visited.insert(dir);
    }
    // Groups cached from an earlier walk that this one did not find are gone.
    if let Some(w) = watch {
        let gone: Vec<GroupPath> = (w.dirs.get(root).into_iter())
            .chain(w.dirs.under(root))
            .filter(|d| !visited.contains(d))
            .cloned()
            .collect();
        if !gone.is_empty() {
            if let Some(read) = tenants_read {
                *read = None; // (a removal its parent's listing did not tell: read all)
            }
        }
        for d in gone {
            w.files.remove_group(&d);
            w.dirs.remove(&d);
        }
    }
}

/// A walk under the daemon's watch, and what it tells of the tenants' groups it read (see
/// `Snapshot::tenants_read`).
struct Watched<'a> {
    watch: &'a mut GroupWatch,
    tenants_read: &'a mut Option<HashSet<String>>,
}

/// Notes a group a walk reads (not taken from the watch): a tenant's group or leaf names its
/// tenant; dbcage's root means no group is known unchanged.
fn note_read(read: &mut Option<HashSet<String>>, dir: &Path, depth: usize) {
    let tenant = match depth {
        0 => None,
        1 => dir.file_name(),
        _ => dir.parent().and_then(Path::file_name),
    };
    match (tenant.and_then(|t| t.to_str()), read.as_mut()) {
        (Some(t), Some(names)) => {
            if !names.contains(t) {
                names.insert(t.to_string());
            }
        }
        (None, _) => *read = None,
        (Some(_), None) => {}
    }
}

/// A process's group directory in each hierarchy (indexed like `Setup::hierarchies`; `None`
/// where it is in none dbcage can name). Those in dbcage's groups share the snapshot's copy of
/// the path (`GroupDirs::get`): kept from one rescan to the next, a copy each would cost 1.5 MiB
/// at 3,000 placed processes.
pub type ProcDirs = Vec<Option<GroupPath>>;

/// A group in dbcage's layout, independent of hierarchy.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum GroupRef {
    /// dbcage's parent cgroup (on v2 its `cgroup.subtree_control` is written; nothing else).
    Parent,
    Root,
    Tenant(String),
    Leaf(String, Leaf),
}

/// What the kernel has now under dbcage's root: which groups exist, the value of every control
/// file the drivers manage, and where each given process is.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub dirs: GroupDirs,
    pub files: GroupFiles,
    /// pid → its group directory in each hierarchy (indexed like `Setup::hierarchies`).
    pub proc_dirs: HashMap<u32, ProcDirs>,
    /// pid → resident memory in bytes.
    pub proc_rss: HashMap<u32, u64>,
    /// pid → bytes of its resident pages per NUMA node (numa_maps), read only for the processes
    /// of a running tenant whose memory nodes the plan changes (see `plan::MemoryMove`).
    pub proc_nodes: BTreeMap<u32, BTreeMap<u32, u64>>,
    /// cpus and memory nodes the parent allows (v1 cpuset.effective_*, v2 cpuset.*.effective).
    pub parent_cpus: Option<crate::kernel::CpuSet>,
    pub parent_mems: Option<crate::kernel::CpuSet>,
    /// Whether the kernel has blk-iolatency (`io.latency` next to `io.max` in a group with the
    /// io controller); `None` when no such group was seen.
    pub io_latency: Option<bool>,
    /// Under the daemon's watch (`read_watched`): the tenants some of whose groups this
    /// snapshot read (new ones, or an event said they changed); every other tenant's groups
    /// hold what the watch read for an earlier plan. `None` when no group is known to be
    /// unchanged: no watch, a root of dbcage's read again (a tenant's group made or removed, a
    /// full sweep, an overrun), a cached group gone, or the files outside dbcage's groups that
    /// its plans depend on (the parent's, the hierarchy root's) read with other values.
    pub tenants_read: Option<HashSet<String>>,
}

impl Snapshot {
    /// Reads the groups under the root (depth 2: tenants and their leaves), the files the driver
    /// manages in each, the parent's cpuset, and the groups of `pids`.
    ///
    /// Each group is opened once and its files are read relative to it (`openat`, then one
    /// read: every managed file is one seq_file record), and its subgroups listed through the
    /// same descriptor: with 1,000 tenants that is some 9,000 groups and 11,000 files in every
    /// plan and rescan, and a walk from `/` plus a `statx` per file was most of their cost.
    pub fn read(fs: &HostFs, layout: &Layout, pids: &[u32]) -> Snapshot {
        Snapshot::read_watched(fs, layout, pids, &[], &|_, _| true, None)
    }

    /// `read`, taking dbcage's groups from `watch` where no event said they changed since it
    /// last read them (the daemon's rescans and guard plans; see `watch`), and the groups of
    /// the processes in `unchanged` (in order: those a rescan kept unread, see
    /// `procs::Scanned::unchanged`) from the snapshot before where it had them. Give the
    /// snapshot back with `GroupWatch::keep` once planned. The resident memory (`proc_rss`) is
    /// read only for the pids `rss_wanted` names, asked once the groups are read.
    pub fn read_watched(
        fs: &HostFs,
        layout: &Layout,
        pids: &[u32],
        unchanged: &[u32],
        rss_wanted: &(dyn Fn(&Snapshot, u32) -> bool + Sync),
        mut watch: Option<&mut GroupWatch>,
    ) -> Snapshot {
        let mut snap = Snapshot::default();
        if let Some(w) = watch.as_deref_mut() {
            w.begin(&layout.parents, &layout.root_name);
        }
        let walks: Vec<(PathBuf, [Vec<&'static str>; 3])> = (layout.setup.hierarchies.iter())
            .enumerate()
            .map(|(h, hier)| {
                (
                    layout.root_dir(h),
                    hier.driver().managed_files_by_depth(&hier.controllers),
                )
            })
            .collect();
        match watch.as_deref_mut() {
            Some(w) => {
                let mut buf = Vec::with_capacity(4096);
                let mut tenants_read = Some(HashSet::new());
                for (root, files) in &walks {
                    let watched = Watched {
                        watch: &mut *w,
                        tenants_read: &mut tenants_read,
                    };
                    read_groups(root, files, &mut snap, Some(watched), &mut buf);
                }
                snap.tenants_read = tenants_read;
            }
            // A command's one reading (`apply`, `plan`): the hierarchies' walks in two threads
            // (1,000 tenants on v1: 12,000 groups in four hierarchies, ~380 ms of CPU).
            None => {
                let parts = crate::threads::in_two(&walks, 2, |part| {
                    let (mut read, mut buf) = (Snapshot::default(), Vec::with_capacity(4096));
                    for (root, files) in part {
                        read_groups(root, files, &mut read, None, &mut buf);
                    }
                    vec![read]
                });
                for part in parts {
                    snap.dirs.extend(part.dirs);
                    snap.files.extend(part.files);
                }
            }
        }
        for (h, hier) in layout.setup.hierarchies.iter().enumerate() {
            let driver = hier.driver();
            driver.read_parent(&layout.parents[h], &hier.controllers, &mut snap);
            driver.read_hierarchy_root(hier, &mut snap);
        }
        let mut kept_dirs = HashMap::new();
        if let Some(w) = watch {
            w.end();
            // What the plans take from outside dbcage's groups: when it changed, every
            // tenant is planned from scratch (a new kernel value has no event there: a cpu
            // taken offline, a grandparent's controllers).
            if w.outside_changed(&snap) {
                snap.tenants_read = None;
            }
            kept_dirs = w.take_proc_dirs(pids, unchanged);
            // The snapshot lends the watch's groups until `keep` gives them back; the parent's
            // and the hierarchy root's files, read every time, are not kept.
            w.extra = snap.files.paths().collect();
            let mut files = std::mem::take(&mut w.files);
            files.extend(std::mem::take(&mut snap.files));
            snap.files = files;
            snap.dirs = std::mem::take(&mut w.dirs);
        }
        // Each process's groups (kept, or /proc/PID/cgroup) and resident memory (statm), ~7 us
        // a file, in two threads once there are many. A kept process whose statm is gone has
        // exited since.
        let (read, kept) = (&snap, &kept_dirs);
        let placed = crate::threads::in_two(pids, 512, |part| {
            let Ok(mut reader) = ProcGroupReader::open(fs, layout) else {
                return Vec::new();
            };
            part.iter()
                .filter_map(|&pid| {
                    let dirs = match kept.contains_key(&pid) {
                        true => None,
                        false => Some(reader.dirs_sharing(pid, &read.dirs)?),
                    };
                    let rss = match rss_wanted(read, pid) {
                        true => Some(reader.resident_set_size(pid)?),
                        false => None,
                    };
                    Some((pid, dirs, rss))
                })
                .collect()
        });
        for (pid, dirs, rss) in placed {
            let Some(dirs) = dirs.or_else(|| kept_dirs.remove(&pid)) else {
                continue;
            };
            snap.proc_dirs.insert(pid, dirs);
            if let Some(rss) = rss {
                snap.proc_rss.insert(pid, rss);
            }
        }
        snap
    }

    pub fn file(&self, path: &Path) -> Option<&str> {
        self.files.get(path)
    }

    /// A tenant's cpuset now: (its hierarchy, cpus, mems) from its group's `cpuset.cpus` and
    /// `cpuset.mems` (the same names on v1 and v2); `None` without a cpuset controller, a group
    /// or a non-empty value in both.
    pub fn tenant_cpuset(
        &self,
        layout: &Layout,
        tenant: &str,
    ) -> Option<(usize, crate::kernel::CpuSet, crate::kernel::CpuSet)> {
        let (h, _) = layout.setup.driver_of(Controller::Cpuset)?;
        let dir = layout.tenant_dir(h, tenant);
        let read = |f: &str| {
            self.file(&dir.join(f))?
                .trim()
                .parse::<crate::kernel::CpuSet>()
                .ok()
                .filter(|s| !s.is_empty())
        };
        Some((h, read(v2::CPUS)?, read(v2::MEMS)?))
    }

    /// The names of the groups under dbcage's root that `named` does not name (tenants the
    /// policy no longer has), in any hierarchy, sorted. Names are borrowed, not collected: a
    /// plan asks at every rescan, and at 1,000 tenants nearly all are named.
    pub fn unnamed_tenant_groups<'s>(
        &'s self,
        layout: &Layout,
        named: &dyn Fn(&str) -> bool,
    ) -> BTreeSet<&'s str> {
        let mut out = BTreeSet::new();
        for h in 0..layout.setup.hierarchies.len() {
            let root = layout.root_dir(h);
            for dir in self.dirs.children(&root) {
                let name = dir.file_name().and_then(|n| n.to_str());
                if let Some(name) = name.filter(|n| !named(n)) {
                    out.insert(name);
                }
            }
        }
        out
    }
}

/// Where a process is now: its group directory in each hierarchy (indexed like
/// `Setup::hierarchies`), or `None` if it has exited.
pub fn proc_group_dirs(fs: &HostFs, layout: &Layout, pid: u32) -> Option<ProcDirs> {
    ProcGroupReader::open(fs, layout).ok()?.dirs(pid)
}

/// Reads processes' `/proc/PID/cgroup` (and `statm`) through the process reader's /proc
/// descriptor and buffer: a plan reads them for every placed process, and a path walked from
/// `/` and a buffer for each were a good part of that.
pub struct ProcGroupReader<'l> {
    procs: crate::inventory::procs::ProcReader,
    layout: &'l Layout,
}

impl<'l> ProcGroupReader<'l> {
    pub fn open(fs: &HostFs, layout: &'l Layout) -> std::io::Result<ProcGroupReader<'l>> {
        Ok(ProcGroupReader {
            procs: crate::inventory::procs::ProcReader::open(fs)?,
            layout,
        })
    }

    fn text(&mut self, pid: u32, file: &str) -> Option<&str> {
        std::str::from_utf8(self.procs.file(pid, file)?).ok()
    }

    /// The process's group directory in each hierarchy (indexed like `Setup::hierarchies`);
    /// `None` when it is gone.
    pub fn dirs(&mut self, pid: u32) -> Option<ProcDirs> {
        self.dirs_sharing(pid, &GroupDirs::default())
    }

    /// `dirs`, sharing the paths `known` has.
    pub fn dirs_sharing(&mut self, pid: u32, known: &GroupDirs) -> Option<ProcDirs> {
        let hierarchies = &self.layout.setup.hierarchies;
        let lines = parse_proc_cgroup(self.text(pid, "cgroup")?);
        Some(
            hierarchies
                .iter()
                .map(|h| {
                    let dir = h.dir_of(h.pick(&lines)?)?;
                    Some(known.get(&dir).cloned().unwrap_or_else(|| dir.into()))
                })
                .collect(),
        )
    }

    /// See the free function `resident_set_size`.
    pub fn resident_set_size(&mut self, pid: u32) -> Option<u64> {
        statm_resident(self.text(pid, "statm")?)
    }
}

/// The file a process is moved into a group with (`cgroup.procs`: the same in v1 and v2).
/// The file that moves a whole process into a group (v1 and v2 alike).
pub const PROCS: &str = "cgroup.procs";

pub fn procs_file(group: &Path) -> PathBuf {
    group.join(PROCS)
}

/// Whether a write to this file enables controllers for a group's children (v2
/// `cgroup.subtree_control`): when it fails, the limit files it would create do not exist.
pub fn enables_controllers(path: &Path) -> bool {
    path.ends_with(v2::SUBTREE_CONTROL)
}

/// Whether this control file holds per-device IO limits (in any driver): a rebalance writes
/// only these.
pub fn is_io_limit_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|f| f.to_str())
        .is_some_and(|f| v1::IO_LIMIT_FILES.contains(&f) || f == v2::IO_MAX)
}

/// A process's resident set size in bytes (the second field of /proc/PID/statm, in pages):
/// counted without walking its page tables, shared pages in full. `None` when it is gone.
pub fn resident_set_size(fs: &HostFs, pid: u32) -> Option<u64> {
    statm_resident(&crate::hostfs::read_text(fs.proc_file(pid, "statm")).ok()?)
}

/// The resident size in bytes from a /proc/PID/statm text (its second field, in pages).
fn statm_resident(statm: &str) -> Option<u64> {
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size())
}

pub fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map(|v| v as u64)
        .unwrap_or(4096)
}

/// Reads the pids in a group's cgroup.procs (empty if the group does not exist).
pub fn procs_in(dir: &Path) -> Vec<u32> {
    crate::hostfs::read_text(dir.join("cgroup.procs"))
        .map(|t| parse_procs(&t))
        .unwrap_or_default()
}

/// The pids of a `cgroup.procs` text.
pub fn parse_procs(text: &str) -> Vec<u32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// Per-hierarchy group directories for a tenant, for status and release.
pub fn tenant_dirs(layout: &Layout, tenant: &str) -> BTreeMap<usize, PathBuf> {
    (0..layout.setup.hierarchies.len())
        .map(|h| (h, layout.tenant_dir(h, tenant)))
        .collect()
}

#[cfg(test)]
mod tests;

/// Moves every process of a group (and its subgroups) to `to`, then removes the groups,
/// deepest first. Processes may fork while this runs, so it retries until the groups are empty.
/// Returns how many processes it moved.
pub fn drain_and_remove(dir: &Path, to: &Path) -> Result<usize, CgroupError> {
    let mut moved = 0;
    let mut dirs = vec![dir.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.insert(0, e.path());
            }
        }
    }
    for d in dirs {
        let mut attempt = 0;
        loop {
            for pid in procs_in(&d) {
                match apply::write_file(&to.join("cgroup.procs"), &pid.to_string()) {
                    Ok(()) => moved += 1,
                    Err(e) if e.write_errno() == Some(nix::libc::ESRCH) => {}
                    Err(e) => return Err(e),
                }
            }
            match std::fs::remove_dir(&d) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) && attempt < 100 => {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(source) => return Err(CgroupError::Rmdir { path: d, source }),
            }
        }
    }
    Ok(moved)
}

/// Moves a tenant's processes back to dbcage's parent cgroup and removes its groups, in every
/// hierarchy. Returns how many processes moved (counted once per process, from the hierarchy
/// that moved the most).
pub fn release_tenant(layout: &Layout, tenant: &str) -> Result<usize, CgroupError> {
    let mut moved = 0;
    for h in 0..layout.setup.hierarchies.len() {
        let dir = layout.tenant_dir(h, tenant);
        if dir.is_dir() {
            moved = moved.max(drain_and_remove(&dir, &layout.parents[h])?);
        }
    }
    Ok(moved)
}

/// Removes dbcage's root group in every hierarchy once no tenant is left in it.
pub fn remove_root(layout: &Layout) -> Result<(), CgroupError> {
    for h in 0..layout.setup.hierarchies.len() {
        let root = layout.root_dir(h);
        if root.is_dir() {
            drain_and_remove(&root, &layout.parents[h])?;
        }
    }
    Ok(())
}
