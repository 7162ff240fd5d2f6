//! The control file values of a reading, kept by group: each group's path once, shared with the
//! group set and the watch (`GroupPath`), and its files by name.
//!
//! At 1,000 tenants on v1 a reading holds some 9,000 groups and 11,000 files, and the daemon
//! keeps it between rescans (`watch`). Keyed by each file's full path it took a path per file
//! and three copies of each group's path (the files' keys, the group set, the watch's
//! descriptors): 6 of the daemon's 15 MiB of heap.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A group directory's path, shared by whatever holds it (cloning does not copy the path).
pub type GroupPath = Arc<Path>;

/// One file of a group: its name and the value read (as `KnownFiles` hands them out).
pub type FileValue = crate::hostfs::FileText;

/// Control file values by group directory, then file name.
#[derive(Debug, Clone, Default)]
pub struct GroupFiles {
    /// By the group's path as bytes (see `ByBytes`): a plan looks up every file of every group.
    by_dir: HashMap<ByBytes, Vec<FileValue>>,
}

/// The group directory and the file name of a control file's path.
fn split(path: &Path) -> Option<(&Path, &str)> {
    Some((path.parent()?, path.file_name()?.to_str()?))
}

impl GroupFiles {
    /// The value read from the file at `path`.
    pub fn get(&self, path: &Path) -> Option<&str> {
        let (dir, name) = split(path)?;
        self.get_in(dir, name)
    }

    /// The value read from the file `name` in the group `dir`.
    fn get_in(&self, dir: &Path, name: &str) -> Option<&str> {
        let files = self.by_dir.get(path_bytes(dir))?;
        files.iter().find(|(n, _)| n == name).map(|(_, v)| &**v)
    }

    /// The files read in the group `dir`.
    pub fn group(&self, dir: &Path) -> Option<&[FileValue]> {
        self.by_dir.get(path_bytes(dir)).map(Vec::as_slice)
    }

    /// Sets the value of the file at `path` (a path without a file name is ignored).
    pub fn insert(&mut self, path: PathBuf, value: String) {
        let Some((dir, name)) = split(&path) else {
            return;
        };
        let value = value.into_boxed_str();
        match self.by_dir.get_mut(path_bytes(dir)) {
            Some(files) => match files.iter_mut().find(|(n, _)| n == name) {
                Some(slot) => slot.1 = value,
                None => files.push((Cow::Owned(name.to_owned()), value)),
            },
            None => {
                let files = vec![(Cow::Owned(name.to_owned()), value)];
                self.by_dir.insert(ByBytes(Arc::from(dir)), files);
            }
        }
    }

    /// Forgets the file at `path`.
    pub fn remove(&mut self, path: &Path) {
        let Some((dir, name)) = split(path) else {
            return;
        };
        if let Some(files) = self.by_dir.get_mut(path_bytes(dir)) {
            files.retain(|(n, _)| n != name);
            if files.is_empty() {
                self.by_dir.remove(path_bytes(dir));
            }
        }
    }

    /// Replaces everything known of `dir`'s files with `files` (a group read again).
    pub fn set_group(&mut self, dir: GroupPath, mut files: Vec<FileValue>) {
        if files.is_empty() {
            self.by_dir.remove(path_bytes(&dir));
        } else {
            files.shrink_to_fit();
            self.by_dir.insert(ByBytes(dir), files);
        }
    }

    /// Forgets every file of `dir` (not of its subgroups).
    pub fn remove_group(&mut self, dir: &Path) {
        self.by_dir.remove(path_bytes(dir));
    }

    /// Keeps the files of the groups `keep` says yes to.
    pub fn retain_groups(&mut self, mut keep: impl FnMut(&Path) -> bool) {
        self.by_dir.retain(|dir, _| keep(&dir.0));
    }

    /// Takes in `other`'s files, over any of the same path.
    pub fn extend(&mut self, other: GroupFiles) {
        for (dir, files) in other.by_dir {
            match self.by_dir.get_mut(&dir) {
                None => {
                    self.by_dir.insert(dir, files);
                }
                Some(mine) => {
                    for (name, value) in files {
                        match mine.iter_mut().find(|(n, _)| *n == name) {
                            Some(slot) => slot.1 = value,
                            None => mine.push((name, value)),
                        }
                    }
                }
            }
        }
    }

    /// Every file's path.
    /// Every file's path and value, in no order.
    pub fn values(&self) -> impl Iterator<Item = (PathBuf, &str)> + '_ {
        (self.by_dir.iter())
            .flat_map(|(dir, files)| files.iter().map(|(n, v)| (dir.0.join(&**n), &**v)))
    }

    pub fn paths(&self) -> impl Iterator<Item = PathBuf> + '_ {
        self.values().map(|(path, _)| path)
    }

    pub fn is_empty(&self) -> bool {
        self.by_dir.is_empty()
    }

    pub fn clear(&mut self) {
        self.by_dir.clear();
    }
}

/// A group path ordered, compared and hashed by its bytes, not component by component as
/// `Path` does (hashing a `Path` parses it too): a lookup is then a few `memcmp`s. A plan looks up each of its 9,000 groups at 1,000 tenants (and the
/// walk each group's freshness); compared by `Path`'s `Ord`, which parses both paths into
/// components, those lookups were some 6% of an idle rescan's CPU.
#[derive(Debug, Clone)]
struct ByBytes(GroupPath);

impl PartialEq for ByBytes {
    fn eq(&self, other: &Self) -> bool {
        path_bytes(&self.0) == path_bytes(&other.0)
    }
}

impl Eq for ByBytes {}

/// As its bytes hash (`Borrow<[u8]>` looks it up by them).
impl std::hash::Hash for ByBytes {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        path_bytes(&self.0).hash(state)
    }
}

fn path_bytes(path: &Path) -> &[u8] {
    use std::os::unix::ffi::OsStrExt as _;
    path.as_os_str().as_bytes()
}

/// Whether `path` is `dir` or under it, compared as bytes (group paths are built by joining
/// normalized parts, as `GroupDirs` keeps them; `Path::starts_with` parses both into components,
/// which a plan did for every placed process in every hierarchy).
pub fn is_within(path: &Path, dir: &Path) -> bool {
    let (p, d) = (path_bytes(path), trimmed(dir));
    p.starts_with(d) && matches!(p.get(d.len()), None | Some(b'/'))
}

/// A directory's bytes without a trailing `/` (the root `/` becomes empty: everything is
/// under it).
fn trimmed(dir: &Path) -> &[u8] {
    let b = path_bytes(dir);
    b.strip_suffix(b"/").unwrap_or(b)
}

impl Ord for ByBytes {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        path_bytes(&self.0).cmp(path_bytes(&other.0))
    }
}

impl PartialOrd for ByBytes {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl std::borrow::Borrow<[u8]> for ByBytes {
    fn borrow(&self) -> &[u8] {
        path_bytes(&self.0)
    }
}

/// A set of group directories (the groups a reading found). Paths are compared as bytes, so
/// they must be spelled one way (as `Path::join` builds them: no `//`, no trailing `/`). In byte
/// order a group's descendants are the paths that begin with its path and a `/`, which sort
/// together (`/a/b-x` sorts between `/a/b` and `/a/b/c`, so they do not simply follow it).
#[derive(Debug, Clone, Default)]
pub struct GroupDirs {
    set: BTreeSet<ByBytes>,
}

impl GroupDirs {
    pub fn contains(&self, dir: &Path) -> bool {
        self.set.contains(path_bytes(dir))
    }

    /// The set's own copy of `dir`'s path (to share it rather than make another).
    pub fn get(&self, dir: &Path) -> Option<&GroupPath> {
        self.set.get(path_bytes(dir)).map(|k| &k.0)
    }

    pub fn insert(&mut self, dir: GroupPath) -> bool {
        self.set.insert(ByBytes(dir))
    }

    pub fn remove(&mut self, dir: &Path) -> bool {
        self.set.remove(path_bytes(dir))
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&GroupPath) -> bool) {
        self.set.retain(|k| keep(&k.0));
    }

    pub fn extend(&mut self, other: GroupDirs) {
        self.set.extend(other.set);
    }

    pub fn iter(&self) -> impl Iterator<Item = &GroupPath> + '_ {
        self.set.iter().map(|k| &k.0)
    }

    /// `dir`'s descendants (not `dir`), in byte order. They sort after `dir`, among the paths
    /// that begin with its bytes (with siblings such as `dir-x` and their subgroups, skipped);
    /// no bound is built, so a walk's thousands of calls allocate nothing.
    pub fn under<'a: 'd, 'd>(&'a self, dir: &'d Path) -> impl Iterator<Item = &'a GroupPath> + 'd {
        let d = trimmed(dir);
        (self.set)
            .range::<[u8], _>((std::ops::Bound::Excluded(d), std::ops::Bound::Unbounded))
            .take_while(move |k| path_bytes(&k.0).starts_with(d))
            .filter(move |k| path_bytes(&k.0).get(d.len()) == Some(&b'/'))
            .map(|k| &k.0)
    }

    /// `dir`'s subgroups (its children only).
    pub fn children<'a: 'd, 'd>(
        &'a self,
        dir: &'d Path,
    ) -> impl Iterator<Item = &'a GroupPath> + 'd {
        let depth = trimmed(dir).len() + 1;
        self.under(dir)
            .filter(move |d| !path_bytes(d)[depth..].contains(&b'/'))
    }

    pub fn len(&self) -> usize {
        self.set.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    pub fn clear(&mut self) {
        self.set.clear();
    }
}

/// Group directories hashed by their bytes (see `ByBytes`), for membership only: a walk's
/// record of the groups it found.
#[derive(Debug, Default)]
pub struct GroupSet {
    set: std::collections::HashSet<ByBytes>,
}

impl GroupSet {
    pub fn insert(&mut self, dir: GroupPath) -> bool {
        self.set.insert(ByBytes(dir))
    }

    pub fn contains(&self, dir: &Path) -> bool {
        self.set.contains(path_bytes(dir))
    }
}

impl FromIterator<GroupPath> for GroupDirs {
    fn from_iter<I: IntoIterator<Item = GroupPath>>(iter: I) -> Self {
        GroupDirs {
            set: iter.into_iter().map(ByBytes).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_is_the_components_prefix_of_normalized_paths() {
        let root = Path::new("/cg/cpu/dbcage");
        for (path, within) in [
            ("/cg/cpu/dbcage", true),
            ("/cg/cpu/dbcage/pg/limited", true),
            ("/cg/cpu/dbcage-other/pg", false),
            ("/cg/cpu", false),
            ("/cg/cpu/user.slice", false),
        ] {
            let path = Path::new(path);
            assert_eq!(is_within(path, root), within, "{}", path.display());
            assert_eq!(path.starts_with(root), within, "{}", path.display());
        }
        assert!(is_within(
            Path::new("/cg/cpu/dbcage/pg"),
            Path::new("/cg/cpu/dbcage/")
        ));
        assert!(is_within(Path::new("/cg/x"), Path::new("/")));
    }

    #[test]
    fn files_are_found_by_path_whichever_way_they_came_in() {
        let mut f = GroupFiles::default();
        let dir: GroupPath = Arc::from(Path::new("/cg/blkio/dbcage/pg"));
        f.set_group(
            dir.clone(),
            vec![
                (Cow::Borrowed("blkio.weight"), "100\n".into()),
                (Cow::Borrowed("tasks"), "".into()),
            ],
        );
        f.insert("/cg/blkio/dbcage/pg/blkio.weight".into(), "200\n".into());
        f.insert("/cg/blkio/dbcage/pg/cgroup.procs".into(), "1\n".into());
        f.insert("/cg/blkio/dbcage/io.cost.qos".into(), "q\n".into());
        assert_eq!(
            f.get(Path::new("/cg/blkio/dbcage/pg/blkio.weight")),
            Some("200\n")
        );
        assert_eq!(f.get(Path::new("/cg/blkio/dbcage/pg/tasks")), Some(""));
        assert_eq!(
            f.get(Path::new("/cg/blkio/dbcage/pg/cgroup.procs")),
            Some("1\n")
        );
        assert_eq!(f.get(Path::new("/cg/blkio/dbcage/pg/other")), None);
        assert_eq!(f.get(Path::new("/cg/blkio/dbcage/other/tasks")), None);
        assert_eq!(f.paths().count(), 4);

        f.remove(Path::new("/cg/blkio/dbcage/pg/tasks"));
        assert_eq!(f.get(Path::new("/cg/blkio/dbcage/pg/tasks")), None);
        let mut paths: Vec<PathBuf> = f.paths().collect();
        paths.sort();
        assert_eq!(
            paths,
            [
                "/cg/blkio/dbcage/io.cost.qos",
                "/cg/blkio/dbcage/pg/blkio.weight",
                "/cg/blkio/dbcage/pg/cgroup.procs"
            ]
            .map(PathBuf::from)
        );

        // Read again: what the group holds now, nothing of before.
        f.set_group(dir.clone(), vec![(Cow::Borrowed("tasks"), "7\n".into())]);
        assert_eq!(f.get(Path::new("/cg/blkio/dbcage/pg/blkio.weight")), None);
        assert_eq!(f.get(Path::new("/cg/blkio/dbcage/pg/tasks")), Some("7\n"));
        f.set_group(dir, Vec::new());
        assert_eq!(f.paths().count(), 1);

        let mut other = GroupFiles::default();
        other.insert("/cg/blkio/dbcage/io.cost.qos".into(), "r\n".into());
        other.insert("/cg/blkio/io.stat".into(), "s\n".into());
        f.extend(other);
        assert_eq!(
            f.get(Path::new("/cg/blkio/dbcage/io.cost.qos")),
            Some("r\n")
        );
        assert_eq!(f.get(Path::new("/cg/blkio/io.stat")), Some("s\n"));
        f.retain_groups(|d| d != Path::new("/cg/blkio"));
        assert_eq!(f.paths().count(), 1);
        f.remove_group(Path::new("/cg/blkio/dbcage"));
        assert!(f.is_empty());
    }

    #[test]
    fn group_dirs_find_a_groups_children_and_descendants_in_byte_order() {
        let dirs: GroupDirs = [
            "/cg/cpu/dbcage",
            "/cg/cpu/dbcage/pg",
            "/cg/cpu/dbcage/pg-x",
            "/cg/cpu/dbcage/pg-x/limited",
            "/cg/cpu/dbcage/pg/limited",
            "/cg/cpu/dbcage/pg/limited/deep",
            "/cg/cpu/dbcage/pg.y",
            "/cg/cpu/dbcage/ph",
            "/cg/cpu/other",
        ]
        .into_iter()
        .map(|p| GroupPath::from(Path::new(p)))
        .collect();
        let list = |it: &mut dyn Iterator<Item = &GroupPath>| -> Vec<String> {
            it.map(|p| p.display().to_string()).collect()
        };
        assert_eq!(
            list(&mut dirs.under(Path::new("/cg/cpu/dbcage/pg"))),
            [
                "/cg/cpu/dbcage/pg/limited",
                "/cg/cpu/dbcage/pg/limited/deep"
            ]
        );
        assert_eq!(
            list(&mut dirs.children(Path::new("/cg/cpu/dbcage"))),
            [
                "/cg/cpu/dbcage/pg",
                "/cg/cpu/dbcage/pg-x",
                "/cg/cpu/dbcage/pg.y",
                "/cg/cpu/dbcage/ph"
            ]
        );
        assert_eq!(dirs.under(Path::new("/cg/cpu/dbcage")).count(), 7);
        assert!(dirs.contains(Path::new("/cg/cpu/dbcage/pg-x")));
        assert!(!dirs.contains(Path::new("/cg/cpu/dbcage/p")));
        let mut fewer = dirs.clone();
        fewer.retain(|d| !d.starts_with("/cg/cpu/dbcage/pg"));
        assert_eq!(fewer.len(), 6);
        assert!(fewer.remove(Path::new("/cg/cpu/other")));
        assert_eq!(fewer.under(Path::new("/cg/cpu")).count(), 5);
    }
}
