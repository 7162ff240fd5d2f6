//! The daemon (`dbcage run`): apply the policy, then keep it true as processes come and go.
//!
//! One thread, one loop over: kernel process events (the proc connector), signals (SIGHUP
//! reloads, SIGTERM/SIGINT stop), a periodic full rescan (the safety net), and short re-checks
//! of processes forked inside a tenant (programs such as PostgreSQL retitle their children
//! without exec, which only a re-read can see). Every decision goes through the same
//! classify → plan::moves → engine::execute path as `dbcage apply`. Limits stay in the kernel
//! when the daemon stops; everything it needs is re-read at start, so a restart converges.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use serde::Serialize;
use tracing::{debug, info, warn};

use crate::cgroup::{GroupWatch, Snapshot};
use crate::classify::connector::{self, Connector, ProcEvent, Received, Timed};
use crate::classify::{self, Classifier, Leaf};
use crate::engine::{self, Adjustments, Prepared, Scan};
use crate::inventory::dirwatch::DirWatch;
use crate::inventory::procs::ProcReader;
use crate::metrics;
use crate::plan::{self, Plan, Step};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

pub struct AgentOptions {
    pub config: crate::policy::PolicyPath,
    /// Full rescan period (the safety net).
    pub rescan: Duration,
    /// Rescan period when the proc connector is unavailable.
    pub fallback_rescan: Duration,
    /// Where to write the run's statistics as one JSON line when it stops.
    pub stats_out: Option<PathBuf>,
    /// Receive buffer of the process-event socket, in bytes.
    pub event_buffer: usize,
    /// Overrides the policy's `agent.metrics`: `Some(None)` turns the endpoint off.
    pub metrics: Option<Option<std::net::SocketAddr>>,
    /// The metrics endpoint's web configuration file (TLS, basic auth).
    pub web_config: Option<PathBuf>,
    /// Serve metrics off loopback without a web configuration.
    pub metrics_insecure: bool,
    /// Where `agent.favordynmods = true` mounts its hierarchy.
    pub favordynmods_dir: PathBuf,
}

/// `moved_at` is pruned of entries older than the horizon once it holds more than this many
/// (and then once it has doubled: see `MovedAt`).
const MOVED_AT_KEEP: usize = 4096;
const MOVED_AT_HORIZON: Duration = Duration::from_secs(10);

/// When each process this daemon moved was last moved: CLOCK_MONOTONIC ns read after its
/// cgroup.procs writes returned (see `Daemon::forked_during_move`), and whether that move took
/// it out of dbcage's groups in hierarchies its new tenant has none in (`Step::Move::leave`).
struct MovedAt {
    at: HashMap<u32, (u64, bool)>,
    /// The size at which entries older than the horizon are dropped next: twice what the last
    /// pruning kept, at least `MOVED_AT_KEEP`. A fixed threshold walked the whole map at every
    /// move once more processes than it were moved within the horizon (410 a second or more),
    /// a twentieth of the daemon's CPU in a sustained storm.
    prune_at: usize,
}

impl MovedAt {
    fn new() -> MovedAt {
        MovedAt {
            at: HashMap::new(),
            prune_at: MOVED_AT_KEEP,
        }
    }

    fn get(&self, pid: u32) -> Option<(u64, bool)> {
        self.at.get(&pid).copied()
    }

    /// Records moves that completed at `done_ns`, then prunes if the map is due.
    fn record(&mut self, moves: impl IntoIterator<Item = (u32, bool)>, done_ns: u64) {
        for (pid, left) in moves {
            self.at.insert(pid, (done_ns, left));
        }
        // A fork event comes within milliseconds of its fork (or is lost, and the overrun's
        // rescan takes over): older entries can go once there are many.
        if self.at.len() > self.prune_at {
            let horizon = done_ns.saturating_sub(MOVED_AT_HORIZON.as_nanos() as u64);
            self.at.retain(|_, &mut (at, _)| at > horizon);
            self.prune_at = (2 * self.at.len()).max(MOVED_AT_KEEP);
        }
    }
}

/// A rescan reads again the processes with `pid % shares` equal to its turn, however quiet they
/// were (see `procs::Reuse`), and every `shares`-th rescan lists /proc: `shares` is this many,
/// or more on a host with more than `SWEEP_SHARES * SWEEP_MOST` processes, so that a rescan
/// sweeps at most about `SWEEP_MOST` of them (at 100,000 processes, one in 100 a rescan: each
/// read again within 50 minutes at the default 30 s; a tenth would cost 10,000 reads a
/// rescan). The placed processes are swept one in `SWEEP_SHARES` however many the host has:
/// their groups are read again with them (another tool's move of one is undone within ten
/// rescans), and there are few of them.
const SWEEP_SHARES: u32 = 10;
const SWEEP_MOST: usize = 1_000;

/// The sweep's share for a host with `procs` processes (see `SWEEP_SHARES`).
fn sweep_shares(procs: usize) -> u32 {
    let shares = procs.div_ceil(SWEEP_MOST);
    u32::try_from(shares).map_or(u32::MAX, |s| s.max(SWEEP_SHARES))
}

/// Past this many processes named by events since the last rescan, the next one reads every
/// process (no dearer than looking each up), and the sets are emptied: their memory is bounded
/// in a fork storm.
const CHANGED_PIDS_MAX: usize = 65_536;

/// After a fork inside a tenant, the child is re-read this long after the fork, to catch
/// retitles that produce no event.
const RECHECK_AFTER: [Duration; 3] = [
    Duration::from_millis(5),
    Duration::from_millis(50),
    Duration::from_millis(500),
];

#[derive(Debug, Default, Serialize)]
pub struct AgentStats {
    pub events: u64,
    pub overruns: u64,
    pub rescans: u64,
    pub moves: u64,
    pub vanished: u64,
    pub rechecks: u64,
    pub reloads: u64,
    pub reload_failures: u64,
    /// Event read from the socket → first cgroup.procs write started (the daemon's own work).
    pub event_to_write_us: Percentiles,
    /// Event emitted by the kernel → write started: adds the time queued in the socket.
    pub kernel_event_to_write_us: Percentiles,
    /// The move itself (all hierarchies): write started → done.
    pub write_us: Percentiles,
    pub rescan_ms: Percentiles,
    pub connector: bool,
    /// The kernel sends only the events the daemon uses (Linux 6.6 and later: no exits).
    pub connector_filtered: bool,
    /// Events for processes already where they belong (inherited from a member): no /proc read
    /// of their cgroups, no write.
    pub already_placed: u64,
    /// Children forked while their parent was being moved, moved after it (see
    /// `forked_during_move`).
    pub forked_during_move: u64,
    /// How plans read dbcage's groups: in full, files only (written since), from the watch.
    pub groups: crate::cgroup::watch::WatchStats,
    /// Processes the rescans read from /proc, and those they kept from the scan before
    /// (unchanged by the events, see `procs::Reuse`), summed over all rescans.
    pub rescan_procs_read: u64,
    pub rescan_procs_kept: u64,
    /// Rescans that read every process (no events, events lost, a `unit` rule, a failed
    /// rescan without a scan to start from).
    pub rescans_full: u64,
}

#[derive(Debug, Default, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

fn percentiles(h: &Histogram<u64>, scale: f64) -> Percentiles {
    Percentiles {
        count: h.len(),
        p50: h.value_at_quantile(0.5) as f64 / scale,
        p99: h.value_at_quantile(0.99) as f64 / scale,
        max: h.max() as f64 / scale,
    }
}

/// The daemon's state (the policy section that configures it is `policy::Agent`).
struct Daemon {
    opts: AgentOptions,
    ctx: Prepared,
    /// What the balancer and the replication guard lay over the policy: every plan uses it.
    adjust: Adjustments,
    /// Processes placed in a tenant and leaf (by us or by inheritance): forks of these are
    /// re-checked, and an event for one whose classification still gives that place needs no
    /// move. Kept exact by fork events (a fork from a non-member forgets a reused PID).
    members: HashMap<u32, (usize, Leaf)>,
    /// Tenants whose change of NUMA nodes waits for their restart (the last full plan's
    /// deferred `memory_moves`): when a process of one starts while its groups are empty, a
    /// full plan runs first, so that the new nodes are written before the restarted instance's
    /// first process is moved in (the event path only moves processes).
    deferred_moves: std::collections::BTreeSet<usize>,
    moved_at: MovedAt,
    rechecks: BTreeMap<(Instant, u32), ()>,
    stats: AgentStats,
    event_hist: Histogram<u64>,
    kernel_hist: Histogram<u64>,
    write_hist: Histogram<u64>,
    rescan_hist: Histogram<u64>,
    has_descendant_rules: bool,
    /// The process fields the rules look at (see `procs::Fields`); set with the policy.
    fields: crate::inventory::procs::Fields,
    /// /proc, kept open for the events' reads.
    reader: ProcReader,
    /// What the metrics endpoint reads.
    shared: Arc<metrics::Shared>,
    /// The policy files' text, `set` overrides and schedule windows (see `control`).
    live: crate::control::Live,
    /// Process events arrive (the event thread runs); otherwise the short fallback rescan.
    connected: bool,
    /// The processes the events said changed (forked, exec'd, renamed, new ids) since the last
    /// rescan, and in the period before it: a rescan reads these again and keeps the others
    /// from the scan before, but for its sweep (see `procs::Reuse`).
    changed_pids: HashSet<u32>,
    changed_before: HashSet<u32>,
    /// The next rescan reads every process: events were lost since the last one.
    scan_all_next: bool,
    move_log: MoveLog,
    /// Under systemd: plans that made leaves in a delegated unit (a restarted unit's new
    /// cgroup): the main loop watches the new leaves (`SystemdWatch`).
    leaves_made: u64,
    /// Set while a plan that changes limits on purpose runs (`execute_change`: the demand
    /// split, a guard): what it sets under systemd is that change, not a repair of drift.
    changing: Option<&'static str>,
    started: Instant,
    /// Under systemd, per tenant, what the last full plan found (its units, its scope's
    /// properties, the units it shares): what the event path decides from between plans.
    governed: BTreeMap<String, plan::Governed>,
    /// Under systemd, the "not applied through systemd" lines already logged: each is said
    /// once (at the first plan that finds it), not at every rescan.
    told_not_applied: HashSet<String>,
    /// A full plan asked for by the event path (a tenant's process in a unit the last plan did
    /// not see), due at this time.
    rescan_due: Option<Instant>,
    /// When the event path last asked for one (at most one a second).
    rescan_asked: Option<Instant>,
}

/// Move lines for the log: one per move, but at most `MOVE_LINES_PER_SECOND` per tenant in
/// any one second; the moves past that are counted and told in one line per tenant when the
/// second is over. A fork storm then costs the daemon (and journald) a line a second, not one
/// write per process, and the log still says what happened.
#[derive(Default)]
struct MoveLog {
    window_start: Option<Instant>,
    /// Per tenant: lines logged in this window, moves not logged one by one.
    tenants: HashMap<String, (u32, u64)>,
}

const MOVE_LINES_PER_SECOND: u32 = 20;
const MOVE_LOG_WINDOW: Duration = Duration::from_secs(1);

impl MoveLog {
    /// `comm` is asked only for a line that is logged: the daemon reads argv, not the kernel's
    /// comm, to classify (one file less per exec), but a log line must show the kernel's comm,
    /// the name a `comm` rule matches.
    fn moved(
        &mut self,
        pid: u32,
        comm: impl FnOnce() -> String,
        tenant: &str,
        leaf: &str,
        rule: &str,
    ) {
        let now = Instant::now();
        if self
            .window_start
            .is_none_or(|s| now.duration_since(s) >= MOVE_LOG_WINDOW)
        {
            self.flush(now, false);
            self.window_start = Some(now);
        }
        let entry = match self.tenants.get_mut(tenant) {
            Some(e) => e,
            None => self.tenants.entry(tenant.to_string()).or_default(),
        };
        if entry.0 < MOVE_LINES_PER_SECOND {
            entry.0 += 1;
            let comm = comm();
            info!(pid, comm, tenant, leaf, rule, "move");
        } else {
            entry.1 += 1;
        }
    }

    /// When the summary of the current window is due (only if something is left to tell).
    fn due(&self) -> Option<Instant> {
        let start = self.window_start?;
        self.tenants
            .values()
            .any(|&(_, quiet)| quiet > 0)
            .then(|| start + MOVE_LOG_WINDOW)
    }

    /// Tells the moves not logged one by one, if the window is over by `now` (or `at_exit`).
    fn flush(&mut self, now: Instant, at_exit: bool) {
        let Some(start) = self.window_start else {
            return;
        };
        if now.duration_since(start) < MOVE_LOG_WINDOW && !at_exit {
            return;
        }
        let window_ms = now.duration_since(start).as_millis() as u64;
        for (tenant, (lines, quiet)) in self.tenants.iter_mut() {
            if *quiet > 0 {
                info!(
                    tenant = tenant.as_str(),
                    moves = *quiet,
                    logged = *lines,
                    window_ms,
                    "more moves than {MOVE_LINES_PER_SECOND} a second into this tenant: these were not logged one by one"
                );
            }
            *lines = 0;
            *quiet = 0;
        }
        self.window_start = None;
    }
}

/// When an event happened, for the latency histograms.
#[derive(Debug, Clone, Copy)]
struct EventTime {
    /// When the daemon read it (or, for a re-check, when the re-check was due).
    received: Instant,
    /// When the kernel emitted it (CLOCK_MONOTONIC ns), for events from the connector.
    kernel_ns: Option<u64>,
}

fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The daemon's latency histograms (microseconds, up to 60,000 s): two significant digits, so
/// a figure is within 1% of what was recorded. Three kept 221 KiB per histogram, 0.9 MiB of
/// the daemon's heap for the four; two keep 30 KiB.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 2).expect("valid histogram bounds")
}

impl Daemon {
    /// Lets the metrics endpoint see the current policy and layout.
    fn publish(&self) {
        let mut view = self.shared.view.write().unwrap_or_else(|e| e.into_inner());
        *view = (self.ctx.loaded.policy.clone(), self.ctx.layout.clone());
        drop(view);
        let hash = metrics::policy_hash(&self.live.sources);
        let mut state = self
            .shared
            .policy
            .write()
            .unwrap_or_else(|e| e.into_inner());
        if state.hash != hash {
            state.loaded_at = unix_ms() as f64 / 1000.0;
        }
        state.hash = hash;
        state.config = Some(crate::policy::PolicyPath::new(
            self.live.config.clone(),
            self.live.trust,
        ));
        state.overrides = self.live.overrides(&self.ctx.loaded.policy);
    }

    /// The policy files this daemon runs on, for `status` and `top` when the files on disk no
    /// longer validate (see `engine::running_policy`); written at start and at each change.
    fn publish_policy(&self) {
        crate::rundir::publish_owned(
            &crate::rundir::state_path(&self.ctx.loaded.policy.agent.root_name, "policy"),
            &self.live.sources,
        );
    }

    /// Whether a tenant's leaves hold no process in the cpuset hierarchy (two small reads).
    fn tenant_groups_empty(&self, tenant: usize) -> bool {
        let layout = &self.ctx.layout;
        let Some((h, _)) = layout.setup.driver_of(crate::cgroup::Controller::Cpuset) else {
            return false;
        };
        let name = &self.ctx.loaded.policy.tenants[tenant].name;
        [Leaf::Limited, Leaf::Exempt].iter().all(|leaf| {
            std::fs::read_to_string(crate::cgroup::procs_file(&layout.leaf_dir(h, name, *leaf)))
                .is_ok_and(|t| t.trim().is_empty())
        })
    }

    /// Remembers which tenants' node changes wait for their restart (see `deferred_moves`).
    fn note_deferred_moves(&mut self, plan: &Plan) {
        let tenants = &self.ctx.loaded.policy.tenants;
        let deferred: std::collections::BTreeSet<usize> = plan
            .memory_moves
            .iter()
            .filter(|m| !m.migrate)
            .filter_map(|m| tenants.iter().position(|t| t.name == m.tenant))
            .collect();
        for m in plan.memory_moves.iter().filter(|m| !m.migrate) {
            let known = tenants
                .iter()
                .position(|t| t.name == m.tenant)
                .is_some_and(|i| self.deferred_moves.contains(&i));
            if !known {
                info!(
                    tenant = %m.tenant,
                    "NUMA nodes change from {} to {} at the instance's restart (its processes keep running on {}; `dbcage apply --migrate-memory` moves them now)",
                    m.from, m.to, m.from
                );
            }
        }
        self.deferred_moves = deferred;
    }

    /// The host read again for a policy (every process), with the daemon's watched groups.
    fn read_host(&self, loaded: crate::policy::Loaded) -> Result<Prepared, engine::Failed> {
        let read = engine::read_host_scanning(loaded, Scan::Rules);
        read.map(|ctx| self.with_watched_groups(ctx))
    }

    /// `read_host` for a rescan: with process events flowing and none lost since the scan
    /// before, the processes they do not name are kept from it (a share of them read again in
    /// turn, for what changes without an event: `sweep_shares`), and so are the groups of those
    /// placed (`Snapshot::read_watched`); otherwise every process is read. A rule on
    /// `unit` reads every process: a unit's processes can change groups without an event. The
    /// scan before is taken from `ctx` (updated in place into the new one); a failed rescan
    /// puts its own scan back there when it made one (`keep_failed_scan`).
    fn read_host_again(&mut self) -> Result<Prepared, engine::Failed> {
        let loaded = self.ctx.loaded.clone();
        if !self.connected || self.scan_all_next || self.fields.unit {
            self.stats.rescans_full += 1;
            return self.read_host(loaded);
        }
        // Every process born since the scan before was named by its fork (no event was lost):
        // the pids come from that scan and the events, except at every `shares`-th rescan,
        // which lists /proc (a safety net for what no event tells, bounded like the sweep's,
        // and where processes gone without being checked or swept leave the inventory).
        let shares = sweep_shares(self.ctx.inventory.procs.len());
        let listed = self.stats.rescans.is_multiple_of(u64::from(shares));
        let mut changed: Vec<u32> = (self.changed_pids.iter())
            .chain(&self.changed_before)
            .copied()
            .collect();
        changed.sort_unstable();
        changed.dedup();
        let mut placed: Vec<u32> = self.members.keys().copied().collect();
        placed.sort_unstable();
        let reuse = crate::inventory::procs::Reuse {
            previous: std::mem::take(&mut self.ctx.inventory.procs),
            skipped: &self.ctx.inventory.skipped_pids,
            changed: &changed,
            sweep: crate::inventory::procs::Sweep {
                turn: self.stats.rescans,
                of: shares,
                checked_of: SWEEP_SHARES,
            },
            from_events: !listed,
            checked: &placed,
        };
        let read = engine::read_host_reusing(loaded, reuse);
        read.map(|ctx| self.with_watched_groups(ctx))
    }

    /// A host read given the daemon's watched groups (see `GroupWatch`) and its memo of what
    /// its processes matched (`classify::Memo`).
    fn with_watched_groups(&self, mut ctx: Prepared) -> Prepared {
        ctx.groups = self.ctx.groups.clone();
        ctx.classified = self.ctx.classified.clone();
        ctx
    }

    fn rescan(&mut self, why: &str) {
        let start = Instant::now();
        self.stats.rescans += 1;
        self.shared.health.rescans.fetch_add(1, Ordering::Relaxed);
        self.shared
            .health
            .last_scan_ms
            .store(unix_ms(), Ordering::Relaxed);
        // Re-read the host (devices and processes) so that device changes are picked up too,
        // but not the policy file: that changes on SIGHUP only, and a broken file must not stop
        // the safety net.
        match self
            .read_host_again()
            .and_then(|c| match engine::plan_placed(&c, &self.adjust) {
                Ok((plan, placed)) => Ok((c, plan, placed)),
                Err(e) => Err(engine::Failed::after(e, c.inventory)),
            }) {
            Ok((ctx, plan, placed)) => {
                let scanned = ctx.inventory.scanned;
                let (read, kept) = (scanned.read as u64, (scanned.listed - scanned.read) as u64);
                self.stats.rescan_procs_read += read;
                self.stats.rescan_procs_kept += kept;
                let health = &self.shared.health;
                health.rescan_procs_read.fetch_add(read, Ordering::Relaxed);
                health.rescan_procs_kept.fetch_add(kept, Ordering::Relaxed);
                // The events since this scan began are kept for the next two.
                self.changed_before = std::mem::take(&mut self.changed_pids);
                self.scan_all_next = false;
                self.ctx = ctx;
                self.take_governed(&plan);
                self.publish();
                let (ok, written) = self.execute(&plan, None);
                if ok && plan.adopts_before_leaves() && self.rescan_due.is_none() {
                    // Adopted into a scope's own group: the next plan makes its leaves.
                    self.rescan_due = Some(Instant::now());
                }
                self.note_deferred_moves(&plan);
                // Plans write only values that differ from the kernel's: each write here
                // corrects a drift from the policy in force.
                self.shared
                    .health
                    .corrections
                    .fetch_add(written as u64, Ordering::Relaxed);
                self.set_members(placed);
                // A full plan's paths and values are the daemon's peak after the first; freed,
                // they would stay in its RSS (1,000 tenants: 24 -> 32 MiB over 20 rescans). The
                // plan goes first (0.5 MiB more at 1,000 tenants when trimmed with it alive).
                drop(plan);
                release_freed_memory();
            }
            Err(engine::Failed { error, inventory }) => {
                let next = self.keep_failed_scan(inventory.map(|i| *i));
                warn!("rescan ({why}) failed, keeping the groups and members as they were ({next}): {error:#}")
            }
        }
        let _ = self.rescan_hist.record(start.elapsed().as_micros() as u64);
    }

    /// After a failed rescan: the scan before went into it (updated in place), so the next
    /// rescan starts from the failed one's scan when it got that far, reading again what that
    /// one read (its processes' matches and groups were not taken in: they count as changed);
    /// otherwise, or after a scan of every process, the next rescan reads every process. Says
    /// which, for the log.
    fn keep_failed_scan(&mut self, inventory: Option<crate::inventory::Inventory>) -> String {
        let Some(inventory) = inventory else {
            self.scan_all_next = true;
            return "the next rescan reads every process".into();
        };
        let full = inventory.unchanged.is_empty();
        if !full {
            // Read in the failed rescan: every scanned process not kept from the one before
            // (both lists in pid order).
            let mut kept = inventory.unchanged.iter().peekable();
            for p in &inventory.procs {
                while kept.next_if(|&&k| k < p.pid).is_some() {}
                if kept.next_if_eq(&&p.pid).is_none() {
                    self.changed_pids.insert(p.pid);
                }
            }
        }
        self.scan_all_next = full;
        let read_again = (inventory.procs.len()).saturating_sub(inventory.unchanged.len());
        self.ctx.inventory.procs = inventory.procs;
        self.ctx.inventory.skipped_pids = inventory.skipped_pids;
        match full {
            true => "the next rescan reads every process".into(),
            false => format!(
                "the next rescan starts from this one's scan, reading again the {read_again} processes it read"
            ),
        }
    }

    /// The tenants' processes (as classified now) that sit in groups without the controllers
    /// their tenant's limits need (a cpuset only when the tenant pins cpus or nodes: the full
    /// set is no limit).
    fn uncovered(&self) -> Vec<crate::cgroup::coverage::Uncovered> {
        let mut out = Vec::new();
        for (ti, tenant) in self.ctx.loaded.policy.tenants.iter().enumerate() {
            for leaf in [Leaf::Limited, Leaf::Exempt] {
                let mut pids: Vec<u32> = self
                    .members
                    .iter()
                    .filter(|(_, place)| **place == (ti, leaf))
                    .map(|(pid, _)| *pid)
                    .collect();
                pids.sort_unstable();
                let systemd = self.ctx.manager == crate::systemd::Manager::Systemd;
                let mut needed = crate::cgroup::coverage::checked(
                    crate::cgroup::coverage::needed_by_policy(tenant),
                    &self.ctx.layout.setup,
                    systemd,
                );
                if leaf == Leaf::Exempt {
                    // The exempt leaf has the tenant's cpu and memory limits, no IO limits.
                    needed.remove(&crate::cgroup::Controller::Io);
                }
                out.extend(crate::cgroup::coverage::check(
                    &self.ctx.fs,
                    &self.ctx.layout.setup,
                    &tenant.name,
                    &pids,
                    &needed,
                    systemd,
                ));
            }
        }
        out
    }

    fn refresh_members(&mut self) {
        let placements = self
            .ctx
            .loaded
            .policy
            .matcher
            .classify(&self.ctx.inventory.procs);
        self.set_members(placements);
    }

    /// The members as `placements` (of the processes in `ctx.inventory`) say: a plan's own, so
    /// that a rescan classifies each process once, not a second time for its members (cheap
    /// when the rules' patterns reject a process on its first bytes, as the 1,000-tenant
    /// bench's do; not so for unanchored ones like `LOCAL=NO`, which read the whole cmdline).
    fn set_members(&mut self, placements: Vec<classify::Placement>) {
        self.members.clear();
        for p in placements {
            self.members.insert(p.pid, (p.tenant, p.leaf));
        }
        self.has_descendant_rules = self
            .ctx
            .loaded
            .policy
            .tenants
            .iter()
            .any(|t| t.rules.iter().chain(&t.exempt).any(|r| r.descendants));
        self.fields = classify::fields_needed(&self.ctx.loaded.policy.tenants);
    }

    /// Under systemd: what a full plan found for each tenant (`plan::Governed`), for the event
    /// path, and the units the metrics read (`Layout::units`); logs what the plan cannot apply
    /// through systemd, once.
    fn take_governed(&mut self, plan: &Plan) {
        if self.ctx.manager != crate::systemd::Manager::Systemd {
            return;
        }
        self.ctx.layout.units = plan.units();
        self.governed = plan.governed();
        let not_applied = crate::cgroup::systemd::NOT_APPLIED;
        for w in plan.warnings.iter().filter(|w| w.contains(not_applied)) {
            if self.told_not_applied.insert(w.clone()) {
                warn!("{w}");
            }
        }
    }

    /// Whether a tenant's process (its /proc/PID/cgroup, `proc_cgroup`) is in one of its units
    /// that hold its leaves (`plan::Governed::delegated`; `group`: the unit's cgroup) but, in
    /// the io hierarchy, not in `leaf`.
    fn outside_its_leaf(&self, tenant: &str, leaf: Leaf, group: &str, proc_cgroup: &str) -> bool {
        let Some(g) = self.governed.get(tenant) else {
            return false;
        };
        let Some((_, unit_dir)) = g.delegated.iter().find(|(cg, _)| cg == group) else {
            return false;
        };
        let setup = &self.ctx.layout.setup;
        setup
            .hierarchy_of(crate::cgroup::Controller::Io)
            .and_then(|h| setup.hierarchies[h].group_dir(proc_cgroup))
            .is_some_and(|d| d != unit_dir.join(leaf.dir()))
    }

    /// Puts a tenant's process into its leaf in its delegated unit (`unit_group`), with the
    /// same steps a full plan makes (`plan::delegated::steps`, from the unit's tree read now
    /// and the tenant's settings of the last plan): after a restart the unit's cgroup is new,
    /// so its leaves are made, every process in the unit's own group moved, io enabled and
    /// the IO limits written again. `false` when the tree cannot hold the leaves now, or a
    /// step failed: the caller plans in full.
    fn place_in_its_leaf(
        &mut self,
        pid: u32,
        ti: usize,
        leaf: Leaf,
        (unit, unit_group): (&str, &str),
        event_at: EventTime,
    ) -> bool {
        let tenant = self.ctx.loaded.policy.tenants[ti].name.clone();
        let Some(settings) = self.governed.get(&tenant).map(|g| g.settings.clone()) else {
            return false;
        };
        let setup = &self.ctx.layout.setup;
        let Some(h) = setup.hierarchy_of(crate::cgroup::Controller::Io) else {
            return false;
        };
        let tree = match crate::cgroup::delegated::DelegatedTree::read(
            &setup.hierarchies[h],
            unit_group,
        ) {
            Some(t) if t.io_available && t.foreign.is_empty() => t,
            _ => return false,
        };
        let steps = crate::plan::delegated::steps(
            &tenant,
            unit,
            &tree,
            &settings,
            |p| (p == pid).then_some(leaf),
            |p| crate::inventory::procs::read_comm(&self.ctx.fs, p).unwrap_or_default(),
            crate::cgroup::page_size(),
        );
        if steps.is_empty() {
            return true;
        }
        let plan = Plan {
            steps,
            ..Plan::default()
        };
        self.execute(&plan, Some(event_at)).0
    }

    /// A tenant's process seen by the event path under systemd. In a unit the tenant is
    /// governed in (its own service, its scope), or one it shares: nothing to do. Started
    /// outside systemd (no unit, a login session, a user's manager): adopted into the tenant's
    /// scope now, through the same `engine::execute` as a full plan's adoptions. In a unit the
    /// last plan did not see (a new service): a full plan, now, sets its properties.
    fn govern_in_systemd(&mut self, pid: u32, ti: usize, leaf: Leaf, event_at: EventTime) {
        let tenant = self.ctx.loaded.policy.tenants[ti].name.clone();
        // A member: its forks are re-checked (a child forked before its parent's adoption
        // stays where it was and is adopted on its re-check).
        self.members.insert(pid, (ti, leaf));
        // Read once: its unit, and where it is in the io hierarchy (`outside_its_leaf`).
        let Ok(proc_cgroup) = self.ctx.fs.read_to_string(format!("/proc/{pid}/cgroup")) else {
            return; // gone
        };
        let found = crate::systemd::unit_group_of(&proc_cgroup);
        let action = {
            let g = self.governed.get(&tenant);
            crate::systemd::plan::on_event(
                &crate::systemd::scope_name(&tenant),
                found.as_ref().map(|(u, g)| (u.as_str(), g.as_str())),
                g.map_or(&[][..], |g| &g.units),
                g.map_or(&[][..], |g| &g.shared),
            )
        };
        use crate::systemd::plan::OnEvent;
        // In a unit that holds the tenant's leaves, but not in its leaf (in the unit's own
        // group after a restart, or in `limited` when it turned out exempt): into its leaf now,
        // the leaves made again if the restart removed them; a full plan when that fails.
        let outside_leaf = match (&action, &found) {
            (OnEvent::Stays, Some((unit, group)))
                if self.outside_its_leaf(&tenant, leaf, group, &proc_cgroup) =>
            {
                Some((unit.clone(), group.clone()))
            }
            _ => None,
        };
        let action = match &outside_leaf {
            Some((unit, group)) => {
                match self.place_in_its_leaf(pid, ti, leaf, (unit, group), event_at) {
                    true => OnEvent::Stays,
                    false => OnEvent::PlanAgain,
                }
            }
            None => action,
        };
        match action {
            OnEvent::Stays => self.stats.already_placed += 1,
            OnEvent::PlanAgain => {
                let now = Instant::now();
                let due = self
                    .rescan_asked
                    .map_or(now, |at| (at + Duration::from_secs(1)).max(now));
                if self.rescan_due.is_none() {
                    let unit = found.map(|(u, _)| u).unwrap_or_default();
                    if outside_leaf.is_some() {
                        info!(pid, tenant = %tenant, unit = %unit, "a tenant's process in its delegated unit, not in its leaf, and the leaf cannot be made now: planning again");
                    } else {
                        info!(pid, tenant = %tenant, unit = %unit, "a tenant's process in a unit the last plan did not see: planning again");
                    }
                    self.rescan_due = Some(due);
                    self.rescan_asked = Some(due);
                }
            }
            OnEvent::Adopt => {
                let scope = crate::systemd::scope_cgroup(&tenant);
                let (properties, in_leaves, wants_leaves) = self
                    .governed
                    .get(&tenant)
                    .map(|g| {
                        let holds = g.delegated.iter().any(|(cg, _)| *cg == scope);
                        (g.properties.clone(), holds, g.scope_wants_leaves)
                    })
                    .unwrap_or_default();
                let mut pids = vec![(pid, leaf)];
                if let Some((_, group)) = &found {
                    pids.extend(self.same_tenant_in(group, ti, pid));
                }
                let plan = Plan {
                    steps: crate::plan::adoptions(
                        &tenant,
                        &pids,
                        in_leaves,
                        &properties,
                        &format!("tenant {tenant}'s process started outside systemd"),
                    ),
                    ..Plan::default()
                };
                if !self.execute(&plan, Some(event_at)).0 {
                    // Not known to be there: the next event or rescan looks again.
                    self.members.remove(&pid);
                    return;
                }
                if !in_leaves && wants_leaves && self.rescan_due.is_none() {
                    // In the scope's own group: the plan makes its leaves and moves them in.
                    info!(tenant = %tenant, "adopted into the scope's own group: planning its leaves now");
                    self.rescan_due = Some(Instant::now());
                }
                // The scope is one of the tenant's units from now on (for the metrics too).
                let units = self.ctx.layout.units.entry(tenant.clone()).or_default();
                if !units.contains(&scope) {
                    units.push(scope.clone());
                    self.governed.entry(tenant).or_default().units.push(scope);
                    self.publish();
                }
            }
        }
    }

    /// The tenant's other processes in `group` (a login session's scope): a postmaster's
    /// children forked before it was adopted. Adopted with it in one call, rather than one
    /// D-Bus round trip each as their re-checks come (measured in the guest under TCG: seven
    /// processes one by one took 1.6 s). Only a unit's group: the root's holds the kernel's
    /// threads. Each becomes a member, so that its re-checks find it placed.
    fn same_tenant_in(&mut self, group: &str, ti: usize, pid: u32) -> Vec<(u32, Leaf)> {
        let Some(dir) = self
            .ctx
            .layout
            .setup
            .hierarchies
            .iter()
            .find(|h| h.version == crate::cgroup::Version::V2)
            .and_then(|h| h.dir_of(group))
        else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for other in crate::cgroup::procs_in(&dir) {
            if other == pid {
                continue;
            }
            let Some(p) = self.reader.read(other, self.fields) else {
                continue;
            };
            let policy = &self.ctx.loaded.policy;
            if let Some(x) =
                classify::classify_direct(&policy.tenants, &p).filter(|x| x.tenant == ti)
            {
                self.members.insert(other, (ti, x.leaf));
                out.push((other, x.leaf));
            }
        }
        out
    }

    /// Runs a plan: whether every step succeeded (a vanished process is not a failure), and
    /// the number of control-file writes it made.
    fn execute(&mut self, plan: &Plan, event_at: Option<EventTime>) -> (bool, usize) {
        let write_start = Instant::now();
        if let Some(at) = event_at {
            let _ = self
                .event_hist
                .record(write_start.duration_since(at.received).as_micros().max(1) as u64);
            if let Some(k) = at.kernel_ns {
                let now = monotonic_ns();
                let _ = self
                    .kernel_hist
                    .record((now.saturating_sub(k) / 1000).max(1));
            }
        }
        let outcome = engine::execute(plan);
        // Under systemd dbcage makes no group but a delegated unit's (or its scope's) leaves.
        if self.ctx.manager == crate::systemd::Manager::Systemd
            && plan.steps.iter().any(|s| matches!(s, Step::Mkdir { .. }))
        {
            self.leaves_made += 1;
        }
        if let Some(g) = &self.ctx.groups {
            GroupWatch::lock(g).absorb_events_if_due();
        }
        let _ = self
            .write_hist
            .record(write_start.elapsed().as_micros().max(1) as u64);
        self.note_moved(plan);
        // Logged after the writes, so that the line costs the process no time outside its group.
        self.note_leaf_repairs(plan, &outcome);
        for s in &plan.steps {
            if let Step::SetUnitProperties { unit, set, was, .. } = s {
                if let Some(by) = self.changing {
                    for (want, now) in set.iter().zip(was) {
                        debug!(unit = %unit, "{by}: set {want} (was {now})");
                    }
                    continue;
                }
                for (want, now) in set.iter().zip(was) {
                    info!(unit = %unit, "unit property {now} differs from the plan: set {want}");
                }
                self.shared
                    .health
                    .systemd_repairs
                    .fetch_add(set.len() as u64, Ordering::Relaxed);
            }
            if let Step::Adopt { tenant, pids, .. } = s {
                // Said only when it happened (a failed adoption has its warning; a process
                // that exited first is counted as vanished).
                if outcome.errors.is_empty() && outcome.vanished < pids.len() {
                    info!(tenant = %tenant, ?pids, "adopted into {}", crate::systemd::scope_name(tenant));
                }
            }
        }
        for s in &plan.steps {
            if let Step::Move {
                pid,
                comm,
                tenant,
                leaf,
                reason,
                ..
            } = s
            {
                let fs = &self.ctx.fs;
                let kernel_comm =
                    || crate::inventory::procs::read_comm(fs, *pid).unwrap_or_else(|| comm.clone());
                self.move_log
                    .moved(*pid, kernel_comm, tenant, leaf.dir(), reason);
            }
        }
        self.record(&outcome);
        (outcome.errors.is_empty(), outcome.written)
    }

    /// Under systemd: an IO limit file of a delegated unit's leaf that held something else
    /// than the plan (written by someone else: `SystemdWatch` brings the plan at once) and was
    /// written back, logged and counted with the units' repaired properties. A leaf the same
    /// plan makes (a restarted unit's) is new, not drifted.
    fn note_leaf_repairs(&self, plan: &Plan, outcome: &engine::Outcome) {
        if self.ctx.manager != crate::systemd::Manager::Systemd || self.changing.is_some() {
            return;
        }
        let made: std::collections::HashSet<&Path> = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Mkdir { path, .. } => Some(path.as_path()),
                _ => None,
            })
            .collect();
        let failed: std::collections::HashSet<&Path> =
            outcome.errors.iter().filter_map(|e| e.path()).collect();
        let mut repaired = std::collections::BTreeSet::new();
        for s in &plan.steps {
            let Step::Write {
                path,
                value,
                current: Some(was),
                ..
            } = s
            else {
                continue;
            };
            let new_leaf = path.parent().is_some_and(|leaf| made.contains(leaf));
            if !crate::cgroup::is_io_limit_file(path)
                || new_leaf
                || failed.contains(path.as_path())
                || was.trim() == value.trim()
            {
                continue;
            }
            if repaired.insert(path) {
                info!(
                    "{} held {was:?}, which differs from the plan: wrote {value:?}",
                    path.display()
                );
            }
        }
        self.shared
            .health
            .systemd_repairs
            .fetch_add(repaired.len() as u64, Ordering::Relaxed);
    }

    /// Runs a plan that changes limits on purpose (`by`: the demand split, a guard), whose
    /// unit properties and leaf files are that change (logged at debug level), not repairs.
    fn execute_change(&mut self, plan: &Plan, by: &'static str) -> (bool, usize) {
        self.changing = Some(by);
        let done = self.execute(plan, None);
        self.changing = None;
        done
    }

    /// Remembers when the processes a plan moved got there, for `forked_during_move`.
    fn note_moved(&mut self, plan: &Plan) {
        let moves = plan.steps.iter().filter_map(|s| match s {
            Step::Move { pid, leave, .. } => Some((*pid, !leave.is_empty())),
            _ => None,
        });
        self.moved_at.record(moves, monotonic_ns());
    }

    /// True when `child`'s fork, reported at `fork_ns`, may have put it in the groups its
    /// parent was being moved out of. A move takes the lock every fork holds (for reading)
    /// while it picks the child's groups, and the kernel stamps the fork event inside that
    /// section (proc_fork_connector comes before cgroup_post_fork). So a fork stamped after the
    /// parent's writes returned inherited the new groups; one stamped before may have kept the
    /// old ones (in every hierarchy, or in those not yet written), and the fork event, handled
    /// after the move, finds the parent a member. Such a child is moved explicitly, whatever it
    /// execs into later (the escape: 2 to 4 children per 1,000 left behind in a storm whose
    /// forking parent was being placed).
    fn forked_during_move(&self, parent: u32, fork_ns: u64) -> bool {
        self.moved_at
            .get(parent)
            .is_some_and(|(done, _)| fork_ns <= done)
    }

    /// Moves a child forked while its parent was being moved into the parent's place.
    fn place_forked(&mut self, child: u32, parent: u32, place: (usize, Leaf), at: EventTime) {
        let placement = classify::Placement {
            pid: child,
            tenant: place.0,
            leaf: place.1,
            reason: format!("forked by {parent} while it was being moved"),
        };
        // Written without reading where it is (its groups may not be final when the fork event
        // comes). Where the parent's move took it out of dbcage's groups, the child may still
        // be in them: taken out the same way (a no-op for the kernel if it is not).
        let layout = &self.ctx.layout;
        let parent_left = self.moved_at.get(parent).is_some_and(|(_, left)| left);
        let dirs = (0..layout.setup.hierarchies.len())
            .map(|h| parent_left.then(|| layout.root_dir(h).into()))
            .collect();
        let mut snap = Snapshot::default();
        snap.proc_dirs.insert(child, dirs);
        let steps = plan::moves(
            &self.ctx.loaded.policy,
            &[],
            &self.ctx.layout,
            &snap,
            &[placement],
        );
        let plan = Plan {
            steps,
            ..Plan::default()
        };
        self.stats.forked_during_move += 1;
        if !self.execute(&plan, Some(at)).0 {
            self.members.remove(&child);
        }
    }

    /// Counts what a plan's execution did and logs its errors.
    fn record(&mut self, outcome: &engine::Outcome) {
        self.stats.moves += outcome.moved as u64;
        self.shared
            .health
            .moves
            .fetch_add(outcome.moved as u64, Ordering::Relaxed);
        self.stats.vanished += outcome.vanished as u64;
        self.shared
            .health
            .apply_errors
            .fetch_add(outcome.errors.len() as u64, Ordering::Relaxed);
        for e in &outcome.errors {
            warn!("{e}");
        }
        if !outcome.errors.is_empty() {
            // A write the kernel refused raises no inotify event: the groups it went to (a
            // vanished disk's IO lines, a cpuset the kernel narrowed) are read again next time,
            // everything when an error names no group.
            if let Some(g) = &self.ctx.groups {
                let mut w = GroupWatch::lock(g);
                for e in &outcome.errors {
                    match e.path() {
                        Some(path) => w.failed(path),
                        None => w.forget_all(),
                    }
                }
            }
        }
        for r in &outcome.recovered {
            info!("{r}");
        }
    }

    /// Classifies one process (with its ancestors when a rule passes a tenant to descendants)
    /// and moves it if it is not where it belongs.
    fn handle_pid(&mut self, pid: u32, event_at: EventTime) {
        let policy = &self.ctx.loaded.policy;
        let fields = self.fields;
        let reader = &mut self.reader;
        let Some(p) = reader.read(pid, fields) else {
            return;
        };
        let mut procs = vec![p];
        let placements: Vec<_> = if self.has_descendant_rules {
            // A descendant claim needs the ancestors, read up to init.
            let mut ppid = procs[0].ppid;
            while ppid > 1 && procs.len() < 64 {
                match reader.read(ppid, fields) {
                    Some(a) => {
                        ppid = a.ppid;
                        procs.push(a);
                    }
                    None => break,
                }
            }
            policy
                .matcher
                .classify(&procs)
                .into_iter()
                .filter(|x| x.pid == pid)
                .collect()
        } else {
            policy
                .matcher
                .classify_direct(&procs[0])
                .into_iter()
                .collect()
        };
        let Some(placed) = placements.first() else {
            return;
        };
        if self.ctx.manager == crate::systemd::Manager::Systemd {
            // dbcage never moves it through cgroupfs: it stays in its unit, or systemd adopts it.
            let (tenant, leaf) = (placed.tenant, placed.leaf);
            self.govern_in_systemd(pid, tenant, leaf, event_at);
            return;
        }
        // The first process of a restarted instance whose node change waited for the restart:
        // a full plan writes the new nodes before it moves the process in (the kernel's exit
        // events, which would have said when the old instance was gone, are not subscribed).
        if self.deferred_moves.contains(&placed.tenant)
            && self.members.get(&pid) != Some(&(placed.tenant, placed.leaf))
            && self.tenant_groups_empty(placed.tenant)
        {
            self.rescan("a tenant whose NUMA nodes change at its restart starts again");
            return;
        }
        let place = (placed.tenant, placed.leaf);
        let before = self.members.insert(pid, place);
        if before == Some(place) {
            // Placed there already (by us, or inherited from its parent): nothing to read or write.
            self.stats.already_placed += 1;
            return;
        }
        // Not a member in that place: written into every hierarchy without reading
        // /proc/PID/cgroup first. Such a process is almost always somewhere else (members cover
        // what this daemon placed and what inherited it); when it is already there (started by
        // `dbcage exec`), the write is a no-op for the kernel. The read cost more than a third
        // of the daemon's time per new process (p50 30 µs, as much as reading its cmdline).
        // A process of another tenant (rare) is read: it leaves that tenant's groups in the
        // hierarchies its new tenant has none in (a pinned tenant's cpuset, say).
        let layout = &self.ctx.layout;
        let dirs = match before {
            Some((other, _)) if other != placed.tenant => {
                crate::cgroup::proc_group_dirs(&self.ctx.fs, layout, pid)
            }
            _ => None,
        };
        let mut snap = Snapshot::default();
        snap.proc_dirs.insert(
            pid,
            dirs.unwrap_or_else(|| vec![None; layout.setup.hierarchies.len()]),
        );
        let steps = plan::moves(policy, &procs, layout, &snap, &placements);
        if !steps.is_empty() {
            let plan = Plan {
                steps,
                ..Plan::default()
            };
            if !self.execute(&plan, Some(event_at)).0 {
                // Not known to be there: the next event or rescan looks again.
                self.members.remove(&pid);
            }
        }
    }

    fn handle_event(&mut self, timed: Timed, received: Instant) {
        let at = EventTime {
            received,
            kernel_ns: Some(timed.kernel_ns),
        };
        let ev = timed.event;
        self.stats.events += 1;
        self.shared.health.events.fetch_add(1, Ordering::Relaxed);
        if self.changed_pids.len() >= CHANGED_PIDS_MAX {
            self.changed_pids = HashSet::new();
            self.changed_before = HashSet::new();
            self.scan_all_next = true;
        }
        match ev {
            ProcEvent::Exec { pid } | ProcEvent::Comm { pid } | ProcEvent::Ids { pid } => {
                self.changed_pids.insert(pid);
                self.handle_pid(pid, at)
            }
            ProcEvent::Fork { parent, child } => {
                self.changed_pids.insert(child);
                if let Some(&t) = self.members.get(&parent) {
                    self.members.insert(child, t);
                    for d in RECHECK_AFTER {
                        self.rechecks.insert((received + d, child), ());
                    }
                    if self.forked_during_move(parent, timed.kernel_ns) {
                        self.place_forked(child, parent, t, at);
                    }
                } else {
                    // A reused PID (exits are not always delivered) must not look placed.
                    self.members.remove(&child);
                }
            }
            ProcEvent::Exit { pid } => {
                self.members.remove(&pid);
            }
            ProcEvent::Other | ProcEvent::Acknowledgement => {}
        }
    }

    /// Events stop coming (the socket failed, or the event thread died): say so, and have the
    /// main loop switch to the short fallback rescan at once.
    fn disconnect(&mut self, why: &str, waker: &Waker) {
        warn!(
            "{why}; switching to rescan-only mode every {:?}",
            self.opts.fallback_rescan
        );
        self.connected = false;
        self.shared
            .health
            .events_connected
            .store(0, Ordering::Relaxed);
        waker.wake_before(Instant::now());
    }

    /// The event socket overran: empty it, say so, count it, and rescan so that nothing stays
    /// misplaced. The kernel reports ENOBUFS only for the first drop after the socket's queue
    /// was last empty: drops while it stays full go unreported. So the queue is emptied first
    /// (the events in it are dropped too: the rescan covers them), and only then the host
    /// scanned; a drop after that point is reported again and starts another round.
    fn events_lost(&mut self, connector: &mut Connector) {
        let mut discarded = 0usize;
        let mut scratch: Vec<connector::Timed> = Vec::with_capacity(64);
        loop {
            scratch.clear();
            match connector.receive(&mut scratch) {
                Ok(Received::Events) => discarded += scratch.len(),
                Ok(Received::Overrun) => {}
                Ok(Received::Empty) | Err(_) => break,
            }
        }
        self.stats.overruns += 1;
        self.shared
            .health
            .events_lost
            .fetch_add(1, Ordering::Relaxed);
        warn!(
            overruns = self.stats.overruns,
            queued_events_dropped = discarded,
            "process events were lost (socket buffer overrun): rescanning now"
        );
        let known: HashSet<u32> = self.ctx.inventory.procs.iter().map(|p| p.pid).collect();
        self.scan_all_next = true;
        self.rescan("events lost");
        // The lost events included forks, and with them the re-checks their children were due
        // (a child retitled after this rescan would otherwise wait for the next periodic one).
        // So every process that appeared since the previous scan and now belongs to a tenant
        // gets them from here; those whose fork was seen are merely checked once more.
        let now = Instant::now();
        let newcomers: Vec<u32> = self
            .members
            .keys()
            .filter(|pid| !known.contains(pid))
            .copied()
            .collect();
        for pid in newcomers {
            for d in RECHECK_AFTER {
                self.rechecks.insert((now + d, pid), ());
            }
        }
    }

    /// SIGHUP and `dbcage reload`: the same request, through `control`.
    fn reload(&mut self) -> crate::control::Response {
        use crate::control::Op;
        self.stats.reloads += 1;
        let r = crate::control::handle(self, &Op::Reload {}, Instant::now());
        self.shared
            .policy
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .last_reload_ok = r.ok;
        if r.ok {
            info!("{}", r.message); // it names the files read
        } else {
            self.stats.reload_failures += 1;
            self.shared
                .health
                .reload_failures
                .fetch_add(1, Ordering::Relaxed);
            warn!(
                "reload refused, the running policy stays: {}",
                one_line(&r.message)
            );
        }
        r
    }

    /// The answer to `health`: what `status` shows of the daemon.
    fn health(&self) -> crate::control::Response {
        let h = &self.shared.health;
        let last_scan_ms = h.last_scan_ms.load(Ordering::Relaxed);
        let mut r = crate::control::Response::ok("daemon health");
        r.overrides = self.live.overrides(&self.ctx.loaded.policy);
        r.daemon = Some(crate::control::DaemonHealth {
            pid: std::process::id(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            mode: if self.connected {
                crate::control::DaemonMode::Events
            } else {
                crate::control::DaemonMode::RescanOnly
            },
            rescan_interval_seconds: if self.connected {
                self.opts.rescan
            } else {
                self.opts.fallback_rescan
            }
            .as_secs_f64(),
            events: h.events.load(Ordering::Relaxed),
            events_lost: h.events_lost.load(Ordering::Relaxed),
            rescans: h.rescans.load(Ordering::Relaxed),
            moves: h.moves.load(Ordering::Relaxed),
            reload_failures: h.reload_failures.load(Ordering::Relaxed),
            last_scan_seconds_ago: (last_scan_ms > 0)
                .then(|| unix_ms().saturating_sub(last_scan_ms) as f64 / 1000.0),
        });
        r
    }

    /// A request from the control socket.
    fn control(&mut self, p: crate::control::server::Pending) {
        use crate::control::Op;
        let r = match &p.request.op {
            Op::Reload {} => self.reload(),
            Op::Health {} => self.health(),
            op => {
                let r = crate::control::handle(self, op, p.received);
                if r.ok {
                    match r.applied_us {
                        Some(us) => info!(peer = p.peer.as_str(), applied_us = us, "{}", r.message),
                        None => info!(peer = p.peer.as_str(), "{}", r.message),
                    }
                } else {
                    warn!(
                        peer = p.peer.as_str(),
                        "control request refused: {}",
                        one_line(&r.message)
                    );
                }
                r
            }
        };
        p.reply(r);
    }
}

impl crate::control::Governor for Daemon {
    type Staged = (Prepared, Plan);
    fn live(&self) -> &crate::control::Live {
        &self.live
    }
    fn live_mut(&mut self) -> &mut crate::control::Live {
        &mut self.live
    }
    fn current(&self) -> &crate::policy::Policy {
        &self.ctx.loaded.policy
    }
    fn stage(&mut self, loaded: crate::policy::Loaded) -> Result<Self::Staged> {
        let ctx = self.read_host(loaded).map_err(|failed| failed.error)?;
        // a request is one-off: `set` says how much memory a NUMA move would take
        let adjust = engine::Adjustments {
            skip_move_sizes: false,
            ..self.adjust.clone()
        };
        let plan = engine::plan(&ctx, &adjust)?;
        Ok((ctx, plan))
    }
    fn numa_changes((_, plan): &Self::Staged) -> Vec<String> {
        plan.numa_changes()
    }
    fn commit(&mut self, live: crate::control::Live, (ctx, plan): Self::Staged) -> Vec<String> {
        self.live = live;
        self.ctx = ctx;
        self.take_governed(&plan);
        (self.shared.owners.lock().unwrap_or_else(|e| e.into_inner())).forget();
        self.publish();
        self.publish_policy();
        let outcome = engine::execute(&plan);
        self.note_moved(&plan);
        self.record(&outcome);
        let errors: Vec<String> = outcome.errors.iter().map(|e| e.to_string()).collect();
        self.refresh_members();
        errors
    }
}

/// The directories whose entries decide a storage glob (`/dev/oracleasm/disks` for
/// `/dev/oracleasm/disks/BX1_*`): when a disk appears or goes there, devices are re-resolved.
fn watched_dirs(policy: &crate::policy::Policy) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = policy
        .tenants
        .iter()
        .flat_map(|t| t.storage.iter().flat_map(|s| watch_globs(&s.value)))
        .filter(|p| p.contains(['*', '?', '[']))
        .filter_map(|p| {
            let fixed = &p[..p.find(['*', '?', '[']).unwrap_or(p.len())];
            fixed
                .rfind('/')
                .map(|i| PathBuf::from(if i == 0 { "/" } else { &fixed[..i] }))
        })
        // A server's restart rewrites its pid file: the new PID (and its children) are placed by
        // the rescan the change triggers.
        .chain(
            policy
                .pid_files()
                .filter_map(|f| f.path.parent().map(Path::to_path_buf)),
        )
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// The globs whose directories decide a storage entry: the entry itself, or for an ASM
/// diskgroup (`asm:DG:diskstring`) its discovery globs (ASMLib and AFD labels live in
/// /dev/oracleasm/disks and /dev/oracleafd/disks). A disk added to the group on a device that
/// was already there is seen by asmcmd at the next periodic rescan.
fn watch_globs(entry: &str) -> Vec<String> {
    match crate::inventory::asm::AsmSpec::parse(entry.strip_prefix("asm:").unwrap_or("")) {
        Ok(spec) if entry.starts_with("asm:") => spec.device_globs(),
        _ => vec![entry.to_string()],
    }
}

/// Watches the storage globs' and pid files' directories, also while they are missing (a
/// unit's runtime directory goes when it stops); `None` if inotify is unavailable (the
/// periodic rescan still re-resolves devices and re-reads pid files).
fn watch_dirs(policy: &crate::policy::Policy) -> Option<DirWatch> {
    let (w, failed) = DirWatch::new(watched_dirs(policy))?;
    for (d, e) in failed {
        warn!("cannot watch {} for storage or pid file changes ({e}); they are seen by the periodic rescan", d.display());
    }
    Some(w)
}

/// Where `systemctl set-property` writes a unit's drop-ins: `UNIT.d/` under the runtime
/// directory (`--runtime`) or the persistent one.
const SYSTEMD_CONTROL_DIRS: [&str; 2] =
    ["/run/systemd/system.control", "/etc/systemd/system.control"];

/// Under systemd, what makes the next full plan come at once rather than at the next rescan
/// (it repairs what drifted), watched as they are after each full plan (rebuilt then, to cover
/// new units):
/// - the drop-in directories of `set-property` (each directory and its `UNIT.d`
///   subdirectories): a change there is a property set by someone (or by this daemon). Measured
///   in the guest under TCG: a rescan-only repair took up to 9 s while daemon-reloads ran.
///   `daemon-reload` writes nothing there.
/// - the `limited` leaves in the tenants' delegated units: a write to their IO limit files by
///   someone else (the other files there change as the kernel pleases: `cgroup.events`,
///   `memory.events`, and are not looked at).
///
/// The daemon's own writes come back as events too: the plan after them finds nothing to do.
struct SystemdWatch {
    ino: Inotify,
    /// The watches on leaves (the rest are drop-in directories).
    leaves: std::collections::HashSet<nix::sys::inotify::WatchDescriptor>,
}

impl SystemdWatch {
    fn new(fs: &crate::hostfs::HostFs, leaves: &[PathBuf]) -> Option<SystemdWatch> {
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
        let flags = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_CLOSE_WRITE;
        let mut watched = 0;
        for base in SYSTEMD_CONTROL_DIRS.map(|d| fs.path(d)) {
            let Ok(entries) = std::fs::read_dir(&base) else {
                continue;
            };
            if ino.add_watch(&base, flags).is_ok() {
                watched += 1;
            }
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir())
                    && ino.add_watch(&e.path(), flags).is_ok()
                {
                    watched += 1;
                }
            }
        }
        let mut on_leaves = std::collections::HashSet::new();
        for leaf in leaves {
            // IN_MODIFY: cgroupfs reports a write to a control file to its directory's watch.
            if let Ok(wd) = ino.add_watch(leaf, AddWatchFlags::IN_MODIFY) {
                on_leaves.insert(wd);
            }
        }
        (watched + on_leaves.len() > 0).then_some(SystemdWatch {
            ino,
            leaves: on_leaves,
        })
    }

    /// Reads every pending event: whether one of them is a change the next plan must look at.
    fn changed(&self) -> bool {
        let mut changed = false;
        while let Ok(evs) = self.ino.read_events() {
            if evs.is_empty() {
                break;
            }
            changed |= evs.iter().any(|e| {
                !self.leaves.contains(&e.wd)
                    || e.name
                        .as_ref()
                        .is_some_and(|n| crate::cgroup::is_io_limit_file(Path::new(n)))
            });
        }
        changed
    }
}

/// After a plan that changed limits on purpose (`Daemon::execute_change`): the drop-ins and
/// leaf files it wrote are its own, not someone's change, and bring no full plan (the demand
/// split changes a unit's IO properties every interval while a load moves).
fn forget_own_writes(watch: &Option<SystemdWatch>) {
    if let Some(w) = watch {
        w.changed();
    }
}

/// The `limited` leaves of the tenants' delegated units, in the io hierarchy (`SystemdWatch`).
fn delegated_leaves(governed: &BTreeMap<String, plan::Governed>) -> Vec<PathBuf> {
    governed
        .values()
        .flat_map(|g| &g.delegated)
        .map(|(_, dir)| dir.join(Leaf::Limited.dir()))
        .collect()
}

/// The agent, shared by the main loop and the event thread. A panic on one thread leaves the
/// state as consistent as any single step does (each event is handled on its own), so the
/// other thread goes on with it rather than stopping the daemon.
fn lock(agent: &Mutex<Daemon>) -> MutexGuard<'_, Daemon> {
    agent.lock().unwrap_or_else(|e| e.into_inner())
}

/// Wakes the main loop's poll early when the event thread schedules a re-check that is due
/// before the loop's own deadline (an eventfd, written only then: a fork storm inside a tenant
/// adds re-checks that are mostly later than the earliest one already armed).
struct Waker {
    fd: nix::sys::eventfd::EventFd,
    /// The main loop's armed deadline, in ns after `epoch`.
    armed_ns: AtomicU64,
    epoch: Instant,
}

impl Waker {
    fn new() -> Result<Waker> {
        Ok(Waker {
            fd: nix::sys::eventfd::EventFd::from_value_and_flags(
                0,
                nix::sys::eventfd::EfdFlags::EFD_NONBLOCK
                    | nix::sys::eventfd::EfdFlags::EFD_CLOEXEC,
            )
            .context("eventfd")?,
            armed_ns: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
        })
    }

    fn ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    fn arm(&self, deadline: Instant) {
        self.armed_ns.store(self.ns(deadline), Ordering::Relaxed);
    }

    /// Called with the agent locked, as `arm` is.
    fn wake_before(&self, due: Instant) {
        let due = self.ns(due);
        if due < self.armed_ns.load(Ordering::Relaxed) {
            self.armed_ns.store(due, Ordering::Relaxed);
            if let Err(e) = self.fd.write(1) {
                warn!("waking the main loop: {e}");
            }
        }
    }

    fn clear(&self) {
        let _ = self.fd.read();
    }
}

/// The event thread: waits in recv on the connector socket and handles each datagram as it
/// comes, with the agent locked. It owns the socket alone, so an event costs one recv and no
/// poll; signals, timers, re-checks and the control socket stay on the main loop.
fn event_loop(mut connector: Connector, agent: &Mutex<Daemon>, waker: &Waker) {
    let mut events = Vec::with_capacity(64);
    loop {
        events.clear();
        let received = connector.wait_receive(&mut events);
        let at = Instant::now();
        let mut a = lock(agent);
        let leaves_made = a.leaves_made;
        match received {
            Ok(Received::Events) => {
                for ev in events.drain(..) {
                    a.handle_event(ev, at);
                }
            }
            Ok(Received::Empty) => {}
            Ok(Received::Overrun) => a.events_lost(&mut connector),
            Err(e) => {
                a.disconnect(&format!("reading process events failed ({e})"), waker);
                return;
            }
        }
        if let Some(((due, _), _)) = a.rechecks.first_key_value() {
            waker.wake_before(*due);
        }
        if let Some(due) = a.move_log.due() {
            waker.wake_before(due);
        }
        if let Some(due) = a.rescan_due {
            waker.wake_before(due);
        }
        if a.leaves_made != leaves_made {
            // A restarted unit's new leaves: the main loop watches them now.
            waker.wake_before(at);
        }
    }
}

/// The start-up hint about `favordynmods`, or None when some cgroup mount on the host has it.
/// The option switches one lock that every hierarchy shares (cgroup_threadgroup_rwsem) to
/// favour writers, so any hierarchy mounted with it takes the grace-period wait out of every
/// move, ours included; a controller-less named v1 hierarchy is enough, so the ones in use need
/// not be remounted (measured in the v2 VM: move p50 14.8 -> 0.23 ms, and back after umount).
fn favordynmods_hint(
    hierarchies: &[&Path],
    mounts: &crate::inventory::MountTable,
) -> Option<String> {
    if crate::favordynmods::mounted_with_option(mounts).is_some() || hierarchies.is_empty() {
        return None;
    }
    let list: Vec<String> = hierarchies
        .iter()
        .map(|h| h.display().to_string())
        .collect();
    Some(format!(
        "{} mounted without favordynmods, and no other cgroup mount has it: a move that follows a quiet spell waits for an RCU grace period (8 to 16 ms on v1 here; 0.03 ms when moves come close together). Kernels 6.0 and later take the option at mount time, and it acts on a lock all hierarchies share, so one extra controller-less mount is enough (no remount of these), at some cost to every fork and exit: set agent.favordynmods = true for dbcage to mount it at start, or: {}",
        list.join(", "),
        crate::favordynmods::commands(Path::new(crate::favordynmods::DEFAULT_DIR))
    ))
}

/// Loads the IO latency program for the metrics endpoint; says once if it cannot (the daemon
/// goes on without histograms).
fn load_io_latency(shared: &metrics::Shared) {
    match crate::iolat::loader::IoLatency::load() {
        Ok(prog) => {
            match prog.no_throttle_split() {
                None => info!("IO latency histograms on (eBPF), with the throttle's wait"),
                Some(why) => {
                    warn!("IO latency histograms on (eBPF), without the throttle's wait: {why}")
                }
            }
            // Set once, here: a second value cannot arrive.
            let _ = shared.iolat.set(prog);
        }
        Err(e) => warn!("running without IO latency histograms: {e}"),
    }
}

/// Tells systemd (Type=notify) that the daemon is ready, if NOTIFY_SOCKET is set.
fn notify_ready() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sock = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(e) => return warn!("NOTIFY_SOCKET: {e}"),
    };
    let bytes = path.as_encoded_bytes();
    let result = if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name)
            .and_then(|a| sock.send_to_addr(b"READY=1", &a))
    } else {
        sock.send_to(b"READY=1", &path)
    };
    if let Err(e) = result {
        warn!("NOTIFY_SOCKET: {e}");
    }
}

/// Hands the heap pages freed since start back to the kernel. The first plan of a large policy
/// is the daemon's peak (1,000 tenants: ~27,000 steps, a path each, ~20 MiB); freed, it stays in
/// the allocator's heap and in the daemon's RSS for good unless trimmed.
fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes no pointers; it only returns free pages of glibc's own heap.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// At most two glibc malloc arenas for the daemon's threads (glibc's default is eight per
/// core). The threads besides the main loop (event reader, control server, a rescan's second
/// reader, the scrape's) are mostly idle, but each got an arena of its own on first use whose
/// touched pages stay resident (two held 2.2 MiB at 1,000 tenants). One arena for all cost the
/// scrape's two readers 20% more CPU in lock contention; two did not (bench/README, "Two malloc
/// arenas").
fn at_most_two_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; it runs before the daemon starts a
    // thread, and a refusal (0) leaves glibc's default.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Raises the soft open-file limit towards the hard one, up to 65,536: the metrics endpoint
/// keeps its tenants' groups open between scrapes (`hostfs::KeptDirs`: 4,000 at 1,000
/// tenants on v1, up to a quarter of the soft limit), and systemd starts services with a soft
/// limit of 1,024 for the sake of programs that use select(), leaving the hard limit (524,288)
/// for those that need more. The bound keeps a child (the replication guard's `psql`) from
/// inheriting a limit that makes closing every descriptor slow.
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    let want = limit.maximum.map_or(65_536, |hard| hard.min(65_536));
    if limit.current.is_some_and(|soft| soft < want) {
        let raised = rustix::process::Rlimit {
            current: Some(want),
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::debug!("raising the open-file limit to {want}: {e}");
        }
    }
}

pub fn run(opts: AgentOptions) -> Result<()> {
    at_most_two_malloc_arenas();
    raise_open_file_limit();
    let mut mask = SigSet::empty();
    for s in [Signal::SIGHUP, Signal::SIGTERM, Signal::SIGINT] {
        mask.add(s);
    }
    mask.thread_block().context("blocking signals")?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .context("signalfd")?;

    // Subscribe before the first scan so that nothing started in between is missed.
    let connector = match Connector::open(opts.event_buffer, Some(connector::DAEMON_EVENTS)) {
        Ok(c) => {
            if let Err(e) = c.filter() {
                warn!("the process-event socket refused its filter ({e}): the events of every thread on the host arrive and are sorted out here, at some CPU cost");
            }
            Some(c)
        }
        Err(e) => {
            warn!(
                "process events unavailable ({e}; they need a kernel with CONFIG_PROC_EVENTS, the host's initial network namespace, and before Linux 6.6 CAP_NET_ADMIN): running in rescan-only mode every {:?}",
                opts.fallback_rescan
            );
            None
        }
    };
    let (live, loaded) = crate::control::Live::load(&opts.config)?;
    // The endpoint's protection is settled before anything is applied: a daemon that would
    // serve the host's tenants to the network unprotected does not start.
    let metrics_addr = opts.metrics.unwrap_or(loaded.policy.agent.metrics);
    let web = opts
        .web_config
        .as_deref()
        .map(crate::web::WebConfig::load)
        .transpose()?;
    if let Some(addr) = metrics_addr {
        if web.is_none() && crate::web::exposed(&addr) && !opts.metrics_insecure {
            anyhow::bail!(
                "metrics on {addr} would be served beyond this host without TLS or authentication: give a web configuration (`run --web-config-file web.yml` with tls_server_config and basic_auth_users), serve on 127.0.0.1, or pass --metrics-insecure to do it anyway"
            );
        }
    }
    let mut ctx = engine::read_host(loaded, Scan::Rules)?;
    // Plans reread only the groups written since the last one (inotify); without a watch (no
    // inotify instance left for root: fs.inotify.max_user_instances) every plan reads them all.
    ctx.groups = match GroupWatch::new() {
        Ok(w) => Some(Arc::new(std::sync::Mutex::new(w))),
        Err(e) => {
            warn!("cannot watch dbcage's groups (inotify: {e}); every rescan reads all of them");
            None
        }
    };
    ctx.classified = Some(Arc::default());
    // The IO latency histograms exist only for the metrics endpoint; said once if unavailable.
    if metrics_addr.is_some() && !ctx.loaded.policy.agent.io_latency {
        info!("IO latency histograms off (agent.io_latency = false): no eBPF program loaded");
    }
    let want_iolat = metrics_addr.is_some() && ctx.loaded.policy.agent.io_latency;
    // Before the first moves, so that they too need not wait for a grace period.
    let favordynmods = ctx.loaded.policy.agent.favordynmods.then(|| {
        let r = crate::favordynmods::ensure(&opts.favordynmods_dir, &ctx.inventory.mounts);
        match &r {
            Ok(crate::favordynmods::Outcome::Present(at)) => info!(
                "favordynmods: {} has it already (it acts for every hierarchy): nothing to mount",
                at.display()
            ),
            Ok(crate::favordynmods::Outcome::Mounted(at)) => info!(
                "favordynmods: mounted the controller-less hierarchy {} with it: moves no longer wait for an RCU grace period (every fork and exit on the host pays a little instead; see the README); it stays mounted when dbcage stops",
                at.display()
            ),
            Err(e) => warn!("favordynmods: {e}; moves after a quiet spell keep waiting for an RCU grace period"),
        }
        r
    });
    let shared = Arc::new(metrics::Shared::new(
        ctx.fs.clone(),
        ctx.loaded.policy.clone(),
        ctx.layout.clone(),
    ));
    if let Some(groups) = &ctx.groups {
        // A scrape takes the limits the daemon's walk read, while no event says they changed.
        let watched = crate::cgroup::watch::WatchedFiles(groups.clone());
        shared.kept.know(Arc::new(watched));
    }
    shared
        .health
        .events_connected
        .store(u64::from(connector.is_some()), Ordering::Relaxed);
    if let Some(addr) = metrics_addr {
        let scheme = if web.as_ref().is_some_and(crate::web::Settings::tls) {
            "https"
        } else {
            "http"
        };
        match metrics::serve(addr, shared.clone(), web) {
            Ok(()) => info!(%addr, "metrics at {scheme}://{addr}/metrics"),
            Err(e) => warn!("{e:#}; running without the metrics endpoint"),
        }
    }
    let ctx_fs = ctx.fs.clone();
    let iolat_for = want_iolat.then(|| shared.clone());
    let mut agent = Daemon {
        shared,
        ctx,
        adjust: Adjustments {
            skip_move_sizes: true,
            ..Adjustments::default()
        },
        members: HashMap::new(),
        deferred_moves: Default::default(),
        moved_at: MovedAt::new(),
        rechecks: BTreeMap::new(),
        governed: BTreeMap::new(),
        told_not_applied: HashSet::new(),
        rescan_due: None,
        rescan_asked: None,
        stats: AgentStats {
            connector: connector.is_some(),
            connector_filtered: connector.as_ref().is_some_and(Connector::kernel_filtered),
            ..AgentStats::default()
        },
        event_hist: histogram(),
        kernel_hist: histogram(),
        write_hist: histogram(),
        rescan_hist: histogram(),
        has_descendant_rules: false,
        fields: crate::inventory::procs::Fields::ALL,
        reader: ProcReader::open(&ctx_fs).context("opening /proc")?,
        opts,
        live,
        connected: connector.is_some(),
        changed_pids: HashSet::new(),
        changed_before: HashSet::new(),
        scan_all_next: false,
        started: Instant::now(),
        move_log: MoveLog::default(),
        leaves_made: 0,
        changing: None,
    };
    agent.publish();
    let manager = crate::systemd::resolve(agent.ctx.loaded.policy.agent.manager, &agent.ctx.fs)
        .map_err(anyhow::Error::msg)?;
    info!(manager = manager.as_str(), "cgroup manager");
    if manager == crate::systemd::Manager::Systemd {
        info!(
            "systemd manages this host's cgroups: limits go on the units as runtime properties, \
             processes started outside systemd are adopted into dbcage.slice scopes as their \
             events arrive and at each full plan (start, rescan every {:?}, reload)",
            agent.opts.rescan
        );
    }
    let (first, placed) = engine::plan_placed(&agent.ctx, &agent.adjust)?;
    // Under systemd the metrics read the tenants' units (`Layout::units`), known from the plan.
    agent.take_governed(&first);
    agent.publish();
    if agent.execute(&first, None).0 && first.adopts_before_leaves() {
        // Adopted into a scope's own group: the next plan makes its leaves.
        agent.rescan_due = Some(Instant::now());
    }
    agent.note_deferred_moves(&first);
    drop(first);
    release_freed_memory();
    agent
        .shared
        .health
        .last_scan_ms
        .store(unix_ms(), Ordering::Relaxed);
    agent.set_members(placed);
    // A process whose group lacks a controller its limits need runs unlimited however many
    // moves succeeded: refuse to start (systemd shows the unit failed, with these lines).
    let uncovered = agent.uncovered();
    if !uncovered.is_empty() {
        for u in &uncovered {
            tracing::error!("{u}");
        }
        anyhow::bail!(
            "{} process(es) of the policy's tenants sit in groups without the controllers their \
             limits need (first: {}); on cgroup v2 the group's parent must enable them in \
             cgroup.subtree_control, which a systemd unit gets with Delegate=yes; the packaged \
             unit needs CAP_SYS_NICE for cpuset moves",
            uncovered.len(),
            uncovered[0]
        );
    }
    let mut storage_watch = watch_dirs(&agent.ctx.loaded.policy);
    let systemd = agent.ctx.manager == crate::systemd::Manager::Systemd;
    let mut dropin_watch = systemd
        .then(|| SystemdWatch::new(&agent.ctx.fs, &delegated_leaves(&agent.governed)))
        .flatten();
    // What the watch was built after: plans, and the leaves the event path made since.
    let watched_after = |a: &Daemon| (a.stats.rescans, a.leaves_made);
    let mut watch_built = watched_after(&agent);
    let hierarchies: Vec<&Path> = agent
        .ctx
        .layout
        .setup
        .hierarchies
        .iter()
        .map(|h| h.mount_point.as_path())
        .collect();
    if favordynmods.is_none() {
        if let Some(hint) = favordynmods_hint(&hierarchies, &agent.ctx.inventory.mounts) {
            info!("{hint}");
        }
    }
    let socket = crate::control::socket_path(&agent.ctx.loaded.policy.agent.root_name);
    let control = match crate::control::Server::start(
        &socket,
        agent.ctx.loaded.policy.agent.control_group.as_ref(),
    ) {
        Ok(s) => Some(s),
        Err(e) => {
            warn!("control socket unavailable ({e:#}); `dbcage set` and `reload` will not reach this daemon (SIGHUP still reloads)");
            None
        }
    };
    agent.publish_policy();
    info!(
        tenants = agent.ctx.loaded.policy.tenants.len(),
        connector = connector.is_some(),
        socket = %socket.display(),
        "dbcage running"
    );
    notify_ready();

    let waker = Arc::new(Waker::new()?);
    let agent = Arc::new(Mutex::new(agent));
    if let Some(c) = connector {
        let (agent, waker) = (agent.clone(), waker.clone());
        std::thread::Builder::new()
            .name("dbcage-events".into())
            .spawn(move || {
                let run = std::panic::AssertUnwindSafe(|| event_loop(c, &agent, &waker));
                if std::panic::catch_unwind(run).is_err() {
                    // The panic message is on stderr already; the daemon goes on without events.
                    lock(&agent).disconnect("the process-event thread panicked", &waker);
                }
            })
            .context("starting the process-event thread")?;
    }
    // After ready: processes are placed meanwhile, and the endpoint serves everything else.
    if let Some(shared) = iolat_for {
        load_io_latency(&shared);
    }
    let period = |a: &Daemon| {
        if a.connected {
            a.opts.rescan
        } else {
            a.opts.fallback_rescan
        }
    };
    let mut next_rescan = Instant::now() + period(&lock(&agent));
    // io.split = "demand": per-device shares of the totals, rebalanced on a timer (balance.rs).
    let mut balancer = crate::balance::Balancer::default();
    // [tenant.replication]: lag watchers, warnings, temporary IO raises (replication/mod.rs).
    let mut replication = crate::replication::Guard::default();
    // io/cpu.protect_*: PSI triggers on protected tenants, lowered donor weights (protect/mod.rs).
    let mut protection = crate::protect::Guard::default();
    loop {
        let timeout = {
            let mut a = lock(&agent);
            let now = Instant::now();
            let a = &mut *a;
            let armed_before = protection.triggers().len();
            let changed = protection.sync(&a.ctx.loaded.policy, &a.ctx.layout, now);
            if changed || protection.triggers().len() != armed_before {
                protection.publish(&a.ctx.loaded.policy);
            }
            if changed {
                protection.adjust(&a.ctx.loaded.policy, &mut a.adjust);
                match engine::plan(&a.ctx, &a.adjust) {
                    Ok(plan) => {
                        a.execute_change(&plan, "protection guard");
                        forget_own_writes(&dropin_watch);
                    }
                    Err(e) => warn!("protection guard: cannot plan the donors' limits: {e:#}"),
                }
            }
            let mut deadline = next_rescan;
            if replication.active(&a.ctx.loaded.policy) {
                deadline = deadline.min(now + crate::replication::TICK);
            }
            if protection.active() {
                deadline = deadline.min(now + crate::protect::TICK);
            }
            if let Some(at) = balancer.next_due(&a.ctx.loaded.policy) {
                deadline = deadline.min(at);
            }
            if let Some(((at, _), _)) = a.rechecks.first_key_value() {
                deadline = deadline.min(*at);
            }
            if let Some(at) = a.live.next_change_instant() {
                deadline = deadline.min(at);
            }
            if let Some(at) = a.move_log.due() {
                deadline = deadline.min(at);
            }
            if let Some(at) = a.rescan_due {
                deadline = deadline.min(at);
            }
            // Armed under the lock: a re-check the event thread adds from now on that is due
            // earlier wakes this poll.
            waker.arm(deadline);
            let wait = deadline.saturating_duration_since(now);
            PollTimeout::try_from(wait.as_millis().min(60_000) as i32 + 1)
                .unwrap_or(PollTimeout::MAX)
        };
        let triggers = protection.triggers();
        let (sig_ready, storage_changed, control_ready, pressured, dropins_changed) = {
            let mut fds = vec![
                PollFd::new(signals.as_fd(), PollFlags::POLLIN),
                PollFd::new(waker.fd.as_fd(), PollFlags::POLLIN),
            ];
            let triggers_at = fds.len();
            for (_, fd) in &triggers {
                fds.push(PollFd::new(*fd, PollFlags::POLLPRI));
            }
            let watch_at = fds.len();
            if let Some(w) = &storage_watch {
                fds.push(PollFd::new(w.as_fd(), PollFlags::POLLIN));
            }
            let control_at = fds.len();
            if let Some(c) = &control {
                fds.push(PollFd::new(c.fd(), PollFlags::POLLIN));
            }
            let dropins_at = fds.len();
            if let Some(w) = &dropin_watch {
                fds.push(PollFd::new(w.ino.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, timeout) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e).context("poll"),
            }
            let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            if ready(&fds[1]) {
                waker.clear();
            }
            let pressured: Vec<crate::protect::Key> = triggers
                .iter()
                .enumerate()
                .filter(|(i, _)| ready(&fds[triggers_at + i]))
                .map(|(_, (name, _))| name.clone())
                .collect();
            (
                ready(&fds[0]),
                storage_watch.is_some() && ready(&fds[watch_at]),
                control.is_some() && fds.get(control_at).is_some_and(ready),
                pressured,
                dropin_watch.is_some() && fds.get(dropins_at).is_some_and(ready),
            )
        };
        drop(triggers);
        let woke = Instant::now();
        let mut a = lock(&agent);
        let agent = &mut *a;
        if dropins_changed && dropin_watch.as_ref().is_some_and(SystemdWatch::changed) {
            // set-property writes a few files: one plan shortly after, not one per file.
            let due = Instant::now() + Duration::from_millis(100);
            agent.rescan_due = Some(agent.rescan_due.map_or(due, |d| d.min(due)));
        }
        if storage_changed && storage_watch.as_mut().is_some_and(DirWatch::changed) {
            info!("a storage or pid file directory changed: re-resolving devices and pid files");
            agent.rescan("storage or pid file changed");
        }
        if sig_ready {
            let mut stop = false;
            while let Ok(Some(info)) = signals.read_signal() {
                match Signal::try_from(info.ssi_signo as i32) {
                    Ok(Signal::SIGHUP) => {
                        agent.reload();
                        storage_watch = watch_dirs(&agent.ctx.loaded.policy);
                        if let Some(c) = &control {
                            c.set_group(agent.ctx.loaded.policy.agent.control_group.as_ref());
                        }
                    }
                    Ok(s) => {
                        info!(signal = s.as_str(), "stopping; limits stay in place");
                        stop = true;
                    }
                    Err(_) => {}
                }
            }
            if stop {
                break;
            }
        }
        if control_ready {
            if let Some(c) = &control {
                for p in c.take() {
                    let reload = matches!(p.request.op, crate::control::Op::Reload {});
                    agent.control(p);
                    if reload {
                        storage_watch = watch_dirs(&agent.ctx.loaded.policy);
                        c.set_group(agent.ctx.loaded.policy.agent.control_group.as_ref());
                    }
                }
            }
        }
        if agent.live.windows_due(chrono::Utc::now()) {
            if let Some(line) = crate::control::tick(agent, &crate::control::now_local()) {
                info!("{line}");
            }
        }
        let now = Instant::now();
        agent.move_log.flush(now, false);
        while let Some(((at, pid), _)) = agent.rechecks.first_key_value().map(|(k, v)| (*k, *v)) {
            if at > now {
                break;
            }
            agent.rechecks.remove(&(at, pid));
            agent.stats.rechecks += 1;
            if agent.members.contains_key(&pid) {
                agent.handle_pid(
                    pid,
                    EventTime {
                        received: at,
                        kernel_ns: None,
                    },
                );
            }
        }
        if balancer
            .next_due(&agent.ctx.loaded.policy)
            .is_some_and(|at| at <= now)
        {
            let policy = agent.adjust.policy(&agent.ctx.loaded.policy);
            let changed = balancer.tick(&agent.ctx, &policy);
            drop(policy);
            agent.adjust.shares = balancer.shares().clone();
            if changed {
                // Only the IO limit writes (lower-before-raise); a rebalance moves no process.
                match engine::plan(&agent.ctx, &agent.adjust) {
                    Ok(plan) => {
                        let plan = crate::balance::io_writes_only(plan);
                        if !plan.steps.is_empty() {
                            agent.execute_change(&plan, "io.split = demand");
                            forget_own_writes(&dropin_watch);
                        }
                    }
                    Err(e) => warn!("io.split = demand: cannot plan the new shares: {e:#}"),
                }
            }
        }
        let mut lowered = false;
        for key in &pressured {
            lowered |= protection.fired(&agent.ctx.loaded.policy, key, woke);
        }
        let restored = protection.active() && protection.tick(&agent.ctx.loaded.policy, now);
        if lowered || restored {
            protection.publish(&agent.ctx.loaded.policy);
            protection.adjust(&agent.ctx.loaded.policy, &mut agent.adjust);
            match engine::plan(&agent.ctx, &agent.adjust) {
                Ok(plan) => {
                    agent.execute_change(&plan, "protection guard");
                    forget_own_writes(&dropin_watch);
                    if lowered {
                        info!(
                            "protection guard: donors' limits written {} ms after the pressure trigger",
                            woke.elapsed().as_millis()
                        );
                    }
                }
                Err(e) => warn!("protection guard: cannot plan the changed weights: {e:#}"),
            }
        }
        if replication.tick(&agent.ctx.loaded.policy) {
            agent.adjust.raises = replication.raises().clone();
            match engine::plan(&agent.ctx, &agent.adjust) {
                Ok(plan) => {
                    agent.execute_change(&plan, "replication guard");
                    forget_own_writes(&dropin_watch);
                }
                Err(e) => warn!("replication guard: cannot plan the changed limits: {e:#}"),
            }
        }
        // The event thread gave up (it says why): the rescan becomes the short fallback.
        next_rescan = next_rescan.min(Instant::now() + period(agent));
        if now >= next_rescan {
            agent.rescan("periodic");
            agent.rescan_due = None;
            next_rescan = Instant::now() + period(agent);
        } else if agent.rescan_due.is_some_and(|at| at <= now) {
            agent.rescan_due = None;
            agent.rescan("a tenant's process in a new unit, or a unit's drop-in changed");
        }
        if systemd && watched_after(agent) != watch_built {
            // New units' drop-in directories and new leaves since the last plan; events of
            // this plan's own writes go with the old watch.
            watch_built = watched_after(agent);
            dropin_watch = SystemdWatch::new(&agent.ctx.fs, &delegated_leaves(&agent.governed));
        }
    }
    // Taking the lock waits for a move in flight on the event thread; that thread then stays
    // blocked on the lock (or in recv) until the process exits.
    let mut a = lock(&agent);
    let agent = &mut *a;
    agent.move_log.flush(Instant::now(), true);
    agent.stats.event_to_write_us = percentiles(&agent.event_hist, 1.0);
    agent.stats.kernel_event_to_write_us = percentiles(&agent.kernel_hist, 1.0);
    agent.stats.write_us = percentiles(&agent.write_hist, 1.0);
    agent.stats.rescan_ms = percentiles(&agent.rescan_hist, 1000.0);
    if let Some(Ok(crate::favordynmods::Outcome::Mounted(at))) = &favordynmods {
        info!(
            "favordynmods: {} stays mounted, and with it the option for every hierarchy (`umount {}` turns it off)",
            at.display(),
            at.display()
        );
    }
    crate::balance::unpublish(&agent.ctx.loaded.policy.agent.root_name);
    let _ = std::fs::remove_file(crate::rundir::state_path(
        &agent.ctx.loaded.policy.agent.root_name,
        "policy",
    ));
    crate::replication::unpublish(&agent.ctx.loaded.policy.agent.root_name);
    crate::protect::unpublish(&agent.ctx.loaded.policy.agent.root_name);
    if let Some(g) = &agent.ctx.groups {
        agent.stats.groups = GroupWatch::lock(g).stats;
    }
    if let Some(path) = &agent.opts.stats_out {
        let line = serde_json::to_string(&agent.stats)? + "\n";
        std::fs::write(path, line)
            .with_context(|| format!("writing statistics to {}", path.display()))?;
    }
    Ok(())
}

/// A multi-line message (a refusal lists one problem per line) as one log line: journald and
/// grep see one record per event.
fn one_line(message: &str) -> String {
    let mut out = String::new();
    for line in message.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !out.is_empty() {
            out.push_str(if out.ends_with(':') { " " } else { "; " });
        }
        out.push_str(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Moves recorded faster than the horizon lets them go: the map is walked once each time it
    /// has doubled, not at every move, and what is older than the horizon is forgotten.
    #[test]
    fn moved_at_is_pruned_once_it_has_doubled_and_forgets_what_is_past_the_horizon() {
        let mut m = MovedAt::new();
        let ms = 1_000_000u64;
        let start = MOVED_AT_HORIZON.as_nanos() as u64;
        // 1,000 moves a second for 60 s, each of another process: 10,000 within the horizon.
        let mut prunings = 0;
        let mut most = 0;
        for i in 0..60_000u64 {
            let (len, prune_at) = (m.at.len(), m.prune_at);
            m.record([(i as u32 + 1, i % 2 == 0)], start + i * ms);
            if m.at.len() != len + 1 || m.prune_at != prune_at {
                prunings += 1;
            }
            most = most.max(m.at.len());
        }
        // At 4,097, 8,195 and 16,391 entries, then every 10 s (when 20,001): 7.
        assert_eq!(prunings, 7, "prunings for 60,000 moves");
        assert!(most <= 20_001, "{most} entries kept at most");
        assert_eq!(m.get(60_000), Some((start + 59_999 * ms, false)));
        assert_eq!(m.get(59_999), Some((start + 59_998 * ms, true)));
        // Recorded in the first second, pruned at 16.4 s.
        assert_eq!(m.get(1), None);
    }

    /// A tenth of the processes a rescan up to 10,000; beyond, about 1,000 a rescan.
    #[test]
    fn the_sweep_reads_a_tenth_or_at_most_about_a_thousand() {
        assert_eq!(sweep_shares(0), 10);
        assert_eq!(sweep_shares(3_500), 10);
        assert_eq!(sweep_shares(10_000), 10);
        assert_eq!(sweep_shares(10_001), 11);
        assert_eq!(sweep_shares(28_000), 28);
        assert_eq!(sweep_shares(100_000), 100);
        assert_eq!(sweep_shares(usize::MAX), u32::MAX);
    }

    /// A drop-in written by `set-property` (a new file in an existing `UNIT.d`) wakes the
    /// watch; nothing happens without one; no directories, no watch. In a delegated unit's
    /// leaf, a write to an IO limit file does; one to a file the kernel changes by itself
    /// (`cgroup.events`) does not.
    #[test]
    fn set_property_drop_ins_and_leaf_limits_are_watched() {
        let dir = tempfile::tempdir().unwrap();
        let fs = crate::hostfs::HostFs::with_root(dir.path());
        assert!(SystemdWatch::new(&fs, &[]).is_none());
        let unit = fs.path("/run/systemd/system.control/postgresql@15-main.service.d");
        std::fs::create_dir_all(&unit).unwrap();
        let leaf = dir.path().join("limited");
        std::fs::create_dir(&leaf).unwrap();
        for f in ["io.max", "cgroup.events"] {
            std::fs::write(leaf.join(f), "").unwrap();
        }
        let w = SystemdWatch::new(&fs, std::slice::from_ref(&leaf)).unwrap();
        assert!(!w.changed(), "no event before a write");
        std::fs::write(unit.join("50-CPUQuota.conf"), "[Service]\nCPUQuota=90%\n").unwrap();
        assert!(w.changed(), "a drop-in written");
        assert!(!w.changed(), "the events were read");
        std::fs::write(leaf.join("cgroup.events"), "populated 1\n").unwrap();
        assert!(!w.changed(), "a file the kernel changes by itself");
        std::fs::write(leaf.join("io.max"), "254:32 rbps=1048576\n").unwrap();
        assert!(w.changed(), "an IO limit written in the leaf");
    }

    #[test]
    fn refusals_are_logged_on_one_line() {
        assert_eq!(
            one_line("1 error:\n  dbcage set pg15: bad\nnothing was changed"),
            "1 error: dbcage set pg15: bad; nothing was changed"
        );
    }

    #[test]
    fn move_lines_past_the_budget_are_counted_and_told_once_the_second_is_over() {
        let mut log = MoveLog::default();
        for pid in 0..25 {
            log.moved(pid, || "ora_p000_BX1".into(), "BX1", "limited", "match[0]");
        }
        log.moved(99, || "oracleBX2".into(), "BX2", "limited", "match[0]");
        assert_eq!(log.tenants["BX1"], (MOVE_LINES_PER_SECOND, 5));
        assert_eq!(log.tenants["BX2"], (1, 0));
        let start = log.window_start.unwrap();
        assert_eq!(log.due(), Some(start + MOVE_LOG_WINDOW));
        // Not yet over: nothing told, nothing reset.
        log.flush(start + Duration::from_millis(500), false);
        assert_eq!(log.tenants["BX1"], (MOVE_LINES_PER_SECOND, 5));
        log.flush(start + MOVE_LOG_WINDOW, false);
        assert_eq!(log.tenants["BX1"], (0, 0));
        assert_eq!(log.due(), None);
        // A new window logs again.
        log.moved(1, || "ora_p000_BX1".into(), "BX1", "limited", "match[0]");
        assert_eq!(log.tenants["BX1"], (1, 0));
        assert_eq!(log.due(), None, "nothing held back, no summary due");
    }

    #[test]
    fn the_favordynmods_hint_is_given_only_when_no_cgroup_mount_has_it() {
        use crate::inventory::MountTable;
        let v1 = "30 25 0:27 / /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroup rw,cpu\n\
                  31 25 0:28 / /sys/fs/cgroup/blkio rw,nosuid - cgroup cgroup rw,blkio\n";
        let ours = [
            Path::new("/sys/fs/cgroup/cpu"),
            Path::new("/sys/fs/cgroup/blkio"),
        ];
        let hint = favordynmods_hint(&ours, &MountTable::parse(v1)).expect("a hint");
        assert!(
            hint.starts_with(
                "/sys/fs/cgroup/cpu, /sys/fs/cgroup/blkio mounted without favordynmods"
            ),
            "{hint}"
        );
        assert!(
            hint.contains("name=dbcage-favordynmods,favordynmods"),
            "{hint}"
        );
        // A separate named hierarchy with the option: no hint.
        let named = format!(
            "{v1}40 25 0:40 / /run/dbcage-favordynmods rw,relatime - cgroup cgroup rw,favordynmods,name=dbcage-favordynmods\n"
        );
        assert_eq!(favordynmods_hint(&ours, &MountTable::parse(&named)), None);
        // cgroup2 with it, as on a v2 host mounted that way: no hint.
        let v2 = "29 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate,favordynmods\n";
        assert_eq!(
            favordynmods_hint(&[Path::new("/sys/fs/cgroup")], &MountTable::parse(v2)),
            None
        );
        // Another file system's option of that name does not count.
        let other = format!("{v1}50 25 0:50 / /mnt rw - tmpfs tmpfs rw,favordynmods\n");
        assert!(favordynmods_hint(&ours, &MountTable::parse(&other)).is_some());
    }

    #[test]
    fn glob_dirs_are_the_fixed_prefixes() {
        let loaded = crate::policy::from_str(
            "p.toml",
            "[[tenant]]\nname = \"a\"\nmatch = [{ comm = \"x\" }]\nstorage = [\"/dev/oracleasm/disks/BX1_*\", \"/data\", \"/dev/sd[bc]\", \"/*\"]\n",
            &crate::policy::SystemAccounts,
        )
        .unwrap();
        let dirs = watched_dirs(&loaded.policy);
        assert_eq!(
            dirs,
            vec![
                PathBuf::from("/"),
                PathBuf::from("/dev"),
                PathBuf::from("/dev/oracleasm/disks")
            ]
        );
    }

    #[test]
    fn asm_diskgroup_entries_watch_their_diskstring_directories() {
        let loaded = crate::policy::from_str(
            "p.toml",
            "[[tenant]]\nname = \"a\"\npreset = \"oracle\"\nsid = \"BX1\"\nasm_diskgroup = \"DATA\"\nasm_diskstring = \"/dev/mapper/asm*,ORCL:*\"\n",
            &crate::policy::SystemAccounts,
        )
        .unwrap();
        assert_eq!(
            watched_dirs(&loaded.policy),
            vec![
                PathBuf::from("/dev/mapper"),
                PathBuf::from("/dev/oracleasm/disks")
            ]
        );
    }

    #[test]
    fn pid_file_directories_are_watched() {
        let loaded = crate::policy::from_str(
            "p.toml",
            "[[tenant]]\nname = \"a\"\nmatch = [{ pidfile = \"/run/mysqld/mysqld.pid\", descendants = true }]\n",
            &crate::policy::SystemAccounts,
        )
        .unwrap();
        assert_eq!(
            watched_dirs(&loaded.policy),
            vec![PathBuf::from("/run/mysqld")]
        );
    }
}
