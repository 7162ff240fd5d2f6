//! The systemd tree driver (`agent.manager = "systemd"`): systemd owns the tree, so a
//! tenant's settings become the properties of the units that run it (set over D-Bus where they
//! differ from what the unit holds: a first apply and a drift repair alike), its leaves live
//! in a unit that delegates its subtree (`plan::delegated`), and its processes outside a unit
//! of their own are adopted into `dbcage-TENANT.scope`. Never a move out of a unit.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::classify::{Leaf, Placement};
use crate::kernel::{CpuSet, DevNum};
use crate::policy::Tenant;
use crate::systemd::Property;

use super::{delegated, Plan, Step, StepInput, TreeDriver};

/// The units, over the view the engine read.
pub struct Systemd<'a> {
    pub view: &'a SystemdView,
}

impl TreeDriver for Systemd<'_> {
    fn name(&self) -> &'static str {
        "systemd"
    }

    fn steps(&self, input: &StepInput, plan: &mut Plan) {
        let (steps, warnings, mut units) =
            systemd_steps(plan, input.placements, &input.policy.tenants, self.view);
        plan.steps = steps;
        plan.warnings.extend(warnings);
        for t in &mut plan.tenants {
            let governed = units.remove(&t.name).unwrap_or_default();
            t.units = governed.units;
            t.unit_properties = governed.properties;
            t.shared_units = governed.shared;
            t.delegated_units = governed.delegated;
            t.needs_delegate = governed.needs_delegate;
            t.scope_wants_leaves = governed.scope_wants_leaves;
        }
    }
}

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
