//! A tenant's limits and usage as the kernel holds them, read through the driver of each
//! controller's hierarchy: what `status`, `top`, the metrics and the balancer read. Reading
//! only; a missing group or file reads as unknown, never as an error.
//!
//! Under systemd a tenant has no group of dbcage's own: its limits are properties of the units
//! that hold its processes (`Layout::units`), and the same readers read those units' cgroups
//! (the first of them for limits and usage: the database's own unit before its scope; every unit for the
//! processes).

use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::path::PathBuf;

use super::stats::{CpuUsage, IoCounters, MemoryUsage, PressureSet};
use super::{Controller, Layout};
use crate::classify::Leaf;
use crate::hostfs::{KeptDirs, OpenDir};
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

    /// A reader of one tenant's limits and usage (`status`, `top`, the metrics, the balancer).
    pub fn reader<'a>(&'a self, tenant: &'a str) -> TenantReader<'a> {
        self.reader_keeping(tenant, None)
    }

    /// `reader`, taking the groups it opens from `kept` and leaving them there.
    pub fn reader_keeping<'a>(
        &'a self,
        tenant: &'a str,
        kept: Option<&'a KeptDirs>,
    ) -> TenantReader<'a> {
        let groups = || {
            (0..self.setup.hierarchies.len())
                .map(|_| OnceCell::new())
                .collect()
        };
        TenantReader {
            layout: self,
            tenant,
            kept,
            groups: groups(),
            limited: groups(),
            exempt: groups(),
        }
    }
}

/// One tenant's groups, each opened once however many of its files are read: `status` and each
/// metrics scrape read some twenty files a tenant from a handful of groups.
pub struct TenantReader<'a> {
    layout: &'a Layout,
    tenant: &'a str,
    kept: Option<&'a KeptDirs>,
    /// Per hierarchy: `Layout::read_dir`.
    groups: Vec<OnceCell<OpenDir<'a>>>,
    /// Per hierarchy: `Layout::read_limited`.
    limited: Vec<OnceCell<OpenDir<'a>>>,
    /// Per hierarchy: the `exempt` leaf of a tenant with groups of dbcage's own.
    exempt: Vec<OnceCell<OpenDir<'a>>>,
}

impl<'a> TenantReader<'a> {
    fn opened(&self, path: PathBuf) -> OpenDir<'a> {
        match self.kept {
            Some(kept) => OpenDir::kept(path, kept),
            None => OpenDir::open(path),
        }
    }

    fn group(&self, h: usize) -> &OpenDir<'a> {
        self.groups[h].get_or_init(|| self.opened(self.layout.read_dir(h, self.tenant)))
    }

    fn limited_group(&self, h: usize) -> &OpenDir<'a> {
        self.limited[h].get_or_init(|| self.opened(self.layout.read_limited(h, self.tenant)))
    }

    /// The IO limits in force on the tenant's `limited` leaf and the tenant's counters (both
    /// leaves), for `status`. `None` without an io controller.
    pub fn io(&self) -> Option<IoState> {
        let (h, d) = self.layout.setup.driver_of(Controller::Io)?;
        Some(IoState {
            limits: d.io_limits(self.limited_group(h)),
            usage: d.io_usage(self.group(h)),
        })
    }

    /// The IO limits and counters of the tenant's `limited` leaf alone, for the balancer (the
    /// exempt leaf's IO is not under the budget it divides).
    pub fn limited_io(&self) -> Option<IoState> {
        let (h, d) = self.layout.setup.driver_of(Controller::Io)?;
        let dir = self.limited_group(h);
        Some(IoState {
            limits: d.io_limits(dir),
            usage: d.io_usage(dir),
        })
    }

    /// The processes of one of the tenant's leaves, listed in hierarchy `h`
    /// (`Layout::read_leaves`).
    pub fn pids(&self, h: usize, leaf: Leaf) -> Vec<u32> {
        if !self.layout.units.contains_key(self.tenant) {
            let dir = match leaf {
                // The same group as the io limits' (`read_limited`).
                Leaf::Limited => self.limited_group(h),
                Leaf::Exempt => self.exempt[h].get_or_init(|| {
                    self.opened(self.layout.leaf_dir(h, self.tenant, Leaf::Exempt))
                }),
            };
            let procs = dir.read("cgroup.procs");
            return procs.map(|t| super::parse_procs(&t)).unwrap_or_default();
        }
        (self.layout.read_leaves(h, self.tenant, leaf).iter())
            .flat_map(|dir| super::procs_in(dir))
            .collect()
    }

    /// The tenant's CPU usage and its quota in cores.
    pub fn cpu(&self) -> (CpuUsage, Option<f64>) {
        let cpu = self.layout.setup.driver_of(Controller::Cpu);
        let acct = self.layout.setup.driver_of(Controller::Cpuacct);
        let cpu_dir = cpu.map(|(h, _)| self.group(h));
        let acct_dir = acct.map(|(h, _)| self.group(h));
        let usage = match cpu.or(acct) {
            Some((_, d)) => d.cpu_usage(cpu_dir, acct_dir),
            None => CpuUsage::default(),
        };
        let quota = cpu.and_then(|(h, d)| d.cpu_quota(self.group(h)));
        (usage, quota)
    }

    /// The memory nodes the tenant's group may use (`cpuset.mems`; the same file name on v1 and
    /// v2), `None` without a cpuset controller or when unreadable.
    pub fn mems(&self) -> Option<crate::kernel::CpuSet> {
        let (h, _) = self.layout.setup.driver_of(Controller::Cpuset)?;
        self.group(h).read("cpuset.mems").ok()?.trim().parse().ok()
    }

    /// The tenant's memory usage and its limit (`memory.max`) in bytes.
    pub fn memory(&self) -> (MemoryUsage, Option<u64>) {
        match self.layout.setup.driver_of(Controller::Memory) {
            Some((h, d)) => (d.memory_usage(self.group(h)), d.memory_limit(self.group(h))),
            None => (MemoryUsage::default(), None),
        }
    }

    /// The tenant's `memory.high` in force (v1: memory.soft_limit_in_bytes); `None` when
    /// unlimited or unreadable.
    pub fn memory_high(&self) -> Option<u64> {
        let (h, d) = self.layout.setup.driver_of(Controller::Memory)?;
        d.memory_high(self.group(h))
    }

    /// The tenant's pressure stall information, from the first hierarchy that keeps it per
    /// cgroup.
    pub fn pressure(&self) -> Option<PressureSet> {
        (self.layout.setup.hierarchies.iter().enumerate())
            .find_map(|(h, hier)| hier.driver().pressure(self.group(h)))
    }

    /// The tenant's io.weight and io.latency targets, from the io controller's hierarchy (empty
    /// where the driver has none: v1).
    pub fn io_protection(&self) -> super::driver::IoProtection {
        (self.layout.setup.driver_of(Controller::Io))
            .map(|(h, d)| d.io_protection(self.group(h)))
            .unwrap_or_default()
    }
}
