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
        std::fs::read_to_string(self.path(host_path))
    }

    pub fn is_real_root(&self) -> bool {
        self.root == Path::new("/")
    }
}
