//! Whether a tenant's limits can act on its processes: each process must sit, for every
//! controller its limits need, in a group of that controller other than the hierarchy's root
//! (v1: the controller's hierarchy is mounted; v2: the controller is in the group's
//! `cgroup.controllers`). When it does not, writes "succeed" nowhere and the process runs
//! unlimited: the daemon refuses to start and `status` says so, instead of reporting moves.
//!
//! Reads only: /proc/PID/cgroup and `cgroup.controllers`, through the host root.

use std::collections::BTreeSet;

use super::{parse_proc_cgroup, Controller, Setup, Version};
use crate::hostfs::HostFs;

/// The controllers a tenant's limits need, from the policy's values (cpuacct never: it only
/// counts; cpuset only when the tenant pins cpus or nodes, itself or by `numa = "auto"`: the
/// full set limits nothing).
pub fn needed_by_policy(t: &crate::policy::Tenant) -> BTreeSet<Controller> {
    let mut out = BTreeSet::new();
    if t.has_io_limits() {
        out.insert(Controller::Io);
    }
    if t.cpu.cores.is_some() || t.cpu.weight.is_some_and(|w| w != 100) {
        out.insert(Controller::Cpu);
    }
    if t.cpu.cpus.is_some() || t.cpu.numa_nodes.is_some() || t.cpu.numa_auto.is_some() {
        out.insert(Controller::Cpuset);
    }
    let m = &t.memory;
    if m.max.is_some() || m.high.is_some() || m.low.is_some() || m.swap_max.is_some() {
        out.insert(Controller::Memory);
    }
    out
}

/// What the daemon's coverage check (`check`) holds a tenant's processes to: `needed`, less,
/// under systemd, the controllers systemd gives a unit no group of on this host (cpuset on
/// cgroup v1, `cgroup::systemd::unmanaged`). Their settings are reported as not applied
/// through systemd by the plan, and by `status`; a process outside a group of such a
/// controller is no reason to refuse to start and leave the tenant's other limits (and every
/// other tenant's) unapplied.
pub fn checked(
    mut needed: BTreeSet<Controller>,
    setup: &Setup,
    under_systemd: bool,
) -> BTreeSet<Controller> {
    if under_systemd {
        needed.retain(|&c| super::systemd::unmanaged_on(c, setup).is_none());
    }
    needed
}

/// The controllers a tenant gets groups in: those its limits need (`needed_by_policy`), and
/// always io, cpu and cpuacct, whose groups are where `status`, `top` and the metrics find a
/// tenant's processes, IO counters and CPU time (and a cpu group of its own gives the tenant
/// its weight as one group, as it always had). No cpuset group for a tenant that pins nothing
/// (each one's cpuset.cpus write rebuilds the scheduler's domains) and no memory group without
/// a memory setting: its processes stay in the cpuset and memory groups they were in.
pub fn grouped_by_policy(t: &crate::policy::Tenant) -> BTreeSet<Controller> {
    let mut out = needed_by_policy(t);
    out.extend([Controller::Io, Controller::Cpu, Controller::Cpuacct]);
    out
}

/// Which of `needed` a tenant's leaf lacks: no hierarchy has the controller, or (v2) the
/// controller is not in the leaf's `cgroup.controllers`, or (v1, under systemd) a unit of the
/// tenant has no group in the controller's hierarchy (systemd made none: cpuset, which it does
/// not manage on v1, or a controller it has not enabled for the unit). A leaf of dbcage's own
/// that does not exist lacks nothing here (it has no processes either).
pub fn leaf_lacks(
    layout: &super::Layout,
    tenant: &str,
    leaf: crate::classify::Leaf,
    needed: &BTreeSet<Controller>,
) -> Vec<Controller> {
    let setup = &layout.setup;
    needed
        .iter()
        .copied()
        .filter(|&c| {
            let Some(h) = setup.hierarchy_of(c) else {
                return true;
            };
            match setup.hierarchies[h].version {
                Version::V1 if layout.units.contains_key(tenant) => {
                    limit_dirs(layout, h, tenant, leaf, c)
                        .iter()
                        .any(|dir| !dir.is_dir())
                }
                Version::V1 => false,
                Version::V2 => limit_dirs(layout, h, tenant, leaf, c).iter().any(|dir| {
                    crate::hostfs::read_text(dir.join("cgroup.controllers"))
                        .is_ok_and(|have| !have.split_whitespace().any(|n| Some(n) == c.v2_name()))
                }),
            }
        })
        .collect()
}

/// The groups where controller `c` must be for a tenant's `leaf`: the leaf, or under systemd
/// its units' cgroups (the limits are theirs, and bind every group below), except io in a unit
/// that holds the tenant's leaves (`cgroup::delegated`: the IO limits are on `limited`).
fn limit_dirs(
    layout: &super::Layout,
    h: usize,
    tenant: &str,
    leaf: crate::classify::Leaf,
    c: Controller,
) -> Vec<std::path::PathBuf> {
    if !layout.units.contains_key(tenant) {
        return vec![layout.leaf_dir(h, tenant, leaf)];
    }
    let units = layout.unit_dirs(h, tenant);
    if c != Controller::Io {
        return units;
    }
    units
        .into_iter()
        .map(|unit| super::delegated::leaf_in(&unit, leaf).unwrap_or(unit))
        .collect()
}

/// A process of a tenant whose group lacks controllers its limits need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uncovered {
    pub tenant: String,
    pub pid: u32,
    /// Where the process is (the v2 group, or `controller:group` per v1 hierarchy).
    pub group: String,
    pub missing: Vec<Controller>,
}

impl std::fmt::Display for Uncovered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.missing.iter().map(|c| c.v1_name()).collect();
        write!(
            f,
            "tenant {}: pid {} in {} has no {} controller: its {} limits do not apply",
            self.tenant,
            self.pid,
            self.group,
            names.join(", "),
            names.join("/"),
        )
    }
}

/// Checks each of `pids` (a tenant's processes) against `needed`. Processes that exited in
/// the meantime are skipped. `under_systemd`: the limits other than IO are properties of the
/// process's unit, set on the unit's cgroup, and bind the groups below it (the tenant's
/// leaves in a delegated unit, `cgroup::delegated`): on v2 those controllers are looked for
/// there; IO limits are on the process's own group either way.
pub fn check(
    fs: &HostFs,
    setup: &Setup,
    tenant: &str,
    pids: &[u32],
    needed: &BTreeSet<Controller>,
    under_systemd: bool,
) -> Vec<Uncovered> {
    let mut out = Vec::new();
    if needed.is_empty() {
        return out;
    }
    for &pid in pids {
        let Ok(text) = fs.read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        let lines = parse_proc_cgroup(&text);
        let mut missing = Vec::new();
        let mut groups = Vec::new();
        for &c in needed {
            let Some(h) = setup.hierarchy_of(c).map(|i| &setup.hierarchies[i]) else {
                missing.push(c);
                continue;
            };
            let Some(path) = h.pick(&lines) else {
                missing.push(c);
                continue;
            };
            let has = match h.version {
                // Limits cannot be set on a hierarchy's root group.
                _ if path == "/" || path == h.mount_root => false,
                Version::V1 => true,
                Version::V2 => h
                    .dir_of(match crate::systemd::unit_and_group(path) {
                        Some((_, unit)) if under_systemd && c != Controller::Io => unit,
                        _ => path,
                    })
                    .and_then(|d| crate::hostfs::read_text(d.join("cgroup.controllers")).ok())
                    .is_some_and(|have| have.split_whitespace().any(|n| Some(n) == c.v2_name())),
            };
            let shown = match h.version {
                Version::V2 => path.to_string(),
                Version::V1 => format!("{}:{path}", c.v1_name()),
            };
            if !groups.contains(&shown) {
                groups.push(shown);
            }
            if !has {
                missing.push(c);
            }
        }
        if !missing.is_empty() {
            out.push(Uncovered {
                tenant: tenant.to_string(),
                pid,
                group: groups.join(" "),
                missing,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::Hierarchy;

    /// io, cpuset and memory: what a tenant with IO limits, pinned cpus and memory.max needs.
    fn needs() -> BTreeSet<Controller> {
        [Controller::Io, Controller::Cpuset, Controller::Memory]
            .into_iter()
            .collect()
    }

    fn v2_host() -> (tempfile::TempDir, HostFs, Setup) {
        let dir = tempfile::tempdir().unwrap();
        let fs = HostFs::with_root(dir.path());
        let mount = fs.path("/sys/fs/cgroup");
        let setup = Setup {
            hierarchies: vec![Hierarchy {
                version: Version::V2,
                mount_point: mount.clone(),
                mount_root: "/".into(),
                controllers: vec![
                    Controller::Io,
                    Controller::Cpu,
                    Controller::Cpuset,
                    Controller::Memory,
                ],
                mount_controllers: vec![],
                own_path: "/".into(),
            }],
            missing: vec![Controller::Cpuacct],
        };
        // The delegated setup the issue found: a leaf below a Delegate=yes unit that enabled
        // nothing for its children, and a unit whose parent enabled everything.
        for (group, controllers) in [
            ("system.slice/dbcage.service/dbcage/pg/limited", ""),
            (
                "system.slice/postgresql.service",
                "cpuset cpu io memory pids",
            ),
        ] {
            std::fs::create_dir_all(mount.join(group)).unwrap();
            std::fs::write(mount.join(group).join("cgroup.controllers"), controllers).unwrap();
        }
        for (pid, cg) in [
            (10, "/system.slice/dbcage.service/dbcage/pg/limited"),
            (11, "/system.slice/postgresql.service"),
            (12, "/"),
        ] {
            std::fs::create_dir_all(fs.path(format!("/proc/{pid}"))).unwrap();
            std::fs::write(fs.path(format!("/proc/{pid}/cgroup")), format!("0::{cg}\n")).unwrap();
        }
        (dir, fs, setup)
    }

    #[test]
    fn needed_follows_the_policy() {
        let text = "[[tenant]]\nname = \"a\"\nmatch = [{ comm = \"x\" }]\n\
                    [tenant.cpu]\ncpus = \"0\"\n[tenant.memory]\nmax = \"1GiB\"\n\
                    [[tenant]]\nname = \"b\"\nmatch = [{ comm = \"y\" }]\n[tenant.cpu]\nweight = 50\n\
                    [[tenant]]\nname = \"c\"\nmatch = [{ comm = \"z\" }]\n";
        let t = crate::policy::from_str("t.toml", text, &crate::policy::FakeAccounts)
            .unwrap()
            .policy
            .tenants
            .clone();
        let n = |i: usize| needed_by_policy(&t[i]).into_iter().collect::<Vec<_>>();
        assert_eq!(n(0), [Controller::Cpuset, Controller::Memory]);
        assert_eq!(n(1), [Controller::Cpu]);
        assert!(n(2).is_empty());
    }

    /// A v1 host under systemd (RHEL 7/8 style): systemd gives a unit groups in the cpu,
    /// memory and blkio hierarchies, none in cpuset. A pinned tenant's process in its scope
    /// sits in cpuset's root group: not a reason for the daemon to refuse to start (the plan
    /// reports the cpus as not applied through systemd); its memory group still is checked.
    #[test]
    fn under_systemd_on_v1_cpuset_is_not_checked() {
        let dir = tempfile::tempdir().unwrap();
        let fs = HostFs::with_root(dir.path());
        let v1 = |c: Controller| Hierarchy {
            version: Version::V1,
            mount_point: fs.path(format!("/sys/fs/cgroup/{}", c.v1_name())),
            mount_root: "/".into(),
            controllers: vec![c],
            mount_controllers: vec![c.v1_name().to_string()],
            own_path: "/".into(),
        };
        let setup = Setup {
            hierarchies: vec![v1(Controller::Cpuset), v1(Controller::Memory)],
            missing: vec![],
        };
        std::fs::create_dir_all(fs.path("/proc/20")).unwrap();
        let at = |memory: &str| {
            std::fs::write(
                fs.path("/proc/20/cgroup"),
                format!(
                    "2:memory:{memory}\n1:cpuset:/\n0::/\n\
                     9:name=systemd:/dbcage.slice/dbcage-pinned.scope\n"
                ),
            )
            .unwrap();
        };
        let needed: BTreeSet<Controller> = [Controller::Cpuset, Controller::Memory].into();
        assert_eq!(
            checked(needed.clone(), &setup, true),
            BTreeSet::from([Controller::Memory])
        );
        // cgroupfs on v1: dbcage makes the cpuset group itself, so it is checked.
        assert_eq!(checked(needed.clone(), &setup, false), needed);
        at("/dbcage.slice/dbcage-pinned.scope");
        let checked_sd = checked(needed.clone(), &setup, true);
        assert!(check(&fs, &setup, "pinned", &[20], &checked_sd, true).is_empty());
        // Unchecked, the scope's process would be found outside a cpuset group.
        let all = check(&fs, &setup, "pinned", &[20], &needed, true);
        assert_eq!(all[0].missing, [Controller::Cpuset]);
        // Not yet in the scope's memory group: reported as before.
        at("/");
        let found = check(&fs, &setup, "pinned", &[20], &checked_sd, true);
        assert_eq!(found[0].missing, [Controller::Memory]);
        // v2: systemd sets AllowedCPUs there, so cpuset stays checked.
        let (_d, _fs, v2) = v2_host();
        assert_eq!(checked(needed.clone(), &v2, true), needed);
    }

    #[test]
    fn v2_groups_without_the_controllers_are_reported() {
        let (_d, fs, setup) = v2_host();
        let found = check(&fs, &setup, "pg", &[10, 11, 12, 99], &needs(), false);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].pid, 10);
        assert_eq!(
            found[0].missing,
            [Controller::Io, Controller::Cpuset, Controller::Memory]
        );
        assert_eq!(
            found[0].to_string(),
            "tenant pg: pid 10 in /system.slice/dbcage.service/dbcage/pg/limited has no blkio, \
             cpuset, memory controller: its blkio/cpuset/memory limits do not apply"
        );
        // The root group: limits cannot apply there whatever it offers.
        assert_eq!(found[1].pid, 12);
        assert_eq!(found[1].group, "/");
    }

    /// Under systemd, a process in the tenant's leaf inside a delegated unit: the unit's cgroup
    /// holds the cpuset and memory limits (its properties), the leaf only io.
    #[test]
    fn under_systemd_a_delegated_units_leaf_needs_only_io_of_its_own() {
        let (_d, fs, setup) = v2_host();
        let leaf = fs.path("/sys/fs/cgroup/system.slice/postgresql.service/limited");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(leaf.join("cgroup.controllers"), "io\n").unwrap();
        std::fs::create_dir_all(fs.path("/proc/13")).unwrap();
        std::fs::write(
            fs.path("/proc/13/cgroup"),
            "0::/system.slice/postgresql.service/limited\n",
        )
        .unwrap();
        assert!(check(&fs, &setup, "pg", &[13], &needs(), true).is_empty());
        let own = check(&fs, &setup, "pg", &[13], &needs(), false);
        assert_eq!(own[0].missing, [Controller::Cpuset, Controller::Memory]);
        // Without io on the leaf its IO limits would not act, unit or not.
        std::fs::write(leaf.join("cgroup.controllers"), "").unwrap();
        let found = check(&fs, &setup, "pg", &[13], &needs(), true);
        assert_eq!(found[0].missing, [Controller::Io]);
    }

    #[test]
    fn v1_needs_the_hierarchy_and_a_group_below_its_root() {
        let (_d, fs, mut setup) = v2_host();
        setup.hierarchies = vec![Hierarchy {
            version: Version::V1,
            mount_point: fs.path("/sys/fs/cgroup/cpuset"),
            mount_root: "/".into(),
            controllers: vec![Controller::Cpuset],
            mount_controllers: vec!["cpuset".into()],
            own_path: "/".into(),
        }];
        std::fs::write(fs.path("/proc/10/cgroup"), "3:cpuset:/dbcage/pg/limited\n").unwrap();
        std::fs::write(fs.path("/proc/12/cgroup"), "3:cpuset:/\n").unwrap();
        let found = check(&fs, &setup, "pg", &[10, 12], &needs(), false);
        assert_eq!(
            found[0].missing,
            [Controller::Io, Controller::Memory],
            "not mounted"
        );
        assert_eq!(
            found[1].missing,
            [Controller::Io, Controller::Cpuset, Controller::Memory]
        );
        assert_eq!(found[1].group, "cpuset:/");
    }
}
