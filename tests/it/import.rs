//! `dbcage import-libcgroup` against libcgroup itself: the same cgconfig.conf is loaded by
//! Debian's cgconfigparser (cgroup-tools) and, converted, applied by dbcage; the kernel values
//! both leave behind must be equal. Groups are named dbcage-test-*, created in the test's own
//! cgroup: cgconfigparser is given the same groups with the test's own path in each hierarchy
//! as a prefix (one group per controller, since the paths may differ), and dbcage the file as a
//! user would write it. There is no memory block: this host's memory hierarchy is not the
//! test's to fill at its root, and the other controllers show the conversion.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::common::*;

/// Removes the groups cgconfigparser created, when the test ends however it ends.
struct LibcgroupGroups(Vec<PathBuf>);

impl Drop for LibcgroupGroups {
    fn drop(&mut self) {
        for d in &self.0 {
            if d.is_dir() {
                let parent = d.parent().unwrap();
                for pid in procs_in(d) {
                    let _ = std::fs::write(parent.join("cgroup.procs"), pid.to_string());
                }
                if let Err(e) = std::fs::remove_dir(d) {
                    eprintln!("cleanup: rmdir {}: {e}", d.display());
                }
            }
        }
    }
}

fn read(p: &std::path::Path) -> String {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .to_string()
}

#[test]
fn imported_policy_gives_the_kernel_values_cgconfigparser_gives() {
    if skip_unless_v1("cgconfig.conf and cgrules.conf are v1 formats (per-hierarchy groups, blkio.throttle files)") {
        return;
    }
    if Command::new("cgconfigparser").arg("-h").output().is_err() {
        cannot_run("needs cgconfigparser (scripts/test.sh installs cgroup-tools)");
        return;
    }
    let disk = LoopDisk::new(64);
    let dev = disk.devnum();
    let tag = format!("dbcage-test-lc{}", std::process::id());
    let (a, b) = (format!("{tag}-a"), format!("{tag}-b"));
    let comm = comm_tag("lcimp");
    let cgconfig = format!(
        "group {a} {{\n  cpuset {{\n    cpuset.cpus = 0;\n    cpuset.mems = 0;\n  }}\n  cpu {{\n    cpu.shares = 512;\n    cpu.cfs_quota_us = 50000;\n    cpu.cfs_period_us = 100000;\n  }}\n  blkio {{\n    blkio.throttle.read_iops_device = \"{dev} 10\";\n    blkio.throttle.write_bps_device = \"{dev} 1048576\";\n  }}\n}}\n\ngroup {b} {{\n  cpu {{\n    cpu.shares = 2048;\n    cpu.cfs_quota_us = 150000;\n  }}\n}}\n"
    );
    // What cgconfigparser loads: the same values, each controller's groups under the test's
    // own cgroup in that hierarchy (cgconfig group names are relative to the mount point).
    let h = hierarchies();
    let own_rel = |c: &str| -> String {
        let own = own_dir(c);
        let rel = own
            .strip_prefix(&h[c].mount_point)
            .unwrap()
            .to_string_lossy();
        if rel.is_empty() {
            String::new()
        } else {
            format!("{rel}/")
        }
    };
    let (pcs, pc, pb) = (own_rel("cpuset"), own_rel("cpu"), own_rel("blkio"));
    let libcgroup_conf = format!(
        "group {pcs}{a} {{\n  cpuset {{\n    cpuset.cpus = 0;\n    cpuset.mems = 0;\n  }}\n}}\n\ngroup {pc}{a} {{\n  cpu {{\n    cpu.shares = 512;\n    cpu.cfs_quota_us = 50000;\n    cpu.cfs_period_us = 100000;\n  }}\n}}\n\ngroup {pb}{a} {{\n  blkio {{\n    blkio.throttle.read_iops_device = \"{dev} 10\";\n    blkio.throttle.write_bps_device = \"{dev} 1048576\";\n  }}\n}}\n\ngroup {pc}{b} {{\n  cpu {{\n    cpu.shares = 2048;\n    cpu.cfs_quota_us = 150000;\n  }}\n}}\n"
    );
    let cgrules = format!("*:{comm}  cpu,cpuset,blkio  {a}\n");
    let dir = tempfile::Builder::new()
        .prefix("dbcage-test-lc-")
        .tempdir()
        .unwrap();
    let cfg_path = dir.path().join("cgconfig.conf");
    let libcgroup_path = dir.path().join("cgconfig-in-own-cgroup.conf");
    std::fs::write(&libcgroup_path, &libcgroup_conf).unwrap();
    let rules_path = dir.path().join("cgrules.conf");
    std::fs::write(&cfg_path, &cgconfig).unwrap();
    std::fs::write(&rules_path, &cgrules).unwrap();

    // libcgroup's own result.
    let lc = |c: &str, g: &str| own_dir(c).join(g);
    let _groups = LibcgroupGroups(vec![
        lc("cpuset", &a),
        lc("cpu", &a),
        lc("blkio", &a),
        lc("cpu", &b),
    ]);
    let out = Command::new("cgconfigparser")
        .arg("-l")
        .arg(&libcgroup_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cgconfigparser: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // dbcage's: convert, then apply.
    let out = Command::new(DBCAGE)
        .args(["import-libcgroup", "--cgconfig"])
        .arg(&cfg_path)
        .arg("--cgrules")
        .arg(&rules_path)
        .output()
        .unwrap();
    let policy = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "import-libcgroup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{policy}");
    let t = Tenancy::new("lcimp", &policy);
    t.ok(&["check"]);
    // cgred matches the process name (comm): a symlink gives `sleep` that name.
    let link = dir.path().join(&comm);
    let sleep = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v sleep"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    std::os::unix::fs::symlink(sleep.trim(), &link).unwrap();
    let mut p = Child::named(&comm, &link.to_string_lossy(), &["60"]);
    t.ok(&["apply"]);

    let blkio_dir = |tenant: &str, file: &str| {
        // Limits sit on the tenant's `limited` leaf (its `exempt` leaf has none) or the tenant.
        let leaf = t.leaf_dir("blkio", tenant, "limited").join(file);
        if leaf.exists() && !read(&leaf).is_empty() {
            leaf
        } else {
            t.tenant_dir("blkio", tenant).join(file)
        }
    };
    let pairs: Vec<(String, PathBuf, PathBuf)> = vec![
        (
            "cpuset.cpus".into(),
            lc("cpuset", &a),
            t.tenant_dir("cpuset", &a),
        ),
        (
            "cpuset.mems".into(),
            lc("cpuset", &a),
            t.tenant_dir("cpuset", &a),
        ),
        ("cpu.shares".into(), lc("cpu", &a), t.tenant_dir("cpu", &a)),
        (
            "cpu.cfs_quota_us".into(),
            lc("cpu", &a),
            t.tenant_dir("cpu", &a),
        ),
        (
            "cpu.cfs_period_us".into(),
            lc("cpu", &a),
            t.tenant_dir("cpu", &a),
        ),
        ("cpu.shares".into(), lc("cpu", &b), t.tenant_dir("cpu", &b)),
        (
            "cpu.cfs_quota_us".into(),
            lc("cpu", &b),
            t.tenant_dir("cpu", &b),
        ),
        (
            "cpu.cfs_period_us".into(),
            lc("cpu", &b),
            t.tenant_dir("cpu", &b),
        ),
    ];
    let mut report = Vec::new();
    let mut differ = Vec::new();
    let mut compare = |what: String, libcgroup: String, dbcage: String| {
        report.push(format!(
            "{what:<45} libcgroup {libcgroup:<14} dbcage {dbcage}"
        ));
        if libcgroup != dbcage {
            differ.push(what);
        }
    };
    for (file, l, d) in pairs {
        let what = format!("{}/{file}", l.file_name().unwrap().to_string_lossy());
        compare(what, read(&l.join(&file)), read(&d.join(&file)));
    }
    for file in [
        "blkio.throttle.read_iops_device",
        "blkio.throttle.write_bps_device",
    ] {
        compare(
            format!("{a}/{file}"),
            read(&lc("blkio", &a).join(file)),
            read(&blkio_dir(&a, file)),
        );
    }
    println!("{}", report.join("\n"));
    assert!(
        differ.is_empty(),
        "values differ: {differ:?}\n{}",
        report.join("\n")
    );
    // The cgrules line became a rule: the process is in the tenant.
    assert!(
        wait_until(Duration::from_secs(5), || proc_cgroups(p.pid)["cpu"]
            .contains(&format!("/{}/{a}", t.root))),
        "{comm} not placed: {:?}",
        proc_cgroups(p.pid)
    );
    assert!(p.alive());
}
