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
//! Those are the cgroupfs tree driver's steps (`cgroupfs.rs`); under systemd the same settings
//! become unit properties (`systemd.rs`), see `TreeDriver`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use crate::cgroup::model::TenantSettings;
use crate::cgroup::{Controller, Layout, Snapshot};
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
    /// Per tenant (policy order), what the cgroupfs driver found for its groups; empty under
    /// systemd. The daemon keeps the settled ones for its next plan (`watch::Settled`).
    #[serde(skip)]
    pub groups: Vec<GroupsOutcome>,
}

/// What a plan found for a tenant's own groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupsOutcome {
    /// Something to make, write or remove.
    Steps,
    /// Nothing to do, worked out.
    Settled,
    /// Nothing to do, known from the last plan without working it out: its groups hold what
    /// was read then and its settings are the same (`watch::Settled`).
    StillSettled,
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

    /// The processes this plan moves (into groups, or into a scope), in order.
    pub fn moved_pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = (self.steps.iter())
            .flat_map(|s| match s {
                Step::Move { pid, .. } => std::slice::from_ref(pid),
                Step::Adopt { pids, .. } => pids.as_slice(),
                _ => &[],
            })
            .copied()
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
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

/// Who writes the tree the plan's settings go into, and how: the step half of a plan. The
/// plan computes each tenant's settings once (`TenantSettings`: the instance-total IO split
/// per device, cpus and memory nodes, quotas and limits), the same for every driver; the tree
/// driver turns them into steps from what the host holds.
///
/// - `Cgroupfs` (`agent.manager = "cgroupfs"`): dbcage's own groups under its parent in every
///   hierarchy, each file written through its hierarchy's file driver (`cgroup::Driver`: v1
///   or v2, mixed on a hybrid host), and the processes moved into their leaves.
/// - `Systemd` (`agent.manager = "systemd"`): systemd owns the tree. The settings become the
///   properties of the units that run a tenant (set over D-Bus), a unit that delegates its
///   subtree gets the tenant's `limited` and `exempt` leaves (their IO files again through
///   the file driver), and processes outside a unit of their own are adopted into the
///   tenant's scope. No process leaves its unit.
///
/// Both are pure: what they plan from arrives in `StepInput` and, for systemd, in the
/// `SystemdView` the engine read over D-Bus.
pub trait TreeDriver {
    /// `cgroupfs`, `systemd`: as `agent.manager` names it.
    fn name(&self) -> &'static str;
    /// Adds to `plan` the steps that take the host to its tenants' settings, and what the
    /// driver finds on the way (warnings; under systemd each tenant's units).
    fn steps(&self, input: &StepInput, plan: &mut Plan);
}

/// What a tree driver plans from besides the settings in the plan.
pub struct StepInput<'a> {
    pub policy: &'a Policy,
    pub inv: &'a Inventory,
    pub layout: &'a Layout,
    pub snap: &'a Snapshot,
    /// Every classified process and its tenant and leaf.
    pub placements: &'a [Placement],
    /// The cpus and memory nodes dbcage's parent allows.
    pub allowed_cpus: &'a CpuSet,
    pub allowed_mems: &'a CpuSet,
    /// See `Planning::settled`.
    pub settled: Option<&'a crate::cgroup::watch::Settled>,
}

/// Builds the plan. Problems that only the host can reveal (cpus outside the parent's, a memory
/// limit below current use, an IO total too small to split) are policy errors: nothing applies.
pub fn build(
    policy: &Policy,
    inv: &Inventory,
    layout: &Layout,
    snap: &Snapshot,
) -> Result<Plan, PolicyErrors> {
    let placements = policy.matcher.classify(&inv.procs);
    let how = Planning {
        shares: &Shares::new(),
        migrate_memory: false,
        driver: &Cgroupfs,
        settled: None,
    };
    build_with(policy, inv, layout, snap, &placements, &how)
}

/// How `build_with` plans, beyond what the host holds.
pub struct Planning<'a> {
    /// The per-device shares the daemon's balancer decided for tenants with `io.split =
    /// "demand"` (tenant name → device → limits). Shares that do not fit the tenant's current
    /// devices and totals are ignored (the equal split applies).
    pub shares: &'a Shares,
    /// Running tenants whose memory nodes change move their memory now (see `MemoryMove`).
    pub migrate_memory: bool,
    /// Turns the tenants' settings into steps: `Cgroupfs` (dbcage's own groups) or `Systemd`
    /// (the units that run the tenants).
    pub driver: &'a dyn TreeDriver,
    /// The daemon's: the tenants its last plan had nothing to do for in their groups, with
    /// what it planned them from (see `watch::Settled`).
    pub settled: Option<&'a crate::cgroup::watch::Settled>,
}

/// `build`, given the placements of `inv`'s processes (the caller's classification, made once:
/// the daemon's matches only what a rescan read again) and `how`.
pub fn build_with(
    policy: &Policy,
    inv: &Inventory,
    layout: &Layout,
    snap: &Snapshot,
    placements: &[Placement],
    how: &Planning,
) -> Result<Plan, PolicyErrors> {
    let (shares, migrate_memory, driver) = (how.shares, how.migrate_memory, how.driver);
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
    let drivers = layout.setup.drivers();
    for d in &drivers {
        plan.warnings.extend(d.parent_warnings(layout, snap));
    }
    let memory_driver = layout.setup.driver_of(Controller::Memory).map(|(_, d)| d);
    // Each tenant's placements (one pass, not one per tenant: 1,000 tenants x 3,000 placed).
    let mut members_of: Vec<Vec<&Placement>> = vec![Vec::new(); policy.tenants.len()];
    for p in placements {
        if let Some(members) = members_of.get_mut(p.tenant) {
            members.push(p);
        }
    }
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
        let members = std::mem::take(&mut members_of[ti]);
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
    let named: std::collections::HashSet<&str> =
        policy.tenants.iter().map(|t| t.name.as_str()).collect();
    for stale in snap.unnamed_tenant_groups(layout, &|name| named.contains(name)) {
        plan.warnings.push(format!(
            "cgroup of tenant `{stale}` exists under `{}` but the policy no longer names it; `dbcage release {stale}` moves its processes out and removes it",
            layout.root_name
        ));
    }

    driver.steps(
        &StepInput {
            policy,
            inv,
            layout,
            snap,
            placements,
            allowed_cpus: &allowed_cpus,
            allowed_mems: &allowed_mems,
            settled: how.settled,
        },
        &mut plan,
    );
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

mod cgroupfs;
pub mod delegated;
pub mod numa;
mod systemd;

pub use cgroupfs::{moves, Cgroupfs};
pub use systemd::{adoptions, systemd_steps, Governed, Systemd, SystemdView};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_systemd;
#[cfg(test)]
mod tests_v2;
