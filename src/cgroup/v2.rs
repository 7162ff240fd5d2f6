//! The cgroup v2 driver: the abstract limits in v2 control files.
//!
//! Layout per tenant: `<parent>/<root>/<tenant>/{limited,exempt}` in the one unified hierarchy.
//! v2 rules this driver follows (Documentation/admin-guide/cgroup-v2.rst):
//! - a controller's files appear in a group only when the controller is enabled in its
//!   parent's `cgroup.subtree_control`, so dbcage enables its controllers in the subtree_control
//!   of dbcage's parent cgroup, of its root group and of each tenant group (never of a leaf), in
//!   that order, before any limit is written;
//! - no internal processes: a group with controllers enabled for its children holds no
//!   processes (the hierarchy root excepted), so processes live only in the leaves, and the
//!   parent must have no processes of its own (a delegated, empty cgroup) unless it is the root;
//! - children inherit cpuset: `cpuset.cpus`/`cpuset.mems` are written on the tenant only (an
//!   empty child set means "the parent's effective set").
//!
//! Limits: `io.max` on the `limited` leaf (the exempt leaf keeps an empty io.max); `cpu.max`,
//! `cpu.weight`, the cpuset and the memory files on the tenant, which bind both leaves.
//! `io.weight` and `io.latency` are on the tenant too: both act between siblings (iocost splits
//! a disk among the children of a group by weight; blk-iolatency throttles the peers of a group
//! that misses its target), and the tenants are the siblings that compete. io.weight has effect
//! only on disks where iocost is enabled (`MAJ:MIN enable=1` in the root's `io.cost.qos`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::hostfs::OpenDir;

use super::driver::{Driver, IoProtection, SpecInput, Staged};
use super::model::{
    parse_memory, stage_common, stage_memory, Desired, FileSpec, TenantSettings, CPU_PERIOD_US,
};
use super::stats::{
    parse_flat_keyed, read_pressure, CpuUsage, IoCounters, MemoryUsage, PressureSet,
};
use super::{Controller, GroupRef, Hierarchy, Layout, Snapshot, Version};
use crate::classify::Leaf;
use crate::kernel::DevNum;
use crate::policy::{IoLimits, Tenant};

pub const IO_MAX: &str = "io.max";
pub const IO_WEIGHT: &str = "io.weight";
pub const IO_LATENCY: &str = "io.latency";
/// iocost's per-disk switch and QoS, on the hierarchy's root only.
pub const IO_COST_QOS: &str = "io.cost.qos";
/// iocost's per-disk cost model, on the hierarchy's root only.
pub const IO_COST_MODEL: &str = "io.cost.model";
/// The group's IO pressure (PSI): averages, the stall total, and where triggers are set.
pub const IO_PRESSURE: &str = "io.pressure";
pub const CPU_PRESSURE: &str = "cpu.pressure";
/// io.weight's value when none is set.
pub const DEFAULT_IO_WEIGHT: u32 = 100;
pub const CPU_MAX: &str = "cpu.max";
pub const CPU_WEIGHT: &str = "cpu.weight";
pub const CPUS: &str = "cpuset.cpus";
pub const MEMS: &str = "cpuset.mems";
pub const CPUS_EFFECTIVE: &str = "cpuset.cpus.effective";
pub const MEMS_EFFECTIVE: &str = "cpuset.mems.effective";
pub const MEM_MAX: &str = "memory.max";
pub const MEM_HIGH: &str = "memory.high";
pub const MEM_LOW: &str = "memory.low";
pub const MEM_SWAP_MAX: &str = "memory.swap.max";
pub const SUBTREE_CONTROL: &str = "cgroup.subtree_control";
pub const CONTROLLERS_FILE: &str = "cgroup.controllers";
pub const PROCS: &str = "cgroup.procs";

/// The text v2 reads and writes for "no limit".
pub const UNLIMITED: &str = "max";

/// The files this driver manages in a group of the v2 hierarchy with these controllers
/// (`cgroup.subtree_control` is read separately: it is not tied to one controller).
pub fn managed_files(controllers: &[Controller]) -> Vec<&'static str> {
    let mut out = Vec::new();
    for c in controllers {
        out.extend_from_slice(match c {
            Controller::Io => &[IO_MAX, IO_WEIGHT, IO_LATENCY][..],
            Controller::Cpu => &[CPU_MAX, CPU_WEIGHT][..],
            Controller::Cpuset => &[CPUS, MEMS][..],
            Controller::Memory => &[MEM_MAX, MEM_HIGH, MEM_LOW, MEM_SWAP_MAX][..],
            Controller::Cpuacct => &[][..],
        });
    }
    out
}

/// The controllers dbcage enables for its groups' children: those it drives on v2 and that
/// the parent offers (its `cgroup.controllers`), in the kernel's usual order.
pub fn controllers_to_enable(
    v2_controllers: &[Controller],
    parent_offers: &str,
) -> Vec<&'static str> {
    [
        Controller::Cpuset,
        Controller::Cpu,
        Controller::Io,
        Controller::Memory,
    ]
    .into_iter()
    .filter(|c| v2_controllers.contains(c))
    .filter_map(|c| c.v2_name())
    .filter(|n| parent_offers.split_whitespace().any(|a| a == *n))
    .collect()
}

/// The `cgroup.subtree_control` files: dbcage's parent, its root and each tenant (not the
/// leaves, which hold the processes). `enable` lists v2 controller names; the spec is tagged
/// with the first controller so that it lands in the v2 hierarchy.
pub fn root_files(enable: &[&'static str], tenants: &[&str]) -> Vec<FileSpec> {
    let Some(controller) = enable.first().and_then(|n| controller_of(n)) else {
        return Vec::new();
    };
    let mut groups = vec![GroupRef::Parent, GroupRef::Root];
    groups.extend(tenants.iter().map(|t| GroupRef::Tenant(t.to_string())));
    groups
        .into_iter()
        .map(|group| FileSpec {
            controller,
            group,
            file: SUBTREE_CONTROL,
            value: Desired::Controllers(enable.to_vec()),
        })
        .collect()
}

fn controller_of(v2_name: &str) -> Option<Controller> {
    super::CONTROLLERS
        .iter()
        .copied()
        .find(|c| c.v2_name() == Some(v2_name))
}

/// The files that express one tenant's settings. `has_swap` says whether `memory.swap.max`
/// exists (swap accounting on) or is asked for.
pub fn tenant_files(tenant: &str, s: &TenantSettings, has_swap: bool) -> Vec<FileSpec> {
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
    push(
        Controller::Io,
        &limited,
        IO_MAX,
        Desired::IoMax(s.io.clone()),
    );
    push(
        Controller::Io,
        &exempt,
        IO_MAX,
        Desired::IoMax(BTreeMap::new()),
    );

    push(
        Controller::Cpu,
        &t,
        CPU_MAX,
        Desired::Text(cpu_max(s.cpu_cores)),
    );
    push(
        Controller::Cpu,
        &t,
        CPU_WEIGHT,
        Desired::Text(s.cpu_weight.to_string()),
    );
    push(Controller::Cpuset, &t, CPUS, Desired::List(s.cpus.clone()));
    push(Controller::Cpuset, &t, MEMS, Desired::List(s.mems.clone()));

    push(
        Controller::Memory,
        &t,
        MEM_MAX,
        Desired::Memory(s.memory_max),
    );
    push(
        Controller::Memory,
        &t,
        MEM_HIGH,
        Desired::Memory(s.memory_high),
    );
    // memory.low's "none" is 0, not max.
    push(
        Controller::Memory,
        &t,
        MEM_LOW,
        Desired::Memory(Some(s.memory_low.unwrap_or(0))),
    );
    push(
        Controller::Io,
        &t,
        IO_WEIGHT,
        Desired::IoWeight(s.io_weight),
    );
    push(
        Controller::Io,
        &t,
        IO_LATENCY,
        Desired::IoLatency(s.io_latency_us.clone()),
    );
    if has_swap || s.memory_swap_max.is_some() {
        push(
            Controller::Memory,
            &t,
            MEM_SWAP_MAX,
            Desired::Memory(s.memory_swap_max),
        );
    }
    out
}

/// `cpu.max` for a quota in cores: `QUOTA PERIOD` or `max PERIOD`.
pub fn cpu_max(cores: Option<f64>) -> String {
    match cores {
        Some(c) => format!(
            "{} {CPU_PERIOD_US}",
            (c * CPU_PERIOD_US as f64).round() as u64
        ),
        None => format!("{UNLIMITED} {CPU_PERIOD_US}"),
    }
}

/// `cpu.max` as cores (`None` = unlimited or unreadable).
pub fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut f = text.split_whitespace();
    let quota: u64 = f.next()?.parse().ok()?;
    let period: u64 = f.next()?.parse().ok()?;
    (period > 0).then(|| quota as f64 / period as f64)
}

/// Parses `io.max`: `MAJ:MIN rbps=N wbps=N riops=N wiops=N` per limited device, `max` for an
/// unset key. Devices with every key at max are left out (the kernel does not list them).
pub fn parse_io_max(text: &str) -> BTreeMap<DevNum, IoLimits> {
    let mut out = BTreeMap::new();
    for (dev, pairs) in device_lines(text) {
        let mut l = IoLimits::default();
        for (k, v) in pairs {
            let v = v.parse::<u64>().ok(); // `max` is no limit
            match k {
                "rbps" => l.read_bps = v,
                "wbps" => l.write_bps = v,
                "riops" => l.read_iops = v,
                "wiops" => l.write_iops = v,
                _ => {}
            }
        }
        if !l.is_empty() {
            out.insert(dev, l);
        }
    }
    out
}

/// The lines of a v2 per-device keyed file (`io.max`, `io.stat`): `MAJ:MIN key=value ...`, as
/// the device and its pairs; lines that do not start with a device number are skipped.
pub fn device_lines(
    text: &str,
) -> impl Iterator<Item = (DevNum, impl Iterator<Item = (&str, &str)>)> {
    text.lines().filter_map(|line| {
        let mut f = line.split_whitespace();
        let dev = f.next()?.parse::<DevNum>().ok()?;
        Some((dev, f.filter_map(|kv| kv.split_once('='))))
    })
}

/// One `io.max` write: every key of the device, `max` for the unset ones (so a device to clear
/// gets four `max`).
pub fn io_max_line(dev: DevNum, l: &IoLimits) -> String {
    let v = |x: Option<u64>| x.map(|n| n.to_string()).unwrap_or_else(|| UNLIMITED.into());
    format!(
        "{dev} rbps={} wbps={} riops={} wiops={}",
        v(l.read_bps),
        v(l.write_bps),
        v(l.read_iops),
        v(l.write_iops)
    )
}

/// The per-key minimum of two limit sets (an unset key is unlimited).
pub fn io_min(a: &IoLimits, b: &IoLimits) -> IoLimits {
    let m = |x: Option<u64>, y: Option<u64>| match (x, y) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (Some(v), None) | (None, Some(v)) => Some(v),
        (None, None) => None,
    };
    IoLimits {
        read_bps: m(a.read_bps, b.read_bps),
        write_bps: m(a.write_bps, b.write_bps),
        read_iops: m(a.read_iops, b.read_iops),
        write_iops: m(a.write_iops, b.write_iops),
    }
}

/// The `default` weight of an `io.weight` text (`default 100`, then `MAJ:MIN WEIGHT` lines).
pub fn parse_io_weight(text: &str) -> Option<u32> {
    text.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == "default").then(|| f.next()?.parse().ok())?
    })
}

/// `io.latency`: `MAJ:MIN target=USECS` per device with a target.
pub fn parse_io_latency(text: &str) -> BTreeMap<DevNum, u64> {
    device_lines(text)
        .filter_map(|(dev, mut pairs)| {
            pairs
                .find(|(k, _)| *k == "target")
                .and_then(|(_, v)| v.parse().ok())
                .map(|v| (dev, v))
        })
        .collect()
}

/// The disks on which iocost is enabled, from the root's `io.cost.qos` (a disk is listed once
/// iocost was configured for it, with `enable=0` or `enable=1`).
pub fn iocost_enabled(qos: &str) -> BTreeSet<DevNum> {
    device_lines(qos)
        .filter_map(|(dev, mut pairs)| pairs.any(|kv| kv == ("enable", "1")).then_some(dev))
        .collect()
}

/// The controllers a `cgroup.subtree_control` (or `cgroup.controllers`) text lists.
pub fn parse_controllers(text: &str) -> Vec<&str> {
    text.split_whitespace().collect()
}

/// The write that enables the controllers of `want` missing from `have`: `+io +cpu ...`.
pub fn enable_line(want: &[&str], have: &str) -> Option<String> {
    let have = parse_controllers(have);
    let missing: Vec<String> = want
        .iter()
        .filter(|w| !have.contains(w))
        .map(|w| format!("+{w}"))
        .collect();
    (!missing.is_empty()).then(|| missing.join(" "))
}

// ---- read back: usage counters

/// Parses v2 `io.stat`: `MAJ:MIN rbytes=N wbytes=N rios=N wios=N dbytes=N dios=N` per device.
pub fn parse_v2_io_stat(text: &str) -> BTreeMap<DevNum, IoCounters> {
    let mut out = BTreeMap::new();
    for (dev, pairs) in device_lines(text) {
        let mut c = IoCounters::default();
        for (k, v) in pairs {
            let Ok(v) = v.parse::<u64>() else { continue };
            match k {
                "rbytes" => c.read_bytes = v,
                "wbytes" => c.write_bytes = v,
                "rios" => c.read_ios = v,
                "wios" => c.write_ios = v,
                _ => {}
            }
        }
        out.insert(dev, c);
    }
    out
}

/// Per-device IO of a v2 group; io.stat counts the group's descendants too.
pub fn v2_io(dir: &OpenDir) -> BTreeMap<DevNum, IoCounters> {
    let mut out = dir
        .read("io.stat")
        .map(|t| parse_v2_io_stat(&t))
        .unwrap_or_default();
    out.retain(|_, c| *c != IoCounters::default());
    out
}

/// CPU usage from a v2 `cpu.stat` text (`usage_usec`, `nr_periods`, `nr_throttled`,
/// `throttled_usec`; the last three only with the cpu controller enabled).
pub fn parse_v2_cpu_stat(text: &str) -> CpuUsage {
    let stat = parse_flat_keyed(text);
    CpuUsage {
        usage_seconds: stat.get("usage_usec").map(|us| *us as f64 / 1e6),
        nr_periods: stat.get("nr_periods").copied(),
        nr_throttled: stat.get("nr_throttled").copied(),
        throttled_seconds: stat.get("throttled_usec").map(|us| *us as f64 / 1e6),
    }
}

/// CPU usage of a v2 group, its descendants included.
pub fn v2_cpu(dir: &OpenDir) -> CpuUsage {
    dir.read("cpu.stat")
        .map(|t| parse_v2_cpu_stat(&t))
        .unwrap_or_default()
}

/// Memory usage of a v2 group: memory.current, memory.peak (6.1 has it on non-root groups) and
/// memory.events, which counts the group's descendants too (unless the hierarchy is mounted with
/// memory_localevents).
pub fn v2_memory(dir: &OpenDir) -> MemoryUsage {
    let events = dir
        .read("memory.events")
        .map(|t| parse_flat_keyed(&t))
        .unwrap_or_default();
    v2_memory_from(
        dir.read_u64("memory.current"),
        dir.read_u64("memory.peak"),
        &events,
    )
}

pub(crate) fn v2_memory_from(
    current: Option<u64>,
    peak: Option<u64>,
    events: &BTreeMap<String, u64>,
) -> MemoryUsage {
    MemoryUsage {
        current_bytes: current,
        peak_bytes: peak,
        limit_hits: events.get("max").copied(),
        oom_kills: events.get("oom_kill").copied(),
        ooms: events.get("oom").copied(),
        high_events: events.get("high").copied(),
    }
}

// ---- the driver

/// The cgroup v2 driver (see the module comment).
pub struct V2;

/// The unified hierarchy's index in the layout.
fn hierarchy(layout: &Layout) -> Option<usize> {
    layout
        .setup
        .hierarchies
        .iter()
        .position(|h| h.version == Version::V2)
}

/// The controllers dbcage enables for its groups' children: those the parent offers (as the
/// snapshot read it, else as the hierarchy lists them).
fn to_enable(layout: &Layout, hv: usize, snap: &Snapshot) -> Vec<&'static str> {
    let hier = &layout.setup.hierarchies[hv];
    let offers = snap
        .file(&layout.parents[hv].join(CONTROLLERS_FILE))
        .map(str::to_string)
        .unwrap_or_else(|| {
            hier.controllers
                .iter()
                .filter_map(|c| c.v2_name())
                .collect::<Vec<_>>()
                .join(" ")
        });
    controllers_to_enable(&hier.controllers, &offers)
}

impl Driver for V2 {
    fn name(&self) -> &'static str {
        "v2"
    }

    fn managed_files(&self, controllers: &[Controller]) -> Vec<&'static str> {
        let mut f = managed_files(controllers);
        f.push(SUBTREE_CONTROL);
        f
    }

    fn specs_of_every_kind(&self) -> Vec<FileSpec> {
        let every = TenantSettings {
            migrate_memory: true,
            memory_swap_max: Some(0),
            ..TenantSettings::default()
        };
        let mut out = root_files(&["cpuset", "cpu", "io", "memory"], &["every"]);
        out.extend(tenant_files("every", &every, true));
        out
    }

    fn read_parent(&self, parent: &Path, controllers: &[Controller], snap: &mut Snapshot) {
        // What the parent offers and already enables for its children.
        for f in [CONTROLLERS_FILE, SUBTREE_CONTROL, PROCS] {
            if let Ok(v) = crate::hostfs::read_text(parent.join(f)) {
                snap.files.insert(parent.join(f), v);
            }
        }
        if controllers.contains(&Controller::Cpuset) {
            let read = |f: &str| {
                crate::hostfs::read_text(parent.join(f))
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
            };
            snap.parent_cpus = read(CPUS_EFFECTIVE);
            snap.parent_mems = read(MEMS_EFFECTIVE);
        }
    }

    fn read_hierarchy_root(&self, hier: &Hierarchy, snap: &mut Snapshot) {
        if !hier.controllers.contains(&Controller::Io) {
            return;
        }
        let qos = hier.mount_point.join(IO_COST_QOS);
        if let Ok(v) = crate::hostfs::read_text(&qos) {
            snap.files.insert(qos, v);
        }
        // io.latency exists only in non-root groups, and only when the kernel has
        // blk-iolatency (Debian's kernels do not): look at a top-level group with io enabled.
        snap.io_latency = std::fs::read_dir(&hier.mount_point)
            .ok()
            .and_then(|entries| {
                entries
                    .flatten()
                    .take(256)
                    .map(|e| e.path())
                    .find(|d| d.join(IO_MAX).exists())
                    .map(|d| d.join(IO_LATENCY).exists())
            });
    }

    fn io_protection_warnings(
        &self,
        t: &Tenant,
        devices: &[DevNum],
        layout: &Layout,
        snap: &Snapshot,
    ) -> Vec<String> {
        let Some(hv) = hierarchy(layout) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let (Some(l), Some(false)) = (&t.io_latency_target, snap.io_latency) {
            out.push(format!(
                "tenant `{}`: io.latency_target = {:?} has no effect on this host: its kernel has no blk-iolatency (groups with the io controller have no io.latency file: CONFIG_BLK_CGROUP_IOLATENCY is not set, as in Debian's kernels); dbcage writes nothing for it. A kernel built with it would honour the target; io.weight with iocost protects without it",
                t.name, l.value
            ));
        }
        let Some(w) = &t.io_weight else {
            return out;
        };
        let qos_path = layout.setup.hierarchies[hv].mount_point.join(IO_COST_QOS);
        let Some(qos) = snap.file(&qos_path) else {
            out.push(format!(
                "tenant `{}`: io.weight = {} has no effect on this host: its kernel has no iocost controller ({} is missing: CONFIG_BLK_CGROUP_IOCOST), which is what honours io.weight; dbcage writes nothing for it. A kernel built with iocost would honour it (or use io.read_bps/io.write_bps caps here)",
                t.name, w.value, qos_path.display()
            ));
            return out;
        };
        let on = iocost_enabled(qos);
        let off: Vec<String> = devices
            .iter()
            .filter(|d| !on.contains(d))
            .map(|d| d.to_string())
            .collect();
        if off.is_empty() {
            return out;
        }
        out.push(format!(
            "tenant `{}`: io.weight = {} has no effect on {}: iocost is not enabled on {} (no `{} enable=1` in {}), so the kernel keeps io.weight but does not use it there. Enable it with `echo \"{} enable=1\" > {}` (the kernel then models the disk itself; io.cost.model tunes it) (dm and md devices cannot have iocost: set storage_level = \"members\" so that the weight acts on the disks under them)",
            t.name,
            w.value,
            off.join(", "),
            if off.len() == 1 { "that disk" } else { "those disks" },
            off[0],
            qos_path.display(),
            off[0],
            qos_path.display()
        ));
        out
    }

    fn parent_warnings(&self, layout: &Layout, snap: &Snapshot) -> Vec<String> {
        let Some(hv) = hierarchy(layout) else {
            return Vec::new();
        };
        let hier = &layout.setup.hierarchies[hv];
        let enable = to_enable(layout, hv, snap);
        // The no-internal-process rule: a parent (other than the hierarchy root) that holds
        // processes cannot enable controllers for its children.
        let parent = &layout.parents[hv];
        let busy = snap
            .file(&parent.join(PROCS))
            .map_or(0, |t| t.lines().filter(|l| !l.trim().is_empty()).count());
        let needs_enable = enable_line(
            &enable,
            snap.file(&parent.join(SUBTREE_CONTROL)).unwrap_or(""),
        )
        .is_some();
        if busy > 0 && needs_enable && parent != &hier.mount_point {
            return vec![format!(
                "the parent cgroup {} holds {busy} processes of its own, so cgroup v2 will refuse to enable controllers for its children (the no-internal-process rule) and apply will fail; run dbcage under a delegated, empty parent (e.g. a systemd unit with Delegate=yes, dbcage itself in a child group) or set agent.parent to an empty cgroup",
                parent.display()
            )];
        }
        Vec::new()
    }

    fn specs(&self, input: &SpecInput) -> Vec<FileSpec> {
        let Some(hv) = hierarchy(input.layout) else {
            return Vec::new();
        };
        let enable = to_enable(input.layout, hv, input.snap);
        let names: Vec<&str> = input.tenants.iter().map(|(n, _)| *n).collect();
        let mut out = root_files(&enable, &names);
        // Without iocost in the kernel there is no io.weight file to write (the check says so).
        let has_iocost = input
            .snap
            .file(
                &input.layout.setup.hierarchies[hv]
                    .mount_point
                    .join(IO_COST_QOS),
            )
            .is_some();
        for (name, settings) in &input.tenants {
            let has_swap = input
                .snap
                .file(&input.layout.tenant_dir(hv, name).join(MEM_SWAP_MAX))
                .is_some();
            out.extend(
                tenant_files(name, settings, has_swap)
                    .into_iter()
                    .filter(|f| has_iocost || f.file != IO_WEIGHT)
                    .filter(|f| input.snap.io_latency != Some(false) || f.file != IO_LATENCY),
            );
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
        let mut out = Vec::new();
        match &spec.value {
            Desired::Memory(want) => {
                return stage_memory(*want, current, UNLIMITED, false, page);
            }
            Desired::IoMax(want) => {
                let have = current.map(parse_io_max).unwrap_or_default();
                let devs: BTreeSet<DevNum> = want.keys().chain(have.keys()).copied().collect();
                for d in devs {
                    let none = IoLimits::default();
                    let (w, c) = (want.get(&d).unwrap_or(&none), have.get(&d).unwrap_or(&none));
                    if w == c {
                        continue;
                    }
                    // Each key lowered first (phase 1), then raised (phase 3): a line sets all
                    // four keys, so a change that lowers one key and raises another is split.
                    let low = io_min(w, c);
                    if &low != c {
                        out.push(Staged {
                            phase: 1,
                            order: 0,
                            value: io_max_line(d, &low),
                        });
                    }
                    if &low != w {
                        out.push(Staged {
                            phase: 3,
                            order: 0,
                            value: io_max_line(d, w),
                        });
                    }
                }
            }
            Desired::IoWeight(want) => {
                // An absent file is a group still to create (or a kernel without iocost, whose
                // specs leave io.weight out): only a set weight is written to it.
                let have = current.map(|c| parse_io_weight(c).unwrap_or(DEFAULT_IO_WEIGHT));
                let target = want.unwrap_or(DEFAULT_IO_WEIGHT);
                if have.unwrap_or(DEFAULT_IO_WEIGHT) != target || (have.is_none() && want.is_some())
                {
                    out.push(Staged {
                        phase: 1,
                        order: 0,
                        value: format!("default {target}"),
                    });
                }
            }
            Desired::IoLatency(want) => {
                let have = current.map(parse_io_latency).unwrap_or_default();
                let devs: BTreeSet<DevNum> = want.keys().chain(have.keys()).copied().collect();
                for d in devs {
                    match (want.get(&d), have.get(&d)) {
                        (Some(w), c) if Some(w) != c => out.push(Staged {
                            phase: 1,
                            order: 0,
                            value: format!("{d} target={w}"),
                        }),
                        (None, Some(_)) => out.push(Staged {
                            phase: 1,
                            order: 0,
                            value: format!("{d} target={UNLIMITED}"),
                        }),
                        _ => {}
                    }
                }
            }
            Desired::Controllers(want) => {
                // Before every limit, parents first (phase 0, ahead of the cpuset widening).
                if let Some(line) = enable_line(want, current.unwrap_or("")) {
                    out.push(Staged {
                        phase: 0,
                        order: spec.group.depth() - 10,
                        value: line,
                    });
                }
            }
            // v1 kinds never come from this driver's specs.
            _ => {}
        }
        out
    }

    /// cgroup-v2.rst's defaults of a new group: no cpu bandwidth limit (period 100 ms), weight
    /// 100, memory.max/high/swap.max `max`, memory.low 0.
    fn new_group_value(&self, file: &str) -> Option<&'static str> {
        match file {
            CPU_MAX => Some("max 100000"),
            CPU_WEIGHT => Some("100"),
            MEM_MAX | MEM_HIGH | MEM_SWAP_MAX => Some(UNLIMITED),
            MEM_LOW => Some("0"),
            _ => None,
        }
    }

    fn limits_buffered_writes(&self) -> bool {
        true
    }

    fn io_limits(&self, group: &OpenDir) -> BTreeMap<DevNum, IoLimits> {
        group
            .read(IO_MAX)
            .map(|s| parse_io_max(&s))
            .unwrap_or_default()
    }

    fn io_usage(&self, group: &OpenDir) -> BTreeMap<DevNum, IoCounters> {
        v2_io(group)
    }

    fn cpu_usage(&self, cpu: Option<&OpenDir>, _cpuacct: Option<&OpenDir>) -> CpuUsage {
        cpu.map(v2_cpu).unwrap_or_default()
    }

    fn cpu_quota(&self, group: &OpenDir) -> Option<f64> {
        parse_cpu_max(&group.read(CPU_MAX).ok()?)
    }

    fn memory_usage(&self, group: &OpenDir) -> MemoryUsage {
        v2_memory(group)
    }

    fn memory_limit(&self, group: &OpenDir) -> Option<u64> {
        parse_memory(&group.read(MEM_MAX).ok()?).flatten()
    }

    fn memory_high(&self, group: &OpenDir) -> Option<u64> {
        parse_memory(&group.read(MEM_HIGH).ok()?).flatten()
    }

    fn io_protection(&self, group: &OpenDir) -> IoProtection {
        let read = |f: &str| group.read(f).ok();
        IoProtection {
            weight: read(IO_WEIGHT).and_then(|t| parse_io_weight(&t)),
            latency_us: read(IO_LATENCY)
                .map(|t| parse_io_latency(&t))
                .unwrap_or_default(),
        }
    }

    fn pressure(&self, group: &OpenDir) -> Option<PressureSet> {
        Some(read_pressure(group))
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    // Copied from the VM (6.1): io.max of a leaf with an 8 MiB/s read limit on vdb.
    #[test]
    fn io_max_round_trip() {
        let m = parse_io_max("254:16 rbps=8388608 wbps=max riops=max wiops=max\n");
        let l = m[&DevNum::new(254, 16)];
        assert_eq!(l.read_bps, Some(8_388_608));
        assert_eq!(l.write_bps, None);
        assert_eq!(
            io_max_line(DevNum::new(254, 16), &l),
            "254:16 rbps=8388608 wbps=max riops=max wiops=max"
        );
        assert_eq!(
            io_max_line(DevNum::new(254, 32), &IoLimits::default()),
            "254:32 rbps=max wbps=max riops=max wiops=max"
        );
        assert!(parse_io_max("").is_empty());
        assert!(parse_io_max("254:0 rbps=max wbps=max riops=max wiops=max\n").is_empty());
    }

    #[test]
    fn cpu_max_text() {
        assert_eq!(cpu_max(Some(0.5)), "50000 100000");
        assert_eq!(cpu_max(None), "max 100000");
        assert_eq!(parse_cpu_max("50000 100000\n"), Some(0.5));
        assert_eq!(parse_cpu_max("max 100000\n"), None);
    }

    #[test]
    fn controllers() {
        let all = [
            Controller::Io,
            Controller::Cpu,
            Controller::Cpuset,
            Controller::Memory,
        ];
        assert_eq!(
            controllers_to_enable(&all, "cpuset cpu io memory hugetlb pids rdma misc\n"),
            vec!["cpuset", "cpu", "io", "memory"]
        );
        assert_eq!(
            controllers_to_enable(&all, "cpu io pids"),
            vec!["cpu", "io"]
        );
        assert_eq!(
            enable_line(&["cpu", "io", "memory"], "cpu memory\n").as_deref(),
            Some("+io")
        );
        assert_eq!(enable_line(&["cpu"], "cpuset cpu"), None);
    }

    #[test]
    fn io_min_per_key() {
        let a = IoLimits {
            read_bps: Some(10),
            write_bps: None,
            read_iops: Some(5),
            write_iops: None,
        };
        let b = IoLimits {
            read_bps: Some(20),
            write_bps: Some(7),
            read_iops: None,
            write_iops: None,
        };
        let m = io_min(&a, &b);
        assert_eq!(
            (m.read_bps, m.write_bps, m.read_iops, m.write_iops),
            (Some(10), Some(7), Some(5), None)
        );
    }
}
