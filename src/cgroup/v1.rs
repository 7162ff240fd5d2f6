//! The cgroup v1 driver: the abstract limits in v1 control files.
//!
//! Layout per tenant in each v1 hierarchy: `<root>/<tenant>/{limited,exempt}`. Measured on this
//! kernel (6.18, v1 hybrid): blk-throttle limits set on `limited` bind only the processes there
//! and leave `exempt` free; cpu quota and memory limits set on the tenant bind both leaves
//! (CFS bandwidth and memcg are hierarchical). A new cpuset group starts with empty cpus and
//! mems and refuses processes until both are written, so every cpuset group gets both files.
//! Files: Documentation/admin-guide/cgroup-v1/{blkio-controller,cpusets,memory}.rst and
//! scheduler/sched-bwc.rst.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::hostfs::OpenDir;

use super::driver::{Driver, SpecInput, Staged};
use super::model::{
    parse_memory, stage_common, stage_memory, Desired, FileSpec, TenantSettings, CPU_PERIOD_US,
};
use super::stats::{parse_flat_keyed, CpuUsage, IoCounters, MemoryUsage, PressureSet};
use super::{Controller, GroupRef, Layout, Snapshot, Version};
use crate::classify::Leaf;
use crate::kernel::{CpuSet, DevNum};
use crate::policy::{IoLimits, Tenant};

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
/// 1: pages of the group's processes follow a change of `cpuset.mems` (v2 always does this).
pub const MEMORY_MIGRATE: &str = "cpuset.memory_migrate";
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
            Controller::Cpuset => &[CPUS, MEMS, MEMORY_MIGRATE][..],
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
        if s.migrate_memory {
            // a Text write (phase 1) precedes the narrowing of mems (phase 2) that moves pages
            push(
                Controller::Cpuset,
                g,
                MEMORY_MIGRATE,
                Desired::Text("1".into()),
            );
        }
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

// ---- read back: usage counters

/// Parses v1 `blkio.throttle.io_service_bytes[_recursive]` / `io_serviced[_recursive]`:
/// `MAJ:MIN Read N`, `MAJ:MIN Write N`, ... and a closing `Total N`.
pub fn parse_v1_blkio(text: &str) -> BTreeMap<DevNum, (u64, u64)> {
    let mut out: BTreeMap<DevNum, (u64, u64)> = BTreeMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(dev), Some(op), Some(v)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (Ok(dev), Ok(v)) = (dev.parse::<DevNum>(), v.parse::<u64>()) else {
            continue;
        };
        let e = out.entry(dev).or_default();
        match op {
            "Read" => e.0 = v,
            "Write" => e.1 = v,
            _ => {}
        }
    }
    out
}

/// Per-device IO of a v1 blkio group, its children included.
pub fn v1_io(dir: &OpenDir) -> BTreeMap<DevNum, IoCounters> {
    let read = |f: &str| dir.read(f).map(|t| parse_v1_blkio(&t)).unwrap_or_default();
    let bytes = read("blkio.throttle.io_service_bytes_recursive");
    let ios = read("blkio.throttle.io_serviced_recursive");
    let mut out: BTreeMap<DevNum, IoCounters> = BTreeMap::new();
    for (d, (r, w)) in bytes {
        let e = out.entry(d).or_default();
        e.read_bytes = r;
        e.write_bytes = w;
    }
    for (d, (r, w)) in ios {
        let e = out.entry(d).or_default();
        e.read_ios = r;
        e.write_ios = w;
    }
    out.retain(|_, c| *c != IoCounters::default());
    out
}

pub fn v1_cpu(cpu_dir: Option<&OpenDir>, cpuacct_dir: Option<&OpenDir>) -> CpuUsage {
    let stat = cpu_dir
        .and_then(|d| d.read("cpu.stat").ok())
        .map(|t| parse_flat_keyed(&t))
        .unwrap_or_default();
    CpuUsage {
        usage_seconds: cpuacct_dir
            .and_then(|d| d.read_u64("cpuacct.usage"))
            .map(|ns| ns as f64 / 1e9),
        nr_periods: stat.get("nr_periods").copied(),
        nr_throttled: stat.get("nr_throttled").copied(),
        throttled_seconds: stat.get("throttled_time").map(|ns| *ns as f64 / 1e9),
    }
}

/// Memory usage of a v1 group. `oom_kill` in memory.oom_control counts only the kills of tasks in
/// that very group (measured on 6.18: a kill in `a/limited` under a limit set on `a` shows in
/// `a/limited` alone), and a tenant's processes live in its leaves, so the group's count and its
/// child groups' counts are added up.
pub fn v1_memory(dir: &OpenDir) -> MemoryUsage {
    let oom_kill = |file: &str| {
        dir.read(file)
            .ok()
            .and_then(|t| parse_flat_keyed(&t).get("oom_kill").copied())
    };
    // The group's own first: a read tells a kept descriptor of a removed group (`OpenDir`)
    // before its listing is taken.
    let own = oom_kill("memory.oom_control");
    let children =
        (dir.subdirs().into_iter()).filter_map(|d| oom_kill(&format!("{d}/memory.oom_control")));
    let oom_kills = own.into_iter().chain(children).reduce(|a, b| a + b);
    MemoryUsage {
        current_bytes: dir.read_u64("memory.usage_in_bytes"),
        peak_bytes: dir.read_u64("memory.max_usage_in_bytes"),
        limit_hits: dir.read_u64("memory.failcnt"),
        oom_kills,
        ..Default::default()
    }
}

// ---- the driver

/// The cgroup v1 driver (see the module comment).
pub struct V1;

/// Whether the v1 memory hierarchy has swap accounting (its parent has memsw files).
fn has_memsw(layout: &Layout, snap: &Snapshot) -> bool {
    layout
        .setup
        .hierarchy_of(Controller::Memory)
        .is_some_and(|h| {
            layout.setup.hierarchies[h].version == Version::V1
                && snap.file(&layout.parents[h].join(MEMSW_LIMIT)).is_some()
        })
}

impl Driver for V1 {
    fn name(&self) -> &'static str {
        "v1"
    }

    fn managed_files(&self, controllers: &[Controller]) -> Vec<&'static str> {
        managed_files(controllers)
    }

    fn specs_of_every_kind(&self) -> Vec<FileSpec> {
        let every = TenantSettings {
            migrate_memory: true,
            ..TenantSettings::default()
        };
        let mut out = root_files(&CpuSet::default(), &CpuSet::default());
        out.extend(tenant_files("every", &every, true));
        out
    }

    fn read_parent(&self, parent: &Path, controllers: &[Controller], snap: &mut Snapshot) {
        if controllers.contains(&Controller::Memory) {
            // Swap accounting: the parent has memsw files only when it is on.
            let memsw = parent.join(MEMSW_LIMIT);
            if let Ok(v) = crate::hostfs::read_text(&memsw) {
                snap.files.insert(memsw, v);
            }
        }
        if controllers.contains(&Controller::Cpuset) {
            let read = |f: &str| {
                crate::hostfs::read_text(parent.join(f))
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
            };
            snap.parent_cpus = read("cpuset.effective_cpus").or_else(|| read(CPUS));
            snap.parent_mems = read("cpuset.effective_mems").or_else(|| read(MEMS));
        }
    }

    fn io_protection_warnings(
        &self,
        t: &Tenant,
        _devices: &[DevNum],
        _layout: &Layout,
        _snap: &Snapshot,
    ) -> Vec<String> {
        let keys: Vec<&str> = [
            ("io.weight", t.io_weight.is_some()),
            ("io.latency_target", t.io_latency_target.is_some()),
            ("io.protect_pressure", t.io_guard.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect();
        if keys.is_empty() {
            return Vec::new();
        }
        let keys = match keys.as_slice() {
            [.., last] if keys.len() > 2 => {
                format!("{} and {last}", keys[..keys.len() - 1].join(", "))
            }
            _ => keys.join(" and "),
        };
        let many = keys.contains(" and ");
        vec![format!(
            "tenant `{}`: {} {} no effect on this host: the IO controller is a cgroup v1 hierarchy (blkio), which has neither iocost weights nor latency targets nor per-group pressure (blkio.weight works only under the BFQ scheduler and dbcage does not set it); dbcage writes nothing for {}. It works with the io controller on cgroup v2 (boot with systemd.unified_cgroup_hierarchy=1, or leave io out of the v1 mounts so that a cgroup2 mount gets it) and, for io.weight, iocost enabled on the disk (`MAJ:MIN enable=1` in the root's io.cost.qos)",
            t.name,
            keys,
            if many { "have" } else { "has" },
            if many { "them" } else { "it" },
        )]
    }

    fn memory_warnings(&self, t: &Tenant, layout: &Layout, snap: &Snapshot) -> Vec<String> {
        let mut warnings = Vec::new();
        if t.memory.low.is_some() {
            warnings.push(format!("tenant `{}`: memory.low has no cgroup v1 equivalent and is not applied on this host", t.name));
        }
        if t.memory.high.is_some() {
            warnings.push(format!(
                "tenant `{}`: on cgroup v1 memory.high becomes memory.soft_limit_in_bytes, which only guides reclaim under host-wide memory pressure",
                t.name
            ));
        }
        if t.memory.swap_max.is_some() && !has_memsw(layout, snap) {
            warnings.push(format!(
                "tenant `{}`: memory.swap_max needs swap accounting (memory.memsw.*, boot with swapaccount=1); not applied",
                t.name
            ));
        }
        if t.memory.swap_max.is_some() && t.memory.max.is_none() {
            warnings.push(format!(
                "tenant `{}`: on cgroup v1 memory.swap_max applies only together with memory.max",
                t.name
            ));
        }
        warnings
    }

    fn specs(&self, input: &SpecInput) -> Vec<FileSpec> {
        let mut out = root_files(input.allowed_cpus, input.allowed_mems);
        let memsw = has_memsw(input.layout, input.snap);
        for (name, settings) in &input.tenants {
            out.extend(tenant_files(name, settings, memsw));
        }
        out
    }

    fn leaf_io_files(&self, settings: &TenantSettings) -> Vec<FileSpec> {
        super::model::limited_io(tenant_files("", settings, false))
    }

    fn stage(&self, spec: &FileSpec, current: Option<&str>, page: u64) -> Vec<Staged> {
        if let Some(s) = stage_common(spec, current) {
            return s;
        }
        match &spec.value {
            Desired::Memory(want) => stage_memory(
                *want,
                current,
                MEMORY_UNLIMITED,
                spec.file == MEMSW_LIMIT,
                page,
            ),
            Desired::Devices(want) => {
                let have = current.map(parse_device_lines).unwrap_or_default();
                let devs: BTreeSet<DevNum> = want.keys().chain(have.keys()).copied().collect();
                let mut out = Vec::new();
                for d in devs {
                    let (w, c) = (want.get(&d).copied(), have.get(&d).copied());
                    if w == c {
                        continue;
                    }
                    // Lowering (including a new limit on an unlimited device) before raising
                    // (including clearing a limit).
                    let lowering = w.unwrap_or(u64::MAX) < c.unwrap_or(u64::MAX);
                    out.push(Staged {
                        phase: if lowering { 1 } else { 3 },
                        order: 0,
                        value: device_line(d, w),
                    });
                }
                out
            }
            // v2 kinds never come from this driver's specs.
            _ => Vec::new(),
        }
    }

    /// kernel/sched/core.c gives a new cpu group a period of 100 ms (default_cfs_period), no
    /// quota (RUNTIME_INF) and the shares of nice 0 (1024); memcg starts every limit at
    /// PAGE_COUNTER_MAX (read back as unlimited). A bandwidth write is not free: each walks
    /// every cpu group of the host (tg_set_bandwidth's schedulability check), which made the
    /// three cpu writes into each of 1,000 new tenants a sixth of the daemon's time to ready.
    fn new_group_value(&self, file: &str) -> Option<&'static str> {
        match file {
            CFS_PERIOD => Some("100000"),
            CFS_QUOTA => Some("-1"),
            SHARES => Some("1024"),
            MEM_LIMIT | MEM_SOFT | MEMSW_LIMIT => Some("-1"),
            _ => None,
        }
    }

    fn limits_buffered_writes(&self) -> bool {
        false
    }

    fn io_limits(&self, group: &OpenDir) -> BTreeMap<DevNum, IoLimits> {
        let mut limits: BTreeMap<DevNum, IoLimits> = BTreeMap::new();
        for (k, file) in IO_LIMIT_FILES.into_iter().enumerate() {
            let text = group.read(file).unwrap_or_default();
            for (d, v) in parse_device_lines(&text) {
                limits.entry(d).or_default().set_key(k, Some(v));
            }
        }
        limits
    }

    fn io_usage(&self, group: &OpenDir) -> BTreeMap<DevNum, IoCounters> {
        v1_io(group)
    }

    fn cpu_usage(&self, cpu: Option<&OpenDir>, cpuacct: Option<&OpenDir>) -> CpuUsage {
        v1_cpu(cpu, cpuacct)
    }

    fn cpu_quota(&self, group: &OpenDir) -> Option<f64> {
        let q: i64 = group.read(CFS_QUOTA).ok()?.trim().parse().ok()?;
        let p = group.read_u64(CFS_PERIOD)?;
        (q > 0).then(|| q as f64 / p as f64)
    }

    fn memory_usage(&self, group: &OpenDir) -> MemoryUsage {
        v1_memory(group)
    }

    fn memory_limit(&self, group: &OpenDir) -> Option<u64> {
        parse_memory(&group.read(MEM_LIMIT).ok()?).flatten()
    }

    fn memory_high(&self, group: &OpenDir) -> Option<u64> {
        parse_memory(&group.read(MEM_SOFT).ok()?).flatten()
    }

    fn pressure(&self, _group: &OpenDir) -> Option<PressureSet> {
        None // v1 keeps pressure per host only
    }
}

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
