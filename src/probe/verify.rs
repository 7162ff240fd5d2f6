//! `dbcage verify TENANT`: each configured IO limit of a tenant checked by a probe that runs
//! inside the tenant's `limited` leaf, against the device the limit is on.
//!
//! The probe is this binary started through `dbcage exec TENANT -- dbcage probe ...`, so it
//! joins the leaf in every hierarchy exactly as `exec` puts a database there (the groups and
//! limits are created first if missing; no other process is moved). Reads go to the whole
//! device the plan limits (read-only); writes only to a file the user names with `--write`,
//! which must be on that device. Per limit the probe is shaped so that this limit, and not
//! another one, binds: bytes/s with 64k–1m sequential reads (larger blocks when an IOPS limit
//! is also set), IOPS with 4k random reads.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::{parse_tolerance, report, Invalid, Rw};
use crate::kernel::DevNum;
use crate::units::HumanBytes;

#[derive(Debug, Clone, clap::Args)]
pub struct VerifyArgs {
    /// The tenant whose limits are checked.
    pub tenant: String,
    /// How far the achieved rate may be from the configured one.
    #[arg(long, default_value = "10%")]
    pub tolerance: String,
    /// Duration of each measurement.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub step_time: Duration,
    /// Warm-up before each measurement, not counted (a throttle lets a burst through when a
    /// group starts doing IO).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub ramp: Duration,
    /// Parallelism of each measurement (threads).
    #[arg(long, default_value_t = 4)]
    pub parallelism: usize,
    /// Also check write limits by writing this file (on the tenant's storage; created at
    /// --write-size if missing, before the probe joins the tenant).
    #[arg(long)]
    pub write: Option<PathBuf>,
    /// Size of the --write file when it has to be created (50MiB, 1GiB).
    #[arg(long, default_value = "256MiB")]
    pub write_size: String,
    /// Print each limit's configured and achieved value as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    ReadBps,
    ReadIops,
    WriteBps,
    WriteIops,
}

impl LimitKind {
    fn name(self) -> &'static str {
        match self {
            LimitKind::ReadBps => "read_bps",
            LimitKind::ReadIops => "read_iops",
            LimitKind::WriteBps => "write_bps",
            LimitKind::WriteIops => "write_iops",
        }
    }
    fn bytes(self) -> bool {
        matches!(self, LimitKind::ReadBps | LimitKind::WriteBps)
    }
}

/// One planned measurement.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub device: String,
    pub name: String,
    pub limit: LimitKind,
    /// The configured per-device value (bytes/s or IO/s) from the plan.
    pub configured: u64,
    /// What should bind: the configured value, or lower if another limit on the same device
    /// binds first at this block size.
    pub expected: f64,
    pub target: PathBuf,
    pub rw: Rw,
    pub bs: u64,
    pub parallelism: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    #[serde(flatten)]
    pub check: Check,
    pub achieved: Option<f64>,
    /// (achieved - expected) / expected.
    pub deviation: Option<f64>,
    pub pass: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Largest power of two at most `v` (1 for 0).
fn pow2_floor(v: u64) -> u64 {
    if v == 0 {
        1
    } else {
        1 << (63 - v.leading_zeros())
    }
}

/// Block size for a bytes/s check: about 64 IOs per second between 64k and 1m, and large enough
/// that an IOPS limit on the same device stays at most half used.
pub fn bps_block_size(bps: u64, iops: Option<u64>) -> u64 {
    let mut bs = pow2_floor(bps / 64).clamp(64 << 10, 1 << 20);
    if let Some(iops) = iops {
        while bs.saturating_mul(iops) < bps.saturating_mul(2) && bs < 64 << 20 {
            bs *= 2;
        }
    }
    bs
}

/// The checks for one device's limits.
pub fn plan_checks(
    dev: DevNum,
    name: &str,
    limits: &crate::policy::IoLimits,
    lbs: u64,
    parallelism: usize,
    write_file: Option<&Path>,
) -> (Vec<Check>, Vec<String>) {
    let mut checks = Vec::new();
    let mut skipped = Vec::new();
    let small = lbs.max(4096);
    let device_path = PathBuf::from(format!("/dev/{name}"));
    let mut add = |limit: LimitKind, configured: u64, other: Option<u64>, target: &Path| {
        let (rw, bs) = match limit {
            LimitKind::ReadBps => (Rw::Read, bps_block_size(configured, other)),
            LimitKind::WriteBps => (Rw::Write, bps_block_size(configured, other)),
            LimitKind::ReadIops => (Rw::Randread, small),
            LimitKind::WriteIops => (Rw::Randwrite, small),
        };
        let mut expected = configured as f64;
        let mut note = None;
        if !limit.bytes() {
            if let Some(bps) = other {
                let cap = bps as f64 / bs as f64;
                if cap < expected {
                    note = Some(format!(
                        "the {}/s bytes limit binds first at {} IOs: expecting {cap:.0} IO/s",
                        HumanBytes(bps),
                        report::bs_label(bs)
                    ));
                    expected = cap;
                }
            }
        }
        checks.push(Check {
            device: dev.to_string(),
            name: name.to_string(),
            limit,
            configured,
            expected,
            target: target.to_path_buf(),
            rw,
            bs,
            parallelism,
            note,
        });
    };
    if let Some(v) = limits.read_bps {
        add(LimitKind::ReadBps, v, limits.read_iops, &device_path);
    }
    if let Some(v) = limits.read_iops {
        add(LimitKind::ReadIops, v, limits.read_bps, &device_path);
    }
    for (kind, v, other) in [
        (LimitKind::WriteBps, limits.write_bps, limits.write_iops),
        (LimitKind::WriteIops, limits.write_iops, limits.write_bps),
    ] {
        let Some(v) = v else { continue };
        match write_file {
            Some(f) => add(kind, v, other, f),
            None => skipped.push(format!(
                "{name} ({dev}) {}: not checked; give --write FILE with a file on {name} (writes are never made to the device itself)",
                kind.name()
            )),
        }
    }
    (checks, skipped)
}

#[derive(Serialize)]
struct Report<'a> {
    tenant: &'a str,
    tolerance: f64,
    step_seconds: f64,
    ramp_seconds: f64,
    checks: &'a [Outcome],
    not_checked: &'a [String],
    interrupted: bool,
}

pub fn verify_command(
    config: &crate::policy::PolicyPath,
    args: &VerifyArgs,
    out: &mut impl Write,
) -> Result<()> {
    let tolerance = parse_tolerance(&args.tolerance)?;
    if args.parallelism == 0 || args.parallelism > 256 {
        return Err(Invalid(format!("--parallelism {}: give 1 to 256", args.parallelism)).into());
    }
    let ctx = crate::engine::prepare(config)?;
    let policy = &ctx.loaded.policy;
    let Some(ti) = policy.tenants.iter().position(|t| t.name == args.tenant) else {
        return Err(Invalid(format!(
            "no tenant named `{}` in {}",
            args.tenant,
            config.display()
        ))
        .into());
    };
    let plan = crate::engine::plan(&ctx, &crate::engine::Adjustments::default())?;
    let io: BTreeMap<DevNum, crate::policy::IoLimits> = plan
        .tenants
        .iter()
        .find(|t| t.name == args.tenant)
        .map(|t| t.settings.io.clone())
        .unwrap_or_default();
    let io: BTreeMap<_, _> = io.into_iter().filter(|(_, l)| !l.is_empty()).collect();
    if io.is_empty() {
        return Err(Invalid(format!(
            "tenant `{}` has no IO limits on any device; nothing to verify",
            args.tenant
        ))
        .into());
    }
    let names: BTreeMap<DevNum, String> = ctx.inventory.tenants[ti]
        .devices
        .iter()
        .map(|d| (d.devnum, d.name.clone()))
        .collect();

    // The write file: on one of the tenant's limited devices, created now (outside the tenant).
    let mut write_dev = None;
    if let Some(f) = &args.write {
        let size = crate::units::parse_bytes(&args.write_size)
            .map_err(|e| Invalid(format!("--write-size: {e}")))?;
        // An existing file is used at its length; a missing one is created at --write-size.
        let size = (!f.exists()).then_some(size);
        let t = super::engine::check_target(f, size, Rw::Write, &[4096], false)?;
        if t.kind != super::engine::Kind::File {
            return Err(Invalid(format!(
                "--write {}: give a file on the tenant's storage, not a device",
                f.display()
            ))
            .into());
        }
        let dir_or_file = if t.missing {
            f.parent().map(Path::to_path_buf).unwrap_or_default()
        } else {
            f.clone()
        };
        let dev = DevNum::from_dev_t(std::fs::metadata(&dir_or_file)?.dev());
        let whole =
            crate::inventory::devices::devices_for(&ctx.fs, dev, policy.tenants[ti].storage_level)
                .unwrap_or_default();
        let Some(d) = whole.iter().find(|d| io.contains_key(&d.devnum)) else {
            return Err(Invalid(format!(
                "--write {} is on device {dev}, which is not among tenant `{}`'s limited devices ({})",
                f.display(),
                args.tenant,
                io.keys().map(|d| format!("{} ({d})", names.get(d).map(String::as_str).unwrap_or("?"))).collect::<Vec<_>>().join(", ")
            ))
            .into());
        };
        if t.missing {
            super::engine::create(&t)?;
        }
        write_dev = Some(d.devnum);
    }

    let mut checks = Vec::new();
    let mut skipped = Vec::new();
    for (dev, limits) in &io {
        let name = names
            .get(dev)
            .cloned()
            .or_else(|| super::engine::device_name(Path::new("/sys"), *dev))
            .unwrap_or_else(|| dev.to_string());
        let lbs = super::engine::logical_block_size(Path::new("/sys"), *dev).unwrap_or(512);
        let wf = args.write.as_deref().filter(|_| write_dev == Some(*dev));
        let (c, s) = plan_checks(*dev, &name, limits, lbs, args.parallelism, wf);
        checks.extend(c);
        skipped.extend(s);
    }

    super::catch_sigint()?;
    let exe = std::env::current_exe().context("finding the dbcage binary")?;
    let mut outcomes = Vec::new();
    for c in checks {
        if super::interrupted() {
            break;
        }
        if !args.json {
            eprintln!(
                "measuring {} {} on {}: {} bs {} x{} for {}s after {}s of warm-up",
                c.name,
                c.limit.name(),
                c.target.display(),
                c.rw,
                report::bs_label(c.bs),
                c.parallelism,
                args.step_time.as_secs_f64(),
                args.ramp.as_secs_f64()
            );
        }
        let mut exec = Command::new(&exe);
        if config.trust == crate::policy::FileTrust::Any {
            exec.arg("--allow-insecure-policy");
        }
        let output = exec
            .arg("-c")
            .arg(&config.path)
            .arg("exec")
            .arg(&args.tenant)
            .arg("--")
            .arg(&exe)
            .arg("probe")
            .arg(&c.target)
            .args(["--rw", &c.rw.to_string()])
            .args(["--bs", &c.bs.to_string()])
            .args(["--jobs", &c.parallelism.to_string()])
            .args(["--step-time", &format!("{}ms", args.step_time.as_millis())])
            .args(["--ramp", &format!("{}ms", args.ramp.as_millis())])
            .arg("--json")
            .output()
            .context("starting the probe inside the tenant")?;
        let parsed = if output.status.success() {
            serde_json::from_slice::<serde_json::Value>(&output.stdout)
                .map_err(|e| format!("unreadable probe output ({e})"))
        } else {
            Err(format!(
                "the probe failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        };
        let achieved = parsed.as_ref().ok().and_then(|v| {
            let s = v["steps"].as_array()?.first()?;
            if c.limit.bytes() {
                Some(s["bytes"].as_f64()? / s["seconds"].as_f64()?)
            } else {
                s["iops"].as_f64()
            }
        });
        let deviation = achieved.map(|a| (a - c.expected) / c.expected);
        outcomes.push(Outcome {
            achieved,
            deviation,
            pass: deviation.map(|d| d.abs() <= tolerance),
            error: match (&parsed, achieved) {
                (Err(e), _) => Some(e.clone()),
                (Ok(_), None) => Some("the probe measured nothing (interrupted?)".into()),
                _ => None,
            },
            check: c,
        });
    }
    let interrupted = super::interrupted();
    if args.json {
        serde_json::to_writer_pretty(
            &mut *out,
            &Report {
                tenant: &args.tenant,
                tolerance,
                step_seconds: args.step_time.as_secs_f64(),
                ramp_seconds: args.ramp.as_secs_f64(),
                checks: &outcomes,
                not_checked: &skipped,
                interrupted,
            },
        )?;
        writeln!(out)?;
    } else {
        print_table(out, &args.tenant, tolerance, &outcomes, &skipped)?;
        if interrupted {
            writeln!(
                out,
                "interrupted: the checks above were measured before Ctrl-C"
            )?;
        }
    }
    let failed = outcomes.iter().filter(|o| o.pass != Some(true)).count();
    if failed > 0 {
        out.flush()?;
        bail!(
            "{failed} of {} limits of tenant `{}` are not within ±{:.0}% of what was measured",
            outcomes.len(),
            args.tenant,
            tolerance * 100.0
        );
    }
    Ok(())
}

fn rate(kind: LimitKind, v: f64) -> String {
    if kind.bytes() {
        format!("{:.2}MiB/s", v / (1u64 << 20) as f64)
    } else {
        format!("{v:.0} IO/s")
    }
}

fn print_table(
    out: &mut impl Write,
    tenant: &str,
    tolerance: f64,
    outcomes: &[Outcome],
    skipped: &[String],
) -> Result<()> {
    writeln!(
        out,
        "tenant {tenant}: limits measured inside its limited group (tolerance ±{:.0}%)",
        tolerance * 100.0
    )?;
    writeln!(
        out,
        "{:<16} {:<10} {:>13} {:>13} {:>7}  {:<6} probe",
        "device", "limit", "configured", "achieved", "diff", "result"
    )?;
    for o in outcomes {
        let c = &o.check;
        writeln!(
            out,
            "{:<16} {:<10} {:>13} {:>13} {:>7}  {:<6} {} bs {} x{}{}",
            format!("{} ({})", c.name, c.device),
            c.limit.name(),
            rate(c.limit, c.configured as f64),
            o.achieved
                .map(|a| rate(c.limit, a))
                .unwrap_or_else(|| "-".into()),
            o.deviation
                .map(|d| format!("{:+.1}%", d * 100.0))
                .unwrap_or_else(|| "-".into()),
            match o.pass {
                Some(true) => "pass",
                Some(false) => "FAIL",
                None => "error",
            },
            c.rw,
            report::bs_label(c.bs),
            c.parallelism,
            c.note
                .as_ref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default(),
        )?;
        if let Some(e) = &o.error {
            writeln!(out, "  error: {e}")?;
        }
    }
    for s in skipped {
        writeln!(out, "{s}")?;
    }
    Ok(())
}
