//! `dbcage iolat`: loads the program for a while, then prints what each tenant's IO waited:
//! without a tenant one summary line per tenant and operation, with one the seed-000 table.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use super::loader::IoLatency;
use super::render::{histogram_table, percentiles, secs_label};
use super::{CgroupOwners, Dev, Hist, Op, Stages, TenantKey};
use crate::cgroup::{Controller, Layout};

/// `dbcage iolat` options.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "Examples:\n  dbcage iolat                  every tenant, 10 s\n  dbcage iolat DEMO --duration 60s --op read\n  dbcage iolat DEMO --stage throttled   only the wait in the throttle"
)]
pub struct IolatArgs {
    /// Show this tenant's histogram (default: a summary line per tenant and operation).
    pub tenant: Option<String>,
    /// How long to record.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Only this operation: read, write, flush or discard.
    #[arg(long)]
    pub op: Option<Op>,
    /// Only this disk (`loop3`, `/dev/sda`, or `8:0`).
    #[arg(long)]
    pub device: Option<String>,
    /// Which time to show: total (submission to completion), throttled (waiting in the
    /// throttle before the block layer queued the request) or service (queued to completion).
    #[arg(long, value_enum, default_value_t = Stage::Total)]
    pub stage: Stage,
    /// Print one JSON object per tenant, disk and operation, with the full histogram.
    #[arg(long)]
    pub json: bool,
    /// Also show what the program cost: the kernel times each of its runs (BPF run
    /// statistics, enabled for the duration) and the time per completed request is printed
    /// (on stderr with --json).
    #[arg(long)]
    pub cost: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Total,
    Throttled,
    Service,
}

impl Stage {
    fn of(self, s: &Stages) -> &Hist {
        match self {
            Stage::Total => &s.total,
            Stage::Throttled => &s.throttled,
            Stage::Service => &s.service,
        }
    }
}

/// The disk's kernel name (`loop3`, `sda`) from /sys/dev/block, or `M:m` if it has none.
pub fn dev_name(sys: &Path, dev: Dev) -> String {
    std::fs::read_link(sys.join(format!("dev/block/{dev}")))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| dev.to_string())
}

/// `--device`: a kernel name, a /dev path or `M:m`.
fn parse_device(sys: &Path, s: &str) -> Result<Dev> {
    if let Some((ma, mi)) = s.split_once(':') {
        if let (Ok(major), Ok(minor)) = (ma.parse(), mi.parse()) {
            return Ok(Dev { major, minor });
        }
    }
    let name = s.strip_prefix("/dev/").unwrap_or(s);
    let path = sys.join("class/block").join(name).join("dev");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "--device {s}: no such block device (reading {})",
            path.display()
        )
    })?;
    let (ma, mi) = text.trim().split_once(':').context("malformed dev file")?;
    Ok(Dev {
        major: ma.parse()?,
        minor: mi.parse()?,
    })
}

/// Which tenant owns which cgroup id, for the tenants of a policy in its io hierarchy: its own
/// group, or under systemd the cgroups of the units that govern it (`Layout::units`; dbcage's
/// own group does not exist there), each with the groups below (a delegated unit's leaves).
pub fn owners(layout: &Layout, tenants: &[String]) -> CgroupOwners {
    let Some(h) = layout.setup.hierarchy_of(Controller::Io) else {
        return CgroupOwners::default();
    };
    let dirs: Vec<(&str, PathBuf)> = tenants
        .iter()
        .flat_map(|t| {
            let own = std::iter::once(layout.tenant_dir(h, t));
            own.chain(layout.unit_dirs(h, t)).map(|d| (t.as_str(), d))
        })
        .collect();
    CgroupOwners::read(dirs.iter().map(|(t, d)| (*t, d.as_path())))
}

#[derive(Serialize)]
struct JsonRow<'a> {
    tenant: &'a str,
    device: String,
    op: Op,
    stage: Stage,
    count: u64,
    mean_s: Option<f64>,
    p50_s: Option<f64>,
    p99_s: Option<f64>,
    /// Share of the total time spent waiting in the throttle.
    throttled_share: Option<f64>,
    hist: &'a Hist,
}

pub fn iolat_command(
    config: &crate::policy::PolicyPath,
    args: &IolatArgs,
    out: &mut impl Write,
) -> Result<()> {
    // Only the cgroup layout: the histograms are keyed by the tenants' group directories.
    let (loaded, layout, _fs) = crate::engine::layout_for(config)?;
    let names: Vec<String> = loaded
        .policy
        .tenants
        .iter()
        .map(|t| t.name.clone())
        .collect();
    if let Some(t) = &args.tenant {
        if !names.contains(t) {
            return Err(crate::usage::Invalid(format!(
                "no tenant named `{t}` in {}",
                config.path.display()
            ))
            .into());
        }
    }
    let sys = Path::new("/sys");
    let device = args
        .device
        .as_deref()
        .map(|d| parse_device(sys, d))
        .transpose()?;
    // Ctrl-C or SIGTERM ends the recording early and prints what it holds: blocked here (this
    // command runs no other thread) and read from a signalfd while the recording waits.
    let stop_signals = RecordingStop::new()?;
    let prog = IoLatency::load()?;
    let throttle_measured = prog.no_throttle_split().is_none();
    if let Some(why) = prog.no_throttle_split() {
        eprintln!(
            "dbcage: the throttle's wait is not measured on this kernel; latency counts from \
             the block layer's queue ({why})"
        );
    }
    let stats_on = if args.cost {
        Some(IoLatency::enable_run_stats().context("enabling BPF run statistics (--cost)")?)
    } else {
        None
    };
    let recorded = stop_signals.wait(args.duration)?;
    let snap = prog.read();
    let cost = stats_on.map(|_on| cost_line(&prog.run_stats(), snap.completed()));
    drop(prog);
    if let Some(line) = &cost {
        if args.json {
            eprintln!("{line}");
        }
    }
    tracing::debug!(
        "iolat: {} requests completed ({} unmatched, {} dropped, {} raced), {} keys",
        snap.completed(),
        snap.unmatched,
        snap.dropped,
        snap.raced,
        snap.entries.len()
    );
    let by = snap.by_tenant(&owners(&layout, &names));
    let keep = |k: &TenantKey| {
        args.tenant.as_ref().is_none_or(|t| &k.tenant == t)
            && args.op.is_none_or(|o| k.op == o)
            && device.is_none_or(|d| k.dev == d)
    };
    let secs = recorded.as_secs_f64();
    // Whole milliseconds: an interrupted recording's duration prints as `3s 212ms`.
    let recorded = Duration::from_millis(recorded.as_millis() as u64);
    for note in snap.uncounted_notes() {
        writeln!(out, "note: {note}")?;
    }

    if args.json {
        let rows: Vec<JsonRow> = by
            .iter()
            .filter(|(k, _)| keep(k))
            .map(|(k, s)| {
                let h = args.stage.of(s);
                JsonRow {
                    tenant: &k.tenant,
                    device: dev_name(sys, k.dev),
                    op: k.op,
                    stage: args.stage,
                    count: h.count,
                    mean_s: h.mean(),
                    p50_s: h.quantile(0.5),
                    p99_s: h.quantile(0.99),
                    throttled_share: (s.total.sum_ns > 0)
                        .then(|| s.throttled.sum_ns as f64 / s.total.sum_ns as f64),
                    hist: h,
                }
            })
            .collect();
        serde_json::to_writer_pretty(&mut *out, &rows)?;
        writeln!(out)?;
        return Ok(());
    }

    match &args.tenant {
        None => {
            // One line per tenant, disk and operation: a disk under another (a loop device's
            // file, a dm target's disks) is charged to the tenant too, so disks are not summed.
            writeln!(
                out,
                "{:<16} {:<8} {:<7} {:>9} {:>8} {:>10} {:>10} {:>10} {:>9}",
                "TENANT", "DEVICE", "OP", "REQUESTS", "IOPS", "MEAN", "P50", "P99", "THROTTLED"
            )?;
            let mut any = false;
            for (k, s) in by.iter().filter(|(k, _)| keep(k)) {
                any = true;
                let h = args.stage.of(s);
                let q = |q| h.quantile(q).map_or_else(|| "-".into(), secs_label);
                writeln!(
                    out,
                    "{:<16} {:<8} {:<7} {:>9} {:>8.0} {:>10} {:>10} {:>10} {:>9}",
                    k.tenant,
                    dev_name(sys, k.dev),
                    k.op.as_str(),
                    h.count,
                    h.count as f64 / secs,
                    h.mean().map_or_else(|| "-".into(), secs_label),
                    q(0.5),
                    q(0.99),
                    if throttle_measured {
                        format!("{:.0}%", throttled_share(s) * 100.0)
                    } else {
                        "-".into()
                    },
                )?;
            }
            if !any {
                writeln!(
                    out,
                    "(no tenant's IO completed in {})",
                    humantime::format_duration(recorded)
                )?;
            }
        }
        Some(tenant) => {
            // One histogram per disk, all operations (or --op) together.
            let mut per_dev: BTreeMap<Dev, Stages> = BTreeMap::new();
            for (k, s) in by.iter().filter(|(k, _)| keep(k)) {
                per_dev.entry(k.dev).or_default().add(s);
            }
            let ops = args.op.map_or("read, write, flush, discard", Op::as_str);
            if per_dev.is_empty() {
                writeln!(
                    out,
                    "{tenant}: no IO completed in {} ({ops})",
                    humantime::format_duration(recorded)
                )?;
            }
            for (i, (dev, all)) in per_dev.iter().enumerate() {
                if i > 0 {
                    writeln!(out)?;
                }
                writeln!(
                    out,
                    "{tenant} on {} ({dev}): {} requests in {} ({ops}), {} time",
                    dev_name(sys, *dev),
                    all.total.count,
                    humantime::format_duration(recorded),
                    match args.stage {
                        Stage::Total => "total (submission to completion)",
                        Stage::Throttled => "waiting in the throttle",
                        Stage::Service => "service (queued to completion)",
                    }
                )?;
                if throttle_measured {
                    writeln!(
                        out,
                        "total {}; in the throttle {} ({:.0}% of the time); service {}",
                        percentiles(&all.total),
                        percentiles(&all.throttled),
                        throttled_share(all) * 100.0,
                        percentiles(&all.service),
                    )?;
                } else {
                    writeln!(
                        out,
                        "{} (from the block layer's queue: the throttle's wait is not measured on this kernel)",
                        percentiles(&all.total)
                    )?;
                }
                writeln!(out)?;
                write!(out, "{}", histogram_table(args.stage.of(all)))?;
            }
        }
    }
    if let Some(line) = cost {
        writeln!(out, "\n{line}")?;
    }
    Ok(())
}

/// SIGINT and SIGTERM, blocked and read from a signalfd: the recording ends at its duration or
/// at the first of them, whichever comes first.
struct RecordingStop {
    fd: nix::sys::signalfd::SignalFd,
}

impl RecordingStop {
    fn new() -> Result<RecordingStop> {
        use nix::sys::signal::{SigSet, Signal};
        use nix::sys::signalfd::{SfdFlags, SignalFd};
        let mut mask = SigSet::empty();
        mask.add(Signal::SIGINT);
        mask.add(Signal::SIGTERM);
        mask.thread_block().context("blocking SIGINT and SIGTERM")?;
        let fd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC).context("signalfd")?;
        Ok(RecordingStop { fd })
    }

    /// Waits `duration` or until a signal; returns how long it waited.
    fn wait(&self, duration: Duration) -> Result<Duration> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let start = std::time::Instant::now();
        loop {
            let left = duration.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(duration);
            }
            let ms = left.as_millis().clamp(1, 60_000) as i32;
            let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
            match poll(
                &mut fds,
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
            ) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => {}
                Ok(_) => {
                    let signal = self.fd.read_signal().ok().flatten().map(|s| s.ssi_signo);
                    tracing::debug!("iolat: recording ended early by signal {signal:?}");
                    return Ok(start.elapsed());
                }
                Err(e) => return Err(anyhow::Error::new(e).context("waiting for the recording")),
            }
        }
    }
}

/// `program cost: iolat_queue 1,234 runs 85 ns/run, ...; 240 ns per completed request`.
fn cost_line(stats: &[(String, u64, u64)], completed: u64) -> String {
    let per_run: Vec<String> = stats
        .iter()
        .map(|(name, runs, ns)| {
            let each = ns.checked_div(*runs).unwrap_or(0);
            format!("{name} {runs} runs {each} ns/run")
        })
        .collect();
    let total: u64 = stats.iter().map(|s| s.2).sum();
    let per_io = total.checked_div(completed).map_or_else(
        || "no request completed".into(),
        |ns| format!("{ns} ns per completed request"),
    );
    format!("program cost: {}; {per_io}", per_run.join(", "))
}

fn throttled_share(s: &Stages) -> f64 {
    if s.total.sum_ns == 0 {
        0.0
    } else {
        s.throttled.sum_ns as f64 / s.total.sum_ns as f64
    }
}

#[cfg(test)]
mod recording_stop_tests {
    use super::*;

    #[test]
    fn a_signal_ends_the_recording_early_and_the_duration_otherwise() {
        let stop = RecordingStop::new().unwrap();
        let waited = stop.wait(Duration::from_millis(30)).unwrap();
        assert!(waited >= Duration::from_millis(30), "{waited:?}");
        // Blocked in this thread, so the signal stays pending for the signalfd.
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM).unwrap();
        let waited = stop.wait(Duration::from_secs(30)).unwrap();
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }
}
