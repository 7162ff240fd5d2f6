//! The one path from policy to kernel: load the policy in force, read the host (inventory and a
//! snapshot of what the kernel holds), plan, apply, and report the outcome. The CLI, the daemon,
//! `set --direct` and `verify` all go through here; nothing in here knows who called it.
//!
//! The plan's inputs are values: the policy (`Prepared::loaded`), the inventory, the snapshot,
//! and the `Adjustments` the daemon holds on top of the policy (the demand split's per-device
//! shares and the replication guard's raises). Outside the daemon there are none.

pub mod apply;
pub mod live;

use std::borrow::Cow;
use std::collections::BTreeMap;

use anyhow::{Context, Result};

use crate::cgroup::{GroupWatch, Layout, Setup, Snapshot};
use crate::classify::{Classifier, Placement};
use crate::hostfs::HostFs;
use crate::inventory::{self, Inventory};
use crate::plan::{self, Plan, Shares};
use crate::policy::{IoLimits, Loaded, Policy, PolicyErrors, PolicyPath};
use std::sync::{Arc, Mutex};

pub use apply::{execute, Outcome};

/// The policy loaded and the host read: everything a plan is made from, except adjustments.
pub struct Prepared {
    pub loaded: Loaded,
    pub inventory: Inventory,
    pub layout: Layout,
    /// `agent.manager` resolved against the host.
    pub manager: crate::systemd::Manager,
    pub fs: HostFs,
    /// The daemon's watched copy of its groups (`cgroup::watch`): plans reread only the groups
    /// written since the last one. `None` (one-shot commands): every plan reads them all.
    pub groups: Option<Arc<Mutex<GroupWatch>>>,
    /// The daemon's memo of what its processes matched (`classify::Memo`): a rescan matches
    /// only the processes it read again. `None` (one-shot commands): every process is matched.
    pub classified: Option<Arc<Mutex<crate::classify::Memo>>>,
}

/// What the daemon lays over the policy when it plans, each decided by one of its loops.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Adjustments {
    /// `io.split = "demand"`: per tenant, the per-device limits the balancer decided (used in
    /// place of the equal split when they fit the tenant's devices and totals).
    pub shares: Shares,
    /// The replication guard's raises: per tenant, the IO totals in force while it holds them.
    pub raises: BTreeMap<String, IoLimits>,
    /// `apply --migrate-memory`: running tenants whose memory nodes change move their memory
    /// now instead of at their restart (see `plan::MemoryMove`).
    pub migrate_memory: bool,
    /// Leave out how much memory a running tenant's node change would move: numa_maps walks
    /// the page tables of a tenant's processes, which the daemon would pay at every rescan of
    /// a deferred change it does not show (`plan`, `check` and `apply` do read it).
    pub skip_move_sizes: bool,
    /// The protection guard's lowered donors: per tenant, the io.weight in force while it
    /// holds them.
    pub weights: BTreeMap<String, u32>,
    /// The protection guard's capped donors (`protect_lever = "caps"`): per tenant, the IO
    /// totals in force while it holds them (each no higher than the tenant's own or raised).
    pub caps: BTreeMap<String, IoLimits>,
    /// The protection guard's lowered donors on cpu pressure (`[tenant.cpu] protect_*`): per
    /// tenant, the cpu.weight in force while it holds them.
    pub cpu_weights: BTreeMap<String, u32>,
}

impl Adjustments {
    /// The policy as planned: the tenants' IO totals with the raises in force.
    pub fn policy<'a>(&self, policy: &'a Policy) -> Cow<'a, Policy> {
        if self.raises.is_empty()
            && self.weights.is_empty()
            && self.caps.is_empty()
            && self.cpu_weights.is_empty()
        {
            return Cow::Borrowed(policy);
        }
        let mut p = policy.clone();
        for t in &mut p.tenants {
            if let Some(r) = self.raises.get(&t.name) {
                t.io = *r;
            }
            if let Some(c) = self.caps.get(&t.name) {
                t.io = t.io.min_each(c);
            }
            if let Some(&w) = self.weights.get(&t.name) {
                let origin = t
                    .io_weight
                    .as_ref()
                    .map(|s| s.origin.clone())
                    .unwrap_or_else(|| t.origin.clone());
                t.io_weight = Some(crate::policy::Sourced { value: w, origin });
            }
            if let Some(&w) = self.cpu_weights.get(&t.name) {
                t.cpu.weight = Some(w);
            }
        }
        Cow::Owned(p)
    }
}

/// How much of /proc a host read needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// Every field a command may show (the kernel's `comm` of every process a rule matches).
    Full,
    /// The daemon's rescan: process names (`comm`) are read only where a rule looks at them
    /// (its move lines take them from argv[0] otherwise, see `procs::Fields::comm`), which
    /// leaves a third less of /proc to read in every rescan.
    Rules,
}

/// The policy files with the schedule windows open now laid over them (what the daemon starts
/// from; its runtime `set` values are the daemon's alone).
pub fn load_policy(config: &PolicyPath) -> Result<Loaded> {
    Ok(live::Live::load(config)?.1)
}

/// Loads the policy, reads the host and finds the cgroup layout. Device problems are policy
/// errors (exit 2): a policy that names a missing disk applies nothing.
pub fn prepare(config: &PolicyPath) -> Result<Prepared> {
    read_host(load_policy(config)?, Scan::Full)
}

/// For a policy already loaded: reads the host (devices, processes, cgroups).
pub fn read_host(loaded: Loaded, scan: Scan) -> Result<Prepared> {
    read_host_scanning(loaded, scan).map_err(|failed| failed.error)
}

/// `read_host`, giving the process scan back with the error when one was made (see `Failed`).
pub fn read_host_scanning(loaded: Loaded, scan: Scan) -> Result<Prepared, Failed> {
    let mut read = read_host_with(loaded, inventory::ProcScan::All)?;
    if scan == Scan::Full {
        exact_comm_of_matched(&mut read).map_err(|error| Failed {
            error,
            inventory: None,
        })?;
    }
    Ok(read)
}

/// The kernel's `comm` for every process a rule matches, where the scan took it from argv[0]
/// (no rule looks at `comm` or passes its tenant on): the processes a plan shows by name
/// (its moves and overlaps) are among them. Reading it for these alone, after the rules have
/// picked them, leaves a third of a scan's files unread on a host where most processes are no
/// tenant's.
fn exact_comm_of_matched(read: &mut Prepared) -> Result<()> {
    if !names_from_argv0(&read.loaded.policy) {
        return Ok(());
    }
    let matcher = &read.loaded.policy.matcher;
    inventory::procs::read_exact_comm(&read.fs, &mut read.inventory.procs, |p| {
        matcher.hit_by_any_rule(p)
    })
    .context("reading the matched processes' comm in /proc")
}

/// Whether a scan takes process names from argv[0] (`procs::Fields::comm`): where no rule looks
/// at `comm` or passes its tenant on (which reads `stat`, the name with it).
fn names_from_argv0(policy: &Policy) -> bool {
    let needed = inventory::procs::Fields::needed_by(&policy.tenants);
    !needed.comm && !needed.tree
}

/// The daemon's rescan: `read_host` (`Scan::Rules`) keeping the processes that `reuse` says
/// have not changed since the scan before.
pub fn read_host_reusing(
    loaded: Loaded,
    reuse: inventory::procs::Reuse,
) -> Result<Prepared, Failed> {
    read_host_with(loaded, inventory::ProcScan::Reusing(reuse))
}

/// A host read (or the plan after it) that failed, with what it read of the host when it got
/// that far: the daemon's next rescan starts from that process scan (a rescan updates the
/// scan before in place, so that one is gone) rather than reading every process again.
#[derive(Debug)]
pub struct Failed {
    pub error: anyhow::Error,
    pub inventory: Option<Box<Inventory>>,
}

impl Failed {
    /// A failure after the host read, with it.
    pub fn after(error: anyhow::Error, inventory: Inventory) -> Failed {
        Failed {
            error,
            inventory: Some(Box::new(inventory)),
        }
    }
}

fn read_host_with(loaded: Loaded, scan: inventory::ProcScan) -> Result<Prepared, Failed> {
    let fs = HostFs::default();
    let (inventory, problems) =
        inventory::gather(&fs, &loaded.policy, scan).map_err(|error| Failed {
            error,
            inventory: None,
        })?;
    let layout_and_manager = || -> Result<_> {
        if !problems.is_empty() {
            return Err(PolicyErrors(problems).into());
        }
        let setup = Setup::detect(&fs, &inventory.mounts)?;
        let layout = Layout::new(setup, &loaded.policy.agent)?;
        let manager = crate::systemd::resolve(loaded.policy.agent.manager, &fs)
            .map_err(anyhow::Error::msg)?;
        Ok((layout, manager))
    };
    match layout_and_manager() {
        Ok((layout, manager)) => Ok(Prepared {
            loaded,
            inventory,
            layout,
            manager,
            fs,
            groups: None,
            classified: None,
        }),
        Err(error) => Err(Failed::after(error, inventory)),
    }
}

/// The policy and the cgroup layout, without the host scan `prepare` does (for commands that
/// only read the cgroups: `status`, `top`, `release`).
pub fn layout_for(config: &PolicyPath) -> Result<(Loaded, Layout, HostFs)> {
    let (_, loaded, layout, fs) = live_layout_for(config)?;
    Ok((loaded, layout, fs))
}

/// `layout_for`, with the state the policy was read in (the schedule windows open now), for
/// readers that also show the overrides in force.
pub fn live_layout_for(config: &PolicyPath) -> Result<(live::Live, Loaded, Layout, HostFs)> {
    let (live, loaded) = live::Live::load(config)?;
    let (layout, fs) = layout_of(&loaded)?;
    Ok((live, loaded, layout, fs))
}

/// The cgroup layout of a policy already loaded, from this host's mounts.
pub fn layout_of(loaded: &Loaded) -> Result<(Layout, HostFs)> {
    let fs = HostFs::default();
    let mounts = inventory::MountTable::read(&fs).context("reading /proc/self/mountinfo")?;
    let setup = Setup::detect(&fs, &mounts)?;
    let layout = Layout::new(setup, &loaded.policy.agent)?;
    Ok((layout, fs))
}

/// For the readers (`status`, `top`): under systemd, the units that govern each tenant
/// (`Layout::units`), found as the plan finds them (a process scan, each process's unit, the
/// units' processes over D-Bus); empty under cgroupfs, where the tenants' own groups are read.
pub fn tenant_units(loaded: &Loaded, fs: &HostFs) -> Result<BTreeMap<String, Vec<String>>> {
    let manager =
        crate::systemd::resolve(loaded.policy.agent.manager, fs).map_err(anyhow::Error::msg)?;
    if manager != crate::systemd::Manager::Systemd {
        return Ok(BTreeMap::new());
    }
    let p = read_host(loaded.clone(), Scan::Rules)?;
    Ok(plan(&p, &Adjustments::default())?.units())
}

/// Reads what the kernel holds now for this policy and plans the steps to the policy with the
/// adjustments.
pub fn plan(p: &Prepared, adjust: &Adjustments) -> Result<Plan> {
    Ok(plan_with_view(p, adjust)?.0)
}

/// `plan`, with the placements of the host's processes it was made from (the daemon keeps them
/// as its members instead of classifying every process again).
pub fn plan_placed(p: &Prepared, adjust: &Adjustments) -> Result<(Plan, Vec<Placement>)> {
    let (plan, _, placements) = plan_with_view(p, adjust)?;
    Ok((plan, placements))
}

/// `plan`, also giving the systemd view it planned from (under systemd) and the processes'
/// placements, for callers that act on the same units (`systemd_release`) without reading
/// them again.
fn plan_with_view(
    p: &Prepared,
    adjust: &Adjustments,
) -> Result<(Plan, Option<plan::SystemdView>, Vec<Placement>)> {
    let policy = adjust.policy(&p.loaded.policy);
    let placements = match &p.classified {
        Some(memo) => crate::classify::classify_reusing(
            &policy.matcher,
            &p.inventory.procs,
            &p.inventory.unchanged,
            &mut memo.lock().unwrap_or_else(|poisoned| poisoned.into_inner()),
        ),
        None => policy.matcher.classify(&p.inventory.procs),
    };
    let pids: Vec<u32> = placements.iter().map(|x| x.pid).collect();
    // The tree driver of the manager in force: under systemd it plans from the units, read
    // once here (D-Bus and /proc).
    let view = match p.manager {
        crate::systemd::Manager::Systemd => Some(systemd_view(p, &pids)?),
        crate::systemd::Manager::Cgroupfs => None,
    };
    let systemd = view.as_ref().map(|view| plan::Systemd { view });
    let driver: &dyn plan::TreeDriver = match &systemd {
        Some(d) => d,
        None => &plan::Cgroupfs,
    };
    let mut watch = p.groups.as_ref().map(|g| GroupWatch::lock(g));
    // The resident memory only where the plan looks at it: a tenant's memory.max (checked
    // against what its processes hold) and a tenant in a cpuset now (its memory moves).
    let tenant_of: std::collections::HashMap<u32, &crate::policy::Tenant> = placements
        .iter()
        .map(|x| (x.pid, &policy.tenants[x.tenant]))
        .collect();
    let rss_wanted = |snap: &Snapshot, pid: u32| {
        tenant_of.get(&pid).is_some_and(|t| {
            t.memory.max.is_some() || snap.tenant_cpuset(&p.layout, &t.name).is_some()
        })
    };
    let mut snap = Snapshot::read_watched(
        &p.fs,
        &p.layout,
        &pids,
        &p.inventory.unchanged,
        &rss_wanted,
        watch.as_deref_mut(),
    );
    let how = plan::Planning {
        shares: &adjust.shares,
        migrate_memory: adjust.migrate_memory,
        driver,
        settled: watch.as_deref().map(|w| &w.settled),
    };
    let build = |snap: &Snapshot| {
        plan::build_with(&policy, &p.inventory, &p.layout, snap, &placements, &how)
    };
    let mut plan = build(&snap)?;
    // A running tenant's nodes change: how much memory that moves comes from its processes'
    // numa_maps, read only then (they walk page tables), and the plan is made again with them.
    let unread: Vec<u32> = plan
        .memory_moves
        .iter()
        .filter(|m| m.bytes.is_none())
        .flat_map(|m| m.pids.iter().copied())
        .collect();
    if !unread.is_empty() && !adjust.skip_move_sizes {
        snap.proc_nodes = inventory::numa::read_process_nodes(&p.fs, &unread);
        plan = build(&snap)?;
    }
    if let Some(w) = watch.as_deref_mut() {
        w.keep(&mut snap, &plan.moved_pids());
        remember_settled(w, &policy, &p.layout, &plan);
    }
    drop(watch);
    Ok((plan, view, placements))
}

/// Keeps in the watch the tenants `plan` had nothing to do for in their groups, for the next
/// plan (`watch::Settled`); a plan that did not say (the systemd driver's) keeps none.
fn remember_settled(w: &mut GroupWatch, policy: &Policy, layout: &Layout, plan: &plan::Plan) {
    use plan::GroupsOutcome;
    let outcomes = &plan.groups;
    if outcomes.len() != policy.tenants.len() {
        w.settled = Default::default();
        return;
    }
    (w.settled).keep_named(policy.tenants.iter().map(|t| t.name.as_str()));
    for ((t, summary), outcome) in policy.tenants.iter().zip(&plan.tenants).zip(outcomes) {
        match outcome {
            GroupsOutcome::StillSettled => w.stats.tenants_settled += 1,
            GroupsOutcome::Settled => {
                (w.settled).settle(&t.name, &summary.settings, &layout.grouped(t))
            }
            GroupsOutcome::Steps => w.settled.unsettle(&t.name),
        }
    }
}

/// What the systemd driver plans from: each process's unit (/proc), and over D-Bus the
/// processes and resource properties of every unit involved.
fn systemd_view(p: &Prepared, pids: &[u32]) -> Result<plan::SystemdView> {
    let sd = crate::systemd::Systemd::connect()?;
    let mut view = plan::SystemdView {
        unified: p
            .layout
            .setup
            .hierarchies
            .iter()
            .all(|h| h.version == crate::cgroup::Version::V2),
        ..Default::default()
    };
    view.scanned = p.inventory.procs.iter().map(|x| x.pid).collect();
    view.page = crate::cgroup::page_size();
    // Leaves in delegated units are made on cgroup v2 only (`cgroup::systemd::Delegation`).
    let io_hierarchy = p
        .layout
        .setup
        .hierarchy_of(crate::cgroup::Controller::Io)
        .map(|h| &p.layout.setup.hierarchies[h])
        .filter(|h| h.version == crate::cgroup::Version::V2);
    for &pid in pids {
        if let Ok(Some((unit, group))) = crate::systemd::unit_group_of_pid(&p.fs, pid) {
            view.unit_group.entry(unit.clone()).or_insert(group);
            view.unit_of.insert(pid, unit);
        }
    }
    let units: std::collections::BTreeSet<&String> = view.unit_of.values().collect();
    for unit in units {
        if !crate::systemd::holds_processes(unit) {
            continue;
        }
        let procs = sd.unit_pids(unit)?;
        let res = sd.unit_resources(unit)?;
        // A delegated unit's tree, for the tenant's leaves in it (`plan::delegated`).
        if let (true, Some(h), Some(group)) =
            (res.delegate, io_hierarchy, view.unit_group.get(unit))
        {
            if let Some(tree) = crate::cgroup::delegated::DelegatedTree::read(h, group) {
                view.delegated.insert(unit.clone(), tree);
            }
        }
        view.unit_pids.insert(unit.clone(), procs);
        view.resources.insert(unit.clone(), res);
    }
    // The names of the processes a delegated unit's tree holds (its moves name them). Where
    // the scan took names from argv[0], the kernel's is read for those no rule matched (a
    // `Scan::Full` read it for the others; a unit's tree also holds their children).
    let in_trees: std::collections::HashSet<u32> =
        view.delegated.values().flat_map(|t| t.pids()).collect();
    if !in_trees.is_empty() {
        let from_argv0 = names_from_argv0(&p.loaded.policy);
        let matcher = &p.loaded.policy.matcher;
        view.comm = p
            .inventory
            .procs
            .iter()
            .filter(|x| in_trees.contains(&x.pid))
            .map(|x| {
                let kernel = (from_argv0 && !matcher.hit_by_any_rule(x))
                    .then(|| crate::inventory::procs::read_comm(&p.fs, x.pid))
                    .flatten();
                (x.pid, kernel.unwrap_or_else(|| x.comm.to_string()))
            })
            .collect();
    }
    // How systemd names each device a tenant's IO limits may name (its IO properties).
    for t in &p.inventory.tenants {
        for d in &t.devices {
            view.device_nodes
                .entry(d.devnum)
                .or_insert_with(|| crate::systemd::plan::device_node(&p.fs, d.devnum));
        }
    }
    Ok(view)
}

/// A unit `release` gave back under systemd: (tenant, unit, how).
pub type ReleasedUnit = (String, String, crate::systemd::govern::Released);

/// `release` under systemd: every unit that holds a selected tenant's processes in place gets
/// its own settings back (dbcage's runtime drop-ins removed, then one manager reload), the
/// tenant's scope systemd's defaults; no process is moved out of its unit or stopped (the
/// processes in a delegated unit's leaves return to the unit's own group, the leaves are
/// removed). Returns (tenant, unit, how) for each unit released, and how many processes left
/// leaves.
pub fn systemd_release(p: &Prepared, only: &[String]) -> Result<(Vec<ReleasedUnit>, usize)> {
    let (plan, view, placements) = plan_with_view(p, &Adjustments::default())?;
    let view = view.context("release under systemd: the policy's manager is not systemd")?;
    let policy = &p.loaded.policy;
    let members: std::collections::HashSet<u32> = placements.iter().map(|x| x.pid).collect();
    let sd = crate::systemd::Systemd::connect()?;
    let mut released = Vec::new();
    let mut from_leaves = 0;
    let mut failed = None;
    'tenants: for summary in plan
        .tenants
        .iter()
        .filter(|t| only.is_empty() || only.contains(&t.name))
    {
        let ti = policy.tenants.iter().position(|t| t.name == summary.name);
        let mine: Vec<u32> = placements
            .iter()
            .filter(|x| Some(x.tenant) == ti)
            .map(|x| x.pid)
            .collect();
        let scope = crate::systemd::scope_name(&summary.name);
        let mut units: std::collections::BTreeSet<String> = mine
            .iter()
            .filter_map(|pid| view.unit_of.get(pid))
            .filter(|u| {
                **u == scope
                    || ti.is_some_and(|ti| policy.tenants[ti].names_unit(u))
                    // the plan's rule: a process started after the scan (a new backend)
                    // does not make the tenant's unit a shared one
                    || view.tenants_own(u, |x| mine.contains(&x), |x| members.contains(&x))
            })
            .cloned()
            .collect();
        if view.resources.contains_key(&scope) || sd.unit_resources(&scope).is_ok() {
            units.insert(scope);
        }
        let managed =
            crate::cgroup::systemd::unit_properties(&summary.settings, view.unified, |d| {
                view.device_nodes.get(&d).cloned().unwrap_or_default()
            });
        for unit in units {
            if let Some(tree) = view.delegated.get(&unit) {
                match tree.dissolve() {
                    Ok(n) => from_leaves += n,
                    Err(e) => {
                        failed = Some(anyhow::Error::new(e).context(format!(
                            "releasing tenant `{}`: returning {unit}'s processes from its leaves to its own group",
                            summary.name
                        )));
                        break 'tenants;
                    }
                }
            }
            match crate::systemd::govern::release(&sd, &p.fs, &unit, &managed) {
                Ok(how) => released.push((summary.name.clone(), unit, how)),
                Err(e) => {
                    failed = Some(
                        anyhow::Error::new(e)
                            .context(format!("releasing tenant `{}`", summary.name)),
                    );
                    break 'tenants;
                }
            }
        }
    }
    // The removed drop-ins still hold until the manager reads the units again; the reload
    // also writes the units' own values into their cgroups. Done also when a later unit
    // failed, so that the units released before it do not wait for someone's daemon-reload.
    let removed = released.iter().any(|(_, _, how)| {
        matches!(how, crate::systemd::govern::Released::DropinsRemoved(files) if !files.is_empty())
    });
    if removed {
        sd.reload()
            .context("the units' runtime drop-ins were removed, but systemd still holds dbcage's values until a reload; run `systemctl daemon-reload`")?;
    }
    match failed {
        Some(e) => Err(e),
        None => Ok((released, from_leaves)),
    }
}
