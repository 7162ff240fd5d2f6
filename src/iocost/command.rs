//! The `dbcage iocost` command: find the unified hierarchy's root, resolve the disks, check who
//! owns their iocost values, measure with the probe, show the proposal, and write or revert only
//! when asked.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::{
    owner, propose, queue_requests, read_nr_requests, read_queue, read_record, record_path,
    restore_lines, udev_iocost_properties, write_queue, write_record, Measured, MeasuredWrites,
    Model, Owner, Qos, QueueLatency, QueueSetting, Record, RootFiles, MIN_VRATE, QUEUE_SCHEDULER,
};
use crate::cgroup::{Controller, Setup, Version};
use crate::hostfs::HostFs;
use crate::inventory::devices::{resolve_entry, BlockDevice};
use crate::inventory::mounts::MountTable;
use crate::policy::StorageLevel;
use crate::probe::{self, report::StepResult, ProbeArgs, Rw};
use crate::usage::Invalid;

/// `dbcage iocost` options.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Examples:
  dbcage iocost /dev/nvme0n1                 # measure and show the proposed lines
  dbcage iocost /srv/pg/data --apply         # the disks under a data directory (dm/md: their members)
  dbcage iocost /dev/sdb --apply --force     # replace values another owner set
  dbcage iocost /dev/sdb --apply --queue     # and give it a scheduler and requests for deep tenants
  dbcage iocost /dev/sdb --revert            # put back what was there before dbcage wrote")]
pub struct IocostArgs {
    /// Disks, or paths on them (a data directory, an LVM volume): partitions count as their
    /// disk, dm and md devices as the disks they are built on.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Write the proposed lines to the root's io.cost.model and io.cost.qos.
    #[arg(long, conflicts_with = "revert")]
    pub apply: bool,
    /// Overwrite (or revert over) iocost values that another owner set.
    #[arg(long)]
    pub force: bool,
    /// Put back the values dbcage found before its --apply, and forget its record.
    #[arg(long)]
    pub revert: bool,
    /// Also measure writes (destroys the disk's contents; refused while it is mounted, held or
    /// swap). Without it the kernel keeps its write parameters.
    #[arg(long)]
    pub destructive: bool,
    /// Duration of each probe step (6 steps per pattern and direction).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub step_time: Duration,
    /// Most parallel jobs the probe reaches (steps 1, 2, 4, ... up to it): the deepest queue a
    /// tenant keeps. The latency targets are the p95 the probe sees there.
    #[arg(long, default_value_t = 32)]
    pub jobs_max: usize,
    /// With --apply, first give a disk with fewer requests (nr_requests) than --jobs-max the
    /// mq-deadline scheduler (when it has none) and enough requests (--jobs-max rounded up to a
    /// power of two, at least 64), then measure it that way. Without them a tenant queueing
    /// deeper waits for a request, which iocost takes as saturation: alone it gets about half
    /// the disk. --revert puts the scheduler and the requests back.
    #[arg(long, requires = "apply")]
    pub queue: bool,
}

/// The unified hierarchy's root, when the io controller is on it; otherwise why not.
pub fn unified_root(fs: &HostFs) -> Result<PathBuf> {
    let mounts = MountTable::read(fs).context("cannot read /proc/self/mountinfo")?;
    let setup = Setup::detect(fs, &mounts)?;
    let Some(h) = setup.hierarchy_of(Controller::Io) else {
        bail!("no io controller is mounted on this host (neither cgroup v2's io nor v1's blkio): iocost needs the io controller on cgroup v2");
    };
    let hier = &setup.hierarchies[h];
    if hier.version == Version::V1 {
        return Err(Invalid(format!(
            "the io controller is a cgroup v1 hierarchy here (blkio at {}): iocost and io.weight exist only on cgroup v2. Boot with systemd.unified_cgroup_hierarchy=1 (or leave blkio out of the v1 mounts so that the cgroup2 mount gets io), then run this again",
            hier.mount_point.display()
        ))
        .into());
    }
    if hier.mount_root != "/" {
        bail!(
            "{} is the cgroup2 group `{}`, not the hierarchy's root (a container?): io.cost.model and io.cost.qos exist only at the root; run dbcage iocost on the host",
            hier.mount_point.display(),
            hier.mount_root
        );
    }
    let root = fs.path(&hier.mount_point);
    if !root.join(crate::cgroup::v2::IO_COST_QOS).exists() {
        bail!(
            "{} has no io.cost.qos: this kernel was built without iocost (CONFIG_BLK_CGROUP_IOCOST), so io.weight cannot act; use io caps (read_bps, ...) instead",
            hier.mount_point.display()
        );
    }
    Ok(root)
}

/// The whole disks to configure: each path resolved as the limits resolve storage with
/// `storage_level = "members"`.
fn disks(fs: &HostFs, paths: &[PathBuf]) -> Result<Vec<BlockDevice>> {
    let mounts = MountTable::read(fs).context("cannot read /proc/self/mountinfo")?;
    let mut out: Vec<BlockDevice> = Vec::new();
    for p in paths {
        let found = resolve_entry(fs, &mounts, &p.to_string_lossy(), StorageLevel::Members)
            .map_err(|e| Invalid(e.to_string()))?;
        for d in found {
            if !out.iter().any(|o| o.devnum == d.devnum) {
                out.push(d);
            }
        }
    }
    Ok(out)
}

/// The device node to probe: `/dev/NAME`, else `/dev/block/MAJ:MIN`.
fn node(fs: &HostFs, d: &BlockDevice) -> PathBuf {
    let by_name = fs.path(format!("/dev/{}", d.name));
    if by_name.exists() {
        by_name
    } else {
        fs.path(format!("/dev/block/{}", d.devnum))
    }
}

fn probe_steps(args: &IocostArgs, target: &Path, rw: Rw, bs: &str) -> Result<Vec<StepResult>> {
    let p = ProbeArgs {
        target: target.to_path_buf(),
        size: None,
        rw,
        bs: bs.into(),
        jobs_max: args.jobs_max,
        jobs: None,
        step_time: args.step_time,
        ramp: Duration::from_millis(200),
        latency_target: Duration::from_millis(10),
        json: false,
        histogram: false,
        plot: None,
        destructive: args.destructive,
    };
    let show = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let r = probe::measure(&p, show)
        .with_context(|| format!("probing {} ({rw} {bs})", target.display()))?;
    if r.interrupted {
        bail!("interrupted: nothing was written");
    }
    if let Some(w) = &r.target.cache_warning {
        bail!("{w}; the cost model would be the page cache's, not the disk's");
    }
    Ok(r.steps)
}

fn best_iops(steps: &[StepResult]) -> u64 {
    steps.iter().map(|s| s.iops).fold(0.0, f64::max).round() as u64
}

fn best_bps(steps: &[StepResult]) -> u64 {
    steps
        .iter()
        .map(|s| s.bytes as f64 / s.seconds.max(1e-9))
        .fold(0.0, f64::max)
        .round() as u64
}

/// The p95 (µs) at the smallest parallelism that reached 90% of the most IOPS (the latency the
/// disk shows when it has just saturated), at the first step twice as deep (the target's), and
/// at the deepest step.
pub fn queue_latency(steps: &[StepResult]) -> QueueLatency {
    let best = steps.iter().map(|s| s.iops).fold(0.0, f64::max);
    let p95 = |s: &StepResult| s.latency_us.p95.round() as u64;
    let saturated = steps.iter().find(|s| s.iops >= 0.9 * best);
    let deepest = steps.iter().max_by_key(|s| s.parallelism);
    let twice = saturated.map_or(0, |s| 2 * s.parallelism);
    let target = steps
        .iter()
        .filter(|s| s.parallelism >= twice)
        .min_by_key(|s| s.parallelism)
        .or(deepest);
    QueueLatency {
        saturated_jobs: saturated.map_or(0, |s| s.parallelism),
        saturated_p95_us: saturated.map_or(0, p95),
        target_jobs: target.map_or(0, |s| s.parallelism),
        target_p95_us: target.map_or(0, p95),
        deepest_jobs: deepest.map_or(0, |s| s.parallelism),
        deepest_p95_us: deepest.map_or(0, p95),
    }
}

/// The saturation point, then the target's and the deepest step's where they are other steps.
pub(super) fn show_latency(l: &QueueLatency) -> String {
    let mut s = format!(
        "p95 {} us at saturation ({} in flight)",
        l.saturated_p95_us, l.saturated_jobs
    );
    let mut shown = l.saturated_jobs;
    for (p95, jobs) in [
        (l.target_p95_us, l.target_jobs),
        (l.deepest_p95_us, l.deepest_jobs),
    ] {
        if jobs != shown {
            s.push_str(&format!(", {p95} us at {jobs} in flight"));
            shown = jobs;
        }
    }
    s
}

fn measure(args: &IocostArgs, target: &Path, out: &mut impl Write) -> Result<Measured> {
    let mut line = |what: &str, v: String| writeln!(out, "  {what:<34} {v}");
    let seq = probe_steps(args, target, Rw::Read, "1m")?;
    let rbps = best_bps(&seq);
    line(
        "sequential 1 MiB reads",
        format!("{:.1} MiB/s", rbps as f64 / 1048576.0),
    )?;
    let rseq = probe_steps(args, target, Rw::Read, "4k")?;
    let rseqiops = best_iops(&rseq);
    line("sequential 4 KiB reads", format!("{rseqiops} IOPS"))?;
    let rrand = probe_steps(args, target, Rw::Randread, "4k")?;
    let rrandiops = best_iops(&rrand);
    let rlat = queue_latency(&rrand);
    line(
        "random 4 KiB reads",
        format!("{rrandiops} IOPS, {}", show_latency(&rlat)),
    )?;
    let writes = if args.destructive {
        let wseq = probe_steps(args, target, Rw::Write, "1m")?;
        let w4 = probe_steps(args, target, Rw::Write, "4k")?;
        let wrand = probe_steps(args, target, Rw::Randwrite, "4k")?;
        let w = MeasuredWrites {
            wbps: best_bps(&wseq),
            wseqiops: best_iops(&w4),
            wrandiops: best_iops(&wrand),
            wlat: queue_latency(&wrand),
        };
        line(
            "sequential 1 MiB writes",
            format!("{:.1} MiB/s", w.wbps as f64 / 1048576.0),
        )?;
        line("sequential 4 KiB writes", format!("{} IOPS", w.wseqiops))?;
        line(
            "random 4 KiB writes",
            format!("{} IOPS, {}", w.wrandiops, show_latency(&w.wlat)),
        )?;
        Some(w)
    } else {
        line(
            "writes",
            "not measured (--destructive): the kernel keeps its write parameters".into(),
        )?;
        None
    };
    Ok(Measured {
        rbps,
        rseqiops,
        rrandiops,
        rlat,
        writes,
    })
}

/// When tenants with `jobs_max` IOs in flight would wait for a request: iocost takes more than
/// 5% of the time spent waiting for one as saturation whatever the QoS line says (block/
/// blk-iocost.c, RQ_WAIT_BUSY_PCT), so such a tenant alone is held near the min vrate.
fn request_shortage(fs: &HostFs, d: &BlockDevice, jobs_max: usize) -> Option<String> {
    let nr = read_nr_requests(fs, &d.name).ok()? as usize;
    let path = fs.path(format!("/sys/block/{}/queue/nr_requests", d.name));
    (nr < jobs_max).then(|| {
        format!(
            "{} has {nr} requests (nr_requests) for up to {jobs_max} IOs in flight: a tenant queueing deeper than {nr} waits for a request, which iocost counts as saturation whatever the QoS line says (more than 5% of the time waiting), so alone it runs near the min vrate ({}% of the model). With an IO scheduler the queue can hold more: `--apply --queue` gives it {QUEUE_SCHEDULER} and {} requests before measuring (--revert undoes it), as would echo {QUEUE_SCHEDULER} > /sys/block/{}/queue/scheduler; echo {} > {}",
            d.name,
            MIN_VRATE / 100,
            queue_requests(jobs_max),
            d.name,
            queue_requests(jobs_max),
            path.display()
        )
    })
}

fn show_current(out: &mut impl Write, model: Option<&Model>, qos: Option<&Qos>) -> Result<()> {
    match (model, qos) {
        (None, None) => writeln!(out, "  now: iocost never configured on it (off)")?,
        _ => {
            if let Some(m) = model {
                writeln!(
                    out,
                    "  now: model ctrl={} rbps={} rseqiops={} rrandiops={} wbps={} wseqiops={} wrandiops={}",
                    if m.user { "user" } else { "auto" },
                    m.rbps, m.rseqiops, m.rrandiops, m.wbps, m.wseqiops, m.wrandiops
                )?;
            }
            if let Some(q) = qos {
                writeln!(
                    out,
                    "  now: qos enable={} ctrl={} rlat={} wlat={}",
                    u8::from(q.enable),
                    if q.user { "user" } else { "auto" },
                    q.rlat,
                    q.wlat
                )?;
            }
        }
    }
    Ok(())
}

pub fn iocost_command(args: &IocostArgs, out: &mut impl Write) -> Result<()> {
    let fs = HostFs::default();
    iocost_in(&fs, args, out)
}

fn iocost_in(fs: &HostFs, args: &IocostArgs, out: &mut impl Write) -> Result<()> {
    let root = unified_root(fs)?;
    let files = RootFiles::at(&root);
    let disks = disks(fs, &args.paths)?;
    if args.revert {
        return revert(fs, &files, &disks, args.force, out);
    }
    // Refuse before measuring: a probe takes a while and its result could not be used.
    let mut states = Vec::new();
    for d in &disks {
        let (model, qos) = files.read(d.devnum)?;
        let record = read_record(fs, d.devnum);
        let who = owner(
            model.as_ref(),
            qos.as_ref(),
            record.as_ref(),
            udev_iocost_properties(fs, d.devnum),
        );
        if args.apply && !args.force && !matches!(who, Owner::Nobody | Owner::Dbcage) {
            return Err(Invalid(format!(
                "{} ({}): its iocost values were set by {who}. Nothing was measured or written; give --force to replace them (dbcage records them first, so --revert puts them back)",
                d.name, d.devnum
            ))
            .into());
        }
        states.push((model, qos, record, who));
    }
    for (d, (model, qos, record, who)) in disks.iter().zip(states) {
        let target = node(fs, d);
        writeln!(
            out,
            "{} ({}), probed at {}:",
            d.name,
            d.devnum,
            target.display()
        )?;
        show_current(out, model.as_ref(), qos.as_ref())?;
        writeln!(out, "  set by: {who}")?;
        // The queue as dbcage first found it, kept across re-applies.
        let earlier = record.as_ref().filter(|_| who == Owner::Dbcage);
        let mut queue_before = earlier.and_then(|r| r.queue_before.clone());
        let mut queue_written = earlier.and_then(|r| r.queue_written.clone());
        // The queue as this run found it, when it changed it.
        let mut changed_from = None;
        if args.queue {
            let now = read_queue(fs, &d.name)?;
            if (now.nr_requests as usize) < args.jobs_max {
                let want = QueueSetting {
                    scheduler: if now.scheduler == "none" {
                        QUEUE_SCHEDULER.to_string()
                    } else {
                        now.scheduler.clone()
                    },
                    nr_requests: queue_requests(args.jobs_max),
                };
                let got = write_queue(fs, &d.name, &want)
                    .with_context(|| format!("deepening the queue of {} ({})", d.name, d.devnum))?;
                writeln!(
                    out,
                    "  queue: scheduler {} -> {}, nr_requests {} -> {}",
                    now.scheduler, got.scheduler, now.nr_requests, got.nr_requests
                )?;
                queue_before.get_or_insert_with(|| now.clone());
                queue_written = Some(got);
                changed_from = Some(now);
            } else {
                writeln!(
                    out,
                    "  queue: scheduler {}, {} requests: enough for {} in flight, left as it is",
                    now.scheduler, now.nr_requests, args.jobs_max
                )?;
            }
        }
        // Nothing half-done: a queue deepened for this run goes back if the rest fails.
        let undo_queue = |e: anyhow::Error| -> anyhow::Error {
            match changed_from.as_ref().map(|q| (q, write_queue(fs, &d.name, q))) {
                Some((q, Err(e2))) => e.context(format!(
                    "and putting back the queue of {} (scheduler {}, {} requests) failed too: {e2:#}",
                    d.name, q.scheduler, q.nr_requests
                )),
                Some((_, Ok(_))) => e.context(format!(
                    "the queue of {} is back as it was",
                    d.name
                )),
                None => e,
            }
        };
        let m = measure(args, &target, out).map_err(undo_queue)?;
        let p = propose(d.devnum, &m);
        writeln!(
            out,
            "  proposed {}: {}",
            files.model.display(),
            p.model_line
        )?;
        writeln!(out, "  proposed {}: {}", files.qos.display(), p.qos_line)?;
        for why in &p.why {
            writeln!(out, "    {why}")?;
        }
        if let Some(note) = request_shortage(fs, d, args.jobs_max) {
            writeln!(out, "  note: {note}")?;
        }
        if !args.apply {
            writeln!(out, "  not written: give --apply to write them")?;
            continue;
        }
        // What was there before dbcage first wrote is kept across re-applies.
        let (model_before, qos_before) = match (&who, record) {
            (Owner::Dbcage, Some(r)) => (r.model_before, r.qos_before),
            _ => (model, qos),
        };
        let undo = Model::restore_line(model.as_ref(), d.devnum);
        files
            .write_pair(&p.model_line, &p.qos_line, &undo)
            .with_context(|| format!("enabling iocost on {} ({})", d.name, d.devnum))
            .map_err(undo_queue)?;
        let (Some(model_written), Some(qos_written)) = files.read(d.devnum)? else {
            bail!(
                "{} ({}): the kernel does not list the disk in {} after the write",
                d.name,
                d.devnum,
                files.qos.display()
            );
        };
        write_record(
            fs,
            &Record {
                device: d.devnum,
                name: d.name.clone(),
                model_before,
                qos_before,
                model_written,
                qos_written,
                queue_before,
                queue_written,
            },
        )?;
        writeln!(
            out,
            "  written; `dbcage iocost {} --revert` puts back what was there",
            args.paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" ")
        )?;
    }
    Ok(())
}

fn revert(
    fs: &HostFs,
    files: &RootFiles,
    disks: &[BlockDevice],
    force: bool,
    out: &mut impl Write,
) -> Result<()> {
    let mut todo = Vec::new();
    for d in disks {
        let Some(r) = read_record(fs, d.devnum) else {
            return Err(Invalid(format!(
                "{} ({}): dbcage has not set iocost on it (no {}); nothing was reverted",
                d.name,
                d.devnum,
                record_path(fs, d.devnum).display()
            ))
            .into());
        };
        let (model, qos) = files.read(d.devnum)?;
        if !force
            && (model.as_ref() != Some(&r.model_written) || qos.as_ref() != Some(&r.qos_written))
        {
            return Err(Invalid(format!(
                "{} ({}): its iocost values changed since dbcage wrote them (now set by {}); nothing was reverted; give --force to put back the values from before dbcage anyway",
                d.name,
                d.devnum,
                owner(model.as_ref(), qos.as_ref(), None, udev_iocost_properties(fs, d.devnum))
            ))
            .into());
        }
        if let (Some(written), false) = (&r.queue_written, force) {
            let now = read_queue(fs, &d.name)?;
            if &now != written {
                return Err(Invalid(format!(
                    "{} ({}): its queue changed since dbcage deepened it (scheduler {}, {} requests; dbcage left {}, {}); nothing was reverted; give --force to put back the queue from before dbcage (scheduler {}) anyway",
                    d.name,
                    d.devnum,
                    now.scheduler,
                    now.nr_requests,
                    written.scheduler,
                    written.nr_requests,
                    r.queue_before.as_ref().map_or("?", |q| q.scheduler.as_str())
                ))
                .into());
            }
        }
        todo.push((d, r, model));
    }
    for (d, r, model_now) in todo {
        let (model_line, qos_line) = restore_lines(&r);
        let undo = Model::restore_line(model_now.as_ref(), d.devnum);
        files
            .write_pair(&model_line, &qos_line, &undo)
            .with_context(|| format!("reverting iocost on {} ({})", d.name, d.devnum))?;
        if let Some(q) = &r.queue_before {
            let back = write_queue(fs, &d.name, q).with_context(|| {
                format!(
                    "iocost on {} ({}) is reverted, but its queue is not",
                    d.name, d.devnum
                )
            })?;
            writeln!(
                out,
                "{} ({}): queue back to scheduler {}, {} requests",
                d.name, d.devnum, back.scheduler, back.nr_requests
            )?;
        }
        let path = record_path(fs, d.devnum);
        std::fs::remove_file(&path)
            .with_context(|| format!("reverted, but cannot remove {}", path.display()))?;
        writeln!(
            out,
            "{} ({}): reverted: {model_line} / {qos_line}",
            d.name, d.devnum
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::DevNum;

    #[test]
    fn notes_a_disk_with_fewer_requests_than_the_queue() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = HostFs::with_root(tmp.path());
        let d = BlockDevice {
            devnum: DevNum::new(252, 0),
            name: "nullb0".into(),
        };
        assert_eq!(
            request_shortage(&fs, &d, 32),
            None,
            "no sysfs entry: no note"
        );
        let queue = fs.path("/sys/block/nullb0/queue");
        std::fs::create_dir_all(&queue).unwrap();
        std::fs::write(queue.join("nr_requests"), "8\n").unwrap();
        let note = request_shortage(&fs, &d, 32).unwrap();
        assert!(
            note.starts_with("nullb0 has 8 requests (nr_requests) for up to 32 IOs in flight")
                && note.contains("(50% of the model)")
                && note.contains("echo 64 > "),
            "{note}"
        );
        assert!(note.contains("`--apply --queue` gives it mq-deadline and 64 requests"));
        assert_eq!(request_shortage(&fs, &d, 8), None);
        std::fs::write(queue.join("nr_requests"), "256\n").unwrap();
        assert_eq!(request_shortage(&fs, &d, 32), None);
    }

    #[test]
    fn a_queue_is_read_written_and_refused_for_a_scheduler_the_kernel_lacks() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = HostFs::with_root(tmp.path());
        let queue = fs.path("/sys/block/nullb0/queue");
        std::fs::create_dir_all(&queue).unwrap();
        std::fs::write(queue.join("scheduler"), "[none] mq-deadline \n").unwrap();
        std::fs::write(queue.join("nr_requests"), "8\n").unwrap();
        let before = read_queue(&fs, "nullb0").unwrap();
        assert_eq!(
            before,
            QueueSetting {
                scheduler: "none".into(),
                nr_requests: 8
            }
        );
        let want = QueueSetting {
            scheduler: QUEUE_SCHEDULER.into(),
            nr_requests: queue_requests(32),
        };
        assert_eq!(want.nr_requests, 64);
        // A plain file takes the name as written; the kernel would show it bracketed.
        write_queue(&fs, "nullb0", &want).unwrap();
        assert_eq!(
            std::fs::read_to_string(queue.join("scheduler")).unwrap(),
            "mq-deadline"
        );
        assert_eq!(
            std::fs::read_to_string(queue.join("nr_requests")).unwrap(),
            "64"
        );
        std::fs::write(queue.join("scheduler"), "none [mq-deadline] \n").unwrap();
        assert_eq!(read_queue(&fs, "nullb0").unwrap(), want);

        // No bfq offered: refused, naming the file and what it lists, nothing written.
        let bfq = QueueSetting {
            scheduler: "bfq".into(),
            nr_requests: 64,
        };
        std::fs::write(queue.join("nr_requests"), "8\n").unwrap();
        let e = format!("{:#}", write_queue(&fs, "nullb0", &bfq).unwrap_err());
        assert!(
            e.contains("the kernel offers no bfq scheduler")
                && e.contains("lists: none [mq-deadline]")
                && e.contains("modprobe bfq"),
            "{e}"
        );
        assert_eq!(
            std::fs::read_to_string(queue.join("nr_requests")).unwrap(),
            "8\n"
        );
        assert_eq!(queue_requests(8), 64);
        assert_eq!(queue_requests(100), 128);
        assert_eq!(
            crate::iocost::parse_scheduler("[bfq] none kyber").0,
            Some("bfq")
        );
    }
}
