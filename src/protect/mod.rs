//! The protection guard (`[tenant.io] protect_pressure`, `protect_window`, `protect_donors`):
//! when a protected tenant's tasks stall on IO for more than `protect_pressure` of
//! `protect_window`, the daemon lowers the io.weight of the donor tenants, step by step, and
//! puts it back once the pressure has stayed low (seed 001: protection instead of caps).
//!
//! It is event-driven: for each protected tenant it holds a PSI trigger on the tenant group's
//! `io.pressure` (Documentation/accounting/psi.rst: write `some STALL_US WINDOW_US` to the open
//! file, then poll it for POLLPRI); the kernel wakes the daemon's poll at most once per window
//! while the stall exceeds the threshold. Each wake-up while below `MAX_STEPS` halves the donors'
//! weights once more (never below 1, never more often than once per window). Restoring uses the
//! file's running `total` (µs stalled): once the stall share over each tick has stayed under half
//! the threshold for `QUIET_WINDOWS` windows, all donors go back to their configured weight in
//! one write each. The halving and the hysteresis keep the writes few: at most `MAX_STEPS` per
//! episode and one restore.
//!
//! The weights are an adjustment the daemon lays over the policy when it plans
//! (`engine::Adjustments::weights`), as the replication guard's raises are; the policy is never
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
use crate::cgroup::{Layout, Version};
use crate::policy::{IoGuard, Policy};

/// Halvings at most: a donor keeps at least an eighth of its weight.
pub const MAX_STEPS: u32 = 3;
/// Windows of low pressure before the donors' weights are restored.
pub const QUIET_WINDOWS: u32 = 5;
/// How often pressure is read while donors are lowered (to restore them).
pub const TICK: Duration = Duration::from_millis(500);
/// How long after a failed trigger the guard tries again (the group may not exist yet).
const RETRY: Duration = Duration::from_secs(5);

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
    pub fn observe(&mut self, now: Instant, total_seconds: f64, g: &IoGuard) -> bool {
        let prev = self.last_total.replace((now, total_seconds));
        if self.steps == 0 {
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
    /// The trigger is set on the tenant's io.pressure.
    pub armed: bool,
    /// Halvings in force (0: the donors have their configured weight).
    pub step: u32,
    /// Each donor's io.weight while lowered.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lowered: BTreeMap<String, u32>,
    /// Lowering and restoring writes since the daemon started.
    pub lowerings: u64,
    pub restores: u64,
}

/// Where the daemon publishes each protected tenant's `GuardState`:
/// `/run/dbcage/<root>.protect.json`.
pub fn published_path(root_name: &str) -> PathBuf {
    crate::rundir::state_path(root_name, "protect")
}

/// Each protected tenant's state, if a running daemon published it.
pub fn read_published(root_name: &str) -> Option<BTreeMap<String, GuardState>> {
    crate::rundir::read_owned(&published_path(root_name))
}

/// Removes the published state (the daemon stops).
pub fn unpublish(root_name: &str) {
    let _ = std::fs::remove_file(published_path(root_name));
}

struct Watch {
    config: IoGuard,
    lowerings: u64,
    restores: u64,
    pressure_file: PathBuf,
    trigger: Option<File>,
    failed_at: Option<Instant>,
    episode: Episode,
}

/// The guards of all protected tenants, kept in step with the policy by `sync`.
#[derive(Default)]
pub struct Guard {
    watches: BTreeMap<String, Watch>,
}

/// Opens the PSI trigger: `some STALL_US WINDOW_US` written to the pressure file, kept open.
pub fn arm_trigger(path: &Path, g: &IoGuard) -> std::io::Result<File> {
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
    /// Follows the policy: a watch per tenant with `protect_pressure` on cgroup v2; triggers are
    /// armed (or re-armed after `RETRY`) here. A watch whose tenant left the policy is dropped,
    /// and its donors go back to their configured weight with the next plan.
    pub fn sync(&mut self, policy: &Policy, layout: &Layout, now: Instant) -> bool {
        let hv = layout
            .setup
            .hierarchies
            .iter()
            .position(|h| h.version == Version::V2);
        let before = self.weights(policy);
        let wanted: BTreeMap<&str, &IoGuard> = policy
            .tenants
            .iter()
            .filter_map(|t| Some((t.name.as_str(), t.io_guard.as_ref()?)))
            .collect();
        self.watches
            .retain(|name, w| wanted.get(name.as_str()).is_some_and(|g| **g == w.config));
        for (name, g) in wanted {
            let w = self
                .watches
                .entry(name.to_string())
                .or_insert_with(|| Watch {
                    config: g.clone(),
                    pressure_file: hv
                        .map(|h| {
                            layout
                                .tenant_dir(h, name)
                                .join(crate::cgroup::v2::IO_PRESSURE)
                        })
                        .unwrap_or_default(),
                    trigger: None,
                    failed_at: None,
                    episode: Episode::default(),
                    lowerings: 0,
                    restores: 0,
                });
            if w.trigger.is_some()
                || w.failed_at
                    .is_some_and(|t| now.saturating_duration_since(t) < RETRY)
            {
                continue;
            }
            if hv.is_none() {
                if w.failed_at.is_none() {
                    warn!(tenant = name, "io.protect_pressure has no effect: the io controller is not on cgroup v2 here, which alone keeps io pressure per group");
                }
                w.failed_at = Some(now);
                continue;
            }
            match arm_trigger(&w.pressure_file, g) {
                Ok(f) => {
                    info!(
                        tenant = name,
                        "protection guard armed: io pressure above {:.0}% of {} lowers the io.weight of {}",
                        g.pressure * 100.0,
                        humantime::format_duration(g.window),
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
        self.weights(policy) != before
    }

    /// The armed triggers, to poll for POLLPRI, with their tenant.
    pub fn triggers(&self) -> Vec<(String, BorrowedFd<'_>)> {
        self.watches
            .iter()
            .filter_map(|(n, w)| Some((n.clone(), w.trigger.as_ref()?.as_fd())))
            .collect()
    }

    /// Whether some donors are lowered (the daemon then ticks every `TICK`).
    pub fn active(&self) -> bool {
        self.watches.values().any(|w| w.episode.steps > 0)
    }

    /// A trigger of `tenant` fired. Returns whether the weights change (and logs why).
    pub fn fired(&mut self, policy: &Policy, tenant: &str, now: Instant) -> bool {
        let Some(w) = self.watches.get_mut(tenant) else {
            return false;
        };
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
                let base = base_weight(policy, &d.value);
                format!(
                    "{} {} -> {}",
                    d.value,
                    lowered(base, steps - 1),
                    lowered(base, steps)
                )
            })
            .collect();
        info!(
            tenant,
            step = steps,
            "protection guard: io pressure of `{tenant}` passed {:.0}% of {}: io.weight {}",
            w.config.pressure * 100.0,
            humantime::format_duration(w.config.window),
            changes.join(", ")
        );
        true
    }

    /// Reads the pressure of lowered tenants; restores their donors once it stayed low.
    /// Returns whether the weights change.
    pub fn tick(&mut self, policy: &Policy, now: Instant) -> bool {
        let mut changed = false;
        for (name, w) in &mut self.watches {
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
            if w.episode.observe(now, total, &w.config) {
                w.restores += 1;
                let back: Vec<String> = w
                    .config
                    .donors
                    .iter()
                    .map(|d| format!("{} {}", d.value, base_weight(policy, &d.value)))
                    .collect();
                info!(
                    tenant = name.as_str(),
                    "protection guard: io pressure of `{name}` stayed under {:.0}% for {}: io.weight restored: {}",
                    w.config.pressure * 50.0,
                    humantime::format_duration(w.config.window * QUIET_WINDOWS),
                    back.join(", ")
                );
                changed = true;
            }
        }
        changed
    }

    /// The donors' weights in force: per donor the lowest any guard asks for.
    pub fn weights(&self, policy: &Policy) -> BTreeMap<String, u32> {
        let mut out: BTreeMap<String, u32> = BTreeMap::new();
        for w in self.watches.values() {
            if w.episode.steps == 0 {
                continue;
            }
            for d in &w.config.donors {
                let v = lowered(base_weight(policy, &d.value), w.episode.steps);
                out.entry(d.value.clone())
                    .and_modify(|x| *x = (*x).min(v))
                    .or_insert(v);
            }
        }
        out
    }

    /// Per protected tenant: its state, for status and the metrics.
    pub fn state(&self, policy: &Policy) -> BTreeMap<String, GuardState> {
        self.watches
            .iter()
            .map(|(n, w)| {
                let steps = w.episode.steps;
                let lowered = if steps == 0 {
                    BTreeMap::new()
                } else {
                    w.config
                        .donors
                        .iter()
                        .map(|d| {
                            (
                                d.value.clone(),
                                lowered(base_weight(policy, &d.value), steps),
                            )
                        })
                        .collect()
                };
                (
                    n.clone(),
                    GuardState {
                        armed: w.trigger.is_some(),
                        step: steps,
                        lowered,
                        lowerings: w.lowerings,
                        restores: w.restores,
                    },
                )
            })
            .collect()
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

fn donors(g: &IoGuard) -> String {
    g.donors
        .iter()
        .map(|d| format!("`{}`", d.value))
        .collect::<Vec<_>>()
        .join(", ")
}
