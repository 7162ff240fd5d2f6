//! An instance-total IO budget that follows the load (`[tenant.io] split = "demand"`).
//!
//! The kernel limits IO per device only. With `split = "equal"` (the default) a tenant's total
//! is divided equally over its devices; with `split = "demand"` the daemon redistributes it every
//! `rebalance_interval` from the tenant's measured per-device usage (the counters `status` reads:
//! v1 `blkio.throttle.io_service_bytes`/`io_serviced`, v2 `io.stat`, of the `limited` leaf).
//!
//! The core, `allocate`, is pure and integer-exact, one key (read_bps, write_bps, read_iops,
//! write_iops) at a time:
//! 1. every device keeps the floor `F = floor(total * floor%)` (at least 1) so an idle disk
//!    can wake up;
//! 2. a device whose smoothed usage is at least `PINNED` (85%) of its current limit is *pinned*
//!    (at the floor, `AT_FLOOR`, 50%, is enough: a load that starts there mid-interval is seen
//!    one interval sooner): it counts as wanting without bound (the limit hides its real demand,
//!    so it gets headroom to reveal it); any other device wants `MARGIN` (125%) of its smoothed
//!    usage, and at least twice the floor once it uses half the floor (so that it does not
//!    bounce between the floor and pinned);
//! 3. the rest of the total (`total - n*F`) is water-filled over the wants, smallest first
//!    (max-min fair): a device never gets more than it wants while another wants more; pinned
//!    devices split what is left equally;
//! 4. if every want is met, what is left over is spread equally (an idle tenant drifts back to
//!    the equal split, and every device has headroom).
//!
//! Smoothing: usage rises are taken at once (a new load is served within one interval) and
//! falls are followed as `est = smoothing*est + (1-smoothing)*rate` (default 0.1), so a short
//! pause does not take a device's budget away, except while some device is pinned (the budget is
//! contested): then falls are followed at once too. When a busy device's use halves while
//! another is held back (a load that moves), the next look comes after a quarter interval
//! (`FOLLOW_UP`), with the held devices still counted as held, so a moving load is followed
//! within about 1.25 intervals (one to see the new disk pinned at its floor, a quarter more to
//! give it what the old disk no longer uses). A change smaller than `DEADBAND` (1% of the total) on every device is not written at
//! all, so constant load gives constant limits.
//! The result never sums to more than the total (integer arithmetic, proven by a proptest).
//!
//! The driver (`Balancer`) keeps the current shares in memory; the daemon hands them to every
//! plan it builds (its periodic rescan, a reload, a rebalance) as `engine::Adjustments::shares`,
//! in place of the equal split; `dbcage apply` without the daemon uses the
//! equal split. Writes go through `plan` → `apply` (lower-before-raise: the per-device sum never
//! exceeds the total mid-change). The decisions go to `/run/dbcage/<root>.balance.json` for
//! `status` and the metrics, removed when the daemon stops; the last written limits stay.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cgroup;
use crate::cgroup::stats::IoCounters;
use crate::kernel::DevNum;
use crate::plan::{Plan, Step};
use crate::policy::{IoLimits, Policy, Split, Tenant};

/// A device using this share of its limit or more is held back by it.
pub const PINNED: f64 = 0.85;
/// A device held at the floor counts as pinned from this share of it in use.
pub const AT_FLOOR: f64 = 0.5;
/// A device pinned at the last look stays pinned while it uses this share of its limit: a
/// synchronous stream (writes with fsync) dips below `PINNED` in some intervals without its
/// demand having changed, and must not lose its share for it. A load that leaves falls far
/// below this at once.
pub const STAY_PINNED: f64 = 0.5;
/// A device that is not pinned is given this much more than it uses.
pub const MARGIN: f64 = 1.25;
/// Changes below this share of the total (on every device) are not written.
pub const DEADBAND: f64 = 0.01;
/// When a busy device's use halved while another device is held back by its limit (a load
/// moving between disks), the next look comes after this share of the interval: the load moved
/// mid-interval and was only partly visible, and the follow-up gives the new disk the rest
/// without waiting a whole interval.
pub const FOLLOW_UP: f64 = 0.25;

/// The four keys, in `IoLimits` order.
pub const KEYS: [&str; 4] = ["read_bps", "write_bps", "read_iops", "write_iops"];

pub fn key_get(l: &IoLimits, k: usize) -> Option<u64> {
    l.key(k)
}

pub fn key_set(l: &mut IoLimits, k: usize, v: Option<u64>) {
    l.set_key(k, v)
}

fn counter(c: &IoCounters, k: usize) -> u64 {
    [c.read_bytes, c.write_bytes, c.read_ios, c.write_ios][k]
}

/// Why a device has the share it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reason {
    /// It gets only the floor (it uses little).
    Floor,
    /// It gets what its recent use asks for (pinned devices included).
    Demand,
}

/// One device's input to `allocate`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// Smoothed usage, units per second.
    pub rate: f64,
    /// The limit in force now (`None`: unlimited).
    pub limit: Option<u64>,
}

/// The floor in units: `floor` (a fraction of the total), at least 1, and never more than an
/// equal share.
pub fn floor_units(total: u64, n: usize, floor: f64) -> u64 {
    if n == 0 {
        return 0;
    }
    let f = ((total as f64) * floor.clamp(0.0, 1.0)).floor() as u64;
    f.max(1).min(total / n as u64)
}

/// Whether a device is held back by its limit: pinned, or at the floor `f` with half of it in
/// use (a load that just started there shows in part of an interval only, so it is seen one
/// interval sooner).
pub fn held(u: &Usage, f: u64) -> bool {
    pinned(u)
        || u.limit
            .is_some_and(|l| l <= f && u.rate > 0.0 && u.rate >= AT_FLOOR * l as f64)
}

/// Whether a device uses so much of its limit that the limit hides its demand.
pub fn pinned(u: &Usage) -> bool {
    u.limit
        .is_some_and(|l| u.rate >= PINNED * l as f64 && u.rate > 0.0)
}

/// Divides `total` over the devices as the module comment describes. The result has one entry
/// per input, and its sum is at most `total`.
pub fn allocate(total: u64, floor: f64, usage: &[Usage]) -> Vec<(u64, Reason)> {
    let n = usage.len();
    if n == 0 {
        return Vec::new();
    }
    let f = floor_units(total, n, floor);
    let mut give = vec![f; n];
    let mut rest = total - f * n as u64;
    // Extra wanted above the floor; None = without bound (pinned).
    let wants: Vec<Option<u64>> = usage
        .iter()
        .map(|u| {
            if held(u, f) {
                None
            } else {
                let w = (u.rate.max(0.0) * MARGIN).ceil();
                let mut w = if w >= u64::MAX as f64 {
                    u64::MAX
                } else {
                    w as u64
                };
                // A device that uses half its floor or more gets at least twice the floor, so
                // that it is not pinned at the floor again next time (no back and forth).
                if u.rate >= AT_FLOOR * f as f64 {
                    w = w.max(f.saturating_mul(2));
                }
                Some(w.saturating_sub(f))
            }
        })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (wants[i].is_none(), wants[i].unwrap_or(0), i));
    let mut left = n as u64;
    for &i in &order {
        let fair = rest / left;
        let g = match wants[i] {
            Some(w) => w.min(fair),
            None => fair,
        };
        give[i] += g;
        rest -= g;
        left -= 1;
    }
    let reasons: Vec<Reason> = give
        .iter()
        .map(|&g| {
            if g == f {
                Reason::Floor
            } else {
                Reason::Demand
            }
        })
        .collect();
    // Every want met: spread what is left equally (the remainder stays unassigned).
    if rest > 0 {
        let each = rest / n as u64;
        for g in &mut give {
            *g += each;
        }
    }
    give.into_iter().zip(reasons).collect()
}

/// IOs per second that one whole IO per throttle slice is worth on a device: blk-throttle (v1
/// blkio and v2 io.max alike) grants `floor(limit * slice)` IOs per slice, so an iops limit
/// that is not a multiple of 1/slice loses the fraction every slice (148 IOPS gives 140 with
/// 100 ms slices: measured here). The slice is 100 ms on rotational devices and 20 ms on others.
pub fn iops_grain(rotational: bool) -> u64 {
    if rotational {
        10
    } else {
        50
    }
}

/// Rounds the demand shares of an iops key down to whole IOs per slice (`grain[i]`), and gives
/// what that frees back, a grain at a time, to the largest shares: the same budget, none of it
/// lost to the kernel's rounding. Floors stay as they are; the sum never grows.
pub fn quantize_iops(alloc: &mut [(u64, Reason)], grain: &[u64]) {
    let mut free = 0u64;
    for (a, g) in alloc.iter_mut().zip(grain) {
        if a.1 == Reason::Demand && *g > 1 && a.0 >= *g {
            free += a.0 % g;
            a.0 -= a.0 % g;
        }
    }
    let mut order: Vec<usize> = (0..alloc.len())
        .filter(|&i| alloc[i].1 == Reason::Demand && grain[i] > 1 && alloc[i].0 >= grain[i])
        .collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(alloc[i].0), i));
    let mut progress = true;
    while progress {
        progress = false;
        for &i in &order {
            if free >= grain[i] {
                alloc[i].0 += grain[i];
                free -= grain[i];
                progress = true;
            }
        }
    }
}

/// Folds a new rate into the estimate: rises at once, falls smoothed.
pub fn smooth(est: Option<f64>, rate: f64, smoothing: f64) -> f64 {
    match est {
        Some(e) if rate < e => smoothing * e + (1.0 - smoothing) * rate,
        _ => rate,
    }
}

/// Whether `new` differs from `cur` enough to be written.
pub fn worth_writing(total: u64, cur: &[Option<u64>], new: &[u64]) -> bool {
    let band = (total as f64 * DEADBAND).max(1.0);
    let cur_sum: u128 = cur.iter().map(|c| c.unwrap_or(u64::MAX) as u128).sum();
    cur_sum > total as u128
        || cur
            .iter()
            .zip(new)
            .any(|(c, n)| c.is_none_or(|c| (c as f64 - *n as f64).abs() >= band))
}

/// One device's decision for one key, as published.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KeyShare {
    pub limit: u64,
    /// limit / total
    pub share: f64,
    pub reason: Reason,
    /// The smoothed usage the decision was based on (units per second).
    pub usage: f64,
}

/// What the daemon publishes: tenant → device (`MAJ:MIN`) → key → decision.
pub type Published = BTreeMap<String, BTreeMap<String, BTreeMap<String, KeyShare>>>;

pub use crate::plan::Shares;

/// Where the daemon publishes its decisions for `status` and the metrics.
pub fn published_path(root_name: &str) -> PathBuf {
    crate::rundir::state_path(root_name, "balance")
}

/// Reads the published decisions, if a running daemon wrote them (see `rundir::read_owned`).
pub fn read_published(root_name: &str) -> Option<Published> {
    crate::rundir::read_owned(&published_path(root_name))
}

fn publish(root_name: &str, p: &Published) {
    crate::rundir::publish_owned(&published_path(root_name), p);
}

#[derive(Debug, Default)]
struct TenantState {
    last: Option<(Instant, BTreeMap<DevNum, IoCounters>)>,
    /// Smoothed usage per (device, key).
    est: BTreeMap<(DevNum, usize), f64>,
    next: Option<Instant>,
    /// The next tick is a quick follow-up: these (device, key) were held back by their limits
    /// when it was scheduled, and count as held in it too (a quarter interval of counters is
    /// too short to tell a held device from a slow one; without this a noisy short sample could
    /// take the new disk's share away again).
    follow_up: Option<std::collections::BTreeSet<(DevNum, usize)>>,
    /// (device, key) pinned at the last look (see `STAY_PINNED`).
    pinned_last: std::collections::BTreeSet<(DevNum, usize)>,
    /// The devices and their iops grains (`iops_grain`), as last read from sysfs.
    grains: Option<(Vec<DevNum>, Vec<u64>)>,
}

/// The daemon's side: state between intervals.
#[derive(Debug, Default)]
pub struct Balancer {
    tenants: BTreeMap<String, TenantState>,
    shares: Shares,
    published: Published,
}

fn demand_tenants(policy: &Policy) -> impl Iterator<Item = &Tenant> {
    policy
        .tenants
        .iter()
        .filter(|t| t.io_split.split == Split::Demand && !t.io.is_empty())
}

impl Balancer {
    /// When the next tenant is due (`None`: no tenant uses `split = "demand"`).
    pub fn next_due(&self, policy: &Policy) -> Option<Instant> {
        demand_tenants(policy)
            .map(|t| {
                self.tenants
                    .get(&t.name)
                    .and_then(|s| s.next)
                    // due already (a moment ago, so that a caller's earlier `now` sees it due)
                    .unwrap_or_else(|| {
                        let now = Instant::now();
                        now.checked_sub(Duration::from_secs(1)).unwrap_or(now)
                    })
            })
            .min()
    }

    /// The per-device shares in force, for `engine::Adjustments::shares`.
    pub fn shares(&self) -> &Shares {
        &self.shares
    }

    /// Rebalances the tenants that are due (`policy`: the policy as planned, raises included).
    /// Returns whether the shares (or the limits the kernel holds) differ from what they should
    /// be: the caller then plans with `shares()` and executes the IO limit writes
    /// (`io_writes_only`, lower-before-raise).
    pub fn tick(&mut self, host: &crate::engine::Prepared, policy: &Policy) -> bool {
        let now = Instant::now();
        // Forget tenants that left the policy or stopped using demand.
        let keep: Vec<String> = demand_tenants(policy).map(|t| t.name.clone()).collect();
        self.tenants.retain(|k, _| keep.contains(k));
        self.shares.retain(|k, _| keep.contains(k));
        self.published.retain(|k, _| keep.contains(k));
        let mut changed = false;
        for (ti, t) in policy.tenants.iter().enumerate() {
            if t.io_split.split != Split::Demand || t.io.is_empty() {
                continue;
            }
            let st = self.tenants.entry(t.name.clone()).or_default();
            if st.next.is_some_and(|n| n > now) {
                continue;
            }
            st.next = Some(now + t.io_split.interval);
            let held_before = st.follow_up.take();
            let mut held_now = std::collections::BTreeSet::new();
            let Some(td) = host.inventory.tenants.get(ti) else {
                continue;
            };
            let devices: Vec<DevNum> = td.devices.iter().map(|d| d.devnum).collect();
            // Read from sysfs only when the device set changes, not every interval.
            if st.grains.as_ref().is_none_or(|(devs, _)| *devs != devices) {
                let grains = devices
                    .iter()
                    .map(|d| {
                        let path = format!("/sys/dev/block/{d}/queue/rotational");
                        // unknown: the rotational slice, the finer grain
                        iops_grain(
                            host.fs
                                .read_to_string(path)
                                .map_or(true, |r| r.trim() != "0"),
                        )
                    })
                    .collect();
                st.grains = Some((devices.clone(), grains));
            }
            let grains = st
                .grains
                .as_ref()
                .map(|(_, g)| g.clone())
                .unwrap_or_default();
            let Some(crate::cgroup::read::IoState {
                limits,
                usage: counters,
            }) = host.layout.reader(&t.name).limited_io()
            else {
                continue;
            };
            let prev = st.last.replace((now, counters.clone()));
            let Some((then, before)) = prev else {
                continue; // the first sample gives no rate
            };
            let dt = now.duration_since(then).as_secs_f64();
            if dt <= 0.0 || devices.is_empty() {
                continue;
            }
            let mut new: BTreeMap<DevNum, IoLimits> = devices
                .iter()
                .map(|d| {
                    (
                        *d,
                        self.shares
                            .get(&t.name)
                            .and_then(|s| s.get(d))
                            .copied()
                            .unwrap_or_else(|| limits.get(d).copied().unwrap_or_default()),
                    )
                })
                .collect();
            let mut pub_t: BTreeMap<String, BTreeMap<String, KeyShare>> = BTreeMap::new();
            for (k, key) in KEYS.iter().enumerate() {
                let Some(total) = key_get(&t.io, k) else {
                    continue;
                };
                let raw: Vec<Usage> = devices
                    .iter()
                    .map(|d| {
                        let c = counters.get(d).map_or(0, |c| counter(c, k));
                        let b = before.get(d).map_or(0, |c| counter(c, k));
                        Usage {
                            rate: c.saturating_sub(b) as f64 / dt,
                            limit: limits.get(d).and_then(|l| key_get(l, k)),
                        }
                    })
                    .collect();
                // When a device is held back by its limit the budget is contested: falls
                // elsewhere are followed at once, unsmoothed.
                let f = floor_units(total, devices.len(), t.io_split.floor);
                let floor = f as f64;
                let contested = raw.iter().any(|u| held(u, f));
                // A busy device that fell to less than half its use while another is held back:
                // the load is moving; a follow-up after a quarter interval gives the held device
                // what the first look had to leave to the old one (it was still busy for part
                // of the interval).
                let dropped = devices.iter().zip(&raw).any(|(d, u)| {
                    st.est
                        .get(&(*d, k))
                        .is_some_and(|e| *e > floor && u.rate < 0.5 * e)
                });
                if contested && dropped {
                    for (d, u) in devices.iter().zip(&raw) {
                        if held(u, f) {
                            held_now.insert((*d, k));
                        }
                    }
                }
                let smoothing = if contested { 0.0 } else { t.io_split.smoothing };
                let usage: Vec<Usage> = devices
                    .iter()
                    .zip(&raw)
                    .map(|(d, u)| {
                        let e = smooth(st.est.get(&(*d, k)).copied(), u.rate, smoothing);
                        st.est.insert((*d, k), e);
                        let still_held = held_before.as_ref().is_some_and(|h| h.contains(&(*d, k)))
                            || (st.pinned_last.contains(&(*d, k))
                                && u.limit.is_some_and(|l| u.rate >= STAY_PINNED * l as f64));
                        match u.limit {
                            Some(l) if still_held => Usage {
                                rate: e.max(l as f64),
                                ..*u
                            },
                            _ => Usage { rate: e, ..*u },
                        }
                    })
                    .collect();
                for (d, u) in devices.iter().zip(&usage) {
                    if pinned(u) {
                        st.pinned_last.insert((*d, k));
                    } else {
                        st.pinned_last.remove(&(*d, k));
                    }
                }
                let mut alloc = allocate(total, t.io_split.floor, &usage);
                if k >= 2 {
                    quantize_iops(&mut alloc, &grains);
                }
                let cur: Vec<Option<u64>> = usage.iter().map(|u| u.limit).collect();
                let vals: Vec<u64> = alloc.iter().map(|a| a.0).collect();
                let write = worth_writing(total, &cur, &vals);
                for (i, d) in devices.iter().enumerate() {
                    let limit = if write {
                        vals[i]
                    } else {
                        cur[i].unwrap_or(vals[i])
                    };
                    key_set(new.get_mut(d).expect("device"), k, Some(limit));
                    pub_t.entry(d.to_string()).or_default().insert(
                        key.to_string(),
                        KeyShare {
                            limit,
                            share: limit as f64 / total as f64,
                            reason: alloc[i].1,
                            usage: usage[i].rate,
                        },
                    );
                }
            }
            // The kernel may hold other values (a one-shot `dbcage apply` wrote the equal split).
            let differs = devices.iter().any(|d| {
                (0..4).any(|k| {
                    key_get(&t.io, k).is_some()
                        && limits.get(d).and_then(|l| key_get(l, k)) != key_get(&new[d], k)
                })
            });
            if differs || self.shares.get(&t.name) != Some(&new) {
                changed = true;
                self.shares.insert(t.name.clone(), new);
            }
            if !held_now.is_empty() {
                st.next = Some(now + t.io_split.interval.mul_f64(FOLLOW_UP));
                st.follow_up = Some(held_now);
            }
            self.published.insert(t.name.clone(), pub_t);
        }
        publish(&policy.agent.root_name, &self.published);
        changed
    }
}

/// Removes the published decisions: the daemon calls it when it stops, so that `status` does
/// not show shares nobody maintains any more (the limits themselves stay in the kernel).
pub fn unpublish(root_name: &str) {
    let _ = std::fs::remove_file(published_path(root_name));
}

/// Keeps only the writes of per-device IO limits (a rebalance moves no process): the limit
/// files, and under systemd the per-device IO properties of the tenants' units (a delegated
/// unit's limits are files on its leaf). Limits already in force (per-device overrides, a
/// share written before) give no step.
pub fn io_writes_only(plan: Plan) -> Plan {
    let steps = plan
        .steps
        .into_iter()
        .filter_map(|s| match s {
            Step::Write { ref path, .. } => cgroup::is_io_limit_file(path).then_some(s),
            // Under systemd the shares are the unit's per-device IO properties.
            Step::SetUnitProperties {
                unit,
                tenant,
                set,
                was,
                reason,
            } => {
                let (set, was): (Vec<_>, Vec<_>) = set
                    .into_iter()
                    .zip(was)
                    .filter(|(p, _)| p.is_io_limit())
                    .unzip();
                (!set.is_empty()).then_some(Step::SetUnitProperties {
                    unit,
                    tenant,
                    set,
                    was,
                    reason,
                })
            }
            _ => None,
        })
        .collect();
    Plan {
        steps,
        tenants: plan.tenants,
        ..Plan::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn idle() -> Usage {
        Usage {
            rate: 0.0,
            limit: None,
        }
    }

    /// Runs the loop against a model disk set: each device serves min(limit, demand).
    fn simulate(total: u64, floor: f64, demand: &[f64], steps: usize) -> Vec<Vec<u64>> {
        let n = demand.len();
        let mut limits: Vec<u64> = vec![total / n as u64; n];
        let mut est: Vec<Option<f64>> = vec![None; n];
        let mut out = Vec::new();
        for _ in 0..steps {
            let usage: Vec<Usage> = (0..n)
                .map(|i| {
                    let served = demand[i].min(limits[i] as f64);
                    let e = smooth(est[i], served, 0.2);
                    est[i] = Some(e);
                    Usage {
                        rate: e,
                        limit: Some(limits[i]),
                    }
                })
                .collect();
            let a = allocate(total, floor, &usage);
            let new: Vec<u64> = a.iter().map(|x| x.0).collect();
            let cur: Vec<Option<u64>> = limits.iter().map(|l| Some(*l)).collect();
            if worth_writing(total, &cur, &new) {
                limits = new;
            }
            out.push(limits.clone());
        }
        out
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn iops_shares_are_whole_ios_per_slice_and_nothing_is_lost() {
        // Two busy disks and an idle one, 300 IOPS, floor 3: 148 + 148 + 3 would run at
        // 140 + 140 (the kernel's rounding); 150 + 140 + 3 runs at 290.
        let mut a = vec![
            (148, Reason::Demand),
            (148, Reason::Demand),
            (3, Reason::Floor),
        ];
        quantize_iops(&mut a, &[10, 10, 10]);
        assert_eq!(a.iter().map(|x| x.0).collect::<Vec<_>>(), vec![150, 140, 3]);
        // one busy disk: 297 -> 290 (the 7 left cannot make a whole grain)
        let mut a = vec![
            (297, Reason::Demand),
            (3, Reason::Floor),
            (0, Reason::Floor),
        ];
        quantize_iops(&mut a, &[10, 10, 10]);
        assert_eq!(a[0].0, 290);
        // non-rotational grain, and a share below one grain is left alone
        let mut a = vec![(1234, Reason::Demand), (30, Reason::Demand)];
        quantize_iops(&mut a, &[50, 50]);
        assert_eq!(a.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1200, 30]);
    }

    proptest! {
        #[test]
        fn quantized_iops_never_sum_to_more(
            shares in proptest::collection::vec((0u64..100_000, any::<bool>()), 1..6),
            rotational in proptest::collection::vec(any::<bool>(), 6),
        ) {
            let mut a: Vec<(u64, Reason)> = shares
                .iter()
                .map(|(v, d)| (*v, if *d { Reason::Demand } else { Reason::Floor }))
                .collect();
            let grains: Vec<u64> = (0..a.len()).map(|i| iops_grain(rotational[i])).collect();
            let before: u64 = a.iter().map(|x| x.0).sum();
            quantize_iops(&mut a, &grains);
            let after: u64 = a.iter().map(|x| x.0).sum();
            prop_assert!(after <= before);
            // at most one grain per demand device is lost to rounding
            prop_assert!(before - after < grains.iter().max().copied().unwrap_or(1) * a.len() as u64 + 1);
            for (x, g) in a.iter().zip(&grains) {
                if x.1 == Reason::Demand && x.0 >= *g {
                    prop_assert_eq!(x.0 % g, 0);
                }
            }
        }
    }

    #[test]
    fn published_decisions_of_a_dead_daemon_are_ignored() {
        if !nix::unistd::Uid::effective().is_root() {
            return; // /run/dbcage is root's
        }
        let root = format!("dbcage-test-unit-{}", std::process::id());
        let mut p = Published::new();
        p.entry("db".into()).or_default();
        publish(&root, &p);
        // This process wrote it and is alive: read back.
        assert_eq!(read_published(&root), Some(p.clone()));
        // A daemon that was killed: its pid now belongs to another program (here pid 1).
        let text = serde_json::json!({ "pid": 1, "tenants": p }).to_string();
        std::fs::write(published_path(&root), text).unwrap();
        let got = read_published(&root);
        unpublish(&root);
        assert_eq!(got, None);
        assert!(!published_path(&root).exists());
    }

    #[test]
    fn idle_tenant_splits_equally_with_floors() {
        let a = allocate(12 * MIB, 0.02, &[idle(), idle(), idle()]);
        let sum: u64 = a.iter().map(|x| x.0).sum();
        assert!(sum <= 12 * MIB && sum > 12 * MIB - 3);
        assert!(a.iter().all(|x| x.0 == 4 * MIB));
    }

    #[test]
    fn one_loaded_device_gets_all_but_the_floors() {
        let got = simulate(12 * MIB, 0.02, &[f64::INFINITY, 0.0, 0.0], 3);
        let last = got.last().unwrap();
        let f = floor_units(12 * MIB, 3, 0.02);
        assert_eq!(last[1], f);
        assert_eq!(last[2], f);
        assert!(last[0] as f64 >= 0.95 * (12 * MIB) as f64, "{last:?}");
        // reached in one step
        assert!(got[0][0] as f64 >= 0.95 * (12 * MIB) as f64, "{got:?}");
    }

    #[test]
    fn load_that_moves_is_followed_within_three_steps() {
        let total = 12 * MIB;
        let mut limits = simulate(total, 0.02, &[f64::INFINITY, 0.0, 0.0], 5)
            .pop()
            .unwrap();
        let mut est: Vec<Option<f64>> = limits.iter().map(|l| Some(*l as f64)).collect();
        est[1] = Some(0.0);
        est[2] = Some(0.0);
        let demand = [0.0, f64::INFINITY, 0.0];
        let mut reached = None;
        for step in 1..=6 {
            let usage: Vec<Usage> = (0..3)
                .map(|i| {
                    let e = smooth(est[i], demand[i].min(limits[i] as f64), 0.2);
                    est[i] = Some(e);
                    Usage {
                        rate: e,
                        limit: Some(limits[i]),
                    }
                })
                .collect();
            limits = allocate(total, 0.02, &usage).iter().map(|x| x.0).collect();
            if reached.is_none() && limits[1] as f64 >= 0.95 * total as f64 {
                reached = Some(step);
            }
        }
        assert!(reached.is_some_and(|s| s <= 3), "{reached:?} {limits:?}");
    }

    #[test]
    fn two_loaded_devices_share_and_a_limited_disk_keeps_what_it_uses() {
        let total = 12 * MIB;
        let got = simulate(total, 0.02, &[f64::INFINITY, f64::INFINITY, 0.0], 5);
        let last = got.last().unwrap();
        assert!((last[0] + last[1]) as f64 >= 0.95 * total as f64);
        assert!(last[0].abs_diff(last[1]) <= 1);
        // a disk that can do only 2 MiB/s keeps about that much; the other gets the rest
        let got = simulate(total, 0.02, &[2.0 * MIB as f64, f64::INFINITY, 0.0], 8);
        let last = got.last().unwrap();
        assert!(last[0] >= 2 * MIB && last[0] <= 3 * MIB, "{last:?}");
        // the margin (25% of 2 MiB/s) and the idle floor are what it does not get
        let f = floor_units(total, 3, 0.02);
        assert_eq!(last[1], total - last[0] - f, "{last:?}");
    }

    #[test]
    fn constant_load_gives_constant_limits() {
        for demand in [
            vec![f64::INFINITY, 0.0, 0.0],
            vec![3.0 * MIB as f64, 5.0 * MIB as f64, 1.0 * MIB as f64],
            vec![f64::INFINITY; 3],
            vec![7.0 * MIB as f64, f64::INFINITY, 0.5 * MIB as f64],
        ]
        .into_iter()
        .chain(
            // trickles around the floor (5% of 12 MiB/s) beside a busy disk
            [0.3, 0.5, 0.6, 0.8, 0.9, 1.0, 1.6, 1.7, 2.5]
                .map(|x| vec![x * (0.05 * (12 * MIB) as f64), f64::INFINITY, 0.0]),
        ) {
            let got = simulate(12 * MIB, 0.05, &demand, 30);
            let tail = &got[10..];
            assert!(
                tail.windows(2).all(|w| w[0] == w[1]),
                "{demand:?}: {tail:?}"
            );
        }
    }

    #[test]
    fn reasons_name_the_floor() {
        let a = allocate(
            1000,
            0.05,
            &[
                Usage {
                    rate: 300.0,
                    limit: Some(333),
                },
                Usage {
                    rate: 0.0,
                    limit: Some(333),
                },
            ],
        );
        assert_eq!(a[0], (950, Reason::Demand));
        assert_eq!(a[1], (50, Reason::Floor));
    }

    fn usage() -> impl Strategy<Value = Usage> {
        (
            prop_oneof![Just(0.0), 0.0..1e12f64, Just(f64::INFINITY)],
            proptest::option::of(any::<u64>()),
        )
            .prop_map(|(rate, limit)| Usage { rate, limit })
    }

    proptest! {
        #[test]
        fn never_more_than_the_total_and_floors_kept(
            total in 1u64..=u64::MAX,
            floor in 0.0f64..=1.0,
            usage in proptest::collection::vec(usage(), 1..12),
        ) {
            let n = usage.len() as u64;
            prop_assume!(total >= n);
            let floor = floor / n as f64;
            let a = allocate(total, floor, &usage);
            prop_assert_eq!(a.len(), usage.len());
            let sum: u128 = a.iter().map(|x| x.0 as u128).sum();
            prop_assert!(sum <= total as u128);
            let f = floor_units(total, usage.len(), floor);
            prop_assert!(f >= 1);
            prop_assert!(a.iter().all(|x| x.0 >= f));
            // nothing is wasted beyond integer rounding
            prop_assert!(total as u128 - sum < n as u128);
        }

        #[test]
        fn steady_loads_converge_to_95_percent_of_the_total(
            loaded in proptest::collection::vec(any::<bool>(), 2..6),
            total in 1000u64..1_000_000_000,
        ) {
            prop_assume!(loaded.iter().any(|l| *l));
            let n = loaded.len();
            let floor = 0.05 / n as f64; // with 5 devices idle floors take up to 4%
            let demand: Vec<f64> = loaded.iter().map(|l| if *l { f64::INFINITY } else { 0.0 }).collect();
            let got = simulate(total, floor, &demand, 4);
            let last = got.last().unwrap();
            let on_loaded: u64 = (0..n).filter(|i| loaded[*i]).map(|i| last[i]).sum();
            prop_assert!(on_loaded as f64 >= 0.95 * total as f64, "{:?}", last);
            let sums_ok = got.iter().all(|l| l.iter().map(|x| *x as u128).sum::<u128>() <= total as u128);
            prop_assert!(sums_ok);
        }
    }

    /// A rebalance under systemd: the unit's per-device IO properties stay (their old values
    /// with them), its other properties, adoptions and moves go; a leaf's io.max stays.
    #[test]
    fn a_rebalance_keeps_only_io_limits_files_and_unit_properties() {
        use crate::systemd::{DeviceLimit, Property};
        let io = |bps| Property::IoReadBandwidthMax(vec![DeviceLimit::new("/dev/vdc", bps)]);
        let plan = Plan {
            steps: vec![
                Step::SetUnitProperties {
                    unit: "postgresql@15-main.service".into(),
                    tenant: "pg".into(),
                    set: vec![Property::CpuWeight(Some(50)), io(2 << 20)],
                    was: vec![Property::CpuWeight(None), io(1 << 20)],
                    reason: String::new(),
                },
                Step::SetUnitProperties {
                    unit: "other.service".into(),
                    tenant: "pg".into(),
                    set: vec![Property::MemoryMax(Some(1 << 30))],
                    was: vec![Property::MemoryMax(None)],
                    reason: String::new(),
                },
                Step::Adopt {
                    tenant: "pg".into(),
                    pids: vec![7],
                    leaf: None,
                    properties: Vec::new(),
                    reason: String::new(),
                },
                Step::Write {
                    path: "/sys/fs/cgroup/x.service/limited/io.max".into(),
                    value: "254:32 rbps=2097152".into(),
                    current: None,
                    reason: String::new(),
                },
                Step::Write {
                    path: "/sys/fs/cgroup/x.service/limited/cpu.max".into(),
                    value: "max 100000".into(),
                    current: None,
                    reason: String::new(),
                },
            ],
            ..Plan::default()
        };
        let kept = io_writes_only(plan).steps;
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert_eq!(
            kept[0],
            Step::SetUnitProperties {
                unit: "postgresql@15-main.service".into(),
                tenant: "pg".into(),
                set: vec![io(2 << 20)],
                was: vec![io(1 << 20)],
                reason: String::new(),
            }
        );
        assert!(matches!(&kept[1], Step::Write { path, .. } if path.ends_with("io.max")));
    }
}
