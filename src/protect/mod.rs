//! The protection guard (`[tenant.io] protect_pressure`, `protect_window`, `protect_donors`,
//! `protect_lever`): when a protected tenant's tasks stall on IO for more than
//! `protect_pressure` of `protect_window`, the daemon lowers the io.weight (or, with
//! `protect_lever = "caps"`, the IO caps) of the donor tenants, step by step, and puts it back
//! once the pressure has stayed low (seed 001: protection instead of caps). The same keys in
//! `[tenant.cpu]` watch the tenant's cpu pressure (its tasks waiting for a cpu) and lower the
//! donors' cpu.weight the same way: a tenant may have both guards, each its own watch.
//!
//! It is event-driven: for each protected tenant it holds a PSI trigger on the tenant group's
//! `io.pressure` (or `cpu.pressure`) (Documentation/accounting/psi.rst: write
//! `some STALL_US WINDOW_US` to the open
//! file, then poll it for POLLPRI); the kernel wakes the daemon's poll at most once per window
//! while the stall exceeds the threshold. Each wake-up while below `MAX_STEPS` halves the donors'
//! weights once more (never below 1, never more often than once per window). Restoring uses the
//! file's running `total` (µs stalled): once the stall share over each tick has stayed under half
//! the threshold for `QUIET_WINDOWS` windows, all donors go back to their configured weight in
//! one write each. The halving and the hysteresis keep the writes few: at most `MAX_STEPS` per
//! episode and one restore. Lowered caps take the pressure away while the flood goes on, so with
//! that lever a quiet tick counts only when no donor uses 3/4 or more of a lowered cap (its
//! io.stat over the tick): the caps come back when the flood ends, not when they worked. A
//! lowered cpu.weight relieves the protected tenant the same way, so a cpu guard's quiet tick
//! also needs every donor under 3/4 of the cpu it used over the first tick after the lowering,
//! and a lowered io.weight (where iocost honours it) the same with the donor's IO requests.
//!
//! The weights are an adjustment the daemon lays over the policy when it plans
//! (`engine::Adjustments::weights`, `caps`, `cpu_weights`), as the replication guard's raises
//! are; the policy is never
//! edited. It needs cgroup v2 with PSI; where it cannot arm a trigger it says why, once, and
//! the rest of the daemon goes on. It never kills anything.

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::cgroup::stats::parse_pressure;
use crate::cgroup::stats::IoCounters;
use crate::cgroup::{Layout, Version};
use crate::policy::{GuardLever, IoLimits, Policy, PressureGuard, Resource};

/// Halvings at most: a donor keeps at least an eighth of its weight.
pub const MAX_STEPS: u32 = 3;
/// Windows of low pressure before the donors' weights are restored.
pub const QUIET_WINDOWS: u32 = 5;
/// How often pressure is read while donors are lowered (to restore them).
pub const TICK: Duration = Duration::from_millis(500);
/// How long after a failed trigger the guard tries again (the group may not exist yet).
const RETRY: Duration = Duration::from_secs(5);
/// A donor using this share of a lowered cap still presses on it (the flood goes on).
const BUSY_SHARE: f64 = 0.75;

/// The pure state of one protected tenant's guard.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Episode {
    /// Halvings in force (0: donors at their configured weight).
    pub steps: u32,
    last_step: Option<Instant>,
    quiet_since: Option<Instant>,
    last_total: Option<(Instant, f64)>,
}

impl Episode {
    /// The trigger fired at `now`: one more step, unless at `MAX_STEPS` or within a window of
    /// the last one. Returns whether the weights change.
    pub fn fired(&mut self, now: Instant, window: Duration) -> bool {
        self.quiet_since = None;
        if self.steps >= MAX_STEPS
            || self
                .last_step
                .is_some_and(|t| now.saturating_duration_since(t) < window)
        {
            return false;
        }
        self.steps += 1;
        self.last_step = Some(now);
        true
    }

    /// A reading of the group's stall total (seconds) at `now`, while lowered. Returns whether
    /// the weights are restored (the stall share stayed under half the threshold for
    /// `QUIET_WINDOWS` windows).
    /// `donors_busy`: a donor still uses most of a lowered cap (the tick is not quiet).
    pub fn observe(
        &mut self,
        now: Instant,
        total_seconds: f64,
        g: &PressureGuard,
        donors_busy: bool,
    ) -> bool {
        let prev = self.last_total.replace((now, total_seconds));
        if self.steps == 0 {
            return false;
        }
        if donors_busy {
            self.quiet_since = None;
            return false;
        }
        let Some((t0, s0)) = prev else {
            return false;
        };
        let dt = now.saturating_duration_since(t0).as_secs_f64();
        if dt <= 0.0 {
            return false;
        }
        let share = (total_seconds - s0).max(0.0) / dt;
        if share >= g.pressure / 2.0 {
            self.quiet_since = None;
            return false;
        }
        let since = *self.quiet_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= g.window * QUIET_WINDOWS {
            *self = Episode::default();
            return true;
        }
        false
    }
}

/// A donor's weight after `steps` halvings of its configured weight (at least 1).
pub fn lowered(base: u32, steps: u32) -> u32 {
    (base >> steps.min(31)).max(1)
}

/// A donor's IO caps after `steps` halvings of its configured ones (each at least 1).
pub fn lowered_caps(base: &IoLimits, steps: u32) -> IoLimits {
    let half = |v: Option<u64>| v.map(|v| (v >> steps.min(63)).max(1));
    IoLimits {
        read_bps: half(base.read_bps),
        write_bps: half(base.write_bps),
        read_iops: half(base.read_iops),
        write_iops: half(base.write_iops),
    }
}

/// The configured IO caps (instance totals) of a tenant.
fn base_caps(policy: &Policy, tenant: &str) -> IoLimits {
    policy
        .tenants
        .iter()
        .find(|t| t.name == tenant)
        .map(|t| t.io)
        .unwrap_or_default()
}

/// `read_iops 500, write_bps 50MiB/s`: the caps that are set.
pub fn caps_text(l: &IoLimits) -> String {
    let mut out = Vec::new();
    if let Some(v) = l.read_bps {
        out.push(format!("read_bps {}/s", crate::units::HumanBytes(v)));
    }
    if let Some(v) = l.write_bps {
        out.push(format!("write_bps {}/s", crate::units::HumanBytes(v)));
    }
    if let Some(v) = l.read_iops {
        out.push(format!("read_iops {v}"));
    }
    if let Some(v) = l.write_iops {
        out.push(format!("write_iops {v}"));
    }
    out.join(", ")
}

/// Whether a donor's use over `dt` (the counters' growth) reaches `BUSY_SHARE` of a lowered cap.
fn presses_on(caps: &IoLimits, grown: &IoCounters, dt: f64) -> bool {
    let near = |cap: Option<u64>, done: u64| {
        cap.is_some_and(|c| done as f64 / dt >= BUSY_SHARE * c as f64)
    };
    near(caps.read_bps, grown.read_bytes)
        || near(caps.write_bps, grown.write_bytes)
        || near(caps.read_iops, grown.read_ios)
        || near(caps.write_iops, grown.write_ios)
}

/// Whether some donor's rate is still `BUSY_SHARE` of its reference (and above `idle`: an idle
/// donor never holds the guard).
fn still_busy(reference: &[f64], now: &[f64], idle: f64) -> bool {
    reference
        .iter()
        .zip(now)
        .any(|(r, n)| *r > idle && *n >= BUSY_SHARE * r)
}

/// A group's cpu time in seconds (its cpu.stat, read by the v2 driver's parser).
fn cpu_seconds(stat: &Path) -> Option<f64> {
    let text = crate::hostfs::read_text(stat).ok()?;
    crate::cgroup::v2::parse_v2_cpu_stat(&text).usage_seconds
}

/// A group's IO requests (reads and writes, all devices) so far.
fn io_requests(stat: &Path) -> Option<f64> {
    io_totals(stat).map(|c| (c.read_ios + c.write_ios) as f64)
}

/// What a donor's rate is measured in while a lowered weight is held: cpu seconds (a cpu guard,
/// idle under a hundredth of a cpu) or IO requests (the io.weight lever, idle under one a
/// second).
#[derive(Clone, Copy)]
enum Usage {
    Cpu,
    IoRequests,
}

impl Usage {
    fn read(self, stat: &Path) -> Option<f64> {
        match self {
            Usage::Cpu => cpu_seconds(stat),
            Usage::IoRequests => io_requests(stat),
        }
    }
    fn idle(self) -> f64 {
        match self {
            Usage::Cpu => 0.01,
            Usage::IoRequests => 1.0,
        }
    }
}

/// A group's io.stat summed over its devices.
fn io_totals(stat: &Path) -> Option<IoCounters> {
    let text = crate::hostfs::read_text(stat).ok()?;
    let mut sum = IoCounters::default();
    for c in crate::cgroup::v2::parse_v2_io_stat(&text).values() {
        sum.read_bytes += c.read_bytes;
        sum.write_bytes += c.write_bytes;
        sum.read_ios += c.read_ios;
        sum.write_ios += c.write_ios;
    }
    Some(sum)
}

/// What a donor has after some halvings of its configured io.weight, IO caps or cpu.weight.
enum Level {
    Weight(u32),
    Caps(IoLimits),
    CpuWeight(u32),
}

impl Level {
    fn of(policy: &Policy, g: &PressureGuard, donor: &str, steps: u32) -> Level {
        match (g.resource, g.lever) {
            (Resource::Cpu, _) => Level::CpuWeight(lowered(base_cpu_weight(policy, donor), steps)),
            (Resource::Io, GuardLever::Weight) => {
                Level::Weight(lowered(base_weight(policy, donor), steps))
            }
            (Resource::Io, GuardLever::Caps) => {
                Level::Caps(lowered_caps(&base_caps(policy, donor), steps))
            }
        }
    }

    /// `50` or `read_iops 1000`, for the log.
    fn text(&self) -> String {
        match self {
            Level::Weight(w) | Level::CpuWeight(w) => w.to_string(),
            Level::Caps(c) => caps_text(c),
        }
    }
}

/// What the guards hold lowered, per donor the lowest any asks for.
#[derive(Default, PartialEq)]
struct Held {
    weights: BTreeMap<String, u32>,
    caps: BTreeMap<String, IoLimits>,
    cpu_weights: BTreeMap<String, u32>,
}

/// What a guard lowers: `io.weight`, `io caps`, `cpu.weight`.
fn lever_name(g: &PressureGuard) -> &'static str {
    match (g.resource, g.lever) {
        (Resource::Cpu, _) => "cpu.weight",
        (Resource::Io, GuardLever::Weight) => "io.weight",
        (Resource::Io, GuardLever::Caps) => "io caps",
    }
}

/// The configured cpu.weight of a tenant (the kernel's 100 when none).
fn base_cpu_weight(policy: &Policy, tenant: &str) -> u32 {
    policy
        .tenants
        .iter()
        .find(|t| t.name == tenant)
        .and_then(|t| t.cpu.weight)
        .unwrap_or(100)
}

/// The configured io.weight of a tenant (the kernel's 100 when none).
fn base_weight(policy: &Policy, tenant: &str) -> u32 {
    policy
        .tenants
        .iter()
        .find(|t| t.name == tenant)
        .and_then(|t| t.io_weight.as_ref())
        .map(|w| w.value)
        .unwrap_or(crate::cgroup::v2::DEFAULT_IO_WEIGHT)
}

/// What `status` and the metrics read about one protected tenant's guard.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GuardState {
    /// The pressure watched: io (`[tenant.io] protect_*`) or cpu (`[tenant.cpu]`).
    #[serde(default)]
    pub resource: Resource,
    /// The trigger is set on the tenant's io.pressure (cpu.pressure).
    pub armed: bool,
    /// Halvings in force (0: the donors have their configured weight).
    pub step: u32,
    /// Each donor's io.weight (cpu.weight for a cpu guard) while lowered (lever `weight`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lowered: BTreeMap<String, u32>,
    /// What the guard lowers.
    #[serde(default)]
    pub lever: GuardLever,
    /// Each donor's IO caps while lowered (lever `caps`), as `caps_text` writes them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capped: BTreeMap<String, String>,
    /// Lowering and restoring writes since the daemon started.
    pub lowerings: u64,
    pub restores: u64,
}

/// Where the daemon publishes each protected tenant's `GuardState`s (one per resource
/// watched): `/run/dbcage/<root>.protect.json`.
pub fn published_path(root_name: &str) -> PathBuf {
    crate::rundir::state_path(root_name, "protect")
}

/// Each protected tenant's guards' states, if a running daemon published them.
pub fn read_published(root_name: &str) -> Option<BTreeMap<String, Vec<GuardState>>> {
    crate::rundir::read_owned(&published_path(root_name))
}

/// Removes the published state (the daemon stops).
pub fn unpublish(root_name: &str) {
    let _ = std::fs::remove_file(published_path(root_name));
}

/// A guard's watch: the protected tenant and the resource whose pressure it watches.
pub type Key = (String, Resource);

struct Watch {
    config: PressureGuard,
    lowerings: u64,
    restores: u64,
    pressure_file: PathBuf,
    /// The donors' io.stat files (an io guard: whether they still press on their caps, or
    /// still flood under a lowered io.weight), or their cpu.stat files (a cpu guard: whether
    /// they still spin).
    donor_stats: Vec<(String, PathBuf)>,
    /// A lowered weight (cpu, or io): the donors' usage (`Usage`) at the last tick, and their
    /// rates over the first tick after the lowering, what "still busy" is measured against.
    donor_usage: Option<(Instant, Vec<Option<f64>>)>,
    donor_usage_ref: Option<Vec<f64>>,
    /// The donors' io.stat sums at the last tick.
    donor_last: Option<(Instant, Vec<Option<IoCounters>>)>,
    trigger: Option<File>,
    failed_at: Option<Instant>,
    episode: Episode,
}

impl Watch {
    fn new(
        config: PressureGuard,
        pressure_file: PathBuf,
        donor_stats: Vec<(String, PathBuf)>,
    ) -> Self {
        Watch {
            config,
            pressure_file,
            donor_stats,
            donor_last: None,
            donor_usage: None,
            donor_usage_ref: None,
            trigger: None,
            failed_at: None,
            episode: Episode::default(),
            lowerings: 0,
            restores: 0,
        }
    }

    /// A lowered weight: whether some donor still uses `BUSY_SHARE` of the cpu (or IO
    /// requests) it used over the first tick after the lowering (the hogs or the flood go on: a
    /// lowered weight relieves the protected tenant while they do, and restoring then would only
    /// lower it again). The first two ticks after a lowering only take the counters and the
    /// reference, and count as busy.
    fn donors_busy(&mut self, usage: Usage, now: Instant) -> bool {
        let used: Vec<Option<f64>> = self
            .donor_stats
            .iter()
            .map(|(_, p)| usage.read(p))
            .collect();
        let Some((dt, before)) = since_last(&mut self.donor_usage, now, &used) else {
            return true;
        };
        let rates: Vec<f64> = before
            .iter()
            .zip(&used)
            .map(|(b, a)| match (b, a) {
                (Some(b), Some(a)) => (a - b).max(0.0) / dt,
                _ => 0.0,
            })
            .collect();
        match &self.donor_usage_ref {
            None => {
                self.donor_usage_ref = Some(rates);
                true
            }
            Some(reference) => still_busy(reference, &rates, usage.idle()),
        }
    }

    /// Whether some donor used `BUSY_SHARE` of a lowered cap since the last tick (the first
    /// tick after a lowering only takes the counters, and counts as busy).
    fn donors_press(&mut self, policy: &Policy, now: Instant) -> bool {
        let sums: Vec<Option<IoCounters>> =
            self.donor_stats.iter().map(|(_, p)| io_totals(p)).collect();
        let Some((dt, before)) = since_last(&mut self.donor_last, now, &sums) else {
            return true;
        };
        self.donor_stats
            .iter()
            .zip(before.iter().zip(&sums))
            .any(|((donor, _), (b, a))| {
                let (Some(b), Some(a)) = (b, a) else {
                    return false;
                };
                let grown = IoCounters {
                    read_bytes: a.read_bytes.saturating_sub(b.read_bytes),
                    write_bytes: a.write_bytes.saturating_sub(b.write_bytes),
                    read_ios: a.read_ios.saturating_sub(b.read_ios),
                    write_ios: a.write_ios.saturating_sub(b.write_ios),
                };
                let caps = lowered_caps(&base_caps(policy, donor), self.episode.steps);
                presses_on(&caps, &grown, dt)
            })
    }
}

/// Keeps `fresh` as the donors' last reading and returns the one before it with the seconds
/// between the two; `None` for a first reading (or when no time passed).
fn since_last<T: Clone>(
    last: &mut Option<(Instant, Vec<T>)>,
    now: Instant,
    fresh: &[T],
) -> Option<(f64, Vec<T>)> {
    let (t0, before) = last.replace((now, fresh.to_vec()))?;
    let dt = now.saturating_duration_since(t0).as_secs_f64();
    (dt > 0.0).then_some((dt, before))
}

/// The guards of all protected tenants, kept in step with the policy by `sync`.
#[derive(Default)]
pub struct Guard {
    watches: BTreeMap<Key, Watch>,
}
/// Opens the PSI trigger: `some STALL_US WINDOW_US` written to the pressure file, kept open.
pub fn arm_trigger(path: &Path, g: &PressureGuard) -> std::io::Result<File> {
    let window_us = g.window.as_micros() as u64;
    let stall_us = ((window_us as f64 * g.pressure) as u64).max(1);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    f.write_all(format!("some {stall_us} {window_us}").as_bytes())?;
    Ok(f)
}

impl Guard {
    /// Follows the policy: a watch per tenant and resource with `protect_pressure` on cgroup v2;
    /// triggers are armed (or re-armed after `RETRY`) here. A watch whose tenant left the policy
    /// is dropped, and its donors go back to their configured weight with the next plan.
    pub fn sync(&mut self, policy: &Policy, layout: &Layout, now: Instant) -> bool {
        let hv = layout
            .setup
            .hierarchies
            .iter()
            .position(|h| h.version == Version::V2);
        let before = self.held(policy);
        let wanted: BTreeMap<Key, &PressureGuard> = policy
            .tenants
            .iter()
            .flat_map(|t| t.io_guard.iter().chain(&t.cpu_guard).map(move |g| (t, g)))
            .map(|(t, g)| ((t.name.clone(), g.resource), g))
            .collect();
        self.watches
            .retain(|key, w| wanted.get(key).is_some_and(|g| **g == w.config));
        for ((name, resource), g) in wanted {
            let name = name.as_str();
            let r = resource.name();
            let (file, stat_file) = match resource {
                Resource::Io => (crate::cgroup::v2::IO_PRESSURE, "io.stat"),
                Resource::Cpu => (crate::cgroup::v2::CPU_PRESSURE, "cpu.stat"),
            };
            let w = self
                .watches
                .entry((name.to_string(), resource))
                .or_insert_with(|| {
                    let pressure_file = hv
                        .map(|h| layout.tenant_dir(h, name).join(file))
                        .unwrap_or_default();
                    let donor_stats = g
                        .donors
                        .iter()
                        .map(|d| {
                            let stat = hv
                                .map(|h| layout.tenant_dir(h, &d.value).join(stat_file))
                                .unwrap_or_default();
                            (d.value.clone(), stat)
                        })
                        .collect();
                    Watch::new(g.clone(), pressure_file, donor_stats)
                });
            if w.trigger.is_some()
                || w.failed_at
                    .is_some_and(|t| now.saturating_duration_since(t) < RETRY)
            {
                continue;
            }
            if hv.is_none() {
                if w.failed_at.is_none() {
                    warn!(tenant = name, "{r}.protect_pressure has no effect: the {r} controller is not on cgroup v2 here, which alone keeps {r} pressure per group");
                }
                w.failed_at = Some(now);
                continue;
            }
            match arm_trigger(&w.pressure_file, g) {
                Ok(f) => {
                    info!(
                        tenant = name,
                        "protection guard armed: {r} pressure above {:.0}% of {} lowers the {} of {}",
                        g.pressure * 100.0,
                        humantime::format_duration(g.window),
                        lever_name(g),
                        donors(g)
                    );
                    w.trigger = Some(f);
                }
                Err(e) => {
                    if w.failed_at.is_none() {
                        warn!(tenant = name, "protection guard not armed: cannot set a pressure trigger on {}: {e} (the kernel needs PSI: CONFIG_PSI, not booted with psi=0); retrying every {}s", w.pressure_file.display(), RETRY.as_secs());
                    }
                    w.failed_at = Some(now);
                }
            }
        }
        self.held(policy) != before
    }

    /// The armed triggers, to poll for POLLPRI, with their tenant and resource.
    pub fn triggers(&self) -> Vec<(Key, BorrowedFd<'_>)> {
        self.watches
            .iter()
            .filter_map(|(k, w)| Some((k.clone(), w.trigger.as_ref()?.as_fd())))
            .collect()
    }

    /// Whether some donors are lowered (the daemon then ticks every `TICK`).
    pub fn active(&self) -> bool {
        self.watches.values().any(|w| w.episode.steps > 0)
    }

    /// The trigger of `key` (a tenant, a resource) fired. Returns whether the weights change
    /// (and logs why).
    pub fn fired(&mut self, policy: &Policy, key: &Key, now: Instant) -> bool {
        let Some(w) = self.watches.get_mut(key) else {
            return false;
        };
        let (tenant, r) = (key.0.as_str(), key.1.name());
        if !w.episode.fired(now, w.config.window) {
            return false;
        }
        let steps = w.episode.steps;
        w.lowerings += 1;
        let changes: Vec<String> = w
            .config
            .donors
            .iter()
            .map(|d| {
                let level = |n| Level::of(policy, &w.config, &d.value, n).text();
                format!("{} {} -> {}", d.value, level(steps - 1), level(steps))
            })
            .collect();
        info!(
            tenant,
            step = steps,
            "protection guard: {r} pressure of `{tenant}` passed {:.0}% of {}: {} {}",
            w.config.pressure * 100.0,
            humantime::format_duration(w.config.window),
            lever_name(&w.config),
            changes.join(", ")
        );
        true
    }

    /// Reads the pressure of lowered tenants; restores their donors once it stayed low.
    /// Returns whether the weights change.
    pub fn tick(&mut self, policy: &Policy, now: Instant) -> bool {
        let mut changed = false;
        for ((name, resource), w) in &mut self.watches {
            let r = resource.name();
            if w.episode.steps == 0 {
                continue;
            }
            let Some(total) = std::fs::read_to_string(&w.pressure_file)
                .ok()
                .and_then(|t| parse_pressure(&t))
                .map(|p| p.some_total_seconds)
            else {
                continue;
            };
            let busy = match (*resource, w.config.lever) {
                (Resource::Cpu, _) => w.donors_busy(Usage::Cpu, now),
                (Resource::Io, GuardLever::Caps) => w.donors_press(policy, now),
                (Resource::Io, GuardLever::Weight) => w.donors_busy(Usage::IoRequests, now),
            };
            if w.episode.observe(now, total, &w.config, busy) {
                w.restores += 1;
                w.donor_last = None;
                w.donor_usage = None;
                w.donor_usage_ref = None;
                let back: Vec<String> = w
                    .config
                    .donors
                    .iter()
                    .map(|d| {
                        let level = Level::of(policy, &w.config, &d.value, 0);
                        format!("{} {}", d.value, level.text())
                    })
                    .collect();
                info!(
                    tenant = name.as_str(),
                    "protection guard: {r} pressure of `{name}` stayed under {:.0}% for {}: {} restored: {}",
                    w.config.pressure * 50.0,
                    humantime::format_duration(w.config.window * QUIET_WINDOWS),
                    lever_name(&w.config),
                    back.join(", ")
                );
                changed = true;
            }
        }
        changed
    }

    /// The donors' weights and caps in force: per donor the lowest any guard asks for.
    fn held(&self, policy: &Policy) -> Held {
        let mut held = Held::default();
        let lowest = |m: &mut BTreeMap<String, u32>, d: &str, v: u32| {
            let x = m.entry(d.to_string()).or_insert(v);
            *x = (*x).min(v);
        };
        for w in self.watches.values().filter(|w| w.episode.steps > 0) {
            for d in &w.config.donors {
                match Level::of(policy, &w.config, &d.value, w.episode.steps) {
                    Level::Weight(v) => lowest(&mut held.weights, &d.value, v),
                    Level::CpuWeight(v) => lowest(&mut held.cpu_weights, &d.value, v),
                    Level::Caps(v) => {
                        let x = held.caps.entry(d.value.clone()).or_insert(v);
                        *x = x.min_each(&v);
                    }
                }
            }
        }
        held
    }

    /// Lays the guards' lowered weights and caps over the plan's adjustments.
    pub fn adjust(&self, policy: &Policy, adjust: &mut crate::engine::Adjustments) {
        let held = self.held(policy);
        adjust.weights = held.weights;
        adjust.caps = held.caps;
        adjust.cpu_weights = held.cpu_weights;
    }

    /// Per protected tenant: its guards' states (io before cpu), for status and the metrics.
    pub fn state(&self, policy: &Policy) -> BTreeMap<String, Vec<GuardState>> {
        let mut out: BTreeMap<String, Vec<GuardState>> = BTreeMap::new();
        for ((n, resource), w) in &self.watches {
            let steps = w.episode.steps;
            let (mut lowered, mut capped) = (BTreeMap::new(), BTreeMap::new());
            for d in w.config.donors.iter().filter(|_| steps > 0) {
                match Level::of(policy, &w.config, &d.value, steps) {
                    Level::Weight(v) | Level::CpuWeight(v) => {
                        lowered.insert(d.value.clone(), v);
                    }
                    Level::Caps(c) => {
                        capped.insert(d.value.clone(), caps_text(&c));
                    }
                }
            }
            out.entry(n.clone()).or_default().push(GuardState {
                resource: *resource,
                armed: w.trigger.is_some(),
                step: steps,
                lowered,
                lever: w.config.lever,
                capped,
                lowerings: w.lowerings,
                restores: w.restores,
            });
        }
        out
    }

    /// Publishes the state for `status` and the metrics (only while some tenant is protected).
    pub fn publish(&self, policy: &Policy) {
        if self.watches.is_empty() {
            unpublish(&policy.agent.root_name);
        } else {
            crate::rundir::publish_owned(
                &published_path(&policy.agent.root_name),
                &self.state(policy),
            );
        }
    }
}

fn donors(g: &PressureGuard) -> String {
    g.donors
        .iter()
        .map(|d| format!("`{}`", d.value))
        .collect::<Vec<_>>()
        .join(", ")
}
