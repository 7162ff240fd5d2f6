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

use crate::cgroup::{Layout, Setup, Snapshot};
use crate::classify::classify;
use crate::hostfs::HostFs;
use crate::inventory::{self, Inventory};
use crate::plan::{self, Plan, Shares};
use crate::policy::{IoLimits, Loaded, Policy, PolicyErrors, PolicyPath};

pub use apply::{execute, Outcome};

/// The policy loaded and the host read: everything a plan is made from, except adjustments.
pub struct Prepared {
    pub loaded: Loaded,
    pub inventory: Inventory,
    pub layout: Layout,
    pub fs: HostFs,
}

/// What the daemon lays over the policy when it plans, each decided by one of its loops.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Adjustments {
    /// `io.split = "demand"`: per tenant, the per-device limits the balancer decided (used in
    /// place of the equal split when they fit the tenant's devices and totals).
    pub shares: Shares,
    /// The replication guard's raises: per tenant, the IO totals in force while it holds them.
    pub raises: BTreeMap<String, IoLimits>,
}

impl Adjustments {
    /// The policy as planned: the tenants' IO totals with the raises in force.
    pub fn policy<'a>(&self, policy: &'a Policy) -> Cow<'a, Policy> {
        if self.raises.is_empty() {
            return Cow::Borrowed(policy);
        }
        let mut p = policy.clone();
        for t in &mut p.tenants {
            if let Some(r) = self.raises.get(&t.name) {
                t.io = *r;
            }
        }
        Cow::Owned(p)
    }
}

/// How much of /proc a host read needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// Every field a command may show (`comm` for every process).
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
    let fs = HostFs::default();
    let (inventory, problems) = inventory::gather(&fs, &loaded.policy, scan == Scan::Full)?;
    if !problems.is_empty() {
        return Err(PolicyErrors(problems).into());
    }
    let setup = Setup::detect(&fs, &inventory.mounts)?;
    let layout = Layout::new(setup, &loaded.policy.agent)?;
    Ok(Prepared {
        loaded,
        inventory,
        layout,
        fs,
    })
}

/// The policy and the cgroup layout, without the host scan `prepare` does (for commands that
/// only read the cgroups: `status`, `top`, `release`).
pub fn layout_for(config: &PolicyPath) -> Result<(Loaded, Layout, HostFs)> {
    let fs = HostFs::default();
    let loaded = load_policy(config)?;
    let mounts = inventory::MountTable::read(&fs).context("reading /proc/self/mountinfo")?;
    let setup = Setup::detect(&fs, &mounts)?;
    let layout = Layout::new(setup, &loaded.policy.agent)?;
    Ok((loaded, layout, fs))
}

/// Reads what the kernel holds now for this policy and plans the steps to the policy with the
/// adjustments.
pub fn plan(p: &Prepared, adjust: &Adjustments) -> Result<Plan> {
    let policy = adjust.policy(&p.loaded.policy);
    let placements = classify(&policy.tenants, &p.inventory.procs);
    let pids: Vec<u32> = placements.iter().map(|x| x.pid).collect();
    let snap = Snapshot::read(&p.fs, &p.layout, &pids);
    Ok(plan::build_with(
        &policy,
        &p.inventory,
        &p.layout,
        &snap,
        &adjust.shares,
    )?)
}
