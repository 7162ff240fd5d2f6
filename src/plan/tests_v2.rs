//! The plan on a cgroup v2 (and a hybrid) layout under a tempdir: which files, in which order,
//! and that a snapshot holding the plan's result gives an empty plan. Nothing here writes to a
//! cgroup.

use std::path::Path;

use super::*;
use crate::cgroup::{v2, Hierarchy, Setup, Version};
use crate::inventory::{BlockDevice, NumaTopology, ProcInfo, TenantDevices};
use crate::policy::Accounts;

struct NoAccounts;
impl Accounts for NoAccounts {
    fn uid(&self, _: &str) -> Option<u32> {
        None
    }
    fn gid(&self, _: &str) -> Option<u32> {
        None
    }
}

const POLICY: &str = r#"
[agent]
root = "dbcage"
parent = "root"

[[tenant]]
name = "bx1"
match = [{ comm = '^ora_' }]
storage = ["/dev/vdb"]
[tenant.io]
read_bps = "8MiB"
[tenant.cpu]
cores = 0.5
weight = 200
[tenant.memory]
max = "32MiB"
"#;

fn policy(text: &str) -> Policy {
    match crate::policy::from_str("dbcage.toml", text, &NoAccounts) {
        Ok(l) => std::sync::Arc::unwrap_or_clone(l.policy),
        Err(e) => panic!("bad test policy:\n{e}"),
    }
}

fn vdb() -> DevNum {
    DevNum::new(254, 16)
}
fn vdc() -> DevNum {
    DevNum::new(254, 32)
}

/// A pure v2 host (`memory_v1`: memory on a v1 hierarchy instead, as on a hybrid host).
fn layout(tmp: &Path, p: &Policy, memory_v1: bool) -> Layout {
    let mut v2 = vec![Controller::Io, Controller::Cpu, Controller::Cpuset];
    let mut hierarchies = Vec::new();
    if memory_v1 {
        hierarchies.push(Hierarchy {
            version: Version::V1,
            mount_point: tmp.join("memory"),
            mount_root: "/".into(),
            controllers: vec![Controller::Memory],
            mount_controllers: vec!["memory".into()],
            own_path: "/".into(),
        });
    } else {
        v2.push(Controller::Memory);
    }
    hierarchies.push(Hierarchy {
        version: Version::V2,
        mount_point: tmp.join("unified"),
        mount_root: "/".into(),
        controllers: v2,
        mount_controllers: Vec::new(),
        own_path: "/".into(),
    });
    let setup = Setup {
        hierarchies,
        missing: Vec::new(),
    };
    Layout::new(setup, &p.agent).unwrap()
}

fn inventory(p: &Policy, devices: &[DevNum]) -> Inventory {
    Inventory {
        tenants: p
            .tenants
            .iter()
            .map(|_| TenantDevices {
                devices: devices
                    .iter()
                    .map(|d| BlockDevice {
                        devnum: *d,
                        name: format!("vd{}", d.minor),
                    })
                    .collect(),
                overrides: BTreeMap::new(),
            })
            .collect(),
        numa: NumaTopology {
            nodes: [(0, "0".parse().unwrap()), (1, "1".parse().unwrap())]
                .into_iter()
                .collect(),
            online_cpus: "0-1".parse().unwrap(),
            memory: Default::default(),
            balancing: None,
            huge_pages: Default::default(),
        },
        skipped_pids: Vec::new(),
        scanned: Default::default(),
        unchanged: Vec::new(),
        procs: vec![ProcInfo {
            pid: 100,
            ppid: 1,
            comm: "ora_pmon_bx1".into(),
            cmdline: "ora_pmon_bx1".into(),
            exe: None,
            uid: 0,
            gid: 0,
            start_time: 1,
            unit: None,
        }],
        mounts: Default::default(),
        mem_total: None,
    }
}

/// What the v2 parent (the hierarchy root) offers, and the process at the root.
fn snapshot(l: &Layout) -> Snapshot {
    let mut snap = Snapshot::default();
    let h = l.setup.hierarchies.len() - 1;
    snap.files.insert(
        l.parents[h].join(v2::CONTROLLERS_FILE),
        "cpuset cpu io memory hugetlb pids rdma misc\n".into(),
    );
    snap.files
        .insert(l.parents[h].join(v2::SUBTREE_CONTROL), "\n".into());
    snap.parent_cpus = Some("0-1".parse().unwrap());
    snap.parent_mems = Some("0-1".parse().unwrap());
    let dirs = l
        .setup
        .hierarchies
        .iter()
        .map(|h| Some(h.mount_point.as_path().into()))
        .collect();
    snap.proc_dirs.insert(100, dirs);
    snap
}

/// What the kernel would hold after the steps (io.max merges device lines, subtree_control adds
/// controllers, memory reads back `max`, the rest is stored as written).
fn run(l: &Layout, snap: &mut Snapshot, steps: &[Step]) {
    use crate::cgroup::driver::Driver;
    for s in steps {
        match s {
            Step::Mkdir { path, .. } => {
                snap.dirs.insert(path.as_path().into());
                // a new group holds the kernel's defaults
                for f in [
                    v2::CPU_MAX,
                    v2::CPU_WEIGHT,
                    v2::MEM_MAX,
                    v2::MEM_HIGH,
                    v2::MEM_LOW,
                    v2::MEM_SWAP_MAX,
                ] {
                    if let Some(v) = v2::V2.new_group_value(f) {
                        snap.files.insert(path.join(f), v.to_string());
                    }
                }
            }
            Step::Write { path, value, .. } => {
                let file = path.file_name().unwrap().to_str().unwrap();
                let old = snap.file(path).unwrap_or_default().to_string();
                let text = match file {
                    v2::IO_MAX => {
                        let mut m = v2::parse_io_max(&old);
                        let line = v2::parse_io_max(value);
                        let dev: DevNum = value.split(' ').next().unwrap().parse().unwrap();
                        m.remove(&dev);
                        m.extend(line);
                        m.iter()
                            .map(|(d, l)| format!("{}\n", v2::io_max_line(*d, l)))
                            .collect()
                    }
                    v2::IO_LATENCY => {
                        let mut m = v2::parse_io_latency(&old);
                        let (dev, target) = value.split_once(" target=").unwrap();
                        let dev: DevNum = dev.parse().unwrap();
                        match target.parse::<u64>() {
                            Ok(t) => m.insert(dev, t),
                            Err(_) => m.remove(&dev),
                        };
                        m.iter().map(|(d, t)| format!("{d} target={t}\n")).collect()
                    }
                    v2::SUBTREE_CONTROL => {
                        let mut have: Vec<String> =
                            old.split_whitespace().map(str::to_string).collect();
                        for c in value.split_whitespace() {
                            have.push(c.trim_start_matches('+').to_string());
                        }
                        have.join(" ") + "\n"
                    }
                    _ => format!("{value}\n"),
                };
                snap.files.insert(path.clone(), text);
            }
            Step::SetUnitProperties { .. } | Step::Adopt { .. } => {
                unreachable!("a cgroupfs plan has no systemd steps")
            }
            Step::Remove { .. } => unreachable!("on v2 a tenant has groups in its one hierarchy"),
            Step::Move {
                pid,
                targets,
                leave,
                ..
            } => {
                let d = snap.proc_dirs.get_mut(pid).unwrap();
                for t in targets.iter().chain(leave) {
                    let dir = t.parent().unwrap().to_path_buf();
                    for (h, hier) in l.setup.hierarchies.iter().enumerate() {
                        if dir.starts_with(&hier.mount_point) {
                            d[h] = Some(dir.as_path().into());
                        }
                    }
                }
            }
        }
    }
}

fn writes(steps: &[Step]) -> Vec<(String, String)> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Write { path, value, .. } => Some((path.display().to_string(), value.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn v2_files_controllers_first_then_limits() {
    let tmp = tempfile::tempdir().unwrap();
    let p = policy(POLICY);
    let l = layout(tmp.path(), &p, false);
    let snap = snapshot(&l);
    let plan = build(&p, &inventory(&p, &[vdb(), vdc()]), &l, &snap).unwrap();
    let mount = tmp.path().join("unified");
    let m = |rel: &str| mount.join(rel).display().to_string();
    let w = writes(&plan.steps);
    let enable = "+cpuset +cpu +io +memory".to_string();
    // subtree_control of the parent, the root and the tenant, in that order, before any limit
    assert_eq!(
        w[0],
        (m("cgroup.subtree_control"), enable.clone()),
        "{w:#?}"
    );
    assert_eq!(w[1], (m("dbcage/cgroup.subtree_control"), enable.clone()));
    assert_eq!(w[2], (m("dbcage/bx1/cgroup.subtree_control"), enable));
    assert!(!w
        .iter()
        .any(|(p, _)| p.ends_with("limited/cgroup.subtree_control")));
    // every mkdir comes before the first write, every move after the last
    let first_write = plan
        .steps
        .iter()
        .position(|s| matches!(s, Step::Write { .. }))
        .unwrap();
    assert!(plan.steps[..first_write]
        .iter()
        .all(|s| matches!(s, Step::Mkdir { .. })));
    assert!(matches!(plan.steps.last(), Some(Step::Move { .. })));

    let has = |path: &str, value: &str| {
        assert!(
            w.contains(&(m(path), value.to_string())),
            "no write of {value:?} to {path} in {w:#?}"
        )
    };
    has(
        "dbcage/bx1/limited/io.max",
        "254:16 rbps=4194304 wbps=max riops=max wiops=max",
    );
    has(
        "dbcage/bx1/limited/io.max",
        "254:32 rbps=4194304 wbps=max riops=max wiops=max",
    );
    has("dbcage/bx1/cpu.max", "50000 100000");
    has("dbcage/bx1/cpu.weight", "200");
    has("dbcage/bx1/cpuset.cpus", "0-1");
    has("dbcage/bx1/cpuset.mems", "0-1");
    has("dbcage/bx1/memory.max", "33554432");
    // a new group starts at memory.high `max` and memory.low 0 (what the tenant wants): no
    // write of either
    let none = |path: &str| assert!(!w.iter().any(|(p, _)| *p == m(path)), "{path}: {w:#?}");
    none("dbcage/bx1/memory.high");
    none("dbcage/bx1/memory.low");
    // the exempt leaf has no io.max line to write (an empty io.max is what it has);
    // cpu, cpuset and memory live on the tenant only; no v1 file anywhere
    assert!(!w.iter().any(|(p, _)| p.contains("/exempt/")), "{w:#?}");
    assert!(!w
        .iter()
        .any(|(p, _)| p.contains("/limited/") && !p.ends_with("io.max")));
    assert!(!w
        .iter()
        .any(|(p, _)| p.contains("blkio.") || p.contains("cfs_") || p.contains("limit_in_bytes")));
    assert!(!w.iter().any(|(p, _)| p.ends_with("memory.swap.max")));
}

#[test]
fn v2_plan_applied_is_empty_and_a_change_writes_only_the_difference() {
    let tmp = tempfile::tempdir().unwrap();
    let p = policy(POLICY);
    let l = layout(tmp.path(), &p, false);
    let inv = inventory(&p, &[vdb(), vdc()]);
    let mut snap = snapshot(&l);
    let first = build(&p, &inv, &l, &snap).unwrap();
    run(&l, &mut snap, &first.steps);
    // what the kernel shows of files nobody wrote
    let tenant = l.tenant_dir(0, "bx1");
    snap.files
        .insert(tenant.join(v2::MEM_SWAP_MAX), "max\n".into());
    snap.files.insert(
        l.leaf_dir(0, "bx1", Leaf::Exempt).join(v2::IO_MAX),
        "".into(),
    );
    let second = build(&p, &inv, &l, &snap).unwrap();
    assert!(second.is_empty(), "{:#?}", second.steps);

    // a memory limit lifted reads `max`; a device dropped is cleared with four `max`
    let changed = policy(&POLICY.replace("max = \"32MiB\"", ""));
    let third = build(&changed, &inventory(&changed, &[vdb()]), &l, &snap).unwrap();
    let w = writes(&third.steps);
    let limited = l.leaf_dir(0, "bx1", Leaf::Limited).join(v2::IO_MAX);
    // vdb's share rises from 4 to 8 MiB/s, vdc's limit is cleared (both raises), memory.max
    // is lifted; nothing else is written
    assert!(w.contains(&(
        limited.display().to_string(),
        "254:16 rbps=8388608 wbps=max riops=max wiops=max".to_string()
    )));
    assert!(w.contains(&(
        limited.display().to_string(),
        "254:32 rbps=max wbps=max riops=max wiops=max".to_string()
    )));
    assert!(w.contains(&(
        tenant.join(v2::MEM_MAX).display().to_string(),
        "max".to_string()
    )));
    assert_eq!(w.len(), 3, "{w:#?}");
}

#[test]
fn v2_io_max_lowers_each_key_before_raising_any() {
    let tmp = tempfile::tempdir().unwrap();
    let text = POLICY.replace("read_bps = \"8MiB\"", "read_bps = \"8MiB\"\nread_iops = 50");
    let p = policy(&text);
    let l = layout(tmp.path(), &p, false);
    let inv = inventory(&p, &[vdb()]);
    let mut snap = snapshot(&l);
    let first = build(&p, &inv, &l, &snap).unwrap();
    run(&l, &mut snap, &first.steps);
    let limited = l.leaf_dir(0, "bx1", Leaf::Limited).join(v2::IO_MAX);
    // now: 4 MiB/s and 100 IOPS; wanted: 8 MiB/s and 50 IOPS
    snap.files.insert(
        limited.clone(),
        "254:16 rbps=4194304 wbps=max riops=100 wiops=max\n".into(),
    );
    let w = writes(&build(&p, &inv, &l, &snap).unwrap().steps);
    let lim = limited.display().to_string();
    assert_eq!(
        w,
        vec![
            (
                lim.clone(),
                "254:16 rbps=4194304 wbps=max riops=50 wiops=max".to_string()
            ),
            (
                lim,
                "254:16 rbps=8388608 wbps=max riops=50 wiops=max".to_string()
            ),
        ]
    );
}

#[test]
fn hybrid_memory_on_v1_gets_v1_files_and_no_v2_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let p = policy(POLICY);
    let l = layout(tmp.path(), &p, true);
    let snap = snapshot(&l);
    let plan = build(&p, &inventory(&p, &[vdb()]), &l, &snap).unwrap();
    let w = writes(&plan.steps);
    let unified = tmp.path().join("unified").display().to_string();
    let memory = tmp.path().join("memory").display().to_string();
    assert_eq!(
        w[0],
        (
            format!("{unified}/cgroup.subtree_control"),
            "+cpuset +cpu +io".to_string()
        )
    );
    assert!(w.contains(&(
        format!("{memory}/dbcage/bx1/memory.limit_in_bytes"),
        "33554432".to_string()
    )));
    assert!(!w
        .iter()
        .any(|(p, _)| p.starts_with(&unified) && p.contains("/memory.")));
    assert!(!w
        .iter()
        .any(|(p, _)| p.starts_with(&memory) && p.contains("subtree_control")));
    // the process moves in both hierarchies
    let Some(Step::Move { targets, .. }) = plan.steps.last() else {
        panic!("no move: {:#?}", plan.steps)
    };
    assert_eq!(targets.len(), 2);
}

/// The root's io.cost.qos with iocost enabled on vdb only (vdc configured, then switched off).
fn with_iocost_on_vdb(l: &Layout, snap: &mut Snapshot) {
    snap.files.insert(
        l.setup.hierarchies[0].mount_point.join(v2::IO_COST_QOS),
        "254:16 enable=1 ctrl=auto rpct=0.00 rlat=250000 wpct=0.00 wlat=250000 min=1.00 max=10000.00\n\
         254:32 enable=0 ctrl=auto rpct=0.00 rlat=250000 wpct=0.00 wlat=250000 min=1.00 max=10000.00\n"
            .into(),
    );
}

const PROTECTED: &str = "read_bps = \"8MiB\"\nweight = 300\nlatency_target = \"5ms\"";

#[test]
fn v2_io_weight_and_latency_target_on_the_tenant_and_undone_when_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let p = policy(&POLICY.replace("read_bps = \"8MiB\"", PROTECTED));
    let l = layout(tmp.path(), &p, false);
    let inv = inventory(&p, &[vdb(), vdc()]);
    let mut snap = snapshot(&l);
    with_iocost_on_vdb(&l, &mut snap);
    let plan = build(&p, &inv, &l, &snap).unwrap();
    let w = writes(&plan.steps);
    let tenant = l.tenant_dir(0, "bx1");
    let at = |f: &str, v: &str| (tenant.join(f).display().to_string(), v.to_string());
    // on the tenant (the groups that compete are the tenants), never on a leaf
    assert!(w.contains(&at(v2::IO_WEIGHT, "default 300")), "{w:#?}");
    assert!(w.contains(&at(v2::IO_LATENCY, "254:16 target=5000")));
    assert!(w.contains(&at(v2::IO_LATENCY, "254:32 target=5000")));
    assert!(!w
        .iter()
        .any(|(p, _)| p.contains("/limited/io.weight") || p.contains("/limited/io.latency")));
    // the weight is after subtree_control enabled io for the tenant's children and the root's
    let enable_root = w
        .iter()
        .position(|(p, _)| p.ends_with("dbcage/cgroup.subtree_control"))
        .unwrap();
    assert!(
        w.iter()
            .position(|x| *x == at(v2::IO_WEIGHT, "default 300"))
            .unwrap()
            > enable_root
    );
    // vdc has iocost switched off: the check names it, and only it, and says how to enable it
    let warn = plan.warnings.join("\n");
    assert!(
        warn.contains("io.weight = 300 has no effect on 254:32:")
            && warn.contains("254:32 enable=1")
            && !warn.contains("254:16,"),
        "{warn}"
    );

    // applied, the same policy plans nothing
    run(&l, &mut snap, &plan.steps);
    let again = build(&p, &inv, &l, &snap).unwrap();
    assert!(
        !writes(&again.steps)
            .iter()
            .any(|(p, _)| p.ends_with("io.weight") || p.ends_with("io.latency")),
        "{:#?}",
        again.steps
    );

    // the keys removed: the weight goes back to 100 and the targets are cleared
    let plain = policy(POLICY);
    let undo = writes(&build(&plain, &inv, &l, &snap).unwrap().steps);
    assert!(
        undo.contains(&at(v2::IO_WEIGHT, "default 100")),
        "{undo:#?}"
    );
    assert!(undo.contains(&at(v2::IO_LATENCY, "254:16 target=max")));
    assert!(undo.contains(&at(v2::IO_LATENCY, "254:32 target=max")));
}

#[test]
fn v2_without_the_keys_writes_no_weight_or_latency() {
    let tmp = tempfile::tempdir().unwrap();
    let p = policy(POLICY);
    let l = layout(tmp.path(), &p, false);
    let mut snap = snapshot(&l);
    with_iocost_on_vdb(&l, &mut snap);
    let plan = build(&p, &inventory(&p, &[vdb(), vdc()]), &l, &snap).unwrap();
    assert!(!writes(&plan.steps)
        .iter()
        .any(|(p, _)| p.ends_with("io.weight") || p.ends_with("io.latency")));
    assert!(!plan.warnings.join("\n").contains("io.weight"));
}

#[test]
fn v2_kernel_without_iocost_gets_no_weight_write_and_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let p = policy(&POLICY.replace("read_bps = \"8MiB\"", PROTECTED));
    let l = layout(tmp.path(), &p, false);
    let snap = snapshot(&l); // no io.cost.qos at the root
    let plan = build(&p, &inventory(&p, &[vdb()]), &l, &snap).unwrap();
    let w = writes(&plan.steps);
    assert!(!w.iter().any(|(p, _)| p.ends_with("io.weight")), "{w:#?}");
    // the latency target does not need iocost
    assert!(w
        .iter()
        .any(|(p, v)| p.ends_with("bx1/io.latency") && v == "254:16 target=5000"));
    let warn = plan.warnings.join("\n");
    assert!(
        warn.contains("io.weight = 300 has no effect on this host")
            && warn.contains("CONFIG_BLK_CGROUP_IOCOST"),
        "{warn}"
    );
}

#[test]
fn v2_kernel_without_iolatency_gets_no_latency_write_and_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let p = policy(&POLICY.replace("read_bps = \"8MiB\"", PROTECTED));
    let l = layout(tmp.path(), &p, false);
    let mut snap = snapshot(&l);
    with_iocost_on_vdb(&l, &mut snap);
    snap.io_latency = Some(false); // a group with io.max and no io.latency was seen
    let plan = build(&p, &inventory(&p, &[vdb()]), &l, &snap).unwrap();
    let w = writes(&plan.steps);
    assert!(!w.iter().any(|(p, _)| p.ends_with("io.latency")), "{w:#?}");
    assert!(w
        .iter()
        .any(|(p, v)| p.ends_with("bx1/io.weight") && v == "default 300"));
    let warn = plan.warnings.join("\n");
    assert!(
        warn.contains("io.latency_target = 5ms has no effect on this host")
            && warn.contains("CONFIG_BLK_CGROUP_IOLATENCY"),
        "{warn}"
    );
}
