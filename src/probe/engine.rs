//! The measuring engine: one thread per unit of parallelism, each issuing blocking `pread` or
//! `pwrite` calls on a shared O_DIRECT descriptor from its own aligned buffer, timing every call.
//!
//! Also the checks that run before anything is opened for writing: what the target is, its size
//! and logical block size, whether its file system does real direct IO, whether a device asked
//! to be written is in use.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::report::Buckets;
use super::{Invalid, Rw};
use crate::kernel::DevNum;
use crate::units::HumanBytes;

/// O_DIRECT on x86_64, aarch64 and most other Linux architectures (asm-generic: 0o40000;
/// arm and aarch64 use 0o200000). Taken from nix so that it is right per target.
const O_DIRECT: i32 = nix::fcntl::OFlag::O_DIRECT.bits();

/// Highest latency the histograms track: 100 s, in nanoseconds.
const MAX_TRACKED_NS: u64 = 100_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    #[serde(rename = "block device")]
    BlockDevice,
    File,
}

/// A checked target: what it is and how much of it the probe uses.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub path: PathBuf,
    pub kind: Kind,
    /// Bytes the probe reads or writes within (from offset 0).
    pub size: u64,
    /// The device's logical block size: every offset and length is a multiple of it.
    pub logical_block_size: u64,
    /// The file does not exist yet: `create` writes it at `size`.
    #[serde(skip)]
    pub missing: bool,
    /// Why the figures may not be the disk's (a loop device that reads its backing file
    /// through the page cache); printed before the results and kept in the JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_warning: Option<String>,
}

/// A loop device without direct IO to its backing file (`/sys/block/loopN/loop/dio` = 0)
/// serves reads from the backing file's page cache: O_DIRECT on the loop device bypasses only
/// the loop device's own cache, and the probe would measure memory (13,883 MiB/s for 1 MiB reads
/// from a loop device on a disk that gives a few hundred). `dev` is the device probed, or the one
/// a probed file lives on; a partition of a loop device counts as its loop device.
pub fn loop_without_direct_io(sys: &Path, dev: DevNum) -> Option<String> {
    let base = sys.join(format!("dev/block/{dev}"));
    let (loop_dir, name) = [base.clone(), base.join("..")].into_iter().find_map(|b| {
        let l = b.join("loop");
        l.join("dio").exists().then(|| {
            let name = std::fs::canonicalize(&b)
                .ok()
                .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
                .unwrap_or_else(|| dev.to_string());
            (l, name)
        })
    })?;
    if std::fs::read_to_string(loop_dir.join("dio")).ok()?.trim() != "0" {
        return None;
    }
    let backing = std::fs::read_to_string(loop_dir.join("backing_file"))
        .map(|b| b.trim().to_string())
        .unwrap_or_else(|_| "its backing file".into());
    Some(format!(
        "{name} reads {backing} through the page cache (/sys/block/{name}/loop/dio is 0): what is cached is served from memory, so these figures can be far above the disk's; `losetup --direct-io=on /dev/{name}` (or create it with `losetup --direct-io=on`) to measure the disk"
    ))
}

/// tmpfs and ramfs accept O_DIRECT opens on recent kernels (6.6+) but serve them from the page
/// cache: a probe there would measure memory, not a disk.
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

fn fs_without_direct_io(path: &Path) -> Option<&'static str> {
    let st = nix::sys::statfs::statfs(path).ok()?;
    #[allow(clippy::unnecessary_cast)]
    match st.filesystem_type().0 as i64 {
        TMPFS_MAGIC => Some("tmpfs"),
        RAMFS_MAGIC => Some("ramfs"),
        _ => None,
    }
}

/// /sys/dev/block/MAJ:MIN/queue/logical_block_size (a partition's is its disk's).
pub fn logical_block_size(sys: &Path, dev: DevNum) -> Option<u64> {
    let base = sys.join(format!("dev/block/{dev}"));
    [
        base.join("queue/logical_block_size"),
        base.join("../queue/logical_block_size"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse().ok())
}

/// The kernel name of a device (`loop3`, `sda1`).
pub fn device_name(sys: &Path, dev: DevNum) -> Option<String> {
    std::fs::canonicalize(sys.join(format!("dev/block/{dev}")))
        .ok()?
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
}

/// The whole disk and its partitions, as device numbers: what must not be mounted when the disk
/// is written.
fn disk_and_partitions(sys: &Path, dev: DevNum) -> Vec<(DevNum, String)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::canonicalize(sys.join(format!("dev/block/{dev}"))) else {
        return out;
    };
    let name = dir
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    out.push((dev, name));
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.join("partition").exists() {
                if let Some(d) = std::fs::read_to_string(p.join("dev"))
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                {
                    out.push((d, e.file_name().to_string_lossy().into_owned()));
                }
            }
        }
    }
    out
}

/// Why a device must not be written: a mount, a holder (dm, md), or swap on it or a partition.
pub fn device_in_use(sys: &Path, mountinfo: &str, swaps: &str, dev: DevNum) -> Option<String> {
    let table = crate::inventory::MountTable::parse(mountinfo);
    for (d, name) in disk_and_partitions(sys, dev) {
        if let Some(m) = table.mounts.iter().find(|m| m.devnum == d) {
            return Some(format!(
                "{name} ({d}) is mounted on {} ({})",
                m.mount_point.display(),
                m.fstype
            ));
        }
        let holders = sys.join(format!("class/block/{name}/holders"));
        if let Some(h) = std::fs::read_dir(holders)
            .ok()
            .and_then(|mut r| r.next())
            .and_then(|e| e.ok())
        {
            return Some(format!(
                "{name} ({d}) is held by {} (device mapper or md)",
                h.file_name().to_string_lossy()
            ));
        }
        if swaps
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().next() == Some(&format!("/dev/{name}")))
        {
            return Some(format!("{name} ({d}) is in use as swap"));
        }
    }
    None
}

/// Checks the target and the options against it. Nothing is created or written here.
pub fn check_target(
    path: &Path,
    size: Option<u64>,
    rw: Rw,
    block_sizes: &[u64],
    destructive: bool,
) -> Result<Target, Invalid> {
    let sys = Path::new("/sys");
    let shown = path.display();
    let (kind, size, dev, missing) = match std::fs::metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let Some(size) = size else {
                return Err(Invalid(format!(
                    "{shown} does not exist; name a block device or an existing file, or give --size (e.g. --size 1GiB) to create a file of that size there"
                )));
            };
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            let pm = std::fs::metadata(&parent).map_err(|e| {
                Invalid(format!(
                    "cannot create {shown}: its directory {} is not usable ({e})",
                    parent.display()
                ))
            })?;
            if !pm.is_dir() {
                return Err(Invalid(format!(
                    "cannot create {shown}: {} is not a directory",
                    parent.display()
                )));
            }
            if let Some(fs) = fs_without_direct_io(&parent) {
                return Err(no_direct_io(path, fs));
            }
            (Kind::File, size, DevNum::from_dev_t(pm.dev()), true)
        }
        Err(e) => return Err(Invalid(format!("cannot read {shown}: {e}"))),
        Ok(m) if m.file_type().is_block_device() => {
            let dev = DevNum::from_dev_t(m.rdev());
            let bytes = std::fs::read_to_string(sys.join(format!("dev/block/{dev}/size")))
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                .map(|sectors| sectors * 512)
                .or_else(|| {
                    use std::io::Seek;
                    File::open(path)
                        .and_then(|mut f| f.seek(io::SeekFrom::End(0)))
                        .ok()
                })
                .unwrap_or(0);
            let size = match size {
                Some(s) if s > bytes => {
                    return Err(Invalid(format!(
                        "--size {} is larger than the device {shown} ({})",
                        HumanBytes(s),
                        HumanBytes(bytes)
                    )))
                }
                Some(s) => s,
                None => bytes,
            };
            (Kind::BlockDevice, size, dev, false)
        }
        Ok(m) if m.file_type().is_file() => {
            if let Some(fs) = fs_without_direct_io(path) {
                return Err(no_direct_io(path, fs));
            }
            let size = match size {
                Some(s) if s > m.len() => {
                    return Err(Invalid(format!(
                        "{shown} exists and holds {}, less than --size {}; give a --size up to its length, or remove the file to have it created at that size",
                        HumanBytes(m.len()),
                        HumanBytes(s)
                    )))
                }
                Some(s) => s,
                None => m.len(),
            };
            (Kind::File, size, DevNum::from_dev_t(m.dev()), false)
        }
        Ok(m) => {
            let what = if m.is_dir() {
                "a directory"
            } else if m.file_type().is_char_device() {
                "a character device"
            } else if m.file_type().is_fifo() {
                "a FIFO"
            } else if m.file_type().is_socket() {
                "a socket"
            } else {
                "not a regular file"
            };
            return Err(Invalid(format!(
                "{shown} is {what}; probe a block device (/dev/sdX, /dev/loopN) or a regular file"
            )));
        }
    };
    if rw.writes() && kind == Kind::BlockDevice {
        if !destructive {
            return Err(Invalid(format!(
                "--rw {rw} would overwrite the block device {shown}; probe a file on it instead, or add --destructive if its contents may be destroyed"
            )));
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        if let Some(why) = device_in_use(sys, &mountinfo, &swaps, dev) {
            return Err(Invalid(format!(
                "refusing to write {shown} with --destructive: {why}; unmount it (and every partition of it) first"
            )));
        }
    }
    let lbs = logical_block_size(sys, dev).unwrap_or(512);
    for &bs in block_sizes {
        if bs == 0 || bs % lbs != 0 {
            return Err(Invalid(format!(
                "--bs {}: {bs} bytes is not a multiple of the logical block size of {shown} ({lbs} bytes); use multiples of {lbs} such as 4k, 64k, 1m",
                HumanBytes(bs)
            )));
        }
        if bs > size {
            return Err(Invalid(format!(
                "--bs {} is larger than the {} of {shown} the probe may use; give a larger --size or a smaller --bs",
                HumanBytes(bs),
                HumanBytes(size)
            )));
        }
    }
    if !missing {
        // A read-only open with O_DIRECT writes nothing and fails (EINVAL) where the file system
        // has no direct IO at all.
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(O_DIRECT)
            .open(path)
            .map_err(|e| {
                if e.raw_os_error() == Some(nix::libc::EINVAL) {
                    no_direct_io(path, "this file system")
                } else {
                    Invalid(format!("cannot open {shown} with O_DIRECT: {e}"))
                }
            })?;
    }
    Ok(Target {
        path: path.to_path_buf(),
        kind,
        size,
        logical_block_size: lbs,
        missing,
        cache_warning: loop_without_direct_io(sys, dev),
    })
}

fn no_direct_io(path: &Path, fs: &str) -> Invalid {
    Invalid(format!(
        "{} is on {fs}, which has no real direct IO (O_DIRECT would measure the page cache, not a disk); probe a block device or a file on a disk-backed file system",
        path.display()
    ))
}

/// A zeroed buffer aligned for O_DIRECT.
pub struct AlignedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// The buffer is plain memory owned by one worker at a time.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len.max(1), align.max(1))
            .expect("buffer size and alignment");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, layout }
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for layout.size() bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.layout.size()) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Buffer alignment: the logical block size, and never less than a page.
pub fn alignment(target: &Target) -> usize {
    target.logical_block_size.max(4096) as usize
}

/// Fills a buffer with bytes that neither compress nor look like zeros to thin storage.
fn scramble(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

/// Creates a missing file at `target.size`, written through once with O_DIRECT (so that reads
/// of it reach the device: a fallocated file would read as holes). The file is removed if this
/// fails part-way.
pub fn create(target: &Target) -> anyhow::Result<()> {
    use anyhow::Context;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(O_DIRECT)
        .open(&target.path)
        .with_context(|| format!("creating {}", target.path.display()))?;
    let result = (|| {
        let chunk = (1u64 << 20).min(target.size);
        let chunk = chunk - chunk % target.logical_block_size;
        let mut buf = AlignedBuf::new(chunk as usize, alignment(target));
        scramble(buf.as_mut_slice(), 0x5eed);
        let mut off = 0;
        while off < target.size {
            let n = chunk.min(target.size - off);
            let n = n.div_ceil(target.logical_block_size) * target.logical_block_size;
            file.write_all_at(&buf.as_slice()[..n as usize], off)
                .with_context(|| format!("writing {} at offset {off}", target.path.display()))?;
            off += n;
        }
        file.sync_all()
            .with_context(|| format!("syncing {}", target.path.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&target.path);
    }
    result
}

/// One step's settings.
#[derive(Debug, Clone, Copy)]
pub struct StepSpec {
    pub bs: u64,
    pub jobs: usize,
    pub rw: Rw,
    pub duration: Duration,
    /// Warm-up before the measured time: IOs run but are not counted (fio's `ramp_time`).
    pub ramp: Duration,
}

/// What one step measured, all workers merged.
pub struct Measured {
    pub hist: Histogram<u64>,
    pub buckets: Buckets,
    pub ios: u64,
    pub bytes: u64,
    pub sum_ns: u128,
    pub seconds: f64,
    /// Stopped early (Ctrl-C).
    pub interrupted: bool,
}

struct WorkerOut {
    hist: Histogram<u64>,
    buckets: Buckets,
    ios: u64,
    sum_ns: u128,
    ended: Instant,
    error: Option<(u64, io::Error)>,
}

/// Runs one step: `jobs` threads for `duration` (or until `stop` is set), each doing blocking
/// IOs of `bs` bytes. `progress` is called every 100 ms with the completed IOs so far.
pub fn run_step(
    file: &Arc<File>,
    target: &Target,
    spec: StepSpec,
    stop: &AtomicBool,
    mut progress: impl FnMut(Duration, u64),
) -> anyhow::Result<Measured> {
    let jobs = spec.jobs.max(1);
    let bs = spec.bs;
    let blocks = (target.size / bs).max(1);
    let align = alignment(target);
    let barrier = Arc::new(Barrier::new(jobs + 1));
    let quit = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for w in 0..jobs {
        let file = Arc::clone(file);
        let barrier = Arc::clone(&barrier);
        let quit = Arc::clone(&quit);
        let done = Arc::clone(&done);
        let rw = spec.rw;
        let duration = spec.duration;
        let ramp = spec.ramp;
        // Sequential workers each get their own slice of the target, as fio's
        // offset_increment does, so they do not read the same blocks.
        let region = (blocks / jobs as u64).max(1);
        let first = (w as u64 * region) % blocks;
        handles.push(std::thread::spawn(move || {
            let mut buf = AlignedBuf::new(bs as usize, align);
            if rw.writes() {
                scramble(buf.as_mut_slice(), w as u64 + 1);
            }
            let mut hist =
                Histogram::<u64>::new_with_bounds(1, MAX_TRACKED_NS, 3).expect("histogram bounds");
            let mut buckets = Buckets::default();
            let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ ((w as u64 + 1) << 32) ^ bs;
            let mut next = 0u64;
            let mut ios = 0u64;
            let mut sum_ns = 0u128;
            let mut error = None;
            barrier.wait();
            let measured_from = Instant::now() + ramp;
            let deadline = measured_from + duration;
            loop {
                let block = if rw.random() {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng % blocks
                } else {
                    let b = first + next;
                    next = (next + 1) % region;
                    b % blocks
                };
                let off = block * bs;
                let t0 = Instant::now();
                let r = if rw.writes() {
                    file.write_at(buf.as_slice(), off)
                } else {
                    file.read_at(buf.as_mut_slice(), off)
                };
                let t1 = Instant::now();
                match r {
                    Ok(n) if n as u64 == bs => {}
                    Ok(n) => {
                        error = Some((
                            off,
                            io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                format!("short transfer: {n} of {bs} bytes"),
                            ),
                        ));
                        break;
                    }
                    Err(e) => {
                        error = Some((off, e));
                        break;
                    }
                }
                if t0 >= measured_from {
                    let ns = (t1 - t0).as_nanos() as u64;
                    hist.saturating_record(ns.clamp(1, MAX_TRACKED_NS));
                    buckets.record(ns);
                    sum_ns += ns as u128;
                    ios += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                if t1 >= deadline || quit.load(Ordering::Relaxed) {
                    break;
                }
            }
            WorkerOut {
                hist,
                buckets,
                ios,
                sum_ns,
                ended: Instant::now(),
                error,
            }
        }));
    }
    barrier.wait();
    let start = Instant::now() + spec.ramp;
    let mut interrupted = false;
    while !handles.iter().all(|h| h.is_finished()) {
        if stop.load(Ordering::Relaxed) && !interrupted {
            interrupted = true;
            quit.store(true, Ordering::Relaxed);
        }
        progress(
            Instant::now().saturating_duration_since(start),
            done.load(Ordering::Relaxed),
        );
        std::thread::sleep(
            Duration::from_millis(20).min(spec.duration / 4 + Duration::from_millis(1)),
        );
    }
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, MAX_TRACKED_NS, 3).expect("histogram bounds");
    let mut buckets = Buckets::default();
    let (mut ios, mut sum_ns) = (0u64, 0u128);
    let mut end = start;
    let mut first_error = None;
    for h in handles {
        let out = h
            .join()
            .map_err(|_| anyhow::anyhow!("a probe worker thread panicked"))?;
        hist.add(&out.hist).expect("same histogram bounds");
        buckets.merge(&out.buckets);
        ios += out.ios;
        sum_ns += out.sum_ns;
        end = end.max(out.ended);
        if first_error.is_none() {
            first_error = out.error;
        }
    }
    if let Some((off, e)) = first_error {
        return Err(anyhow::Error::new(e).context(format!(
            "{} {} of {} at offset {off} failed",
            spec.rw,
            HumanBytes(bs),
            target.path.display()
        )));
    }
    let measured = end.saturating_duration_since(start);
    progress(measured, ios);
    Ok(Measured {
        hist,
        buckets,
        ios,
        bytes: ios * bs,
        sum_ns,
        seconds: measured.as_secs_f64(),
        interrupted,
    })
}

/// Opens the target for the probe: read-only for reads; for writes read-write, and exclusively
/// for a block device (the kernel refuses O_EXCL on a device that is mounted or held).
pub fn open(target: &Target, rw: Rw) -> anyhow::Result<File> {
    use anyhow::Context;
    let mut flags = O_DIRECT;
    if rw.writes() && target.kind == Kind::BlockDevice {
        flags |= nix::libc::O_EXCL;
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(rw.writes())
        .custom_flags(flags)
        .open(&target.path)
        .with_context(|| format!("opening {} with O_DIRECT", target.path.display()))
}
