//! The systemd encoding of a tenant's settings: the unit properties that express the same
//! `TenantSettings` the v1 and v2 drivers write as files (the instance-total IO split arrives
//! divided per device and becomes per-device IO properties). `crate::systemd` sets them.

use crate::kernel::DevNum;
use crate::systemd::{DeviceLimit, Property};

use super::model::TenantSettings;
use super::{Controller, Version};

/// The kernel's default cpu and io weight; systemd's "not set" leaves it there.
const DEFAULT_WEIGHT: u32 = 100;

/// The properties that give a unit a tenant's settings. `unified`: cgroup v2 (cpuset, IOWeight and the
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
            // `[tenant.io] weight`; 100 is the kernel's default, systemd's "not set".
            Property::IoWeight(s.io_weight.filter(|w| *w != DEFAULT_WEIGHT).map(u64::from)),
            // `[tenant.io] latency_target`, per device (io.latency).
            Property::IoDeviceLatencyTargetUsec(
                s.io_latency_us
                    .iter()
                    .map(|(dev, us)| DeviceLimit::new(device_path(*dev), *us))
                    .collect(),
            ),
        ]);
    }
    props
}

/// What every "not applied, and why" line under systemd says (`check`, `plan`, and the daemon's
/// log, once per text).
pub const NOT_APPLIED: &str = "not applied through systemd";

/// Why a unit that runs a tenant's exempt processes cannot hold the tenant's leaves
/// (`cgroup::delegated`), for `exempt_not_applied`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delegation {
    /// The unit has no `Delegate=yes`.
    Missing,
    /// It has, but its cgroup offers no io controller to its subgroups: it was started before
    /// it had Delegate=yes (cgroup v2).
    StartedBefore,
    /// cgroup v1: dbcage makes no leaves in a unit there (systemd places a unit's processes
    /// into its group of each controller hierarchy itself when it sets the unit up, out of
    /// any leaf in blkio).
    CgroupV1,
    /// Its delegated tree holds processes in subgroups of its own software's (or someone's).
    Foreign(Vec<String>),
    /// The io hierarchy does not show the unit's cgroup.
    NotVisible,
}

impl Delegation {
    /// From the hierarchy (`unified`: cgroup v2), the unit's `Delegate` property and what its
    /// cgroup holds.
    pub fn of(
        unified: bool,
        delegates: bool,
        tree: Option<&super::delegated::DelegatedTree>,
    ) -> Delegation {
        match tree {
            _ if !unified => Delegation::CgroupV1,
            _ if !delegates => Delegation::Missing,
            None => Delegation::NotVisible,
            Some(t) if !t.io_available => Delegation::StartedBefore,
            Some(t) => Delegation::Foreign(t.foreign.clone()),
        }
    }
}

/// Why a tenant's exempt processes in `unit` get its IO limits under systemd (the unit's
/// properties bind every process in it; the cgroupfs drivers, and a unit with Delegate=yes,
/// give them an `exempt` leaf without IO limits), and what would change it.
pub fn exempt_not_applied(unit: &str, why: Delegation) -> String {
    let head = format!(
        "exempt processes in {unit} run under its IO limits (exempt processes are meant to run \
         without them): that needs an exempt leaf below the unit, in a subtree systemd delegates"
    );
    match why {
        Delegation::Missing => format!(
            "{head}, and {unit} has no Delegate=yes: run `dbcage systemd-setup` (it writes \
             /etc/systemd/system/{unit}.d/50-dbcage-delegate.conf with `Delegate=yes` and \
             reloads systemd), then restart {unit}"
        ),
        Delegation::StartedBefore => format!(
            "{head}; {unit} has Delegate=yes, but was started before it had (its cgroup offers \
             its subgroups no io controller): restart {unit}"
        ),
        Delegation::CgroupV1 => format!(
            "{head}; dbcage makes that leaf on cgroup v2 only: on v1 systemd itself places a \
             unit's processes into its group of each controller hierarchy when it sets the unit \
             up (after a property change, later than the call returns), out of any leaf below \
             it in blkio"
        ),
        Delegation::Foreign(groups) => format!(
            "{head}; {unit}'s delegated cgroup holds processes in subgroups of its own ({}), \
             next to which dbcage makes no leaves",
            groups.join(", ")
        ),
        Delegation::NotVisible => format!(
            "{head}; {unit} has Delegate=yes, but the io hierarchy does not show its cgroup"
        ),
    }
}

/// Why systemd gives a unit no group of controller `c` on a hierarchy of version `v`, when it
/// does not: cpuset on cgroup v1 (systemd 252 has no AllowedCPUs there). The plan reports the
/// settings as not applied (`unexpressible`); the daemon's coverage check does not wait for
/// such a group (`coverage::checked`) and `status` names the controller as not limited, with
/// this reason.
pub fn unmanaged(c: Controller, v: Version) -> Option<&'static str> {
    (c == Controller::Cpuset && v == Version::V1).then_some(NO_CPUSET_ON_V1)
}

/// `unmanaged` for controller `c` on this host's hierarchy of it (none without one).
pub fn unmanaged_on(c: Controller, setup: &super::Setup) -> Option<&'static str> {
    setup
        .hierarchy_of(c)
        .and_then(|h| unmanaged(c, setup.hierarchies[h].version))
}

const NO_CPUSET_ON_V1: &str = "systemd has no cpuset on cgroup v1";

/// Settings systemd cannot express on this hierarchy, for the "not applied, and why" report.
pub fn unexpressible(s: &TenantSettings, unified: bool) -> Vec<String> {
    let mut out = Vec::new();
    if !unified {
        if !s.cpus.is_empty() || !s.mems.is_empty() {
            out.push(format!(
                "cpu.cpus / numa_nodes: {NO_CPUSET_ON_V1}; needs Delegate=yes and a cpuset group \
                 dbcage writes itself"
            ));
        }
        for (set, name) in [
            (s.memory_high.is_some(), "memory.high"),
            (s.memory_low.is_some(), "memory.low"),
            (s.memory_swap_max.is_some(), "memory.swap_max"),
            (s.io_weight.is_some(), "io.weight"),
            (!s.io_latency_us.is_empty(), "io.latency_target"),
        ] {
            if set {
                out.push(format!("{name}: cgroup v2 only"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
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
            memory_max: Some(1 << 30),
            memory_swap_max: Some(0),
            io_weight: Some(300),
            io_latency_us: BTreeMap::from([(
                DevNum {
                    major: 254,
                    minor: 32,
                },
                5000,
            )]),
            ..TenantSettings::default()
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
                "IOWeight=300",
                "IODeviceLatencyTargetUSec=/dev/x32 5000",
            ]
        );
        // v1: no cpuset, no io weight and no v2-only memory knobs, and the report says what is left out.
        let v1 = unit_properties(&settings(), false, name);
        assert_eq!(v1.len(), 7);
        let left = unexpressible(&settings(), false);
        assert_eq!(left.len(), 4, "{left:?}");
        assert_eq!(
            left[0],
            "cpu.cpus / numa_nodes: systemd has no cpuset on cgroup v1; needs Delegate=yes and a \
             cpuset group dbcage writes itself"
        );
        assert!(left[1].contains("memory.swap_max"));
        assert!(left[2].contains("io.weight"));
        assert_eq!(left[3], "io.latency_target: cgroup v2 only");
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
        s.io_weight = Some(100);
        let props = unit_properties(&s, true, name);
        assert!(props.contains(&Property::IoWeight(None)));
    }
}
