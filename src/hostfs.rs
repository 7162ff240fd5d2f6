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
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    loop {
        if buf.capacity() - buf.len() < 512 {
            buf.reserve(4096);
        }
        let len = buf.len();
        let spare = buf.capacity() - len;
        buf.resize(len + spare, 0);
        let n = loop {
            match rustix::io::read(&fd, &mut buf[len..]) {
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
}
