//! What the host has: block devices behind each tenant's storage, NUMA nodes, processes.
//! Everything here only reads, through a `HostFs`, so fixtures can stand in for a real host.

pub mod asm;
pub mod devices;
pub mod dirwatch;
pub mod mounts;
pub mod numa;
pub mod procs;
pub mod tasks;

use std::collections::BTreeMap;

use crate::hostfs::HostFs;
use crate::kernel::DevNum;
use crate::policy::{IoLimits, Policy, Problem};
pub use devices::BlockDevice;
pub use mounts::MountTable;
pub use numa::NumaTopology;
pub use procs::ProcInfo;

/// The devices of one tenant, and per-device overrides resolved to device numbers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantDevices {
    pub devices: Vec<BlockDevice>,
    pub overrides: BTreeMap<DevNum, IoLimits>,
}

#[derive(Debug, Clone, Default)]
pub struct Inventory {
    /// Indexed like `policy.tenants`.
    pub tenants: Vec<TenantDevices>,
    pub numa: NumaTopology,
    pub procs: Vec<ProcInfo>,
    /// The pids listed that are no process `procs` holds: kernel threads, and processes gone
    /// before their read (see `procs::Reuse::skipped`).
    pub skipped_pids: Vec<u32>,
    /// How many processes the scan listed and read (a rescan keeps what has not changed).
    pub scanned: procs::ScanCount,
    /// The pids a rescan kept from the scan before without reading them (see
    /// `procs::Scanned::unchanged`), in order; empty after a full scan.
    pub unchanged: Vec<u32>,
    pub mounts: MountTable,
    /// The host's memory (`MemTotal` of /proc/meminfo), in bytes; `None` when unreadable.
    pub mem_total: Option<u64>,
}

/// `MemTotal` of a /proc/meminfo text, in bytes.
pub fn parse_mem_total(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let kib = l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?;
        kib.trim().parse::<u64>().ok().map(|k| k * 1024)
    })
}

/// Resolves every tenant's storage. Problems carry the policy location of the path at fault.
pub fn resolve_devices(
    fs: &HostFs,
    mounts: &MountTable,
    policy: &Policy,
) -> (Vec<TenantDevices>, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut out = Vec::new();
    for t in &policy.tenants {
        let paths: Vec<String> = t.storage.iter().map(|s| s.value.clone()).collect();
        let (devices, errors) = devices::resolve_storage(fs, mounts, &paths, t.storage_level);
        for (i, e) in errors {
            problems.push(Problem::at(
                &t.storage[i].origin,
                format!("tenant `{}`: {e}", t.name),
            ));
        }
        let mut overrides = BTreeMap::new();
        for o in &t.io_devices {
            match devices::resolve_entry(fs, mounts, &o.path.value, t.storage_level) {
                Ok(devs) => {
                    for d in devs {
                        if !devices.iter().any(|x| x.devnum == d.devnum) {
                            problems.push(Problem::at(&o.path.origin, format!(
                                "tenant `{}`: io.device `{}` is device {} ({}), which is not among the tenant's storage devices",
                                t.name, o.path.value, d.devnum, d.name
                            )));
                        }
                        overrides.insert(d.devnum, o.limits);
                    }
                }
                Err(e) => problems.push(Problem::at(
                    &o.path.origin,
                    format!("tenant `{}`: io.device: {e}", t.name),
                )),
            }
        }
        out.push(TenantDevices { devices, overrides });
    }
    (out, problems)
}

/// How `gather` reads the processes.
pub enum ProcScan<'a> {
    /// Every process, with the fields the rules need (`procs::Fields::needed_by`).
    All,
    /// The daemon's rescan with its process events: what the scan before read and has not
    /// changed since is kept (see `procs::Reuse`; `comm` only where a rule needs it).
    Reusing(procs::Reuse<'a>),
}

/// Reads everything the plan needs from the host.
pub fn gather(
    fs: &HostFs,
    policy: &Policy,
    scan: ProcScan,
) -> anyhow::Result<(Inventory, Vec<Problem>)> {
    use anyhow::Context;
    let mounts = MountTable::read(fs).context("reading /proc/self/mountinfo")?;
    let (tenants, problems) = resolve_devices(fs, &mounts, policy);
    let numa = NumaTopology::read(fs).context("reading NUMA topology from /sys/devices/system")?;
    policy.refresh_pid_files(fs);
    let needed = procs::Fields::needed_by(&policy.tenants);
    let scanned = match scan {
        ProcScan::All => {
            let (procs, skipped) = procs::scan_listed(fs, needed).context("scanning /proc")?;
            let listed = procs.len() + skipped.len();
            procs::Scanned {
                procs,
                skipped,
                unchanged: Vec::new(),
                count: procs::ScanCount {
                    listed,
                    read: listed,
                },
            }
        }
        ProcScan::Reusing(reuse) => {
            procs::scan_reusing(fs, needed, reuse).context("scanning /proc")?
        }
    };
    let mem_total = fs
        .read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| parse_mem_total(&t));
    Ok((
        Inventory {
            tenants,
            numa,
            procs: scanned.procs,
            skipped_pids: scanned.skipped,
            scanned: scanned.count,
            unchanged: scanned.unchanged,
            mounts,
            mem_total,
        },
        problems,
    ))
}
