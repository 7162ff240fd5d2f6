//! The systemd driver's steps (pure): limits on a tenant's own unit where they differ, the
//! rest of its processes adopted, nothing for a unit it shares, no cpuset when not pinned.

use std::collections::HashMap;

use super::*;
use crate::cgroup::model::TenantSettings;
use crate::classify::{Leaf, Placement};
use crate::systemd::{DeviceLimit, UnitResources};

fn tenants() -> Vec<Tenant> {
    let text = "[[tenant]]\nname = \"pg\"\nmatch = [{ comm = \"postgres\" }]\n\
                [tenant.cpu]\ncores = 0.5\n";
    crate::policy::from_str("t.toml", text, &crate::policy::FakeAccounts)
        .unwrap()
        .policy
        .tenants
        .clone()
}

fn settings() -> TenantSettings {
    let mut io = BTreeMap::new();
    io.insert(
        DevNum {
            major: 254,
            minor: 32,
        },
        IoLimits {
            read_bps: Some(2 << 20),
            ..Default::default()
        },
    );
    TenantSettings {
        io,
        cpu_cores: Some(0.5),
        cpus: "0-1".parse().unwrap(),
        mems: "0".parse().unwrap(),
        ..TenantSettings::default()
    }
}

fn placed(pids: &[u32]) -> Vec<Placement> {
    pids.iter()
        .map(|&pid| Placement {
            pid,
            tenant: 0,
            leaf: Leaf::Limited,
            reason: String::new(),
        })
        .collect()
}

fn view(unit_now: UnitResources) -> SystemdView {
    let unit = "postgresql@15-main.service".to_string();
    let mut v = SystemdView {
        unified: true,
        ..Default::default()
    };
    for pid in [1, 2] {
        v.unit_of.insert(pid, unit.clone());
    }
    v.unit_group
        .insert(unit.clone(), format!("/system.slice/{unit}"));
    v.unit_of.insert(3, "session-4.scope".into());
    v.unit_pids = HashMap::from([
        (unit.clone(), vec![1, 2]),
        ("session-4.scope".into(), vec![3, 99]),
    ]);
    v.resources.insert(unit, unit_now);
    v.device_nodes.insert(
        DevNum {
            major: 254,
            minor: 32,
        },
        "/dev/vdc".into(),
    );
    // pid 4 started in the unit after the scan: not held against it being the tenant's.
    v.scanned = [1, 2, 3, 99].into_iter().collect();
    v.unit_pids
        .get_mut("postgresql@15-main.service")
        .unwrap()
        .push(4);
    v
}

/// The steps in one line each, for comparing a plan with the expected one.
pub(super) fn shown(steps: &[Step]) -> Vec<String> {
    steps
        .iter()
        .map(|s| match s {
            Step::Mkdir { path, .. } => format!("mkdir {}", path.display()),
            Step::Move { pid, targets, .. } => format!("move {pid} {}", targets[0].display()),
            Step::Write { path, value, .. } => format!("write {} {value}", path.display()),
            Step::SetUnitProperties { unit, set, .. } => format!(
                "set {unit} {}",
                set.iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Step::Adopt { pids, leaf, .. } => format!("adopt {pids:?} {leaf:?}"),
            s => format!("{s:?}"),
        })
        .collect()
}

/// A unit as systemd reports it with nothing set (MemoryLow reads 0, not infinity).
fn defaults() -> UnitResources {
    UnitResources {
        memory_low: Some(0),
        ..Default::default()
    }
}

fn plan_of() -> Plan {
    Plan {
        tenants: vec![TenantSummary {
            name: "pg".into(),
            settings: settings(),
            processes: 3,
            units: Vec::new(),
            unit_properties: Vec::new(),
            shared_units: Vec::new(),
            delegated_units: Vec::new(),
            needs_delegate: Vec::new(),
            scope_wants_leaves: false,
        }],
        ..Plan::default()
    }
}

#[test]
fn limits_go_on_the_tenants_unit_and_the_rest_is_adopted() {
    let (steps, warnings, units) = systemd_steps(
        &plan_of(),
        &placed(&[1, 2, 3]),
        &tenants(),
        &view(defaults()),
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(steps.len(), 2, "{steps:?}");
    let Step::SetUnitProperties { unit, set, .. } = &steps[0] else {
        panic!("{steps:?}")
    };
    assert_eq!(unit, "postgresql@15-main.service");
    assert_eq!(
        set,
        &[
            Property::CpuQuotaPerSecUSec(Some(500_000)),
            Property::IoReadBandwidthMax(vec![DeviceLimit::new("/dev/vdc", 2 << 20)]),
        ],
        "only what differs; AllowedCPUs not set for a tenant that does not pin"
    );
    // The session scope holds pid 99 too: pid 3 is adopted, the scope is never touched.
    let Step::Adopt { tenant, pids, .. } = &steps[1] else {
        panic!("{steps:?}")
    };
    assert_eq!((tenant.as_str(), pids.as_slice()), ("pg", &[3][..]));
    // status reads the unit holding most of the tenant's processes first, then the scope.
    assert_eq!(
        units["pg"].units,
        [
            "/system.slice/postgresql@15-main.service",
            "/dbcage.slice/dbcage-pg.scope"
        ]
    );
}

#[test]
fn a_unit_that_holds_the_plan_needs_no_step_and_drift_is_repaired() {
    let held = UnitResources {
        cpu_quota_per_sec_usec: Some(500_000),
        io_read_bandwidth_max: vec![DeviceLimit::new("/dev/vdc", 2 << 20)],
        memory_low: Some(0),
        ..Default::default()
    };
    let (steps, _, _) = systemd_steps(
        &plan_of(),
        &placed(&[1, 2]),
        &tenants(),
        &view(held.clone()),
    );
    assert!(steps.is_empty(), "{steps:?}");
    let drifted = UnitResources {
        cpu_quota_per_sec_usec: Some(900_000),
        ..held
    };
    let (steps, _, _) = systemd_steps(&plan_of(), &placed(&[1, 2]), &tenants(), &view(drifted));
    let Step::SetUnitProperties { set, was, .. } = &steps[0] else {
        panic!("{steps:?}")
    };
    assert_eq!(set, &[Property::CpuQuotaPerSecUSec(Some(500_000))]);
    assert_eq!(was, &[Property::CpuQuotaPerSecUSec(Some(900_000))]);
}

/// A unit the policy names (`unit =`) is governed in place even when it also runs processes
/// the tenant's rules leave out (here a helper of another comm); without the key the same unit
/// is shared: not governed, and warned about.
#[test]
fn a_unit_named_in_the_policy_is_governed_in_place() {
    let mut v = view(defaults());
    v.unit_pids
        .get_mut("postgresql@15-main.service")
        .unwrap()
        .push(98);
    v.unit_of.insert(98, "postgresql@15-main.service".into());
    v.scanned.insert(98);
    let (steps, warnings, units) = systemd_steps(&plan_of(), &placed(&[1, 2]), &tenants(), &v);
    assert!(
        steps.is_empty() && warnings.len() == 1 && warnings[0].contains("also runs processes"),
        "without unit =: {steps:?} {warnings:?}"
    );
    assert!(units["pg"].units.is_empty());

    let named = crate::policy::from_str(
        "t.toml",
        "[[tenant]]\nname = \"pg\"\n\
         match = [{ unit = \"postgresql@*.service\", comm = \"postgres\" }]\n",
        &crate::policy::FakeAccounts,
    )
    .unwrap()
    .policy
    .tenants
    .clone();
    let (steps, warnings, units) = systemd_steps(&plan_of(), &placed(&[1, 2]), &named, &v);
    assert!(warnings.is_empty(), "{warnings:?}");
    let [Step::SetUnitProperties { unit, .. }] = steps.as_slice() else {
        panic!("{steps:?}")
    };
    assert_eq!(unit, "postgresql@15-main.service");
    assert_eq!(
        units["pg"].units,
        ["/system.slice/postgresql@15-main.service"]
    );
}

/// The rule the plan and `release` share: a unit is the tenant's when every process in it is,
/// except those started after the scan (pid 4 here); a scanned process of no tenant (99) makes
/// the unit shared.
#[test]
fn a_process_started_after_the_scan_does_not_make_a_unit_shared() {
    let v = view(defaults());
    let mine = |p: u32| [1, 2, 3].contains(&p);
    assert!(v.holds_only("postgresql@15-main.service", mine));
    assert!(!v.holds_only("session-4.scope", mine));
    assert!(!v.holds_only("unknown.service", mine));
}

/// A service whose main process is the tenant's is its own even while a helper of no tenant
/// runs next to it (Debian's debian-start after mariadb.service starts, pid 98 here): governed,
/// not shared. A helper of another tenant (pid 97 in `other`) makes it shared again, and so does
/// a main process that is not the tenant's.
#[test]
fn a_service_whose_main_process_is_the_tenants_is_its_own_despite_a_helper() {
    let mut v = view(UnitResources {
        main_pid: Some(1),
        ..defaults()
    });
    let unit = "postgresql@15-main.service";
    v.unit_pids.get_mut(unit).unwrap().push(98);
    v.unit_of.insert(98, unit.into());
    v.scanned.insert(98);
    let (steps, warnings, units) = systemd_steps(&plan_of(), &placed(&[1, 2]), &tenants(), &v);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(
        matches!(steps.as_slice(), [Step::SetUnitProperties { unit: u, .. }] if u == unit),
        "{steps:?}"
    );
    assert_eq!(units["pg"].units, [format!("/system.slice/{unit}")]);

    let mine = |p: u32| [1, 2].contains(&p);
    assert!(v.tenants_own(unit, mine, |p| [1, 2].contains(&p)));
    assert!(
        !v.tenants_own(unit, mine, |p| [1, 2, 98].contains(&p)),
        "the helper is another tenant's"
    );
    v.resources.get_mut(unit).unwrap().main_pid = Some(98);
    assert!(!v.tenants_own(unit, mine, |p| [1, 2].contains(&p)));
    v.resources.get_mut(unit).unwrap().main_pid = None;
    assert!(!v.tenants_own(unit, mine, |p| [1, 2].contains(&p)));
}

/// cgroup v1: systemd has no cpuset there. A tenant that pins cpus is told so; one that does
/// not (its settings hold every allowed cpu, as the v1 driver needs) is not, and gets no
/// cpuset property either.
#[test]
fn on_v1_only_a_tenant_that_pins_cpus_is_told_systemd_cannot_pin_them() {
    let mut v = view(defaults());
    v.unified = false;
    let (steps, warnings, _) = systemd_steps(&plan_of(), &placed(&[1, 2]), &tenants(), &v);
    assert!(warnings.is_empty(), "{warnings:?}");
    let Step::SetUnitProperties { set, .. } = &steps[0] else {
        panic!("{steps:?}")
    };
    assert!(
        !set.iter().any(|p| matches!(
            p,
            Property::AllowedCpus(_) | Property::AllowedMemoryNodes(_)
        )),
        "{set:?}"
    );
    let pinned = crate::policy::from_str(
        "t.toml",
        "[[tenant]]\nname = \"pg\"\nmatch = [{ comm = \"postgres\" }]\n\
         [tenant.cpu]\ncores = 0.5\ncpus = \"0-1\"\n",
        &crate::policy::FakeAccounts,
    )
    .unwrap()
    .policy
    .tenants
    .clone();
    let (_, warnings, _) = systemd_steps(&plan_of(), &placed(&[1, 2]), &pinned, &v);
    assert!(
        warnings.len() == 1 && warnings[0].contains("no cpuset on cgroup v1"),
        "{warnings:?}"
    );
}

/// An exempt process (a WAL writer) in the tenant's unit gets the unit's IO limits under
/// systemd until the unit delegates its subtree: said, with `dbcage systemd-setup` and the
/// drop-in it writes, and the unit listed for it; a unit with Delegate=yes that started before
/// it had, or whose cgroup is not visible, is said so. Nothing said without IO limits.
#[test]
fn exempt_processes_under_the_units_io_limits_are_reported() {
    let mut placements = placed(&[1, 2, 3]);
    placements[1].leaf = Leaf::Exempt;
    let (steps, warnings, governed) =
        systemd_steps(&plan_of(), &placements, &tenants(), &view(defaults()));
    assert_eq!(steps.len(), 2, "the limits are set all the same: {steps:?}");
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let w = &warnings[0];
    assert!(
        w.starts_with("tenant pg: not applied through systemd: exempt processes in postgresql@15-main.service run under its IO limits"),
        "{w}"
    );
    assert!(
        w.contains("run `dbcage systemd-setup` (it writes /etc/systemd/system/postgresql@15-main.service.d/50-dbcage-delegate.conf with `Delegate=yes`"),
        "{w}"
    );
    assert_eq!(
        governed["pg"].needs_delegate,
        ["postgresql@15-main.service"]
    );
    // Delegated, but the io hierarchy shows no tree, or the unit started before Delegate=yes.
    let delegated = UnitResources {
        delegate: true,
        ..defaults()
    };
    let (_, warnings, governed) = systemd_steps(
        &plan_of(),
        &placements,
        &tenants(),
        &view(delegated.clone()),
    );
    assert!(
        warnings.len() == 1
            && warnings[0]
                .contains("has Delegate=yes, but the io hierarchy does not show its cgroup"),
        "{warnings:?}"
    );
    assert!(governed["pg"].needs_delegate.is_empty());
    let mut v = view(delegated);
    v.delegated.insert(
        "postgresql@15-main.service".into(),
        crate::cgroup::delegated::DelegatedTree {
            dir: "/sys/fs/cgroup/system.slice/postgresql@15-main.service".into(),
            version: crate::cgroup::Version::V2,
            io_available: false,
            io_enabled: false,
            in_unit: vec![1, 2],
            leaves: BTreeMap::new(),
            foreign: vec![],
            limited_files: BTreeMap::new(),
        },
    );
    let (_, warnings, _) = systemd_steps(&plan_of(), &placements, &tenants(), &v);
    assert!(
        warnings.len() == 1
            && warnings[0].contains("has Delegate=yes, but was started before it had")
            && warnings[0].ends_with("restart postgresql@15-main.service"),
        "{warnings:?}"
    );
    // cgroup v1: no leaves there, delegated or not, and no drop-in to write.
    v.unified = false;
    let (_, warnings, governed) = systemd_steps(&plan_of(), &placements, &tenants(), &v);
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("dbcage makes that leaf on cgroup v2 only")),
        "{warnings:?}"
    );
    assert!(governed["pg"].needs_delegate.is_empty());
    // An exempt process adopted into a scope that does not run yet: on v2 the plan after the
    // adoption gives it the scope's exempt leaf (nothing to say); on v1 there are no leaves.
    let mut placements = placed(&[1, 2, 3]);
    placements[2].leaf = Leaf::Exempt;
    let (_, warnings, _) = systemd_steps(&plan_of(), &placements, &tenants(), &view(defaults()));
    assert!(warnings.is_empty(), "{warnings:?}");
    let mut v1 = view(defaults());
    v1.unified = false;
    let (_, warnings, _) = systemd_steps(&plan_of(), &placements, &tenants(), &v1);
    assert!(
        warnings.len() == 1
            && warnings[0].contains("exempt processes in dbcage-pg.scope")
            && warnings[0].contains("dbcage makes that leaf on cgroup v2 only"),
        "{warnings:?}"
    );
    // No IO limits: an exempt process loses nothing in the unit.
    let mut plan = plan_of();
    plan.tenants[0].settings.io.clear();
    let mut placements = placed(&[1, 2]);
    placements[1].leaf = Leaf::Exempt;
    let (_, warnings, _) = systemd_steps(&plan, &placements, &tenants(), &view(defaults()));
    assert!(warnings.is_empty(), "{warnings:?}");
}

/// A unit with Delegate=yes whose cgroup offers io to its subgroups: the tenant's leaves in
/// it, its processes moved into them (the exempt one to `exempt`, pid 4 that started after
/// the scan to `limited`), io enabled, the IO limits on `limited`, and only then the unit's
/// properties without the IO limits. No "not applied" line; the unit is listed as holding
/// the leaves for the event path.
#[test]
fn a_delegated_unit_holds_the_tenants_leaves_with_the_io_limits_on_limited() {
    let mut placements = placed(&[1, 2, 3]);
    placements[1].leaf = Leaf::Exempt;
    let unit = "postgresql@15-main.service";
    let dir = format!("/sys/fs/cgroup/system.slice/{unit}");
    let mut v = view(UnitResources {
        delegate: true,
        ..defaults()
    });
    v.delegated.insert(
        unit.into(),
        crate::cgroup::delegated::DelegatedTree {
            dir: dir.clone().into(),
            version: crate::cgroup::Version::V2,
            io_available: true,
            io_enabled: false,
            in_unit: vec![1, 2, 4],
            leaves: BTreeMap::new(),
            foreign: vec![],
            limited_files: BTreeMap::new(),
        },
    );
    let (steps, warnings, governed) = systemd_steps(&plan_of(), &placements, &tenants(), &v);
    assert!(warnings.is_empty(), "{warnings:?}");
    let shown = shown(&steps);
    assert_eq!(
        shown,
        [
            format!("mkdir {dir}/limited"),
            format!("mkdir {dir}/exempt"),
            format!("move 1 {dir}/limited/cgroup.procs"),
            format!("move 2 {dir}/exempt/cgroup.procs"),
            format!("move 4 {dir}/limited/cgroup.procs"),
            format!("write {dir}/cgroup.subtree_control +io"),
            format!("write {dir}/limited/io.max 254:32 rbps=2097152 wbps=max riops=max wiops=max"),
            format!("set {unit} CPUQuotaPerSecUSec=500000"),
            "adopt [3] None".to_string(),
        ]
    );
    assert_eq!(
        governed["pg"].delegated,
        [(format!("/system.slice/{unit}"), dir.into())]
    );
}

/// The tenant's running scope (started by dbcage with Delegate=yes) holds its leaves as a
/// delegated unit does: pid 3, in the scope's own group, moved to `limited`, io enabled, the IO
/// limit on `limited`, the scope's IO property cleared; then the processes still to adopt go
/// straight into their leaves (pid 5 exempt, pid 6 limited), through systemd. The tenant with
/// exempt rules is marked for the daemon (an adoption that starts the scope is planned again).
#[test]
fn the_tenants_scope_holds_its_leaves_and_adoptions_go_into_them() {
    let scope = "dbcage-pg.scope";
    let dir = format!("/sys/fs/cgroup/dbcage.slice/{scope}");
    let mut v = view(defaults());
    v.unit_of.insert(3, scope.into());
    v.unit_group
        .insert(scope.into(), format!("/dbcage.slice/{scope}"));
    v.unit_pids.insert(scope.into(), vec![3]);
    v.resources.insert(
        scope.into(),
        UnitResources {
            delegate: true,
            io_read_bandwidth_max: vec![DeviceLimit::new("/dev/vdc", 2 << 20)],
            cpu_quota_per_sec_usec: Some(500_000),
            ..defaults()
        },
    );
    v.delegated.insert(
        scope.into(),
        crate::cgroup::delegated::DelegatedTree {
            dir: dir.clone().into(),
            version: crate::cgroup::Version::V2,
            io_available: true,
            io_enabled: false,
            in_unit: vec![3],
            leaves: BTreeMap::new(),
            foreign: vec![],
            limited_files: BTreeMap::new(),
        },
    );
    for pid in [5, 6] {
        v.unit_of.insert(pid, "session-4.scope".into());
        v.scanned.insert(pid);
    }
    let tenants = crate::policy::from_str(
        "t.toml",
        "[[tenant]]\nname = \"pg\"\nmatch = [{ comm = \"postgres\" }]\n\
         exempt = [{ comm = \"walwriter\" }]\n",
        &crate::policy::FakeAccounts,
    )
    .unwrap()
    .policy
    .tenants
    .clone();
    let mut placements = placed(&[3, 5, 6]);
    placements[1].leaf = Leaf::Exempt;
    let (steps, warnings, governed) = systemd_steps(&plan_of(), &placements, &tenants, &v);
    assert!(warnings.is_empty(), "{warnings:?}");
    let shown = shown(&steps);
    assert_eq!(
        shown,
        [
            format!("mkdir {dir}/limited"),
            format!("mkdir {dir}/exempt"),
            format!("move 3 {dir}/limited/cgroup.procs"),
            format!("write {dir}/cgroup.subtree_control +io"),
            format!("write {dir}/limited/io.max 254:32 rbps=2097152 wbps=max riops=max wiops=max"),
            format!("set {scope} IOReadBandwidthMax="),
            "adopt [6] Some(Limited)".to_string(),
            "adopt [5] Some(Exempt)".to_string(),
        ]
    );
    let g = &governed["pg"];
    assert_eq!(
        g.delegated,
        [(format!("/dbcage.slice/{scope}"), dir.into())]
    );
    assert!(g.scope_wants_leaves);
    assert_eq!(g.units, [format!("/dbcage.slice/{scope}")]);
}
