//! The policy: which processes form each tenant, which disks it uses, and the limits it gets.
//!
//! Reading happens in two steps (see `raw` and `validate`): serde reads TOML into raw types that
//! keep every value's file, line and column; validation parses units, compiles regexes, resolves
//! users and groups, and collects *every* problem before returning, so one run of `dbcage check`
//! lists all of them. A policy with any error is never applied.

pub mod asm;
pub(crate) mod keys;
mod preset;
pub mod raw;
pub mod replication;
pub mod ruleset;
pub mod schedule;
pub mod source;
mod validate;
pub(crate) use validate::parse_duration;

use std::fmt;
use std::path::{Path, PathBuf};

use regex::Regex;
use std::sync::{Arc, OnceLock};

use crate::kernel::CpuSet;
pub use schedule::Schedule;
pub use source::{Origin, Sourced};
pub use validate::{check_group_name, Accounts, SystemAccounts};

/// Default location of the policy.
pub const DEFAULT_POLICY: &str = "/etc/dbcage/dbcage.toml";
/// Default name of the cgroup that holds every tenant.
pub const DEFAULT_ROOT: &str = "dbcage";
/// Default address of the daemon's metrics endpoint (loopback only).
pub const DEFAULT_METRICS: &str = "127.0.0.1:9477";

#[derive(Debug, Clone)]
pub struct Policy {
    pub agent: Agent,
    pub tenants: Vec<Tenant>,
    /// The files read, main file first, then drop-ins in merge order.
    pub files: Vec<PathBuf>,
    /// The tenants' rules compiled into one matcher (built once per policy read; clones share it).
    pub matcher: std::sync::Arc<ruleset::RuleSet>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    pub root_name: String,
    pub parent: ParentSpec,
    /// Where the daemon serves Prometheus metrics; `None` when `metrics = "off"`.
    pub metrics: Option<std::net::SocketAddr>,
    /// `agent.control_group`: members may use the control socket (root always may).
    pub control_group: Option<ControlGroup>,
    /// `agent.manager`: who owns the cgroup tree dbcage governs in.
    pub manager: ManagerChoice,
    /// `agent.io_latency`: the daemon records IO latency histograms (eBPF) for the metrics.
    pub io_latency: bool,
    /// `agent.favordynmods`: `dbcage run` turns the option on at start (see `favordynmods`).
    pub favordynmods: bool,
}

/// `agent.manager`: whether limits go through systemd (units' properties, transient scopes,
/// delegated subtrees) or straight to cgroupfs. `Auto` decides from the host at start-up
/// (`systemd::is_cgroup_manager`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ManagerChoice {
    #[default]
    Auto,
    Systemd,
    Cgroupfs,
}

impl ManagerChoice {
    pub const NAMES: &'static [&'static str] = &["auto", "systemd", "cgroupfs"];
    pub fn as_str(self) -> &'static str {
        match self {
            ManagerChoice::Auto => "auto",
            ManagerChoice::Systemd => "systemd",
            ManagerChoice::Cgroupfs => "cgroupfs",
        }
    }
}

impl std::str::FromStr for ManagerChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(ManagerChoice::Auto),
            "systemd" => Ok(ManagerChoice::Systemd),
            "cgroupfs" => Ok(ManagerChoice::Cgroupfs),
            other => Err(format!(
                "`{other}` is not a cgroup manager; use \"auto\" (systemd when it runs the host), \"systemd\" or \"cgroupfs\""
            )),
        }
    }
}

/// A group named by the policy, resolved to its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlGroup {
    pub name: String,
    pub gid: u32,
}

/// Where dbcage's root cgroup is created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParentSpec {
    /// Directly under each hierarchy's root (the production default).
    HierarchyRoot,
    /// Under the cgroup dbcage itself runs in, per controller (for shared hosts and delegation).
    OwnCgroup,
    /// Under this cgroup path (relative to each hierarchy's root, starting with `/`).
    Path(String),
}

#[derive(Debug, Clone)]
pub struct Tenant {
    pub name: String,
    pub origin: Origin,
    /// Any of these selects a process into the tenant's `limited` leaf.
    pub rules: Vec<Rule>,
    /// Any of these selects a process into the tenant's `exempt` leaf (no IO limits).
    pub exempt: Vec<Rule>,
    pub storage: Vec<Sourced<String>>,
    pub storage_level: StorageLevel,
    /// Instance totals over all the tenant's devices.
    pub io: IoLimits,
    pub io_devices: Vec<DeviceOverride>,
    /// How the totals divide over the devices (`split`, `rebalance_interval`, `floor`, ...).
    pub io_split: IoSplit,
    /// `io.weight`: the share of a contended disk (cgroup v2 with iocost on the disk).
    pub io_weight: Option<Sourced<u32>>,
    /// `io.latency_target`: the completion latency the tenant is protected at (cgroup v2).
    pub io_latency_target: Option<Sourced<std::time::Duration>>,
    /// `io.protect_*`: the protection guard on the tenant's io pressure, if any.
    pub io_guard: Option<PressureGuard>,
    /// `cpu.protect_*`: the protection guard on the tenant's cpu pressure, if any.
    pub cpu_guard: Option<PressureGuard>,
    pub cpu: CpuPolicy,
    pub memory: MemoryPolicy,
    /// `[tenant.replication]`: the replication guard, if any.
    pub replication: Option<replication::GuardConfig>,
    /// `[[tenant.schedule]]` windows, in file order (a later window wins where two overlap).
    pub schedules: Vec<Schedule>,
}

/// `[tenant.io] protect_pressure`, `protect_window`, `protect_donors`, `protect_lever` (or the
/// same keys but the lever in `[tenant.cpu]`): when this tenant's io (cpu) pressure passes
/// `pressure` of `window`, the daemon lowers the donors' io.weight or io caps (cpu.weight).
#[derive(Debug, Clone, PartialEq)]
pub struct PressureGuard {
    /// Whose pressure is watched, and so which of the donors' weights is lowered.
    pub resource: Resource,
    /// The share of the window (0 < p <= 1) the tenant's tasks may stall on IO.
    pub pressure: f64,
    pub window: std::time::Duration,
    pub donors: Vec<Sourced<String>>,
    pub lever: GuardLever,
    pub origin: Origin,
}

/// The pressure a protection guard watches (the tenant group's `io.pressure` or
/// `cpu.pressure`); the donors' weight it lowers is the same resource's.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Resource {
    #[default]
    Io,
    Cpu,
}

impl Resource {
    /// `io`, `cpu`: the policy table and the cgroup files' prefix.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Io => "io",
            Resource::Cpu => "cpu",
        }
    }
}

/// What the protection guard lowers on its donors (`io.protect_lever`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuardLever {
    /// Their io.weight: acts where the disk's controller shares by weight (iocost on v2).
    #[default]
    Weight,
    /// Their IO caps (the instance totals `read_bps` .. `write_iops` they have): io.max acts on
    /// every disk, with or without iocost.
    Caps,
}

impl Tenant {
    /// Whether one of its rules names this systemd unit (`unit =`, a name or a glob): under
    /// systemd such a unit is governed in place, as the tenant's own.
    pub fn names_unit(&self, unit: &str) -> bool {
        self.rules
            .iter()
            .chain(&self.exempt)
            .any(|r| r.unit.as_ref().is_some_and(|u| u.matches(unit)))
    }

    pub fn has_io_limits(&self) -> bool {
        !self.io.is_empty() || self.io_devices.iter().any(|d| !d.limits.is_empty())
    }
    pub fn sets_write_limits(&self) -> bool {
        self.io.write_bps.is_some()
            || self.io.write_iops.is_some()
            || self
                .io_devices
                .iter()
                .any(|d| d.limits.write_bps.is_some() || d.limits.write_iops.is_some())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageLevel {
    /// dm and md devices are limited as themselves.
    Device,
    /// dm and md devices are replaced by the whole disks they are built on.
    Members,
}

/// The four IO limits; `None` means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct IoLimits {
    pub read_bps: Option<u64>,
    pub write_bps: Option<u64>,
    pub read_iops: Option<u64>,
    pub write_iops: Option<u64>,
}

impl IoLimits {
    /// Key `k` in the order `read_bps`, `write_bps`, `read_iops`, `write_iops`.
    pub fn key(&self, k: usize) -> Option<u64> {
        [
            self.read_bps,
            self.write_bps,
            self.read_iops,
            self.write_iops,
        ][k]
    }

    /// Sets key `k` (order as in `key`).
    pub fn set_key(&mut self, k: usize, v: Option<u64>) {
        match k {
            0 => self.read_bps = v,
            1 => self.write_bps = v,
            2 => self.read_iops = v,
            _ => self.write_iops = v,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.read_bps.is_none()
            && self.write_bps.is_none()
            && self.read_iops.is_none()
            && self.write_iops.is_none()
    }

    /// Per key the lower of the two where both are set, the one that is set otherwise.
    pub fn min_each(&self, other: &IoLimits) -> IoLimits {
        let mut out = IoLimits::default();
        for k in 0..4 {
            let v = match (self.key(k), other.key(k)) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            out.set_key(k, v);
        }
        out
    }

    /// Keys set in `over` replace those here.
    pub fn overridden_by(&self, over: &IoLimits) -> IoLimits {
        IoLimits {
            read_bps: over.read_bps.or(self.read_bps),
            write_bps: over.write_bps.or(self.write_bps),
            read_iops: over.read_iops.or(self.read_iops),
            write_iops: over.write_iops.or(self.write_iops),
        }
    }
}

/// `[tenant.io] split`: how an instance total divides over the tenant's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Equal shares (what `dbcage apply` writes; the default).
    #[default]
    Equal,
    /// The daemon follows each device's recent usage (see `balance`).
    Demand,
}

/// Default `rebalance_interval`.
pub const DEFAULT_REBALANCE: std::time::Duration = std::time::Duration::from_millis(500);
/// Default `floor`: the share of the total each device keeps under `split = "demand"`.
pub const DEFAULT_FLOOR: f64 = 0.01;
/// Default `smoothing`: the weight of the previous estimate when a device's usage falls.
pub const DEFAULT_SMOOTHING: f64 = 0.1;

#[derive(Debug, Clone, PartialEq)]
pub struct IoSplit {
    pub split: Split,
    pub interval: std::time::Duration,
    /// Fraction of the total (0..=1/n); checked against the device count in `plan`.
    pub floor: f64,
    /// Where `floor` was written, for the error when it exceeds 1/n.
    pub floor_origin: Option<Origin>,
    pub smoothing: f64,
}

impl Default for IoSplit {
    fn default() -> Self {
        IoSplit {
            split: Split::Equal,
            interval: DEFAULT_REBALANCE,
            floor: DEFAULT_FLOOR,
            floor_origin: None,
            smoothing: DEFAULT_SMOOTHING,
        }
    }
}

/// Limits for one device that replace the share of the total it would otherwise get.
#[derive(Debug, Clone)]
pub struct DeviceOverride {
    pub path: Sourced<String>,
    pub limits: IoLimits,
}

#[derive(Debug, Clone, Default)]
pub struct CpuPolicy {
    pub cpus: Option<Sourced<CpuSet>>,
    pub numa_nodes: Option<Sourced<CpuSet>>,
    /// `numa = "auto"`: the plan chooses the nodes (see `plan::numa`); the origin locates its
    /// refusals.
    pub numa_auto: Option<Origin>,
    /// `migrate_memory = true`: a change of the tenant's memory nodes moves the memory of its
    /// running processes at once (see `plan::MemoryMove`); false (default) keeps the running
    /// instance where it is until it restarts.
    pub migrate_memory: bool,
    /// Quota in cores (2.5 = two and a half cpus' worth of time per period).
    pub cores: Option<f64>,
    /// Relative share, 1..=10000, default 100.
    pub weight: Option<u32>,
}

#[derive(Debug, Clone, Default)]
pub struct MemoryPolicy {
    pub max: Option<Sourced<u64>>,
    pub high: Option<u64>,
    pub low: Option<u64>,
    pub swap_max: Option<u64>,
    /// Bytes of huge pages the instance uses (PostgreSQL `huge_pages = on`, Oracle
    /// `use_large_pages`): counted by `numa = "auto"` against the nodes' huge page pools. Not a
    /// limit: hugetlb memory is not charged to memory.max.
    pub huge_pages: Option<u64>,
}

/// A rule's regex (`cmdline`, `comm`). Checked when the policy is read (syntax, and the size
/// limit a `Regex` has) but compiled on its own only if something matches with this rule alone:
/// processes are classified by `classify::Matcher`, which compiles all rules' patterns into one
/// set. A `Regex` per rule cost 2.5 ms and 40 KiB each (a dense DFA for every small pattern):
/// 4.5 s and 70 MiB for 1,000 tenants of two rules.
#[derive(Clone)]
pub struct Pattern(Arc<PatternInner>);

struct PatternInner {
    text: String,
    compiled: OnceLock<Regex>,
    shape: PatternShape,
}

/// What proving that one pattern's matches are all another's needs (`validate::overlaps`),
/// worked out from the parse that validated the pattern: parsing each pattern again for the
/// check was a fifth of reading a policy of 1,000 tenants.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct PatternShape {
    /// As the broad side: no end anchor, word boundary or other look-around but `^`.
    pub may_imply: bool,
    /// As the narrow side: anchored at the start, the literal prefixes every match begins with
    /// (None when there are none, or one is empty or not UTF-8: then nothing is proven).
    pub prefixes: Option<Vec<String>>,
    /// The one text the pattern matches, when it is a literal anchored at both ends
    /// (`^postgres$`): the rule set looks such patterns up instead of searching for them.
    pub exact: Option<String>,
}

impl PatternShape {
    fn of(hir: &regex_syntax::hir::Hir) -> PatternShape {
        use regex_syntax::hir::literal::{ExtractKind, Extractor};
        use regex_syntax::hir::Look;
        let may_imply = hir.properties().look_set().remove(Look::Start).is_empty();
        let prefixes = hir
            .properties()
            .look_set_prefix()
            .contains(Look::Start)
            .then(|| Extractor::new().kind(ExtractKind::Prefix).extract(hir))
            .and_then(|seq| {
                let lits = seq.literals()?;
                if lits.is_empty() {
                    return None;
                }
                lits.iter()
                    .map(|l| {
                        std::str::from_utf8(l.as_bytes())
                            .ok()
                            .filter(|s| !s.is_empty())
                            .map(str::to_string)
                    })
                    .collect()
            });
        PatternShape {
            may_imply,
            prefixes,
            exact: exact_text(hir),
        }
    }
}

/// The text a pattern of the form `^literal$` matches: `^` and `$` without the multi-line flag
/// are the text's start and end, so it matches that text and nothing else.
fn exact_text(hir: &regex_syntax::hir::Hir) -> Option<String> {
    use regex_syntax::hir::{HirKind, Look};
    let HirKind::Concat(parts) = hir.kind() else {
        return None;
    };
    match parts.iter().map(|h| h.kind()).collect::<Vec<_>>()[..] {
        [HirKind::Look(Look::Start), HirKind::Literal(lit), HirKind::Look(Look::End)] => {
            std::str::from_utf8(&lit.0).ok().map(str::to_string)
        }
        _ => None,
    }
}

/// The NFA size limit of `regex::RegexBuilder`'s default, which a pattern must stay within.
const PATTERN_SIZE_LIMIT: usize = 10 << 20;

impl Pattern {
    /// Checks `text` as `Regex::new` would, without building the regex; the error is the text
    /// `regex::Error` has for it.
    pub fn new(text: &str) -> Result<Pattern, String> {
        let hir = regex_syntax::Parser::new()
            .parse(text)
            .map_err(|e| e.to_string())?;
        let config =
            regex_automata::nfa::thompson::Config::new().nfa_size_limit(Some(PATTERN_SIZE_LIMIT));
        regex_automata::nfa::thompson::Compiler::new()
            .configure(config)
            .build_from_hir(&hir)
            .map_err(|e| {
                format!("compiled regex exceeds size limit of {PATTERN_SIZE_LIMIT} bytes ({e})")
            })?;
        Ok(Pattern(Arc::new(PatternInner {
            text: text.to_string(),
            compiled: OnceLock::new(),
            shape: PatternShape::of(&hir),
        })))
    }

    pub fn as_str(&self) -> &str {
        &self.0.text
    }

    pub(crate) fn shape(&self) -> &PatternShape {
        &self.0.shape
    }

    /// Matches this pattern alone (compiled on first use).
    pub fn is_match(&self, haystack: &str) -> bool {
        self.0
            .compiled
            .get_or_init(|| Regex::new(&self.0.text).expect("checked when the policy was read"))
            .is_match(haystack)
    }
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pattern({:?})", self.0.text)
    }
}

/// One match rule: every field that is set must match (AND); a tenant's rules are ORed.
#[derive(Debug, Clone)]
pub struct Rule {
    pub cmdline: Option<Pattern>,
    pub comm: Option<Pattern>,
    pub exe: Option<PathBuf>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// The process named by a pid file (`postmaster.pid`, `mysqld.pid`).
    pub pidfile: Option<PidFile>,
    /// Processes whose cgroup is in a systemd unit of this name (or glob), read from
    /// /proc/PID/cgroup; under systemd the tenant is governed in place through that unit.
    pub unit: Option<crate::unitname::UnitPattern>,
    /// Also take every existing descendant of a process this rule matches.
    pub descendants: bool,
    /// An exempt rule that only decides the leaf of the tenant's inherited processes and claims
    /// none by itself (`within_tenant = true`).
    pub within_tenant: bool,
    /// How the rule reads in plans and status (`match[1] comm=~^ora_p...`).
    pub label: String,
    pub origin: Origin,
}

/// A pid file a rule refers to, and the PID last read from it (0: none, unreadable, or not a
/// PID). The PID is shared by every clone of the policy, so one `refresh` (at each scan, and in
/// the daemon when the file's directory changes) serves the daemon's copy and the plan's alike.
#[derive(Debug, Clone)]
pub struct PidFile {
    pub path: PathBuf,
    pid: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl PidFile {
    pub fn new(path: PathBuf) -> Self {
        PidFile {
            path,
            pid: Default::default(),
        }
    }

    /// The PID read at the last refresh.
    pub fn pid(&self) -> Option<u32> {
        match self.pid.load(std::sync::atomic::Ordering::Relaxed) {
            0 => None,
            p => Some(p),
        }
    }

    /// Re-reads the file (through `fs`, so fixtures work); true when the PID changed. A missing
    /// file or one whose first line is not a PID (a server that is down, or mid-write) gives none.
    pub fn refresh(&self, fs: &crate::hostfs::HostFs) -> bool {
        let pid = fs
            .read_to_string(&self.path)
            .ok()
            .and_then(|t| parse_pid_file(&t))
            .unwrap_or(0);
        self.pid.swap(pid, std::sync::atomic::Ordering::Relaxed) != pid
    }
}

/// The PID on the first line of a pid file (PostgreSQL's postmaster.pid has more lines after it).
pub fn parse_pid_file(text: &str) -> Option<u32> {
    text.lines()
        .next()?
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|p| *p > 1)
}

impl Policy {
    /// Every pid file the rules name.
    pub fn pid_files(&self) -> impl Iterator<Item = &PidFile> {
        self.tenants
            .iter()
            .flat_map(|t| t.rules.iter().chain(&t.exempt))
            .filter_map(|r| r.pidfile.as_ref())
    }

    /// Re-reads every pid file; true when any PID changed.
    pub fn refresh_pid_files(&self, fs: &crate::hostfs::HostFs) -> bool {
        self.pid_files()
            .fold(false, |changed, f| f.refresh(fs) | changed)
    }
}

/// Everything wrong with a policy, each with its location when one is known.
#[derive(Debug, Clone, Default)]
pub struct PolicyErrors(pub Vec<Problem>);

#[derive(Debug, Clone)]
pub struct Problem {
    pub origin: Option<Origin>,
    pub message: String,
}

impl Problem {
    pub fn at(origin: &Origin, message: impl Into<String>) -> Self {
        Problem {
            origin: Some(origin.clone()),
            message: message.into(),
        }
    }
    pub fn general(message: impl Into<String>) -> Self {
        Problem {
            origin: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.origin {
            Some(o) => write!(f, "{o}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        writeln!(
            f,
            "the policy has {n} error{}; nothing was applied:",
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.0 {
            writeln!(f, "  {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyErrors {}

/// A validated policy and the warnings found on the way (things that work but may surprise).
#[derive(Debug, Clone)]
pub struct Loaded {
    /// Shared, not copied: the daemon's every rescan and the metrics view hold the same policy
    /// until a reload replaces it (at 1,000 tenants a copy is megabytes of rules and strings).
    pub policy: std::sync::Arc<Policy>,
    pub warnings: Vec<Problem>,
}

/// The drop-in directory for a policy file: `conf.d/` beside it.
pub fn dropin_dir(policy_file: &Path) -> PathBuf {
    policy_file
        .parent()
        .unwrap_or(Path::new("."))
        .join("conf.d")
}

/// Reads the policy file and its drop-ins (`conf.d/*.toml`, in name order) and validates them.
pub fn load(path: &Path, accounts: &dyn Accounts) -> Result<Loaded, PolicyErrors> {
    validate::from_sources(&read_sources(path, FileTrust::RootOnly)?, accounts)
}

/// Whether the policy files must be trusted: root's, and writable by no one else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FileTrust {
    /// Refuse files that are not root's or that group or others may write (the default).
    #[default]
    RootOnly,
    /// `--allow-insecure-policy`: read them whatever their owner and mode (development).
    Any,
}

/// Where the policy is read from (the main file; drop-ins in `conf.d/` beside it) and how far
/// its files are trusted. Derefs to the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyPath {
    pub path: PathBuf,
    pub trust: FileTrust,
}

impl PolicyPath {
    pub fn new(path: impl Into<PathBuf>, trust: FileTrust) -> PolicyPath {
        PolicyPath {
            path: path.into(),
            trust,
        }
    }
}

impl std::ops::Deref for PolicyPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

/// A policy file, `conf.d` or the directory that holds them must be owned by root and not
/// writable by group or others (a directory with the sticky bit, such as /tmp, is fine: others
/// cannot replace root's files in it): whoever can write them can change every limit and, through
/// `exe` rules and storage globs, steer a daemon that runs as root.
pub fn check_trusted(path: &Path, trust: FileTrust) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    if trust == FileTrust::Any {
        return Ok(());
    }
    let md = std::fs::metadata(path)
        .map_err(|e| format!("cannot read policy {}: {e}", path.display()))?;
    let what = if md.is_dir() { "directory" } else { "file" };
    if md.uid() != 0 {
        return Err(format!(
            "refusing the policy {what} {}: it is owned by uid {}, not root; `chown root {}` (or run with --allow-insecure-policy while developing)",
            path.display(),
            md.uid(),
            path.display()
        ));
    }
    let sticky_dir = md.is_dir() && md.mode() & 0o1000 != 0;
    if md.mode() & 0o022 != 0 && !sticky_dir {
        return Err(format!(
            "refusing the policy {what} {}: its mode {:04o} lets group or others write it; `chmod go-w {}` (or run with --allow-insecure-policy while developing)",
            path.display(),
            md.mode() & 0o7777,
            path.display()
        ));
    }
    Ok(())
}

/// What the daemon lays over the policy files: the schedule windows in force and the values
/// given with `dbcage set`, merged in that order after the files (so `set` wins).
#[derive(Debug, Clone, Default)]
pub struct Overlay {
    /// `(tenant, index of its [[tenant.schedule]])` of each window in force.
    pub windows: Vec<(String, usize)>,
    /// Drop-in shaped fragments (`[[tenant]] name = ... [tenant.io] read_bps = ...`) that may
    /// change only the limits of tenants the files define.
    pub fragments: Vec<(PathBuf, String)>,
}

/// Reads the policy file and its drop-ins as text, in merge order (what `load` validates).
pub fn read_sources(path: &Path, trust: FileTrust) -> Result<Vec<(PathBuf, String)>, PolicyErrors> {
    let general = |m: String| PolicyErrors(vec![Problem::general(m)]);
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    check_trusted(parent, trust).map_err(general)?;
    check_trusted(path, trust).map_err(general)?;
    let main = std::fs::read_to_string(path)
        .map_err(|e| general(format!("cannot read policy {}: {e}", path.display())))?;
    let mut sources = vec![(path.to_path_buf(), main)];
    let dir = dropin_dir(path);
    if dir.is_dir() {
        check_trusted(&dir, trust).map_err(general)?;
    }
    for p in dropin_files(path).map_err(general)? {
        check_trusted(&p, trust).map_err(general)?;
        let text = std::fs::read_to_string(&p)
            .map_err(|e| general(format!("cannot read drop-in {}: {e}", p.display())))?;
        sources.push((p, text));
    }
    Ok(sources)
}

/// The drop-ins beside a policy file (`conf.d/*.toml`), in name order.
pub fn dropin_files(path: &Path) -> Result<Vec<PathBuf>, String> {
    let dir = dropin_dir(path);
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot list drop-in directory {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    names.sort();
    Ok(names)
}

/// Validates policy sources with an overlay (see `Overlay`).
pub fn from_sources_with(
    sources: &[(PathBuf, String)],
    overlay: &Overlay,
    accounts: &dyn Accounts,
) -> Result<Loaded, PolicyErrors> {
    validate::from_sources_with(sources, overlay, accounts)
}

/// Validates policy text that is not on disk (tests, and `--config -`).
pub fn from_str(name: &str, text: &str, accounts: &dyn Accounts) -> Result<Loaded, PolicyErrors> {
    validate::from_sources(&[(PathBuf::from(name), text.to_string())], accounts)
}

/// A fixed account table for unit tests, so they do not depend on the users of the machine.
#[cfg(test)]
pub(crate) struct FakeAccounts;

#[cfg(test)]
impl Accounts for FakeAccounts {
    fn uid(&self, name: &str) -> Option<u32> {
        match name {
            "oracle" => Some(54321),
            "postgres" => Some(104),
            _ => None,
        }
    }
    fn gid(&self, name: &str) -> Option<u32> {
        match name {
            "dba" => Some(54322),
            "oinstall" => Some(54321),
            "postgres" => Some(110),
            _ => None,
        }
    }
}
