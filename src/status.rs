//! What each tenant uses now: one sample of the kernel's counters per tenant (`collect`), and
//! rates between two samples (`with_rates`). Shared by `status`, `top` and the metrics endpoint.
//! Reads only.
//!
//! Counters that go backwards between two samples (a group removed and created again) give no
//! rate for that interval rather than a huge or negative one.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use crate::cgroup::stats;
use crate::cgroup::{self, Controller, Layout};
use crate::classify::{Classifier, Leaf};
use crate::hostfs::{HostFs, KeptDirs};
use crate::inventory::ProcInfo;
use crate::kernel::DevNum;
use crate::policy::{IoLimits, Policy, Resource};

#[derive(Debug, Clone, Serialize)]
pub struct Member {
    pub pid: u32,
    pub comm: String,
    pub cmdline: String,
    pub leaf: Leaf,
    pub rule: String,
}

/// Per-second rates of one device or one tenant (absent without a previous sample).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct IoRates {
    pub read_bytes_per_second: f64,
    pub write_bytes_per_second: f64,
    pub read_iops: f64,
    pub write_iops: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceStatus {
    /// `MAJ:MIN`
    pub device: String,
    pub name: String,
    #[serde(skip)]
    pub devnum: DevNum,
    pub read_bps_limit: Option<u64>,
    pub write_bps_limit: Option<u64>,
    pub read_iops_limit: Option<u64>,
    pub write_iops_limit: Option<u64>,
    /// Counters since the group was created (its children included).
    #[serde(flatten)]
    pub usage: stats::IoCounters,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rates: Option<IoRates>,
    /// Under `io.split = "demand"`, the daemon's current decision per key (`read_bps`, ...):
    /// the limit, its share of the total, why (`demand` or `floor`) and the usage it followed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balance: Option<BTreeMap<String, crate::balance::KeyShare>>,
}

/// The tenant's IO over all its devices: rates, the sum of the per-device limits, and the share
/// of each limit in use (rate / limit, over the devices that have that limit).
#[derive(Debug, Clone, Default, Serialize)]
pub struct IoTotals {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rates: Option<IoRates>,
    pub limits: IoLimits,
    pub read_bps_share: Option<f64>,
    pub write_bps_share: Option<f64>,
    pub read_iops_share: Option<f64>,
    pub write_iops_share: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TenantStatus {
    pub name: String,
    /// Under systemd: the units' cgroups the tenant is governed in (read here in place of
    /// dbcage's own groups), the one its limits and usage are read from first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<String>,
    pub processes: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<Member>,
    pub devices: Vec<DeviceStatus>,
    pub io: IoTotals,
    pub cpu: stats::CpuUsage,
    pub cpu_quota_cores: Option<f64>,
    /// Cores used over the interval (absent without a previous sample).
    pub cpu_cores_used: Option<f64>,
    /// Share of the interval the tenant was throttled by its quota (0..1).
    pub cpu_throttled_share: Option<f64>,
    pub memory: stats::MemoryUsage,
    pub memory_limit_bytes: Option<u64>,
    /// `memory.high` in force (v1: memory.soft_limit_in_bytes).
    pub memory_high_bytes: Option<u64>,
    /// What the tenant's processes hold in memory: the sum of their proportional set sizes
    /// (`Pss` of /proc/PID/smaps_rollup, so shared memory such as an SGA or shared_buffers counts
    /// once). The kernel charges a page to the group of the process that first touched it and
    /// does not move the charge with the process (cgroup v2, and v1 since charge moving went), so
    /// for an instance moved in while running this is more than `memory.current_bytes`, and
    /// memory.max binds only what the tenant allocates after the move.
    pub memory_resident_bytes: Option<u64>,
    /// `io.weight` in force (v2; absent where the kernel keeps none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_weight: Option<u32>,
    /// `io.latency` targets in force, in microseconds, by device (`MAJ:MIN`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub io_latency_target_us: BTreeMap<String, u64>,
    /// For a tenant held to some of the host's NUMA nodes: the share (0..1) of its processes'
    /// resident pages that are on those nodes (the `N<node>=` pages of /proc/PID/numa_maps
    /// summed over the processes). Counted from the processes and not from memory.numa_stat,
    /// which holds only what is charged to the group (memory touched before a process was moved
    /// in stays charged to its old group). A page mapped by several processes counts once per
    /// process, so shared memory weighs as often as it is mapped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa_local_share: Option<f64>,
    /// Pressure stall information; the kernel keeps it per cgroup on v2 only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pressure: Option<stats::PressureSet>,
    /// Limits the tenant sits at (95% or more in use): `io.read_bps`, `cpu.cores`, `memory.max`.
    pub at_limit: Vec<String>,
    /// Leaves that hold processes but lack controllers the tenant's limits need: those limits
    /// do not apply (`limited: cpuset, memory`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_limited: Vec<String>,
    /// The replication guard's last look (`[tenant.replication]`, while a daemon runs it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replication: Option<crate::replication::GuardStatus>,
    /// The protection guard's state (`io.protect_pressure`, while a daemon runs it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protection: Option<crate::protect::GuardState>,
    /// The cpu protection guard's state (`cpu.protect_pressure`, while a daemon runs it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_protection: Option<crate::protect::GuardState>,
}

/// One sample of every (selected) tenant.
#[derive(Debug, Clone)]
pub struct Sample {
    pub at: Instant,
    pub tenants: Vec<TenantStatus>,
}

/// The kernel's name of a block device (`sda`, `loop3`), or its number if unknown. Names are
/// cached per device number: resolving the sysfs link costs several syscalls, and a scrape asks
/// for every device of every tenant.
pub fn device_name(fs: &HostFs, dev: DevNum) -> String {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static NAMES: Mutex<Option<HashMap<DevNum, String>>> = Mutex::new(None);
    let mut cache = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    let map = cache.get_or_insert_with(HashMap::new);
    if let Some(n) = map.get(&dev) {
        return n.clone();
    }
    let name = std::fs::read_link(fs.path(format!("/sys/dev/block/{dev}")))
        .ok()
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()));
    match name {
        Some(n) => {
            map.insert(dev, n.clone());
            n
        }
        None => dev.to_string(),
    }
}

/// Device limits in force on a tenant's `limited` leaf and its per-device counters.
fn io_of(fs: &HostFs, reader: &cgroup::read::TenantReader) -> Vec<DeviceStatus> {
    let Some(io) = reader.io() else {
        return Vec::new();
    };
    let (limits, usage) = (io.limits, io.usage);
    let mut devs: Vec<DevNum> = limits.keys().chain(usage.keys()).copied().collect();
    devs.sort();
    devs.dedup();
    devs.into_iter()
        .map(|d| {
            let l = limits.get(&d).copied().unwrap_or_default();
            DeviceStatus {
                device: d.to_string(),
                name: device_name(fs, d),
                devnum: d,
                read_bps_limit: l.read_bps,
                write_bps_limit: l.write_bps,
                read_iops_limit: l.read_iops,
                write_iops_limit: l.write_iops,
                usage: usage.get(&d).copied().unwrap_or_default(),
                rates: None,
                balance: None,
            }
        })
        .collect()
}

/// How `collect` finds the memory a tenant's processes hold (`memory_resident_bytes`): summed
/// from every member's smaps_rollup, which walks the process's page tables (an SGA mapped by a
/// thousand processes is walked a thousand times; at 1,000 tenants of three small processes it
/// was a quarter of `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resident {
    /// Not read (`top`, the metrics, the first of two samples).
    Skip,
    /// Every tenant's (`status --json`).
    Every,
    /// Only where it can be clearly above the charge (`charged_below_resident`), the one place
    /// the text view shows it: members' summed Rss (statm, no walk) is never below their summed
    /// Pss, so a tenant whose Rss stays within the charge's margin is not walked.
    AboveCharge,
}

/// Reads one sample. `procs` (a /proc scan) is needed only to list members with their rule.
/// `resident` says whose `memory_resident_bytes` are summed (`status` shows it from its last
/// sample only). A caller that samples again (`top`, the metrics, `status --interval`) passes
/// `kept`: the groups stay open for its next sample.
pub fn collect(
    fs: &HostFs,
    layout: &Layout,
    policy: &Policy,
    only: &[String],
    procs: Option<&[ProcInfo]>,
    resident: Resident,
    kept: Option<&KeptDirs>,
) -> Sample {
    let at = Instant::now();
    // pid → (process, placement), for listing members with the rule that placed them.
    let by_pid: std::collections::HashMap<u32, &ProcInfo> = procs
        .unwrap_or_default()
        .iter()
        .map(|p| (p.pid, p))
        .collect();
    let placed: std::collections::HashMap<u32, crate::classify::Placement> = procs
        .map(|p| policy.matcher.classify(p))
        .unwrap_or_default()
        .into_iter()
        .map(|x| (x.pid, x))
        .collect();
    let h_of = |c| layout.setup.hierarchy_of(c);
    let selected: Vec<(usize, &crate::policy::Tenant)> = policy
        .tenants
        .iter()
        .enumerate()
        .filter(|(_, t)| only.is_empty() || only.contains(&t.name))
        .collect();
    let published = policy
        .tenants
        .iter()
        .any(|t| t.io_split.split == crate::policy::Split::Demand)
        .then(|| crate::balance::read_published(&layout.root_name))
        .flatten();
    let guarded = policy
        .tenants
        .iter()
        .any(|t| t.replication.is_some())
        .then(|| crate::replication::read_published(&layout.root_name))
        .flatten();
    let protected = policy
        .tenants
        .iter()
        .any(|t| t.io_guard.is_some() || t.cpu_guard.is_some())
        .then(|| crate::protect::read_published(&layout.root_name))
        .flatten();
    let all_nodes = crate::inventory::NumaTopology::read(fs)
        .ok()
        .map(|n| n.node_set());
    let one = |(ti, t): (usize, &crate::policy::Tenant)| -> TenantStatus {
        let guard_of = |r: Resource| {
            protected
                .as_ref()
                .and_then(|g| g.get(&t.name))
                .and_then(|v| v.iter().find(|g| g.resource == r))
                .cloned()
        };
        let h_procs = h_of(Controller::Io).or(h_of(Controller::Cpu)).unwrap_or(0);
        let reader = layout.reader_keeping(&t.name, kept);
        let (memory, memory_limit_bytes) = reader.memory();
        let mut members = Vec::new();
        let mut count = 0;
        let mut member_pids = Vec::new();
        // numa_maps walks page tables, so it is read only for a tenant held to some nodes; and
        // only a tenant the policy pins has a cpuset group of its own to read (v1 makes none
        // for the others: 1,000 failed opens a scrape).
        let needed_by_policy = cgroup::coverage::needed_by_policy(t);
        let pinned = needed_by_policy.contains(&Controller::Cpuset);
        let own_nodes = (pinned.then(|| reader.mems()).flatten())
            .filter(|m| !m.is_empty() && all_nodes.as_ref().is_some_and(|all| *m != *all));
        let mut node_bytes: BTreeMap<u32, u64> = BTreeMap::new();
        let mut not_limited = Vec::new();
        for leaf in [Leaf::Limited, Leaf::Exempt] {
            if layout.setup.hierarchies.is_empty() {
                break;
            }
            let pids = reader.pids(h_procs, leaf);
            count += pids.len();
            if resident != Resident::Skip {
                member_pids.extend_from_slice(&pids);
            }
            for pid in &pids {
                if own_nodes.is_some() {
                    if let Ok(text) = fs.read_to_string(format!("/proc/{pid}/numa_maps")) {
                        for (n, b) in crate::inventory::numa::parse_numa_maps(&text) {
                            *node_bytes.entry(n).or_default() += b;
                        }
                    }
                }
            }
            if !pids.is_empty() {
                let mut needed = needed_by_policy.clone();
                if leaf == Leaf::Exempt {
                    needed.remove(&Controller::Io);
                }
                let lacks = cgroup::coverage::leaf_lacks(layout, &t.name, leaf, &needed);
                if !lacks.is_empty() {
                    // Under systemd, a controller it does not manage here says why (cpuset
                    // on cgroup v1: the tenant's cpus are not applied).
                    let names: Vec<String> = lacks
                        .iter()
                        .map(|&c| {
                            let why = layout
                                .units
                                .contains_key(&t.name)
                                .then(|| cgroup::systemd::unmanaged_on(c, &layout.setup))
                                .flatten();
                            match why {
                                Some(why) => format!("{}: {why}", c.v1_name()),
                                None => c.v1_name().to_string(),
                            }
                        })
                        .collect();
                    not_limited.push(format!("{}: {}", leaf.dir(), names.join(", ")));
                }
            }
            if procs.is_some() {
                for pid in pids {
                    let p = by_pid.get(&pid).copied();
                    let rule = placed
                        .get(&pid)
                        .filter(|x| x.tenant == ti)
                        .map(|x| x.reason.clone())
                        .unwrap_or_else(|| "inherited from its parent (no rule matches it; new children stay in their parent's group)".into());
                    members.push(Member {
                        pid,
                        comm: p.map(|p| p.comm.to_string()).unwrap_or_default(),
                        cmdline: p.map(|p| p.cmdline.to_string()).unwrap_or_default(),
                        leaf,
                        rule,
                    });
                }
            }
        }
        let mut devices = io_of(fs, &reader);
        if let Some(b) = published.as_ref().and_then(|p| p.get(&t.name)) {
            for d in &mut devices {
                d.balance = b.get(&d.device).cloned();
            }
        }
        let sum = |f: fn(&DeviceStatus) -> Option<u64>| -> Option<u64> {
            let v: Vec<u64> = devices.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| v.iter().sum())
        };
        let io = IoTotals {
            limits: IoLimits {
                read_bps: sum(|d| d.read_bps_limit),
                write_bps: sum(|d| d.write_bps_limit),
                read_iops: sum(|d| d.read_iops_limit),
                write_iops: sum(|d| d.write_iops_limit),
            },
            ..IoTotals::default()
        };

        let (cpu, cpu_quota_cores) = reader.cpu();
        let walk = match resident {
            Resident::Skip => false,
            Resident::Every => true,
            Resident::AboveCharge => memory.current_bytes.is_some_and(|charged| {
                let rss: u64 = (member_pids.iter())
                    .filter_map(|pid| cgroup::resident_set_size(fs, *pid))
                    .sum();
                rss > above_charge(charged)
            }),
        };
        let resident_bytes = walk.then(|| resident_of(fs, &member_pids)).flatten();
        let memory_high_bytes = reader.memory_high();
        let pressure = reader.pressure();
        let protection = reader.io_protection();
        let mut status = TenantStatus {
            name: t.name.clone(),
            units: layout.units.get(&t.name).cloned().unwrap_or_default(),
            processes: count,
            members,
            devices,
            io,
            cpu,
            cpu_quota_cores,
            cpu_cores_used: None,
            cpu_throttled_share: None,
            memory,
            memory_limit_bytes,
            memory_high_bytes,
            memory_resident_bytes: resident_bytes,
            io_weight: protection.weight,
            io_latency_target_us: protection
                .latency_us
                .iter()
                .map(|(d, us)| (d.to_string(), *us))
                .collect(),
            numa_local_share: own_nodes.and_then(|own| local_share(&node_bytes, &own)),
            pressure,
            at_limit: Vec::new(),
            not_limited,
            replication: guarded.as_ref().and_then(|g| g.get(&t.name)).cloned(),
            protection: guard_of(Resource::Io),
            cpu_protection: guard_of(Resource::Cpu),
        };
        status.at_limit = at_limit(&status);
        status
    };
    // Reading a tenant is some twenty small kernel files.
    let tenants =
        crate::threads::in_two(&selected, 8, |part| part.iter().copied().map(one).collect());
    Sample { at, tenants }
}

/// The members' summed Pss; `None` when none could be read.
fn resident_of(fs: &HostFs, pids: &[u32]) -> Option<u64> {
    pids.iter()
        .filter_map(|pid| proportional_set_size(fs, *pid))
        .reduce(|a, b| a + b)
}

/// A process's proportional set size in bytes (`Pss:` of /proc/PID/smaps_rollup); `None` when it
/// is gone or unreadable.
pub fn proportional_set_size(fs: &HostFs, pid: u32) -> Option<u64> {
    let text = fs
        .read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()?;
    parse_pss(&text)
}

/// The share of `bytes` on the nodes `own`; `None` when there are none.
pub fn local_share(bytes: &BTreeMap<u32, u64>, own: &crate::kernel::CpuSet) -> Option<f64> {
    let total: u64 = bytes.values().sum();
    let local: u64 = bytes
        .iter()
        .filter(|(n, _)| own.contains(**n))
        .map(|(_, b)| b)
        .sum();
    (total > 0).then(|| local as f64 / total as f64)
}

/// `Pss:` of a smaps_rollup text, in bytes.
pub fn parse_pss(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let kib = l.strip_prefix("Pss:")?.trim().strip_suffix("kB")?;
        kib.trim().parse::<u64>().ok().map(|k| k * 1024)
    })
}

/// True when the tenant's processes hold clearly more memory than its group is charged for:
/// memory they touched before they were moved in stays charged where it was, and memory.max
/// does not bind it.
pub fn charged_below_resident(t: &TenantStatus) -> bool {
    match (t.memory.current_bytes, t.memory_resident_bytes) {
        (Some(charged), Some(resident)) => resident > above_charge(charged),
        _ => false,
    }
}

/// The resident memory above which a charge counts as clearly below it.
fn above_charge(charged: u64) -> u64 {
    charged + (charged / 4).max(16 << 20)
}

/// A counter's rate over `dt` seconds; `None` if it went backwards (the group was recreated).
fn rate(prev: u64, cur: u64, dt: f64) -> Option<f64> {
    (cur >= prev && dt > 0.0).then(|| (cur - prev) as f64 / dt)
}

fn share(rate: f64, limit: Option<u64>) -> Option<f64> {
    limit.filter(|l| *l > 0).map(|l| rate / l as f64)
}

/// Which limits the tenant sits at (95% or more in use).
fn at_limit(t: &TenantStatus) -> Vec<String> {
    let mut out = Vec::new();
    let near = |s: Option<f64>| s.is_some_and(|s| s >= 0.95);
    for (name, s) in [
        ("io.read_bps", t.io.read_bps_share),
        ("io.write_bps", t.io.write_bps_share),
        ("io.read_iops", t.io.read_iops_share),
        ("io.write_iops", t.io.write_iops_share),
    ] {
        if near(s) {
            out.push(name.to_string());
        }
    }
    if let (Some(used), Some(q)) = (t.cpu_cores_used, t.cpu_quota_cores) {
        if near(Some(used / q)) {
            out.push("cpu.cores".into());
        }
    }
    if let (Some(cur), Some(max)) = (t.memory.current_bytes, t.memory_limit_bytes) {
        if near(Some(cur as f64 / max as f64)) {
            out.push("memory.max".into());
        }
    }
    out
}

/// Fills the rates of `cur` from the previous sample.
pub fn with_rates(prev: &Sample, cur: &mut Sample) {
    let dt = cur.at.duration_since(prev.at).as_secs_f64();
    for t in &mut cur.tenants {
        let Some(p) = prev.tenants.iter().find(|p| p.name == t.name) else {
            continue;
        };
        let mut total = IoRates::default();
        let mut complete = true;
        for d in &mut t.devices {
            let before = p
                .devices
                .iter()
                .find(|x| x.devnum == d.devnum)
                .map(|x| x.usage)
                .unwrap_or_default();
            let r = (|| {
                Some(IoRates {
                    read_bytes_per_second: rate(before.read_bytes, d.usage.read_bytes, dt)?,
                    write_bytes_per_second: rate(before.write_bytes, d.usage.write_bytes, dt)?,
                    read_iops: rate(before.read_ios, d.usage.read_ios, dt)?,
                    write_iops: rate(before.write_ios, d.usage.write_ios, dt)?,
                })
            })();
            match r {
                Some(r) => {
                    total.read_bytes_per_second += r.read_bytes_per_second;
                    total.write_bytes_per_second += r.write_bytes_per_second;
                    total.read_iops += r.read_iops;
                    total.write_iops += r.write_iops;
                }
                None => complete = false,
            }
            d.rates = r;
        }
        if complete {
            // Share of a limit: the rate on the devices that have that limit, over their sum.
            let limited_rate =
                |f: fn(&DeviceStatus) -> Option<u64>, r: fn(&IoRates) -> f64| -> f64 {
                    t.devices
                        .iter()
                        .filter(|d| f(d).is_some())
                        .filter_map(|d| d.rates.as_ref().map(r))
                        .sum()
                };
            t.io.read_bps_share = share(
                limited_rate(|d| d.read_bps_limit, |r| r.read_bytes_per_second),
                t.io.limits.read_bps,
            );
            t.io.write_bps_share = share(
                limited_rate(|d| d.write_bps_limit, |r| r.write_bytes_per_second),
                t.io.limits.write_bps,
            );
            t.io.read_iops_share = share(
                limited_rate(|d| d.read_iops_limit, |r| r.read_iops),
                t.io.limits.read_iops,
            );
            t.io.write_iops_share = share(
                limited_rate(|d| d.write_iops_limit, |r| r.write_iops),
                t.io.limits.write_iops,
            );
            t.io.rates = Some(total);
        }
        if let (Some(a), Some(b)) = (p.cpu.usage_seconds, t.cpu.usage_seconds) {
            t.cpu_cores_used = (b >= a && dt > 0.0).then(|| (b - a) / dt);
        }
        if let (Some(a), Some(b)) = (p.cpu.throttled_seconds, t.cpu.throttled_seconds) {
            t.cpu_throttled_share = (b >= a && dt > 0.0).then(|| ((b - a) / dt).min(1.0));
        }
        t.at_limit = at_limit(t);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn tenant(read_bytes: u64, usage_s: f64) -> TenantStatus {
        TenantStatus {
            name: "BX1".into(),
            units: Vec::new(),
            processes: 1,
            members: Vec::new(),
            devices: vec![DeviceStatus {
                device: "7:0".into(),
                name: "loop0".into(),
                devnum: DevNum::new(7, 0),
                read_bps_limit: Some(4 << 20),
                write_bps_limit: None,
                read_iops_limit: None,
                write_iops_limit: None,
                usage: stats::IoCounters {
                    read_bytes,
                    write_bytes: 0,
                    read_ios: read_bytes / 65536,
                    write_ios: 0,
                },
                rates: None,
                balance: None,
            }],
            io: IoTotals {
                limits: IoLimits {
                    read_bps: Some(4 << 20),
                    ..IoLimits::default()
                },
                ..IoTotals::default()
            },
            cpu: stats::CpuUsage {
                usage_seconds: Some(usage_s),
                ..stats::CpuUsage::default()
            },
            cpu_quota_cores: Some(0.5),
            cpu_cores_used: None,
            cpu_throttled_share: None,
            memory: stats::MemoryUsage::default(),
            memory_limit_bytes: None,
            memory_high_bytes: None,
            memory_resident_bytes: None,
            io_weight: None,
            io_latency_target_us: BTreeMap::new(),
            numa_local_share: None,
            pressure: None,
            at_limit: Vec::new(),
            not_limited: Vec::new(),
            replication: None,
            protection: None,
            cpu_protection: None,
        }
    }

    #[test]
    fn numa_maps_counts_pages_per_node_with_their_size() {
        // lines copied from a 2-node guest: normal pages, a 2 MiB huge page mapping, no pages
        let text = "7f2a1c000000 default anon=12288 dirty=12288 active=0 N0=300 N1=11988 kernelpagesize_kB=4\n\
                    7f2a00000000 default file=/anon_hugepage\\040(deleted) huge dirty=2 N1=2 kernelpagesize_kB=2048\n\
                    7ffd5b1c4000 default stack anon=3 dirty=3 N0=3 kernelpagesize_kB=4\n\
                    7ffd5b1f0000 default\n";
        let b = crate::inventory::numa::parse_numa_maps(text);
        assert_eq!(b.get(&0), Some(&(303 * 4096)));
        assert_eq!(b.get(&1), Some(&(11988 * 4096 + 2 * (2 << 20))));
        let share = local_share(&b, &"1".parse().unwrap()).unwrap();
        assert!((share - (11988.0 * 4096.0 + 4194304.0) / (b[&0] + b[&1]) as f64).abs() < 1e-12);
        assert!(share > 0.97 && share < 0.98, "{share}");
        assert_eq!(local_share(&BTreeMap::new(), &"1".parse().unwrap()), None);
    }

    #[test]
    fn rates_shares_and_at_limit() {
        let t0 = Instant::now();
        let prev = Sample {
            at: t0,
            tenants: vec![tenant(0, 10.0)],
        };
        let mut cur = Sample {
            at: t0 + std::time::Duration::from_secs(2),
            tenants: vec![tenant(8 << 20, 11.0)],
        };
        with_rates(&prev, &mut cur);
        let t = &cur.tenants[0];
        let r = t.io.rates.unwrap();
        assert_eq!(r.read_bytes_per_second, (4 << 20) as f64);
        assert_eq!(r.read_iops, 64.0);
        assert_eq!(t.io.read_bps_share, Some(1.0));
        assert_eq!(t.cpu_cores_used, Some(0.5));
        assert_eq!(
            t.at_limit,
            vec!["io.read_bps".to_string(), "cpu.cores".to_string()]
        );
    }

    #[test]
    fn a_counter_that_goes_back_gives_no_rate() {
        let t0 = Instant::now();
        let prev = Sample {
            at: t0,
            tenants: vec![tenant(100 << 20, 50.0)],
        };
        let mut cur = Sample {
            at: t0 + std::time::Duration::from_secs(1),
            tenants: vec![tenant(1 << 20, 0.1)],
        };
        with_rates(&prev, &mut cur);
        let t = &cur.tenants[0];
        assert!(t.io.rates.is_none());
        assert!(t.devices[0].rates.is_none());
        assert!(t.cpu_cores_used.is_none());
        assert!(t.at_limit.is_empty());
    }
}
