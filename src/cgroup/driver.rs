//! The interface every cgroup driver implements: one per way of expressing dbcage's abstract
//! limits (`TenantSettings`) in the kernel. Today `v1::V1` (one hierarchy per controller) and
//! `v2::V2` (the unified hierarchy); a hybrid host mixes them per controller, so the driver is
//! chosen per hierarchy (`Hierarchy::driver`). A driver owns both directions of what it writes:
//! the values for a limit (`specs`, `stage`) and the readers that turn what the kernel holds
//! back into limits and usage (`io_limits`, `cpu_quota`, `memory_usage`, ...). Nothing outside
//! `cgroup/` names a control file or a version; callers go through `Layout`'s tenant readers
//! (`read.rs`) and the plan through this trait.
//!
//! Under systemd the tree is systemd's: the plan's tree driver (`plan::TreeDriver`) sets a
//! tenant's settings as its units' properties (`cgroup::systemd` encodes them) and writes files
//! only in a unit's delegated leaves, through these drivers (`leaf_io_files`, `stage`); the
//! readers read the units' groups, which hold the same files.

use std::collections::BTreeMap;
use std::path::Path;

use crate::hostfs::OpenDir;

use super::model::{FileSpec, TenantSettings};
use super::stats::{CpuUsage, IoCounters, MemoryUsage, PressureSet};
use super::{Controller, Hierarchy, Layout, Snapshot};
use crate::kernel::{CpuSet, DevNum};
use crate::policy::{IoLimits, Tenant};

/// The proportional IO settings in force on a group (`io.weight`, `io.latency`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct IoProtection {
    /// The group's default weight; `None` where the kernel has no weights (v1, no iocost).
    pub weight: Option<u32>,
    /// Per device, the latency target in microseconds.
    pub latency_us: BTreeMap<DevNum, u64>,
}

/// One write the plan stages for a spec: `phase` orders writes across the whole plan (0 widen
/// and enable, 1 set and lower, 2 narrow, 3 raise), `order` within a phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    pub phase: u8,
    pub order: i64,
    pub value: String,
}

/// What a driver plans from: the layout and snapshot, the cpus and memory nodes the parent
/// allows, and each tenant's settings (in policy order).
pub struct SpecInput<'a> {
    pub layout: &'a Layout,
    pub snap: &'a Snapshot,
    pub allowed_cpus: &'a CpuSet,
    pub allowed_mems: &'a CpuSet,
    pub tenants: Vec<(&'a str, &'a TenantSettings)>,
}

pub trait Driver: Sync {
    /// `v1`, `v2`: how `cgroup controllers:` lines name it.
    fn name(&self) -> &'static str;

    // ---- what the kernel holds, for the snapshot

    /// The files the driver manages in each of dbcage's groups of a hierarchy with these
    /// controllers.
    fn managed_files(&self, controllers: &[Controller]) -> Vec<&'static str>;
    /// The specs of one tenant with every setting that adds a file on (and dbcage's root's):
    /// which files the plans can compare in a group at each depth (`managed_files_by_depth`).
    fn specs_of_every_kind(&self) -> Vec<FileSpec>;
    /// `managed_files` by the group's depth under dbcage's root (0: the root, 1: a tenant's
    /// group, 2: a leaf): only those the plans compare there (`model::files_by_depth`), which
    /// is what the walks of the groups read.
    fn managed_files_by_depth(&self, controllers: &[Controller]) -> [Vec<&'static str>; 3] {
        super::model::files_by_depth(
            &self.specs_of_every_kind(),
            &self.managed_files(controllers),
        )
    }
    /// Reads what the plan needs of dbcage's parent group (the cpus and memory nodes it allows,
    /// swap accounting, the controllers it offers) into the snapshot.
    fn read_parent(&self, parent: &Path, controllers: &[Controller], snap: &mut Snapshot);
    /// Reads host-wide settings of the hierarchy's root the plan's checks need (v2: whether
    /// iocost is on for each disk).
    fn read_hierarchy_root(&self, _hier: &Hierarchy, _snap: &mut Snapshot) {}

    // ---- plan

    /// Warnings about the parent group that planning reveals (before any tenant's).
    fn parent_warnings(&self, _layout: &Layout, _snap: &Snapshot) -> Vec<String> {
        Vec::new()
    }
    /// Warnings about a tenant's memory settings this driver cannot express in full.
    fn memory_warnings(&self, _t: &Tenant, _layout: &Layout, _snap: &Snapshot) -> Vec<String> {
        Vec::new()
    }
    /// Why a tenant's `io.weight` or `io.latency_target` has no effect on some of its devices
    /// (`devices`) here, and what would make it work.
    fn io_protection_warnings(
        &self,
        t: &Tenant,
        devices: &[DevNum],
        layout: &Layout,
        snap: &Snapshot,
    ) -> Vec<String>;
    /// Every spec (a file or property of a group, and its desired value) for the root group and
    /// the tenants; the plan keeps those of controllers this driver has on this host.
    fn specs(&self, input: &SpecInput) -> Vec<FileSpec>;
    /// The IO limit files of a tenant's `limited` leaf alone: what dbcage writes below a
    /// systemd unit that delegates its subtree (`cgroup::delegated`), where the unit's other
    /// limits are its properties.
    fn leaf_io_files(&self, settings: &TenantSettings) -> Vec<FileSpec>;
    /// The writes that take a spec's current value (`None`: absent) to the desired one, in
    /// the plan's phases; nothing when it holds already.
    fn stage(&self, spec: &FileSpec, current: Option<&str>, page: u64) -> Vec<Staged>;
    /// The value a file holds in a group the kernel has just created, where the kernel fixes
    /// it (not inherited from the parent): the plan stages a group it creates from these, so
    /// that it writes only what differs from the kernel's defaults.
    fn new_group_value(&self, _file: &str) -> Option<&'static str> {
        None
    }
    /// Whether IO write limits bind buffered writes (v1: only O_DIRECT and fsync'd writes).
    fn limits_buffered_writes(&self) -> bool;

    // ---- read back, for status, top, the metrics and the balancer

    /// The per-device limits in force on a group.
    fn io_limits(&self, group: &OpenDir) -> BTreeMap<DevNum, IoLimits>;
    /// Per-device IO counters of a group (its children included); devices with no IO left out.
    fn io_usage(&self, group: &OpenDir) -> BTreeMap<DevNum, IoCounters>;
    /// CPU usage of a group: `cpu` is its group in the cpu hierarchy, `cpuacct` in cpuacct's
    /// (v1 keeps usage apart from throttling).
    fn cpu_usage(&self, cpu: Option<&OpenDir>, cpuacct: Option<&OpenDir>) -> CpuUsage;
    /// The cpu quota in force, in cores (`None`: unlimited or unreadable).
    fn cpu_quota(&self, group: &OpenDir) -> Option<f64>;
    fn memory_usage(&self, group: &OpenDir) -> MemoryUsage;
    /// The memory limit in force (`None`: unlimited or unreadable).
    fn memory_limit(&self, group: &OpenDir) -> Option<u64>;
    /// The soft limit in force (`memory.high`; v1 memory.soft_limit_in_bytes).
    fn memory_high(&self, group: &OpenDir) -> Option<u64>;
    /// The proportional IO settings in force on a tenant's group.
    fn io_protection(&self, _group: &OpenDir) -> IoProtection {
        IoProtection::default()
    }
    /// Pressure stall information, where the kernel keeps it per cgroup.
    fn pressure(&self, group: &OpenDir) -> Option<PressureSet>;
}
