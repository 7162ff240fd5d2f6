//! The packaged unit's capabilities against this kernel (cgroup v1; v2 is checked in the systemd
//! guest, tests/sdguest/): with exactly `CapabilityBoundingSet=` of dist/dbcage.service, a root
//! process can move another root process (one with every capability) into a group of each
//! controller dbcage drives, and without CAP_SYS_NICE the cpuset move fails (the kernel's
//! cpuset_can_attach → security_task_setscheduler check), so the capability is load-bearing.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

/// The unit's `CapabilityBoundingSet=` as setpriv's `+cap` list.
fn unit_caps() -> Vec<String> {
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/dist/dbcage.service"))
        .unwrap();
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("dist/dbcage.service sets CapabilityBoundingSet=");
    line.split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect()
}

/// A cgroup directory removed (after moving its processes back) when dropped.
struct Group {
    dir: PathBuf,
    home: PathBuf,
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(self.home.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn group(controller: &str, tag: &str) -> Group {
    let home = own_dir(controller);
    let dir = home.join(format!("dbcage-test-caps-{tag}"));
    std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    if controller == "cpuset" {
        for f in ["cpuset.cpus", "cpuset.mems"] {
            let v = std::fs::read_to_string(home.join(f)).unwrap();
            std::fs::write(dir.join(f), v.trim()).unwrap();
        }
    }
    Group { dir, home }
}

/// Writes `pid` into `dir/cgroup.procs` from a root shell whose capabilities are `caps` only.
fn move_with(caps: &[String], pid: u32, dir: &Path) -> Result<(), String> {
    let bounding = format!("-all,{}", caps.join(","));
    let out = Command::new("setpriv")
        .args([
            "--bounding-set",
            &bounding,
            "--inh-caps=-all",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!(
            "exec /bin/echo {pid} > {}/cgroup.procs",
            dir.display()
        ))
        .output()
        .expect("run setpriv (util-linux)");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

#[test]
fn unit_capabilities_suffice_for_every_controller_and_cpuset_needs_sys_nice() {
    if skip() {
        return;
    }
    let caps = unit_caps();
    let tag = sid();
    let mut victim = Child::named(&format!("dbcage-test-caps-{tag}"), "sleep", &["300"]);
    // Not memory: the host's memory hierarchy holds the supervisor's group, and the kernel has
    // no capability check on memory moves (mem_cgroup_can_attach).
    for controller in ["cpu", "cpuacct", "blkio", "cpuset"] {
        let g = group(controller, &tag);
        move_with(&caps, victim.pid, &g.dir).unwrap_or_else(|e| {
            panic!("{controller}: the unit's capabilities {caps:?} cannot move a root process: {e}")
        });
        assert_eq!(
            proc_cgroups(victim.pid)[controller],
            format!(
                "{}/dbcage-test-caps-{tag}",
                own_cgroups()[controller].trim_end_matches('/')
            ),
            "{controller}"
        );
        std::fs::write(g.home.join("cgroup.procs"), victim.pid.to_string()).unwrap();
        if controller == "cpuset" {
            let without: Vec<String> = caps.iter().filter(|c| *c != "+sys_nice").cloned().collect();
            let err = move_with(&without, victim.pid, &g.dir).expect_err(
                "a cpuset move without CAP_SYS_NICE succeeded: is the capability still needed?",
            );
            assert!(err.contains("Operation not permitted"), "{err}");
            println!("cpuset move without CAP_SYS_NICE: {err}");
        }
    }
    assert!(victim.alive());
}
