//! The plan on synthetic values: a hand-made layout of v1 hierarchies under a tempdir, a
//! hand-made inventory and snapshot. Nothing here writes to a cgroup; the tempdir only holds
//! the few files the snapshot reader looks at (memsw presence, stale tenant directories).

use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::cgroup::{v1, Hierarchy, Setup, Version};
use crate::inventory::{BlockDevice, NumaTopology, ProcInfo, TenantDevices};
use crate::policy::FakeAccounts;

const FILE: &str = "dbcage.toml";

fn policy(text: &str) -> Policy {
    match crate::policy::from_str(FILE, text, &FakeAccounts) {
        Ok(l) => std::sync::Arc::unwrap_or_clone(l.policy),
        Err(e) => panic!("bad test policy:\n{e}"),
    }
}

/// Five v1 hierarchies, one per controller, mounted under a tempdir.
struct Host {
    tmp: tempfile::TempDir,
    layout: Layout,
    /// The memory hierarchy has swap accounting (its parent has memsw files).
    memsw: bool,
}

const HIERARCHIES: [(Controller, &str); 5] = [
    (Controller::Io, "blkio"),
    (Controller::Cpu, "cpu"),
    (Controller::Cpuacct, "cpuacct"),
    (Controller::Cpuset, "cpuset"),
    (Controller::Memory, "memory"),
];

impl Host {
    fn new(policy: &Policy) -> Host {
        Self::with(policy, false)
    }

    /// `memsw`: whether the memory hierarchy has swap accounting.
    fn with(policy: &Policy, memsw: bool) -> Host {
        let tmp = tempfile::tempdir().unwrap();
        let mut hierarchies = Vec::new();
        for (c, name) in HIERARCHIES {
            let mp = tmp.path().join(name);
            std::fs::create_dir_all(&mp).unwrap();
            hierarchies.push(Hierarchy {
                version: Version::V1,
                mount_point: mp,
                mount_root: "/".into(),
                controllers: vec![c],
                mount_controllers: vec![name.into()],
                own_path: "/".into(),
            });
        }
        if memsw {
            std::fs::write(tmp.path().join("memory").join(v1::MEMSW_LIMIT), "").unwrap();
        }
        let setup = Setup {
            hierarchies,
            missing: Vec::new(),
        };
        let layout = Layout::new(setup, &policy.agent).unwrap();
        Host { tmp, layout, memsw }
    }

    fn h(&self, c: Controller) -> usize {
        self.layout.setup.hierarchy_of(c).unwrap()
    }

    fn mount(&self, c: Controller) -> PathBuf {
        self.layout.setup.hierarchies[self.h(c)].mount_point.clone()
    }

    fn tenant_file(&self, c: Controller, tenant: &str, file: &str) -> PathBuf {
        self.layout.tenant_dir(self.h(c), tenant).join(file)
    }

    fn leaf_file(&self, c: Controller, tenant: &str, leaf: Leaf, file: &str) -> PathBuf {
        self.layout.leaf_dir(self.h(c), tenant, leaf).join(file)
    }

    /// A snapshot of a host with no dbcage group yet (only the parent's files).
    fn empty_snapshot(&self) -> Snapshot {
        let mut snap = Snapshot::default();
        if self.memsw {
            let parent = &self.layout.parents[self.h(Controller::Memory)];
            snap.files
                .insert(parent.join(v1::MEMSW_LIMIT), String::new());
        }
        snap
    }

    /// A snapshot with every group of `policy` present and every process at the hierarchy root.
    fn snapshot_with_groups(&self, policy: &Policy, pids: &[u32]) -> Snapshot {
        let mut snap = self.empty_snapshot();
        for h in 0..self.layout.setup.hierarchies.len() {
            snap.dirs.insert(self.layout.root_dir(h).into());
            for t in &policy.tenants {
                snap.dirs.insert(self.layout.tenant_dir(h, &t.name).into());
                for leaf in [Leaf::Limited, Leaf::Exempt] {
                    snap.dirs
                        .insert(self.layout.leaf_dir(h, &t.name, leaf).into());
                }
            }
        }
        self.at_root(&mut snap, pids);
        snap
    }

    fn at_root(&self, snap: &mut Snapshot, pids: &[u32]) {
        for &pid in pids {
            let dirs = self
                .layout
                .setup
                .hierarchies
                .iter()
                .map(|h| Some(h.mount_point.as_path().into()))
                .collect();
            snap.proc_dirs.insert(pid, dirs);
        }
    }

    /// What the kernel would hold after the plan's steps, as a snapshot (a new group holds
    /// the kernel's defaults).
    fn apply(&self, snap: &mut Snapshot, steps: &[Step]) {
        use crate::cgroup::driver::Driver;
        for s in steps {
            match s {
                Step::Mkdir { path, .. } => {
                    snap.dirs.insert(path.as_path().into());
                    for f in v1::managed_files(&crate::cgroup::CONTROLLERS) {
                        if let Some(v) = v1::V1.new_group_value(f) {
                            snap.files.insert(path.join(f), v.to_string());
                        }
                    }
                }
                Step::Write { path, value, .. } => {
                    let name = path.file_name().unwrap().to_string_lossy();
                    if name.starts_with("blkio.throttle.") {
                        // device files hold one line per device; `MAJ:MIN 0` removes the line
                        let mut lines = v1::parse_device_lines(snap.file(path).unwrap_or_default());
                        let (dev, v) = value.split_once(' ').unwrap();
                        let dev: DevNum = dev.parse().unwrap();
                        let v: u64 = v.parse().unwrap();
                        if v == 0 {
                            lines.remove(&dev);
                        } else {
                            lines.insert(dev, v);
                        }
                        let text: String =
                            lines.iter().map(|(d, v)| format!("{d} {v}\n")).collect();
                        snap.files.insert(path.clone(), text);
                    } else {
                        snap.files.insert(path.clone(), format!("{value}\n"));
                    }
                }
                Step::SetUnitProperties { .. } | Step::Adopt { .. } => {
                    unreachable!("a cgroupfs plan has no systemd steps")
                }
                Step::Remove { path, to, .. } => {
                    snap.dirs.retain(|d| !d.starts_with(path));
                    for dirs in snap.proc_dirs.values_mut() {
                        for d in dirs.iter_mut().flatten() {
                            if d.starts_with(path) {
                                *d = to.as_path().into();
                            }
                        }
                    }
                }
                Step::Move {
                    pid,
                    targets,
                    leave,
                    ..
                } => {
                    let dirs = snap.proc_dirs.get_mut(pid).expect("moved pid is known");
                    for t in targets.iter().chain(leave) {
                        assert_eq!(t.file_name().unwrap(), "cgroup.procs");
                        let leaf = t.parent().unwrap();
                        let h = self
                            .layout
                            .parents
                            .iter()
                            .position(|p| leaf.starts_with(p))
                            .expect("target in a hierarchy");
                        dirs[h] = Some(leaf.into());
                    }
                }
            }
        }
    }
}

fn inventory(policy: &Policy, devices: &[Vec<DevNum>], procs: Vec<ProcInfo>) -> Inventory {
    assert_eq!(policy.tenants.len(), devices.len());
    Inventory {
        tenants: devices
            .iter()
            .map(|ds| TenantDevices {
                devices: ds
                    .iter()
                    .map(|d| BlockDevice {
                        devnum: *d,
                        name: format!("loop{}", d.minor),
                    })
                    .collect(),
                overrides: BTreeMap::new(),
            })
            .collect(),
        numa: NumaTopology {
            nodes: [(0, "0-1".parse().unwrap())].into_iter().collect(),
            online_cpus: "0-1".parse().unwrap(),
            memory: Default::default(),
            balancing: None,
            huge_pages: Default::default(),
        },
        procs,
        skipped_pids: Vec::new(),
        scanned: Default::default(),
        unchanged: Vec::new(),
        mounts: Default::default(),
        mem_total: None,
    }
}

fn proc(pid: u32, comm: &str) -> ProcInfo {
    ProcInfo {
        pid,
        ppid: 1,
        comm: comm.into(),
        cmdline: comm.into(),
        exe: None,
        uid: 54321,
        gid: 54321,
        start_time: pid as u64,
        unit: None,
    }
}

fn dev(minor: u32) -> DevNum {
    DevNum::new(7, minor)
}

const MIB: u64 = 1 << 20;

/// The index of the write of `value` to `path`.
fn write_index(steps: &[Step], path: &Path, value: &str) -> usize {
    steps
        .iter()
        .position(|s| matches!(s, Step::Write { path: p, value: v, .. } if p == path && v == value))
        .unwrap_or_else(|| panic!("no write of `{value}` to {}:\n{steps:#?}", path.display()))
}

fn writes_to<'a>(steps: &'a [Step], path: &Path) -> Vec<&'a str> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Write { path: p, value, .. } if p == path => Some(value.as_str()),
            _ => None,
        })
        .collect()
}

fn error_text(r: Result<Plan, PolicyErrors>) -> Vec<String> {
    match r {
        Ok(p) => panic!("plan should fail, got {:#?}", p.steps),
        Err(e) => e.0.iter().map(|p| p.to_string()).collect(),
    }
}

// ---------------------------------------------------------------- split and per-device limits

proptest! {
    #[test]
    fn split_equal_never_exceeds_the_total(total in any::<u64>(), n in 1usize..64) {
        let share = split_equal(total, n);
        let sum = share as u128 * n as u128;
        prop_assert!(sum <= total as u128);
        prop_assert!(total as u128 - sum < n as u128);
    }
}

#[test]
fn split_equal_edges() {
    assert_eq!(split_equal(100, 0), 0);
    assert_eq!(split_equal(100, 3), 33);
    assert_eq!(split_equal(2, 3), 0);
    assert_eq!(split_equal(u64::MAX, 1), u64::MAX);
}

const IO_TENANT: &str = r#"
[[tenant]]
name = "bx1"
storage = ["/u01"]
[[tenant.match]]
comm = "^ora_"
[tenant.io]
read_bps = "100MiB"
write_iops = 1000
"#;

#[test]
fn io_per_device_splits_and_applies_overrides() {
    let p = policy(IO_TENANT);
    let t = &p.tenants[0];
    let devices = [dev(0), dev(1), dev(2)];
    let overrides: BTreeMap<DevNum, IoLimits> = [(
        dev(1),
        IoLimits {
            read_bps: Some(10 * MIB),
            read_iops: Some(50),
            ..Default::default()
        },
    )]
    .into_iter()
    .collect();
    let mut problems = Vec::new();
    let got = io_per_device(t, &devices, &overrides, &mut problems);
    assert!(problems.is_empty(), "{problems:?}");
    let share = 100 * MIB / 3;
    assert_eq!(
        got.get(&dev(0)),
        Some(&IoLimits {
            read_bps: Some(share),
            write_iops: Some(333),
            ..Default::default()
        })
    );
    assert_eq!(
        got.get(&dev(1)),
        Some(&IoLimits {
            read_bps: Some(10 * MIB),
            read_iops: Some(50),
            write_iops: Some(333),
            write_bps: None,
        })
    );
    assert_eq!(got.get(&dev(2)), got.get(&dev(0)));
    assert_eq!(got.len(), 3);
}

#[test]
fn io_per_device_without_totals_keeps_only_overridden_devices() {
    let p = policy(
        "[[tenant]]\nname = \"bx1\"\nstorage = [\"/u01\"]\n\
         [[tenant.io.device]]\npath = \"/dev/loop1\"\nwrite_bps = \"1MiB\"\n",
    );
    let overrides: BTreeMap<DevNum, IoLimits> = [(
        dev(1),
        IoLimits {
            write_bps: Some(MIB),
            ..Default::default()
        },
    )]
    .into_iter()
    .collect();
    let mut problems = Vec::new();
    let got = io_per_device(&p.tenants[0], &[dev(0), dev(1)], &overrides, &mut problems);
    assert!(problems.is_empty());
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![dev(1)]);
    assert_eq!(got[&dev(1)].write_bps, Some(MIB));
}

#[test]
fn io_total_too_small_to_split_is_a_problem() {
    let p =
        policy("[[tenant]]\nname = \"bx1\"\nstorage = [\"/u01\"]\n[tenant.io]\nread_iops = 2\n");
    let mut problems = Vec::new();
    io_per_device(
        &p.tenants[0],
        &[dev(0), dev(1), dev(2)],
        &BTreeMap::new(),
        &mut problems,
    );
    assert_eq!(problems.len(), 1);
    let msg = problems[0].to_string();
    assert!(msg.starts_with("dbcage.toml:2:8: "), "{msg}");
    assert!(
        msg.contains("io.read_iops = 2") && msg.contains("3 devices"),
        "{msg}"
    );
}

// ---------------------------------------------------------------- build, from nothing

const FULL: &str = r#"
[[tenant]]
name = "bx1"
storage = ["/u01"]
[[tenant.match]]
comm = "^ora_p"
[[tenant.exempt]]
comm = "^ora_lgwr"
[tenant.io]
read_bps = "8MiB"
write_iops = 200
[tenant.cpu]
cores = 1.5
weight = 200
[tenant.memory]
max = "2GiB"
high = "1GiB"
swap_max = "512MiB"
"#;

/// `FULL` pinned to every cpu: groups in all five hierarchies (unpinned, it has no cpuset
/// group).
fn full_pinned() -> Policy {
    policy(&FULL.replace("weight = 200\n", "weight = 200\ncpus = \"0-1\"\n"))
}

fn full_procs() -> Vec<ProcInfo> {
    vec![
        proc(100, "ora_p000_BX1"),
        proc(101, "ora_p001_BX1"),
        proc(102, "ora_lgwr_BX1"),
        proc(103, "bash"),
    ]
}

fn full_inventory(p: &Policy) -> Inventory {
    inventory(p, &[vec![dev(0), dev(1)]], full_procs())
}

/// `p` on a host with swap accounting, no dbcage group yet, and `full_procs` at the root.
fn full_host(p: &Policy) -> (Host, Inventory, Snapshot) {
    let host = Host::with(p, true);
    let inv = full_inventory(p);
    let mut snap = host.empty_snapshot();
    host.at_root(&mut snap, &[100, 101, 102, 103]);
    (host, inv, snap)
}

#[test]
fn empty_snapshot_creates_groups_then_writes_then_moves() {
    let p = full_pinned();
    let (host, inv, snap) = full_host(&p);
    let plan = build(&p, &inv, &host.layout, &snap).unwrap();
    let steps = &plan.steps;

    // every group in every hierarchy, parents first, before any write
    let mkdirs: Vec<&PathBuf> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Mkdir { path, .. } => Some(path),
            _ => None,
        })
        .collect();
    assert_eq!(mkdirs.len(), 5 * 4);
    let first_other = steps
        .iter()
        .position(|s| !matches!(s, Step::Mkdir { .. }))
        .unwrap();
    assert_eq!(
        first_other,
        mkdirs.len(),
        "every mkdir comes before any write"
    );
    for h in 0..5 {
        let l = &host.layout;
        let want = [
            l.root_dir(h),
            l.tenant_dir(h, "bx1"),
            l.leaf_dir(h, "bx1", Leaf::Limited),
            l.leaf_dir(h, "bx1", Leaf::Exempt),
        ];
        let pos: Vec<usize> = want
            .iter()
            .map(|w| mkdirs.iter().position(|m| *m == w).expect("mkdir present"))
            .collect();
        assert!(
            pos[0] < pos[1] && pos[1] < pos[2] && pos[1] < pos[3],
            "{pos:?}"
        );
    }
    assert_eq!(
        host.layout.leaf_dir(0, "bx1", Leaf::Limited),
        host.tmp.path().join("blkio/dbcage/bx1/limited")
    );

    // cpuset: every group gets cpus and mems, top-down, before any move
    let first_move = steps
        .iter()
        .position(|s| matches!(s, Step::Move { .. }))
        .unwrap();
    let cs = |g: &str| host.mount(Controller::Cpuset).join(g).join(v1::CPUS);
    let root = write_index(steps, &cs("dbcage"), "0-1");
    let tenant = write_index(steps, &cs("dbcage/bx1"), "0-1");
    let limited = write_index(steps, &cs("dbcage/bx1/limited"), "0-1");
    let exempt = write_index(steps, &cs("dbcage/bx1/exempt"), "0-1");
    assert!(root < tenant && tenant < limited && tenant < exempt);
    assert!(exempt < first_move && limited < first_move);
    for g in [
        "dbcage",
        "dbcage/bx1",
        "dbcage/bx1/limited",
        "dbcage/bx1/exempt",
    ] {
        let mems = host.mount(Controller::Cpuset).join(g).join(v1::MEMS);
        assert!(write_index(steps, &mems, "0") < first_move);
    }

    // the values
    let limited_rbps = host.leaf_file(Controller::Io, "bx1", Leaf::Limited, v1::READ_BPS);
    assert_eq!(
        writes_to(steps, &limited_rbps),
        vec![format!("7:0 {}", 4 * MIB), format!("7:1 {}", 4 * MIB)]
    );
    let limited_wiops = host.leaf_file(Controller::Io, "bx1", Leaf::Limited, v1::WRITE_IOPS);
    assert_eq!(writes_to(steps, &limited_wiops), vec!["7:0 100", "7:1 100"]);
    // nothing to clear in the exempt leaf, which starts empty
    let exempt_rbps = host.leaf_file(Controller::Io, "bx1", Leaf::Exempt, v1::READ_BPS);
    assert!(writes_to(steps, &exempt_rbps).is_empty());
    let cpu = |f| host.tenant_file(Controller::Cpu, "bx1", f);
    assert_eq!(writes_to(steps, &cpu(v1::CFS_QUOTA)), vec!["150000"]);
    // a new cpu group has the 100-ms period already: not written
    assert!(writes_to(steps, &cpu(v1::CFS_PERIOD)).is_empty());
    assert_eq!(writes_to(steps, &cpu(v1::SHARES)), vec!["2048"]);
    let mem = |f| host.tenant_file(Controller::Memory, "bx1", f);
    assert_eq!(
        writes_to(steps, &mem(v1::MEM_LIMIT)),
        vec![(2u64 << 30).to_string()]
    );
    assert_eq!(
        writes_to(steps, &mem(v1::MEM_SOFT)),
        vec![(1u64 << 30).to_string()]
    );
    assert_eq!(
        writes_to(steps, &mem(v1::MEMSW_LIMIT)),
        vec![((2u64 << 30) + (512 << 20)).to_string()]
    );

    // moves last, one target per hierarchy, into the right leaf; bash stays where it is
    assert!(steps[first_move..]
        .iter()
        .all(|s| matches!(s, Step::Move { .. })));
    let moves: Vec<(u32, Leaf, &Vec<PathBuf>)> = steps[first_move..]
        .iter()
        .map(|s| match s {
            Step::Move {
                pid, leaf, targets, ..
            } => (*pid, *leaf, targets),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(
        moves.iter().map(|m| m.0).collect::<Vec<_>>(),
        vec![100, 101, 102]
    );
    for (pid, leaf, targets) in &moves {
        let want_leaf = if *pid == 102 {
            Leaf::Exempt
        } else {
            Leaf::Limited
        };
        assert_eq!(*leaf, want_leaf);
        assert_eq!(targets.len(), 5);
        for (h, t) in targets.iter().enumerate() {
            assert_eq!(
                *t,
                host.layout
                    .leaf_dir(h, "bx1", want_leaf)
                    .join("cgroup.procs")
            );
        }
    }

    assert_eq!(plan.tenants.len(), 1);
    assert_eq!(plan.tenants[0].processes, 3);
}

#[test]
fn a_snapshot_that_holds_the_plan_gives_an_empty_plan() {
    let p = policy(FULL);
    let (host, inv, mut snap) = full_host(&p);
    let first = build(&p, &inv, &host.layout, &snap).unwrap();
    assert!(!first.is_empty());
    host.apply(&mut snap, &first.steps);
    let second = build(&p, &inv, &host.layout, &snap).unwrap();
    assert!(second.is_empty(), "second plan: {:#?}", second.steps);

    // a change of one value gives exactly the writes for it
    let changed = policy(&FULL.replace("cores = 1.5", "cores = 0.5"));
    let third = build(&changed, &inv, &host.layout, &snap).unwrap();
    assert_eq!(third.steps.len(), 1, "{:#?}", third.steps);
    assert_eq!(
        writes_to(
            &third.steps,
            &host.tenant_file(Controller::Cpu, "bx1", v1::CFS_QUOTA)
        ),
        vec!["50000"]
    );
}

#[test]
fn idempotent_with_several_tenants_and_numa() {
    let text = format!(
        "{}\n[[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^postgres\"\n\
         descendants = true\n[tenant.cpu]\nnuma_nodes = [1]\ncpus = \"2-3\"\n",
        FULL.replace("weight = 200\n", "weight = 200\ncpus = \"0-1\"\n")
    );
    let p = policy(&text);
    let host = Host::new(&p);
    let mut procs = full_procs();
    procs.push(proc(200, "postgres"));
    procs.push(ProcInfo {
        ppid: 200,
        ..proc(201, "sh")
    });
    let mut inv = inventory(&p, &[vec![dev(0), dev(1)], vec![]], procs);
    inv.numa = NumaTopology {
        nodes: [(0, "0-1".parse().unwrap()), (1, "2-3".parse().unwrap())]
            .into_iter()
            .collect(),
        online_cpus: "0-3".parse().unwrap(),
        memory: Default::default(),
        balancing: None,
        huge_pages: Default::default(),
    };
    let mut snap = Snapshot::default();
    host.at_root(&mut snap, &[100, 101, 102, 103, 200, 201]);
    let first = build(&p, &inv, &host.layout, &snap).unwrap();
    let pg_cpus = host.tenant_file(Controller::Cpuset, "pg", v1::CPUS);
    let pg_mems = host.tenant_file(Controller::Cpuset, "pg", v1::MEMS);
    assert_eq!(writes_to(&first.steps, &pg_cpus), vec!["2-3"]);
    assert_eq!(writes_to(&first.steps, &pg_mems), vec!["1"]);
    let bx1_mems = host.tenant_file(Controller::Cpuset, "bx1", v1::MEMS);
    assert_eq!(writes_to(&first.steps, &bx1_mems), vec!["0-1"]);
    let moved: Vec<u32> = first
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Move { pid, .. } => Some(*pid),
            _ => None,
        })
        .collect();
    assert_eq!(moved, vec![100, 101, 102, 200, 201]);
    // a tenant without memory limits has no memory group: nothing made, written or moved there
    let pg_memory = host.layout.tenant_dir(host.h(Controller::Memory), "pg");
    assert!(!first.steps.iter().any(|s| match s {
        Step::Mkdir { path, .. } | Step::Write { path, .. } => path.starts_with(&pg_memory),
        Step::Move { targets, .. } => targets.iter().any(|t| t.starts_with(&pg_memory)),
        _ => false,
    }));
    host.apply(&mut snap, &first.steps);
    let second = build(&p, &inv, &host.layout, &snap).unwrap();
    assert!(second.is_empty(), "second plan: {:#?}", second.steps);
}

/// The daemon's plans under its group watch: a tenant its last plan had nothing to do for is
/// not worked out again while its groups were not read again and its settings are the same;
/// its processes still move. What is not known unchanged is planned in full.
#[test]
fn a_settled_tenant_is_planned_again_only_when_read_or_changed() {
    let text = format!(
        "{}\n[[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^postgres\"\n\
         [tenant.cpu]\ncpus = \"2-3\"\n",
        FULL.replace("weight = 200\n", "weight = 200\ncpus = \"0-1\"\n")
    );
    let p = policy(&text);
    let host = Host::new(&p);
    let mut procs = full_procs();
    procs.push(proc(200, "postgres"));
    let mut inv = inventory(&p, &[vec![dev(0), dev(1)], vec![]], procs);
    inv.numa.online_cpus = "0-3".parse().unwrap();
    let mut snap = Snapshot::default();
    host.at_root(&mut snap, &[100, 101, 102, 103, 200]);
    let shares = Shares::new();
    let plan_with = |p: &Policy, inv: &Inventory, snap: &Snapshot, settled| {
        let how = Planning {
            shares: &shares,
            migrate_memory: false,
            driver: &Cgroupfs,
            settled,
        };
        let placements = p.matcher.classify(&inv.procs);
        build_with(p, inv, &host.layout, snap, &placements, &how).unwrap()
    };
    let first = plan_with(&p, &inv, &snap, None);
    assert_eq!(first.groups, vec![GroupsOutcome::Steps; 2]);
    host.apply(&mut snap, &first.steps);
    let second = plan_with(&p, &inv, &snap, None);
    assert!(second.is_empty(), "{:#?}", second.steps);
    assert_eq!(second.groups, vec![GroupsOutcome::Settled; 2]);
    let mut settled = crate::cgroup::watch::Settled::default();
    for (t, summary) in p.tenants.iter().zip(&second.tenants) {
        settled.settle(&t.name, &summary.settings, &host.layout.grouped(t));
    }

    // A value that differs, in groups the watch did not read again (so, as far as the daemon
    // knows, a value no one wrote): a plan without the memo writes it, one with it does not.
    let bx1_mems = host.tenant_file(Controller::Cpuset, "bx1", v1::MEMS);
    snap.files.insert(bx1_mems.clone(), "1\n".into());
    snap.tenants_read = Some(Default::default());
    let full = plan_with(&p, &inv, &snap, None);
    assert_eq!(writes_to(&full.steps, &bx1_mems).last(), Some(&"0"));
    let skipped = plan_with(&p, &inv, &snap, Some(&settled));
    assert!(skipped.is_empty(), "{:#?}", skipped.steps);
    assert_eq!(skipped.groups, vec![GroupsOutcome::StillSettled; 2]);
    // A settled tenant's new process still moves.
    inv.procs.push(proc(202, "postgres"));
    host.at_root(&mut snap, &[202]);
    let moved = plan_with(&p, &inv, &snap, Some(&settled));
    assert_eq!(moved.moved_pids(), vec![202]);
    assert_eq!(moved.groups, vec![GroupsOutcome::StillSettled; 2]);

    // bx1's groups read again: bx1 planned (its value repaired), pg not.
    snap.tenants_read = Some(["bx1".to_string()].into_iter().collect());
    let read = plan_with(&p, &inv, &snap, Some(&settled));
    assert_eq!(writes_to(&read.steps, &bx1_mems).last(), Some(&"0"));
    assert_eq!(
        read.groups,
        vec![GroupsOutcome::Steps, GroupsOutcome::StillSettled]
    );
    // No group known unchanged (a root read again, a full sweep): every tenant planned.
    snap.tenants_read = None;
    let all = plan_with(&p, &inv, &snap, Some(&settled));
    assert_eq!(writes_to(&all.steps, &bx1_mems).last(), Some(&"0"));
    assert_eq!(
        all.groups,
        vec![GroupsOutcome::Steps, GroupsOutcome::Settled]
    );

    // pg's settings changed (a reload, a `set`): pg planned though its groups were not read.
    snap.files.insert(bx1_mems.clone(), "0\n".into());
    snap.tenants_read = Some(Default::default());
    let p2 = policy(&text.replace("cpus = \"2-3\"", "cpus = \"2\""));
    let changed = plan_with(&p2, &inv, &snap, Some(&settled));
    let pg_cpus = host.tenant_file(Controller::Cpuset, "pg", v1::CPUS);
    assert_eq!(writes_to(&changed.steps, &pg_cpus), vec!["2"]);
    assert_eq!(
        changed.groups,
        vec![GroupsOutcome::StillSettled, GroupsOutcome::Steps]
    );
}

// ---------------------------------------------------------------- ordering of changes

#[test]
fn lowering_comes_before_raising() {
    let p = policy(FULL);
    let host = Host::new(&p);
    let inv = full_inventory(&p);
    let mut snap = host.snapshot_with_groups(&p, &[]);
    let rbps = host.leaf_file(Controller::Io, "bx1", Leaf::Limited, v1::READ_BPS);
    snap.files
        .insert(rbps.clone(), format!("7:0 {}\n7:1 {}\n", 6 * MIB, 2 * MIB));
    let plan = build(&p, &inv, &host.layout, &snap).unwrap();
    let low = write_index(&plan.steps, &rbps, &format!("7:0 {}", 4 * MIB));
    let high = write_index(&plan.steps, &rbps, &format!("7:1 {}", 4 * MIB));
    assert!(
        low < high,
        "lowering 7:0 at {low} must precede raising 7:1 at {high}"
    );
}

#[test]
fn a_removed_device_is_cleared_after_every_lowering() {
    let p = policy(&FULL.replace("write_iops = 200", "write_iops = 200\nwrite_bps = \"8MiB\""));
    let host = Host::new(&p);
    let inv = full_inventory(&p);
    let mut snap = host.snapshot_with_groups(&p, &[]);
    let rbps = host.leaf_file(Controller::Io, "bx1", Leaf::Limited, v1::READ_BPS);
    let wbps = host.leaf_file(Controller::Io, "bx1", Leaf::Limited, v1::WRITE_BPS);
    let three = format!("7:0 {m}\n7:1 {m}\n7:2 {m}\n", m = 6 * MIB);
    snap.files.insert(rbps.clone(), three.clone());
    snap.files.insert(wbps.clone(), three);
    let plan = build(&p, &inv, &host.layout, &snap).unwrap();
    let lowerings: Vec<usize> = [&rbps, &wbps]
        .iter()
        .flat_map(|f| [0, 1].map(|m| write_index(&plan.steps, f, &format!("7:{m} {}", 4 * MIB))))
        .collect();
    let last_lowering = *lowerings.iter().max().unwrap();
    for f in [&rbps, &wbps] {
        let clear = write_index(&plan.steps, f, "7:2 0");
        assert!(
            clear > last_lowering,
            "clear at {clear}, lowering at {last_lowering}"
        );
    }
}

#[test]
fn cpuset_swap_widens_top_down_and_narrows_bottom_up() {
    let p = policy(
        &format!("{FULL}[tenant.cpu]\ncpus = \"1\"\n")
            .replace("[tenant.cpu]\ncores = 1.5\nweight = 200\n", ""),
    );
    assert_eq!(
        p.tenants[0].cpu.cpus.as_ref().unwrap().value.to_string(),
        "1"
    );
    let host = Host::new(&p);
    let inv = full_inventory(&p);
    let mut snap = host.snapshot_with_groups(&p, &[]);
    let cs = |g: &str, f: &str| host.mount(Controller::Cpuset).join(g).join(f);
    snap.files.insert(cs("dbcage", v1::CPUS), "0-1\n".into());
    snap.files.insert(cs("dbcage", v1::MEMS), "0\n".into());
    for g in ["dbcage/bx1", "dbcage/bx1/limited", "dbcage/bx1/exempt"] {
        snap.files.insert(cs(g, v1::CPUS), "0\n".into());
        snap.files.insert(cs(g, v1::MEMS), "0\n".into());
    }
    let plan = build(&p, &inv, &host.layout, &snap).unwrap();
    let steps = &plan.steps;
    assert!(writes_to(steps, &cs("dbcage", v1::CPUS)).is_empty());
    assert_eq!(
        writes_to(steps, &cs("dbcage/bx1", v1::CPUS)),
        vec!["0-1", "1"]
    );
    let widen = write_index(steps, &cs("dbcage/bx1", v1::CPUS), "0-1");
    let narrow = write_index(steps, &cs("dbcage/bx1", v1::CPUS), "1");
    for leaf in ["dbcage/bx1/limited", "dbcage/bx1/exempt"] {
        let to_one = write_index(steps, &cs(leaf, v1::CPUS), "1");
        assert!(widen < to_one, "{leaf}: the tenant widens first");
        assert!(to_one < narrow, "{leaf}: leaves narrow before the tenant");
        // whatever the leaf holds in between stays within the tenant's set at that point
        if let Some(leaf_widen) = steps.iter().position(|s| {
            matches!(s, Step::Write { path, value, .. } if *path == cs(leaf, v1::CPUS) && value == "0-1")
        }) {
            assert!(widen < leaf_widen);
        }
    }
    // and the result holds
    let mut after = snap.clone();
    host.apply(&mut after, steps);
    for g in ["dbcage/bx1", "dbcage/bx1/limited", "dbcage/bx1/exempt"] {
        assert_eq!(after.file(&cs(g, v1::CPUS)), Some("1\n"));
    }
}

#[test]
fn memory_raise_writes_memsw_first_and_lower_writes_limit_first() {
    let p = policy(FULL); // max 2GiB, swap 512MiB → memsw 2.5GiB
    let host = Host::with(&p, true);
    let inv = full_inventory(&p);
    let limit = host.tenant_file(Controller::Memory, "bx1", v1::MEM_LIMIT);
    let memsw = host.tenant_file(Controller::Memory, "bx1", v1::MEMSW_LIMIT);
    let want_limit = (2u64 << 30).to_string();
    let want_memsw = ((2u64 << 30) + (512 << 20)).to_string();

    // raising from 1GiB / 1.5GiB
    let mut snap = host.snapshot_with_groups(&p, &[]);
    snap.files.insert(limit.clone(), (1u64 << 30).to_string());
    snap.files
        .insert(memsw.clone(), ((1u64 << 30) + (512 << 20)).to_string());
    let plan = build(&p, &inv, &host.layout, &snap).unwrap();
    let l = write_index(&plan.steps, &limit, &want_limit);
    let s = write_index(&plan.steps, &memsw, &want_memsw);
    assert!(s < l, "raising: memsw ({s}) before limit ({l})");

    // lowering from 4GiB / 4.5GiB
    let mut snap = host.snapshot_with_groups(&p, &[]);
    snap.files.insert(limit.clone(), (4u64 << 30).to_string());
    snap.files
        .insert(memsw.clone(), ((4u64 << 30) + (512 << 20)).to_string());
    let plan = build(&p, &inv, &host.layout, &snap).unwrap();
    let l = write_index(&plan.steps, &limit, &want_limit);
    let s = write_index(&plan.steps, &memsw, &want_memsw);
    assert!(l < s, "lowering: limit ({l}) before memsw ({s})");

    // from unlimited (as the kernel reads it back): a raise of memsw is not needed first
    let mut snap = host.snapshot_with_groups(&p, &[]);
    snap.files
        .insert(limit.clone(), "9223372036854771712\n".into());
    snap.files
        .insert(memsw.clone(), "9223372036854771712\n".into());
    let plan = build(&p, &inv, &host.layout, &snap).unwrap();
    let l = write_index(&plan.steps, &limit, &want_limit);
    let s = write_index(&plan.steps, &memsw, &want_memsw);
    assert!(l < s, "from unlimited: limit ({l}) before memsw ({s})");
}

#[test]
fn without_swap_accounting_memsw_is_left_alone() {
    let p = policy(FULL);
    let host = Host::new(&p);
    let plan = build(&p, &full_inventory(&p), &host.layout, &Snapshot::default()).unwrap();
    let memsw = host.tenant_file(Controller::Memory, "bx1", v1::MEMSW_LIMIT);
    assert!(writes_to(&plan.steps, &memsw).is_empty());
    assert!(
        plan.warnings
            .iter()
            .any(|w| w.contains("memory.swap_max needs swap accounting")),
        "{:?}",
        plan.warnings
    );
}

// ---------------------------------------------------------------- errors and warnings

#[test]
fn cpus_outside_the_parent_are_an_error() {
    let text = format!("{FULL}[tenant.cpu]\ncpus = \"0-3\"\n")
        .replace("[tenant.cpu]\ncores = 1.5\nweight = 200\n", "");
    let p = policy(&text);
    let host = Host::new(&p);
    let snap = Snapshot {
        parent_cpus: Some("0-1".parse().unwrap()),
        ..Default::default()
    };
    let e = error_text(build(&p, &full_inventory(&p), &host.layout, &snap));
    assert_eq!(e.len(), 1, "{e:?}");
    let line = text.lines().position(|l| l == "cpus = \"0-3\"").unwrap() + 1;
    assert!(
        e[0].starts_with(&format!("{FILE}:{line}:8: ")),
        "{} should be located at line {line}",
        e[0]
    );
    assert!(e[0].contains("cpus 0-3 include 2-3"), "{}", e[0]);
    assert!(e[0].contains("(0-1)"), "{}", e[0]);
}

#[test]
fn a_missing_numa_node_is_an_error() {
    let text = "[[tenant]]\nname = \"pg\"\n[tenant.cpu]\nnuma_nodes = [0, 3]\n";
    let p = policy(text);
    let host = Host::new(&p);
    let e = error_text(build(
        &p,
        &inventory(&p, &[vec![]], vec![]),
        &host.layout,
        &Snapshot::default(),
    ));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("dbcage.toml:4:14: "), "{}", e[0]);
    assert!(e[0].contains("NUMA node 3 does not exist"), "{}", e[0]);
    assert!(e[0].contains("(nodes: 0)"), "{}", e[0]);
}

#[test]
fn memory_max_below_current_rss_is_an_error() {
    let p = policy(FULL); // max 2GiB
    let host = Host::new(&p);
    let inv = full_inventory(&p);
    let mut snap = Snapshot::default();
    snap.proc_rss.insert(100, 1536 << 20);
    snap.proc_rss.insert(102, 1 << 30);
    snap.proc_rss.insert(103, 8 << 30); // bash is not the tenant's
    let e = error_text(build(&p, &inv, &host.layout, &snap));
    assert_eq!(e.len(), 1, "{e:?}");
    let line = FULL.lines().position(|l| l == "max = \"2GiB\"").unwrap() + 1;
    assert!(e[0].starts_with(&format!("{FILE}:{line}:7: ")), "{}", e[0]);
    assert!(
        e[0].contains("memory.max 2GiB is below the 2.50GiB its 3 processes"),
        "{}",
        e[0]
    );

    // just below the limit is fine
    snap.proc_rss.insert(100, 1 << 30);
    assert!(build(&p, &inv, &host.layout, &snap).is_ok());
}

#[test]
fn a_stale_tenant_directory_is_a_warning() {
    let p = policy(FULL);
    let host = Host::new(&p);
    let root = host.layout.root_dir(host.h(Controller::Cpu));
    std::fs::create_dir_all(root.join("bx0")).unwrap();
    std::fs::create_dir_all(root.join("bx1")).unwrap();
    std::fs::write(root.join("cpu.shares"), "1024").unwrap(); // a file, not a group
                                                              // The plan reads no file: the snapshot reader finds the groups.
    let snap = Snapshot::read(&crate::hostfs::HostFs::default(), &host.layout, &[]);
    let plan = build(&p, &full_inventory(&p), &host.layout, &snap).unwrap();
    let stale: Vec<&String> = plan
        .warnings
        .iter()
        .filter(|w| w.contains("dbcage release"))
        .collect();
    assert_eq!(stale.len(), 1, "{:?}", plan.warnings);
    assert!(stale[0].contains("`bx0`") && stale[0].contains("`dbcage release bx0`"));
}

#[test]
fn an_exited_process_gets_no_move() {
    let p = policy(FULL);
    let host = Host::new(&p);
    let inv = full_inventory(&p);
    let mut snap = Snapshot::default();
    host.at_root(&mut snap, &[100, 102]); // 101 exited after the scan
    let plan = build(&p, &inv, &host.layout, &snap).unwrap();
    let moved: Vec<u32> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Move { pid, .. } => Some(*pid),
            _ => None,
        })
        .collect();
    assert_eq!(moved, vec![100, 102]);
}

#[test]
fn a_process_partly_in_place_moves_only_where_it_is_not() {
    let p = full_pinned();
    let host = Host::new(&p);
    let inv = full_inventory(&p);
    let mut snap = host.snapshot_with_groups(&p, &[100]);
    let cpu = host.h(Controller::Cpu);
    snap.proc_dirs.get_mut(&100).unwrap()[cpu] =
        Some(host.layout.leaf_dir(cpu, "bx1", Leaf::Limited).into());
    let plan = build(&p, &inv, &host.layout, &snap).unwrap();
    let targets = plan
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Move {
                pid: 100, targets, ..
            } => Some(targets.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(targets.len(), 4);
    assert!(!targets
        .iter()
        .any(|t| t.starts_with(host.mount(Controller::Cpu))));
}

// ------------------------------------------------ groups only where a tenant's settings act

/// A tenant with an IO limit only, and one pinned to cpus with a memory limit.
const IO_ONLY_AND_PINNED: &str = r#"
[[tenant]]
name = "io"
storage = ["/u01"]
[[tenant.match]]
comm = "^ora_p"
[tenant.io]
read_bps = "8MiB"

[[tenant]]
name = "pinned"
[[tenant.match]]
comm = "^postgres"
[tenant.cpu]
cpus = "1"
[tenant.memory]
max = "1GiB"
"#;

/// The hierarchies of `paths` (by mount point), each once, in `HIERARCHIES` order.
fn controllers_of(host: &Host, paths: &[&PathBuf]) -> Vec<Controller> {
    HIERARCHIES
        .iter()
        .map(|(c, _)| *c)
        .filter(|c| paths.iter().any(|p| p.starts_with(host.mount(*c))))
        .collect()
}

#[test]
fn an_io_only_tenant_has_no_cpuset_or_memory_group() {
    let p = policy(IO_ONLY_AND_PINNED);
    let host = Host::new(&p);
    let inv = inventory(
        &p,
        &[vec![dev(0)], vec![]],
        vec![proc(100, "ora_p000"), proc(200, "postgres")],
    );
    let mut snap = host.empty_snapshot();
    host.at_root(&mut snap, &[100, 200]);
    let plan = build(&p, &inv, &host.layout, &snap).unwrap();
    let touched = |tenant: &str| -> Vec<Controller> {
        let paths: Vec<&PathBuf> = plan
            .steps
            .iter()
            .flat_map(|s| match s {
                Step::Mkdir { path, .. } | Step::Write { path, .. } => vec![path],
                Step::Move { targets, .. } => targets.iter().collect(),
                _ => vec![],
            })
            .filter(|p| p.components().any(|c| c.as_os_str() == tenant))
            .collect();
        controllers_of(&host, &paths)
    };
    use Controller::*;
    assert_eq!(touched("io"), vec![Io, Cpu, Cpuacct]);
    assert_eq!(touched("pinned"), vec![Io, Cpu, Cpuacct, Cpuset, Memory]);
    let targets = |pid: u32| {
        plan.steps
            .iter()
            .find_map(|s| match s {
                Step::Move {
                    pid: p,
                    targets,
                    leave,
                    ..
                } if *p == pid => Some((targets.len(), leave.len())),
                _ => None,
            })
            .unwrap()
    };
    assert_eq!(
        targets(100),
        (3, 0),
        "the io tenant's process stays in its cpuset and memory groups"
    );
    assert_eq!(targets(200), (5, 0));
    // dbcage's root is made in every hierarchy all the same
    for h in 0..5 {
        let root = host.layout.root_dir(h);
        assert!(plan
            .steps
            .iter()
            .any(|s| matches!(s, Step::Mkdir { path, .. } if *path == root)));
    }
    host.apply(&mut snap, &plan.steps);
    let again = build(&p, &inv, &host.layout, &snap).unwrap();
    assert!(again.is_empty(), "second plan: {:#?}", again.steps);
}

#[test]
fn a_process_that_leaves_a_pinned_tenant_leaves_its_cpuset_and_memory_groups() {
    let p = policy(IO_ONLY_AND_PINNED);
    let host = Host::new(&p);
    let inv = inventory(&p, &[vec![dev(0)], vec![]], vec![proc(100, "ora_p000")]);
    let mut snap = host.snapshot_with_groups(&p, &[]);
    // pid 100 ran as a postgres of the pinned tenant before it exec'd into ora_p000
    let dirs = (0..5)
        .map(|h| Some(host.layout.leaf_dir(h, "pinned", Leaf::Limited).into()))
        .collect();
    snap.proc_dirs.insert(100, dirs);
    let plan = build(&p, &inv, &host.layout, &snap).unwrap();
    let Some(Step::Move { targets, leave, .. }) =
        plan.steps.iter().find(|s| matches!(s, Step::Move { .. }))
    else {
        panic!("no move: {:#?}", plan.steps)
    };
    assert_eq!(
        controllers_of(&host, &targets.iter().collect::<Vec<_>>()),
        vec![Controller::Io, Controller::Cpu, Controller::Cpuacct]
    );
    let parents = [Controller::Cpuset, Controller::Memory]
        .map(|c| host.layout.parents[host.h(c)].join("cgroup.procs"));
    assert_eq!(leave.as_slice(), parents.as_slice());
    // the io tenant's own groups there (left from an older policy) are removed after the moves
    let removed: Vec<&PathBuf> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Remove { path, .. } => Some(path),
            _ => None,
        })
        .collect();
    assert_eq!(
        removed,
        [Controller::Cpuset, Controller::Memory]
            .map(|c| host.layout.tenant_dir(host.h(c), "io"))
            .iter()
            .collect::<Vec<_>>()
    );
    let first_remove = plan
        .steps
        .iter()
        .position(|s| matches!(s, Step::Remove { .. }))
        .unwrap();
    assert!(plan.steps[first_remove..]
        .iter()
        .all(|s| matches!(s, Step::Remove { .. })));
    host.apply(&mut snap, &plan.steps);
    let again = build(&p, &inv, &host.layout, &snap).unwrap();
    assert!(again.is_empty(), "second plan: {:#?}", again.steps);
}

#[test]
fn a_process_already_out_of_dbcage_groups_is_not_moved_back_to_the_parent() {
    // the io tenant's process sits in a cpuset and memory group of someone else's: it stays
    let p = policy(IO_ONLY_AND_PINNED);
    let host = Host::new(&p);
    let inv = inventory(&p, &[vec![dev(0)], vec![]], vec![proc(100, "ora_p000")]);
    let mut snap = host.snapshot_with_groups(&p, &[100]);
    for c in [Controller::Cpuset, Controller::Memory] {
        snap.proc_dirs.get_mut(&100).unwrap()[host.h(c)] = Some(host.mount(c).join("other").into());
    }
    let plan = build(&p, &inv, &host.layout, &snap).unwrap();
    assert!(plan.steps.iter().any(|s| matches!(
        s,
        Step::Move { targets, leave, .. } if targets.len() == 3 && leave.is_empty()
    )));
}

#[test]
fn v1_write_limit_and_memory_warnings() {
    let p = policy(&FULL.replace("write_iops = 200", "write_bps = \"4MiB\""));
    let host = Host::new(&p);
    let plan = build(&p, &full_inventory(&p), &host.layout, &Snapshot::default()).unwrap();
    let w = plan.warnings.join("\n");
    assert_eq!(plan.buffered_writes_pass, ["bx1"]);
    let note = plan.buffered_writes_note().unwrap();
    assert!(note.contains("bx1") && note.contains("O_DIRECT"), "{note}");
    assert!(
        !w.contains("O_DIRECT"),
        "the caveat is not among the warnings: {w}"
    );
    assert!(w.contains("memory.soft_limit_in_bytes"), "{w}");
}

/// memory.max above the host's memory and a quota above its online cpus never bind: warnings.
#[test]
fn limits_beyond_the_host_warn() {
    let text = "[[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^postgres\"\n\
                [tenant.cpu]\ncores = 7\n[tenant.memory]\nmax = \"1TB\"\n";
    let p = policy(text);
    let host = Host::new(&p);
    let mut inv = inventory(&p, &[vec![]], vec![]);
    inv.mem_total = Some(23 << 30);
    let plan = build(&p, &inv, &host.layout, &Snapshot::default()).unwrap();
    let w = plan.warnings.join("\n");
    assert!(
        w.contains("tenant `pg`: memory.max 931.32GiB is more than this host's memory (23GiB)"),
        "{w}"
    );
    assert!(
        w.starts_with("dbcage.toml:8:7: ") || w.contains("\ndbcage.toml:8:7: "),
        "{w}"
    );
    assert!(
        w.contains("cpu.cores = 7 is more than this host's 2 online cpus"),
        "{w}"
    );
    inv.mem_total = Some(2 << 40);
    let plan = build(&p, &inv, &host.layout, &Snapshot::default()).unwrap();
    assert!(
        !plan.warnings.join("\n").contains("memory.max"),
        "{:?}",
        plan.warnings
    );
}

#[test]
fn parse_mem_total_reads_kib() {
    let m = "MemTotal:       24557428 kB\nMemFree:         1000 kB\n";
    assert_eq!(crate::inventory::parse_mem_total(m), Some(24557428 * 1024));
    assert_eq!(crate::inventory::parse_mem_total("MemFree: 1 kB\n"), None);
}

#[test]
fn numa_nodes_without_an_allowed_cpu_are_an_error() {
    // the parent allows cpus 0-1 (node 0) and both memory nodes; node 1's cpus are 2-3
    let text = "[[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^postgres\"\n\
                [tenant.cpu]\nnuma_nodes = [1]\n";
    let p = policy(text);
    let host = Host::new(&p);
    let mut inv = inventory(&p, &[vec![]], vec![]);
    inv.numa = NumaTopology {
        nodes: [(0, "0-1".parse().unwrap()), (1, "2-3".parse().unwrap())]
            .into_iter()
            .collect(),
        online_cpus: "0-3".parse().unwrap(),
        memory: Default::default(),
        balancing: None,
        huge_pages: Default::default(),
    };
    let snap = Snapshot {
        parent_cpus: Some("0-1".parse().unwrap()),
        parent_mems: Some("0-1".parse().unwrap()),
        ..Default::default()
    };
    let e = error_text(build(&p, &inv, &host.layout, &snap));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("dbcage.toml:6:14: "), "{}", e[0]);
    assert!(e[0].contains("pg") && e[0].contains("(0-1)"), "{}", e[0]);

    // with node 0 it works, and the tenant gets node 0's cpus
    let p = policy(&text.replace("[1]", "[0]"));
    let plan = build(&p, &inv, &host.layout, &snap).unwrap();
    assert_eq!(plan.tenants[0].settings.cpus.to_string(), "0-1");
    assert_eq!(plan.tenants[0].settings.mems.to_string(), "0");
}

fn two_nodes(inv: &mut Inventory) {
    inv.numa = NumaTopology {
        nodes: [(0, "0-1".parse().unwrap()), (1, "2-3".parse().unwrap())]
            .into_iter()
            .collect(),
        online_cpus: "0-3".parse().unwrap(),
        memory: Default::default(),
        balancing: None,
        huge_pages: Default::default(),
    };
}

#[test]
fn cpus_off_the_chosen_numa_nodes_are_an_error() {
    let text = "[[tenant]]\nname = \"pg\"\n[tenant.cpu]\ncpus = \"0\"\nnuma_nodes = [1]\n";
    let p = policy(text);
    let host = Host::new(&p);
    let mut inv = inventory(&p, &[vec![]], vec![]);
    two_nodes(&mut inv);
    let e = error_text(build(&p, &inv, &host.layout, &Snapshot::default()));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("dbcage.toml:4:8: "), "{}", e[0]);
    assert!(
        e[0].contains("cpus 0 has no cpu on the chosen NUMA nodes (2-3)"),
        "{}",
        e[0]
    );
}

#[test]
fn numa_nodes_outside_the_parents_memory_nodes_are_an_error() {
    let text = "[[tenant]]\nname = \"pg\"\n[tenant.cpu]\nnuma_nodes = [1]\n";
    let p = policy(text);
    let host = Host::new(&p);
    let mut inv = inventory(&p, &[vec![]], vec![]);
    two_nodes(&mut inv);
    let snap = Snapshot {
        parent_mems: Some("0".parse().unwrap()),
        ..Default::default()
    };
    let e = error_text(build(&p, &inv, &host.layout, &snap));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("dbcage.toml:4:14: "), "{}", e[0]);
    assert!(
        e[0].contains("NUMA nodes 1 are outside the memory nodes"),
        "{}",
        e[0]
    );
}

#[test]
fn memory_limits_are_rounded_down_to_pages() {
    let page = crate::cgroup::page_size();
    let text = "[[tenant]]\nname = \"pg\"\n[tenant.memory]\nmax = 1000000001\n";
    let p = policy(text);
    let host = Host::new(&p);
    let inv = inventory(&p, &[vec![]], vec![]);
    let limit = host.tenant_file(Controller::Memory, "pg", v1::MEM_LIMIT);
    let rounded = 1_000_000_001 / page * page;
    assert_ne!(rounded, 1_000_000_001);
    let plan = build(&p, &inv, &host.layout, &Snapshot::default()).unwrap();
    assert_eq!(writes_to(&plan.steps, &limit), vec![rounded.to_string()]);
    // the kernel reads back the rounded value: nothing to do
    let mut snap = host.snapshot_with_groups(&p, &[]);
    snap.files.insert(limit.clone(), format!("{rounded}\n"));
    let plan = build(&p, &inv, &host.layout, &snap).unwrap();
    assert!(writes_to(&plan.steps, &limit).is_empty());
}

#[test]
fn demand_shares_replace_the_equal_split_only_when_they_fit() {
    let text = IO_TENANT.replace(
        "write_iops = 1000",
        "write_iops = 1000\nsplit = \"demand\"\nfloor = \"10%\"",
    );
    let p = policy(&text);
    let t = &p.tenants[0];
    let devices = [dev(0), dev(1), dev(2)];
    let lim = |r: u64, w: u64| IoLimits {
        read_bps: Some(r),
        write_iops: Some(w),
        ..Default::default()
    };
    let good: BTreeMap<DevNum, IoLimits> = [
        (dev(0), lim(80 * MIB, 800)),
        (dev(1), lim(10 * MIB, 100)),
        (dev(2), lim(10 * MIB, 100)),
    ]
    .into_iter()
    .collect();
    let mut problems = Vec::new();
    let got = io_per_device_with(t, &devices, &BTreeMap::new(), Some(&good), &mut problems);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(got, good);
    // over the total, a missing key, or another device set: the equal split
    let mut over = good.clone();
    over.get_mut(&dev(0)).unwrap().read_bps = Some(81 * MIB);
    let mut missing = good.clone();
    missing.get_mut(&dev(2)).unwrap().write_iops = None;
    let mut fewer = good.clone();
    fewer.remove(&dev(2));
    for bad in [over, missing, fewer] {
        let got = io_per_device_with(t, &devices, &BTreeMap::new(), Some(&bad), &mut problems);
        assert_eq!(got[&dev(0)], lim(100 * MIB / 3, 333));
    }
    // an equal-split tenant ignores shares
    let p = policy(IO_TENANT);
    let got = io_per_device_with(
        &p.tenants[0],
        &devices,
        &BTreeMap::new(),
        Some(&good),
        &mut problems,
    );
    assert_eq!(got[&dev(0)], lim(100 * MIB / 3, 333));
    assert!(problems.is_empty());
}

#[test]
fn demand_floor_above_an_equal_share_is_a_located_problem() {
    let text = IO_TENANT.replace(
        "write_iops = 1000",
        "write_iops = 1000\nsplit = \"demand\"\nfloor = \"40%\"",
    );
    let p = policy(&text);
    let mut problems = Vec::new();
    io_per_device(
        &p.tenants[0],
        &[dev(0), dev(1), dev(2)],
        &BTreeMap::new(),
        &mut problems,
    );
    assert_eq!(problems.len(), 1);
    let msg = problems[0].to_string();
    assert!(
        msg.contains(":11:9:")
            && msg.contains("io.floor 40% is more than an equal share of its 3 devices"),
        "{msg}"
    );
}

#[test]
fn v1_says_io_weight_and_latency_target_have_no_effect_and_writes_nothing_for_them() {
    let p = policy(&FULL.replace(
        "write_iops = 200",
        "write_iops = 200\nweight = 300\nlatency_target = \"5ms\"",
    ));
    let host = Host::new(&p);
    let plan = build(&p, &full_inventory(&p), &host.layout, &Snapshot::default()).unwrap();
    let w = plan.warnings.join("\n");
    assert!(
        w.contains("tenant `bx1`: io.weight and io.latency_target have no effect")
            && w.contains("cgroup v1")
            && w.contains("cgroup v2"),
        "{w}"
    );
    // the same plan as without the keys: nothing is written for them on v1
    let without = policy(FULL);
    let plain = build(
        &without,
        &full_inventory(&without),
        &host.layout,
        &Snapshot::default(),
    )
    .unwrap();
    assert_eq!(plan.steps, plain.steps);
    // the protection guard's keys too
    let mut t = p.tenants[0].clone();
    t.io_guard = Some(crate::policy::PressureGuard {
        resource: crate::policy::Resource::Io,
        pressure: 0.4,
        window: std::time::Duration::from_secs(1),
        donors: Vec::new(),
        lever: crate::policy::GuardLever::Weight,
        origin: t.origin.clone(),
    });
    use crate::cgroup::driver::Driver;
    let w = crate::cgroup::v1::V1
        .io_protection_warnings(&t, &[], &host.layout, &Snapshot::default())
        .join("\n");
    assert!(
        w.contains(
            "tenant `bx1`: io.weight, io.latency_target and io.protect_pressure have no effect"
        ) && w.contains("per-group pressure"),
        "{w}"
    );
    // and without the keys, no such warning
    assert!(!plain.warnings.join("\n").contains("io.weight"));
}

fn two_nodes_of_4gib() -> NumaTopology {
    NumaTopology {
        nodes: [(0, "0-1".parse().unwrap()), (1, "2-3".parse().unwrap())]
            .into_iter()
            .collect(),
        memory: [(0, 4 << 30), (1, 4 << 30)].into_iter().collect(),
        online_cpus: "0-3".parse().unwrap(),
        balancing: None,
        huge_pages: Default::default(),
    }
}

#[test]
fn numa_auto_puts_tenants_on_nodes_of_their_own() {
    let tenant = |name: &str| {
        format!("[[tenant]]\nname = \"{name}\"\n[tenant.cpu]\nnuma = \"auto\"\ncores = 2\n[tenant.memory]\nmax = \"3GiB\"\n")
    };
    let p = policy(&format!("{}{}", tenant("a"), tenant("b")));
    let host = Host::new(&p);
    let mut inv = inventory(&p, &[vec![], vec![]], vec![]);
    inv.numa = two_nodes_of_4gib();
    let plan = build(&p, &inv, &host.layout, &Snapshot::default()).unwrap();
    let mems = |t: &str| {
        writes_to(
            &plan.steps,
            &host.tenant_file(Controller::Cpuset, t, v1::MEMS),
        )
    };
    let cpus = |t: &str| {
        writes_to(
            &plan.steps,
            &host.tenant_file(Controller::Cpuset, t, v1::CPUS),
        )
    };
    assert_eq!((mems("a"), cpus("a")), (vec!["0"], vec!["0-1"]));
    assert_eq!((mems("b"), cpus("b")), (vec!["1"], vec!["2-3"]));
    assert_eq!(plan.numa.len(), 2);
    assert!(
        plan.numa[1].reason.contains("node 1 holds it alone"),
        "{:?}",
        plan.numa
    );
}

#[test]
fn numa_auto_that_cannot_fit_is_refused_at_the_tenants_key() {
    let text = "[[tenant]]\nname = \"big\"\n[tenant.cpu]\nnuma = \"auto\"\n[tenant.memory]\nmax = \"9GiB\"\n";
    let p = policy(text);
    let host = Host::new(&p);
    let mut inv = inventory(&p, &[vec![]], vec![]);
    inv.numa = two_nodes_of_4gib();
    let e = error_text(build(&p, &inv, &host.layout, &Snapshot::default()));
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].starts_with("dbcage.toml:4:8: "), "{}", e[0]);
    for part in [
        "tenant `big`",
        "9GiB",
        "node 0: 2 of 2 cpus free, 4GiB of 4GiB free",
        "node 1:",
    ] {
        assert!(e[0].contains(part), "{part}: {}", e[0]);
    }
}

/// Seed 002's live swap with `numa = "auto"`: `a` (2 cores) and `b` (1 core) exchange CPU
/// counts while an instance runs in each. Where they are now (the snapshot's cpusets) is kept
/// where it still holds them: `a` keeps one of its nodes and gets its cpus at once, its memory
/// nodes held (it runs); `b` grows onto the node `a` left (no page moves, written at once); `c`
/// is not touched.
#[test]
fn numa_auto_live_swap_moves_only_the_tenants_that_must() {
    let tenant = |name: &str, cores: u32| {
        format!("[[tenant]]\nname = \"{name}\"\n[[tenant.match]]\ncomm = \"^{name}$\"\n[tenant.cpu]\nnuma = \"auto\"\ncores = {cores}\n[tenant.memory]\nmax = \"1GiB\"\n")
    };
    let text = |a: u32, b: u32| format!("{}{}{}", tenant("a", a), tenant("b", b), tenant("c", 1));
    let before = policy(&text(2, 1));
    let host = Host::new(&before);
    let mut inv = inventory(
        &before,
        &[vec![], vec![], vec![]],
        vec![proc(200, "a"), proc(300, "b"), proc(400, "c")],
    );
    inv.numa = NumaTopology {
        nodes: (0..4).map(|n| (n, CpuSet::from_iter([n]))).collect(),
        memory: (0..4).map(|n| (n, 4 << 30)).collect(),
        online_cpus: "0-3".parse().unwrap(),
        balancing: None,
        huge_pages: Default::default(),
    };
    let mut snap = Snapshot::default();
    host.at_root(&mut snap, &[200, 300, 400]);
    for pid in [200, 300, 400] {
        snap.proc_rss.insert(pid, 100 * MIB);
    }
    let first = build(&before, &inv, &host.layout, &snap).unwrap();
    assert_eq!(
        first
            .numa
            .iter()
            .map(|c| c.nodes.to_string())
            .collect::<Vec<_>>(),
        ["0-1", "2", "3"]
    );
    host.apply(&mut snap, &first.steps);
    snap.proc_nodes
        .insert(200, [(0, 60 * MIB), (1, 40 * MIB)].into_iter().collect());

    let swapped = build(&policy(&text(1, 2)), &inv, &host.layout, &snap).unwrap();
    let nodes: Vec<(String, Option<String>)> = swapped
        .numa
        .iter()
        .map(|c| (c.nodes.to_string(), c.was.as_ref().map(|w| w.to_string())))
        .collect();
    let was = |s: &str| Some(s.to_string());
    assert_eq!(
        nodes,
        [
            ("0".into(), was("0-1")),
            ("1-2".into(), was("2")),
            ("3".into(), was("3"))
        ]
    );
    let file =
        |t: &str, f: &str| writes_to(&swapped.steps, &host.tenant_file(Controller::Cpuset, t, f));
    assert_eq!(file("a", v1::CPUS), vec!["0"], "a's cpus change at once");
    assert!(
        file("a", v1::MEMS).is_empty(),
        "a runs: its memory nodes stay"
    );
    assert_eq!(file("b", v1::MEMS), vec!["1-2"], "b only grows: at once");
    assert_eq!(file("b", v1::CPUS), vec!["1-2"]);
    assert!(file("c", v1::CPUS).is_empty() && file("c", v1::MEMS).is_empty());
    assert_eq!(swapped.memory_moves.len(), 1, "{:?}", swapped.memory_moves);
    assert_eq!(swapped.memory_moves[0].bytes, Some(40 * MIB));
    assert_eq!(
        swapped.numa_changes(),
        [
            "tenant `a`: NUMA nodes 0-1 -> 0: cpus now; its memory (40MiB outside nodes 0) stays on nodes 0-1 until the instance restarts (`dbcage set a cpu.migrate_memory=true` moves it now)",
            "tenant `b`: NUMA nodes 2 -> 1-2: cpus and nodes now; no memory moves",
        ]
    );
    // the next plan from there changes nothing: `a` is on node 0 by its cpus
    host.apply(&mut snap, &swapped.steps);
    let again = build(&policy(&text(1, 2)), &inv, &host.layout, &snap).unwrap();
    assert!(again.numa_changes().is_empty(), "{:?}", again.numa);
    assert!(
        again.steps.iter().all(|s| !matches!(s, Step::Write { .. })),
        "{:#?}",
        again.steps
    );
}

// ---------------------------------------------------------------- moving a running tenant's memory

/// Issue 26: a running tenant whose nodes change keeps them until asked (`--migrate-memory`,
/// `cpu.migrate_memory`) or until its processes are gone; the plan says how much would move.
#[test]
fn a_running_tenants_memory_moves_only_when_asked_or_at_restart() {
    let text = |nodes: &str, extra: &str| {
        format!("[[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^postgres\"\n[tenant.cpu]\nnuma_nodes = [{nodes}]\n{extra}")
    };
    let on_1 = policy(&text("1", ""));
    let host = Host::new(&on_1);
    let mut inv = inventory(&on_1, &[vec![]], vec![proc(200, "postgres")]);
    inv.numa = two_nodes_of_4gib();
    let mut snap = Snapshot::default();
    host.at_root(&mut snap, &[200]);
    snap.proc_rss.insert(200, 100 * MIB);
    let first = build(&on_1, &inv, &host.layout, &snap).unwrap();
    assert!(first.memory_moves.is_empty(), "{:?}", first.memory_moves);
    host.apply(&mut snap, &first.steps);

    let on_0 = policy(&text("0", ""));
    let mems = host.tenant_file(Controller::Cpuset, "pg", v1::MEMS);
    let limited_mems = host.leaf_file(Controller::Cpuset, "pg", Leaf::Limited, v1::MEMS);
    let migrate = host.leaf_file(Controller::Cpuset, "pg", Leaf::Limited, v1::MEMORY_MIGRATE);
    // not asked: the memory nodes stay, the cpus change now (those it leaves may be another
    // tenant's already), and the plan says why and how much
    snap.proc_nodes
        .insert(200, [(0, 4096), (1, 100 * MIB)].into_iter().collect());
    let held = build(&on_0, &inv, &host.layout, &snap).unwrap();
    assert!(
        writes_to(&held.steps, &mems).is_empty(),
        "{:#?}",
        held.steps
    );
    assert!(writes_to(&held.steps, &limited_mems).is_empty());
    assert_eq!(
        writes_to(
            &held.steps,
            &host.tenant_file(Controller::Cpuset, "pg", v1::CPUS)
        ),
        vec!["0-3", "0-1"] // widened first: its leaves hold 2-3 until they are written
    );
    let m = &held.memory_moves[0];
    assert_eq!(
        (m.from.to_string(), m.to.to_string()),
        ("1".into(), "0".into())
    );
    assert_eq!(
        (m.pids.clone(), m.bytes, m.migrate),
        (vec![200], Some(100 * MIB), false)
    );
    assert!(
        held.warnings.iter().any(|w| w.contains(
            "tenant `pg`: its memory nodes change from 1 to 0 with 1 process in its groups"
        ) && w
            .contains("100MiB of their memory is on nodes outside 0")
            && w.contains("its cpus change now (cpus 2-3 -> 0-1), its memory stays on nodes 1")),
        "{:?}",
        held.warnings
    );
    // asked: memory_migrate on before the narrowing that moves the pages (v1)
    for asked in [
        build_with(
            &on_0,
            &inv,
            &host.layout,
            &snap,
            &on_0.matcher.classify(&inv.procs),
            &Planning {
                shares: &Shares::new(),
                migrate_memory: true,
                driver: &Cgroupfs,
                settled: None,
            },
        )
        .unwrap(),
        build(
            &policy(&text("0", "migrate_memory = true\n")),
            &inv,
            &host.layout,
            &snap,
        )
        .unwrap(),
    ] {
        assert!(asked.memory_moves[0].migrate);
        assert_eq!(writes_to(&asked.steps, &mems), vec!["0-1", "0"]);
        assert_eq!(writes_to(&asked.steps, &migrate), vec!["1"]);
        assert!(
            write_index(&asked.steps, &migrate, "1")
                < write_index(&asked.steps, &limited_mems, "0"),
            "{:#?}",
            asked.steps
        );
        assert!(asked
            .warnings
            .iter()
            .all(|w| !w.contains("memory nodes change")));
    }
    // exited but not reaped: a zombie (no resident memory) still shows its group in /proc
    snap.proc_rss.insert(200, 0);
    let zombie = build(&on_0, &inv, &host.layout, &snap).unwrap();
    assert!(zombie.memory_moves.is_empty(), "{:?}", zombie.memory_moves);
    assert_eq!(writes_to(&zombie.steps, &mems), vec!["0-1", "0"]);
    // restarted: the old processes are gone and the new one is not in the group yet, so the
    // nodes change at once and the new process moves in after
    let mut inv = inv.clone();
    inv.procs = vec![proc(300, "postgres")];
    snap.proc_dirs.clear();
    host.at_root(&mut snap, &[300]);
    let restart = build(&on_0, &inv, &host.layout, &snap).unwrap();
    assert!(restart.memory_moves.is_empty());
    assert_eq!(writes_to(&restart.steps, &mems), vec!["0-1", "0"]);
    assert!(matches!(
        restart.steps.last(),
        Some(Step::Move { pid: 300, .. })
    ));
}

/// Issue 26: a tenant's huge pages go where a node's pool holds them, and the pools are not
/// counted as memory other tenants can use.
#[test]
fn numa_auto_places_huge_pages_on_the_node_with_the_pool() {
    let text = "[[tenant]]\nname = \"sga\"\n[tenant.cpu]\nnuma = \"auto\"\n[tenant.memory]\nmax = \"1GiB\"\nhuge_pages = \"2GiB\"\n\
                [[tenant]]\nname = \"big\"\n[tenant.cpu]\nnuma = \"auto\"\n[tenant.memory]\nmax = \"3GiB\"\n";
    let p = policy(text);
    let host = Host::new(&p);
    let mut inv = inventory(&p, &[vec![], vec![]], vec![]);
    inv.numa = two_nodes_of_4gib();
    // node 0: 2 GiB of 2 MiB pages (nodeN/hugepages/hugepages-2048kB/nr_hugepages = 1024)
    inv.numa.huge_pages.insert(0, 1024 * (2 << 20));
    let plan = build(&p, &inv, &host.layout, &Snapshot::default()).unwrap();
    let nodes: Vec<String> = plan.numa.iter().map(|c| c.nodes.to_string()).collect();
    // big (3 GiB, placed first, and on node 0 without pools) no longer fits beside the pool on
    // node 0 (4 GiB less 2 GiB): node 1
    assert_eq!(nodes, ["0", "1"], "{:?}", plan.numa);
    assert!(
        plan.numa[0].reason.contains("2GiB of huge pages"),
        "{:?}",
        plan.numa
    );
    // without the pool the huge pages cannot be placed, and check says where they are not
    inv.numa.huge_pages.clear();
    let e = error_text(build(&p, &inv, &host.layout, &Snapshot::default()));
    assert!(
        e[0].contains("tenant `sga`") && e[0].contains("no huge pages"),
        "{e:?}"
    );
}

// ---------------------------------------------------------------- the tree drivers

#[test]
fn one_policy_and_host_planned_by_each_tree_driver() {
    let p = full_pinned();
    let (host, inv, snap) = full_host(&p);
    let placements = p.matcher.classify(&inv.procs);
    let shares = Shares::new();
    let cgroupfs = Planning {
        shares: &shares,
        migrate_memory: false,
        driver: &Cgroupfs,
        settled: None,
    };
    let by_cgroupfs = build_with(&p, &inv, &host.layout, &snap, &placements, &cgroupfs).unwrap();

    // The same host under systemd: the tenant's processes run in a service of their own, which
    // has no Delegate=yes (so its exempt process runs under the unit's IO limits).
    let unit = "oracle-bx1.service".to_string();
    let mut view = SystemdView {
        unified: true,
        page: 4096,
        ..Default::default()
    };
    for pid in [100, 101, 102] {
        view.unit_of.insert(pid, unit.clone());
    }
    view.unit_group
        .insert(unit.clone(), format!("/system.slice/{unit}"));
    view.unit_pids.insert(unit.clone(), vec![100, 101, 102]);
    view.resources.insert(
        unit.clone(),
        crate::systemd::UnitResources {
            memory_low: Some(0),
            ..Default::default()
        },
    );
    view.scanned = [100, 101, 102, 103].into_iter().collect();
    let systemd = Planning {
        driver: &Systemd { view: &view },
        ..cgroupfs
    };
    let by_systemd = build_with(&p, &inv, &host.layout, &snap, &placements, &systemd).unwrap();

    // One computation of the settings, whichever driver writes them.
    let settings = |plan: &Plan| {
        plan.tenants
            .iter()
            .map(|t| (t.name.clone(), t.settings.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(settings(&by_cgroupfs), settings(&by_systemd));

    // cgroupfs: dbcage's own groups, files and moves; no unit.
    let kinds = |plan: &Plan| {
        let mut k: Vec<&str> = plan
            .steps
            .iter()
            .map(|s| match s {
                Step::Mkdir { .. } => "mkdir",
                Step::Write { .. } => "write",
                Step::Move { .. } => "move",
                Step::SetUnitProperties { .. } => "set",
                Step::Adopt { .. } => "adopt",
                _ => "other",
            })
            .collect();
        k.dedup();
        k
    };
    assert_eq!(kinds(&by_cgroupfs), ["mkdir", "write", "move"]);
    assert!(by_cgroupfs.tenants[0].units.is_empty());

    // systemd: the settings on the tenant's unit, no group of dbcage's, no move.
    assert_eq!(kinds(&by_systemd), ["set"]);
    let Step::SetUnitProperties { unit: on, set, .. } = &by_systemd.steps[0] else {
        unreachable!()
    };
    assert_eq!(on, &unit);
    let shown: Vec<String> = set.iter().map(|x| x.to_string()).collect();
    // the instance total (8 MiB/s) split over its two disks, as the cgroupfs files have it
    for want in [
        "CPUQuotaPerSecUSec=1500000",
        "CPUWeight=200",
        "AllowedCPUs=0-1",
        "IOReadBandwidthMax=/dev/block/7:0 4194304, /dev/block/7:1 4194304",
    ] {
        assert!(shown.iter().any(|s| s == want), "{want} in {shown:?}");
    }
    assert_eq!(
        by_systemd.tenants[0].units,
        vec![format!("/system.slice/{unit}")]
    );
    assert!(
        by_systemd
            .warnings
            .iter()
            .any(|w| w.contains("exempt processes in oracle-bx1.service run under its IO limits")),
        "{:?}",
        by_systemd.warnings
    );
}
