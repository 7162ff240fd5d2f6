//! `agent.favordynmods = true`: the daemon turns on the kernel's `favordynmods` cgroup option at
//! start by mounting one extra controller-less named v1 hierarchy with it, unless some cgroup
//! mount on the host has it already. It owns that one mount and nothing else: it never remounts
//! the hierarchies in use, and it leaves the mount in place when it stops (the option is the
//! host's choice, like a line in /etc/fstab; unmounting it is the administrator's).
//!
//! Why it works (Documentation/admin-guide/cgroup-v2.rst, `favordynmods`; Linux 6.0 and later):
//! every cgroup.procs write takes cgroup_threadgroup_rwsem for writing, and a write that follows
//! a quiet spell first waits for an RCU grace period (8 to 16 ms here) for the lock's readers
//! (every fork and exit) to leave their fast path. The option keeps them on the slow path, so
//! moves never wait for a grace period, at a cost to every fork and exit. The lock is shared by
//! all hierarchies, so any one mount with the option turns it on for all of them.

use std::path::{Path, PathBuf};

use crate::inventory::MountTable;

/// Where the daemon mounts it by default; the directory's name is the hierarchy's name.
pub const DEFAULT_DIR: &str = "/run/dbcage-favordynmods";

/// What `ensure` found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A cgroup mount with the option exists already (here): nothing to do.
    Present(PathBuf),
    /// The daemon mounted it here.
    Mounted(PathBuf),
}

/// The first cgroup (v1 or v2) mount whose super options include `favordynmods`.
pub fn mounted_with_option(mounts: &MountTable) -> Option<&Path> {
    mounts
        .mounts
        .iter()
        .find(|m| {
            (m.fstype == "cgroup" || m.fstype == "cgroup2")
                && m.super_options.iter().any(|o| o == "favordynmods")
        })
        .map(|m| m.mount_point.as_path())
}

/// The mount options for a controller-less named hierarchy called `name` with the option.
pub fn mount_options(name: &str) -> String {
    format!("none,name={name},favordynmods")
}

/// The shell commands that do what `ensure` does, for messages.
pub fn commands(dir: &Path) -> String {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("?");
    format!(
        "mkdir -p {d} && mount -t cgroup -o {o} cgroup {d}",
        d = dir.display(),
        o = mount_options(name)
    )
}

/// The hierarchy's name: the directory's last component, which must be a plain name (the
/// kernel takes `[A-Za-z0-9_.-]`, at most 64 bytes).
fn hierarchy_name(dir: &Path) -> Result<&str, String> {
    if !dir.is_absolute() {
        return Err(format!("{}: not an absolute path", dir.display()));
    }
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{}: no directory name to name the hierarchy", dir.display()))?;
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        && name != "."
        && name != "..";
    if ok {
        Ok(name)
    } else {
        Err(format!(
            "{}: `{name}` cannot name a cgroup hierarchy (use letters, digits, `_`, `.` and `-`, at most 64)",
            dir.display()
        ))
    }
}

/// Turns the option on, unless a cgroup mount in `mounts` has it: creates `dir` (a directory,
/// not a symlink) and mounts the named hierarchy there. The error says what failed, the
/// kernel's answer, what it likely means and the commands to run by hand.
pub fn ensure(dir: &Path, mounts: &MountTable) -> Result<Outcome, String> {
    if let Some(at) = mounted_with_option(mounts) {
        return Ok(Outcome::Present(at.to_path_buf()));
    }
    let name = hierarchy_name(dir)?;
    if let Err(e) = std::fs::create_dir(dir) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(format!("creating {}: {e}", dir.display()));
        }
    }
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_dir() => {}
        Ok(_) => {
            return Err(format!(
                "{} exists and is not a directory (a symlink is not followed)",
                dir.display()
            ))
        }
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    }
    use nix::mount::{mount, MsFlags};
    let options = mount_options(name);
    mount(
        Some("cgroup"),
        dir,
        Some("cgroup"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(options.as_str()),
    )
    .map_err(|e| {
        let why = match e {
            nix::errno::Errno::EINVAL => {
                "the kernel knows no favordynmods (it came in Linux 6.0) or has no cgroup v1 support"
            }
            nix::errno::Errno::EBUSY => {
                "a hierarchy of that name exists already, mounted without the option: mount it with the option, or pick another directory name"
            }
            nix::errno::Errno::EPERM => "mounting needs CAP_SYS_ADMIN in the initial namespaces",
            _ => "see mount(2)",
        };
        format!(
            "mount -t cgroup -o {options} cgroup {}: {e} ({why}); by hand: {}",
            dir.display(),
            commands(dir)
        )
    })?;
    Ok(Outcome::Mounted(dir.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_option_is_found_on_cgroup_mounts_only() {
        let none = MountTable::parse(
            "30 25 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
             50 25 0:50 / /mnt rw - tmpfs tmpfs rw,favordynmods\n",
        );
        assert_eq!(mounted_with_option(&none), None);
        let named = MountTable::parse(
            "40 25 0:40 / /run/dbcage-favordynmods rw - cgroup cgroup rw,favordynmods,name=dbcage-favordynmods\n",
        );
        assert_eq!(
            mounted_with_option(&named),
            Some(Path::new("/run/dbcage-favordynmods"))
        );
        let v2 =
            MountTable::parse("29 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,favordynmods\n");
        assert!(mounted_with_option(&v2).is_some());
        // Present already: nothing is created or mounted.
        assert_eq!(
            ensure(Path::new("/nonexistent/dbcage-test-x"), &named),
            Ok(Outcome::Present(PathBuf::from("/run/dbcage-favordynmods")))
        );
    }

    #[test]
    fn the_directory_names_the_hierarchy() {
        assert_eq!(
            hierarchy_name(Path::new(DEFAULT_DIR)),
            Ok("dbcage-favordynmods")
        );
        assert_eq!(
            mount_options("dbcage-favordynmods"),
            "none,name=dbcage-favordynmods,favordynmods"
        );
        assert!(commands(Path::new(DEFAULT_DIR)).ends_with(
            "mount -t cgroup -o none,name=dbcage-favordynmods,favordynmods cgroup /run/dbcage-favordynmods"
        ));
        for bad in ["relative/x", "/run/a,b", "/run/a=b", "/run/x y", "/"] {
            let e = hierarchy_name(Path::new(bad)).expect_err(bad);
            assert!(e.contains(bad.trim_end_matches('/')) || bad == "/", "{e}");
        }
        let long = format!("/run/{}", "x".repeat(65));
        assert!(hierarchy_name(Path::new(&long)).is_err());
        // Refused before anything is created.
        let e = ensure(Path::new("/run/a,b"), &MountTable::default()).unwrap_err();
        assert!(e.contains("cannot name a cgroup hierarchy"), "{e}");
    }
}
