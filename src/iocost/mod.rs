//! `dbcage iocost`: turns on the kernel's iocost controller for a tenant's disks with a cost
//! model measured on the disk itself, so that `[tenant.io] weight` has effect
//! (Documentation/admin-guide/cgroup-v2.rst, "io.cost.model" and "io.cost.qos";
//! block/blk-iocost.c).
//!
//! It owns the two root files of the unified hierarchy, one line per disk:
//! - `io.cost.model`: `MAJ:MIN ctrl=user model=linear rbps= rseqiops= rrandiops= wbps= ...`,
//!   what the disk delivers (bytes/s for large sequential IO, 4 KiB IOPS sequential and
//!   random). iocost charges each IO its cost under this model and shares the "virtual time"
//!   among cgroups by io.weight.
//! - `io.cost.qos`: `MAJ:MIN enable=1 ctrl=user rpct= rlat= wpct= wlat= min= max=`: iocost
//!   takes the disk as saturated when the rpct-th percentile of read completion latency passes
//!   rlat (µs), and then slows every group down (vrate, bounded by min and max percent of the
//!   model; dbcage proposes 50 and 115, or 100 when a target sits at the probe's deepest
//!   queue, see `max_vrate`). The latency targets are the probe's p95 with twice the
//!   saturation's depth in flight, so that a tenant alone queueing that deep is not taken for
//!   saturation (see `PROPOSED_PCT`); `propose` says why for each number.
//!
//! The kernel overlays a written line on the disk's current values, so dbcage writes only the
//! keys it measured (reads always; writes only with `--destructive` on an unused device) and
//! the kernel keeps the rest. Before writing it records the lines it found in
//! `/run/dbcage/iocost/MAJ:MIN.json` (the kernel forgets iocost settings at reboot, so does
//! /run): `--revert` writes them back, and a later run recognises its own values. Values that
//! someone else set (`ctrl=user`, or iocost switched on with the kernel's own model) are not
//! overwritten without `--force`; where it can tell, it names who: systemd's `systemd-iocost`
//! (udev rule 90-iocost.rules applying a hwdb solution, visible as `IOCOST_*` properties in the
//! disk's udev database entry `/run/udev/data/bMAJ:MIN`).
//!
//! It never writes anything without `--apply` or `--revert`, and a model write is undone when
//! the QoS write that follows it fails.

pub mod command;

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cgroup::v2::{device_lines, IO_COST_MODEL, IO_COST_QOS};
use crate::hostfs::HostFs;
use crate::kernel::DevNum;

/// Where the lines dbcage found before it wrote are kept, one file per disk.
pub const RECORD_DIR: &str = "/run/dbcage/iocost";

/// One disk's `io.cost.model` line, as the kernel prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Model {
    /// `ctrl=user`: someone wrote the parameters (`ctrl=auto`: the kernel's defaults).
    pub user: bool,
    pub rbps: u64,
    pub rseqiops: u64,
    pub rrandiops: u64,
    pub wbps: u64,
    pub wseqiops: u64,
    pub wrandiops: u64,
}

/// One disk's `io.cost.qos` line, as the kernel prints it (percentages in hundredths).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Qos {
    pub enable: bool,
    pub user: bool,
    /// Percentile (in hundredths of a percent) of read latencies compared with `rlat`.
    pub rpct: u32,
    /// Read latency target, µs.
    pub rlat: u64,
    pub wpct: u32,
    pub wlat: u64,
    /// vrate bounds, in hundredths of a percent.
    pub min: u32,
    pub max: u32,
}

/// `95.00` → 9500.
fn hundredths(v: &str) -> Option<u32> {
    let (int, frac) = v.split_once('.').unwrap_or((v, "0"));
    let frac = format!("{frac:0<2}");
    Some(int.parse::<u32>().ok()? * 100 + frac.get(..2)?.parse::<u32>().ok()?)
}

fn show_hundredths(v: u32) -> String {
    format!("{}.{:02}", v / 100, v % 100)
}

impl Model {
    /// The write that gives a disk this model again: its values when someone had set them,
    /// else `ctrl=auto` (the kernel's defaults).
    pub fn restore_line(model: Option<&Model>, dev: DevNum) -> String {
        match model {
            Some(m) if m.user => format!(
                "{dev} ctrl=user model=linear rbps={} rseqiops={} rrandiops={} wbps={} wseqiops={} wrandiops={}",
                m.rbps, m.rseqiops, m.rrandiops, m.wbps, m.wseqiops, m.wrandiops
            ),
            _ => format!("{dev} ctrl=auto"),
        }
    }

    /// The disk's line in `io.cost.model`; `None` when iocost was never configured on it.
    pub fn find(text: &str, dev: DevNum) -> Option<Model> {
        let (_, pairs) = device_lines(text).find(|(d, _)| *d == dev)?;
        let mut m = Model::default();
        for (k, v) in pairs {
            let n = v.parse::<u64>().ok();
            match (k, n) {
                ("ctrl", _) => m.user = v == "user",
                ("rbps", Some(n)) => m.rbps = n,
                ("rseqiops", Some(n)) => m.rseqiops = n,
                ("rrandiops", Some(n)) => m.rrandiops = n,
                ("wbps", Some(n)) => m.wbps = n,
                ("wseqiops", Some(n)) => m.wseqiops = n,
                ("wrandiops", Some(n)) => m.wrandiops = n,
                _ => {}
            }
        }
        Some(m)
    }
}

impl Qos {
    /// The disk's line in `io.cost.qos`; `None` when iocost was never configured on it.
    pub fn find(text: &str, dev: DevNum) -> Option<Qos> {
        let (_, pairs) = device_lines(text).find(|(d, _)| *d == dev)?;
        let mut q = Qos::default();
        for (k, v) in pairs {
            match k {
                "enable" => q.enable = v == "1",
                "ctrl" => q.user = v == "user",
                "rpct" => q.rpct = hundredths(v).unwrap_or(0),
                "rlat" => q.rlat = v.parse().unwrap_or(0),
                "wpct" => q.wpct = hundredths(v).unwrap_or(0),
                "wlat" => q.wlat = v.parse().unwrap_or(0),
                "min" => q.min = hundredths(v).unwrap_or(0),
                "max" => q.max = hundredths(v).unwrap_or(0),
                _ => {}
            }
        }
        Some(q)
    }
}

/// What dbcage measured on a disk: each `None` is left to the kernel's current value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Measured {
    pub rbps: u64,
    pub rseqiops: u64,
    pub rrandiops: u64,
    /// 4 KiB random reads: where their latency was measured.
    pub rlat: QueueLatency,
    pub writes: Option<MeasuredWrites>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct MeasuredWrites {
    pub wbps: u64,
    pub wseqiops: u64,
    pub wrandiops: u64,
    pub wlat: QueueLatency,
}

/// The p95 completion latency (µs) of 4 KiB random IO at three points of the probe.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QueueLatency {
    /// The smallest parallelism that reached 90% of the most IOPS: where the disk saturates.
    pub saturated_jobs: usize,
    pub saturated_p95_us: u64,
    /// The first step at least twice as deep as the saturation (the deepest step when none
    /// is): the queue the latency target allows, see [`QueueLatency::target_us`].
    pub target_jobs: usize,
    pub target_p95_us: u64,
    /// The probe's deepest step (`--jobs-max`): what one tenant alone sees when it keeps that
    /// many IOs in flight on the saturated disk, the wait for a device tag included.
    pub deepest_jobs: usize,
    pub deepest_p95_us: u64,
}

impl QueueLatency {
    /// The latency target: the p95 with twice the saturation's depth in flight (never below
    /// the saturation p95), rounded. Why that depth: [`TARGET_DEPTH_WHY`].
    pub fn target_us(&self) -> u64 {
        round_latency(self.target_p95_us.max(self.saturated_p95_us))
    }
}

/// Why the latency targets sit at twice the saturation depth (printed with the proposal).
const TARGET_DEPTH_WHY: &str = "iocost times a request from its allocation, the wait in the scheduler and for a device tag included, and lowers vrate while more than 10% of IOs miss the target: at this depth the disk already runs flat out, so a tenant alone queueing deeper is held back in iocost (in weight order) with no throughput lost, and iocost brings vrate down to what the disk really does whenever the tenants together queue deeper. In the test VM (null_blk, mq-deadline, 64 requests) at the p95 of the deepest queue (32) vrate sat at max whatever the disk did and a protected reader at weight 900 kept 83-91% of its solo IOPS under a flood; at the saturation p95 one reader alone lost 7%";

/// The lines dbcage proposes for one disk: only the keys it measured, so the kernel keeps the
/// rest (it overlays a write on the disk's current values); `why` says where each number of
/// the QoS line comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Proposal {
    pub model_line: String,
    pub qos_line: String,
    pub why: Vec<String>,
}

/// The QoS percentile dbcage proposes. The latency target is the p95 a tenant alone sees with
/// twice the saturation's depth in flight, so at that depth it misses on about 5% of its IOs:
/// half of the 10% that iocost tolerates at the 90th percentile (it lowers vrate above 10%
/// missed, and raises it again only below 7.5%). Tenants queueing deeper together miss more
/// often, and iocost holds their IOs back by weight.
pub const PROPOSED_PCT: u32 = 9000;

/// The upper vrate bound dbcage proposes, in hundredths of a percent, when every latency target
/// sits below the probe's deepest queue; why: [`MAX_ABOVE_MODEL_WHY`].
pub const MAX_VRATE_ABOVE_MODEL: u32 = 11500;

/// The upper vrate bound when a latency target sits at the probe's deepest queue; why:
/// [`MAX_AT_MODEL_WHY`].
pub const MAX_VRATE_AT_MODEL: u32 = 10000;

/// Why iocost may run above the model (printed after `max=115.00: `).
const MAX_ABOVE_MODEL_WHY: &str = "iocost may issue up to 15% more than the model while the latency targets hold, and no more. The probe's model is a few percent under what a busy database's many tasks get from the same disk (4-13% under 32 tasks of fio in the test VM, under mq-deadline): at max=100 a tenant alone got 87-91% of the disk there, and a protected tenant under a neighbour's flood 83-89% of its solo IOPS; at 115 they got 96-111% and 91-98%, and the latency targets brought vrate back to 98-109% when the two tenants together filled the disk, so the weights still split it (1:8.7 at 100:900, 1:11.4 at 75:925). The kernel's default, 10000.00, lets vrate run far past the model while latencies are met, and the weights never bind (two readers at 100 and 300 split 1:0.96)";

/// Why iocost stays at the model (printed after `max=100.00: `).
const MAX_AT_MODEL_WHY: &str = "iocost never issues more than the model. A latency target here sits at the deepest queue the probe ran, where tenants queueing as deep never miss it, so above the model vrate would stay at its max while they fill the disk and the weights would not bind (measured in the test VM: a target at 32 in flight with max=115 let two readers at 75 and 925 split 1:4.5). A larger --jobs-max measures a deeper queue, and then the target sits below it and max=115.00 is proposed";

/// The upper vrate bound for these measurements, and why. Above the model only when every
/// target sits below the deepest queue the probe ran: tenants that fill the disk deeper than
/// that miss it, and vrate comes down.
fn max_vrate(m: &Measured) -> (u32, &'static str) {
    let below = |l: &QueueLatency| l.target_jobs < l.deepest_jobs;
    if below(&m.rlat) && m.writes.as_ref().is_none_or(|w| below(&w.wlat)) {
        (MAX_VRATE_ABOVE_MODEL, MAX_ABOVE_MODEL_WHY)
    } else {
        (MAX_VRATE_AT_MODEL, MAX_AT_MODEL_WHY)
    }
}

/// The lower vrate bound dbcage proposes, in hundredths of a percent; why: [`MIN_VRATE_WHY`].
pub const MIN_VRATE: u32 = 5000;

/// Why the lower bound (printed after `min=50.00: `).
const MIN_VRATE_WHY: &str = "iocost may slow the disk down to half its model to meet the targets, no further. The weights bind only while min x model stays below what the disk then delivers: in the test VM the disk ran at 40-75% of its probe while the host was busy, and at min=75 a reader at weight 100 took 1:2.2 instead of 1:3 from one at 300 (at min=90, a flooding writer at 100 took 47% from a reader at 900). A tenant alone keeps the whole disk through the latency targets, not the floor (while the disk has a request for each IO it queues: see the note when it does not)";

/// A latency target rounded up to 100 µs (and at least that): the kernel compares whole µs and
/// a measured p95 is not precise below that.
fn round_latency(us: u64) -> u64 {
    us.max(1).div_ceil(100) * 100
}

fn show_ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

/// Why a latency target: `what` is `read` or `write`.
fn latency_why(key: &str, what: &str, l: &QueueLatency) -> String {
    let depth = if l.target_jobs >= 2 * l.saturated_jobs {
        format!(
            "twice the {} at which the disk saturated (p95 {}; {} at the probe's deepest queue, {})",
            l.saturated_jobs,
            show_ms(l.saturated_p95_us),
            show_ms(l.deepest_p95_us),
            l.deepest_jobs
        )
    } else {
        format!(
            "the probe's deepest step, where twice the {} at which the disk saturated (p95 {}) would be deeper: a larger --jobs-max measures it",
            l.saturated_jobs,
            show_ms(l.saturated_p95_us)
        )
    };
    format!(
        "{key}={}: the p95 of 4 KiB random {what}s with {} in flight, {depth}: {TARGET_DEPTH_WHY}",
        l.target_us(),
        l.target_jobs,
    )
}

pub fn propose(dev: DevNum, m: &Measured) -> Proposal {
    let (max, max_why) = max_vrate(m);
    let mut model = format!(
        "{dev} ctrl=user model=linear rbps={} rseqiops={} rrandiops={}",
        m.rbps, m.rseqiops, m.rrandiops
    );
    let mut qos = format!(
        "{dev} enable=1 ctrl=user rpct={} rlat={} min={} max={}",
        show_hundredths(PROPOSED_PCT),
        m.rlat.target_us(),
        show_hundredths(MIN_VRATE),
        show_hundredths(max)
    );
    let mut why = vec![latency_why("rlat", "read", &m.rlat)];
    if let Some(w) = &m.writes {
        model.push_str(&format!(
            " wbps={} wseqiops={} wrandiops={}",
            w.wbps, w.wseqiops, w.wrandiops
        ));
        qos.push_str(&format!(
            " wpct={} wlat={}",
            show_hundredths(PROPOSED_PCT),
            w.wlat.target_us()
        ));
        why.push(latency_why("wlat", "write", &w.wlat));
    }
    why.push(format!(
        "pct={}: iocost lowers vrate while more than 10% of IOs miss their target, and raises it again only below 7.5%",
        show_hundredths(PROPOSED_PCT)
    ));
    why.push(format!(
        "min={}: {MIN_VRATE_WHY}",
        show_hundredths(MIN_VRATE)
    ));
    why.push(format!("max={}: {max_why}", show_hundredths(max)));
    Proposal {
        model_line: model,
        qos_line: qos,
        why,
    }
}

/// What dbcage found on a disk before it wrote, and what it wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub device: DevNum,
    pub name: String,
    pub model_before: Option<Model>,
    pub qos_before: Option<Qos>,
    pub model_written: Model,
    pub qos_written: Qos,
    /// The disk's queue before `--queue` deepened it, and as it left it (absent in records of
    /// an apply without `--queue`, and of dbcage before it had the option).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_before: Option<QueueSetting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_written: Option<QueueSetting>,
}

/// Who set the iocost values a disk has now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// The kernel's defaults, iocost off (or never configured): free to write.
    Nobody,
    /// The values dbcage wrote (its record matches what the kernel shows).
    Dbcage,
    /// systemd-iocost, from the udev hwdb; the solution names and the property lines.
    Udev { properties: Vec<String> },
    /// Someone else; what is not the default.
    Unknown { what: String },
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Nobody => f.write_str("nobody (the kernel's defaults, iocost off)"),
            Owner::Dbcage => f.write_str("dbcage (its record in /run/dbcage/iocost matches)"),
            Owner::Udev { properties } => write!(
                f,
                "systemd-iocost through udev (rule 90-iocost.rules applies the hwdb solution named by TargetSolution= in /etc/udev/iocost.conf; this disk's udev entry has {}); to stop it setting them again, mask the rule: ln -s /dev/null /etc/udev/rules.d/90-iocost.rules",
                properties.join(" ")
            ),
            Owner::Unknown { what } => write!(
                f,
                "another owner, not dbcage ({what}; no IOCOST_* udev properties on this disk, so not systemd-iocost: a boot script, resctl-demo or a manual write)"
            ),
        }
    }
}

/// The disk's udev database entry: `/run/udev/data/bMAJ:MIN`.
pub fn udev_entry(fs: &HostFs, dev: DevNum) -> PathBuf {
    fs.path(format!("/run/udev/data/b{dev}"))
}

/// The `IOCOST_*` properties udev holds for the disk (`E:IOCOST_SOLUTIONS=...` lines).
pub fn udev_iocost_properties(fs: &HostFs, dev: DevNum) -> Vec<String> {
    std::fs::read_to_string(udev_entry(fs, dev))
        .map(|t| {
            t.lines()
                .filter_map(|l| l.strip_prefix("E:"))
                .filter(|p| p.starts_with("IOCOST_"))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Who set the disk's current values (see [`Owner`]).
pub fn owner(
    model: Option<&Model>,
    qos: Option<&Qos>,
    record: Option<&Record>,
    udev_properties: Vec<String>,
) -> Owner {
    let model_user = model.is_some_and(|m| m.user);
    let qos_user = qos.is_some_and(|q| q.user);
    let enabled = qos.is_some_and(|q| q.enable);
    if !model_user && !qos_user && !enabled {
        return Owner::Nobody;
    }
    if let Some(r) = record {
        if model == Some(&r.model_written) && qos == Some(&r.qos_written) {
            return Owner::Dbcage;
        }
    }
    if !udev_properties.is_empty() {
        return Owner::Udev {
            properties: udev_properties,
        };
    }
    let mut what = Vec::new();
    if model_user {
        what.push("io.cost.model has ctrl=user");
    }
    if qos_user {
        what.push("io.cost.qos has ctrl=user");
    } else if enabled {
        what.push("iocost was switched on (enable=1) with the kernel's own parameters");
    }
    Owner::Unknown {
        what: what.join(", "),
    }
}

/// The lines that put a disk back as a record found it: the values someone had written, or
/// `ctrl=auto` (the kernel's defaults) with iocost on or off as it was.
pub fn restore_lines(r: &Record) -> (String, String) {
    let dev = r.device;
    let model = Model::restore_line(r.model_before.as_ref(), dev);
    let qos = match &r.qos_before {
        Some(q) if q.user => format!(
            "{dev} enable={} ctrl=user rpct={} rlat={} wpct={} wlat={} min={} max={}",
            u8::from(q.enable),
            show_hundredths(q.rpct),
            q.rlat,
            show_hundredths(q.wpct),
            q.wlat,
            show_hundredths(q.min),
            show_hundredths(q.max)
        ),
        Some(q) => format!("{dev} enable={} ctrl=auto", u8::from(q.enable)),
        None => format!("{dev} enable=0 ctrl=auto"),
    };
    (model, qos)
}

pub fn record_path(fs: &HostFs, dev: DevNum) -> PathBuf {
    fs.path(RECORD_DIR).join(format!("{dev}.json"))
}

pub fn read_record(fs: &HostFs, dev: DevNum) -> Option<Record> {
    let text = std::fs::read_to_string(record_path(fs, dev)).ok()?;
    serde_json::from_str(&text).ok()
}

pub fn write_record(fs: &HostFs, r: &Record) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::os::unix::fs::DirBuilderExt;
    let path = record_path(fs, r.device);
    let dir = path.parent().expect("record path has a directory");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(&path, serde_json::to_string_pretty(r)?)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// A disk's request queue: its IO scheduler and how many requests it holds
/// (`/sys/block/NAME/queue/scheduler` and `nr_requests`). `dbcage iocost --queue` deepens it
/// and records what it found, for `--revert`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSetting {
    pub scheduler: String,
    pub nr_requests: u32,
}

/// The scheduler `--queue` gives a disk short of requests: it queues requests beyond the tags,
/// and dispatches reads ahead of writes within their deadlines.
pub const QUEUE_SCHEDULER: &str = "mq-deadline";

/// The number of requests `--queue` gives for tenants with up to `jobs_max` IOs in flight.
pub fn queue_requests(jobs_max: usize) -> u32 {
    jobs_max.next_power_of_two().clamp(64, 4096) as u32
}

fn queue_dir(fs: &HostFs, disk: &str) -> PathBuf {
    fs.path(format!("/sys/block/{disk}/queue"))
}

/// The scheduler in use (the bracketed name of `scheduler`: `[none] mq-deadline`) and the
/// ones the kernel offers.
fn parse_scheduler(text: &str) -> (Option<&str>, Vec<&str>) {
    let mut current = None;
    let mut all = Vec::new();
    for word in text.split_whitespace() {
        let name = word.trim_start_matches('[').trim_end_matches(']');
        if word.starts_with('[') {
            current = Some(name);
        }
        all.push(name);
    }
    (current, all)
}

/// What a disk's queue is now.
pub fn read_queue(fs: &HostFs, disk: &str) -> anyhow::Result<QueueSetting> {
    use anyhow::Context;
    let dir = queue_dir(fs, disk);
    let sched_path = dir.join("scheduler");
    let text = std::fs::read_to_string(&sched_path)
        .with_context(|| format!("cannot read {}", sched_path.display()))?;
    let scheduler = parse_scheduler(&text).0.unwrap_or("none").to_string();
    Ok(QueueSetting {
        scheduler,
        nr_requests: read_nr_requests(fs, disk)?,
    })
}

/// A disk's number of requests (`/sys/block/NAME/queue/nr_requests`).
pub fn read_nr_requests(fs: &HostFs, disk: &str) -> anyhow::Result<u32> {
    use anyhow::Context;
    let path = queue_dir(fs, disk).join("nr_requests");
    let nr = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    nr.trim()
        .parse()
        .with_context(|| format!("{}: `{}` is not a number", path.display(), nr.trim()))
}

/// Sets a disk's scheduler, then its number of requests (a scheduler change resets it), and
/// returns what the kernel shows after. A scheduler the kernel does not offer is refused before
/// anything is written.
pub fn write_queue(fs: &HostFs, disk: &str, want: &QueueSetting) -> anyhow::Result<QueueSetting> {
    use anyhow::{bail, Context};
    let dir = queue_dir(fs, disk);
    let sched_path = dir.join("scheduler");
    let text = std::fs::read_to_string(&sched_path)
        .with_context(|| format!("cannot read {}", sched_path.display()))?;
    let (current, offered) = parse_scheduler(&text);
    if !offered.contains(&want.scheduler.as_str()) {
        bail!(
            "{disk}: the kernel offers no {} scheduler for it ({} lists: {}); load its module (modprobe {}) or leave out --queue",
            want.scheduler,
            sched_path.display(),
            text.trim(),
            want.scheduler.replace('-', "_")
        );
    }
    if current != Some(want.scheduler.as_str()) {
        std::fs::write(&sched_path, &want.scheduler).with_context(|| {
            format!(
                "cannot write `{}` to {}",
                want.scheduler,
                sched_path.display()
            )
        })?;
    }
    let nr_path = dir.join("nr_requests");
    std::fs::write(&nr_path, want.nr_requests.to_string()).with_context(|| {
        format!(
            "cannot write {} to {} (scheduler now {})",
            want.nr_requests,
            nr_path.display(),
            want.scheduler
        )
    })?;
    read_queue(fs, disk)
}

/// The root's two files.
#[derive(Debug, Clone)]
pub struct RootFiles {
    pub model: PathBuf,
    pub qos: PathBuf,
}

impl RootFiles {
    pub fn at(root: &Path) -> RootFiles {
        RootFiles {
            model: root.join(IO_COST_MODEL),
            qos: root.join(IO_COST_QOS),
        }
    }

    /// The disk's current lines.
    pub fn read(&self, dev: DevNum) -> anyhow::Result<(Option<Model>, Option<Qos>)> {
        use anyhow::Context;
        let read = |p: &Path| {
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
        };
        Ok((
            Model::find(&read(&self.model)?, dev),
            Qos::find(&read(&self.qos)?, dev),
        ))
    }

    /// Writes a model line, then a QoS line; when the QoS write fails, the model is put back to
    /// `model_undo` so that nothing is left half-applied.
    pub fn write_pair(&self, model: &str, qos: &str, model_undo: &str) -> anyhow::Result<()> {
        use crate::cgroup::apply::write_file;
        write_file(&self.model, model)?;
        if let Err(e) = write_file(&self.qos, qos) {
            return Err(match write_file(&self.model, model_undo) {
                Ok(()) => anyhow::anyhow!(
                    "{e}; {} was put back to `{model_undo}`",
                    self.model.display()
                ),
                Err(undo) => anyhow::anyhow!(
                    "{e}; putting {} back to `{model_undo}` failed too ({undo}): check it by hand",
                    self.model.display()
                ),
            });
        }
        Ok(())
    }
}
