//! Storage paths → the block devices the kernel throttles.
//!
//! A path resolves to the device that holds it (a device node's own number, or the file system's
//! device from stat and mountinfo). Then: a partition becomes its whole disk (blk-throttle and
//! io.max refuse partitions); a loop device stays itself; dm and md devices stay themselves, or
//! become the whole disks they are built on (`slaves/`) with `storage_level = "members"`.
//! Several paths on one disk count once. Paths on file systems without a block device (tmpfs,
//! NFS, overlay, btrfs and zfs pools, whose st_dev is an anonymous number) are an error that
//! names the path and the file system type.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::mounts::MountTable;
use crate::hostfs::HostFs;
use crate::kernel::DevNum;
use crate::policy::StorageLevel;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockDevice {
    pub devnum: DevNum,
    /// Kernel name: `sda`, `loop3`, `dm-0`, `md127`.
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("storage path `{path}` does not exist: {reason}")]
    Missing { path: String, reason: String },
    #[error("storage glob `{pattern}` matches nothing")]
    GlobEmpty { pattern: String },
    #[error("storage glob `{pattern}` is not a valid pattern: {reason}")]
    GlobInvalid { pattern: String, reason: String },
    #[error(
        "storage path `{path}` is on a `{fstype}` file system ({fs_source}), which has no block device; IO limits apply to disks, so list paths on local block devices"
    )]
    NoBlockDevice {
        path: String,
        fstype: String,
        fs_source: String,
    },
    #[error("storage `{entry}`: {reason}")]
    Asm {
        entry: String,
        reason: super::asm::AsmError,
    },
    #[error("storage path `{path}` is on device {devnum}, which the kernel does not list in /sys/dev/block")]
    UnknownDevice { path: String, devnum: DevNum },
}

/// Expands the tenant's storage list into the whole devices to limit. Returns the devices
/// (sorted by number, each once) and, per storage entry, an error if it could not be resolved.
pub fn resolve_storage(
    fs: &HostFs,
    mounts: &MountTable,
    paths: &[String],
    level: StorageLevel,
) -> (Vec<BlockDevice>, Vec<(usize, DeviceError)>) {
    let mut found = BTreeMap::new();
    let mut errors = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        match resolve_entry(fs, mounts, p, level) {
            Ok(devs) => {
                for d in devs {
                    found.insert(d.devnum, d);
                }
            }
            Err(e) => errors.push((i, e)),
        }
    }
    (found.into_values().collect(), errors)
}

fn is_glob(p: &str) -> bool {
    p.contains(['*', '?', '['])
}

/// Resolves one storage entry (a path or a glob) into its whole devices.
pub fn resolve_entry(
    fs: &HostFs,
    mounts: &MountTable,
    path: &str,
    level: StorageLevel,
) -> Result<Vec<BlockDevice>, DeviceError> {
    if let Some(spec) = path.strip_prefix("asm:") {
        let asm_err = |reason| DeviceError::Asm {
            entry: path.into(),
            reason,
        };
        let spec =
            super::asm::AsmSpec::parse(spec).map_err(|e| asm_err(super::asm::AsmError::Spec(e)))?;
        let disks = super::asm::list_disks(fs, &spec).map_err(asm_err)?;
        let mut out = Vec::new();
        for d in disks {
            out.extend(resolve_path(fs, mounts, &d, level)?);
        }
        return Ok(out);
    }
    if !is_glob(path) {
        return resolve_path(fs, mounts, path, level);
    }
    let pattern = fs.path(path);
    let entries = glob::glob(&pattern.to_string_lossy()).map_err(|e| DeviceError::GlobInvalid {
        pattern: path.into(),
        reason: e.to_string(),
    })?;
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let host = fs.host_path(&entry);
        out.extend(resolve_path(fs, mounts, &host.to_string_lossy(), level)?);
    }
    if out.is_empty() {
        return Err(DeviceError::GlobEmpty {
            pattern: path.into(),
        });
    }
    Ok(out)
}

fn resolve_path(
    fs: &HostFs,
    mounts: &MountTable,
    path: &str,
    level: StorageLevel,
) -> Result<Vec<BlockDevice>, DeviceError> {
    let meta = std::fs::metadata(fs.path(path)).map_err(|e| DeviceError::Missing {
        path: path.into(),
        reason: e.to_string(),
    })?;
    let devnum = if meta.file_type().is_block_device() {
        DevNum::from_dev_t(meta.rdev())
    } else {
        let dev = DevNum::from_dev_t(meta.dev());
        let on_block_dev = fs.path(format!("/sys/dev/block/{dev}")).exists();
        if dev.major == 0 || !on_block_dev {
            let m = mounts
                .by_devnum(dev)
                .or_else(|| mounts.containing(Path::new(path)));
            return Err(DeviceError::NoBlockDevice {
                path: path.into(),
                fstype: m
                    .map(|m| m.fstype.clone())
                    .unwrap_or_else(|| "unknown".into()),
                fs_source: m
                    .map(|m| m.source.clone())
                    .unwrap_or_else(|| format!("device {dev}")),
            });
        }
        dev
    };
    devices_for(fs, devnum, level).ok_or_else(|| DeviceError::UnknownDevice {
        path: path.into(),
        devnum,
    })
}

/// The whole devices to limit for a device number (see the module comment), from sysfs.
pub fn devices_for(fs: &HostFs, devnum: DevNum, level: StorageLevel) -> Option<Vec<BlockDevice>> {
    let sys = sys_dir(fs, devnum)?;
    Some(whole_devices(&sys, level))
}

/// The device's directory under /sys/devices, found through /sys/dev/block/MAJ:MIN.
fn sys_dir(fs: &HostFs, dev: DevNum) -> Option<PathBuf> {
    std::fs::canonicalize(fs.path(format!("/sys/dev/block/{dev}"))).ok()
}

fn read_devnum(dir: &Path) -> Option<DevNum> {
    std::fs::read_to_string(dir.join("dev"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn name_of(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A partition's directory sits inside its disk's directory and has a `partition` file.
fn whole_disk(dir: &Path) -> PathBuf {
    if dir.join("partition").exists() {
        if let Some(parent) = dir.parent() {
            return parent.to_path_buf();
        }
    }
    dir.to_path_buf()
}

fn whole_devices(dir: &Path, level: StorageLevel) -> Vec<BlockDevice> {
    let disk = whole_disk(dir);
    if level == StorageLevel::Members {
        let mut members = Vec::new();
        if let Ok(entries) = std::fs::read_dir(disk.join("slaves")) {
            for e in entries.flatten() {
                if let Ok(slave) = std::fs::canonicalize(e.path()) {
                    members.extend(whole_devices(&slave, level));
                }
            }
        }
        if !members.is_empty() {
            members.sort_by_key(|d| d.devnum);
            members.dedup();
            return members;
        }
    }
    match read_devnum(&disk) {
        Some(devnum) => vec![BlockDevice {
            devnum,
            name: name_of(&disk),
        }],
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests;
