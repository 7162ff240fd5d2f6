//! Where each of a tenant's processes is governed under systemd (in place in a unit of its
//! own, or adopted into the tenant's transient scope), and how systemd names a device. The
//! unit properties for a tenant's settings are encoded next to the other drivers, in
//! `cgroup::systemd`.

use std::collections::BTreeMap;

use crate::kernel::DevNum;

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
    /// Processes started outside systemd: in a login session's scope, a user's manager, a
    /// getty, or in no unit at all. Adopted into the tenant's scope, by systemd.
    pub adopt: Vec<u32>,
    /// Processes already in the tenant's own scope.
    pub in_scope: Vec<u32>,
    /// Service units that also run processes of no tenant (or of another): neither governed
    /// (their other processes would get the limits) nor emptied (dbcage never moves a process
    /// out of a service). Reported, so that the admin gives the database a unit of its own.
    pub shared: BTreeMap<String, Vec<u32>>,
}

/// Sorts a tenant's processes. `unit_of` gives each process's unit (None: not in a unit);
/// `unit_is_tenants` says whether every process of a unit belongs to the tenant; `named` says
/// whether the policy names a unit in the tenant's rules (`unit =`): such a unit is governed in
/// place whatever else runs in it.
pub fn place(
    tenant_scope: &str,
    pids: &[u32],
    unit_of: impl Fn(u32) -> Option<String>,
    unit_is_tenants: impl Fn(&str) -> bool,
    named: impl Fn(&str) -> bool,
) -> Placement {
    let mut p = Placement::default();
    for &pid in pids {
        match unit_of(pid) {
            Some(u) if u == tenant_scope => p.in_scope.push(pid),
            Some(u) if named(&u) => p.units.entry(u).or_default().push(pid),
            None => p.adopt.push(pid),
            Some(u) if outside_systemd(&u) || !super::holds_processes(&u) => p.adopt.push(pid),
            Some(u) if unit_is_tenants(&u) => p.units.entry(u).or_default().push(pid),
            Some(u) => p.shared.entry(u).or_default().push(pid),
        }
    }
    p
}

/// What the daemon's event path does with a tenant's process under systemd (`on_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnEvent {
    /// In a unit the tenant is governed in (its own service, its scope), or in one it shares
    /// (left to the full plan's warning): nothing.
    Stays,
    /// In a unit the last full plan did not see (a new service): plan again, now.
    PlanAgain,
    /// Started outside systemd (no unit, a login session, a user's manager): adopt it now.
    Adopt,
}

/// Decides `OnEvent` for a process found in `found` (its unit and the unit's cgroup; `None`:
/// in no unit), from what the last full plan knew of the tenant: the cgroups of its units and
/// of the units it shares. The same sorting as `place`, for one process.
pub fn on_event(
    tenant_scope: &str,
    found: Option<(&str, &str)>,
    units: &[String],
    shared: &[String],
) -> OnEvent {
    match found {
        Some((unit, group))
            if unit == tenant_scope || units.iter().chain(shared).any(|g| g.as_str() == group) =>
        {
            OnEvent::Stays
        }
        Some((unit, _)) if super::holds_processes(unit) && !outside_systemd(unit) => {
            OnEvent::PlanAgain
        }
        _ => OnEvent::Adopt,
    }
}

/// Units that by their nature hold whatever a person starts (a login session, a user's
/// manager, a console getty without pam_systemd): a database found there was started outside
/// systemd, even when only the database runs in them right now.
pub fn outside_systemd(unit: &str) -> bool {
    (unit.starts_with("session-") && unit.ends_with(".scope"))
        || unit.starts_with("user@")
        || unit.starts_with("serial-getty@")
        || unit.starts_with("getty@")
        || unit == "init.scope"
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_event_path_adopts_only_what_systemd_did_not_start() {
        let units = ["/system.slice/postgresql@15-main.service".to_string()];
        let shared = ["/system.slice/cron.service".to_string()];
        let on = |found| on_event("dbcage-pg.scope", found, &units, &shared);
        let svc = Some(("postgresql@15-main.service", units[0].as_str()));
        assert_eq!(on(svc), OnEvent::Stays);
        let scope = Some(("dbcage-pg.scope", "/dbcage.slice/dbcage-pg.scope"));
        assert_eq!(on(scope), OnEvent::Stays);
        assert_eq!(
            on(Some(("cron.service", shared[0].as_str()))),
            OnEvent::Stays
        );
        let new_unit = Some((
            "postgresql@15-b.service",
            "/system.slice/postgresql@15-b.service",
        ));
        assert_eq!(on(new_unit), OnEvent::PlanAgain);
        let session = Some((
            "session-3.scope",
            "/user.slice/user-0.slice/session-3.scope",
        ));
        assert_eq!(on(session), OnEvent::Adopt);
        assert_eq!(
            on(Some((
                "user@0.service",
                "/user.slice/user-0.slice/user@0.service"
            ))),
            OnEvent::Adopt
        );
        assert_eq!(on(None), OnEvent::Adopt);
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
                9 => "serial-getty@ttyS0.service".into(),
                10 => "-.slice".into(),
                _ => return None,
            })
        };
        // cron.service also runs other jobs; session scopes count as outside systemd whatever
        // runs there.
        let only_tenant = |u: &str| u != "cron.service";
        let p = place(
            "dbcage-pg.scope",
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            units,
            only_tenant,
            |_| false,
        );
        assert_eq!(
            p.units.keys().collect::<Vec<_>>(),
            ["postgresql@15-main.service", "ssh.service"]
        );
        assert_eq!(p.units["postgresql@15-main.service"], [1, 2, 3]);
        assert_eq!(p.adopt, [4, 8, 9, 10]);
        assert_eq!(p.in_scope, [6]);
        // Never moved out of a service, never governed with others' processes in it.
        assert_eq!(p.shared["cron.service"], [7]);
        // A unit named in the policy is governed in place even when it is shared.
        let p = place("dbcage-pg.scope", &[7], units, only_tenant, |u| {
            u == "cron.service"
        });
        assert_eq!(p.units["cron.service"], [7]);
        assert!(p.adopt.is_empty() && p.shared.is_empty());
    }
}
