//! A unit's resource-control properties as systemd's D-Bus API names and types them
//! (systemd.resource-control(5); org.freedesktop.systemd1(5)): the values dbcage sets at runtime
//! and reads back, with systemd's "unset" encodings (`u64::MAX` for infinity / not set, an empty
//! array to clear a device list) made explicit as `Option` and empty vectors.

use std::collections::HashMap;
use std::fmt;

use zbus::zvariant::{OwnedValue, Value};

use crate::kernel::CpuSet;

/// systemd's encoding of "no limit" (`infinity`) and "not set" for `t` properties.
const UNSET: u64 = u64::MAX;

/// One device's entry in an IO property (`IOReadBandwidthMax=/dev/vdb 1M`): systemd takes a
/// device node path (or a path on the device's file system) and a value per second.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct DeviceLimit {
    pub path: String,
    pub value: u64,
}

impl DeviceLimit {
    pub fn new(path: impl Into<String>, value: u64) -> Self {
        DeviceLimit {
            path: path.into(),
            value,
        }
    }
}

/// A property dbcage sets on a unit. `None` resets a value to systemd's default (infinity / not
/// set); an empty device list clears every entry of that IO property.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Property {
    /// CPU time per second of wall time, in µs (`CPUQuota=50%` is 500000).
    CpuQuotaPerSecUSec(Option<u64>),
    /// 1..=10000; `None` is systemd's "not set" (the kernel default, 100).
    CpuWeight(Option<u64>),
    /// cgroup v2 only (cpuset); empty: no restriction.
    AllowedCpus(CpuSet),
    AllowedMemoryNodes(CpuSet),
    MemoryMax(Option<u64>),
    MemoryHigh(Option<u64>),
    MemoryLow(Option<u64>),
    MemorySwapMax(Option<u64>),
    /// The unit's default IO weight, 1..=10000 (cgroup v2 `io.weight`, proportional under
    /// iocost or BFQ); `None` is systemd's "not set" (the kernel default, 100).
    IoWeight(Option<u64>),
    IoReadBandwidthMax(Vec<DeviceLimit>),
    IoWriteBandwidthMax(Vec<DeviceLimit>),
    IoReadIopsMax(Vec<DeviceLimit>),
    IoWriteIopsMax(Vec<DeviceLimit>),
    /// cgroup v2 `io.latency` per device, in µs (`[tenant.io] latency_target`); systemd
    /// writes it only on kernels with blk-iolatency (the file exists).
    IoDeviceLatencyTargetUsec(Vec<DeviceLimit>),
    /// Delegate=yes: the unit's subtree is handed to its processes (takes effect for a service
    /// on its next start; a transient scope gets it at creation).
    Delegate(bool),
}

impl Property {
    /// A per-device IO limit (bandwidth or IOPS, read or write): what the demand split
    /// changes and a delegated unit's `limited` leaf holds instead of the unit.
    pub fn is_io_limit(&self) -> bool {
        matches!(
            self,
            Property::IoReadBandwidthMax(_)
                | Property::IoWriteBandwidthMax(_)
                | Property::IoReadIopsMax(_)
                | Property::IoWriteIopsMax(_)
        )
    }

    /// systemd's property name on the bus.
    pub fn name(&self) -> &'static str {
        match self {
            Property::CpuQuotaPerSecUSec(_) => "CPUQuotaPerSecUSec",
            Property::CpuWeight(_) => "CPUWeight",
            Property::AllowedCpus(_) => "AllowedCPUs",
            Property::AllowedMemoryNodes(_) => "AllowedMemoryNodes",
            Property::MemoryMax(_) => "MemoryMax",
            Property::MemoryHigh(_) => "MemoryHigh",
            Property::MemoryLow(_) => "MemoryLow",
            Property::MemorySwapMax(_) => "MemorySwapMax",
            Property::IoWeight(_) => "IOWeight",
            Property::IoReadBandwidthMax(_) => "IOReadBandwidthMax",
            Property::IoWriteBandwidthMax(_) => "IOWriteBandwidthMax",
            Property::IoReadIopsMax(_) => "IOReadIOPSMax",
            Property::IoWriteIopsMax(_) => "IOWriteIOPSMax",
            Property::IoDeviceLatencyTargetUsec(_) => "IODeviceLatencyTargetUSec",
            Property::Delegate(_) => "Delegate",
        }
    }

    /// The unit-file directive systemd writes for this property in the drop-in a runtime
    /// `SetUnitProperties` leaves (`/run/systemd/system.control/UNIT.d/50-NAME.conf`): the bus
    /// name, except the CPU quota (sent in µs, written as `CPUQuota=` in percent).
    pub fn directive(&self) -> &'static str {
        match self {
            Property::CpuQuotaPerSecUSec(_) => "CPUQuota",
            Property::IoDeviceLatencyTargetUsec(_) => "IODeviceLatencyTargetSec",
            other => other.name(),
        }
    }

    /// What to send to set this property to exactly its value. systemd merges a device list
    /// into the unit's (an entry per device it names; other devices keep theirs), and only an
    /// empty list clears it: a non-empty list is sent after an empty one, so that a device the
    /// plan no longer names (storage moved, someone's `set-property`) loses its limit, as
    /// `systemctl set-property U "IOReadBandwidthMax=" "IOReadBandwidthMax=/dev/vdc 1M"` does.
    pub fn assignments(&self) -> Vec<Property> {
        match self {
            Property::IoReadBandwidthMax(l)
            | Property::IoWriteBandwidthMax(l)
            | Property::IoReadIopsMax(l)
            | Property::IoWriteIopsMax(l)
            | Property::IoDeviceLatencyTargetUsec(l)
                if !l.is_empty() =>
            {
                vec![self.reset(), self.clone()]
            }
            _ => vec![self.clone()],
        }
    }

    /// The same property with systemd's default value: what `release` sets.
    pub fn reset(&self) -> Property {
        match self {
            Property::CpuQuotaPerSecUSec(_) => Property::CpuQuotaPerSecUSec(None),
            Property::CpuWeight(_) => Property::CpuWeight(None),
            Property::AllowedCpus(_) => Property::AllowedCpus(CpuSet::default()),
            Property::AllowedMemoryNodes(_) => Property::AllowedMemoryNodes(CpuSet::default()),
            Property::MemoryMax(_) => Property::MemoryMax(None),
            Property::MemoryHigh(_) => Property::MemoryHigh(None),
            // systemd's default for MemoryLow is 0, not infinity.
            Property::MemoryLow(_) => Property::MemoryLow(Some(0)),
            Property::MemorySwapMax(_) => Property::MemorySwapMax(None),
            Property::IoWeight(_) => Property::IoWeight(None),
            Property::IoReadBandwidthMax(_) => Property::IoReadBandwidthMax(Vec::new()),
            Property::IoWriteBandwidthMax(_) => Property::IoWriteBandwidthMax(Vec::new()),
            Property::IoReadIopsMax(_) => Property::IoReadIopsMax(Vec::new()),
            Property::IoWriteIopsMax(_) => Property::IoWriteIopsMax(Vec::new()),
            Property::IoDeviceLatencyTargetUsec(_) => {
                Property::IoDeviceLatencyTargetUsec(Vec::new())
            }
            Property::Delegate(_) => Property::Delegate(false),
        }
    }

    /// The D-Bus value (`t`, `ay`, `a(st)` or `b`) in systemd's encoding.
    pub fn to_value(&self) -> Value<'static> {
        let t = |v: &Option<u64>| Value::U64(v.unwrap_or(UNSET));
        let devices = |list: &[DeviceLimit]| {
            Value::from(
                list.iter()
                    .map(|d| (d.path.clone(), d.value))
                    .collect::<Vec<(String, u64)>>(),
            )
        };
        match self {
            Property::CpuQuotaPerSecUSec(v)
            | Property::CpuWeight(v)
            | Property::MemoryMax(v)
            | Property::MemoryHigh(v)
            | Property::MemoryLow(v)
            | Property::MemorySwapMax(v)
            | Property::IoWeight(v) => t(v),
            Property::AllowedCpus(set) | Property::AllowedMemoryNodes(set) => {
                Value::from(cpuset_to_mask(set))
            }
            Property::IoReadBandwidthMax(l)
            | Property::IoWriteBandwidthMax(l)
            | Property::IoReadIopsMax(l)
            | Property::IoWriteIopsMax(l)
            | Property::IoDeviceLatencyTargetUsec(l) => devices(l),
            Property::Delegate(b) => Value::Bool(*b),
        }
    }
}

impl fmt::Display for Property {
    /// As `systemctl show` prints it, for logs and errors.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: &Option<u64>| match v {
            Some(n) => n.to_string(),
            None => "infinity".to_string(),
        };
        let devices = |l: &[DeviceLimit]| {
            l.iter()
                .map(|d| format!("{} {}", d.path, d.value))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let value = match self {
            Property::CpuWeight(None) | Property::IoWeight(None) => "[not set]".to_string(),
            Property::CpuQuotaPerSecUSec(v)
            | Property::CpuWeight(v)
            | Property::MemoryMax(v)
            | Property::MemoryHigh(v)
            | Property::MemoryLow(v)
            | Property::MemorySwapMax(v)
            | Property::IoWeight(v) => opt(v),
            Property::AllowedCpus(s) | Property::AllowedMemoryNodes(s) => s.to_string(),
            Property::IoReadBandwidthMax(l)
            | Property::IoWriteBandwidthMax(l)
            | Property::IoReadIopsMax(l)
            | Property::IoWriteIopsMax(l)
            | Property::IoDeviceLatencyTargetUsec(l) => devices(l),
            Property::Delegate(b) => if *b { "yes" } else { "no" }.to_string(),
        };
        write!(f, "{}={value}", self.name())
    }
}

/// systemd's `ay` cpu mask: bit `c % 8` of byte `c / 8` set for cpu `c`.
pub fn cpuset_to_mask(set: &CpuSet) -> Vec<u8> {
    let mut mask = Vec::new();
    for cpu in set.iter() {
        let byte = (cpu / 8) as usize;
        if mask.len() <= byte {
            mask.resize(byte + 1, 0);
        }
        mask[byte] |= 1 << (cpu % 8);
    }
    mask
}

pub fn mask_to_cpuset(mask: &[u8]) -> CpuSet {
    mask.iter()
        .enumerate()
        .flat_map(|(i, byte)| {
            (0..8u32)
                .filter(move |bit| byte & (1 << bit) != 0)
                .map(move |bit| i as u32 * 8 + bit)
        })
        .collect()
}

/// The resource side of a unit as systemd holds it now (its runtime and configured values merged).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitResources {
    /// The unit's cgroup, relative to the hierarchy root (`/system.slice/x.service`); empty when
    /// the unit is not running.
    pub control_group: String,
    pub cpu_quota_per_sec_usec: Option<u64>,
    pub cpu_weight: Option<u64>,
    pub allowed_cpus: CpuSet,
    pub allowed_memory_nodes: CpuSet,
    pub memory_max: Option<u64>,
    pub memory_high: Option<u64>,
    pub memory_low: Option<u64>,
    pub memory_swap_max: Option<u64>,
    pub io_weight: Option<u64>,
    pub io_read_bandwidth_max: Vec<DeviceLimit>,
    pub io_write_bandwidth_max: Vec<DeviceLimit>,
    pub io_read_iops_max: Vec<DeviceLimit>,
    pub io_write_iops_max: Vec<DeviceLimit>,
    pub io_device_latency_target_usec: Vec<DeviceLimit>,
    pub delegate: bool,
    /// A service's main process (`MainPID`); `None` for a scope, or a service with none (not
    /// running, a oneshot, a forking one before its pid file is read).
    pub main_pid: Option<u32>,
}

/// A property of the reply that is missing or has another type than systemd documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadProperty {
    pub property: &'static str,
    pub why: String,
}

impl UnitResources {
    /// From the `GetAll` reply of a unit's type interface (`org.freedesktop.systemd1.Service`).
    pub fn from_properties(props: &HashMap<String, OwnedValue>) -> Result<Self, BadProperty> {
        let get = |name: &'static str| {
            props.get(name).ok_or_else(|| BadProperty {
                property: name,
                why: "missing from systemd's reply".into(),
            })
        };
        let bad = |name: &'static str, v: &OwnedValue, want: &str| BadProperty {
            property: name,
            why: format!("expected {want}, got {:?}", **v),
        };
        let u64_of = |name: &'static str| -> Result<Option<u64>, BadProperty> {
            let v = get(name)?;
            match **v {
                Value::U64(n) => Ok((n != UNSET).then_some(n)),
                _ => Err(bad(name, v, "t")),
            }
        };
        let mask_of = |name: &'static str| -> Result<CpuSet, BadProperty> {
            let v = get(name)?;
            let bytes: Vec<u8> = v
                .try_clone()
                .ok()
                .and_then(|v| v.try_into().ok())
                .ok_or_else(|| bad(name, v, "ay"))?;
            Ok(mask_to_cpuset(&bytes))
        };
        let devices_of = |name: &'static str| -> Result<Vec<DeviceLimit>, BadProperty> {
            let v = get(name)?;
            let list: Vec<(String, u64)> = v
                .try_clone()
                .ok()
                .and_then(|v| v.try_into().ok())
                .ok_or_else(|| bad(name, v, "a(st)"))?;
            Ok(list
                .into_iter()
                .map(|(p, n)| DeviceLimit::new(p, n))
                .collect())
        };
        let control_group = match &**get("ControlGroup")? {
            Value::Str(s) => s.to_string(),
            _ => return Err(bad("ControlGroup", get("ControlGroup")?, "s")),
        };
        let delegate = match **get("Delegate")? {
            Value::Bool(b) => b,
            _ => return Err(bad("Delegate", get("Delegate")?, "b")),
        };
        Ok(UnitResources {
            control_group,
            cpu_quota_per_sec_usec: u64_of("CPUQuotaPerSecUSec")?,
            cpu_weight: u64_of("CPUWeight")?,
            allowed_cpus: mask_of("AllowedCPUs")?,
            allowed_memory_nodes: mask_of("AllowedMemoryNodes")?,
            memory_max: u64_of("MemoryMax")?,
            memory_high: u64_of("MemoryHigh")?,
            memory_low: u64_of("MemoryLow")?,
            memory_swap_max: u64_of("MemorySwapMax")?,
            io_weight: u64_of("IOWeight")?,
            io_read_bandwidth_max: devices_of("IOReadBandwidthMax")?,
            io_write_bandwidth_max: devices_of("IOWriteBandwidthMax")?,
            io_read_iops_max: devices_of("IOReadIOPSMax")?,
            io_write_iops_max: devices_of("IOWriteIOPSMax")?,
            // systemd >= 240; older ones (RHEL 8's 239) have no such property: nothing set.
            io_device_latency_target_usec: if props.contains_key("IODeviceLatencyTargetUSec") {
                devices_of("IODeviceLatencyTargetUSec")?
            } else {
                Vec::new()
            },
            delegate,
            // Services only (`org.freedesktop.systemd1.Service`); 0 when there is none.
            main_pid: match props.get("MainPID").map(|v| &**v) {
                None | Some(Value::U32(0)) => None,
                Some(Value::U32(p)) => Some(*p),
                Some(_) => return Err(bad("MainPID", get("MainPID")?, "u")),
            },
        })
    }

    /// The value this unit holds now for the property `p` names (to compare with a plan: drift).
    pub fn current(&self, p: &Property) -> Property {
        let list = |l: &[DeviceLimit]| {
            let mut l = l.to_vec();
            l.sort();
            l
        };
        match p {
            Property::CpuQuotaPerSecUSec(_) => {
                Property::CpuQuotaPerSecUSec(self.cpu_quota_per_sec_usec)
            }
            Property::CpuWeight(_) => Property::CpuWeight(self.cpu_weight),
            Property::AllowedCpus(_) => Property::AllowedCpus(self.allowed_cpus.clone()),
            Property::AllowedMemoryNodes(_) => {
                Property::AllowedMemoryNodes(self.allowed_memory_nodes.clone())
            }
            Property::MemoryMax(_) => Property::MemoryMax(self.memory_max),
            Property::MemoryHigh(_) => Property::MemoryHigh(self.memory_high),
            Property::MemoryLow(_) => Property::MemoryLow(self.memory_low),
            Property::MemorySwapMax(_) => Property::MemorySwapMax(self.memory_swap_max),
            Property::IoWeight(_) => Property::IoWeight(self.io_weight),
            Property::IoReadBandwidthMax(_) => {
                Property::IoReadBandwidthMax(list(&self.io_read_bandwidth_max))
            }
            Property::IoWriteBandwidthMax(_) => {
                Property::IoWriteBandwidthMax(list(&self.io_write_bandwidth_max))
            }
            Property::IoReadIopsMax(_) => Property::IoReadIopsMax(list(&self.io_read_iops_max)),
            Property::IoWriteIopsMax(_) => Property::IoWriteIopsMax(list(&self.io_write_iops_max)),
            Property::IoDeviceLatencyTargetUsec(_) => {
                Property::IoDeviceLatencyTargetUsec(list(&self.io_device_latency_target_usec))
            }
            Property::Delegate(_) => Property::Delegate(self.delegate),
        }
    }

    /// The properties of `wanted` whose value differs from what the unit holds: each as
    /// (wanted, now). Device lists compare as sets.
    pub fn drift(&self, wanted: &[Property]) -> Vec<(Property, Property)> {
        wanted
            .iter()
            .filter_map(|p| {
                let now = self.current(p);
                let want = match p {
                    Property::IoReadBandwidthMax(l) => Property::IoReadBandwidthMax(sorted(l)),
                    Property::IoWriteBandwidthMax(l) => Property::IoWriteBandwidthMax(sorted(l)),
                    Property::IoReadIopsMax(l) => Property::IoReadIopsMax(sorted(l)),
                    Property::IoWriteIopsMax(l) => Property::IoWriteIopsMax(sorted(l)),
                    Property::IoDeviceLatencyTargetUsec(l) => {
                        Property::IoDeviceLatencyTargetUsec(sorted(l))
                    }
                    other => other.clone(),
                };
                (want != now).then(|| (p.clone(), now))
            })
            .collect()
    }
}

fn sorted(l: &[DeviceLimit]) -> Vec<DeviceLimit> {
    let mut l = l.to_vec();
    l.sort();
    l
}

impl std::str::FromStr for Property {
    type Err = String;
    /// `Name=value` as `Display` prints it: numbers or `infinity`, cpu lists (`0-1`), device
    /// lists (`/dev/vdc 1048576, /dev/vdd 5`, empty to clear), `yes`/`no`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, value) = s
            .split_once('=')
            .ok_or_else(|| format!("`{s}`: expected Name=value"))?;
        let value = value.trim();
        let num = || -> Result<Option<u64>, String> {
            match value {
                "infinity" | "[not set]" | "" => Ok(None),
                v => v
                    .parse()
                    .map(Some)
                    .map_err(|_| format!("{name}: `{v}` is not a number or `infinity`")),
            }
        };
        let set =
            || -> Result<CpuSet, String> { value.parse().map_err(|e| format!("{name}: {e}")) };
        let devices = || -> Result<Vec<DeviceLimit>, String> {
            value
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(|d| {
                    let (path, n) = d
                        .rsplit_once(' ')
                        .ok_or_else(|| format!("{name}: `{d}`: expected `PATH VALUE`"))?;
                    let n = n
                        .parse()
                        .map_err(|_| format!("{name}: `{n}` is not a number"))?;
                    Ok(DeviceLimit::new(path.trim(), n))
                })
                .collect()
        };
        Ok(match name {
            "CPUQuotaPerSecUSec" => Property::CpuQuotaPerSecUSec(num()?),
            "CPUWeight" => Property::CpuWeight(num()?),
            "AllowedCPUs" => Property::AllowedCpus(set()?),
            "AllowedMemoryNodes" => Property::AllowedMemoryNodes(set()?),
            "IOWeight" => Property::IoWeight(num()?),
            "MemoryMax" => Property::MemoryMax(num()?),
            "MemoryHigh" => Property::MemoryHigh(num()?),
            "MemoryLow" => Property::MemoryLow(num()?),
            "MemorySwapMax" => Property::MemorySwapMax(num()?),
            "IOReadBandwidthMax" => Property::IoReadBandwidthMax(devices()?),
            "IOWriteBandwidthMax" => Property::IoWriteBandwidthMax(devices()?),
            "IOReadIOPSMax" => Property::IoReadIopsMax(devices()?),
            "IOWriteIOPSMax" => Property::IoWriteIopsMax(devices()?),
            "IODeviceLatencyTargetUSec" => Property::IoDeviceLatencyTargetUsec(devices()?),
            "Delegate" => Property::Delegate(match value {
                "yes" | "true" | "1" => true,
                "no" | "false" | "0" => false,
                v => return Err(format!("Delegate: `{v}` is not yes or no")),
            }),
            other => return Err(format!("`{other}` is not a property dbcage sets")),
        })
    }
}
