//! Per-tenant IO latency histograms from the kernel (eBPF).
//!
//! `bpf/iolat.bpf.c` records, for every bio, the time from submission to completion, split
//! into the wait before the block layer queued it (blk-throttle holds throttled bios there)
//! and the service after it, as log2 histograms keyed by the bio's own cgroup (its blkcg: the
//! group the block layer charges and throttles, not the task that ran), disk and operation.
//! This module owns the data model (pure: merging per tenant, quantiles, Prometheus buckets);
//! `loader` loads the program (libbpf-rs, CO-RE) and reads its maps, `render` draws the text
//! views, `command` is `dbcage iolat`, `metrics` the Prometheus families. `top` and the
//! daemon's metrics use it through `loader::IoLatency` and `command::owners`.
//! Nothing here writes to cgroups; without BTF or CAP_BPF the loader says why and callers go on.

pub mod command;
pub mod loader;
pub mod metrics;
pub mod render;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;

/// Log2 slots: slot k holds [2^k, 2^(k+1)) microseconds; slot 0 also holds < 1 us and the
/// last slot everything from 2^23 us (8.4 s) up. Mirrors `SLOTS` in iolat.bpf.c.
pub const SLOTS: usize = 24;
/// Each slot is cut into `SUB` equal parts (`SUB` in iolat.bpf.c), so that percentiles are
/// known to within 1/16 of their value.
pub const SUB: usize = 8;
pub const FINE: usize = SLOTS * SUB;

/// The operation of a bio, as iolat.bpf.c classifies it (`OP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Read,
    Write,
    /// A cache flush: fsync's empty write with REQ_PREFLUSH, or REQ_OP_FLUSH.
    Flush,
    /// Discard and secure erase.
    Discard,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Read, Op::Write, Op::Flush, Op::Discard];
    pub fn from_raw(v: u32) -> Option<Op> {
        Op::ALL.get(v as usize).copied()
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Discard => "discard",
        }
    }
}

impl std::str::FromStr for Op {
    type Err = String;
    fn from_str(s: &str) -> Result<Op, String> {
        Op::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| format!("`{s}` is not an operation; use read, write, flush or discard"))
    }
}

/// One log2 latency histogram.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hist {
    /// Counts per log2 slot (the sum of its `fine` parts).
    pub slots: [u64; SLOTS],
    /// Counts per eighth of a slot: `fine[slot * SUB + part]`.
    #[serde(skip)]
    pub fine: [u64; FINE],
    /// Total time of the requests in each slot, in nanoseconds.
    pub slot_ns: [u64; SLOTS],
    pub count: u64,
    pub sum_ns: u64,
}

/// Lower bound of a slot in microseconds (slot 0 starts at 0).
pub fn slot_low_us(slot: usize) -> u64 {
    if slot == 0 {
        0
    } else {
        1 << slot
    }
}

/// Upper bound of a slot in microseconds; `None` for the last (open) slot.
pub fn slot_high_us(slot: usize) -> Option<u64> {
    (slot + 1 < SLOTS).then(|| 1 << (slot + 1))
}

impl Default for Hist {
    fn default() -> Hist {
        Hist {
            slots: [0; SLOTS],
            fine: [0; FINE],
            slot_ns: [0; SLOTS],
            count: 0,
            sum_ns: 0,
        }
    }
}

/// Bounds in microseconds of one fine bucket (slot 0 starts at 0; the last one is open, and
/// reported as twice its start).
fn fine_bounds_us(i: usize) -> (f64, f64) {
    let (slot, part) = (i / SUB, i % SUB);
    if slot == 0 {
        // [0, 2) us: integer microseconds 0 and 1 land in parts 0 and 4.
        let low = part as f64 * 2.0 / SUB as f64;
        return (low, low + 2.0 / SUB as f64);
    }
    let base = (1u64 << slot) as f64;
    let width = base / SUB as f64;
    (base + part as f64 * width, base + (part + 1) as f64 * width)
}

impl Hist {
    /// From the fine counts alone (tests; the loader reads the per-slot time too).
    pub fn from_fine(fine: [u64; FINE]) -> Hist {
        let mut h = Hist {
            fine,
            ..Hist::default()
        };
        for (i, n) in fine.iter().enumerate() {
            h.slots[i / SUB] += n;
            h.count += n;
        }
        h
    }

    pub fn add(&mut self, other: &Hist) {
        for i in 0..FINE {
            self.fine[i] += other.fine[i];
        }
        for i in 0..SLOTS {
            self.slots[i] += other.slots[i];
            self.slot_ns[i] += other.slot_ns[i];
        }
        self.count += other.count;
        self.sum_ns += other.sum_ns;
    }

    /// The counts since `earlier` (a histogram read before from the same map entry).
    pub fn since(&self, earlier: &Hist) -> Hist {
        let mut d = Hist::default();
        for i in 0..FINE {
            d.fine[i] = self.fine[i].saturating_sub(earlier.fine[i]);
        }
        for i in 0..SLOTS {
            d.slots[i] = self.slots[i].saturating_sub(earlier.slots[i]);
            d.slot_ns[i] = self.slot_ns[i].saturating_sub(earlier.slot_ns[i]);
        }
        d.count = self.count.saturating_sub(earlier.count);
        d.sum_ns = self.sum_ns.saturating_sub(earlier.sum_ns);
        d
    }

    /// The q-quantile (0..=1) in seconds, interpolated linearly inside its bucket (an eighth
    /// of a log2 slot); `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total: u64 = self.fine.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * total as f64).max(1.0);
        let mut seen = 0.0;
        for (i, &n) in self.fine.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let n = n as f64;
            if seen + n >= rank {
                let (low, high) = fine_bounds_us(i);
                let frac = (rank - seen) / n;
                return Some((low + (high - low) * frac) / 1e6);
            }
            seen += n;
        }
        None
    }

    /// Mean in seconds.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns as f64 / self.count as f64 / 1e9)
    }
}

/// What the program keeps per (cgroup, disk, op): total time and its two parts.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Stages {
    /// Submission to completion: what the issuer waited.
    pub total: Hist,
    /// Submission until the block layer queued the bio: the throttle's wait (blk-throttle
    /// holds a bio over its group's limit here), near zero for a bio that was not held.
    pub throttled: Hist,
    /// Queued to completion: the IO scheduler, the driver and the device.
    pub service: Hist,
}

impl Stages {
    pub fn add(&mut self, o: &Stages) {
        self.total.add(&o.total);
        self.throttled.add(&o.throttled);
        self.service.add(&o.service);
    }
    pub fn since(&self, e: &Stages) -> Stages {
        Stages {
            total: self.total.since(&e.total),
            throttled: self.throttled.since(&e.throttled),
            service: self.service.since(&e.service),
        }
    }
}

/// A block device number as the kernel's `dev_t` (`major:minor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Dev {
    pub major: u32,
    pub minor: u32,
}

impl Dev {
    /// From the kernel-internal encoding iolat.bpf.c uses (major << 20 | minor).
    pub fn from_kernel(v: u32) -> Dev {
        Dev {
            major: v >> 20,
            minor: v & ((1 << 20) - 1),
        }
    }
}

impl std::fmt::Display for Dev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// The cgroup's id: the inode number of its directory (v2, or the blkio hierarchy on v1).
    pub cgroup_id: u64,
    pub dev: Dev,
    pub op: Op,
}

/// Everything the program has counted since it was loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub entries: BTreeMap<Key, Stages>,
    /// Completions not recorded because every histogram slot was taken.
    pub dropped: u64,
    /// Completions not recorded because other CPUs took the slots they tried for a new key
    /// (rare: the key's next completion tries again).
    pub raced: u64,
    /// Completions of bios queued before the program was loaded (not counted).
    pub unmatched: u64,
}

/// How many (cgroup, disk, operation) combinations the program keeps histograms for: mirrors
/// `MAX_SLOTS` in iolat.bpf.c.
pub const HISTOGRAM_KEYS: usize = 1024;

impl Snapshot {
    /// What the program saw but did not record, one line per reason, for the user.
    pub fn uncounted_notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.dropped > 0 {
            notes.push(format!(
                "requests not counted: {} (every one of the {HISTOGRAM_KEYS} histograms is taken: \
                 one per cgroup, disk and operation seen since the program was loaded; restart \
                 the recording or the daemon to start afresh)",
                self.dropped
            ));
        }
        if self.raced > 0 {
            notes.push(format!(
                "requests not counted: {} (CPUs completing the first requests of a new cgroup, \
                 disk and operation at once raced for its histogram; the next ones are counted)",
                self.raced
            ));
        }
        notes
    }

    /// Requests completed and recorded, over every cgroup, disk and operation.
    pub fn completed(&self) -> u64 {
        self.entries.values().map(|s| s.total.count).sum()
    }

    /// The counts since `earlier`.
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        Snapshot {
            entries: self
                .entries
                .iter()
                .map(|(k, v)| {
                    let d = earlier
                        .entries
                        .get(k)
                        .map_or_else(|| v.clone(), |e| v.since(e));
                    (*k, d)
                })
                .collect(),
            dropped: self.dropped.saturating_sub(earlier.dropped),
            raced: self.raced.saturating_sub(earlier.raced),
            unmatched: self.unmatched.saturating_sub(earlier.unmatched),
        }
    }

    /// Folds cgroups into tenants (cgroups no tenant owns are left out) and disks into names.
    pub fn by_tenant(&self, owners: &CgroupOwners) -> BTreeMap<TenantKey, Stages> {
        let mut out: BTreeMap<TenantKey, Stages> = BTreeMap::new();
        for (k, v) in &self.entries {
            if let Some(tenant) = owners.tenant_of(k.cgroup_id) {
                out.entry(TenantKey {
                    tenant: tenant.to_string(),
                    dev: k.dev,
                    op: k.op,
                })
                .or_default()
                .add(v);
            }
        }
        out
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenantKey {
    pub tenant: String,
    pub dev: Dev,
    pub op: Op,
}

/// Which tenant owns which cgroup id: the inode numbers of every directory under each tenant's
/// group in the hierarchy that holds the io (v2) or blkio (v1) controller. The kernel's cgroup
/// id is the kernfs node id, which is the directory's inode number.
#[derive(Debug, Clone, Default)]
pub struct CgroupOwners {
    owner: BTreeMap<u64, String>,
    /// Cgroup ids known to be no tenant's: ids the program had seen before a walk that did not
    /// find them under a tenant (`note_foreign`).
    foreign: BTreeSet<u64>,
}

impl CgroupOwners {
    /// Walks each tenant's directory (`<io hierarchy>/<root>/<tenant>`, its leaves and any
    /// groups below) and notes the inode numbers. A tenant without a directory owns nothing.
    pub fn read<'a>(tenant_dirs: impl IntoIterator<Item = (&'a str, &'a Path)>) -> CgroupOwners {
        use std::os::unix::fs::MetadataExt;
        let mut owner = BTreeMap::new();
        for (tenant, dir) in tenant_dirs {
            let mut stack = vec![dir.to_path_buf()];
            while let Some(d) = stack.pop() {
                let Ok(meta) = std::fs::metadata(&d) else {
                    continue;
                };
                owner.insert(meta.ino(), tenant.to_string());
                if let Ok(entries) = std::fs::read_dir(&d) {
                    for e in entries.flatten() {
                        if e.file_type().is_ok_and(|t| t.is_dir()) {
                            stack.push(e.path());
                        }
                    }
                }
            }
        }
        CgroupOwners {
            owner,
            foreign: BTreeSet::new(),
        }
    }

    pub fn from_pairs(pairs: impl IntoIterator<Item = (u64, String)>) -> CgroupOwners {
        CgroupOwners {
            owner: pairs.into_iter().collect(),
            foreign: BTreeSet::new(),
        }
    }

    /// Notes the cgroups of `before` (a reading taken before this walk) that no tenant owns:
    /// they existed when the tenants' directories were walked, and a cgroup id is never reused
    /// nor moved to another parent, so they stay no tenant's.
    fn note_foreign(&mut self, before: &Snapshot) {
        let owner = &self.owner;
        (self.foreign).extend(
            (before.entries.keys())
                .map(|k| k.cgroup_id)
                .filter(|id| !owner.contains_key(id)),
        );
    }

    /// Whether this walk tells the owner of every cgroup in `snap` (a tenant or none): if not, a
    /// group was made since (a new leaf, a restarted unit) and the walk must be done again.
    fn knows_all(&self, snap: &Snapshot) -> bool {
        (snap.entries.keys())
            .all(|k| self.owner.contains_key(&k.cgroup_id) || self.foreign.contains(&k.cgroup_id))
    }

    pub fn tenant_of(&self, cgroup_id: u64) -> Option<&str> {
        self.owner.get(&cgroup_id).map(String::as_str)
    }
}

/// The owners of the cgroups a reader of the program sees (the metrics, `top`), walked again only
/// when a reading holds a cgroup the last walk does not know: at 1,000 tenants the walk was a
/// quarter of a scrape's system calls, and walking only once would miss every group made later
/// (a restarted unit's cgroup under systemd).
#[derive(Debug, Default)]
pub struct KeptOwners(Option<CgroupOwners>);

impl KeptOwners {
    /// The owners for `snap` (read before this call), from the kept walk or from `walk`.
    pub fn of(&mut self, snap: &Snapshot, walk: impl FnOnce() -> CgroupOwners) -> &CgroupOwners {
        let kept = (self.0.take().filter(|o| o.knows_all(snap))).unwrap_or_else(|| {
            let mut walked = walk();
            walked.note_foreign(snap);
            walked
        });
        self.0.insert(kept)
    }

    /// Drops the kept walk (the tenants changed: their groups' latency may be no longer theirs).
    pub fn forget(&mut self) {
        self.0 = None;
    }
}

/// The Prometheus buckets of `dbcage_io_latency_seconds`: every second log2 slot boundary,
/// 4 us .. 4.19 s (11 bounds) plus +Inf: 12 `_bucket` series, 14 with `_sum` and `_count`, per
/// (tenant, device, op). The finer view stays in `dbcage iolat`.
pub const PROM_BOUNDS_US: [u64; 11] = [
    4,
    16,
    64,
    256,
    1 << 10,
    1 << 12,
    1 << 14,
    1 << 16,
    1 << 18,
    1 << 20,
    1 << 22,
];

/// Per-bucket (not cumulative) counts at each of `PROM_BOUNDS_US` in seconds, then the rest
/// at `f64::MAX` (+Inf), as `prometheus_client`'s histogram encoder takes them. A bound is a
/// slot boundary, so a bucket holds whole slots: requests below the bound (Prometheus' `le`
/// differs only for a request of exactly the bound).
pub fn prom_buckets(h: &Hist) -> Vec<(f64, u64)> {
    let mut out = Vec::with_capacity(PROM_BOUNDS_US.len() + 1);
    let mut slot = 0;
    for &bound in &PROM_BOUNDS_US {
        let mut n = 0;
        while slot < SLOTS && slot_high_us(slot).is_some_and(|hi| hi <= bound) {
            n += h.slots[slot];
            slot += 1;
        }
        out.push((bound as f64 / 1e6, n));
    }
    out.push((f64::MAX, h.slots[slot..].iter().sum()));
    out
}
