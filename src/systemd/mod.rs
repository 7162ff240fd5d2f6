//! systemd as the host's cgroup manager: detecting it, finding the unit a process lives in, and
//! talking to its manager on the system bus (`bus`): reading and setting a unit's resource
//! properties at runtime, adopting processes into transient scopes, stopping and resetting units.
//!
//! Under systemd the cgroup tree has a single writer per group (systemd's
//! docs/CGROUP_DELEGATION.md): dbcage may write a unit's limits only through systemd's API, and
//! may write cgroup files only inside a subtree systemd delegated (`Delegate=yes`). This module
//! owns the vocabulary for that (unit names, properties, the D-Bus calls) and the one unit file
//! dbcage writes (`setup`: the drop-in that delegates a tenant's service); it never writes a
//! cgroup file and never moves a process itself (the leaves in a delegated unit are
//! `cgroup::delegated`'s, planned by `plan::delegated`).

pub mod bus;
pub mod govern;
pub mod plan;
pub mod props;
pub mod setup;

pub use bus::{Error, ScopeSpec, Systemd};
pub use props::{DeviceLimit, Property, UnitResources};

use crate::hostfs::HostFs;
use crate::policy::ManagerChoice;
pub use crate::unitname::{systemd_cgroup_of, unit_of_cgroup_path};

/// The slice dbcage's transient scopes live in.
pub const SLICE: &str = "dbcage.slice";

/// The transient scope that holds a tenant's processes started outside systemd.
/// Tenant names are validated to letters, digits, `_`, `.` and `-`, all valid in unit names.
pub fn scope_name(tenant: &str) -> String {
    format!("dbcage-{tenant}.scope")
}

/// Whether a unit is one of dbcage's tenant scopes (`scope_name`).
pub fn is_dbcage_scope(unit: &str) -> bool {
    unit.starts_with("dbcage-") && unit.ends_with(".scope")
}

/// The cgroup of a tenant's transient scope, as /proc/PID/cgroup names it (the slice is a
/// child of the root slice).
pub fn scope_cgroup(tenant: &str) -> String {
    format!("/{SLICE}/{}", scope_name(tenant))
}

/// systemd is the cgroup manager when it is PID 1 and booted the system (`sd_booted()`: the
/// directory /run/systemd/system exists). A systemd running in a container as PID 1 counts:
/// it owns that container's tree the same way.
pub fn is_cgroup_manager(fs: &HostFs) -> bool {
    let pid1 = fs.read_to_string("/proc/1/comm").unwrap_or_default();
    pid1.trim() == "systemd" && fs.path("/run/systemd/system").is_dir()
}

/// Who writes the cgroup tree dbcage governs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Manager {
    /// Through systemd: units' properties, transient scopes, delegated subtrees.
    Systemd,
    /// dbcage writes cgroupfs itself (hosts without systemd, or by choice).
    Cgroupfs,
}

impl Manager {
    pub fn as_str(self) -> &'static str {
        match self {
            Manager::Systemd => "systemd",
            Manager::Cgroupfs => "cgroupfs",
        }
    }
}

/// `agent.manager` against the host: `auto` follows detection; `systemd` on a host systemd
/// does not run is refused (with what was found), since nothing there would apply the limits.
pub fn resolve(choice: ManagerChoice, fs: &HostFs) -> Result<Manager, String> {
    let detected = is_cgroup_manager(fs);
    match choice {
        ManagerChoice::Auto if detected => Ok(Manager::Systemd),
        ManagerChoice::Auto | ManagerChoice::Cgroupfs => Ok(Manager::Cgroupfs),
        ManagerChoice::Systemd if detected => Ok(Manager::Systemd),
        ManagerChoice::Systemd => {
            let pid1 = fs.read_to_string("/proc/1/comm").unwrap_or_default();
            Err(format!(
                "agent.manager = \"systemd\", but systemd does not run this host (PID 1 is `{}`, \
                 /run/systemd/system {}); use \"auto\" or \"cgroupfs\"",
                pid1.trim(),
                if fs.path("/run/systemd/system").is_dir() {
                    "exists"
                } else {
                    "is missing"
                }
            ))
        }
    }
}

/// The unit a cgroup path belongs to (as `unit_of_cgroup_path`) and the unit's own cgroup: the
/// path up to and including the unit's component (a delegated unit's subgroups lie below it).
pub fn unit_and_group(path: &str) -> Option<(&str, &str)> {
    let unit = unit_of_cgroup_path(path)?;
    let mut end = 0;
    for component in path.split('/') {
        end += component.len();
        if component == unit {
            return Some((unit, &path[..end]));
        }
        end += 1; // the '/' after it
    }
    None
}

/// Whether a unit name is one whose processes a tenant may live in (a service or a scope).
pub fn holds_processes(unit: &str) -> bool {
    crate::unitname::PROCESS_UNIT_SUFFIXES
        .iter()
        .any(|s| unit.ends_with(s))
}

/// The unit a process lives in and the unit's cgroup, read from /proc/PID/cgroup (no bus call).
/// `Ok(None)` when the process is in no unit.
pub fn unit_group_of_pid(fs: &HostFs, pid: u32) -> std::io::Result<Option<(String, String)>> {
    let text = fs.read_to_string(format!("/proc/{pid}/cgroup"))?;
    Ok(unit_group_of(&text))
}

/// `unit_group_of_pid` from the text of /proc/PID/cgroup, for a caller that reads it for
/// more than the unit.
pub fn unit_group_of(proc_cgroup: &str) -> Option<(String, String)> {
    systemd_cgroup_of(proc_cgroup)
        .and_then(unit_and_group)
        .map(|(unit, group)| (unit.to_string(), group.to_string()))
}

/// The unit a process lives in, read from /proc/PID/cgroup (no bus call). `Ok(None)` when the
/// process is in no unit (the root, or a group systemd does not know).
pub fn unit_of_pid(fs: &HostFs, pid: u32) -> std::io::Result<Option<String>> {
    let text = fs.read_to_string(format!("/proc/{pid}/cgroup"))?;
    Ok(crate::unitname::unit_of_proc_cgroup(&text).map(str::to_string))
}

#[cfg(test)]
mod tests;
