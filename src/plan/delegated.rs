//! Under systemd, the steps for a tenant's unit that delegates its subtree (`Delegate=yes`):
//! the tenant's `limited` and `exempt` leaves inside the unit's cgroup
//! (`cgroup::delegated`), its processes moved between them (never out of the unit), and the
//! IO limits written on `limited` by the driver of the io hierarchy, as the cgroupfs plan
//! writes them on dbcage's own leaves. The unit keeps its other limits as properties; its IO
//! properties are cleared (they would bind the exempt leaf too), after the leaf holds the
//! limits.

use super::Step;
use crate::cgroup::delegated::{moves, DelegatedTree};
use crate::cgroup::model::TenantSettings;
use crate::classify::Leaf;
use crate::systemd::Property;

/// The steps that make a delegated unit's tree hold the tenant's leaves with its IO limits:
/// the leaves made, the unit's processes moved into them (`exempt` to the exempt leaf), on
/// cgroup v2 `io` enabled for them (the unit's own group is empty by then), and the limit
/// files written. `classified` is a process's leaf as the tenant's rules place it
/// (`cgroup::delegated::moves`); `comm` names a process for the plan's readers. `page` is the
/// page size (the drivers' staging takes it).
pub fn steps(
    tenant: &str,
    unit: &str,
    tree: &DelegatedTree,
    settings: &TenantSettings,
    classified: impl Fn(u32) -> Option<Leaf>,
    comm: impl Fn(u32) -> String,
    page: u64,
) -> Vec<Step> {
    let mut out = Vec::new();
    for leaf in [Leaf::Limited, Leaf::Exempt] {
        if !tree.leaves.contains_key(&leaf) {
            out.push(Step::Mkdir {
                path: tree.leaf_dir(leaf),
                reason: format!(
                    "tenant {tenant}'s {} leaf in {unit}'s delegated cgroup",
                    leaf.dir()
                ),
            });
        }
    }
    for (pid, leaf) in moves(tree, classified) {
        out.push(Step::Move {
            pid,
            comm: comm(pid),
            tenant: tenant.to_string(),
            leaf,
            targets: vec![crate::cgroup::procs_file(&tree.leaf_dir(leaf))],
            leave: Vec::new(),
            reason: format!(
                "tenant {tenant}'s process in {unit}, to its {} leaf",
                leaf.dir()
            ),
        });
    }
    if tree.version == crate::cgroup::Version::V2 && !tree.io_enabled {
        out.push(Step::Write {
            path: tree.dir.join(crate::cgroup::v2::SUBTREE_CONTROL),
            value: "+io".into(),
            current: None,
            reason: format!("io for the leaves of {unit} (its own group holds no process now)"),
        });
    }
    let driver = tree.version.driver();
    let mut writes = Vec::new();
    for spec in driver.leaf_io_files(settings) {
        let current = tree
            .limited_files
            .get(spec.file)
            .map(String::as_str)
            .or_else(|| driver.new_group_value(spec.file));
        let path = tree.leaf_dir(Leaf::Limited).join(spec.file);
        for s in driver.stage(&spec, current, page) {
            writes.push((s.phase, s.order, path.clone(), s.value, current));
        }
    }
    writes.sort_by_key(|w| (w.0, w.1));
    for (_, _, path, value, current) in writes {
        out.push(Step::Write {
            path,
            value,
            current: current.map(|c| c.trim().to_string()),
            reason: format!("tenant {tenant}'s IO limits, on its limited leaf in {unit}"),
        });
    }
    out
}

/// The unit properties of a unit whose IO limits are on its `limited` leaf: the same, with
/// the per-device IO limits cleared (the IO weight and latency target stay: they bind the
/// unit as a whole against its siblings, which is what they mean).
pub fn without_io_limits(props: &[Property]) -> Vec<Property> {
    props
        .iter()
        .map(|p| match p {
            Property::IoReadBandwidthMax(_) => Property::IoReadBandwidthMax(Vec::new()),
            Property::IoWriteBandwidthMax(_) => Property::IoWriteBandwidthMax(Vec::new()),
            Property::IoReadIopsMax(_) => Property::IoReadIopsMax(Vec::new()),
            Property::IoWriteIopsMax(_) => Property::IoWriteIopsMax(Vec::new()),
            p => p.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cgroup::Version;
    use crate::kernel::DevNum;
    use crate::plan::tests_systemd::shown;
    use crate::policy::IoLimits;

    const DEV: DevNum = DevNum {
        major: 254,
        minor: 32,
    };

    fn settings() -> TenantSettings {
        TenantSettings {
            io: BTreeMap::from([(
                DEV,
                IoLimits {
                    read_bps: Some(1 << 20),
                    ..Default::default()
                },
            )]),
            ..Default::default()
        }
    }

    /// The steps for tenant pg in pg.service with pid 11 exempt and `limited` classified.
    fn steps_for(tree: &DelegatedTree, limited: &[u32]) -> Vec<Step> {
        let classified = |p: u32| match p {
            11 => Some(Leaf::Exempt),
            p if limited.contains(&p) => Some(Leaf::Limited),
            _ => None,
        };
        steps(
            "pg",
            "pg.service",
            tree,
            &settings(),
            classified,
            |_| String::new(),
            4096,
        )
    }

    fn fresh(version: Version) -> DelegatedTree {
        DelegatedTree {
            dir: "/cg/system.slice/pg.service".into(),
            version,
            io_available: true,
            io_enabled: false,
            in_unit: vec![10, 11],
            leaves: BTreeMap::new(),
            foreign: vec![],
            limited_files: BTreeMap::new(),
        }
    }

    /// A unit started with Delegate=yes and nothing of dbcage's yet: leaves, every process
    /// into one, then io for the leaves (v2: only once the unit's group is empty), then the
    /// limits on `limited` alone.
    #[test]
    fn a_fresh_delegated_unit_gets_leaves_moves_and_the_leaf_limits_in_that_order() {
        let s = steps_for(&fresh(Version::V2), &[]);
        assert_eq!(
            shown(&s),
            [
                "mkdir /cg/system.slice/pg.service/limited",
                "mkdir /cg/system.slice/pg.service/exempt",
                "move 10 /cg/system.slice/pg.service/limited/cgroup.procs",
                "move 11 /cg/system.slice/pg.service/exempt/cgroup.procs",
                "write /cg/system.slice/pg.service/cgroup.subtree_control +io",
                "write /cg/system.slice/pg.service/limited/io.max 254:32 rbps=1048576 wbps=max riops=max wiops=max",
            ]
        );
        // v1: no subtree_control; the blkio files of the limited leaf.
        let s = steps_for(&fresh(Version::V1), &[]);
        assert_eq!(
            shown(&s)[4..],
            ["write /cg/system.slice/pg.service/limited/blkio.throttle.read_bps_device 254:32 1048576"]
        );
    }

    /// Everything in place: no step (a rescan writes nothing).
    #[test]
    fn a_tree_in_place_plans_nothing() {
        let mut t = fresh(Version::V2);
        t.in_unit.clear();
        t.io_enabled = true;
        t.leaves = BTreeMap::from([(Leaf::Limited, vec![10]), (Leaf::Exempt, vec![11])]);
        t.limited_files = BTreeMap::from([(
            "io.max",
            "254:32 rbps=1048576 wbps=max riops=max wiops=max\n".to_string(),
        )]);
        let s = steps_for(&t, &[10]);
        assert!(s.is_empty(), "{:?}", shown(&s));
    }

    #[test]
    fn io_limits_leave_the_unit_and_the_rest_stays() {
        let props = vec![
            Property::CpuWeight(Some(50)),
            Property::IoReadBandwidthMax(vec![crate::systemd::DeviceLimit::new("/dev/vdc", 1)]),
            Property::IoWeight(Some(300)),
        ];
        assert_eq!(
            without_io_limits(&props),
            [
                Property::CpuWeight(Some(50)),
                Property::IoReadBandwidthMax(vec![]),
                Property::IoWeight(Some(300)),
            ]
        );
    }
}
