//! A systemd unit's delegated subtree (`Delegate=yes`) as dbcage uses it under systemd: the
//! tenant's `limited` and `exempt` leaves inside the unit's own cgroup, in the hierarchy with
//! the io controller. A unit property binds every process of the unit (its IO limits too); a
//! limit written on the `limited` leaf binds only that leaf, so the exempt processes (a WAL
//! writer, a log archiver) run without the IO limits and still in their unit, where
//! `systemctl status`, `stop` and `restart` see them. The unit's other limits (cpu, memory)
//! stay its properties, set through systemd, and bind both leaves.
//!
//! systemd's rules (docs/CGROUP_DELEGATION.md): below a delegated unit's cgroup the unit's
//! processes own the tree; the unit's cgroup itself keeps systemd's attributes, and its
//! `cgroup.procs` and `cgroup.subtree_control` are the delegatee's. On cgroup v2 the
//! no-internal-process rule means every process leaves the unit's own group before `io` is
//! enabled for the leaves.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{procs_in, v2, Controller, Hierarchy, Version};
use crate::classify::Leaf;

/// What a delegated unit's cgroup holds now in the io hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelegatedTree {
    /// The unit's own cgroup directory in the hierarchy with the io controller.
    pub dir: PathBuf,
    pub version: Version,
    /// Whether the io controller can be used below the unit: on v2 `io` is in the unit's
    /// `cgroup.controllers` (systemd enables it for a unit started with Delegate=yes; a unit
    /// given Delegate=yes after it started has none until it restarts); on v1 the unit has its
    /// group in the blkio hierarchy.
    pub io_available: bool,
    /// v2: `io` is enabled in the unit's `cgroup.subtree_control`.
    pub io_enabled: bool,
    /// The processes in the unit's own group (not in a leaf).
    pub in_unit: Vec<u32>,
    /// The leaves that exist, and the processes in each.
    pub leaves: BTreeMap<Leaf, Vec<u32>>,
    /// Other subgroups of the unit that hold processes (made by the unit's own software, or
    /// by someone else): dbcage does not make its leaves next to them.
    pub foreign: Vec<String>,
    /// The IO limit files of the `limited` leaf and what they hold.
    pub limited_files: BTreeMap<&'static str, String>,
}

impl DelegatedTree {
    /// Reads a unit's cgroup (`group`, as /proc/PID/cgroup names it) in the io hierarchy `h`.
    /// `None` when the hierarchy does not show it.
    pub fn read(h: &Hierarchy, group: &str) -> Option<DelegatedTree> {
        let dir = h.dir_of(group)?;
        let io_available = match h.version {
            Version::V2 => crate::hostfs::read_text(dir.join(v2::CONTROLLERS_FILE))
                .is_ok_and(|t| t.split_whitespace().any(|c| c == "io")),
            Version::V1 => dir.is_dir(),
        };
        let io_enabled = h.version == Version::V2
            && crate::hostfs::read_text(dir.join(v2::SUBTREE_CONTROL))
                .is_ok_and(|t| t.split_whitespace().any(|c| c == "io"));
        let mut leaves = BTreeMap::new();
        let mut foreign = Vec::new();
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            match [Leaf::Limited, Leaf::Exempt]
                .into_iter()
                .find(|l| l.dir() == name)
            {
                Some(leaf) => {
                    leaves.insert(leaf, procs_in(&e.path()));
                }
                None if !procs_below(&e.path()) => {}
                None => foreign.push(name),
            }
        }
        foreign.sort();
        let driver = h.driver();
        let limited = dir.join(Leaf::Limited.dir());
        let limited_files = if leaves.contains_key(&Leaf::Limited) {
            driver
                .managed_files(&[Controller::Io])
                .into_iter()
                .filter(|f| super::is_io_limit_file(Path::new(f)))
                .filter_map(|f| Some((f, crate::hostfs::read_text(limited.join(f)).ok()?)))
                .collect()
        } else {
            BTreeMap::new()
        };
        Some(DelegatedTree {
            in_unit: procs_in(&dir),
            dir,
            version: h.version,
            io_available,
            io_enabled,
            leaves,
            foreign,
            limited_files,
        })
    }

    pub fn leaf_dir(&self, leaf: Leaf) -> PathBuf {
        self.dir.join(leaf.dir())
    }

    /// Every process in the unit's own group and its leaves.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.in_unit
            .iter()
            .chain(self.leaves.values().flatten())
            .copied()
    }

    /// Gives the unit its tree back (`release`): the processes of the leaves return to the
    /// unit's own group and the leaves are removed (on v2 `io` is disabled for the unit's
    /// children first: the unit's group may hold processes only then). Returns how many
    /// processes moved.
    pub fn dissolve(&self) -> Result<usize, super::CgroupError> {
        if self.leaves.is_empty() {
            return Ok(0);
        }
        if self.io_enabled {
            super::apply::write_file(&self.dir.join(v2::SUBTREE_CONTROL), "-io")?;
        }
        let mut moved = 0;
        for leaf in self.leaves.keys() {
            moved += super::drain_and_remove(&self.leaf_dir(*leaf), &self.dir)?;
        }
        Ok(moved)
    }
}

/// The tenant's `leaf` in a unit's cgroup directory (`unit_dir`, in any hierarchy), when it
/// is there: the readers read a unit that holds the tenant's leaves through them.
pub fn leaf_in(unit_dir: &Path, leaf: Leaf) -> Option<PathBuf> {
    let dir = unit_dir.join(leaf.dir());
    dir.is_dir().then_some(dir)
}

/// Whether a group or one below it holds a process.
fn procs_below(dir: &Path) -> bool {
    if !procs_in(dir).is_empty() {
        return true;
    }
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.file_type().is_ok_and(|t| t.is_dir()) && procs_below(&e.path()))
}

/// The leaves a delegated unit's processes go to, by `classified` (a process's leaf as the
/// tenant's rules place it, `None` for one they do not place): every process in the unit's
/// own group to its leaf, `limited` when unplaced (a backend forked since the scan, a
/// pg_ctlcluster: the unit's, and so the tenant's). Between the leaves only placed processes
/// move: an unplaced child of an exempt process stays with it. Returns (pid, leaf) for each
/// process not in its leaf yet.
pub fn moves(tree: &DelegatedTree, classified: impl Fn(u32) -> Option<Leaf>) -> Vec<(u32, Leaf)> {
    let mut out: Vec<(u32, Leaf)> = tree
        .in_unit
        .iter()
        .map(|&p| (p, classified(p).unwrap_or(Leaf::Limited)))
        .collect();
    for (&leaf, pids) in &tree.leaves {
        for &p in pids {
            match classified(p) {
                Some(want) if want != leaf => out.push((p, want)),
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> DelegatedTree {
        DelegatedTree {
            dir: "/sys/fs/cgroup/system.slice/pg.service".into(),
            version: Version::V2,
            io_available: true,
            io_enabled: false,
            in_unit: vec![10, 11],
            leaves: BTreeMap::from([(Leaf::Limited, vec![12, 13]), (Leaf::Exempt, vec![14])]),
            foreign: vec![],
            limited_files: BTreeMap::new(),
        }
    }

    #[test]
    fn unit_processes_go_to_their_leaves_and_only_classified_ones_change_leaf() {
        // 11 and 13 are exempt; 14 sits in exempt unclassified (an exempt process's child).
        let classified = |p| match p {
            11 | 13 => Some(Leaf::Exempt),
            10 | 12 => Some(Leaf::Limited),
            _ => None,
        };
        assert_eq!(
            moves(&tree(), classified),
            [(10, Leaf::Limited), (11, Leaf::Exempt), (13, Leaf::Exempt)]
        );
        assert_eq!(tree().pids().collect::<Vec<_>>(), [10, 11, 12, 13, 14]);
    }

    #[test]
    fn reads_a_unit_tree_from_the_filesystem() {
        let root = tempfile::tempdir().unwrap();
        let unit = root.path().join("system.slice/pg.service");
        for d in ["limited", "other/deeper", "empty"] {
            std::fs::create_dir_all(unit.join(d)).unwrap();
        }
        std::fs::write(unit.join("cgroup.controllers"), "cpu io memory\n").unwrap();
        std::fs::write(unit.join("cgroup.subtree_control"), "io\n").unwrap();
        std::fs::write(unit.join("cgroup.procs"), "7\n").unwrap();
        std::fs::write(unit.join("limited/cgroup.procs"), "8\n9\n").unwrap();
        std::fs::write(unit.join("limited/io.max"), "254:32 rbps=1048576\n").unwrap();
        std::fs::write(unit.join("other/deeper/cgroup.procs"), "20\n").unwrap();
        let h = Hierarchy {
            version: Version::V2,
            mount_point: root.path().to_path_buf(),
            mount_root: "/".into(),
            controllers: vec![Controller::Io],
            mount_controllers: vec![],
            own_path: "/".into(),
        };
        let t = DelegatedTree::read(&h, "/system.slice/pg.service").unwrap();
        assert!(t.io_available && t.io_enabled);
        assert_eq!(t.in_unit, [7]);
        assert_eq!(t.leaves, BTreeMap::from([(Leaf::Limited, vec![8, 9])]));
        assert_eq!(t.foreign, ["other"]);
        assert_eq!(
            t.limited_files.get("io.max").map(String::as_str),
            Some("254:32 rbps=1048576\n")
        );
    }
}
