//! Watches directories that may come and go: the directory of a pid file (a unit's
//! `RuntimeDirectory=`, which systemd removes when the unit stops and makes again when it
//! starts) and of a storage glob (`/dev/oracleasm/disks`).
//!
//! An inotify watch ends with the directory it watches: a watch made once would miss every
//! change after the directory's first removal. Here a directory that is missing is watched
//! through its nearest existing ancestor, for the entry that leads to it, and `rewatch` moves
//! the watch back down once it exists again. Hand-written over nix's inotify: the `notify`
//! crate watches existing paths only and would need the same ancestor logic on top.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Component, Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// What a change in a watched directory is: a file made, removed, renamed or written.
const CHANGES: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_CLOSE_WRITE);

pub struct DirWatch {
    ino: Inotify,
    /// The directories whose changes matter.
    targets: Vec<PathBuf>,
    /// What each watch is on: a target itself, or an ancestor of missing targets.
    watched: HashMap<WatchDescriptor, PathBuf>,
}

impl DirWatch {
    /// Watches `targets` (absolute directories), with the directories it could not watch and
    /// why; `None` when inotify is unavailable (the periodic rescan still sees the changes) or
    /// there is nothing to watch.
    pub fn new(targets: Vec<PathBuf>) -> Option<(DirWatch, Vec<(PathBuf, nix::Error)>)> {
        if targets.is_empty() {
            return None;
        }
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
        let mut w = DirWatch {
            ino,
            targets,
            watched: HashMap::new(),
        };
        let failed = w.rewatch();
        Some((w, failed))
    }

    /// The directories watched now (targets, or the ancestors standing in for missing ones).
    #[cfg(test)]
    fn watched(&self) -> Vec<&Path> {
        let mut v: Vec<&Path> = self.watched.values().map(PathBuf::as_path).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Puts each target's watch on the target when it exists, else on its nearest existing
    /// ancestor; drops watches no target needs any more. Returns the directories it could not
    /// watch at all, with the error.
    pub fn rewatch(&mut self) -> Vec<(PathBuf, nix::Error)> {
        let mut failed = Vec::new();
        let mut wanted: Vec<PathBuf> = Vec::new();
        for t in &self.targets {
            let mut at = t.as_path();
            loop {
                if at.is_dir() {
                    match self.ino.add_watch(at, CHANGES | AddWatchFlags::IN_ONLYDIR) {
                        Ok(wd) => {
                            self.watched.insert(wd, at.to_path_buf());
                            wanted.push(at.to_path_buf());
                        }
                        Err(e) => failed.push((t.clone(), e)),
                    }
                    break;
                }
                match at.parent() {
                    Some(p) => at = p,
                    None => break,
                }
            }
        }
        let stale: Vec<WatchDescriptor> = self
            .watched
            .iter()
            .filter(|(_, p)| !wanted.contains(p))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in stale {
            // Gone already when its directory was removed (the kernel ended it).
            let _ = self.ino.rm_watch(wd);
            self.watched.remove(&wd);
        }
        failed
    }

    /// Reads the pending events; true when one concerns a target: a change inside it, its
    /// removal, or the appearance of a directory on the way to a missing one. Watches are
    /// moved (`rewatch`) whenever a directory on the way appeared or went.
    pub fn changed(&mut self) -> bool {
        let mut relevant = false;
        let mut moved = false;
        while let Ok(events) = self.ino.read_events() {
            if events.is_empty() {
                break;
            }
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    // Events lost: anything may have changed.
                    relevant = true;
                    moved = true;
                    continue;
                }
                let Some(dir) = self.watched.get(&ev.wd).cloned() else {
                    continue;
                };
                if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                    // The directory went (or the watch was replaced): watch further up.
                    self.watched.remove(&ev.wd);
                    relevant |= self.targets.iter().any(|t| t.starts_with(&dir));
                    moved = true;
                    continue;
                }
                if self.targets.contains(&dir) {
                    relevant = true;
                } else if let Some(name) = &ev.name {
                    // An ancestor's entry: only the one leading to a target matters.
                    if self
                        .targets
                        .iter()
                        .any(|t| next_component(&dir, t) == Some(name.as_os_str()))
                    {
                        relevant = true;
                        moved = true;
                    }
                }
            }
        }
        if moved {
            self.rewatch();
        }
        relevant
    }
}

impl AsFd for DirWatch {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ino.as_fd()
    }
}

/// The entry of `dir` on the way to `target` (`/run`, `/run/mysqld/x` -> `mysqld`).
fn next_component<'a>(dir: &Path, target: &'a Path) -> Option<&'a OsStr> {
    match target.strip_prefix(dir).ok()?.components().next()? {
        Component::Normal(c) => Some(c),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settle(w: &mut DirWatch) -> bool {
        // inotify events are queued synchronously with the change; one read gets them.
        w.changed()
    }

    #[test]
    fn a_directory_removed_and_made_again_is_watched_again() {
        let base = tempfile::Builder::new()
            .prefix("dbcage-test-dirwatch")
            .tempdir()
            .unwrap();
        let run = base.path().join("mysqld");
        std::fs::create_dir(&run).unwrap();
        let mut w = DirWatch::new(vec![run.clone()]).unwrap().0;
        assert_eq!(w.watched(), vec![run.as_path()]);
        assert!(!settle(&mut w), "nothing changed yet");

        std::fs::write(run.join("mysqld.pid"), "100\n").unwrap();
        assert!(settle(&mut w), "a pid file written in the directory");

        // The unit stops: its runtime directory goes with the pid file.
        std::fs::remove_dir_all(&run).unwrap();
        assert!(settle(&mut w), "the directory's removal is a change");
        assert_eq!(w.watched(), vec![base.path()], "watched through its parent");

        // Something else in the parent is no change of ours.
        std::fs::write(base.path().join("other"), "").unwrap();
        assert!(!settle(&mut w));

        // The unit starts again: the directory, then the pid file in it.
        std::fs::create_dir(&run).unwrap();
        assert!(settle(&mut w), "the directory came back");
        assert_eq!(
            w.watched(),
            vec![run.as_path()],
            "the watch moved back down"
        );
        std::fs::write(run.join("mysqld.pid"), "200\n").unwrap();
        assert!(settle(&mut w), "the new pid file is seen");
    }

    #[test]
    fn a_missing_directory_is_watched_from_its_nearest_ancestor() {
        let base = tempfile::Builder::new()
            .prefix("dbcage-test-dirwatch")
            .tempdir()
            .unwrap();
        let deep = base.path().join("a/b");
        let mut w = DirWatch::new(vec![deep.clone()]).unwrap().0;
        assert_eq!(w.watched(), vec![base.path()]);
        std::fs::create_dir(base.path().join("a")).unwrap();
        assert!(settle(&mut w));
        assert_eq!(w.watched(), vec![base.path().join("a").as_path()]);
        std::fs::create_dir(&deep).unwrap();
        assert!(settle(&mut w));
        assert_eq!(w.watched(), vec![deep.as_path()]);
    }

    #[test]
    fn next_component_leads_to_the_target() {
        assert_eq!(
            next_component(Path::new("/run"), Path::new("/run/mysqld/x")),
            Some(OsStr::new("mysqld"))
        );
        assert_eq!(next_component(Path::new("/dev"), Path::new("/run/x")), None);
    }
}
