//! The abstract limit model the plan produces and the drivers encode, and the desired value of
//! one control file, which knows how to compare itself with what the kernel reads back.

use std::collections::BTreeMap;

use serde::Serialize;

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

/// One control file of one group, and the value it should hold.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileSpec {
    pub controller: Controller,
    pub group: GroupRef,
    pub file: &'static str,
    pub value: Desired,
}
