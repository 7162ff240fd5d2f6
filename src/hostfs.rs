//! The host's file systems as seen from a root directory. Only `main` uses `/`; unit tests point
//! a `HostFs` at a fixture tree copied from a real host, so every reader of /proc, /sys and
//! mountinfo can be tested without the machine it was written for.

use std::io;
use std::path::{Path, PathBuf};

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

    pub fn read_to_string(&self, host_path: impl AsRef<Path>) -> io::Result<String> {
        read_text(self.path(host_path))
    }

    pub fn is_real_root(&self) -> bool {
        self.root == Path::new("/")
    }
}

/// `std::fs::read_to_string` for a small kernel file (cgroupfs, /proc): open, read, close.
/// std adds a `statx` for a size hint these files cannot give and a last read to see the end;
/// a seq_file hands over all it has when the buffer is large enough, so a read that does not
/// fill the buffer is the end. `status` and each metrics scrape read some twenty of these per
/// tenant, and a smaps_rollup per process.
pub fn read_text(path: impl AsRef<Path>) -> std::io::Result<String> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(
        path.as_ref(),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        if buf.capacity() - buf.len() < 512 {
            buf.reserve(4096);
        }
        let len = buf.len();
        let spare = buf.capacity() - len;
        buf.resize(len + spare, 0);
        let n = rustix::io::read(&fd, &mut buf[len..])?;
        buf.truncate(len + n);
        if n < spare {
            break;
        }
    }
    String::from_utf8(buf).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
