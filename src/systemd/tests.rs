use super::props::{cpuset_to_mask, mask_to_cpuset};
use super::*;
use crate::kernel::CpuSet;
use crate::policy::ManagerChoice;

#[test]
fn unit_of_a_cgroup_path_follows_systemd() {
    let cases = [
        (
            "/system.slice/postgresql@15-main.service",
            Some("postgresql@15-main.service"),
        ),
        // A delegated unit's own subgroups still belong to it.
        ("/system.slice/x.service/supervisor", Some("x.service")),
        ("/system.slice/x.service/y.service", Some("x.service")),
        (
            "/user.slice/user-1000.slice/session-2.scope",
            Some("session-2.scope"),
        ),
        (
            "/dbcage.slice/dbcage-bx1.scope/limited",
            Some("dbcage-bx1.scope"),
        ),
        ("/init.scope", Some("init.scope")),
        ("/system.slice", None),
        ("/", None),
        ("", None),
        // dbcage's own groups outside any unit (parent = "root").
        ("/dbcage/bx1/limited", None),
        (".service", None),
    ];
    for (path, unit) in cases {
        assert_eq!(unit_of_cgroup_path(path), unit, "{path}");
    }
}

#[test]
fn a_units_own_group_ends_at_its_component() {
    let cases = [
        (
            "/system.slice/postgresql@15-main.service",
            Some((
                "postgresql@15-main.service",
                "/system.slice/postgresql@15-main.service",
            )),
        ),
        (
            "/system.slice/x.service/supervisor",
            Some(("x.service", "/system.slice/x.service")),
        ),
        (
            "/dbcage.slice/dbcage-pg.scope",
            Some(("dbcage-pg.scope", "/dbcage.slice/dbcage-pg.scope")),
        ),
        // A slice whose name starts like the unit's does not end the path early.
        (
            "/x.service-a.slice/x.service/y",
            Some(("x.service", "/x.service-a.slice/x.service")),
        ),
        ("/system.slice", None),
        ("/dbcage/pg/limited", None),
    ];
    for (path, want) in cases {
        assert_eq!(unit_and_group(path), want, "{path}");
    }
    assert_eq!(scope_cgroup("pg"), "/dbcage.slice/dbcage-pg.scope");
}

#[test]
fn systemd_cgroup_of_reads_the_right_line() {
    let v2 = "0::/system.slice/postgresql@15-main.service\n";
    assert_eq!(
        systemd_cgroup_of(v2),
        Some("/system.slice/postgresql@15-main.service")
    );
    // v1 / hybrid: the name=systemd hierarchy decides, not the (possibly empty) v2 line.
    let v1 =
        "12:cpu,cpuacct:/dbcage/bx1/limited\n1:name=systemd:/system.slice/oracle.service\n0::/\n";
    assert_eq!(systemd_cgroup_of(v1), Some("/system.slice/oracle.service"));
    assert_eq!(systemd_cgroup_of("garbage"), None);
}

#[test]
fn unit_of_pid_and_detection_read_the_host_tree() {
    let dir = tempfile::tempdir().unwrap();
    let fs = crate::hostfs::HostFs::with_root(dir.path());
    std::fs::create_dir_all(fs.path("/proc/42")).unwrap();
    std::fs::create_dir_all(fs.path("/proc/1")).unwrap();
    std::fs::write(
        fs.path("/proc/42/cgroup"),
        "0::/system.slice/mariadb.service\n",
    )
    .unwrap();
    assert_eq!(
        unit_of_pid(&fs, 42).unwrap().as_deref(),
        Some("mariadb.service")
    );
    assert!(unit_of_pid(&fs, 43).is_err());

    std::fs::write(fs.path("/proc/1/comm"), "systemd\n").unwrap();
    assert!(
        !is_cgroup_manager(&fs),
        "no /run/systemd/system: not booted with systemd"
    );
    std::fs::create_dir_all(fs.path("/run/systemd/system")).unwrap();
    assert!(is_cgroup_manager(&fs));
    assert_eq!(resolve(ManagerChoice::Auto, &fs), Ok(Manager::Systemd));
    assert_eq!(resolve(ManagerChoice::Cgroupfs, &fs), Ok(Manager::Cgroupfs));
    assert_eq!(resolve(ManagerChoice::Systemd, &fs), Ok(Manager::Systemd));
    std::fs::write(fs.path("/proc/1/comm"), "init\n").unwrap();
    assert!(!is_cgroup_manager(&fs), "PID 1 is not systemd");
    assert_eq!(resolve(ManagerChoice::Auto, &fs), Ok(Manager::Cgroupfs));
    let err = resolve(ManagerChoice::Systemd, &fs).unwrap_err();
    assert!(
        err.contains("PID 1 is `init`") && err.contains("exists"),
        "{err}"
    );
}

#[test]
fn scope_names_are_unit_names() {
    assert_eq!(scope_name("bx1"), "dbcage-bx1.scope");
    assert!(holds_processes(&scope_name("a.b_c-d")));
}

#[test]
fn cpu_masks_round_trip() {
    for text in ["", "0", "1", "0-3", "0,9,17", "0-63", "5-12,100"] {
        let set: CpuSet = text.parse().unwrap();
        assert_eq!(mask_to_cpuset(&cpuset_to_mask(&set)), set, "{text}");
    }
    // cpu 9 is bit 1 of byte 1
    assert_eq!(cpuset_to_mask(&"9".parse().unwrap()), vec![0, 2]);
}

#[test]
fn properties_print_like_systemctl_show_and_reset_to_defaults() {
    let p = Property::IoReadBandwidthMax(vec![DeviceLimit::new("/dev/vdc", 1_048_576)]);
    assert_eq!(p.to_string(), "IOReadBandwidthMax=/dev/vdc 1048576");
    assert_eq!(p.reset(), Property::IoReadBandwidthMax(vec![]));
    assert_eq!(
        Property::CpuQuotaPerSecUSec(None).to_string(),
        "CPUQuotaPerSecUSec=infinity"
    );
    assert_eq!(Property::CpuWeight(None).to_string(), "CPUWeight=[not set]");
    assert_eq!(
        Property::MemoryLow(Some(5)).reset(),
        Property::MemoryLow(Some(0))
    );
    assert_eq!(
        Property::CpuQuotaPerSecUSec(None).to_value(),
        zbus::zvariant::Value::U64(u64::MAX)
    );
}

/// systemd merges a device list into the unit's: a list goes out after an empty one (which
/// clears every device's entry), so that a device the plan no longer names loses its limit.
#[test]
fn device_lists_are_sent_after_a_clear_and_other_values_as_they_are() {
    let list = Property::IoWriteIopsMax(vec![DeviceLimit::new("/dev/vdc", 100)]);
    assert_eq!(
        list.assignments(),
        [Property::IoWriteIopsMax(vec![]), list.clone()]
    );
    assert_eq!(
        Property::IoReadBandwidthMax(vec![]).assignments(),
        [Property::IoReadBandwidthMax(vec![])]
    );
    assert_eq!(
        Property::MemoryMax(Some(1)).assignments(),
        [Property::MemoryMax(Some(1))]
    );
}

#[test]
fn drift_compares_device_lists_as_sets() {
    let now = UnitResources {
        io_read_bandwidth_max: vec![
            DeviceLimit::new("/dev/vdd", 2),
            DeviceLimit::new("/dev/vdc", 1),
        ],
        cpu_weight: Some(50),
        ..Default::default()
    };
    let same = Property::IoReadBandwidthMax(vec![
        DeviceLimit::new("/dev/vdc", 1),
        DeviceLimit::new("/dev/vdd", 2),
    ]);
    assert!(now.drift(std::slice::from_ref(&same)).is_empty());
    let drifted = now.drift(&[
        Property::CpuWeight(Some(100)),
        Property::MemoryMax(Some(1 << 30)),
    ]);
    assert_eq!(
        drifted,
        vec![
            (
                Property::CpuWeight(Some(100)),
                Property::CpuWeight(Some(50))
            ),
            (
                Property::MemoryMax(Some(1 << 30)),
                Property::MemoryMax(None)
            ),
        ]
    );
}

#[test]
fn properties_parse_what_they_print() {
    let texts = [
        "CPUQuotaPerSecUSec=500000",
        "CPUQuotaPerSecUSec=infinity",
        "CPUWeight=[not set]",
        "CPUWeight=50",
        "IOWeight=300",
        "AllowedCPUs=0-1",
        "AllowedMemoryNodes=0",
        "MemoryMax=268435456",
        "MemoryHigh=infinity",
        "MemoryLow=0",
        "MemorySwapMax=0",
        "IOReadBandwidthMax=/dev/vdc 1048576, /dev/vdd 2097152",
        "IOWriteBandwidthMax=",
        "IOReadIOPSMax=/dev/vdc 100",
        "IOWriteIOPSMax=/dev/vdd 50",
        "IODeviceLatencyTargetUSec=/dev/vdc 5000",
        "Delegate=yes",
    ];
    for text in texts {
        let p: Property = text.parse().unwrap();
        assert_eq!(p.to_string(), text);
    }
    for bad in [
        "CPUWeight",
        "CPUWeight=x",
        "Nice=5",
        "Delegate=maybe",
        "IOReadIOPSMax=/dev/vdc",
    ] {
        assert!(bad.parse::<Property>().is_err(), "{bad}");
    }
}

#[test]
fn release_removes_only_the_runtime_dropins_of_managed_properties() {
    // As systemd 252 writes them for SetUnitProperties(runtime=true) (seen in the guest), next
    // to drop-ins dbcage must leave: another property, an admin's file with other settings.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let write = |name: &str, text: &str| std::fs::write(d.join(name), text).unwrap();
    write(
        "50-CPUQuota.conf",
        "# This is a drop-in unit file extension, created via \"systemctl set-property\"\n# or an equivalent operation. Do not edit.\n[Service]\nCPUQuota=40%\n",
    );
    write("50-MemoryMax.conf", "[Service]\nMemoryMax=134217728\n");
    write(
        "50-IOReadBandwidthMax.conf",
        "[Service]\nIOReadBandwidthMax=\nIOReadBandwidthMax=/dev/vdc 2097152\n",
    );
    write("50-TasksMax.conf", "[Service]\nTasksMax=100\n");
    write("60-admin.conf", "[Service]\nMemoryMax=1G\nNice=5\n");
    write("50-Empty.conf", "[Service]\n");
    let managed = [
        Property::CpuQuotaPerSecUSec(Some(400_000)),
        Property::MemoryMax(Some(1 << 27)),
        Property::IoReadBandwidthMax(vec![DeviceLimit::new("/dev/vdc", 1)]),
    ];
    let names: Vec<String> = govern::runtime_dropins(d, &managed)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "50-CPUQuota.conf",
            "50-IOReadBandwidthMax.conf",
            "50-MemoryMax.conf"
        ]
    );
    assert!(govern::runtime_dropins(&d.join("absent"), &managed).is_empty());
    assert!(is_dbcage_scope("dbcage-pg.scope"));
    assert!(!is_dbcage_scope("dbcage.service"));
    assert!(!is_dbcage_scope("postgresql@15-main.service"));
}
