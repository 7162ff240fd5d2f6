//! Governing through systemd, one unit at a time: assert a unit's properties (read, compare,
//! set only what differs, and say what changed: the drift), adopt a tenant's processes into
//! its transient scope (created on first use, joined afterwards), and release (systemd's
//! defaults back, processes left where they are). The daemon's systemd driver calls these; the
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
/// or the running one. A scope left failed by an earlier run is reset first.
pub fn adopt(
    sd: &Systemd,
    tenant: &str,
    pids: &[u32],
    properties: &[Property],
) -> Result<Adopted, Error> {
    let scope = super::scope_name(tenant);
    match sd.attach(&scope, "", pids) {
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

/// Gives a unit back to systemd: every property dbcage manages back to systemd's default (the
/// unit file's values apply again once the runtime drop-in no longer overrides them). The
/// processes stay where they are; a tenant scope ends by itself when its last process exits.
pub fn release(sd: &Systemd, unit: &str, managed: &[Property]) -> Result<(), Error> {
    let defaults: Vec<Property> = managed.iter().map(Property::reset).collect();
    sd.set_properties(unit, &defaults)
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
