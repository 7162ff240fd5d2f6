//! The cgroupfs tree driver (`agent.manager = "cgroupfs"`): dbcage's own groups under its
//! parent in every hierarchy, created parents first, their files written through the file
//! driver of each hierarchy (`cgroup::Driver`) in the phases the plan's module comment
//! describes, the processes moved into their leaves last, and a tenant's groups in
//! hierarchies its settings no longer use emptied and removed.
//!
//! Under the daemon's group watch, a tenant the last plan had nothing to do for, whose groups
//! were not read again since (no event in them) and whose settings are the same, is not worked
//! out again (`watch::Settled`): its processes' moves are all a rescan plans for it.

use crate::cgroup::driver::SpecInput;
use crate::cgroup::model::FileSpec;
use crate::cgroup::{GroupPath, GroupRef, Layout, Snapshot};
use crate::classify::{Leaf, Placement};
use crate::policy::{Policy, Tenant};
use std::collections::HashMap;

use super::{GroupsOutcome, Plan, Step, StepInput, TreeDriver};

/// dbcage's own groups, written directly.
pub struct Cgroupfs;

impl TreeDriver for Cgroupfs {
    fn name(&self) -> &'static str {
        "cgroupfs"
    }

    fn steps(&self, input: &StepInput, plan: &mut Plan) {
        let StepInput {
            policy,
            inv,
            layout,
            snap,
            placements,
            ..
        } = *input;
        let drivers = layout.setup.drivers();
        // Per tenant: the hierarchies it has groups in (`Layout::grouped`), and whether the
        // daemon's last plan left it settled with the same settings while its groups were not
        // read again since: then nothing is planned for its groups (only its processes' moves).
        let grouped: Vec<Vec<bool>> = policy.tenants.iter().map(|t| layout.grouped(t)).collect();
        let still_settled: Vec<bool> = (policy.tenants.iter().zip(&plan.tenants).zip(&grouped))
            .map(|((t, summary), g)| {
                let unread = (snap.tenants_read.as_ref()).is_some_and(|r| !r.contains(&t.name));
                unread
                    && input
                        .settled
                        .is_some_and(|s| s.holds(&t.name, &summary.settings, g))
            })
            .collect();
        let scope = Scope {
            policy,
            grouped: &grouped,
            still_settled: &still_settled,
        };
        let index: HashMap<&str, usize> = (policy.tenants.iter().enumerate())
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        // Each driver writes the specs of the controllers in its hierarchies (a hybrid host mixes
        // them).
        let spec_input = SpecInput {
            layout,
            snap,
            allowed_cpus: input.allowed_cpus,
            allowed_mems: input.allowed_mems,
            tenants: (plan.tenants.iter().zip(&still_settled))
                .filter(|(_, still)| !**still)
                .map(|(t, _)| (t.name.as_str(), &t.settings))
                .collect(),
        };
        let specs: Vec<FileSpec> = drivers
            .iter()
            .flat_map(|d| {
                d.specs(&spec_input).into_iter().filter(|s| {
                    let Some((h, x)) = layout.setup.driver_of(s.controller) else {
                        return false;
                    };
                    // Only in the hierarchies where the tenant has groups.
                    let tenant = match &s.group {
                        GroupRef::Tenant(t) | GroupRef::Leaf(t, _) => Some(t.as_str()),
                        GroupRef::Parent | GroupRef::Root => None,
                    };
                    x.name() == d.name()
                        && tenant.is_none_or(|t| index.get(t).is_none_or(|&i| grouped[i][h]))
                })
            })
            .collect();
        let mut touched = vec![false; policy.tenants.len()];
        let mut touch = |tenant: &str| {
            if let Some(&i) = index.get(tenant) {
                touched[i] = true;
            }
        };
        plan.steps.extend(mkdirs(layout, snap, &scope, &mut touch));
        plan.steps.extend(writes(&specs, layout, snap, &mut touch));
        plan.steps
            .extend(moves(policy, &inv.procs, layout, snap, placements));
        plan.steps
            .extend(removals(layout, snap, &scope, &mut touch));
        plan.groups = (still_settled.iter().zip(&touched))
            .map(|(&still, &touched)| match (still, touched) {
                (true, _) => GroupsOutcome::StillSettled,
                (false, false) => GroupsOutcome::Settled,
                (false, true) => GroupsOutcome::Steps,
            })
            .collect();
        for t in &policy.tenants {
            let named: Vec<&str> = t
                .rules
                .iter()
                .chain(&t.exempt)
                .filter_map(|r| Some(r.unit.as_ref()?.as_str()))
                .collect();
            if !named.is_empty() {
                plan.warnings.push(format!(
                    "tenant {}: unit = {} under agent.manager = \"{}\": dbcage moves the \
                     processes into its own groups, out of their unit (systemctl stop and restart \
                     then miss them; on cgroup v2 the rule no longer sees a moved process); set \
                     agent.manager = \"systemd\" (\"auto\" picks it on a host systemd runs)",
                    t.name,
                    named.join(", "),
                    self.name()
                ));
            }
        }
    }
}

/// The tenants whose groups a plan works out, and the hierarchies each has groups in.
struct Scope<'a> {
    policy: &'a Policy,
    /// Per tenant (policy order), `Layout::grouped`.
    grouped: &'a [Vec<bool>],
    /// Per tenant: known to have nothing to do, not worked out (see `Cgroupfs::steps`).
    still_settled: &'a [bool],
}

impl<'a> Scope<'a> {
    /// The tenants planned, each with the hierarchies it has groups in.
    fn planned(&self) -> impl Iterator<Item = (&'a Tenant, &'a [bool])> {
        let tenants = self.policy.tenants.iter().zip(self.grouped);
        (tenants.zip(self.still_settled))
            .filter(|(_, still)| !**still)
            .map(|((t, g), _)| (t, g.as_slice()))
    }
}

/// Groups to create, parents before children: dbcage's root in every hierarchy, a planned
/// tenant's groups in the hierarchies its settings use; `touch` hears of each tenant that
/// gets one.
fn mkdirs(
    layout: &Layout,
    snap: &Snapshot,
    scope: &Scope,
    touch: &mut dyn FnMut(&str),
) -> Vec<Step> {
    let mut out = Vec::new();
    for h in 0..layout.setup.hierarchies.len() {
        // Every group is looked up in every plan (1,000 tenants: 9,000 on v1); what a missing
        // one needs (its reason) is made only for it.
        let mut need = |path: std::path::PathBuf, reason: &dyn Fn() -> String| {
            let missing = !snap.dirs.contains(path.as_path());
            if missing {
                out.push(Step::Mkdir {
                    path,
                    reason: reason(),
                });
            }
            missing
        };
        need(layout.root_dir(h), &|| {
            format!("dbcage root `{}`", layout.root_name)
        });
        for (t, _) in scope.planned().filter(|(_, g)| g[h]) {
            let mut made = need(layout.tenant_dir(h, &t.name), &|| {
                format!("tenant `{}`", t.name)
            });
            for leaf in [Leaf::Limited, Leaf::Exempt] {
                made |= need(layout.leaf_dir(h, &t.name, leaf), &|| {
                    format!("tenant `{}` {} leaf", t.name, leaf.dir())
                });
            }
            if made {
                touch(&t.name);
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
/// comment describes; `touch` hears of each tenant whose groups get one.
fn writes(
    specs: &[FileSpec],
    layout: &Layout,
    snap: &Snapshot,
    touch: &mut dyn FnMut(&str),
) -> Vec<Step> {
    let page = crate::cgroup::page_size();
    // (phase, order within phase, step): phases run in order.
    let mut staged: Vec<(u8, i64, Step)> = Vec::new();
    for spec in specs {
        let Some((h, driver)) = layout.setup.driver_of(spec.controller) else {
            continue;
        };
        let dir = layout.dir(h, &spec.group);
        let path = dir.join(spec.file);
        let current = snap.file(&path).map(str::trim);
        // A group this plan creates starts with the kernel's defaults: only what differs is
        // written (the step still says the file is absent now).
        let initial = match current {
            Some(c) => Some(c),
            None if !snap.dirs.contains(dir.as_path()) => driver.new_group_value(spec.file),
            None => None,
        };
        let stages = driver.stage(spec, initial, page);
        if stages.is_empty() {
            continue; // as it should be (most files, at every rescan)
        }
        if let GroupRef::Tenant(t) | GroupRef::Leaf(t, _) = &spec.group {
            touch(t);
        }
        let reason = reason_of(spec);
        for s in stages {
            staged.push((
                s.phase,
                s.order,
                Step::Write {
                    path: path.clone(),
                    value: s.value,
                    current: current.map(str::to_string),
                    reason: reason.clone(),
                },
            ));
        }
    }
    staged.sort_by_key(|(phase, order, _)| (*phase, *order));
    staged.into_iter().map(|(_, _, s)| s).collect()
}

/// The groups of planned tenants in hierarchies their settings no longer use (a tenant
/// unpinned, its memory limit dropped): each emptied into dbcage's parent there and removed,
/// after the moves; `touch` hears of each tenant that has one.
fn removals(
    layout: &Layout,
    snap: &Snapshot,
    scope: &Scope,
    touch: &mut dyn FnMut(&str),
) -> Vec<Step> {
    let mut out = Vec::new();
    for (t, grouped) in scope.planned() {
        for (h, &grouped) in grouped.iter().enumerate() {
            let path = layout.tenant_dir(h, &t.name);
            if grouped || !snap.dirs.contains(path.as_path()) {
                continue;
            }
            touch(&t.name);
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
    // A scan's processes are in pid order (looked up only for the few that move: a map of
    // 100,000 processes at every rescan was a tenth of it); the daemon's event path passes one
    // process or a few ancestors.
    let sorted = procs.is_sorted_by_key(|p| p.pid);
    let comm_of = |pid: u32| match sorted {
        true => (procs.binary_search_by_key(&pid, |p| p.pid).ok()).map(|i| &*procs[i].comm),
        false => procs.iter().find(|p| p.pid == pid).map(|p| &*p.comm),
    };
    // Per tenant and leaf, once (a plan asks for every placed process): the hierarchies it is
    // grouped in and its leaf there. A process's group is most often the leaf spelled the
    // same (bytes compared); otherwise the paths' components are.
    let hierarchies = layout.setup.hierarchies.len();
    let roots: Vec<std::path::PathBuf> = (0..hierarchies).map(|h| layout.root_dir(h)).collect();
    let mut leaves: HashMap<(usize, Leaf), (Vec<bool>, Vec<std::path::PathBuf>)> = HashMap::new();
    let mut out = Vec::new();
    for p in placements {
        let Some(now) = snap.proc_dirs.get(&p.pid) else {
            continue;
        }; // gone since the scan
        let t = &policy.tenants[p.tenant];
        let (grouped, leaf_dirs) = leaves.entry((p.tenant, p.leaf)).or_insert_with(|| {
            let dirs = (0..hierarchies).map(|h| layout.leaf_dir(h, &t.name, p.leaf));
            (layout.grouped(t), dirs.collect())
        });
        let mut targets = Vec::new();
        let mut leave = Vec::new();
        for (h, &grouped) in grouped.iter().enumerate() {
            let here = now.get(h).and_then(|d| d.as_ref());
            if grouped {
                let in_leaf = |d: &GroupPath| {
                    d.as_os_str() == leaf_dirs[h].as_os_str()
                        || layout.is_leaf_dir(d, h, &t.name, p.leaf)
                };
                if !here.is_some_and(in_leaf) {
                    targets.push(leaf_dirs[h].join(crate::cgroup::PROCS));
                }
            } else if here.is_some_and(|d| crate::cgroup::values::is_within(d, &roots[h])) {
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
