//! The host's file systems as seen from a root directory. Only `main` uses `/`; unit tests point
//! a `HostFs` at a fixture tree copied from a real host, so every reader of /proc, /sys and
//! mountinfo can be tested without the machine it was written for.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nix::libc;

#[derive(Debug, Clone)]
pub struct HostFs {
    root: PathBuf,
}

impl Default for HostFs {
    fn default() -> Self {
        HostFs::with_root("/")
    }
}

impl HostFs {
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        HostFs { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Maps an absolute host path (`/sys/dev/block/8:0`) into this root.
    pub fn path(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let p = host_path.as_ref();
        match p.strip_prefix("/") {
            Ok(rel) => self.root.join(rel),
            Err(_) => self.root.join(p),
        }
    }

    /// Removes this root's prefix again, for messages that should name the host path.
    pub fn host_path(&self, path: &Path) -> PathBuf {
        match path.strip_prefix(&self.root) {
            Ok(rel) => Path::new("/").join(rel),
            Err(_) => path.to_path_buf(),
        }
    }

    pub fn proc(&self) -> PathBuf {
        self.path("/proc")
    }

    /// `/proc/PID/NAME` in this root, built in one buffer (read for every placed process in
    /// every plan).
    pub fn proc_file(&self, pid: u32, name: &str) -> PathBuf {
        use std::fmt::Write as _;
        let mut rel = String::with_capacity(24 + name.len());
        let _ = write!(rel, "proc/{pid}/{name}");
        self.root.join(rel)
    }

    pub fn read_to_string(&self, host_path: impl AsRef<Path>) -> io::Result<String> {
        read_text(self.path(host_path))
    }

    pub fn is_real_root(&self) -> bool {
        self.root == Path::new("/")
    }
}

/// `std::fs::read_to_string` without its `statx` (a size hint that kernel files cannot give:
/// cgroupfs says 4096, /proc 0): open, read until a read returns nothing, close. `status` and
/// each metrics scrape read some twenty of these per tenant. It reads to the end rather than
/// stopping at a short read: a seq_file of many records (mountinfo, numa_maps, a cgroup.procs of
/// many pids) returns less than asked when its next record does not fit the kernel's buffer.
pub fn read_text(path: impl AsRef<Path>) -> std::io::Result<String> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(
        path.as_ref(),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    read_fd_text(&fd)
}

fn read_fd_text(fd: &OwnedFd) -> std::io::Result<String> {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        if buf.capacity() - buf.len() < 512 {
            buf.reserve(4096);
        }
        let len = buf.len();
        let spare = buf.capacity() - len;
        buf.resize(len + spare, 0);
        let n = loop {
            match rustix::io::read(fd, &mut buf[len..]) {
                Ok(n) => break n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        buf.truncate(len + n);
        if n == 0 {
            break;
        }
    }
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// A directory opened once whose files are read relative to it (`openat`): a group's dozen
/// files read by `status` and each metrics scrape cost one walk from `/` instead of one each
/// (the kernel's path walk was a third of a scrape at 1,000 tenants). A directory that could
/// not be opened reads every file as that error, as the full paths would. It is opened at its
/// first read (a reader may ask a group for nothing: v1 keeps no pressure per group), or taken
/// from `KeptDirs` when the reader keeps its groups open from one read to the next.
#[derive(Debug)]
pub struct OpenDir<'k> {
    path: PathBuf,
    fd: RefCell<Option<Result<Arc<OwnedFd>, rustix::io::Errno>>>,
    kept: Option<&'k KeptDirs>,
    /// The descriptor came from `kept` and no read has succeeded through it yet.
    unproven: Cell<bool>,
    /// The files `kept`'s `KnownFiles` knew at this directory's first read (the reader's
    /// moment: its later reads ask no lock again).
    known: std::cell::OnceCell<Option<KnownGroup>>,
}

impl<'k> OpenDir<'k> {
    pub fn open(path: impl Into<PathBuf>) -> OpenDir<'k> {
        OpenDir {
            path: path.into(),
            fd: RefCell::new(None),
            kept: None,
            unproven: Cell::new(false),
            known: std::cell::OnceCell::new(),
        }
    }

    /// A directory whose descriptor is taken from `kept`, and left there for the next reader.
    pub fn kept(path: impl Into<PathBuf>, kept: &'k KeptDirs) -> OpenDir<'k> {
        OpenDir {
            kept: Some(kept),
            ..OpenDir::open(path)
        }
    }

    fn fd(&self) -> Result<Arc<OwnedFd>, rustix::io::Errno> {
        if let Some(fd) = &*self.fd.borrow() {
            return fd.clone();
        }
        let fd = match self.kept.and_then(|k| k.get(&self.path)) {
            Some(fd) => {
                self.unproven.set(true);
                Ok(fd)
            }
            // A group the daemon's watch knows is not there: no open to find that out.
            None if self.kept.is_some_and(|k| k.absent(&self.path)) => {
                Err(rustix::io::Errno::NOENT)
            }
            None => self.open_by_path(),
        };
        *self.fd.borrow_mut() = Some(fd.clone());
        fd
    }

    fn open_by_path(&self) -> Result<Arc<OwnedFd>, rustix::io::Errno> {
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(&self.path, flags, Mode::empty()).map(Arc::new);
        if let Some(kept) = self.kept {
            match &fd {
                Ok(fd) => kept.keep(&self.path, fd.clone()),
                Err(_) => kept.forget(&self.path),
            }
        }
        fd
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The text of `name`, a path relative to this directory (or as `KnownFiles` knows it).
    pub fn read(&self, name: &str) -> io::Result<String> {
        use rustix::fs::{Mode, OFlags};
        if let Some(kept) = self.kept {
            let known = self.known.get_or_init(|| kept.known_group(&self.path));
            if let Some((_, text)) = known.iter().flatten().find(|(n, _)| n == name) {
                return Ok(text.to_string());
            }
        }
        let read = |dir: &OwnedFd| -> io::Result<String> {
            let flags = OFlags::RDONLY | OFlags::CLOEXEC;
            read_fd_text(&rustix::fs::openat(dir, name, flags, Mode::empty())?)
        };
        let result = read(&*self.fd()?);
        if !self.unproven.replace(false) {
            return result;
        }
        match result {
            // A kept descriptor of a group removed since (and perhaps made again): its files
            // are gone. Opened again by its path, once.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENODEV)) => {
                let fd = self.open_by_path();
                *self.fd.borrow_mut() = Some(fd.clone());
                read(&*fd?)
            }
            r => r,
        }
    }

    /// A file holding one number; `None` when missing or not a number.
    pub fn read_u64(&self, name: &str) -> Option<u64> {
        self.read(name).ok()?.trim().parse().ok()
    }

    /// The names of the directories in this one (none when it could not be opened).
    pub fn subdirs(&self) -> Vec<String> {
        use rustix::fs::FileType;
        let Ok(dir) = self.fd() else {
            return Vec::new();
        };
        let dir = &*dir;
        let Ok(entries) = rustix::fs::Dir::read_from(dir) else {
            return Vec::new();
        };
        let is_dir = |name: &str, t: FileType| match t {
            FileType::Directory => true,
            // A file system that gives no type: asked of the entry itself.
            FileType::Unknown => {
                rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
            }
            _ => false,
        };
        entries
            .flatten()
            .filter_map(|e| Some((e.file_name().to_str().ok()?.to_string(), e.file_type())))
            .filter(|(n, t)| n != "." && n != ".." && is_dir(n, *t))
            .map(|(n, _)| n)
            .collect()
    }
}

/// Groups kept open from one read to the next: the metrics endpoint opens the same handful of
/// groups a tenant at every scrape (4,000 at 1,000 tenants on v1, about 6 us each: a fifth
/// of a scrape). A group the last `sweep` period did not use is closed (the group of a tenant
/// that left is not held), and a kept one whose files are gone is opened again by its path
/// (`OpenDir::read`). At most a quarter of the open-file limit is kept: past it, groups are
/// opened for each read as before.
#[derive(Debug)]
pub struct KeptDirs {
    inner: Mutex<Kept>,
    /// Files whose text is known without reading them (`KnownFiles`).
    known: std::sync::OnceLock<Arc<dyn KnownFiles>>,
}

/// Control files whose text a reader can have without reading them: the daemon's group watch
/// holds the limits it read at its last walk, and an inotify event would have said if one had
/// been written since (`cgroup::watch::WatchedFiles`).
pub trait KnownFiles: Send + Sync + std::fmt::Debug {
    /// Before a round of `known_group`: takes in what changed since the last one.
    fn refresh(&self);
    /// The files of the group `dir` whose text is known (names and texts), if any is.
    fn known_group(&self, dir: &Path) -> Option<KnownGroup>;
    /// Whether the group `dir` is known not to be there (so not worth an open).
    fn absent(&self, dir: &Path) -> bool;
}

/// One control file of a group: its name (the drivers' names are static) and its text.
pub type FileText = (std::borrow::Cow<'static, str>, Box<str>);

/// A group's control files as a `KnownFiles` knows them.
pub type KnownGroup = Vec<FileText>;

#[derive(Debug)]
struct Kept {
    fds: HashMap<PathBuf, (Arc<OwnedFd>, bool)>,
    cap: usize,
}

impl KeptDirs {
    pub fn new() -> KeptDirs {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        KeptDirs::with_cap(limit.map_or(4096, |n| (n / 4) as usize))
    }

    pub fn with_cap(cap: usize) -> KeptDirs {
        KeptDirs {
            inner: Mutex::new(Kept {
                fds: HashMap::new(),
                cap,
            }),
            known: std::sync::OnceLock::new(),
        }
    }

    /// Files read through these groups are first asked of `known` (set once).
    pub fn know(&self, known: Arc<dyn KnownFiles>) {
        let _ = self.known.set(known);
    }

    /// Before a round of reads: the known files take in what changed.
    pub fn refresh(&self) {
        if let Some(k) = self.known.get() {
            k.refresh();
        }
    }

    fn known_group(&self, dir: &Path) -> Option<KnownGroup> {
        self.known.get()?.known_group(dir)
    }

    fn absent(&self, dir: &Path) -> bool {
        self.known.get().is_some_and(|k| k.absent(dir))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, path: &Path) -> Option<Arc<OwnedFd>> {
        let mut kept = self.lock();
        let (fd, used) = kept.fds.get_mut(path)?;
        *used = true;
        Some(fd.clone())
    }

    fn keep(&self, path: &Path, fd: Arc<OwnedFd>) {
        let mut kept = self.lock();
        if kept.fds.len() < kept.cap || kept.fds.contains_key(path) {
            kept.fds.insert(path.to_path_buf(), (fd, true));
        }
    }

    fn forget(&self, path: &Path) {
        self.lock().fds.remove(path);
    }

    /// Closes the groups not used since the last sweep.
    pub fn sweep(&self) {
        self.lock()
            .fds
            .retain(|_, (_, used)| std::mem::replace(used, false));
    }

    pub fn len(&self) -> usize {
        self.lock().fds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for KeptDirs {
    fn default() -> Self {
        KeptDirs::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_text_reads_to_the_end() {
        // A regular file of several buffers, and a seq_file of many records (crypto: one
        // record per algorithm, some 20 KiB), which returns short reads before its end.
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        let text: String = (0..3000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&big, &text).unwrap();
        assert_eq!(read_text(&big).unwrap(), text);
        // (11 KiB on the development host: a read stopping at the first short read got 4 KiB.)
        let crypto = read_text("/proc/crypto").unwrap();
        assert_eq!(crypto, std::fs::read_to_string("/proc/crypto").unwrap());
        assert!(read_text(dir.path().join("missing")).is_err());
    }

    #[test]
    fn open_dir_reads_relative_to_one_open() {
        let tmp = tempfile::tempdir().unwrap();
        let group = tmp.path().join("dbcage-test-group");
        // Opened at its first read, not when made.
        let dir = OpenDir::open(&group);
        std::fs::create_dir_all(group.join("limited")).unwrap();
        std::fs::write(group.join("memory.failcnt"), "42\n").unwrap();
        std::fs::write(group.join("limited/memory.oom_control"), "oom_kill 1\n").unwrap();
        std::fs::write(group.join("cgroup.procs"), "").unwrap();
        assert_eq!(dir.read_u64("memory.failcnt"), Some(42));
        assert_eq!(
            dir.read("limited/memory.oom_control").unwrap(),
            "oom_kill 1\n"
        );
        assert_eq!(dir.read("cgroup.procs").unwrap(), "");
        assert_eq!(dir.read_u64("cgroup.procs"), None);
        assert_eq!(
            dir.read("missing").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(dir.subdirs(), vec!["limited".to_string()]);
        assert_eq!(dir.path(), group);
        // A group that is not there reads as missing, every file of it.
        let gone = OpenDir::open(tmp.path().join("gone"));
        assert_eq!(
            gone.read("memory.failcnt").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert!(gone.subdirs().is_empty());
    }

    #[test]
    fn kept_dirs_are_bounded_and_swept() {
        let tmp = tempfile::tempdir().unwrap();
        for g in ["a", "b"] {
            std::fs::create_dir(tmp.path().join(g)).unwrap();
            std::fs::write(tmp.path().join(g).join("cpu.stat"), g).unwrap();
        }
        let kept = KeptDirs::with_cap(1);
        for g in ["a", "b"] {
            let dir = OpenDir::kept(tmp.path().join(g), &kept);
            assert_eq!(dir.read("cpu.stat").unwrap(), g);
        }
        assert_eq!(kept.len(), 1, "no more than the cap");
        // Read through the kept one and through one opened for the read alone.
        for g in ["a", "b"] {
            assert_eq!(
                OpenDir::kept(tmp.path().join(g), &kept)
                    .read("cpu.stat")
                    .unwrap(),
                g
            );
        }
        kept.sweep();
        assert_eq!(kept.len(), 1, "used since the last sweep");
        kept.sweep();
        assert!(kept.is_empty());
    }
}
