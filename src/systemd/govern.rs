//! Governing through systemd, one unit at a time: assert a unit's properties (read, compare,
//! set only what differs, and say what changed: the drift), adopt a tenant's processes into
//! its transient scope (created on first use, joined afterwards), and release (the unit's own
//! settings back, processes left where they are). The daemon's systemd driver calls these; the
//! decisions of what to set and where come from `plan`.

use super::bus::{Error, ScopeSpec, Systemd};
use super::props::Property;

/// A property that differed from the plan and was set again: (wanted, what the unit held).
pub type Repair = (Property, Property);

/// Reads the unit's properties and sets those that differ from `wanted` (all in one call, which
/// systemd checks as a whole before applying). Returns what was repaired; empty when the unit
/// already held the plan. A first apply is the same operation as a drift repair.
pub fn assert_unit(sd: &Systemd, unit: &str, wanted: &[Property]) -> Result<Vec<Repair>, Error> {
    let now = sd.unit_resources(unit)?;
    let drift = now.drift(wanted);
    if !drift.is_empty() {
        let set: Vec<Property> = drift.iter().map(|(want, _)| want.clone()).collect();
        sd.set_properties(unit, &set)?;
    }
    Ok(drift)
}

/// How `adopt` placed the processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adopted {
    /// A new scope was started with them.
    Started,
    /// They joined the tenant's running scope.
    Attached,
}

/// Moves `pids` (processes started outside systemd) into the tenant's scope under
/// `dbcage.slice`, through systemd: a new scope with Delegate=yes and the tenant's properties,
/// or the running one, into its `subgroup` (`/limited`: a leaf of the tenant's; empty: the
/// scope's own group). A new scope takes them into its own group (the next plan makes its
/// leaves). A scope left failed by an earlier run is reset first.
pub fn adopt(
    sd: &Systemd,
    tenant: &str,
    pids: &[u32],
    subgroup: &str,
    properties: &[Property],
) -> Result<Adopted, Error> {
    let scope = super::scope_name(tenant);
    match sd.attach(&scope, subgroup, pids) {
        Ok(()) => return Ok(Adopted::Attached),
        Err(e) if is_absent(&e) => {}
        Err(e) => return Err(e),
    }
    let spec = ScopeSpec {
        name: scope.clone(),
        slice: super::SLICE.into(),
        description: format!("dbcage tenant {tenant} (processes started outside systemd)"),
        pids: pids.to_vec(),
        delegate: true,
        properties: properties.to_vec(),
    };
    match sd.start_scope(&spec) {
        Err(e) if e.systemd_name() == Some("org.freedesktop.systemd1.UnitExists") => {
            // Loaded but not running (failed, or stopping): forget it and start afresh.
            let _ = sd.reset_failed(&scope);
            sd.start_scope(&spec)?;
        }
        other => other?,
    }
    Ok(Adopted::Started)
}

/// Where systemd 252 keeps the drop-ins of runtime `SetUnitProperties` calls (gone at reboot;
/// `systemctl set-property --runtime` writes there too): `system.control/UNIT.d/` for a unit
/// with a file, `transient/UNIT.d/` for a transient one (seen in the guest).
pub const RUNTIME_DROPIN_DIRS: [&str; 2] =
    ["/run/systemd/system.control", "/run/systemd/transient"];

/// How `release` gave a unit back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// A unit with a file of its own (a service, someone else's scope): the runtime drop-ins
    /// holding dbcage's properties were removed (listed, host paths). The unit's settings are
    /// its files' again once the manager has reloaded (`Systemd::reload`, once after all
    /// releases): until then systemd still holds the values dbcage set.
    DropinsRemoved(Vec<std::path::PathBuf>),
    /// dbcage's own scope (`dbcage-TENANT.scope`): it has no file but the properties it was
    /// started with, so systemd's defaults were set at runtime. The scope keeps running with
    /// its processes (stopping it would end them); it ends when its last process exits.
    ScopeLeft { processes: usize },
}

/// Gives a unit back to systemd, leaving every process where it is. A unit of its own gets its
/// files' settings back: the runtime drop-ins of the properties dbcage manages are removed (a
/// property set back to a default at runtime would itself be a drop-in, masking a unit file's
/// `CPUQuota=` or `MemoryMax=` until reboot). An admin's own `set-property --runtime` of one of
/// those properties went into the same file and is removed with it: while dbcage governed the
/// unit it was drift, replaced by the plan. Persistent settings (`/etc`, unit files, drop-ins
/// an admin wrote) are left alone. The caller reloads the manager once afterwards when any
/// drop-in was removed. dbcage's own scope gets systemd's defaults at runtime instead.
pub fn release(
    sd: &Systemd,
    fs: &crate::hostfs::HostFs,
    unit: &str,
    managed: &[Property],
) -> Result<Released, Error> {
    if super::is_dbcage_scope(unit) {
        let defaults: Vec<Property> = managed.iter().map(Property::reset).collect();
        sd.set_properties(unit, &defaults)?;
        let processes = sd.unit_pids(unit)?.len();
        return Ok(Released::ScopeLeft { processes });
    }
    let mut removed = Vec::new();
    let found = RUNTIME_DROPIN_DIRS
        .iter()
        .flat_map(|d| runtime_dropins(&fs.path(format!("{d}/{unit}.d")), managed));
    for path in found {
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(fs.host_path(&path)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(Error::Dropin {
                    unit: unit.to_string(),
                    path: fs.host_path(&path),
                    source,
                })
            }
        }
    }
    Ok(Released::DropinsRemoved(removed))
}

/// The drop-ins in `dir` (a unit's runtime control directory) that hold only properties of
/// `managed`: systemd writes one file per property, `50-NAME.conf` with a section header and
/// the property's assignments (`CPUQuota=50%`; for a device list an emptying `IOReadBandwidthMax=`
/// and a line per device). Recognised by their contents, not their names: a file with any
/// other assignment (an admin's own drop-in placed there by hand) is left alone.
pub fn runtime_dropins(dir: &std::path::Path, managed: &[Property]) -> Vec<std::path::PathBuf> {
    let directives: Vec<&str> = managed.iter().map(Property::directive).collect();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<std::path::PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "conf"))
        .filter(|p| {
            let Ok(text) = std::fs::read_to_string(p) else {
                return false;
            };
            let mut keys = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with(['#', ';', '[']))
                .map(|l| l.split_once('=').map_or(l, |(k, _)| k).trim())
                .peekable();
            keys.peek().is_some() && keys.all(|k| directives.contains(&k))
        })
        .collect();
    out.sort();
    out
}

/// The scope cannot take processes: it does not exist, or it is loaded but not running (left
/// failed by an earlier start whose job failed: systemd 252 answers AttachProcessesToUnit with
/// InvalidArgs "Unit is not active, refusing"). Starting it afresh is the remedy; a scope that
/// does run makes that start fail with UnitExists, which is reported.
fn is_absent(e: &Error) -> bool {
    matches!(
        e.systemd_name(),
        Some(
            "org.freedesktop.systemd1.NoSuchUnit"
                | "org.freedesktop.systemd1.UnitInactive"
                | "org.freedesktop.DBus.Error.InvalidArgs"
        )
    )
}
