//! The one writer of control files (`write_file`, with the `cgroup.procs` descriptor cache the
//! daemon's moves go through) and the check that the kernel holds what was written
//! (`read_back`). Every failure names the file, the value and the kernel's error.

use std::io::Write;
use std::path::Path;

use super::model::parse_memory;
use super::{v1, v2, CgroupError};
use crate::kernel::CpuSet;

/// Writes one value to a control file, in a single write(2) as the kernel expects.
pub fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    let result = if path
        .as_os_str()
        .as_encoded_bytes()
        .ends_with(b"/cgroup.procs")
    {
        write_procs(path, value)
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|mut f| f.write_all(value.as_bytes()))
    };
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

/// Writes to a `cgroup.procs` through a cached descriptor: the daemon moves one process per
/// event into the same few leaves, and opening and closing the file each time doubles the
/// syscalls of a move. A descriptor of a group that was removed (and maybe created again) fails
/// with ENODEV; it is then reopened once. Keyed by the path's bytes: hashing a `Path` parses
/// its components, which cost more than the rest of the lookup (profiled in a storm).
fn write_procs(path: &Path, value: &str) -> std::io::Result<()> {
    use std::collections::HashMap;
    use std::ffi::OsString;
    use std::sync::Mutex;
    static OPEN: Mutex<Option<HashMap<OsString, std::fs::File>>> = Mutex::new(None);
    const MAX_OPEN: usize = 512;
    let mut guard = OPEN.lock().unwrap_or_else(|e| e.into_inner());
    let files = guard.get_or_insert_with(HashMap::new);
    let key = path.as_os_str();
    for attempt in 0..2 {
        let result = match files.get_mut(key) {
            Some(f) => f.write_all(value.as_bytes()),
            None => {
                if files.len() >= MAX_OPEN {
                    files.clear();
                }
                let f = std::fs::OpenOptions::new().write(true).open(path)?;
                files
                    .entry(key.to_os_string())
                    .or_insert(f)
                    .write_all(value.as_bytes())
            }
        };
        match result {
            Ok(()) => return Ok(()),
            Err(e) if attempt == 0 && e.raw_os_error() == Some(nix::libc::ENODEV) => {
                files.remove(key);
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns on its second attempt")
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
        (Some(e), v2::SUBTREE_CONTROL) if e == nix::libc::EBUSY => {
            " (this cgroup has processes of its own, and on cgroup v2 a cgroup that holds processes cannot enable controllers for its children (the no-internal-process rule); \
if it is dbcage's parent, run dbcage under a delegated, empty parent, e.g. a systemd unit with Delegate=yes, or set agent.parent to an empty cgroup)".into()
        }
        (Some(e), "cgroup.procs") if e == nix::libc::EBUSY => {
            " (on cgroup v2 a cgroup that has controllers enabled for its children in cgroup.subtree_control cannot hold processes, unless it is the hierarchy root; \
the processes stay where they are: move them to a leaf cgroup yourself, or use the hierarchy root as agent.parent)".into()
        }
        (Some(e), f) if e == nix::libc::ENODEV && f == v2::IO_MAX => {
            " (the kernel has no such whole disk: io.max accepts whole disks, not partitions)".into()
        }
        (Some(e), f) if e == nix::libc::EBUSY && f.starts_with("memory.") => {
            " (the group already uses more memory than this limit and the kernel could not reclaim it)".into()
        }
        _ => String::new(),
    }
}

/// Rereads a file just written and checks that the kernel holds the value, with the
/// normalisation the plan compares with (lists as sets, memory rounded and `max`/`-1` as
/// unlimited, per-device files device by device, subtree_control as a set of controllers).
pub fn read_back(path: &Path, written: &str) -> Result<(), CgroupError> {
    let got = std::fs::read_to_string(path).map_err(|source| CgroupError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    if holds(&file, written, &got) {
        Ok(())
    } else {
        Err(CgroupError::Readback {
            path: path.to_path_buf(),
            wanted: written.to_string(),
            got: got.trim().replace('\n', "; "),
        })
    }
}

/// Whether the text `got` read back from `file` holds the value `written` to it.
pub fn holds(file: &str, written: &str, got: &str) -> bool {
    match file {
        v2::SUBTREE_CONTROL => {
            let have = v2::parse_controllers(got);
            written
                .split_whitespace()
                .filter_map(|w| w.strip_prefix('+'))
                .all(|c| have.contains(&c))
        }
        v2::IO_MAX => {
            let want = v2::parse_io_max(written);
            let have = v2::parse_io_max(got);
            written
                .split_whitespace()
                .next()
                .and_then(|d| d.parse().ok())
                .is_some_and(|d| want.get(&d) == have.get(&d))
        }
        v2::IO_WEIGHT => v2::parse_io_weight(written) == v2::parse_io_weight(got),
        v2::IO_LATENCY => {
            let mut w = written.split_whitespace();
            let dev = w.next().and_then(|d| d.parse().ok());
            let target = w
                .next()
                .and_then(|t| t.strip_prefix("target="))
                .map(|t| t.parse::<u64>().ok());
            match (dev, target) {
                (Some(d), Some(t)) => v2::parse_io_latency(got).get(&d).copied() == t,
                _ => false,
            }
        }
        f if f.starts_with("blkio.throttle.") => {
            let have = v1::parse_device_lines(got);
            let mut w = written.split_whitespace();
            match (
                w.next().and_then(|d| d.parse().ok()),
                w.next().and_then(|v| v.parse::<u64>().ok()),
            ) {
                (Some(d), Some(v)) => have.get(&d).copied() == (v != 0).then_some(v),
                _ => false,
            }
        }
        v1::CPUS | v1::MEMS => written.parse::<CpuSet>().ok() == got.parse::<CpuSet>().ok(),
        f if f.starts_with("memory.") => match (parse_memory(written), parse_memory(got)) {
            (Some(w), Some(g)) => w == g,
            _ => written.trim() == got.trim(),
        },
        _ => written.trim() == got.trim(),
    }
}

#[cfg(test)]
mod read_back_tests {
    use super::holds;

    #[test]
    fn normalised_like_the_plan() {
        assert!(holds(
            "cgroup.subtree_control",
            "+io +memory",
            "cpuset cpu io memory\n"
        ));
        assert!(!holds("cgroup.subtree_control", "+io +memory", "cpu io\n"));
        assert!(holds(
            "io.max",
            "254:16 rbps=8388608 wbps=max riops=max wiops=max",
            "254:16 rbps=8388608 wbps=max riops=max wiops=max\n254:32 rbps=1 wbps=max riops=max wiops=max\n"
        ));
        assert!(holds(
            "io.max",
            "254:16 rbps=max wbps=max riops=max wiops=max",
            ""
        ));
        assert!(!holds(
            "io.max",
            "254:16 rbps=max wbps=max riops=max wiops=max",
            "254:16 rbps=1 wbps=max riops=max wiops=max\n"
        ));
        assert!(holds("blkio.throttle.read_bps_device", "7:0 0", ""));
        assert!(holds(
            "blkio.throttle.read_bps_device",
            "7:0 5",
            "7:0 5\n7:1 6\n"
        ));
        assert!(holds("cpuset.cpus", "0-1", "0,1\n"));
        assert!(holds("memory.max", "max", "max\n"));
        assert!(holds(
            "memory.limit_in_bytes",
            "-1",
            "9223372036854771712\n"
        ));
        assert!(holds("memory.max", "33554432", "33554432\n"));
        assert!(!holds("memory.max", "33554432", "max\n"));
        assert!(holds("cpu.max", "50000 100000", "50000 100000\n"));
        // io.weight reads back with per-device lines after the default one
        assert!(holds(
            "io.weight",
            "default 300",
            "default 300\n254:16 50\n"
        ));
        assert!(!holds("io.weight", "default 300", "default 100\n"));
        // io.latency: a cleared target leaves no line
        assert!(holds(
            "io.latency",
            "254:16 target=5000",
            "254:16 target=5000\n"
        ));
        assert!(holds("io.latency", "254:16 target=max", ""));
        assert!(!holds(
            "io.latency",
            "254:16 target=max",
            "254:16 target=5000\n"
        ));
    }
}
