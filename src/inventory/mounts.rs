//! /proc/self/mountinfo, parsed once and shared by device discovery (which file system holds a
//! path) and cgroup detection (where each controller's hierarchy is mounted).

use std::path::{Path, PathBuf};

use crate::hostfs::HostFs;
use crate::kernel::DevNum;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub devnum: DevNum,
    /// The part of the file system that is mounted (`/` for the whole of it).
    pub root: String,
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
    pub super_options: Vec<String>,
}

#[derive(Debug, Clone, Default)]
pub struct MountTable {
    pub mounts: Vec<Mount>,
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            if let Ok(v) = u8::from_str_radix(field.get(i + 1..i + 4).unwrap_or("x"), 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl MountTable {
    pub fn parse(text: &str) -> MountTable {
        let mut mounts = Vec::new();
        for line in text.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            if l.len() < 5 || r.len() < 2 {
                continue;
            }
            let Ok(devnum) = l[2].parse::<DevNum>() else {
                continue;
            };
            mounts.push(Mount {
                devnum,
                root: unescape(l[3]),
                mount_point: PathBuf::from(unescape(l[4])),
                fstype: r[0].to_string(),
                source: unescape(r[1]),
                super_options: r
                    .get(2)
                    .map(|o| o.split(',').map(str::to_string).collect())
                    .unwrap_or_default(),
            });
        }
        MountTable { mounts }
    }

    pub fn read(fs: &HostFs) -> std::io::Result<MountTable> {
        Ok(Self::parse(&fs.read_to_string("/proc/self/mountinfo")?))
    }

    /// The mount whose mount point is the longest prefix of `path` (the last one wins when
    /// several are stacked on one point, as the kernel shows the top one last).
    pub fn containing(&self, path: &Path) -> Option<&Mount> {
        self.mounts
            .iter()
            .filter(|m| path.starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.as_os_str().len())
    }

    pub fn by_devnum(&self, dev: DevNum) -> Option<&Mount> {
        self.mounts.iter().rev().find(|m| m.devnum == dev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n\
50 27 7:3 / /mnt/with\\040space rw shared:5 - ext4 /dev/loop3 rw\n";

    #[test]
    fn parses_fields_and_escapes() {
        let t = MountTable::parse(SAMPLE);
        assert_eq!(t.mounts.len(), 5);
        assert_eq!(t.mounts[2].super_options, vec!["rw", "cpu"]);
        assert_eq!(t.mounts[4].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(t.mounts[4].devnum, DevNum::new(7, 3));
        assert_eq!(
            t.containing(Path::new("/mnt/with space/data"))
                .unwrap()
                .source,
            "/dev/loop3"
        );
        assert_eq!(
            t.containing(Path::new("/sys/fs/cgroup/x")).unwrap().fstype,
            "tmpfs"
        );
        assert_eq!(t.by_devnum(DevNum::new(0, 29)).unwrap().fstype, "cgroup");
    }
}
