//! Device resolution on fixture sysfs trees, on the copy of this VM's layout in
//! tests/fixtures/hosts/debian-vm-v1, and (read-only) on the real host.

use std::os::unix::fs::symlink;

use super::*;
use crate::inventory::NumaTopology;

/// A fake /sys under a tempdir: block devices under /sys/devices with their `dev` files, and
/// the /sys/dev/block/MAJ:MIN symlinks the kernel makes for them.
struct Sys {
    _tmp: tempfile::TempDir,
    fs: HostFs,
}

impl Sys {
    fn new() -> Sys {
        let tmp = tempfile::tempdir().unwrap();
        let fs = HostFs::with_root(tmp.path());
        std::fs::create_dir_all(fs.path("/sys/dev/block")).unwrap();
        Sys { _tmp: tmp, fs }
    }

    /// A device at /sys/devices/`rel` with number `dev`; returns `rel` for chaining.
    fn device(&self, rel: &str, dev: &str) -> String {
        let dir = self.fs.path(format!("/sys/devices/{rel}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("dev"), format!("{dev}\n")).unwrap();
        // relative, as the kernel makes them: /sys/dev/block/8:0 -> ../../devices/...
        symlink(
            format!("../../devices/{rel}"),
            self.fs.path(format!("/sys/dev/block/{dev}")),
        )
        .unwrap();
        rel.to_string()
    }

    /// A partition `name` inside the disk at `disk_rel`.
    fn partition(&self, disk_rel: &str, name: &str, dev: &str) -> String {
        let rel = self.device(&format!("{disk_rel}/{name}"), dev);
        let n = name.trim_start_matches(|c: char| !c.is_ascii_digit());
        std::fs::write(self.fs.path(format!("/sys/devices/{rel}/partition")), n).unwrap();
        rel
    }

    /// `holder` (a dm or md device) is built on `member`: holder/slaves/<member name> -> member.
    fn slave(&self, holder_rel: &str, member_rel: &str) {
        let slaves = self.fs.path(format!("/sys/devices/{holder_rel}/slaves"));
        std::fs::create_dir_all(&slaves).unwrap();
        let member = self.fs.path(format!("/sys/devices/{member_rel}"));
        symlink(&member, slaves.join(member.file_name().unwrap())).unwrap();
    }

    fn resolve(&self, dev: &str, level: StorageLevel) -> Option<Vec<(String, String)>> {
        devices_for(&self.fs, dev.parse().unwrap(), level).map(|v| {
            v.into_iter()
                .map(|d| (d.name, d.devnum.to_string()))
                .collect()
        })
    }
}

fn pairs(v: &[(&str, &str)]) -> Option<Vec<(String, String)>> {
    Some(
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
    )
}

const SCSI: &str = "pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/block";

/// sda (8:0) with sda1, sda2; sdb (8:16) with sdb1; sdc (8:32) whole.
fn disks(sys: &Sys) -> (String, String) {
    let sda = sys.device(&format!("{SCSI}/sda"), "8:0");
    sys.partition(&sda, "sda1", "8:1");
    sys.partition(&sda, "sda2", "8:2");
    let sdb = sys.device(&format!("{SCSI}/sdb"), "8:16");
    sys.partition(&sdb, "sdb1", "8:17");
    sys.device(&format!("{SCSI}/sdc"), "8:32");
    (sda, sdb)
}

#[test]
fn a_partition_resolves_to_its_whole_disk() {
    let sys = Sys::new();
    disks(&sys);
    for level in [StorageLevel::Device, StorageLevel::Members] {
        assert_eq!(sys.resolve("8:1", level), pairs(&[("sda", "8:0")]));
        assert_eq!(sys.resolve("8:2", level), pairs(&[("sda", "8:0")]));
        assert_eq!(sys.resolve("8:0", level), pairs(&[("sda", "8:0")]));
        assert_eq!(sys.resolve("8:17", level), pairs(&[("sdb", "8:16")]));
        assert_eq!(sys.resolve("8:32", level), pairs(&[("sdc", "8:32")]));
    }
}

#[test]
fn a_loop_device_resolves_to_itself() {
    let sys = Sys::new();
    sys.device("virtual/block/loop0", "7:0");
    sys.device("virtual/block/loop3", "7:3");
    assert_eq!(
        sys.resolve("7:3", StorageLevel::Device),
        pairs(&[("loop3", "7:3")])
    );
    assert_eq!(
        sys.resolve("7:3", StorageLevel::Members),
        pairs(&[("loop3", "7:3")])
    );
}

#[test]
fn an_unknown_device_number_is_none() {
    let sys = Sys::new();
    disks(&sys);
    assert_eq!(sys.resolve("8:48", StorageLevel::Device), None);
}

#[test]
fn dm_over_partitions() {
    let sys = Sys::new();
    disks(&sys);
    let dm0 = sys.device("virtual/block/dm-0", "253:0");
    sys.slave(&dm0, &format!("{SCSI}/sda/sda1"));
    sys.slave(&dm0, &format!("{SCSI}/sdb/sdb1"));
    assert_eq!(
        sys.resolve("253:0", StorageLevel::Device),
        pairs(&[("dm-0", "253:0")])
    );
    assert_eq!(
        sys.resolve("253:0", StorageLevel::Members),
        pairs(&[("sda", "8:0"), ("sdb", "8:16")])
    );
}

#[test]
fn dm_over_two_partitions_of_one_disk_counts_the_disk_once() {
    let sys = Sys::new();
    disks(&sys);
    let dm = sys.device("virtual/block/dm-2", "253:2");
    sys.slave(&dm, &format!("{SCSI}/sda/sda2"));
    sys.slave(&dm, &format!("{SCSI}/sda/sda1"));
    assert_eq!(
        sys.resolve("253:2", StorageLevel::Members),
        pairs(&[("sda", "8:0")])
    );
}

#[test]
fn md_over_dm_over_disks_resolves_recursively() {
    let sys = Sys::new();
    disks(&sys);
    let dm0 = sys.device("virtual/block/dm-0", "253:0");
    sys.slave(&dm0, &format!("{SCSI}/sda/sda1"));
    let dm1 = sys.device("virtual/block/dm-1", "253:1");
    sys.slave(&dm1, &format!("{SCSI}/sdc"));
    sys.slave(&dm1, &format!("{SCSI}/sdb/sdb1"));
    let md = sys.device("virtual/block/md127", "9:127");
    sys.slave(&md, &dm1);
    sys.slave(&md, &dm0);
    // a partition of the md device
    sys.partition(&md, "md127p1", "259:5");
    assert_eq!(
        sys.resolve("9:127", StorageLevel::Device),
        pairs(&[("md127", "9:127")])
    );
    assert_eq!(
        sys.resolve("259:5", StorageLevel::Device),
        pairs(&[("md127", "9:127")])
    );
    let members = pairs(&[("sda", "8:0"), ("sdb", "8:16"), ("sdc", "8:32")]);
    assert_eq!(sys.resolve("9:127", StorageLevel::Members), members);
    assert_eq!(sys.resolve("259:5", StorageLevel::Members), members);
}

/// The device number of the file system holding the tempdir (real, from stat).
fn devnum_of(path: &Path) -> DevNum {
    DevNum::from_dev_t(std::fs::metadata(path).unwrap().dev())
}

#[test]
fn several_paths_on_one_disk_count_once() {
    let sys = Sys::new();
    let real = devnum_of(sys.fs.root());
    if real.major == 0 {
        eprintln!("skipped: the tempdir is on a file system without a block device ({real})");
        return;
    }
    // the tempdir's file system is partition 1 of a fake disk
    let disk = sys.device("pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1", "259:900");
    sys.partition(&disk, "nvme0n1p1", &real.to_string());
    for d in ["/data/a", "/data/b/c"] {
        std::fs::create_dir_all(sys.fs.path(d)).unwrap();
    }
    let paths: Vec<String> = ["/data/a", "/data/b/c", "/data/*", "/data/none"]
        .map(String::from)
        .to_vec();
    let (devices, errors) = resolve_storage(
        &sys.fs,
        &MountTable::default(),
        &paths,
        StorageLevel::Device,
    );
    assert_eq!(
        devices,
        vec![BlockDevice {
            devnum: DevNum::new(259, 900),
            name: "nvme0n1".into()
        }]
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, 3);
    assert!(
        matches!(&errors[0].1, DeviceError::Missing { path, .. } if path == "/data/none"),
        "{:?}",
        errors[0].1
    );
}

#[test]
fn a_path_on_a_device_sysfs_does_not_list_is_unknown_or_no_block_device() {
    // the tempdir's device is absent from this empty /sys/dev/block
    let sys = Sys::new();
    std::fs::create_dir_all(sys.fs.path("/data")).unwrap();
    let err = resolve_entry(
        &sys.fs,
        &MountTable::default(),
        "/data",
        StorageLevel::Device,
    )
    .unwrap_err();
    match err {
        DeviceError::NoBlockDevice { path, fstype, .. } => {
            assert_eq!(path, "/data");
            assert_eq!(fstype, "unknown");
        }
        other => panic!("expected NoBlockDevice, got {other:?}"),
    }
}

#[test]
fn an_invalid_glob_is_reported() {
    let sys = Sys::new();
    let err = resolve_entry(
        &sys.fs,
        &MountTable::default(),
        "/data/[",
        StorageLevel::Device,
    )
    .unwrap_err();
    assert!(
        matches!(&err, DeviceError::GlobInvalid { pattern, .. } if pattern == "/data/["),
        "{err:?}"
    );
    assert!(err.to_string().contains("`/data/[`"), "{err}");
}

// ---------------------------------------------------------------- this VM, as a fixture

fn debian_vm() -> HostFs {
    HostFs::with_root(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hosts/debian-vm-v1"),
    )
}

#[test]
fn fixture_mount_table() {
    let t = MountTable::read(&debian_vm()).unwrap();
    assert_eq!(t.mounts.len(), 19);
    let root = t.containing(Path::new("/u01/oradata")).unwrap();
    assert_eq!(root.mount_point, PathBuf::from("/"));
    assert_eq!(root.fstype, "ext4");
    assert_eq!(root.source, "/dev/vda");
    assert_eq!(root.devnum, DevNum::new(254, 0));
    // /dev/shm is mounted twice; the later (top) mount is the one that holds paths
    let shm = t.containing(Path::new("/dev/shm/x")).unwrap();
    assert_eq!(
        (shm.fstype.as_str(), shm.devnum),
        ("tmpfs", DevNum::new(0, 27))
    );
    assert_eq!(
        t.by_devnum(DevNum::new(0, 27)).unwrap().mount_point,
        PathBuf::from("/dev/shm")
    );
    assert_eq!(t.mounts.iter().filter(|m| m.fstype == "cgroup").count(), 9);
    let unified: Vec<_> = t.mounts.iter().filter(|m| m.fstype == "cgroup2").collect();
    assert_eq!(unified.len(), 1);
    assert_eq!(
        unified[0].mount_point,
        PathBuf::from("/sys/fs/cgroup/unified")
    );
    let blkio = t
        .mounts
        .iter()
        .find(|m| m.mount_point == Path::new("/sys/fs/cgroup/blkio"))
        .unwrap();
    assert_eq!(blkio.super_options, vec!["rw", "blkio"]);
}

#[test]
fn fixture_numa_topology() {
    let n = NumaTopology::read(&debian_vm()).unwrap();
    assert_eq!(n.online_cpus.to_string(), "0-1");
    assert_eq!(n.nodes.len(), 1);
    assert_eq!(n.nodes[&0].to_string(), "0-1");
    assert_eq!(n.node_set().to_string(), "0");
    assert_eq!(n.cpus_of(&"1".parse().unwrap()), Err(1));
}

#[test]
fn fixture_block_devices() {
    let fs = debian_vm();
    for level in [StorageLevel::Device, StorageLevel::Members] {
        let vda = devices_for(&fs, DevNum::new(254, 0), level).unwrap();
        assert_eq!(
            vda,
            vec![BlockDevice {
                devnum: DevNum::new(254, 0),
                name: "vda".into()
            }]
        );
        let loop0 = devices_for(&fs, DevNum::new(7, 0), level).unwrap();
        assert_eq!(
            loop0,
            vec![BlockDevice {
                devnum: DevNum::new(7, 0),
                name: "loop0".into()
            }]
        );
    }
    assert_eq!(
        devices_for(&fs, DevNum::new(7, 1), StorageLevel::Device),
        None
    );
}

// ---------------------------------------------------------------- the real host, read only

fn real() -> (HostFs, MountTable) {
    let fs = HostFs::default();
    let mounts = MountTable::read(&fs).unwrap();
    (fs, mounts)
}

#[test]
fn real_tmpfs_path_has_no_block_device() {
    let (fs, mounts) = real();
    let on_tmpfs = mounts
        .containing(Path::new("/dev/shm"))
        .is_some_and(|m| m.fstype == "tmpfs");
    if !on_tmpfs {
        eprintln!("skipped: /dev/shm is not a tmpfs on this host");
        return;
    }
    let err = resolve_entry(&fs, &mounts, "/dev/shm", StorageLevel::Device).unwrap_err();
    assert!(
        matches!(&err, DeviceError::NoBlockDevice { path, fstype, .. } if path == "/dev/shm" && fstype == "tmpfs"),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("`/dev/shm`") && msg.contains("`tmpfs`"),
        "{msg}"
    );
}

#[test]
fn real_missing_path() {
    let (fs, mounts) = real();
    let p = "/nonexistent-dbcage-test/data";
    let err = resolve_entry(&fs, &mounts, p, StorageLevel::Device).unwrap_err();
    assert!(
        matches!(&err, DeviceError::Missing { path, .. } if path == p),
        "{err:?}"
    );
    assert!(err.to_string().contains(p), "{err}");
}

#[test]
fn real_empty_glob() {
    let (fs, mounts) = real();
    let p = "/nonexistent-dbcage-test-*/data";
    let err = resolve_entry(&fs, &mounts, p, StorageLevel::Device).unwrap_err();
    assert_eq!(err, DeviceError::GlobEmpty { pattern: p.into() });
    assert!(err.to_string().contains(p), "{err}");
}

#[test]
fn real_root_is_on_vda() {
    if !Path::new("/sys/dev/block/254:0").exists() {
        eprintln!("skipped: this host has no 254:0 (vda)");
        return;
    }
    let (fs, mounts) = real();
    let devs = resolve_entry(&fs, &mounts, "/", StorageLevel::Device).unwrap();
    assert_eq!(
        devs,
        vec![BlockDevice {
            devnum: DevNum::new(254, 0),
            name: "vda".into()
        }]
    );
}

#[test]
fn real_block_device_node_is_its_own_device() {
    if !Path::new("/sys/dev/block/254:0").exists() || !Path::new("/dev/vda").exists() {
        eprintln!("skipped: this host has no /dev/vda (254:0)");
        return;
    }
    let (fs, mounts) = real();
    let devs = resolve_entry(&fs, &mounts, "/dev/vda", StorageLevel::Members).unwrap();
    assert_eq!(
        devs,
        vec![BlockDevice {
            devnum: DevNum::new(254, 0),
            name: "vda".into()
        }]
    );
    // /dev itself is a devtmpfs (here), which has no block device
    let dev_fs = mounts.containing(Path::new("/dev")).unwrap().fstype.clone();
    if dev_fs == "devtmpfs" {
        let err = resolve_entry(&fs, &mounts, "/dev", StorageLevel::Device).unwrap_err();
        assert!(
            matches!(&err, DeviceError::NoBlockDevice { fstype, .. } if *fstype == dev_fs),
            "{err:?}"
        );
    }
}
