//! Hierarchy detection and layout on fixture hosts (tests/fixtures/hosts). Nothing here touches
//! a real cgroup.

use super::*;
use crate::policy::DEFAULT_ROOT;

fn fixture(name: &str) -> HostFs {
    HostFs::with_root(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/hosts")
            .join(name),
    )
}

fn detect(fs: &HostFs) -> Setup {
    let mounts = MountTable::read(fs).unwrap();
    Setup::detect(fs, &mounts).unwrap()
}

fn hierarchy(setup: &Setup, c: Controller) -> &Hierarchy {
    let h = setup
        .hierarchy_of(c)
        .unwrap_or_else(|| panic!("{c:?} not detected: {setup:?}"));
    &setup.hierarchies[h]
}

fn agent(parent: ParentSpec) -> Agent {
    Agent {
        root_name: DEFAULT_ROOT.into(),
        parent,
        metrics: None,
        control_group: None,
        manager: Default::default(),
        io_latency: true,
        favordynmods: false,
    }
}

const OWN_MEMORY: &str = "/process_api/7b40f560c5365a304fbcc0bb1749574c";

#[test]
fn debian_vm_v1() {
    let fs = fixture("debian-vm-v1");
    let setup = detect(&fs);
    // one hierarchy per controller; devices, freezer, pids and name=systemd are not ours,
    // and the cgroup2 mount offers only hugetlb
    assert_eq!(setup.hierarchies.len(), 5, "{setup:#?}");
    assert!(setup.hierarchies.iter().all(|h| h.version == Version::V1));
    assert!(setup.missing.is_empty(), "{:?}", setup.missing);
    for c in CONTROLLERS {
        let h = hierarchy(&setup, c);
        assert_eq!(h.controllers, vec![c]);
        assert_eq!(h.mount_controllers, vec![c.v1_name().to_string()]);
        assert_eq!(
            h.mount_point,
            fs.path(format!("/sys/fs/cgroup/{}", c.v1_name()))
        );
        assert_eq!(h.mount_root, "/");
    }
    assert_eq!(hierarchy(&setup, Controller::Memory).own_path, OWN_MEMORY);
    assert_eq!(hierarchy(&setup, Controller::Cpu).own_path, "/");
    assert_eq!(hierarchy(&setup, Controller::Io).own_path, "/");
    assert_eq!(
        setup.describe(),
        "blkio=v1 cpu=v1 cpuacct=v1 cpuset=v1 memory=v1"
    );
}

#[test]
fn debian_vm_layout_under_own_cgroup() {
    let fs = fixture("debian-vm-v1");
    let setup = detect(&fs);
    let mem = setup.hierarchy_of(Controller::Memory).unwrap();
    let cpu = setup.hierarchy_of(Controller::Cpu).unwrap();

    let l = Layout::new(setup.clone(), &agent(ParentSpec::OwnCgroup)).unwrap();
    assert_eq!(
        l.root_dir(mem),
        fs.path(format!("/sys/fs/cgroup/memory{OWN_MEMORY}/dbcage"))
    );
    assert_eq!(l.root_dir(cpu), fs.path("/sys/fs/cgroup/cpu/dbcage"));

    let l = Layout::new(setup.clone(), &agent(ParentSpec::HierarchyRoot)).unwrap();
    assert_eq!(
        l.leaf_dir(mem, "bx1", Leaf::Exempt),
        fs.path("/sys/fs/cgroup/memory/dbcage/bx1/exempt")
    );
    // Told without building the path, for each leaf and neighbour.
    let exempt = l.leaf_dir(mem, "bx1", Leaf::Exempt);
    assert!(l.is_leaf_dir(&exempt, mem, "bx1", Leaf::Exempt));
    assert!(!l.is_leaf_dir(&exempt, mem, "bx1", Leaf::Limited));
    assert!(!l.is_leaf_dir(&exempt, mem, "bx", Leaf::Exempt));
    assert!(!l.is_leaf_dir(&exempt, cpu, "bx1", Leaf::Exempt));
    assert!(!l.is_leaf_dir(&l.tenant_dir(mem, "bx1"), mem, "bx1", Leaf::Exempt));
    assert!(!l.is_leaf_dir(&exempt.join("x"), mem, "bx1", Leaf::Exempt));

    let l = Layout::new(setup, &agent(ParentSpec::Path("/system.slice/x".into()))).unwrap();
    assert_eq!(
        l.tenant_dir(cpu, "bx1"),
        fs.path("/sys/fs/cgroup/cpu/system.slice/x/dbcage/bx1")
    );
    // nothing exists under the fixture's cgroup mounts
    assert!(l.existing_tenants().is_empty());
}

#[test]
fn hybrid_memory_stays_v1_cpu_and_io_go_to_v2() {
    let fs = fixture("hybrid-synthetic");
    let setup = detect(&fs);
    assert_eq!(setup.hierarchies.len(), 3, "{setup:#?}");
    let cpuset = hierarchy(&setup, Controller::Cpuset);
    assert_eq!(cpuset.version, Version::V1);
    assert_eq!(cpuset.own_path, "/");
    let mem = hierarchy(&setup, Controller::Memory);
    assert_eq!(mem.version, Version::V1);
    assert_eq!(mem.mount_point, fs.path("/sys/fs/cgroup/memory"));
    assert_eq!(mem.own_path, "/");
    let v2 = hierarchy(&setup, Controller::Cpu);
    assert_eq!(v2.version, Version::V2);
    assert_eq!(v2.controllers, vec![Controller::Io, Controller::Cpu]);
    assert_eq!(v2.mount_point, fs.path("/sys/fs/cgroup/unified"));
    assert_eq!(v2.own_path, "/system.slice/db.service");
    assert_eq!(
        setup.hierarchy_of(Controller::Io),
        setup.hierarchy_of(Controller::Cpu)
    );
    // cpu time comes from cpu.stat on v2: cpuacct is neither driven nor missing
    assert_eq!(setup.hierarchy_of(Controller::Cpuacct), None);
    assert!(setup.missing.is_empty(), "{:?}", setup.missing);
    assert_eq!(setup.describe(), "blkio=v2 cpu=v2 cpuset=v1 memory=v1");
}

#[test]
fn pure_v2() {
    let fs = fixture("v2-synthetic");
    let setup = detect(&fs);
    assert_eq!(setup.hierarchies.len(), 1, "{setup:#?}");
    let h = &setup.hierarchies[0];
    assert_eq!(h.version, Version::V2);
    assert_eq!(
        h.controllers,
        vec![
            Controller::Io,
            Controller::Cpu,
            Controller::Cpuset,
            Controller::Memory
        ]
    );
    assert_eq!(h.mount_point, fs.path("/sys/fs/cgroup"));
    assert_eq!(h.own_path, "/user.slice/user-1000.slice/session-3.scope");
    assert!(setup.missing.is_empty());

    let l = Layout::new(setup, &agent(ParentSpec::OwnCgroup)).unwrap();
    assert_eq!(
        l.root_dir(0),
        fs.path("/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope/dbcage")
    );
}

/// A host tree written by the test: mountinfo, /proc/self/cgroup and cgroup2's controllers.
fn host(mountinfo: &str, own: &str, v2_controllers: Option<(&str, &str)>) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let fs = HostFs::with_root(tmp.path());
    std::fs::create_dir_all(fs.path("/proc/self")).unwrap();
    std::fs::write(fs.path("/proc/self/mountinfo"), mountinfo).unwrap();
    std::fs::write(fs.path("/proc/self/cgroup"), own).unwrap();
    if let Some((mp, list)) = v2_controllers {
        std::fs::create_dir_all(fs.path(mp)).unwrap();
        std::fs::write(fs.path(mp).join("cgroup.controllers"), list).unwrap();
    }
    tmp
}

#[test]
fn combined_and_duplicate_v1_mounts() {
    let tmp = host(
        "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n\
         33 31 0:29 / /mnt/cpu-again rw,relatime - cgroup cgroup rw,cpu,cpuacct\n\
         35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n",
        "4:memory:/a\n2:cpu,cpuacct:/b\n0::/\n",
        None,
    );
    let fs = HostFs::with_root(tmp.path());
    let setup = detect(&fs);
    assert_eq!(setup.hierarchies.len(), 2, "{setup:#?}");
    let cpu = hierarchy(&setup, Controller::Cpu);
    assert_eq!(cpu.controllers, vec![Controller::Cpu, Controller::Cpuacct]);
    assert_eq!(cpu.mount_point, fs.path("/sys/fs/cgroup/cpu,cpuacct"));
    assert_eq!(cpu.own_path, "/b");
    assert_eq!(hierarchy(&setup, Controller::Memory).own_path, "/a");
    assert_eq!(setup.missing, vec![Controller::Io, Controller::Cpuset]);
    assert_eq!(
        setup.describe(),
        "blkio=missing cpu=v1 cpuacct=v1 cpuset=missing memory=v1"
    );
}

#[test]
fn a_container_sees_only_part_of_the_hierarchy() {
    // mount root /docker/abc: only paths under it are visible
    let tmp = host(
        "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
        "4:memory:/docker/abc/app\n",
        None,
    );
    let fs = HostFs::with_root(tmp.path());
    let setup = detect(&fs);
    let h = hierarchy(&setup, Controller::Memory).clone();
    assert_eq!(h.mount_root, "/docker/abc");
    assert_eq!(
        h.dir_of("/docker/abc/app"),
        Some(fs.path("/sys/fs/cgroup/memory/app"))
    );
    assert_eq!(
        h.dir_of("/docker/abc"),
        Some(fs.path("/sys/fs/cgroup/memory"))
    );
    assert_eq!(h.dir_of("/docker/abcdef"), None);
    assert_eq!(h.dir_of("/other"), None);

    let l = Layout::new(setup.clone(), &agent(ParentSpec::OwnCgroup)).unwrap();
    assert_eq!(l.root_dir(0), fs.path("/sys/fs/cgroup/memory/app/dbcage"));
    let l = Layout::new(setup.clone(), &agent(ParentSpec::HierarchyRoot)).unwrap();
    assert_eq!(l.root_dir(0), fs.path("/sys/fs/cgroup/memory/dbcage"));
    let err = Layout::new(setup, &agent(ParentSpec::Path("/system.slice".into()))).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("/system.slice") && msg.contains("/docker/abc"),
        "{msg}"
    );
}

#[test]
fn missing_proc_self_cgroup_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = HostFs::with_root(tmp.path());
    let err = Setup::detect(&fs, &MountTable::default()).unwrap_err();
    assert!(err.to_string().contains("/proc/self/cgroup"), "{err}");
}

#[test]
fn proc_cgroup_lines() {
    let lines = parse_proc_cgroup("12:cpu,cpuacct:/a:b\n1:name=systemd:/\n0::/x\nbogus\n");
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0].names().collect::<Vec<_>>(), ["cpu", "cpuacct"]);
    assert_eq!(lines[0].path, "/a:b");
    assert_eq!(lines[1].names().collect::<Vec<_>>(), ["name=systemd"]);
    assert_eq!(lines[2].names().count(), 0);
    assert_eq!(lines[2].path, "/x");
}

/// Under systemd on cgroup v1 a unit's controller groups are systemd's to make: one it made
/// none of (cpuset, which systemd does not manage on v1) is lacking, and `status` says so.
#[test]
fn under_systemd_on_v1_a_unit_without_a_cpuset_group_lacks_cpuset() {
    let tmp = tempfile::tempdir().unwrap();
    let scope = "dbcage.slice/dbcage-pinned.scope";
    let v1 = |c: Controller| Hierarchy {
        version: Version::V1,
        mount_point: tmp.path().join(c.v1_name()),
        mount_root: "/".into(),
        controllers: vec![c],
        mount_controllers: vec![c.v1_name().to_string()],
        own_path: "/".into(),
    };
    for c in [Controller::Cpu, Controller::Memory] {
        let dir = tmp.path().join(c.v1_name()).join(scope);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.procs"), "212\n").unwrap();
    }
    std::fs::create_dir_all(tmp.path().join("cpuset")).unwrap();
    std::fs::create_dir_all(tmp.path().join("blkio")).unwrap();
    let setup = Setup {
        hierarchies: vec![
            v1(Controller::Io),
            v1(Controller::Cpu),
            v1(Controller::Cpuset),
            v1(Controller::Memory),
        ],
        missing: vec![],
    };
    let mut l = Layout::new(setup, &agent(ParentSpec::HierarchyRoot)).unwrap();
    let needed = [Controller::Cpu, Controller::Cpuset, Controller::Memory]
        .into_iter()
        .collect();
    // Under cgroupfs dbcage's own leaf that does not exist yet lacks nothing.
    assert!(coverage::leaf_lacks(&l, "pinned", Leaf::Limited, &needed).is_empty());
    l.units.insert("pinned".into(), vec![format!("/{scope}")]);
    // Its processes: the scope has no blkio group (no IO settings), where status counts them;
    // they are listed by its cpu group.
    assert_eq!(
        l.read_leaves(0, "pinned", Leaf::Limited),
        [tmp.path().join("cpu").join(scope)]
    );
    let procs: Vec<u32> = l
        .read_leaves(0, "pinned", Leaf::Limited)
        .iter()
        .flat_map(|d| procs_in(d))
        .collect();
    assert_eq!(procs, [212]);
    assert_eq!(
        coverage::leaf_lacks(&l, "pinned", Leaf::Limited, &needed),
        [Controller::Cpuset]
    );
    assert_eq!(
        crate::cgroup::systemd::unmanaged(Controller::Cpuset, Version::V1),
        Some("systemd has no cpuset on cgroup v1")
    );
    assert_eq!(
        crate::cgroup::systemd::unmanaged(Controller::Cpuset, Version::V2),
        None
    );
    assert_eq!(
        crate::cgroup::systemd::unmanaged(Controller::Memory, Version::V1),
        None
    );
    // A memory group systemd has not made (yet): lacking too.
    std::fs::remove_dir_all(tmp.path().join("memory").join(scope)).unwrap();
    assert_eq!(
        coverage::leaf_lacks(&l, "pinned", Leaf::Limited, &needed),
        [Controller::Cpuset, Controller::Memory]
    );
}

/// Under systemd a tenant has no group of dbcage's: its limits, usage and processes are read
/// from the cgroups of the units that govern it (a synthetic v2 tree as systemd lays it out).
#[test]
fn readers_read_a_tenants_units_under_systemd() {
    let tmp = tempfile::tempdir().unwrap();
    let mount = tmp.path().join("unified");
    let unit = mount.join("system.slice/postgresql@15-main.service");
    let scope = mount.join("dbcage.slice/dbcage-pg.scope");
    for (dir, procs, quota) in [
        (&unit, "10\n11\n", "50000 100000"),
        (&scope, "20\n", "max 100000"),
    ] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("cgroup.procs"), procs).unwrap();
        std::fs::write(dir.join("cpu.max"), quota).unwrap();
        std::fs::write(dir.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        std::fs::write(dir.join("memory.max"), "536870912\n").unwrap();
    }
    std::fs::write(
        unit.join("io.max"),
        "254:32 rbps=2097152 wbps=max riops=max wiops=max\n",
    )
    .unwrap();
    let setup = Setup {
        hierarchies: vec![Hierarchy {
            version: Version::V2,
            mount_point: mount.clone(),
            mount_root: "/".into(),
            controllers: vec![Controller::Io, Controller::Cpu, Controller::Memory],
            mount_controllers: Vec::new(),
            own_path: "/".into(),
        }],
        missing: Vec::new(),
    };
    let mut l = Layout::new(setup, &agent(ParentSpec::HierarchyRoot)).unwrap();
    // Under cgroupfs: dbcage's own (absent) groups, read as unknown.
    assert_eq!(l.reader("pg").cpu().1, None);
    assert_eq!(
        l.read_leaves(0, "pg", Leaf::Limited),
        [mount.join("dbcage/pg/limited")]
    );
    l.units.insert(
        "pg".into(),
        vec![
            "/system.slice/postgresql@15-main.service".into(),
            "/dbcage.slice/dbcage-pg.scope".into(),
        ],
    );
    assert_eq!(l.reader("pg").cpu().1, Some(0.5));
    assert_eq!(l.reader("pg").memory().1, Some(512 << 20));
    let io = l.reader("pg").io().unwrap();
    let dev = crate::kernel::DevNum {
        major: 254,
        minor: 32,
    };
    assert_eq!(io.limits[&dev].read_bps, Some(2 << 20));
    // Processes are counted in every unit; a unit has no exempt leaf.
    let procs: Vec<u32> = l
        .read_leaves(0, "pg", Leaf::Limited)
        .iter()
        .flat_map(|d| procs_in(d))
        .collect();
    assert_eq!(procs, [10, 11, 20]);
    assert!(l.read_leaves(0, "pg", Leaf::Exempt).is_empty());
    // The coverage check reads the units: io is not enabled in them.
    let needed = [Controller::Io, Controller::Cpu].into_iter().collect();
    assert_eq!(
        coverage::leaf_lacks(&l, "pg", Leaf::Limited, &needed),
        [Controller::Io]
    );
    // Another tenant still reads its own groups.
    assert_eq!(l.read_dir(0, "other"), mount.join("dbcage/other"));

    // The unit delegates its subtree and holds the tenant's leaves (`cgroup::delegated`): the
    // IO limits are read from `limited` (the unit's own io.max is cleared), the processes are
    // counted in the unit's group and each leaf, and io is checked on the leaf, cpu on the unit.
    std::fs::write(unit.join("io.max"), "").unwrap();
    std::fs::write(unit.join("cgroup.procs"), "").unwrap();
    std::fs::write(unit.join("cgroup.controllers"), "cpu io memory pids\n").unwrap();
    for (leaf, procs) in [("limited", "10\n"), ("exempt", "11\n")] {
        std::fs::create_dir_all(unit.join(leaf)).unwrap();
        std::fs::write(unit.join(leaf).join("cgroup.procs"), procs).unwrap();
        std::fs::write(unit.join(leaf).join("cgroup.controllers"), "io\n").unwrap();
    }
    std::fs::write(
        unit.join("limited/io.max"),
        "254:32 rbps=2097152 wbps=max riops=max wiops=max\n",
    )
    .unwrap();
    assert_eq!(
        l.reader("pg").io().unwrap().limits[&dev].read_bps,
        Some(2 << 20)
    );
    let counted = |leaf| -> Vec<u32> {
        l.read_leaves(0, "pg", leaf)
            .iter()
            .flat_map(|d| procs_in(d))
            .collect()
    };
    assert_eq!(counted(Leaf::Limited), [10, 20]);
    assert_eq!(counted(Leaf::Exempt), [11]);
    std::fs::write(scope.join("cgroup.controllers"), "cpu io memory pids\n").unwrap();
    assert!(coverage::leaf_lacks(&l, "pg", Leaf::Limited, &needed).is_empty());
    // The scope without io: its process's IO limit would not act.
    std::fs::write(scope.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
    assert_eq!(
        coverage::leaf_lacks(&l, "pg", Leaf::Limited, &needed),
        [Controller::Io]
    );
}

/// The walks read in each group only the files the plans compare at its depth, and every file
/// any tenant's specs name is among them (whatever its settings).
#[test]
fn groups_are_read_for_the_files_their_depth_is_planned_with() {
    use super::driver::Driver;
    use super::model::TenantSettings;
    let all = [
        Controller::Io,
        Controller::Cpu,
        Controller::Cpuset,
        Controller::Memory,
        Controller::Cpuacct,
    ];
    let [root, tenant, leaf] = v1::V1.managed_files_by_depth(&all);
    assert_eq!(root, ["cpuset.cpus", "cpuset.mems"]);
    assert_eq!(
        tenant,
        [
            "cpu.cfs_quota_us",
            "cpu.cfs_period_us",
            "cpu.shares",
            "cpuset.cpus",
            "cpuset.mems",
            "cpuset.memory_migrate",
            "memory.limit_in_bytes",
            "memory.soft_limit_in_bytes",
            "memory.memsw.limit_in_bytes",
        ]
    );
    assert_eq!(
        leaf,
        [
            "blkio.throttle.read_bps_device",
            "blkio.throttle.write_bps_device",
            "blkio.throttle.read_iops_device",
            "blkio.throttle.write_iops_device",
            "cpuset.cpus",
            "cpuset.mems",
            "cpuset.memory_migrate",
        ]
    );
    // One v1 hierarchy's controllers only.
    assert_eq!(
        v1::V1.managed_files_by_depth(&[Controller::Cpu, Controller::Cpuacct]),
        [
            vec![],
            vec!["cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.shares"],
            vec![]
        ]
    );
    let [root, tenant, leaf] = v2::V2.managed_files_by_depth(&all);
    assert_eq!(root, ["cgroup.subtree_control"]);
    assert_eq!(
        tenant,
        [
            "io.weight",
            "io.latency",
            "cpu.max",
            "cpu.weight",
            "cpuset.cpus",
            "cpuset.mems",
            "memory.max",
            "memory.high",
            "memory.low",
            "memory.swap.max",
            "cgroup.subtree_control",
        ]
    );
    assert_eq!(leaf, ["io.max"]);

    // Whatever a tenant asks for, its specs name no file its group's depth is not read for.
    let dev: crate::kernel::DevNum = "8:0".parse().unwrap();
    let limits = crate::policy::IoLimits {
        read_bps: Some(1 << 20),
        write_iops: Some(100),
        ..Default::default()
    };
    let many = TenantSettings {
        io: [(dev, limits)].into(),
        cpu_cores: Some(1.5),
        cpu_weight: 300,
        memory_max: Some(1 << 30),
        memory_high: Some(1 << 29),
        memory_low: Some(1 << 28),
        memory_swap_max: Some(1 << 20),
        migrate_memory: true,
        io_weight: Some(200),
        io_latency_us: [(dev, 5000)].into(),
        ..TenantSettings::default()
    };
    for settings in [TenantSettings::default(), many] {
        for has_swap in [false, true] {
            let specs = [
                (
                    v1::tenant_files("t", &settings, has_swap),
                    v1::V1.managed_files_by_depth(&all),
                ),
                (
                    v2::tenant_files("t", &settings, has_swap),
                    v2::V2.managed_files_by_depth(&all),
                ),
            ];
            for (specs, by_depth) in specs {
                for s in specs {
                    assert!(
                        by_depth[s.group.depth() as usize].contains(&s.file),
                        "{} at depth {} is not read",
                        s.file,
                        s.group.depth()
                    );
                }
            }
        }
    }
}
