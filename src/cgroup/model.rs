//! The abstract limit model the plan produces and the drivers encode, and the desired value of
//! one control file, which knows how to compare itself with what the kernel reads back.

use std::collections::BTreeMap;

use serde::Serialize;

use super::driver::Staged;
use super::{Controller, GroupRef};
use crate::kernel::{CpuSet, DevNum};
use crate::policy::IoLimits;

/// Everything one tenant should have, independent of cgroup version.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantSettings {
    /// Per-device limits for the `limited` leaf (the exempt leaf has none).
    pub io: BTreeMap<DevNum, IoLimits>,
    /// CPU quota in cores; `None` = unlimited.
    pub cpu_cores: Option<f64>,
    /// 1..=10000, 100 by default.
    pub cpu_weight: u32,
    pub cpus: CpuSet,
    pub mems: CpuSet,
    pub memory_max: Option<u64>,
    pub memory_high: Option<u64>,
    pub memory_low: Option<u64>,
    pub memory_swap_max: Option<u64>,
    /// A change of `mems` moves the pages the tenant's processes hold (see
    /// `plan::MemoryMove`): on v1 `cpuset.memory_migrate` is set first (v2 always migrates).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub migrate_memory: bool,
    /// `io.weight` (1..=10000); `None`: the kernel's default (100).
    pub io_weight: Option<u32>,
    /// `io.latency_target` in microseconds, per device of the tenant.
    pub io_latency_us: BTreeMap<DevNum, u64>,
}

impl Default for TenantSettings {
    /// A tenant with no limits: the kernel's defaults everywhere (cpu weight 100).
    fn default() -> TenantSettings {
        TenantSettings {
            io: BTreeMap::new(),
            cpu_cores: None,
            cpu_weight: 100,
            cpus: CpuSet::default(),
            mems: CpuSet::default(),
            memory_max: None,
            memory_high: None,
            memory_low: None,
            memory_swap_max: None,
            migrate_memory: false,
            io_weight: None,
            io_latency_us: BTreeMap::new(),
        }
    }
}

/// The period dbcage writes with a cpu quota (the kernel's default, 100 ms).
pub const CPU_PERIOD_US: u64 = 100_000;

/// The desired content of one control file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Desired {
    /// Written and compared as text (after trimming).
    Text(String),
    /// A cpu or node list, compared as a set.
    List(CpuSet),
    /// A memory limit in bytes (`None` = unlimited); the kernel rounds to pages.
    Memory(Option<u64>),
    /// Per-device lines (`MAJ:MIN VALUE`); devices absent here are cleared.
    Devices(BTreeMap<DevNum, u64>),
    /// v2 `io.max`: per device, the four limits; compared device by device with a parse of the
    /// current file, and devices absent here are cleared (all four keys `max`).
    IoMax(BTreeMap<DevNum, IoLimits>),
    /// v2 `io.weight`'s `default` line (`None`: 100, the kernel's default, written only to
    /// undo a weight dbcage set).
    IoWeight(Option<u32>),
    /// v2 `io.latency`: per device, the target in microseconds; devices absent here are
    /// cleared (`target=max`).
    IoLatency(BTreeMap<DevNum, u64>),
    /// v2 `cgroup.subtree_control`: these controllers must be enabled (others are left alone).
    Controllers(Vec<&'static str>),
}

/// A memory value as the kernel reads it back: `max` (v2), `-1` or a huge page-aligned
/// counter (v1) are unlimited (`Some(None)`); unreadable text is `None`.
pub fn parse_memory(text: &str) -> Option<Option<u64>> {
    let t = text.trim();
    if t == "max" || t == "-1" {
        return Some(None);
    }
    let v: u64 = t.parse().ok()?;
    Some((v < super::v1::UNLIMITED_THRESHOLD).then_some(v))
}

/// Of a tenant's files, the IO limits of its `limited` leaf (`Driver::leaf_io_files`).
pub fn limited_io(files: Vec<FileSpec>) -> Vec<FileSpec> {
    files
        .into_iter()
        .filter(|f| {
            f.controller == Controller::Io
                && matches!(f.group, GroupRef::Leaf(_, crate::classify::Leaf::Limited))
        })
        .collect()
}

/// Per depth under dbcage's root (0: the root, 1: a tenant's group, 2: its leaves), the files of
/// `managed` that `specs` name in a group at that depth, in `managed`'s order. With the specs of
/// every kind a driver makes (`Driver::specs_of_every_kind`), what a walk of the groups needs to
/// read at each depth: at 1,000 tenants on v1 half the files it read in every group were never
/// compared (the IO limits of a tenant's group, the CPU files of its leaves).
pub fn files_by_depth(specs: &[FileSpec], managed: &[&'static str]) -> [Vec<&'static str>; 3] {
    let mut out: [Vec<&'static str>; 3] = Default::default();
    for (depth, files) in out.iter_mut().enumerate() {
        let named =
            |f: &str| (specs.iter()).any(|s| s.file == f && s.group.depth() == depth as i64);
        files.extend(managed.iter().copied().filter(|f| named(f)));
    }
    out
}

/// One control file of one group, and the value it should hold.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileSpec {
    pub controller: Controller,
    pub group: GroupRef,
    pub file: &'static str,
    pub value: Desired,
}

impl GroupRef {
    /// How deep the group is under dbcage's parent (the parent is -1).
    pub fn depth(&self) -> i64 {
        match self {
            GroupRef::Parent => -1,
            GroupRef::Root => 0,
            GroupRef::Tenant(_) => 1,
            GroupRef::Leaf(..) => 2,
        }
    }
}

fn staged(phase: u8, order: i64, value: String) -> Staged {
    Staged {
        phase,
        order,
        value,
    }
}

/// The writes for the kinds of value every driver stages alike: text (set in phase 1 when it
/// differs) and cpu/node lists (widened top-down in phase 0, narrowed bottom-up in phase 2: v1
/// requires a child's set within its parent's). `None` for the other kinds.
pub fn stage_common(spec: &FileSpec, current: Option<&str>) -> Option<Vec<Staged>> {
    let mut out = Vec::new();
    match &spec.value {
        Desired::Text(v) => {
            if current != Some(v.as_str()) {
                out.push(staged(1, 0, v.clone()));
            }
        }
        Desired::List(want) => {
            let have: CpuSet = current.and_then(|c| c.parse().ok()).unwrap_or_default();
            if &have == want {
                return Some(out);
            }
            let d = spec.group.depth();
            if !want.is_subset(&have) {
                let wide = have.union(want);
                out.push(staged(0, d, wide.to_string()));
                if &wide != want {
                    out.push(staged(2, -d, want.to_string()));
                }
            } else {
                out.push(staged(2, -d, want.to_string()));
            }
        }
        _ => return None,
    }
    Some(out)
}

/// The write for a memory limit (phase 1), rounded to pages as the kernel does; `unlimited` is
/// the driver's text for no limit. With `memsw` (v1's memory + swap, which must stay at or
/// above the limit) the file goes first when the limit rises; any other goes first when it
/// falls.
pub fn stage_memory(
    want: Option<u64>,
    current: Option<&str>,
    unlimited: &str,
    memsw: bool,
    page: u64,
) -> Vec<Staged> {
    let have = current.and_then(parse_memory).flatten();
    let want_rounded = want.map(|w| w / page * page);
    if have == want_rounded && current.is_some() {
        return Vec::new();
    }
    let value = want_rounded
        .map(|v| v.to_string())
        .unwrap_or_else(|| unlimited.to_string());
    let raising = want_rounded.unwrap_or(u64::MAX) > have.unwrap_or(u64::MAX);
    let order = if memsw == raising { 0 } else { 1 };
    vec![staged(1, order, value)]
}
