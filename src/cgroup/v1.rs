//! The cgroup v1 driver: the abstract limits in v1 control files.
//!
//! Layout per tenant in each v1 hierarchy: `<root>/<tenant>/{limited,exempt}`. Measured on this
//! kernel (6.18, v1 hybrid): blk-throttle limits set on `limited` bind only the processes there
//! and leave `exempt` free; cpu quota and memory limits set on the tenant bind both leaves
//! (CFS bandwidth and memcg are hierarchical). A new cpuset group starts with empty cpus and
//! mems and refuses processes until both are written, so every cpuset group gets both files.
//! Files: Documentation/admin-guide/cgroup-v1/{blkio-controller,cpusets,memory}.rst and
//! scheduler/sched-bwc.rst.

use std::collections::BTreeMap;

use super::model::{Desired, FileSpec, TenantSettings, CPU_PERIOD_US};
use super::{Controller, GroupRef};
use crate::classify::Leaf;
use crate::kernel::{CpuSet, DevNum};

pub const READ_BPS: &str = "blkio.throttle.read_bps_device";
pub const WRITE_BPS: &str = "blkio.throttle.write_bps_device";
pub const READ_IOPS: &str = "blkio.throttle.read_iops_device";
pub const WRITE_IOPS: &str = "blkio.throttle.write_iops_device";
/// The four per-device throttle files, in `IoLimits` key order.
pub const IO_LIMIT_FILES: [&str; 4] = [READ_BPS, WRITE_BPS, READ_IOPS, WRITE_IOPS];
pub const CFS_QUOTA: &str = "cpu.cfs_quota_us";
pub const CFS_PERIOD: &str = "cpu.cfs_period_us";
pub const SHARES: &str = "cpu.shares";
pub const CPUS: &str = "cpuset.cpus";
pub const MEMS: &str = "cpuset.mems";
pub const MEM_LIMIT: &str = "memory.limit_in_bytes";
pub const MEM_SOFT: &str = "memory.soft_limit_in_bytes";
pub const MEMSW_LIMIT: &str = "memory.memsw.limit_in_bytes";

/// The files this driver manages in a group of a hierarchy with these controllers.
pub fn managed_files(controllers: &[Controller]) -> Vec<&'static str> {
    let mut out = Vec::new();
    for c in controllers {
        out.extend_from_slice(match c {
            Controller::Io => &[READ_BPS, WRITE_BPS, READ_IOPS, WRITE_IOPS][..],
            Controller::Cpu => &[CFS_QUOTA, CFS_PERIOD, SHARES][..],
            Controller::Cpuset => &[CPUS, MEMS][..],
            Controller::Memory => &[MEM_LIMIT, MEM_SOFT, MEMSW_LIMIT][..],
            Controller::Cpuacct => &[][..],
        });
    }
    out
}

/// v1 cpu.shares for a v2-style weight: 100 ↔ 1024 (the defaults), clamped to the kernel's range.
pub fn weight_to_shares(weight: u32) -> u64 {
    ((weight as u64 * 1024) / 100).clamp(2, 262_144)
}

/// The files for the root group: cpuset needs cpus and mems before any child can have them.
pub fn root_files(parent_cpus: &CpuSet, parent_mems: &CpuSet) -> Vec<FileSpec> {
    vec![
        FileSpec {
            controller: Controller::Cpuset,
            group: GroupRef::Root,
            file: CPUS,
            value: Desired::List(parent_cpus.clone()),
        },
        FileSpec {
            controller: Controller::Cpuset,
            group: GroupRef::Root,
            file: MEMS,
            value: Desired::List(parent_mems.clone()),
        },
    ]
}

/// The files that express one tenant's settings. `has_memsw` says whether swap accounting exists.
pub fn tenant_files(tenant: &str, s: &TenantSettings, has_memsw: bool) -> Vec<FileSpec> {
    let t = GroupRef::Tenant(tenant.to_string());
    let limited = GroupRef::Leaf(tenant.to_string(), Leaf::Limited);
    let exempt = GroupRef::Leaf(tenant.to_string(), Leaf::Exempt);
    let mut out = Vec::new();
    let mut push = |controller, group: &GroupRef, file, value| {
        out.push(FileSpec {
            controller,
            group: group.clone(),
            file,
            value,
        });
    };

    // IO on the limited leaf; the exempt leaf is kept explicitly free.
    let per = |f: fn(&crate::policy::IoLimits) -> Option<u64>| -> BTreeMap<DevNum, u64> {
        s.io.iter()
            .filter_map(|(d, l)| f(l).map(|v| (*d, v)))
            .collect()
    };
    for (file, map) in [
        (READ_BPS, per(|l| l.read_bps)),
        (WRITE_BPS, per(|l| l.write_bps)),
        (READ_IOPS, per(|l| l.read_iops)),
        (WRITE_IOPS, per(|l| l.write_iops)),
    ] {
        push(Controller::Io, &limited, file, Desired::Devices(map));
        push(
            Controller::Io,
            &exempt,
            file,
            Desired::Devices(BTreeMap::new()),
        );
    }

    // CPU bandwidth and weight on the tenant (both leaves share them).
    let quota = match s.cpu_cores {
        Some(c) => ((c * CPU_PERIOD_US as f64).round() as i64).to_string(),
        None => "-1".to_string(),
    };
    push(
        Controller::Cpu,
        &t,
        CFS_PERIOD,
        Desired::Text(CPU_PERIOD_US.to_string()),
    );
    push(Controller::Cpu, &t, CFS_QUOTA, Desired::Text(quota));
    push(
        Controller::Cpu,
        &t,
        SHARES,
        Desired::Text(weight_to_shares(s.cpu_weight).to_string()),
    );

    // cpuset on the tenant and on both leaves (v1 children start empty).
    for g in [&t, &limited, &exempt] {
        push(Controller::Cpuset, g, CPUS, Desired::List(s.cpus.clone()));
        push(Controller::Cpuset, g, MEMS, Desired::List(s.mems.clone()));
    }

    // Memory on the tenant. v1 has no memory.low; high maps to the soft limit (reclaimed under
    // global pressure, not throttled as v2's memory.high is); swap is memsw = memory + swap.
    push(
        Controller::Memory,
        &t,
        MEM_LIMIT,
        Desired::Memory(s.memory_max),
    );
    push(
        Controller::Memory,
        &t,
        MEM_SOFT,
        Desired::Memory(s.memory_high),
    );
    if has_memsw {
        let memsw = match (s.memory_max, s.memory_swap_max) {
            (Some(max), Some(swap)) => Some(max.saturating_add(swap)),
            _ => None,
        };
        push(Controller::Memory, &t, MEMSW_LIMIT, Desired::Memory(memsw));
    }
    out
}

/// Parses a v1 throttle file: one `MAJ:MIN VALUE` line per limited device.
pub fn parse_device_lines(text: &str) -> BTreeMap<DevNum, u64> {
    text.lines()
        .filter_map(|l| {
            let (d, v) = l.trim().split_once(' ')?;
            Some((d.parse().ok()?, v.trim().parse().ok()?))
        })
        .collect()
}

/// v1 reads "no limit" back as the largest page-aligned counter value; anything this large
/// is unlimited for comparison.
pub const UNLIMITED_THRESHOLD: u64 = 1 << 62;

/// One write for a device entry: `MAJ:MIN VALUE`, or `MAJ:MIN 0` to clear it.
pub fn device_line(dev: DevNum, value: Option<u64>) -> String {
    format!("{dev} {}", value.unwrap_or(0))
}

/// The text to write for an unlimited memory value.
pub const MEMORY_UNLIMITED: &str = "-1";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_weight() {
        assert_eq!(weight_to_shares(100), 1024);
        assert_eq!(weight_to_shares(1), 10);
        assert_eq!(weight_to_shares(10000), 102_400);
    }

    #[test]
    fn device_lines_round_trip() {
        let m = parse_device_lines("7:0 4194304\n7:1 4194304\n");
        assert_eq!(m.len(), 2);
        assert_eq!(
            device_line(DevNum::new(7, 0), m.get(&DevNum::new(7, 0)).copied()),
            "7:0 4194304"
        );
        assert_eq!(device_line(DevNum::new(7, 2), None), "7:2 0");
    }
}
