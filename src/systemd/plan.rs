//! What dbcage asks of systemd for a tenant, computed without touching the host: the unit
//! properties that express a tenant's settings (the same `TenantSettings` the cgroupfs drivers
//! encode as files; the instance-total IO split arrives already divided per device and becomes
//! per-device IO properties), and where each of a tenant's processes is governed: in place in a
//! unit of its own, or adopted into the tenant's transient scope.

use std::collections::BTreeMap;

use super::props::{DeviceLimit, Property};
use crate::cgroup::model::TenantSettings;
use crate::kernel::DevNum;

/// The kernel's default cpu weight; systemd's "not set" leaves it there.
const DEFAULT_WEIGHT: u32 = 100;

/// The properties that give a unit a tenant's settings. `unified`: cgroup v2 (cpuset and the
/// MemoryHigh/Low/SwapMax knobs exist only there; systemd maps the rest to v1 files itself).
/// `device_path` names a device as systemd takes it (a node path such as `/dev/vdc`).
/// Every property dbcage manages is listed, unset ones with their default value, so that
/// setting the list also clears what an earlier plan set.
pub fn unit_properties(
    s: &TenantSettings,
    unified: bool,
    device_path: impl Fn(DevNum) -> String,
) -> Vec<Property> {
    let cores_to_usec = |c: f64| (c * 1_000_000.0).round() as u64;
    let devices = |pick: fn(&crate::policy::IoLimits) -> Option<u64>| {
        s.io.iter()
            .filter_map(|(dev, l)| pick(l).map(|v| DeviceLimit::new(device_path(*dev), v)))
            .collect::<Vec<_>>()
    };
    let mut props = vec![
        Property::CpuQuotaPerSecUSec(s.cpu_cores.map(cores_to_usec)),
        Property::CpuWeight((s.cpu_weight != DEFAULT_WEIGHT).then_some(u64::from(s.cpu_weight))),
        Property::MemoryMax(s.memory_max),
        Property::IoReadBandwidthMax(devices(|l| l.read_bps)),
        Property::IoWriteBandwidthMax(devices(|l| l.write_bps)),
        Property::IoReadIopsMax(devices(|l| l.read_iops)),
        Property::IoWriteIopsMax(devices(|l| l.write_iops)),
    ];
    if unified {
        props.extend([
            Property::AllowedCpus(s.cpus.clone()),
            Property::AllowedMemoryNodes(s.mems.clone()),
            Property::MemoryHigh(s.memory_high),
            Property::MemoryLow(Some(s.memory_low.unwrap_or(0))),
            Property::MemorySwapMax(s.memory_swap_max),
        ]);
    }
    props
}

/// Settings systemd cannot express on this hierarchy, for the "not applied, and why" report.
pub fn unexpressible(s: &TenantSettings, unified: bool) -> Vec<String> {
    let mut out = Vec::new();
    if !unified {
        if !s.cpus.is_empty() || !s.mems.is_empty() {
            out.push(
                "cpu.cpus / numa_nodes: systemd has no cpuset on cgroup v1; needs Delegate=yes \
                 and a cpuset group dbcage writes itself"
                    .to_string(),
            );
        }
        for (set, name) in [
            (s.memory_high.is_some(), "memory.high"),
            (s.memory_low.is_some(), "memory.low"),
            (s.memory_swap_max.is_some(), "memory.swap_max"),
        ] {
            if set {
                out.push(format!("{name}: cgroup v2 only"));
            }
        }
    }
    out
}

/// The node path systemd accepts for a device: `/dev/<DEVNAME>` from the device's uevent
/// (`/sys/dev/block/MAJ:MIN/uevent`), or udev's `/dev/block/MAJ:MIN` link when it has none.
pub fn device_node(fs: &crate::hostfs::HostFs, dev: DevNum) -> String {
    let uevent = fs
        .read_to_string(format!("/sys/dev/block/{dev}/uevent"))
        .unwrap_or_default();
    uevent
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .map(|name| format!("/dev/{name}"))
        .unwrap_or_else(|| format!("/dev/block/{dev}"))
}

/// Where a tenant's processes are governed under systemd.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// Units that hold only this tenant's processes (or that the policy names): governed in
    /// place, by setting their properties. Processes are never moved out of them.
    pub units: BTreeMap<String, Vec<u32>>,
    /// Processes in units they share with others (a login session, a shell's service, the
    /// root of the tree): adopted into the tenant's scope, by systemd.
    pub adopt: Vec<u32>,
    /// Processes already in the tenant's own scope.
    pub in_scope: Vec<u32>,
}

/// Sorts a tenant's processes. `unit_of` gives each process's unit (None: not in a unit);
/// `unit_is_tenants` says whether every process of a unit belongs to the tenant; `named` is
/// the policy's `unit =` for the tenant, governed in place whatever else runs in it.
pub fn place(
    tenant_scope: &str,
    pids: &[u32],
    unit_of: impl Fn(u32) -> Option<String>,
    unit_is_tenants: impl Fn(&str) -> bool,
    named: Option<&str>,
) -> Placement {
    let mut p = Placement::default();
    for &pid in pids {
        match unit_of(pid) {
            Some(u) if u == tenant_scope => p.in_scope.push(pid),
            Some(u)
                if named == Some(u.as_str())
                    || (super::holds_processes(&u) && !is_shared(&u) && unit_is_tenants(&u)) =>
            {
                p.units.entry(u).or_default().push(pid)
            }
            _ => p.adopt.push(pid),
        }
    }
    p
}

/// Units that by their nature hold whatever a person starts: never a database's own unit, even
/// when only the database runs in them right now.
fn is_shared(unit: &str) -> bool {
    (unit.starts_with("session-") && unit.ends_with(".scope"))
        || unit.starts_with("user@")
        || unit.starts_with("serial-getty@")
        || unit.starts_with("getty@")
        || unit == "init.scope"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::CpuSet;
    use crate::policy::IoLimits;

    fn settings() -> TenantSettings {
        let mut io = BTreeMap::new();
        io.insert(
            DevNum {
                major: 254,
                minor: 32,
            },
            IoLimits {
                read_bps: Some(1 << 20),
                read_iops: Some(100),
                ..Default::default()
            },
        );
        io.insert(
            DevNum {
                major: 254,
                minor: 48,
            },
            IoLimits {
                read_bps: Some(2 << 20),
                write_bps: Some(3 << 20),
                ..Default::default()
            },
        );
        TenantSettings {
            io,
            cpu_cores: Some(1.5),
            cpu_weight: 50,
            cpus: "1".parse().unwrap(),
            mems: CpuSet::default(),
            memory_max: Some(1 << 30),
            memory_high: None,
            memory_low: None,
            memory_swap_max: Some(0),
        }
    }

    fn name(d: DevNum) -> String {
        format!("/dev/x{}", d.minor)
    }

    #[test]
    fn settings_become_unit_properties_with_the_split_per_device() {
        let props = unit_properties(&settings(), true, name);
        let shown: Vec<String> = props.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            shown,
            [
                "CPUQuotaPerSecUSec=1500000",
                "CPUWeight=50",
                "MemoryMax=1073741824",
                "IOReadBandwidthMax=/dev/x32 1048576, /dev/x48 2097152",
                "IOWriteBandwidthMax=/dev/x48 3145728",
                "IOReadIOPSMax=/dev/x32 100",
                "IOWriteIOPSMax=",
                "AllowedCPUs=1",
                "AllowedMemoryNodes=",
                "MemoryHigh=infinity",
                "MemoryLow=0",
                "MemorySwapMax=0",
            ]
        );
        // v1: no cpuset and no v2-only memory knobs, and the report says what is left out.
        let v1 = unit_properties(&settings(), false, name);
        assert_eq!(v1.len(), 7);
        let left = unexpressible(&settings(), false);
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(left[0].contains("cpuset"));
        assert!(left[1].contains("memory.swap_max"));
        assert!(unexpressible(&settings(), true).is_empty());
    }

    #[test]
    fn default_weight_and_no_quota_are_systemd_defaults() {
        let mut s = settings();
        s.cpu_weight = 100;
        s.cpu_cores = None;
        let props = unit_properties(&s, true, name);
        assert!(props.contains(&Property::CpuWeight(None)));
        assert!(props.contains(&Property::CpuQuotaPerSecUSec(None)));
    }

    #[test]
    fn device_nodes_from_uevent_or_the_dev_block_link() {
        let dir = tempfile::tempdir().unwrap();
        let fs = crate::hostfs::HostFs::with_root(dir.path());
        std::fs::create_dir_all(fs.path("/sys/dev/block/254:32")).unwrap();
        std::fs::write(
            fs.path("/sys/dev/block/254:32/uevent"),
            "MAJOR=254\nMINOR=32\nDEVNAME=vdc\nDEVTYPE=disk\n",
        )
        .unwrap();
        assert_eq!(
            device_node(
                &fs,
                DevNum {
                    major: 254,
                    minor: 32
                }
            ),
            "/dev/vdc"
        );
        assert_eq!(
            device_node(&fs, DevNum { major: 8, minor: 0 }),
            "/dev/block/8:0"
        );
    }

    #[test]
    fn processes_are_governed_in_their_own_unit_or_adopted() {
        let units = |pid: u32| -> Option<String> {
            Some(match pid {
                1..=3 => "postgresql@15-main.service".into(),
                4 => "session-2.scope".into(),
                5 => "ssh.service".into(),
                6 => "dbcage-pg.scope".into(),
                7 => "cron.service".into(),
                _ => return None,
            })
        };
        // cron.service also runs other jobs; session scopes count as shared whatever runs there.
        let only_tenant = |u: &str| u != "cron.service";
        let p = place(
            "dbcage-pg.scope",
            &[1, 2, 3, 4, 5, 6, 7, 8],
            units,
            only_tenant,
            None,
        );
        assert_eq!(
            p.units.keys().collect::<Vec<_>>(),
            ["postgresql@15-main.service", "ssh.service"]
        );
        assert_eq!(p.units["postgresql@15-main.service"], [1, 2, 3]);
        assert_eq!(p.adopt, [4, 7, 8]);
        assert_eq!(p.in_scope, [6]);
        // A unit named in the policy is governed in place even when it is shared.
        let p = place(
            "dbcage-pg.scope",
            &[7],
            units,
            only_tenant,
            Some("cron.service"),
        );
        assert_eq!(p.units["cron.service"], [7]);
        assert!(p.adopt.is_empty());
    }
}
