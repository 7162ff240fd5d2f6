//! A tenant's limits and usage as the kernel holds them, read through the driver of each
//! controller's hierarchy: what `status`, `top`, the metrics and the balancer read. Reading
//! only; a missing group or file reads as unknown, never as an error.
//!
//! Under systemd a tenant has no group of dbcage's own: its limits are properties of the units
//! that hold its processes (`Layout::units`), and the same readers read those units' cgroups
//! (the first of them for limits and usage: the database's own unit before its scope; every unit for the
//! processes).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::stats::{CpuUsage, IoCounters, MemoryUsage, PressureSet};
use super::{Controller, Layout};
use crate::classify::Leaf;
use crate::kernel::DevNum;
use crate::policy::IoLimits;

/// Per-device IO limits and counters.
#[derive(Debug, Clone, Default)]
pub struct IoState {
    pub limits: BTreeMap<DevNum, IoLimits>,
    pub usage: BTreeMap<DevNum, IoCounters>,
}

impl Layout {
    /// The group a tenant's limits and usage are read from in hierarchy `h`: the cgroup of its
    /// main unit under systemd, its own group otherwise.
    pub fn read_dir(&self, h: usize, tenant: &str) -> PathBuf {
        self.unit_dirs(h, tenant)
            .into_iter()
            .next()
            .unwrap_or_else(|| self.tenant_dir(h, tenant))
    }

    /// The groups a tenant's processes of a leaf live in, for counting and listing them: its
    /// leaf, or under systemd every unit's cgroup for `limited` and, in a unit that holds the
    /// tenant's leaves (`cgroup::delegated`: they exist only in the io hierarchy), the leaf
    /// itself too.
    pub fn read_leaves(&self, h: usize, tenant: &str, leaf: Leaf) -> Vec<PathBuf> {
        if !self.units.contains_key(tenant) {
            return vec![self.leaf_dir(h, tenant, leaf)];
        }
        let mut out = Vec::new();
        for unit in self.unit_procs_dirs(h, tenant) {
            let in_leaf = super::delegated::leaf_in(&unit, leaf);
            if leaf == Leaf::Limited {
                out.push(unit);
            }
            out.extend(in_leaf);
        }
        out
    }

    /// The group whose IO limits are the tenant's limited ones: its `limited` leaf, also in a
    /// unit that holds it under systemd (else the unit's own cgroup).
    fn read_limited(&self, h: usize, tenant: &str) -> PathBuf {
        match self.units.contains_key(tenant) {
            true => {
                let unit = self.read_dir(h, tenant);
                super::delegated::leaf_in(&unit, Leaf::Limited).unwrap_or(unit)
            }
            false => self.leaf_dir(h, tenant, Leaf::Limited),
        }
    }

    /// The units' cgroups that list their processes, in hierarchy `h`, for `read_leaves`. On
    /// cgroup v1 systemd makes a unit's groups only in the hierarchies of the controllers it
    /// enabled for the unit (a unit without IO settings has none in blkio, where the processes
    /// are otherwise counted): its processes are then listed by its group in the first other
    /// hierarchy that has one (they are in each of them), not counted as none.
    fn unit_procs_dirs(&self, h: usize, tenant: &str) -> Vec<PathBuf> {
        let Some(units) = self.units.get(tenant) else {
            return Vec::new();
        };
        let here = &self.setup.hierarchies[h];
        units
            .iter()
            .filter_map(|u| {
                let dir = here.dir_of(u);
                if here.version == super::Version::V2 || dir.as_ref().is_some_and(|d| d.is_dir()) {
                    return dir;
                }
                (self.setup.hierarchies.iter())
                    .filter(|x| x.version == super::Version::V1)
                    .filter_map(|x| x.dir_of(u))
                    .find(|d| d.is_dir())
                    .or(dir)
            })
            .collect()
    }

    /// The units' cgroups of a tenant governed through systemd, in hierarchy `h` (a unit's
    /// group may be missing from a v1 hierarchy whose controller systemd did not enable for
    /// it: it then reads as unknown, like any missing group).
    pub(crate) fn unit_dirs(&self, h: usize, tenant: &str) -> Vec<PathBuf> {
        let Some(units) = self.units.get(tenant) else {
            return Vec::new();
        };
        units
            .iter()
            .filter_map(|u| self.setup.hierarchies[h].dir_of(u))
            .collect()
    }

    /// The IO limits in force on a tenant's `limited` leaf and the tenant's counters (both
    /// leaves), for `status`. `None` without an io controller.
    pub fn tenant_io(&self, tenant: &str) -> Option<IoState> {
        let (h, d) = self.setup.driver_of(Controller::Io)?;
        Some(IoState {
            limits: d.io_limits(&self.read_limited(h, tenant)),
            usage: d.io_usage(&self.read_dir(h, tenant)),
        })
    }

    /// The IO limits and counters of a tenant's `limited` leaf alone, for the balancer (the
    /// exempt leaf's IO is not under the budget it divides).
    pub fn limited_io(&self, tenant: &str) -> Option<IoState> {
        let (h, d) = self.setup.driver_of(Controller::Io)?;
        let dir = self.read_limited(h, tenant);
        Some(IoState {
            limits: d.io_limits(&dir),
            usage: d.io_usage(&dir),
        })
    }

    /// A tenant's CPU usage and its quota in cores.
    pub fn tenant_cpu(&self, tenant: &str) -> (CpuUsage, Option<f64>) {
        let cpu = self.setup.driver_of(Controller::Cpu);
        let acct = self.setup.driver_of(Controller::Cpuacct);
        let cpu_dir = cpu.map(|(h, _)| self.read_dir(h, tenant));
        let acct_dir = acct.map(|(h, _)| self.read_dir(h, tenant));
        let usage = match cpu.or(acct) {
            Some((_, d)) => d.cpu_usage(cpu_dir.as_deref(), acct_dir.as_deref()),
            None => CpuUsage::default(),
        };
        let quota = cpu.and_then(|(h, d)| d.cpu_quota(&self.read_dir(h, tenant)));
        (usage, quota)
    }

    /// The memory nodes a tenant's group may use (`cpuset.mems`; the same file name on v1 and
    /// v2), `None` without a cpuset controller or when unreadable.
    pub fn tenant_mems(&self, tenant: &str) -> Option<crate::kernel::CpuSet> {
        let (h, _) = self.setup.driver_of(Controller::Cpuset)?;
        crate::hostfs::read_text(self.read_dir(h, tenant).join("cpuset.mems"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// A tenant's memory usage and its limit (`memory.max`) in bytes.
    pub fn tenant_memory(&self, tenant: &str) -> (MemoryUsage, Option<u64>) {
        match self.setup.driver_of(Controller::Memory) {
            Some((h, d)) => {
                let dir = self.read_dir(h, tenant);
                (d.memory_usage(&dir), d.memory_limit(&dir))
            }
            None => (MemoryUsage::default(), None),
        }
    }

    /// A tenant's `memory.high` in force (v1: memory.soft_limit_in_bytes); `None` when
    /// unlimited or unreadable.
    pub fn tenant_memory_high(&self, tenant: &str) -> Option<u64> {
        let (h, d) = self.setup.driver_of(Controller::Memory)?;
        d.memory_high(&self.read_dir(h, tenant))
    }

    /// A tenant's pressure stall information, from the first hierarchy that keeps it per
    /// cgroup.
    pub fn tenant_pressure(&self, tenant: &str) -> Option<PressureSet> {
        self.setup
            .hierarchies
            .iter()
            .enumerate()
            .find_map(|(h, hier)| hier.driver().pressure(&self.read_dir(h, tenant)))
    }

    /// A tenant's io.weight and io.latency targets, from the io controller's hierarchy (empty
    /// where the driver has none: v1).
    pub fn tenant_io_protection(&self, tenant: &str) -> super::driver::IoProtection {
        self.setup
            .driver_of(super::Controller::Io)
            .map(|(h, d)| d.io_protection(&self.read_dir(h, tenant)))
            .unwrap_or_default()
    }
}
