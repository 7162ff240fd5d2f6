//! `dbcage probe`: what a disk (or a file on it) delivers under direct IO as parallelism grows,
//! and where its latency crosses a target (seed 004); `dbcage verify`: the same probe run inside
//! a tenant's limited cgroup, to check each configured limit against what a process there gets
//! (seed 003's fio before and after, in one command).
//!
//! Engine: one thread per unit of parallelism, each issuing blocking `pread`/`pwrite` on an
//! O_DIRECT descriptor from a buffer aligned to the device's logical block size (at least 4096).
//! This is fio's `ioengine=psync` with `numjobs=N`, the peer the accuracy tests compare against.
//! Threads were chosen over io_uring and libaio because they are portable to every kernel dbcage
//! supports (RHEL 7's 3.10 has no io_uring; io_uring is also often disabled by sysctl or seccomp
//! in hardened and container hosts) and need no new dependency or unsafe ring code; a
//! database's own IO is mostly synchronous per process too. An io_uring engine with one thread
//! and a queue depth could be added later behind the same `run_step` interface.
//!
//! It must never write to a block device without `--destructive`, nor to one that is mounted,
//! held (dm, md) or used as swap; every input is checked before anything is created or
//! written. tmpfs and ramfs are refused: they accept O_DIRECT on recent kernels but serve it
//! from memory.

pub mod engine;
pub mod plot;
pub mod report;
pub mod verify;

#[cfg(test)]
mod tests;

use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use engine::{Kind, StepSpec, Target};
use report::{Latency, StepResult};

pub use crate::usage::Invalid;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    Read,
    Write,
    Randread,
    Randwrite,
}

impl Rw {
    pub fn writes(self) -> bool {
        matches!(self, Rw::Write | Rw::Randwrite)
    }
    pub fn random(self) -> bool {
        matches!(self, Rw::Randread | Rw::Randwrite)
    }
}

impl fmt::Display for Rw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rw::Read => "read",
            Rw::Write => "write",
            Rw::Randread => "randread",
            Rw::Randwrite => "randwrite",
        })
    }
}

/// `dbcage probe` options.
#[derive(Debug, Clone, clap::Args)]
pub struct ProbeArgs {
    /// A block device or a file (created at --size if missing).
    pub target: PathBuf,
    /// Size of the file to create if TARGET is missing, or how much of TARGET to use (4GiB).
    #[arg(long)]
    pub size: Option<String>,
    /// Access pattern. Writes go only to a file, or to a device with --destructive.
    #[arg(long, value_enum, default_value_t = Rw::Read)]
    pub rw: Rw,
    /// Block sizes to probe, a list (multiples of the device's logical block size).
    #[arg(long, default_value = "4k,64k,1m")]
    pub bs: String,
    /// Most jobs: concurrent threads, each with one IO in flight (fio's numjobs with
    /// iodepth=1, not fio's iodepth); steps are 1, 2, 4, ... up to it.
    #[arg(long, default_value_t = 16, alias = "depth-max")]
    pub jobs_max: usize,
    /// Exact job counts instead of powers of two (`--jobs 1,3,8`).
    #[arg(long, alias = "depths")]
    pub jobs: Option<String>,
    /// Duration of each step.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub step_time: Duration,
    /// Warm-up of each step, not counted (as fio's ramp_time): lets a throttle's initial
    /// burst or a cache settle.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub ramp: Duration,
    /// p99 latency the knee must stay under.
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
    pub latency_target: Duration,
    /// Print the result as JSON (no progress bar).
    #[arg(long)]
    pub json: bool,
    /// Print each step's latency distribution: RANGE, DURATION (s), %, CALLS, MEAN, MIN, MAX
    /// (ms) per range (0-100us, 100-250us, ... 2-5ms, 5-10ms, ... 1000ms-+inf), and a TOTAL.
    #[arg(long)]
    pub histogram: bool,
    /// Draw throughput (log scale) and p99 latency against jobs to this SVG file, with the
    /// latency target and each block size's knee.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Allow writes to a block device (its contents are destroyed). Refused while it or any of
    /// its partitions is mounted, held or swap.
    #[arg(long)]
    pub destructive: bool,
}

/// Parses a block-size list: `4k,64k,1m` (binary units, as fio reads them).
pub fn parse_bs_list(text: &str) -> Result<Vec<u64>, Invalid> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim) {
        let v = crate::units::parse_bytes(part)
            .map_err(|e| Invalid(format!("--bs: {e}")))
            .and_then(|v| {
                if v == 0 {
                    Err(Invalid("--bs: a block size of 0 bytes".into()))
                } else {
                    Ok(v)
                }
            })?;
        if v > 64 << 20 {
            return Err(Invalid(format!(
                "--bs {part}: larger than 64MiB; use at most 64m"
            )));
        }
        if !out.contains(&v) {
            out.push(v);
        }
    }
    Ok(out)
}

/// Parallelism steps: powers of two up to `max`, then `max` itself if it is not one.
pub fn depth_steps(max: usize) -> Result<Vec<usize>, Invalid> {
    if max == 0 || max > 1024 {
        return Err(Invalid(format!(
            "--jobs-max {max}: give a number of jobs from 1 to 1024"
        )));
    }
    let mut out = Vec::new();
    let mut d = 1;
    while d <= max {
        out.push(d);
        d *= 2;
    }
    if *out.last().unwrap() != max {
        out.push(max);
    }
    Ok(out)
}

/// An explicit list of parallelism steps: `1,3,8`.
pub fn parse_depths(text: &str) -> Result<Vec<usize>, Invalid> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim) {
        match part.parse::<usize>() {
            Ok(d) if (1..=1024).contains(&d) => out.push(d),
            _ => {
                return Err(Invalid(format!(
                    "--jobs: `{part}` is not a number of jobs from 1 to 1024 (example: 1,2,4,8)"
                )))
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// A tolerance as `10%` or `0.1`.
pub fn parse_tolerance(text: &str) -> Result<f64, Invalid> {
    let t = text.trim();
    let bad = || {
        Invalid(format!(
            "--tolerance `{text}`: give a percentage from 0% to 100% such as 10% (or a fraction such as 0.1)"
        ))
    };
    let v = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map_err(|_| bad())? / 100.0,
        None => t.parse::<f64>().map_err(|_| bad())?,
    };
    if !(0.0..=1.0).contains(&v) || !v.is_finite() {
        return Err(bad());
    }
    Ok(v)
}

/// Set by SIGINT while a probe runs: the current step stops, what was measured is printed.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: nix::libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Routes SIGINT to the `INTERRUPTED` flag (only an atomic store happens in the handler).
pub fn catch_sigint() -> Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let action = SigAction::new(
        SigHandler::Handler(on_sigint),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { sigaction(Signal::SIGINT, &action) }.context("installing the SIGINT handler")?;
    Ok(())
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Everything a probe found, as `--json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    pub target: Target,
    pub rw: Rw,
    pub engine: &'static str,
    pub step_seconds: f64,
    pub ramp_seconds: f64,
    pub latency_target_us: f64,
    /// Ctrl-C stopped the run; the steps listed are those measured.
    pub interrupted: bool,
    pub steps: Vec<StepResult>,
    pub knees: Vec<report::Knee>,
}

pub const ENGINE: &str = "threads, pread/pwrite, O_DIRECT (as fio ioengine=psync, numjobs=N)";

/// Checks everything, creates a missing file, runs every step. Nothing is written before the
/// checks pass.
pub fn measure(args: &ProbeArgs, show_progress: bool) -> Result<ProbeReport> {
    let block_sizes = parse_bs_list(&args.bs)?;
    let depths = match &args.jobs {
        Some(d) => parse_depths(d)?,
        None => depth_steps(args.jobs_max)?,
    };
    if args.step_time < Duration::from_millis(100) {
        return Err(Invalid(format!(
            "--step-time {}: give at least 100ms (2s or more for stable figures)",
            humantime::format_duration(args.step_time)
        ))
        .into());
    }
    let size = args
        .size
        .as_deref()
        .map(|s| crate::units::parse_bytes(s).map_err(|e| Invalid(format!("--size: {e}"))))
        .transpose()?;
    if size == Some(0) {
        return Err(Invalid("--size 0: give a size such as 1GiB".into()).into());
    }
    if let Some(p) = &args.plot {
        if p.extension().is_none_or(|e| e != "svg") {
            return Err(Invalid(format!(
                "--plot {}: the plot is SVG; give a file name ending in .svg",
                p.display()
            ))
            .into());
        }
    }
    let mut target =
        engine::check_target(&args.target, size, args.rw, &block_sizes, args.destructive)?;
    if target.missing {
        engine::create(&target)?;
        target.missing = false;
    }
    let file = Arc::new(engine::open(&target, args.rw)?);
    catch_sigint()?;

    let total = (block_sizes.len() * depths.len()) as u64;
    let step_ms = args.step_time.as_millis() as u64;
    let bar = if show_progress {
        let b = indicatif::ProgressBar::new(total * step_ms);
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{bar:30}] {msg} (eta {eta})")
                .expect("progress template")
                .progress_chars("=> "),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut steps = Vec::new();
    'outer: for &bs in &block_sizes {
        for &jobs in &depths {
            if interrupted() {
                break 'outer;
            }
            let spec = StepSpec {
                bs,
                jobs,
                rw: args.rw,
                duration: args.step_time,
                ramp: args.ramp,
            };
            let base = steps.len() as u64 * step_ms;
            let m = engine::run_step(&file, &target, spec, &INTERRUPTED, |t, ios| {
                bar.set_position(base + (t.as_millis() as u64).min(step_ms));
                bar.set_message(format!(
                    "{} bs {} x{jobs}: {:.0} IOPS",
                    args.rw,
                    report::bs_label(bs),
                    ios as f64 / t.as_secs_f64().max(1e-3)
                ));
            })?;
            if m.ios == 0 {
                break 'outer; // interrupted before the first IO finished
            }
            steps.push(step_result(bs, jobs, &m));
            if m.interrupted {
                break 'outer;
            }
        }
    }
    bar.finish_and_clear();
    let target_us = args.latency_target.as_secs_f64() * 1e6;
    let knees = report::knees(&steps, target_us);
    Ok(ProbeReport {
        target,
        rw: args.rw,
        engine: ENGINE,
        step_seconds: args.step_time.as_secs_f64(),
        ramp_seconds: args.ramp.as_secs_f64(),
        latency_target_us: target_us,
        interrupted: interrupted(),
        steps,
        knees,
    })
}

fn step_result(bs: u64, jobs: usize, m: &engine::Measured) -> StepResult {
    let q = |x: f64| m.hist.value_at_quantile(x) as f64 / 1000.0;
    let secs = m.seconds.max(1e-9);
    StepResult {
        bs,
        parallelism: jobs,
        seconds: m.seconds,
        ios: m.ios,
        bytes: m.bytes,
        iops: m.ios as f64 / secs,
        mib_s: m.bytes as f64 / secs / (1u64 << 20) as f64,
        latency_us: Latency {
            mean: m.sum_ns as f64 / m.ios.max(1) as f64 / 1000.0,
            min: m
                .buckets
                .0
                .iter()
                .filter(|b| b.calls > 0)
                .map(|b| b.min_ns)
                .min()
                .unwrap_or(0) as f64
                / 1000.0,
            p50: q(0.50),
            p95: q(0.95),
            p99: q(0.99),
            p99_9: q(0.999),
            max: m.buckets.0.iter().map(|b| b.max_ns).max().unwrap_or(0) as f64 / 1000.0,
        },
        interrupted: m.interrupted,
        histogram: m.buckets.rows(),
        buckets: m.buckets.clone(),
    }
}

/// `dbcage probe`: measure, then print (text or JSON), plot if asked.
pub fn probe_command(args: &ProbeArgs, out: &mut impl Write) -> Result<()> {
    let show = !args.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let r = measure(args, show)?;
    if let Some(p) = &args.plot {
        plot::draw(p, &r).with_context(|| format!("drawing {}", p.display()))?;
    }
    if args.json {
        serde_json::to_writer_pretty(&mut *out, &r)?;
        writeln!(out)?;
        return Ok(());
    }
    print_text(&r, args.histogram, out)?;
    if let Some(p) = &args.plot {
        writeln!(out, "plot: {}", p.display())?;
    }
    Ok(())
}

pub fn print_text(r: &ProbeReport, histogram: bool, out: &mut impl Write) -> Result<()> {
    let t = &r.target;
    if let Some(w) = &t.cache_warning {
        eprintln!("warning: {w}");
    }
    writeln!(
        out,
        "{}: {}, {} used, logical block {}B; {}, {:.1}s per step, engine: {}",
        t.path.display(),
        match t.kind {
            Kind::BlockDevice => "block device",
            Kind::File => "file",
        },
        crate::units::HumanBytes(t.size),
        t.logical_block_size,
        r.rw,
        r.step_seconds,
        r.engine
    )?;
    writeln!(out, "{}", report::step_header())?;
    for s in &r.steps {
        writeln!(out, "{}", report::step_line(s, r.latency_target_us))?;
    }
    if histogram {
        for s in &r.steps {
            writeln!(
                out,
                "\nbs {}, {} job{} ({} IOs in {:.1}s):",
                report::bs_label(s.bs),
                s.parallelism,
                if s.parallelism == 1 { "" } else { "s" },
                s.ios,
                s.seconds
            )?;
            write!(out, "{}", report::histogram_table(&s.buckets))?;
        }
        writeln!(out)?;
    }
    for k in &r.knees {
        writeln!(out, "{}", report::knee_line(k, r.latency_target_us))?;
    }
    if r.interrupted {
        writeln!(
            out,
            "interrupted: {} measured before Ctrl-C",
            crate::units::count(r.steps.len(), "step", "steps")
        )?;
    }
    Ok(())
}
