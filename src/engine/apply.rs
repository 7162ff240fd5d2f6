//! Executes a plan: the only code that creates groups, writes control files and moves processes
//! (through `cgroup::apply::write_file`). A process that exits between the scan and its move
//! (ESRCH) is counted, not an error.

use serde::Serialize;

use crate::cgroup::apply::{read_back, write_file};
use crate::cgroup::CgroupError;
use crate::plan::{Plan, Step};

#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    pub created: usize,
    pub written: usize,
    pub moved: usize,
    /// Processes that exited before they could be moved.
    pub vanished: usize,
    /// Steps not attempted: on v2, after a `cgroup.subtree_control` write fails, the limit
    /// files it would have created do not exist and moving processes would put them under no
    /// limit, so the rest of the plan is left undone.
    pub skipped: usize,
    #[serde(serialize_with = "errors_as_text")]
    pub errors: Vec<CgroupError>,
    /// What went wrong and was recovered from, for the log: a scope whose start failed because
    /// some of its processes had exited, adopted again without them (systemd's journal shows
    /// the failed start; this says why).
    pub recovered: Vec<String>,
}

fn errors_as_text<S: serde::Serializer>(errors: &[CgroupError], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(errors.iter().map(|e| e.to_string()))
}

pub fn execute(plan: &Plan) -> Outcome {
    let mut out = Outcome::default();
    // Connected on the first systemd step only: plans without them never touch the bus.
    let mut systemd: Option<Result<crate::systemd::Systemd, crate::systemd::Error>> = None;
    for (i, step) in plan.steps.iter().enumerate() {
        match step {
            Step::Mkdir { path, .. } => match std::fs::create_dir(path) {
                Ok(()) => out.created += 1,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(source) => out.errors.push(CgroupError::Mkdir {
                    path: path.clone(),
                    source,
                }),
            },
            Step::Write { path, value, .. } => match write_file(path, value) {
                Ok(()) => {
                    out.written += 1;
                    if let Err(e) = read_back(path, value) {
                        out.errors.push(e);
                    }
                }
                // Without the controllers enabled there are no limit files to write, and
                // moved processes would run unlimited: the rest of the plan is left undone.
                Err(e) if crate::cgroup::enables_controllers(path) => {
                    // Refused because the group holds processes again: forks of those this
                    // plan moved out of it into its leaves, made between the plan's reading
                    // and the moves (a unit's processes under systemd). They follow their
                    // parent, and the write is tried again.
                    if e.write_errno() == Some(nix::libc::EBUSY) {
                        if let Some(followed) = follow_forks(path, &plan.steps[..i]) {
                            if write_file(path, value).is_ok() {
                                out.written += 1;
                                out.moved += followed.len();
                                out.recovered.push(format!(
                                    "{}: refused ({}) while pids {followed:?}, forked into its \
                                     group during the plan's moves, were there; moved after their \
                                     parents into its leaves and written again",
                                    path.display(),
                                    nix::errno::Errno::EBUSY.desc()
                                ));
                                continue;
                            }
                        }
                    }
                    out.errors.push(e);
                    out.skipped = plan.steps.len() - i - 1;
                    break;
                }
                Err(e) => out.errors.push(e),
            },
            Step::SetUnitProperties { unit, set, .. } => {
                match systemd.get_or_insert_with(crate::systemd::Systemd::connect) {
                    Ok(sd) => match sd.set_properties(unit, set) {
                        Ok(()) => out.written += set.len(),
                        Err(e) => out.errors.push(e.into()),
                    },
                    Err(e) => out.errors.push(connect_error(e)),
                }
            }
            Step::Adopt {
                tenant,
                pids,
                leaf,
                properties,
                ..
            } => match systemd.get_or_insert_with(crate::systemd::Systemd::connect) {
                Ok(sd) => adopt_retrying(
                    &mut out,
                    tenant,
                    pids,
                    |pid| std::path::Path::new(&format!("/proc/{pid}")).exists(),
                    |pids| {
                        let subgroup = leaf.map_or(String::new(), |l| format!("/{}", l.dir()));
                        crate::systemd::govern::adopt(sd, tenant, pids, &subgroup, properties)
                            .map(|_| ())
                    },
                ),
                Err(e) => out.errors.push(connect_error(e)),
            },
            Step::Move {
                pid,
                targets,
                leave,
                ..
            } => {
                let mut gone = false;
                let pid = pid.to_string();
                for t in targets.iter().chain(leave) {
                    match write_file(t, &pid) {
                        Ok(()) => {}
                        Err(e) if e.write_errno() == Some(nix::libc::ESRCH) => {
                            gone = true;
                            break;
                        }
                        Err(e) => out.errors.push(e),
                    }
                }
                if gone {
                    out.vanished += 1;
                } else {
                    out.moved += 1;
                }
            }
            Step::Remove { path, to, .. } => match crate::cgroup::drain_and_remove(path, to) {
                Ok(moved) => out.moved += moved,
                Err(e) => out.errors.push(e),
            },
        }
    }
    out
}

/// Moves the processes in the group of `subtree_control` (a cgroup v2 `cgroup.subtree_control`)
/// into the leaf their parent (or an earlier ancestor) moved to in `done` (the plan's steps
/// so far): a process forked while its parent was being moved out of the group stays behind in
/// it. Rounds until the group is empty (forks go on while it is emptied), at most a few: the
/// pids moved, or `None` when a process there has no ancestor among the moved ones (not this
/// plan's to place: the next plan classifies it) or a move failed.
fn follow_forks(subtree_control: &std::path::Path, done: &[Step]) -> Option<Vec<u32>> {
    let group = subtree_control.parent()?;
    // Where each process the plan moved went, for the targets in this group's children.
    let went: std::collections::HashMap<u32, &std::path::PathBuf> = done
        .iter()
        .filter_map(|s| match s {
            Step::Move { pid, targets, .. } => targets
                .iter()
                .find(|t| t.parent().and_then(|leaf| leaf.parent()) == Some(group))
                .map(|t| (*pid, t)),
            _ => None,
        })
        .collect();
    if went.is_empty() {
        return None;
    }
    let ppid = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        crate::inventory::procs::parse_stat(&stat).map(|(_, ppid, _)| ppid)
    };
    let mut followed = Vec::new();
    for _ in 0..4 {
        let left = crate::cgroup::procs_in(group);
        if left.is_empty() {
            return Some(followed);
        }
        for pid in left {
            // Its parent's leaf, or the nearest ancestor's (a fork of a fork), below init.
            let target = std::iter::successors(ppid(pid), |&a| ppid(a))
                .take(16)
                .take_while(|&a| a > 1)
                .find_map(|a| went.get(&a))?;
            match write_file(target, &pid.to_string()) {
                Ok(()) => followed.push(pid),
                Err(e) if e.write_errno() == Some(nix::libc::ESRCH) => {}
                Err(_) => return None,
            }
        }
    }
    crate::cgroup::procs_in(group)
        .is_empty()
        .then_some(followed)
}

/// Adopts a tenant's `pids` (`adopt`: into its scope, through systemd). systemd refuses the
/// whole call (UnixProcessIdUnknown), or starts the scope and fails its job, when one process
/// has exited since it was found: the others (`alive`) are adopted again without it, it counts
/// as vanished, and the first error goes to `recovered` with the scope and the exited pids, so
/// that the journal's "Failed to start dbcage-T.scope" has its explanation in dbcage's log.
fn adopt_retrying(
    out: &mut Outcome,
    tenant: &str,
    pids: &[u32],
    alive: impl Fn(u32) -> bool,
    mut adopt: impl FnMut(&[u32]) -> Result<(), crate::systemd::Error>,
) {
    let e = match adopt(pids) {
        Ok(()) => {
            out.moved += pids.len();
            return;
        }
        Err(e) => e,
    };
    let (left, gone): (Vec<u32>, Vec<u32>) = pids.iter().partition(|&&pid| alive(pid));
    if gone.is_empty() {
        out.errors.push(e.into());
        return;
    }
    out.vanished += gone.len();
    out.recovered.push(format!(
        "tenant {tenant}: adopting pids {pids:?} into {} failed ({e}); pids {gone:?} had \
         exited, {}",
        crate::systemd::scope_name(tenant),
        if left.is_empty() {
            "none is left to adopt".to_string()
        } else {
            format!("adopting the others {left:?} again without them")
        }
    ));
    if left.is_empty() {
        return;
    }
    match adopt(&left) {
        Ok(()) => out.moved += left.len(),
        Err(e) => out.errors.push(e.into()),
    }
}

/// A failed connection is reported on every systemd step it prevents (the error is not Clone).
fn connect_error(e: &crate::systemd::Error) -> CgroupError {
    CgroupError::Layout(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(pids: &[u32]) -> crate::systemd::Error {
        crate::systemd::Error::Call {
            method: "StartTransientUnit",
            unit: "dbcage-pg.scope".into(),
            properties: vec![format!("PIDs={pids:?}")],
            name: "org.freedesktop.systemd1.UnixProcessIdUnknown".into(),
            message: "PID 12 doesn't exist.".into(),
        }
    }

    /// A pid gone between the scan and the adoption: the others are adopted on a second try,
    /// and the first error is kept for the log with the scope and the pid that exited.
    #[test]
    fn an_adoption_refused_for_an_exited_pid_is_retried_and_its_error_kept() {
        let mut out = Outcome::default();
        let mut calls = Vec::new();
        adopt_retrying(
            &mut out,
            "pg",
            &[11, 12, 13],
            |pid| pid != 12,
            |pids| {
                calls.push(pids.to_vec());
                if pids.contains(&12) {
                    Err(refused(pids))
                } else {
                    Ok(())
                }
            },
        );
        assert_eq!(calls, [vec![11, 12, 13], vec![11, 13]]);
        assert_eq!((out.moved, out.vanished, out.errors.len()), (2, 1, 0));
        assert_eq!(out.recovered.len(), 1);
        let r = &out.recovered[0];
        assert!(
            r.starts_with("tenant pg: adopting pids [11, 12, 13] into dbcage-pg.scope failed (systemd StartTransientUnit of dbcage-pg.scope"),
            "{r}"
        );
        assert!(
            r.contains("UnixProcessIdUnknown: PID 12 doesn't exist."),
            "{r}"
        );
        assert!(
            r.ends_with("pids [12] had exited, adopting the others [11, 13] again without them"),
            "{r}"
        );

        // Every pid alive: the error is the error, no retry.
        let mut out = Outcome::default();
        adopt_retrying(&mut out, "pg", &[11], |_| true, |p| Err(refused(p)));
        assert_eq!(
            (out.moved, out.errors.len(), out.recovered.len()),
            (0, 1, 0)
        );
    }
}
