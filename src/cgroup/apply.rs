//! Executes a plan: the only code that creates groups, writes control files and moves processes.
//! Every failure names the file, the value and the kernel's error. A process that exits between
//! the scan and its move (ESRCH) is counted, not an error.

use std::io::Write;
use std::path::Path;

use serde::Serialize;

use super::CgroupError;
use crate::plan::{Plan, Step};

#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    pub created: usize,
    pub written: usize,
    pub moved: usize,
    /// Processes that exited before they could be moved.
    pub vanished: usize,
    #[serde(serialize_with = "errors_as_text")]
    pub errors: Vec<CgroupError>,
}

fn errors_as_text<S: serde::Serializer>(errors: &[CgroupError], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(errors.iter().map(|e| e.to_string()))
}

/// Writes one value to a control file, in a single write(2) as the kernel expects.
pub fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    let result = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()));
    result.map_err(|source| {
        let hint = hint_for(path, &source);
        CgroupError::Write {
            path: path.to_path_buf(),
            value: value.to_string(),
            source,
            hint,
        }
    })
}

fn hint_for(path: &Path, e: &std::io::Error) -> String {
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    match (e.raw_os_error(), file.as_str()) {
        (Some(libc_enodev), f) if libc_enodev == nix::libc::ENODEV && f.starts_with("blkio.") => {
            " (the kernel has no such whole disk: blk-throttle accepts whole disks, not partitions)".into()
        }
        (Some(e), f) if e == nix::libc::EINVAL && f.starts_with("memory.") => {
            " (memory.memsw.limit_in_bytes must stay at or above memory.limit_in_bytes)".into()
        }
        (Some(e), "cgroup.procs") if e == nix::libc::ENOSPC => " (the target cpuset has no cpus or memory nodes)".into(),
        (Some(e), f) if e == nix::libc::EBUSY && f.starts_with("memory.") => {
            " (the group already uses more memory than this limit and the kernel could not reclaim it)".into()
        }
        _ => String::new(),
    }
}

pub fn execute(plan: &Plan) -> Outcome {
    let mut out = Outcome::default();
    for step in &plan.steps {
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
                Ok(()) => out.written += 1,
                Err(e) => out.errors.push(e),
            },
            Step::Move { pid, targets, .. } => {
                let mut gone = false;
                for t in targets {
                    match write_file(t, &pid.to_string()) {
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
        }
    }
    out
}
