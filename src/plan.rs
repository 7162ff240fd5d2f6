//! Policy + inventory + what the kernel has now → the steps that make the kernel match the policy.
//!
//! Pure: no file system, no clock, no globals; everything arrives as values (what the host has,
//! swap accounting and stale tenant groups included, is in the `Snapshot`). `dbcage plan` prints the very
//! `Plan` that `dbcage apply` executes. Only differences become steps, so a second apply with
//! nothing changed has no steps. Ordering rules that keep the kernel consistent mid-change:
//! groups are created parents first; per-device IO limits are lowered before any is raised, so the
//! sum over a tenant's devices never exceeds its total; cpusets are widened top-down and narrowed
//! bottom-up (v1 requires a child's set within its parent's); v1 memsw is moved on the side that
//! keeps memsw >= limit; processes move last, into groups that already have their limits.
//! A tenant has groups only in the hierarchies its settings use (`Layout::grouped`: io, cpu and
//! cpuacct always, cpuset when it pins, memory with a memory setting); its processes leave
//! dbcage's groups in the others (back to dbcage's parent there), and its groups in a hierarchy
//! its settings no longer use are emptied and removed after the moves.
//! On cgroup v2, controllers are enabled in `cgroup.subtree_control` (parent, root, tenants, in
//! that order) right after the groups are created and before any limit, and an `io.max` line
//! that lowers one key and raises another is split into a lowering and a raising write. Each
//! spec is written by the driver of its controller's version (v1 and v2 mix on hybrid hosts).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use crate::cgroup::driver::SpecInput;
use crate::cgroup::model::{FileSpec, TenantSettings};
use crate::cgroup::{Controller, GroupRef, Layout, Snapshot};
use crate::classify::{Classifier, Leaf, Placement};
use crate::inventory::Inventory;
use crate::kernel::{CpuSet, DevNum};
use crate::policy::{IoLimits, Policy, PolicyErrors, Problem, Sourced, Tenant};
use crate::systemd::Property;
use crate::units::HumanBytes;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "action", rename_all = "lowercase")]
pub enum Step {
    /// Create a cgroup.
    Mkdir { path: PathBuf, reason: String },
    /// Write one value to one control file.
    Write {
        path: PathBuf,
        value: String,
        current: Option<String>,
        reason: String,
    },
    /// Under systemd: set a unit's properties at runtime (the tenant's limits on the unit its
    /// processes run in, or on its scope); `was` holds what the unit had (the drift repaired).
    SetUnitProperties {
        unit: String,
        tenant: String,
        set: Vec<crate::systemd::Property>,
        was: Vec<crate::systemd::Property>,
        reason: String,
    },
    /// Under systemd: processes started outside systemd join the tenant's transient scope
    /// (created with `properties` and Delegate=yes when it does not run yet), into its `leaf`
    /// when the running scope holds the tenant's leaves (`plan::delegated`).
    Adopt {
        tenant: String,
        pids: Vec<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        leaf: Option<Leaf>,
        properties: Vec<crate::systemd::Property>,
        reason: String,
    },
    /// Move a whole process (all its threads) by writing its pid to each `cgroup.procs`.
    Move {
        pid: u32,
        comm: String,
        tenant: String,
        leaf: Leaf,
        targets: Vec<PathBuf>,
        /// The `cgroup.procs` of dbcage's parent in the hierarchies the tenant has no group in
        /// where the process is in a group of dbcage's now (it leaves a pinned tenant's cpuset,
        /// say): written after `targets`.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        leave: Vec<PathBuf>,
        reason: String,
    },
    /// Remove a tenant's group (its leaves first) from a hierarchy its settings no longer use,
    /// after moving whatever runs in it to `to` (dbcage's parent there), as `release` does.
    Remove {
        path: PathBuf,
        to: PathBuf,
        reason: String,
    },
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub warnings: Vec<String>,
    /// Tenants with write limits on a hierarchy where they pass buffered writes (cgroup v1).
    /// Kept apart from `warnings` so that views can say it in full once (`check`), briefly when
    /// a plan writes something, and not at all on a no-op.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub buffered_writes_pass: Vec<String>,
    /// Per tenant: the devices and the limits each gets (for people reading the plan).
    pub tenants: Vec<TenantSummary>,
    /// The nodes chosen for `numa = "auto"` tenants, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub numa: Vec<numa::Choice>,
    /// Running tenants whose memory nodes the policy changes: moved now or kept until restart.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub memory_moves: Vec<MemoryMove>,
}

/// A tenant with processes in its groups whose memory nodes (`cpuset.mems`) the policy changes.
/// Its pages follow a new `cpuset.mems` (cgroup v2 always migrates them; on v1 the plan sets
/// `cpuset.memory_migrate` first), a copy of every page held on the nodes it leaves, paid by
/// the running instance. So the plan makes the change only when asked (`apply
/// --migrate-memory`, or `cpu.migrate_memory = true` in the policy or in a window that is open);
/// otherwise the tenant keeps its cpus and nodes while those processes run, and the new ones
/// are written once its groups hold none (the instance restarted: its new processes start on
/// the new nodes).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryMove {
    pub tenant: String,
    pub from: CpuSet,
    pub to: CpuSet,
    /// The processes in the tenant's groups now.
    pub pids: Vec<u32>,
    /// Their resident bytes on nodes outside `to` (what moves), from /proc/PID/numa_maps;
    /// `None` when those were not read.
    pub bytes: Option<u64>,
    /// Moved by this plan (true), or kept on `from` until the instance restarts (false).
    pub migrate: bool,
}

impl Plan {
    /// One line per `numa = "auto"` tenant this plan puts on other nodes than it is on: from
    /// which to which, and what becomes of its memory (moved now, held until its restart, or
    /// nothing to move).
    pub fn numa_changes(&self) -> Vec<String> {
        self.numa
            .iter()
            .filter_map(|c| {
                let was = c.was.as_ref().filter(|w| **w != c.nodes)?;
                let memory = match self.memory_moves.iter().find(|m| m.tenant == c.tenant) {
                    Some(m) => {
                        let bytes = m.bytes.map_or("an unknown amount".into(), |b| {
                            HumanBytes(b).to_string()
                        });
                        if m.migrate {
                            format!("cpus now; {bytes} of memory moves to nodes {} now", m.to)
                        } else {
                            format!(
                                "cpus now; its memory ({bytes} outside nodes {}) stays on nodes {} until the instance restarts (`dbcage set {} cpu.migrate_memory=true` moves it now)",
                                m.to, m.from, c.tenant
                            )
                        }
                    }
                    None if was.is_subset(&c.nodes) => "cpus and nodes now; no memory moves".into(),
                    None => "cpus and nodes now; no process runs in it, no memory moves".into(),
                };
                Some(format!(
                    "tenant `{}`: NUMA nodes {was} -> {}: {memory}",
                    c.tenant, c.nodes
                ))
            })
            .collect()
    }
}

impl MemoryMove {
    /// Why the tenant stays on its nodes, for `check`, `plan` and `apply`.
    pub fn deferred_text(&self, cpus_before: &CpuSet, cpus: &CpuSet) -> String {
        let bytes = match self.bytes {
            Some(b) => format!(
                "{} of their memory is on nodes outside {}",
                HumanBytes(b),
                self.to
            ),
            None => "how much of their memory would move is unknown (numa_maps unreadable)".into(),
        };
        format!(
            "tenant `{}`: its memory nodes change from {} to {} with {} in its groups ({bytes}): its cpus change now ({}), its memory stays on nodes {} until the instance restarts; `dbcage apply --migrate-memory` (with the daemon running: `dbcage set TENANT cpu.migrate_memory=true`, or cpu.migrate_memory = true in the policy) moves it now",
            self.tenant,
            self.from,
            self.to,
            crate::units::count(self.pids.len(), "process", "processes"),
            if cpus_before == cpus {
                format!("cpus {cpus}")
            } else {
                format!("cpus {cpus_before} -> {cpus}")
            },
            self.from,
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TenantSummary {
    pub name: String,
    pub settings: TenantSettings,
    pub processes: usize,
    /// Under systemd: the cgroups of the units that govern the tenant's processes in place
    /// (its own service units and its scope), its own units before its scope.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<String>,
    /// Under systemd: the unit properties of the tenant's settings, what its scope is started
    /// with when the daemon adopts a process between full plans.
    #[serde(skip)]
    pub unit_properties: Vec<Property>,
    /// Under systemd: the cgroups of units it shares with other processes (not governed).
    #[serde(skip)]
    pub shared_units: Vec<String>,
    /// Under systemd: its units that delegate their subtree and hold its `limited` and
    /// `exempt` leaves (`plan::delegated`): each unit's cgroup and its directory in the io
    /// hierarchy.
    #[serde(skip)]
    pub delegated_units: Vec<(String, PathBuf)>,
    /// Under systemd: its units that run exempt processes under the unit's IO limits until
    /// they have `Delegate=yes` (`dbcage systemd-setup` writes the drop-in).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub needs_delegate: Vec<String>,
    /// Under systemd: its scope is to hold its leaves (`Governed::scope_wants_leaves`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub scope_wants_leaves: bool,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Under systemd, per tenant, the units' cgroups its limits and usage are read from (for
    /// `Layout::units`); empty under cgroupfs.
    pub fn units(&self) -> BTreeMap<String, Vec<String>> {
        self.tenants
            .iter()
            .filter(|t| !t.units.is_empty())
            .map(|t| (t.name.clone(), t.units.clone()))
            .collect()
    }

    /// Under systemd: whether this plan adopts processes into the own group of a scope that is
    /// to hold the tenant's leaves (it does not run yet, so its tree could not be planned): a
    /// plan after it makes the leaves and moves them in (`apply` runs it before it returns).
    pub fn adopts_before_leaves(&self) -> bool {
        self.steps.iter().any(|s| {
            matches!(s, Step::Adopt { tenant, leaf: None, .. }
                if self.tenants.iter().any(|t| t.name == *tenant && t.scope_wants_leaves))
        })
    }

    /// Under systemd, per tenant, what the daemon's event path needs between full plans.
    pub fn governed(&self) -> BTreeMap<String, Governed> {
        self.tenants
            .iter()
            .map(|t| {
                let g = Governed {
                    units: t.units.clone(),
                    properties: t.unit_properties.clone(),
                    shared: t.shared_units.clone(),
                    delegated: t.delegated_units.clone(),
                    needs_delegate: t.needs_delegate.clone(),
                    settings: t.settings.clone(),
                    scope_wants_leaves: t.scope_wants_leaves,
                };
                (t.name.clone(), g)
            })
            .collect()
    }

    /// The cgroup v1 write-limit caveat in full (`check`), or `None` when it does not apply.
    pub fn buffered_writes_note(&self) -> Option<String> {
        (!self.buffered_writes_pass.is_empty()).then(|| format!(
            "tenants with write limits ({}): on cgroup v1 write limits bind only direct (O_DIRECT) and fsync'd writes; buffered writes without fsync are written back by the kernel, not charged to the writer, and pass the limit (measured here: about 1000 times past an 8 MiB/s limit). Databases that use O_DIRECT or fsync are limited; use cgroup v2 to limit buffered writes too",
            self.buffered_writes_pass.join(", ")
        ))
    }
}

/// Per tenant, the per-device limits the plan uses instead of the equal split (the daemon's
/// balancer decides them, see `engine::Adjustments`).
pub type Shares = BTreeMap<String, BTreeMap<DevNum, IoLimits>>;

/// Divides the instance total equally over `n` devices (as the seed scripts do), rounding down
/// so that the per-device values never add up to more than the total.
pub fn split_equal(total: u64, n: usize) -> u64 {
    if n == 0 {
        0
    } else {
        total / n as u64
    }
}

/// The per-device limits of a tenant: the total split equally, then per-device overrides.
pub fn io_per_device(
    t: &Tenant,
    devices: &[DevNum],
    overrides: &BTreeMap<DevNum, IoLimits>,
    problems: &mut Vec<Problem>,
) -> BTreeMap<DevNum, IoLimits> {
    io_per_device_with(t, devices, overrides, None, problems)
}

/// Whether the balancer's shares can stand in for the equal split: one entry per device, and
/// for each key the tenant sets, every device has a value of at least 1 and their sum is within
/// the total. Anything else (a device added or gone since) falls back to the equal split.
pub fn shares_fit(t: &Tenant, devices: &[DevNum], shares: &BTreeMap<DevNum, IoLimits>) -> bool {
    let same_devices =
        shares.len() == devices.len() && devices.iter().all(|d| shares.contains_key(d));
    same_devices
        && (0..4).all(|k| {
            let total = t.io.key(k);
            let vals: Vec<Option<u64>> = devices.iter().map(|d| shares[d].key(k)).collect();
            match total {
                None => vals.iter().all(Option::is_none),
                Some(total) => {
                    vals.iter().all(|v| v.is_some_and(|v| v >= 1))
                        && vals.iter().map(|v| v.unwrap_or(0) as u128).sum::<u128>()
                            <= total as u128
                }
            }
        })
}

/// `io_per_device`, with the balancer's current shares for a tenant with `split = "demand"`
/// (when they fit, see `shares_fit`) in place of the equal split; overrides still apply on top.
pub fn io_per_device_with(
    t: &Tenant,
    devices: &[DevNum],
    overrides: &BTreeMap<DevNum, IoLimits>,
    shares: Option<&BTreeMap<DevNum, IoLimits>>,
    problems: &mut Vec<Problem>,
) -> BTreeMap<DevNum, IoLimits> {
    let n = devices.len();
    if t.io_split.split == crate::policy::Split::Demand
        && n > 0
        && t.io_split.floor * n as f64 > 1.0 + 1e-9
    {
        let msg = format!(
            "tenant `{}`: io.floor {}% is more than an equal share of its {n} devices (at most {:.2}%)",
            t.name,
            t.io_split.floor * 100.0,
            100.0 / n as f64
        );
        problems.push(match &t.io_split.floor_origin {
            Some(o) => Problem::at(o, msg),
            None => Problem::at(&t.origin, msg),
        });
    }
    let balanced = shares
        .filter(|s| t.io_split.split == crate::policy::Split::Demand && shares_fit(t, devices, s));
    let share = |total: Option<u64>, key: &str, problems: &mut Vec<Problem>| {
        let v = total.map(|t| split_equal(t, n));
        if v == Some(0) && n > 0 {
            problems.push(Problem::at(
                &t.origin,
                format!(
                "tenant `{}`: io.{key} = {} is less than one unit per device over its {n} devices",
                t.name,
                total.unwrap_or(0)
            ),
            ));
        }
        v
    };
    let equal = IoLimits {
        read_bps: share(t.io.read_bps, "read_bps", problems),
        write_bps: share(t.io.write_bps, "write_bps", problems),
        read_iops: share(t.io.read_iops, "read_iops", problems),
        write_iops: share(t.io.write_iops, "write_iops", problems),
    };
    devices
        .iter()
        .map(|d| {
            let base = balanced.map_or(equal, |s| s[d]);
            (
                *d,
                overrides
                    .get(d)
                    .map(|o| base.overridden_by(o))
                    .unwrap_or(base),
            )
        })
        .filter(|(_, l)| !l.is_empty())
        .collect()
}

/// Resolves a tenant's cpu and memory-node sets against the NUMA topology and what the parent
/// allows.
fn cpu_sets(
    t: &Tenant,
    inv: &Inventory,
    auto_nodes: Option<&CpuSet>,
    allowed_cpus: &CpuSet,
    allowed_mems: &CpuSet,
    problems: &mut Vec<Problem>,
) -> (CpuSet, CpuSet) {
    let mut cpus = allowed_cpus.clone();
    let mut mems = allowed_mems.clone();
    let chosen = t.cpu.numa_nodes.clone().or_else(|| {
        Some(Sourced {
            value: auto_nodes?.clone(),
            origin: t.cpu.numa_auto.clone()?,
        })
    });
    if let Some(nodes) = &chosen {
        match inv.numa.cpus_of(&nodes.value) {
            Err(n) => problems.push(Problem::at(
                &nodes.origin,
                format!(
                    "tenant `{}`: NUMA node {n} does not exist on this host (nodes: {})",
                    t.name,
                    inv.numa.node_set()
                ),
            )),
            Ok(node_cpus) => {
                if !nodes.value.is_subset(allowed_mems) {
                    problems.push(Problem::at(&nodes.origin, format!(
                        "tenant `{}`: NUMA nodes {} are outside the memory nodes the parent cgroup allows ({allowed_mems})",
                        t.name, nodes.value
                    )));
                }
                cpus = node_cpus.difference(&node_cpus.difference(allowed_cpus));
                mems = nodes.value.clone();
                // an empty cpuset refuses every process; with `cpus` set, the check below reports it
                if cpus.is_empty() && t.cpu.cpus.is_none() {
                    problems.push(Problem::at(&nodes.origin, format!(
                        "tenant `{}`: NUMA nodes {} have no cpu the parent cgroup allows ({allowed_cpus})",
                        t.name, nodes.value
                    )));
                }
            }
        }
    }
    if let Some(want) = &t.cpu.cpus {
        if !want.value.is_subset(allowed_cpus) {
            problems.push(Problem::at(&want.origin, format!(
                "tenant `{}`: cpus {} include {} outside the cpus the parent cgroup allows ({allowed_cpus})",
                t.name,
                want.value,
                want.value.difference(allowed_cpus)
            )));
        }
        let within = want.value.difference(&want.value.difference(&cpus));
        if within.is_empty() && chosen.is_some() {
            problems.push(Problem::at(
                &want.origin,
                format!(
                    "tenant `{}`: cpus {} has no cpu on the chosen NUMA nodes ({cpus})",
                    t.name, want.value
                ),
            ));
        }
        cpus = within;
    }
    (cpus, mems)
}

/// A memory-node change of a tenant whose groups hold processes (with `migrate` false), and the
/// cpus it has now; `None` when its nodes stay, or when nothing runs in it.
fn memory_move(
    t: &Tenant,
    members: &[&Placement],
    layout: &Layout,
    snap: &Snapshot,
    want: &CpuSet,
) -> Option<(MemoryMove, CpuSet)> {
    let (h, cpus, from) = snap.tenant_cpuset(layout, &t.name)?;
    // more nodes than now (a tenant that grows) moves no page: written at once; an unpinned
    // tenant's group goes, and its processes widen to the parent's set
    if from.is_subset(want) || !layout.grouped(t)[h] {
        return None;
    }
    let dir = layout.tenant_dir(h, &t.name);
    // A process with no resident memory is a zombie (an instance that just exited, not yet
    // reaped: /proc still shows its group) and holds nothing that could move.
    let pids: Vec<u32> = members
        .iter()
        .map(|p| p.pid)
        .filter(|pid| snap.proc_rss.get(pid).is_some_and(|r| *r > 0))
        .filter(|pid| {
            snap.proc_dirs
                .get(pid)
                .and_then(|d| d.get(h)?.as_ref())
                .is_some_and(|d| d.starts_with(&dir))
        })
        .collect();
    if pids.is_empty() {
        return None;
    }
    let read: Vec<&BTreeMap<u32, u64>> =
        pids.iter().filter_map(|p| snap.proc_nodes.get(p)).collect();
    let bytes = (!read.is_empty()).then(|| {
        read.iter()
            .flat_map(|nodes| nodes.iter())
            .filter(|(n, _)| !want.contains(**n))
            .map(|(_, b)| b)
            .sum()
    });
    Some((
        MemoryMove {
            tenant: t.name.clone(),
            from,
            to: want.clone(),
            pids,
            bytes,
            migrate: false,
        },
        cpus,
    ))
}

/// The nodes a tenant is on now, for sticky placement: those of its cpuset.mems that hold its
/// cpus (a tenant whose memory move waits for its restart already runs on its new nodes' cpus),
/// or its mems when none do. `None` without a group, or when it may use every node (it was not
/// placed: nothing to keep).
fn current_nodes(
    t: &Tenant,
    inv: &Inventory,
    layout: &Layout,
    snap: &Snapshot,
    allowed_mems: &CpuSet,
) -> Option<CpuSet> {
    let (_, cpus, mems) = snap.tenant_cpuset(layout, &t.name)?;
    let running: CpuSet = mems
        .iter()
        .filter(|n| {
            inv.numa
                .nodes
                .get(n)
                .is_some_and(|c| c.difference(&cpus).len() < c.len())
        })
        .collect();
    let current = if running.is_empty() { mems } else { running };
    (current.is_subset(allowed_mems) && current != *allowed_mems).then_some(current)
}

/// Places the `numa = "auto"` tenants on the nodes the parent cgroup allows (see `numa::place`);
/// a set that does not fit is a problem at the refused tenant's `numa` key.
fn place_numa(
    policy: &Policy,
    inv: &Inventory,
    layout: &Layout,
    snap: &Snapshot,
    allowed_cpus: &CpuSet,
    allowed_mems: &CpuSet,
    problems: &mut Vec<Problem>,
) -> Vec<numa::Choice> {
    if policy.tenants.iter().all(|t| t.cpu.numa_auto.is_none()) {
        return Vec::new();
    }
    let nodes: Vec<numa::Node> = inv
        .numa
        .nodes
        .iter()
        .filter(|(id, _)| allowed_mems.contains(**id))
        .map(|(id, cpus)| numa::Node {
            id: *id,
            cpus: cpus.difference(&cpus.difference(allowed_cpus)).len(),
            // the huge page pools are not memory other allocations can use
            memory: inv
                .numa
                .memory
                .get(id)
                .map(|m| m.saturating_sub(inv.numa.huge_pages.get(id).copied().unwrap_or(0))),
            huge_pages: inv.numa.huge_pages.get(id).copied().unwrap_or(0),
        })
        .collect();
    let needs: Vec<numa::Need> = policy
        .tenants
        .iter()
        .filter(|t| t.cpu.numa_auto.is_some() || t.cpu.numa_nodes.is_some())
        .map(|t| numa::Need {
            tenant: t.name.clone(),
            cores: t.cpu.cores.unwrap_or(0.0),
            memory: t.memory.max.as_ref().map_or(0, |m| m.value),
            huge_pages: t.memory.huge_pages.unwrap_or(0),
            pinned: t.cpu.numa_nodes.as_ref().map(|n| n.value.clone()),
            current: t
                .cpu
                .numa_auto
                .as_ref()
                .and_then(|_| current_nodes(t, inv, layout, snap, allowed_mems)),
        })
        .collect();
    match numa::place(&needs, &nodes) {
        Ok(choices) => choices,
        Err(refusal) => {
            let t = policy.tenants.iter().find(|t| t.name == refusal.tenant);
            match t.and_then(|t| t.cpu.numa_auto.as_ref()) {
                Some(o) => problems.push(Problem::at(o, refusal.message)),
                None => problems.push(Problem {
                    origin: None,
                    message: refusal.message,
                }),
            }
            Vec::new()
        }
    }
}

/// Builds the plan. Problems that only the host can reveal (cpus outside the parent's, a memory
/// limit below current use, an IO total too small to split) are policy errors: nothing applies.
pub fn build(
    policy: &Policy,
    inv: &Inventory,
    layout: &Layout,
    snap: &Snapshot,
) -> Result<Plan, PolicyErrors> {
    build_with(policy, inv, layout, snap, &Shares::new(), false)
}

/// `build`, with the per-device shares the daemon's balancer decided for tenants with
/// `io.split = "demand"` (tenant name → device → limits). Shares that do not fit the tenant's
/// current devices and totals are ignored (the equal split applies). With `migrate_memory`,
/// running tenants whose memory nodes change move their memory now (see `MemoryMove`).
pub fn build_with(
    policy: &Policy,
    inv: &Inventory,
    layout: &Layout,
    snap: &Snapshot,
    shares: &Shares,
    migrate_memory: bool,
) -> Result<Plan, PolicyErrors> {
    let mut problems = Vec::new();
    let mut plan = Plan::default();
    let allowed_cpus = snap
        .parent_cpus
        .clone()
        .unwrap_or_else(|| inv.numa.online_cpus.clone());
    let allowed_mems = snap
        .parent_mems
        .clone()
        .unwrap_or_else(|| inv.numa.node_set());
    plan.numa = place_numa(
        policy,
        inv,
        layout,
        snap,
        &allowed_cpus,
        &allowed_mems,
        &mut problems,
    );
    let all_pinned = policy
        .tenants
        .iter()
        .all(|t| t.cpu.numa_nodes.is_some() || t.cpu.numa_auto.is_some());
    if inv.numa.nodes.len() > 1
        && !policy.tenants.is_empty()
        && all_pinned
        && inv.numa.balancing == Some(true)
    {
        plan.warnings.push("every tenant is pinned to NUMA nodes while the kernel's automatic NUMA balancing is on (/proc/sys/kernel/numa_balancing): it keeps sampling and moving pages the pins already place; turn it off with `sysctl kernel.numa_balancing=0` (the kernel's guidance for pinned workloads)".into());
    }
    let placements = policy.matcher.classify(&inv.procs);
    let drivers = layout.setup.drivers();
    for d in &drivers {
        plan.warnings.extend(d.parent_warnings(layout, snap));
    }
    let memory_driver = layout.setup.driver_of(Controller::Memory).map(|(_, d)| d);
    for (ti, t) in policy.tenants.iter().enumerate() {
        let td = &inv.tenants[ti];
        let devnums: Vec<DevNum> = td.devices.iter().map(|d| d.devnum).collect();
        let io = io_per_device_with(
            t,
            &devnums,
            &td.overrides,
            shares.get(&t.name),
            &mut problems,
        );
        let auto_nodes = plan
            .numa
            .iter()
            .find(|c| c.tenant == t.name)
            .map(|c| &c.nodes);
        let (cpus, mems) = cpu_sets(
            t,
            inv,
            auto_nodes,
            &allowed_cpus,
            &allowed_mems,
            &mut problems,
        );
        let members: Vec<&Placement> = placements.iter().filter(|p| p.tenant == ti).collect();
        let (cpus, mems) = match memory_move(t, &members, layout, snap, &mems) {
            Some((mut m, now_cpus)) => {
                m.migrate = migrate_memory || t.cpu.migrate_memory;
                // the cpus change at once even so: the tenant's cores are promised on its new
                // nodes, and the ones it leaves may already be another tenant's (a live swap)
                let held = (!m.migrate).then(|| {
                    plan.warnings.push(m.deferred_text(&now_cpus, &cpus));
                    (cpus.clone(), m.from.clone())
                });
                plan.memory_moves.push(m);
                held.unwrap_or((cpus, mems))
            }
            None => (cpus, mems),
        };
        let migrate_pages = plan
            .memory_moves
            .iter()
            .any(|m| m.tenant == t.name && m.migrate);
        if let Some(max) = &t.memory.max {
            let used: u64 = members
                .iter()
                .filter_map(|p| snap.proc_rss.get(&p.pid))
                .sum();
            if used > max.value {
                problems.push(Problem::at(&max.origin, format!(
                    "tenant `{}`: memory.max {} is below the {} its {} processes already use (resident); raise it or stop them first",
                    t.name,
                    HumanBytes(max.value),
                    HumanBytes(used),
                    members.len()
                )));
            }
        }
        let settings = TenantSettings {
            io,
            cpu_cores: t.cpu.cores,
            cpu_weight: t.cpu.weight.unwrap_or(100),
            cpus,
            mems,
            memory_max: t.memory.max.as_ref().map(|m| m.value),
            memory_high: t.memory.high,
            memory_low: t.memory.low,
            memory_swap_max: t.memory.swap_max,
            migrate_memory: migrate_pages,
            io_weight: t.io_weight.as_ref().map(|w| w.value),
            io_latency_us: t
                .io_latency_target
                .as_ref()
                .map(|l| {
                    let us = l.value.as_micros() as u64;
                    devnums.iter().map(|d| (*d, us)).collect()
                })
                .unwrap_or_default(),
        };
        if let Some((_, d)) = layout.setup.driver_of(Controller::Io) {
            plan.warnings
                .extend(d.io_protection_warnings(t, &devnums, layout, snap));
        } else if t.io_weight.is_some() || t.io_latency_target.is_some() {
            plan.warnings.push(format!(
                "tenant `{}`: io.weight and io.latency_target have no effect: this host has no io controller dbcage can use; they need the io controller of cgroup v2",
                t.name
            ));
        }
        if let Some(d) = memory_driver {
            plan.warnings.extend(d.memory_warnings(t, layout, snap));
        }
        host_warnings(&mut plan.warnings, t, inv);
        plan.tenants.push(TenantSummary {
            name: t.name.clone(),
            settings,
            processes: members.len(),
            units: Vec::new(),
            unit_properties: Vec::new(),
            shared_units: Vec::new(),
            delegated_units: Vec::new(),
            needs_delegate: Vec::new(),
            scope_wants_leaves: false,
        });
    }
    if !problems.is_empty() {
        return Err(PolicyErrors(problems));
    }
    // Each driver writes the specs of the controllers in its hierarchies (a hybrid host mixes
    // them).
    let input = SpecInput {
        layout,
        snap,
        allowed_cpus: &allowed_cpus,
        allowed_mems: &allowed_mems,
        tenants: plan
            .tenants
            .iter()
            .map(|t| (t.name.as_str(), &t.settings))
            .collect(),
    };
    // Only in the hierarchies where the tenant has groups (`Layout::grouped`).
    let grouped: std::collections::HashMap<&str, Vec<bool>> = policy
        .tenants
        .iter()
        .map(|t| (t.name.as_str(), layout.grouped(t)))
        .collect();
    let specs: Vec<FileSpec> = drivers
        .iter()
        .flat_map(|d| {
            d.specs(&input).into_iter().filter(|s| {
                let Some((h, x)) = layout.setup.driver_of(s.controller) else {
                    return false;
                };
                let tenant = match &s.group {
                    GroupRef::Tenant(t) | GroupRef::Leaf(t, _) => Some(t.as_str()),
                    GroupRef::Parent | GroupRef::Root => None,
                };
                x.name() == d.name() && tenant.is_none_or(|t| grouped.get(t).is_none_or(|g| g[h]))
            })
        })
        .collect();
    let writers: Vec<&str> = policy
        .tenants
        .iter()
        .filter(|t| t.sets_write_limits())
        .map(|t| t.name.as_str())
        .collect();
    if layout.setup.write_limits_pass_buffered_writes() {
        plan.buffered_writes_pass = writers.iter().map(|w| w.to_string()).collect();
    }
    for c in &layout.setup.missing {
        plan.warnings.push(format!(
            "the {} controller is not available on this host; its limits are not applied",
            c.v1_name()
        ));
    }
    for stale in snap.tenant_groups(layout) {
        if !policy.tenants.iter().any(|t| t.name == stale) {
            plan.warnings.push(format!(
                "cgroup of tenant `{stale}` exists under `{}` but the policy no longer names it; `dbcage release {stale}` moves its processes out and removes it",
                layout.root_name
            ));
        }
    }

    plan.steps.extend(mkdirs(policy, layout, snap));
    plan.steps.extend(writes(&specs, layout, snap));
    plan.steps
        .extend(moves(policy, &inv.procs, layout, snap, &placements));
    plan.steps.extend(removals(policy, layout, snap));
    Ok(plan)
}

/// Limits the host can never reach: they never bind, which a user should hear before relying
/// on them.
fn host_warnings(warnings: &mut Vec<String>, t: &Tenant, inv: &Inventory) {
    let online = inv.numa.online_cpus.len();
    if let Some(cores) = t.cpu.cores {
        if t.cpu.cpus.is_none() && online > 0 && cores > online as f64 {
            warnings.push(format!(
                "tenant `{}`: cpu.cores = {cores} is more than this host's {online} online cpus: the quota never binds",
                t.name
            ));
        }
    }
    if let (Some(max), Some(total)) = (&t.memory.max, inv.mem_total) {
        if max.value > total {
            warnings.push(format!(
                "{}: tenant `{}`: memory.max {} is more than this host's memory ({}): it never binds; the host runs out first",
                max.origin,
                t.name,
                HumanBytes(max.value),
                HumanBytes(total)
            ));
        }
    }
}

/// Groups to create, parents before children: dbcage's root in every hierarchy, a tenant's
/// groups in the hierarchies its settings use (`Layout::grouped`).
fn mkdirs(policy: &Policy, layout: &Layout, snap: &Snapshot) -> Vec<Step> {
    let mut out = Vec::new();
    let grouped: Vec<Vec<bool>> = policy.tenants.iter().map(|t| layout.grouped(t)).collect();
    for h in 0..layout.setup.hierarchies.len() {
        let mut groups = vec![(
            GroupRef::Root,
            format!("dbcage root `{}`", layout.root_name),
        )];
        for (t, _) in policy.tenants.iter().zip(&grouped).filter(|(_, g)| g[h]) {
            groups.push((
                GroupRef::Tenant(t.name.clone()),
                format!("tenant `{}`", t.name),
            ));
            for leaf in [Leaf::Limited, Leaf::Exempt] {
                groups.push((
                    GroupRef::Leaf(t.name.clone(), leaf),
                    format!("tenant `{}` {} leaf", t.name, leaf.dir()),
                ));
            }
        }
        for (g, reason) in groups {
            let path = layout.dir(h, &g);
            if !snap.dirs.contains(&path) {
                out.push(Step::Mkdir { path, reason });
            }
        }
    }
    out
}

fn reason_of(spec: &FileSpec) -> String {
    match &spec.group {
        GroupRef::Parent => "dbcage's parent cgroup".to_string(),
        GroupRef::Root => "dbcage root".to_string(),
        GroupRef::Tenant(t) => format!("tenant `{t}`"),
        GroupRef::Leaf(t, l) => format!("tenant `{t}` {} leaf", l.dir()),
    }
}

/// The writes that turn the current files into the desired ones, ordered as the module
/// comment describes.
fn writes(specs: &[FileSpec], layout: &Layout, snap: &Snapshot) -> Vec<Step> {
    let page = crate::cgroup::page_size();
    // (phase, order within phase, step): phases run in order.
    let mut staged: Vec<(u8, i64, Step)> = Vec::new();
    for spec in specs {
        let Some((h, driver)) = layout.setup.driver_of(spec.controller) else {
            continue;
        };
        let dir = layout.dir(h, &spec.group);
        let path = dir.join(spec.file);
        let current = snap.file(&path).map(|s| s.trim().to_string());
        // A group this plan creates starts with the kernel's defaults: only what differs is
        // written (the step still says the file is absent now).
        let initial = match &current {
            Some(c) => Some(c.as_str()),
            None if !snap.dirs.contains(&dir) => driver.new_group_value(spec.file),
            None => None,
        };
        let reason = reason_of(spec);
        for s in driver.stage(spec, initial, page) {
            staged.push((
                s.phase,
                s.order,
                Step::Write {
                    path: path.clone(),
                    value: s.value,
                    current: current.clone(),
                    reason: reason.clone(),
                },
            ));
        }
    }
    staged.sort_by_key(|(phase, order, _)| (*phase, *order));
    staged.into_iter().map(|(_, _, s)| s).collect()
}

/// The groups of tenants in hierarchies their settings no longer use (a tenant unpinned, its
/// memory limit dropped): each emptied into dbcage's parent there and removed, after the moves.
fn removals(policy: &Policy, layout: &Layout, snap: &Snapshot) -> Vec<Step> {
    let mut out = Vec::new();
    for t in &policy.tenants {
        for (h, grouped) in layout.grouped(t).into_iter().enumerate() {
            let path = layout.tenant_dir(h, &t.name);
            if grouped || !snap.dirs.contains(&path) {
                continue;
            }
            let controllers: Vec<&str> = layout.setup.hierarchies[h]
                .controllers
                .iter()
                .map(|c| c.v1_name())
                .collect();
            out.push(Step::Remove {
                to: layout.parents[h].clone(),
                reason: format!(
                    "tenant `{}` sets nothing the {} hierarchy controls",
                    t.name,
                    controllers.join(",")
                ),
                path,
            });
        }
    }
    out
}

/// Moves for placed processes that are not yet in their leaf in every hierarchy their tenant
/// has groups in, and out of dbcage's groups in the others. Shared by `build` (all processes)
/// and the daemon (the one process an event names; `None` where it is not known to be in a
/// group of dbcage's).
pub fn moves(
    policy: &Policy,
    procs: &[crate::inventory::ProcInfo],
    layout: &Layout,
    snap: &Snapshot,
    placements: &[Placement],
) -> Vec<Step> {
    // The daemon's event path passes one process (or a few ancestors): a map only for a scan.
    let comms: std::collections::HashMap<u32, &str> = if procs.len() > 16 {
        procs.iter().map(|p| (p.pid, p.comm.as_str())).collect()
    } else {
        Default::default()
    };
    let comm_of = |pid: u32| match comms.get(&pid) {
        Some(c) => Some(*c),
        None => procs
            .iter()
            .take(16)
            .find(|p| p.pid == pid)
            .map(|p| p.comm.as_str()),
    };
    let mut out = Vec::new();
    for p in placements {
        let Some(now) = snap.proc_dirs.get(&p.pid) else {
            continue;
        }; // gone since the scan
        let t = &policy.tenants[p.tenant];
        let mut targets = Vec::new();
        let mut leave = Vec::new();
        for (h, grouped) in layout.grouped(t).into_iter().enumerate() {
            let here = now.get(h).and_then(|d| d.as_ref());
            if grouped {
                let mut want = layout.leaf_dir(h, &t.name, p.leaf);
                if here != Some(&want) {
                    want.push(crate::cgroup::PROCS);
                    targets.push(want);
                }
            } else if here.is_some_and(|d| d.starts_with(layout.root_dir(h))) {
                leave.push(crate::cgroup::procs_file(&layout.parents[h]));
            }
        }
        if targets.is_empty() && leave.is_empty() {
            continue;
        }
        out.push(Step::Move {
            pid: p.pid,
            comm: comm_of(p.pid).unwrap_or_default().to_string(),
            tenant: t.name.clone(),
            leaf: p.leaf,
            targets,
            leave,
            reason: p.reason.clone(),
        });
    }
    out
}

pub mod delegated;
pub mod numa;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_systemd;
#[cfg(test)]
mod tests_v2;

/// The steps that adopt a tenant's processes (each with its leaf) into its scope: into their
/// leaves when the running scope holds them (`in_leaves`), else into the scope itself, which
/// is started with every property (the IO limits too, until its leaves hold them).
pub fn adoptions(
    tenant: &str,
    pids: &[(u32, Leaf)],
    in_leaves: bool,
    properties: &[crate::systemd::Property],
    reason: &str,
) -> Vec<Step> {
    let groups: Vec<(Option<Leaf>, Vec<u32>)> = if in_leaves {
        [Leaf::Limited, Leaf::Exempt]
            .into_iter()
            .map(|l| {
                (
                    Some(l),
                    pids.iter().filter(|x| x.1 == l).map(|x| x.0).collect(),
                )
            })
            .collect()
    } else {
        vec![(None, pids.iter().map(|x| x.0).collect())]
    };
    groups
        .into_iter()
        .filter(|(_, of)| !of.is_empty())
        .map(|(leaf, pids)| Step::Adopt {
            tenant: tenant.to_string(),
            pids,
            leaf,
            properties: properties.to_vec(),
            reason: reason.to_string(),
        })
        .collect()
}

/// What the systemd driver plans from, read by the engine (D-Bus and /proc): where each
/// process is, the processes of each unit involved, what each unit holds now, and how systemd
/// names each device.
#[derive(Debug, Clone, Default)]
pub struct SystemdView {
    pub unit_of: std::collections::HashMap<u32, String>,
    /// Each unit's own cgroup (from /proc/PID/cgroup of a process in it).
    pub unit_group: std::collections::HashMap<String, String>,
    pub unit_pids: std::collections::HashMap<String, Vec<u32>>,
    pub resources: std::collections::HashMap<String, crate::systemd::UnitResources>,
    pub device_nodes: BTreeMap<DevNum, String>,
    /// The pids of the process scan the plan classified; a unit's process missing here started
    /// after the scan and is not held against the unit being the tenant's.
    pub scanned: std::collections::HashSet<u32>,
    /// cgroup v2 (cpuset and the v2-only memory knobs are expressible).
    pub unified: bool,
    /// The units with `Delegate=yes`: what their cgroup holds in the io hierarchy.
    pub delegated: std::collections::HashMap<String, crate::cgroup::delegated::DelegatedTree>,
    /// The names of the processes in delegated units' trees, for their moves.
    pub comm: std::collections::HashMap<u32, String>,
    /// The page size (the drivers' staging of memory values takes it).
    pub page: u64,
}

impl SystemdView {
    /// Whether every process of `unit` is one of `mine` (the tenant's), not counting those
    /// that started after the scan (a postmaster's new backend or autovacuum worker): such a
    /// unit is the tenant's own (`tenants_own`).
    pub fn holds_only(&self, unit: &str, mine: impl Fn(u32) -> bool) -> bool {
        self.unit_pids
            .get(unit)
            .is_some_and(|all| all.iter().all(|&p| mine(p) || !self.scanned.contains(&p)))
    }

    /// Whether `unit` is the tenant's own, governed in place and given back by `release`:
    /// every process in it is the tenant's (`holds_only`), or it is a service whose main
    /// process is the tenant's and that runs no other tenant's (`member`: a process of any
    /// tenant). The helpers a database's unit runs next to the server (Debian's
    /// `/etc/mysql/debian-start` after mariadb.service starts, pg_ctlcluster while a cluster
    /// starts) are part of its service, not a sign that it is shared.
    pub fn tenants_own(
        &self,
        unit: &str,
        mine: impl Fn(u32) -> bool,
        member: impl Fn(u32) -> bool,
    ) -> bool {
        if self.holds_only(unit, &mine) {
            return true;
        }
        let main_is_mine = self
            .resources
            .get(unit)
            .and_then(|r| r.main_pid)
            .is_some_and(&mine);
        main_is_mine && self.holds_only(unit, |p| mine(p) || !member(p))
    }
}

/// Under systemd, what a plan found for one tenant beyond its steps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Governed {
    /// The cgroups of the units that govern its processes: its own units (the one holding
    /// most of them first) and, once it has processes there or to adopt, its scope.
    pub units: Vec<String>,
    /// The unit properties of its settings (what its scope is started with).
    pub properties: Vec<Property>,
    /// The cgroups of units that hold its processes with others' (not governed, see the
    /// warnings): the daemon's event path leaves them to the next full plan.
    pub shared: Vec<String>,
    /// Its units whose delegated tree holds its leaves: the unit's cgroup and its directory in
    /// the io hierarchy (a process in that directory itself is not in a leaf yet).
    pub delegated: Vec<(String, PathBuf)>,
    /// Its units that need `Delegate=yes` for its exempt processes (`TenantSummary`).
    pub needs_delegate: Vec<String>,
    /// Its settings (what the event path writes on a delegated unit's leaf after a restart).
    pub settings: crate::cgroup::model::TenantSettings,
    /// Its scope is to hold its leaves (IO limits and exempt rules, cgroup v2): an adoption
    /// that starts the scope, whose processes join the scope's own group, is followed by a
    /// plan that makes them.
    pub scope_wants_leaves: bool,
}

/// The steps of the systemd driver for a plan's tenants (pure): the tenants' settings as unit
/// properties (`cgroup::systemd::unit_properties`) on every unit that holds only the tenant's
/// processes, set where they differ from what the unit holds (a first apply and a drift repair
/// alike); the tenant's other processes adopted into `dbcage-TENANT.scope`. Never a cgroup
/// write and never a move out of a unit by dbcage itself.
///
/// Also returns, per tenant, the cgroups of the units that govern it and the properties its
/// scope gets (`Governed`).
pub fn systemd_steps(
    plan: &Plan,
    placements: &[Placement],
    tenants: &[Tenant],
    view: &SystemdView,
) -> (Vec<Step>, Vec<String>, BTreeMap<String, Governed>) {
    let mut steps = Vec::new();
    let mut warnings = Vec::new();
    let mut governed = BTreeMap::new();
    // Each tenant's processes, and which of them are exempt: one pass over the placements, not
    // one per tenant.
    let mut by_tenant: Vec<(Vec<u32>, std::collections::HashSet<u32>)> =
        vec![Default::default(); tenants.len()];
    for p in placements {
        let Some((pids, exempt)) = by_tenant.get_mut(p.tenant) else {
            continue;
        };
        pids.push(p.pid);
        if p.leaf == Leaf::Exempt {
            exempt.insert(p.pid);
        }
    }
    // Every tenant's processes: a unit that runs another tenant's is never one's own.
    let members: std::collections::HashSet<u32> = placements.iter().map(|p| p.pid).collect();
    let index: std::collections::HashMap<&str, usize> = tenants
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    for summary in &plan.tenants {
        let Some(&ti) = index.get(summary.name.as_str()) else {
            continue;
        };
        let (pids, exempt) = &by_tenant[ti];
        let t = &tenants[ti];
        let mut settings = summary.settings.clone();
        if t.cpu.cpus.is_none() && t.cpu.numa_nodes.is_none() {
            // Not pinned: the settings hold every allowed cpu and node, which for a unit is no
            // restriction at all: left unset, so that systemd need not enable cpuset for it
            // (v2), and not reported as a cpuset systemd cannot set (v1).
            settings.cpus = CpuSet::default();
            settings.mems = CpuSet::default();
        }
        let props = crate::cgroup::systemd::unit_properties(&settings, view.unified, |d| {
            view.device_nodes
                .get(&d)
                .cloned()
                .unwrap_or_else(|| format!("/dev/block/{d}"))
        });
        let mut not_applied = crate::cgroup::systemd::unexpressible(&settings, view.unified);
        let scope = crate::systemd::scope_name(&summary.name);
        let mine: std::collections::HashSet<u32> = pids.iter().copied().collect();
        let placement = crate::systemd::plan::place(
            &scope,
            pids,
            |pid| view.unit_of.get(&pid).cloned(),
            |unit| view.tenants_own(unit, |p| mine.contains(&p), |p| members.contains(&p)),
            |unit| t.names_unit(unit),
        );
        // Exempt processes: the unit's properties bind every process in it, the IO limits too
        // (the cgroupfs drivers give them a leaf without). Said only when there are IO limits.
        let io_limited = props.iter().any(|p| {
            matches!(p,
                Property::IoReadBandwidthMax(l)
                | Property::IoWriteBandwidthMax(l)
                | Property::IoReadIopsMax(l)
                | Property::IoWriteIopsMax(l) if !l.is_empty())
        });
        // A unit that delegates its subtree gets the tenant's leaves instead, with the IO
        // limits on `limited` (`plan::delegated`): wanted when the tenant has exempt rules (its
        // exempt processes may start any time) or the leaves are there already (kept, so that
        // a plan does not flip between the two).
        let mut unit_props: BTreeMap<&String, Vec<Property>> = BTreeMap::new();
        let mut leaf_steps = Vec::new();
        let mut delegated_units = Vec::new();
        let mut needs_delegate = Vec::new();
        // The tenant's own units, and its running scope (started with Delegate=yes): both
        // hold its leaves the same way.
        let in_scope = (!placement.in_scope.is_empty()).then_some((&scope, &placement.in_scope));
        let mut scope_leaves = false;
        for (unit, upids) in placement.units.iter().chain(in_scope) {
            let has_exempt = upids.iter().any(|p| exempt.contains(p));
            let delegates = view.resources.get(unit).is_some_and(|r| r.delegate);
            let tree = view.delegated.get(unit).filter(|_| delegates);
            let wanted = io_limited
                && (has_exempt
                    || !t.exempt.is_empty()
                    || tree.is_some_and(|t| !t.leaves.is_empty()));
            if !wanted {
                continue;
            }
            let usable = match tree {
                Some(tree) if view.unified && tree.io_available && tree.foreign.is_empty() => tree,
                _ => {
                    if has_exempt {
                        not_applied.push(crate::cgroup::systemd::exempt_not_applied(
                            unit,
                            crate::cgroup::systemd::Delegation::of(view.unified, delegates, tree),
                        ));
                    }
                    if view.unified && !delegates {
                        needs_delegate.push(unit.clone());
                    }
                    continue;
                }
            };
            leaf_steps.extend(delegated::steps(
                &summary.name,
                unit,
                usable,
                &settings,
                |pid| match (exempt.contains(&pid), mine.contains(&pid)) {
                    (true, _) => Some(Leaf::Exempt),
                    (false, true) => Some(Leaf::Limited),
                    (false, false) => None,
                },
                |pid| view.comm.get(&pid).cloned().unwrap_or_default(),
                view.page,
            ));
            unit_props.insert(unit, delegated::without_io_limits(&props));
            if let Some(group) = view.unit_group.get(unit) {
                delegated_units.push((group.clone(), usable.dir.clone()));
            }
            scope_leaves |= *unit == scope;
        }
        // Exempt processes adopted into a scope that does not run yet join its own group with
        // the scope's IO limits; the plan after the adoption makes the leaves (the daemon plans
        // again at once, `apply` before it returns). On cgroup v1 there are no leaves.
        if io_limited && !view.unified && placement.adopt.iter().any(|p| exempt.contains(p)) {
            let why = crate::cgroup::systemd::exempt_not_applied(
                &scope,
                crate::cgroup::systemd::Delegation::CgroupV1,
            );
            if !not_applied.contains(&why) {
                not_applied.push(why);
            }
        }
        for why in not_applied {
            warnings.push(format!(
                "tenant {}: {}: {why}",
                summary.name,
                crate::cgroup::systemd::NOT_APPLIED
            ));
        }
        // The units systemd started first (the one with most of its processes first), then
        // its scope.
        let mut own: Vec<(usize, String)> = placement
            .units
            .iter()
            .filter_map(|(u, pids)| Some((pids.len(), view.unit_group.get(u)?.clone())))
            .collect();
        own.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let mut groups: Vec<String> = own.into_iter().map(|(_, g)| g).collect();
        if !placement.in_scope.is_empty() || !placement.adopt.is_empty() {
            groups.push(crate::systemd::scope_cgroup(&summary.name));
        }
        governed.insert(
            summary.name.clone(),
            Governed {
                units: groups,
                properties: props.clone(),
                shared: placement
                    .shared
                    .keys()
                    .filter_map(|u| view.unit_group.get(u).cloned())
                    .collect(),
                delegated: delegated_units,
                needs_delegate,
                settings: settings.clone(),
                scope_wants_leaves: io_limited && view.unified && !t.exempt.is_empty(),
            },
        );
        // The leaves hold the IO limits before the unit's IO properties are cleared.
        steps.extend(leaf_steps);
        let mut units: Vec<&String> = placement.units.keys().collect();
        if !placement.in_scope.is_empty() {
            units.push(&scope);
        }
        for unit in units {
            let Some(now) = view.resources.get(unit) else {
                continue;
            };
            let drift = now.drift(unit_props.get(unit).unwrap_or(&props));
            if drift.is_empty() {
                continue;
            }
            let (set, was): (Vec<_>, Vec<_>) = drift.into_iter().unzip();
            steps.push(Step::SetUnitProperties {
                unit: unit.clone(),
                tenant: summary.name.clone(),
                set,
                was,
                reason: format!("tenant {}'s limits, in place on its unit", summary.name),
            });
        }
        for (unit, pids) in &placement.shared {
            warnings.push(format!(
                "tenant {}: pids {pids:?} run in {unit}, which also runs processes of no tenant: \
                 not governed (dbcage neither limits a shared unit nor moves a process out of a \
                 service); run the database in a unit of its own",
                summary.name
            ));
        }
        let reason = format!(
            "tenant {}'s processes outside a unit of their own (shared units or none)",
            summary.name
        );
        let to_adopt: Vec<(u32, Leaf)> = placement
            .adopt
            .iter()
            .map(|&p| {
                (
                    p,
                    if exempt.contains(&p) {
                        Leaf::Exempt
                    } else {
                        Leaf::Limited
                    },
                )
            })
            .collect();
        steps.extend(adoptions(
            &summary.name,
            &to_adopt,
            scope_leaves,
            &props,
            &reason,
        ));
    }
    (steps, warnings, governed)
}
