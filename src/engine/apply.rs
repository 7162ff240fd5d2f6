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
                properties,
                ..
            } => match systemd.get_or_insert_with(crate::systemd::Systemd::connect) {
                Ok(sd) => match crate::systemd::govern::adopt(sd, tenant, pids, properties) {
                    Ok(_) => out.moved += pids.len(),
                    // systemd refuses the whole call (UnixProcessIdUnknown), or starts the scope
                    // and fails its job, when one process has exited since it was found: the
                    // others are adopted without it, and it counts as vanished.
                    Err(e) => {
                        let alive: Vec<u32> = pids
                            .iter()
                            .copied()
                            .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
                            .collect();
                        if alive.len() == pids.len() {
                            out.errors.push(e.into());
                            continue;
                        }
                        out.vanished += pids.len() - alive.len();
                        if alive.is_empty() {
                            continue;
                        }
                        match crate::systemd::govern::adopt(sd, tenant, &alive, properties) {
                            Ok(_) => out.moved += alive.len(),
                            Err(e) => out.errors.push(e.into()),
                        }
                    }
                },
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
                        Err(CgroupError::Write { ref source, .. })
                            if source.raw_os_error() == Some(nix::libc::ESRCH) =>
                        {
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

/// A failed connection is reported on every systemd step it prevents (the error is not Clone).
fn connect_error(e: &crate::systemd::Error) -> CgroupError {
    CgroupError::Layout(e.to_string())
}
