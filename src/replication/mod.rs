//! The replication guard (`[tenant.replication]`): IO limits must not make a standby fall behind
//! without bound (seed 001: the primary then recycles WAL the standby still needs).
//!
//! For each tenant with a guard, a watcher thread asks the local server, every `interval`, how
//! far behind replication is: on a standby from `pg_stat_wal_receiver` (the primary's WAL end as
//! its last message reported it) and the replay position; on a primary from
//! `pg_stat_replication` (per standby), with the WAL it keeps for them (`wal_keep_size`,
//! replication slots' `wal_status`/`safe_wal_size`). It runs `psql -XAtq` as a subprocess with
//! a timeout rather than linking a client library: the `postgres` crate would bring an async
//! runtime into a daemon that has none, for one query a second; psql is on every PostgreSQL
//! host, and a hung server costs a killed child, not a stuck daemon (the daemon's loop never
//! waits for it: it reads the latest sample from a channel).
//!
//! The decisions (`Watch::observe`) are pure and tested on their own: when the lag (bytes or
//! seconds) stays above its threshold for `for`, the guard warns, once per episode, with the
//! numbers; with `action = "raise"` it also doubles the tenant's write limits (and read limits,
//! if any: replay reads pages), up to `raise_to`, again after each further `for` while the lag
//! keeps growing; once the lag stays under half the threshold for `for`, it restores the
//! configured limits. On a primary it also warns when a standby's lag passes 80% of the WAL the
//! primary retains for it. A raise is an adjustment the daemon lays over the policy when it
//! plans (`engine::Adjustments::raises`); the policy itself is never edited, and a raise
//! survives a reload. Every action is logged with
//! the numbers that caused it.

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::{info, warn};

pub use crate::policy::replication::{validate, Action, GuardConfig, Role};
use crate::policy::{IoLimits, Policy};
use crate::units::HumanBytes;

/// One reading of the server.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub at: Instant,
    /// The largest lag over the standbys (primary) or this standby's: bytes not yet replayed.
    pub lag_bytes: u64,
    /// Seconds since the last replayed transaction, while bytes are behind (0 when caught up).
    pub lag_seconds: f64,
    /// Primary only: the standby that lags most, and the WAL the primary still keeps for it
    /// (`wal_keep_size`, or a slot's `safe_wal_size`), if bounded.
    pub standby: Option<String>,
    pub retained: Option<u64>,
    /// A slot whose WAL is `unreserved` or `lost`.
    pub slot_trouble: Option<String>,
}

/// What the guard decided for one sample.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Warn(String),
    /// New write (and read) limits; the message says why.
    Raise(IoLimits, String),
    /// Back to the configured limits.
    Restore(String),
}

/// The state of one tenant's guard: pure, fed with samples.
#[derive(Debug, Clone, Default)]
pub struct Watch {
    above_since: Option<Instant>,
    below_since: Option<Instant>,
    /// Lag when the last action was taken (a further raise needs the lag still growing).
    acted_at_lag: Option<u64>,
    warned: bool,
    retention_warned: bool,
    /// The limits in force while raised.
    pub raised: Option<IoLimits>,
    /// The tenant's configured limits (what a restore goes back to).
    base: Option<IoLimits>,
}

fn double(v: Option<u64>, ceiling: Option<u64>) -> Option<u64> {
    match (v, ceiling) {
        (Some(v), Some(c)) => Some(v.saturating_mul(2).min(c).max(v)),
        (v, _) => v,
    }
}

impl Watch {
    /// Feeds one sample; `configured` is the tenant's IO limits as the policy sets them.
    pub fn observe(&mut self, c: &GuardConfig, configured: &IoLimits, s: &Sample) -> Vec<Decision> {
        let mut out = Vec::new();
        let secs_over = c.lag_seconds.is_some_and(|l| s.lag_seconds > l);
        let above = s.lag_bytes > c.lag_bytes || secs_over;
        let numbers = format!(
            "lag {} ({} bytes), {:.1} s behind; thresholds {} / {}",
            HumanBytes(s.lag_bytes),
            s.lag_bytes,
            s.lag_seconds,
            HumanBytes(c.lag_bytes),
            c.lag_seconds.map_or("-".into(), |l| format!("{l} s")),
        );
        if let (Some(kept), Some(name)) = (s.retained, &s.standby) {
            if s.lag_bytes * 5 > kept * 4 && !self.retention_warned {
                self.retention_warned = true;
                out.push(Decision::Warn(format!(
                    "standby `{name}` is {} behind and the primary keeps {} of WAL for it: past that, the WAL it needs is recycled and it must be rebuilt",
                    HumanBytes(s.lag_bytes),
                    HumanBytes(kept)
                )));
            } else if s.lag_bytes * 2 < kept {
                self.retention_warned = false;
            }
        }
        if let Some(slot) = &s.slot_trouble {
            if !self.retention_warned {
                self.retention_warned = true;
                out.push(Decision::Warn(format!(
                    "replication slot `{slot}`: the WAL it needs is no longer reserved"
                )));
            }
        }
        if above {
            self.below_since = None;
            let since = *self.above_since.get_or_insert(s.at);
            if s.at.duration_since(since) < c.hold {
                return out;
            }
            if !self.warned {
                self.warned = true;
                out.push(Decision::Warn(format!(
                    "replication is behind for {:.1} s: {numbers}",
                    s.at.duration_since(since).as_secs_f64()
                )));
            }
            let growing = self.acted_at_lag.is_none_or(|l| s.lag_bytes > l);
            if c.action == Action::Raise && growing {
                let from = self.raised.unwrap_or(*configured);
                let to = IoLimits {
                    read_bps: double(from.read_bps, c.raise_to),
                    write_bps: double(from.write_bps, c.raise_to),
                    read_iops: double(from.read_iops, c.raise_iops_to),
                    write_iops: double(from.write_iops, c.raise_iops_to),
                };
                if to != from {
                    self.raised = Some(to);
                    out.push(Decision::Raise(
                        to,
                        format!(
                            "{numbers}; write_bps {} -> {}, write_iops {} -> {} (ceiling {} / {})",
                            show(from.write_bps, true),
                            show(to.write_bps, true),
                            show(from.write_iops, false),
                            show(to.write_iops, false),
                            show(c.raise_to, true),
                            show(c.raise_iops_to, false)
                        ),
                    ));
                }
            }
            // The next step waits another `for`, and for the lag to have grown.
            self.acted_at_lag = Some(s.lag_bytes);
            self.above_since = Some(s.at);
        } else {
            self.above_since = None;
            let calm = s.lag_bytes * 2 <= c.lag_bytes
                && c.lag_seconds.is_none_or(|l| s.lag_seconds * 2.0 <= l);
            if !calm {
                self.below_since = None;
                return out;
            }
            let since = *self.below_since.get_or_insert(s.at);
            if s.at.duration_since(since) < c.hold {
                return out;
            }
            if self.raised.take().is_some() {
                out.push(Decision::Restore(format!(
                    "caught up for {:.1} s: {numbers}; limits back to write_bps {}, write_iops {}",
                    s.at.duration_since(since).as_secs_f64(),
                    show(configured.write_bps, true),
                    show(configured.write_iops, false)
                )));
            }
            if self.warned {
                self.warned = false;
                out.push(Decision::Warn(format!("replication caught up: {numbers}")));
            }
            self.acted_at_lag = None;
        }
        out
    }
}

fn show(v: Option<u64>, bytes: bool) -> String {
    match v {
        None => "none".into(),
        Some(v) if bytes => format!("{}/s", HumanBytes(v)),
        Some(v) => v.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// reading the server

/// Standby: the primary's WAL end (as its last message said) and the replay position.
const STANDBY_SQL: &str = "select coalesce(pg_wal_lsn_diff(greatest(r.latest_end_lsn, r.flushed_lsn, pg_last_wal_receive_lsn()), pg_last_wal_replay_lsn()), 0)::bigint, \
 coalesce(extract(epoch from now() - pg_last_xact_replay_timestamp()), 0)::float8 \
 from (select 1) one left join pg_stat_wal_receiver r on true";

/// Primary: per standby, the bytes not replayed, replay lag time, and what is kept for it:
/// `wal_keep_size` without a slot; with a slot whose WAL is bounded (`max_slot_wal_keep_size`),
/// what it holds now plus what may still be written before it is in danger (`safe_wal_size`);
/// -1 when unbounded.
const PRIMARY_SQL: &str = "select r.application_name, \
 coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), r.replay_lsn), 0)::bigint, \
 coalesce(extract(epoch from r.replay_lag), 0)::float8, \
 coalesce(s.safe_wal_size + pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn), case when s.slot_name is null then (select setting::bigint * 1048576 from pg_settings where name = 'wal_keep_size') end, -1)::bigint, \
 coalesce(s.wal_status, '') \
 from pg_stat_replication r left join pg_replication_slots s on s.active_pid = r.pid";

/// Parses psql's `-XAt` output (`|`-separated) into a sample.
pub fn parse(role: Role, at: Instant, out: &str) -> Option<Sample> {
    let mut sample = Sample {
        at,
        lag_bytes: 0,
        lag_seconds: 0.0,
        standby: None,
        retained: None,
        slot_trouble: None,
    };
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split('|').collect();
        match role {
            Role::Standby => {
                let bytes: i64 = f.first()?.trim().parse().ok()?;
                let secs: f64 = f.get(1)?.trim().parse().ok()?;
                sample.lag_bytes = bytes.max(0) as u64;
                sample.lag_seconds = if bytes > 0 { secs.max(0.0) } else { 0.0 };
            }
            Role::Primary => {
                let bytes = f.get(1)?.trim().parse::<i64>().ok()?.max(0) as u64;
                let secs: f64 = f.get(2)?.trim().parse().ok()?;
                let kept: i64 = f.get(3)?.trim().parse().ok()?;
                let status = f.get(4).map(|s| s.trim()).unwrap_or("");
                if matches!(status, "unreserved" | "lost") {
                    sample.slot_trouble = Some(f[0].to_string());
                }
                if bytes >= sample.lag_bytes {
                    sample.lag_bytes = bytes;
                    sample.lag_seconds = secs;
                    sample.standby = Some(f[0].to_string());
                    // wal_keep_size = 0 and no slot: nothing is kept beyond max_wal_size.
                    sample.retained = (kept > 0).then_some(kept as u64);
                }
            }
        }
    }
    Some(sample)
}

/// Runs psql once, killing it after `timeout`.
fn query(c: &GuardConfig, sql: &str, timeout: Duration) -> Result<String, String> {
    use std::io::Read as _;
    use std::os::unix::process::CommandExt as _;
    let mut cmd = Command::new(&c.psql);
    if let Some(user) = &c.user {
        let account = nix::unistd::User::from_name(user)
            .map_err(|e| format!("account `{user}`: {e}"))?
            .ok_or_else(|| format!("no account `{user}`"))?;
        cmd.uid(account.uid.as_raw()).gid(account.gid.as_raw());
    }
    let mut child = cmd
        .args([
            "-XAtq",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            &c.conninfo,
            "-c",
            sql,
        ])
        .current_dir("/")
        .env("PGCONNECT_TIMEOUT", "2")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", c.psql))?;
    let end = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("psql did not answer within {timeout:?}"));
            }
            Err(e) => return Err(format!("waiting for psql: {e}")),
        }
    };
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    if status.success() {
        Ok(out)
    } else {
        Err(format!("psql {status}: {}", err.trim()))
    }
}

/// A thread that samples one server every `interval` and sends what it read.
fn spawn_watcher(
    tenant: String,
    c: GuardConfig,
    tx: mpsc::Sender<(String, Sample)>,
    stop: mpsc::Receiver<()>,
) {
    std::thread::Builder::new()
        .name(format!("repl-{tenant}"))
        .spawn(move || {
            let sql = match c.role {
                Role::Standby => STANDBY_SQL,
                Role::Primary => PRIMARY_SQL,
            };
            let mut failing = false;
            loop {
                let started = Instant::now();
                match query(&c, sql, c.interval.max(Duration::from_secs(2))) {
                    Ok(out) => {
                        failing = false;
                        if let Some(s) = parse(c.role, Instant::now(), &out) {
                            if tx.send((tenant.clone(), s)).is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) if !failing => {
                        failing = true;
                        warn!(
                            tenant = tenant.as_str(),
                            "replication guard cannot read the server ({}): {e}",
                            redact_password(&c.conninfo)
                        );
                    }
                    Err(_) => {}
                }
                let wait = c.interval.saturating_sub(started.elapsed());
                match stop.recv_timeout(wait) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
            }
        })
        .expect("spawning a replication watcher");
}

/// Where the daemon publishes each guarded tenant's `GuardStatus` (lag, behind, raised limits,
/// actions taken): `/run/dbcage/<root>.replication.json`.
pub fn published_path(root_name: &str) -> std::path::PathBuf {
    crate::rundir::state_path(root_name, "replication")
}

fn publish(root_name: &str, status: &std::collections::BTreeMap<String, GuardStatus>) {
    crate::rundir::publish_owned(&published_path(root_name), status);
}

/// Each guarded tenant's state, if a running daemon published it (for `status` and metrics).
pub fn read_published(root_name: &str) -> Option<std::collections::BTreeMap<String, GuardStatus>> {
    crate::rundir::read_owned(&published_path(root_name))
}

/// Removes the published state (the daemon stops: nobody keeps it true any more).
pub fn unpublish(root_name: &str) {
    let _ = std::fs::remove_file(published_path(root_name));
}

/// How often the daemon looks for new samples while a guard runs.
pub const TICK: Duration = Duration::from_millis(250);

/// What `status` and the metrics read about one tenant's guard.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct GuardStatus {
    pub lag_bytes: u64,
    pub lag_seconds: f64,
    pub behind: bool,
    pub raised_write_bps: Option<u64>,
    pub raised_write_iops: Option<u64>,
    pub actions: u64,
}

/// The daemon's side: one watcher per guarded tenant, their samples, the decisions.
#[derive(Default)]
pub struct Guard {
    /// (tenant, config, stop sender) of the running watchers.
    running: Vec<(String, GuardConfig, mpsc::Sender<()>)>,
    rx: Option<mpsc::Receiver<(String, Sample)>>,
    tx: Option<mpsc::Sender<(String, Sample)>>,
    watches: std::collections::BTreeMap<String, Watch>,
    pub status: std::collections::BTreeMap<String, GuardStatus>,
    /// The raises in force (tenant → IO totals), laid over the policy when the daemon plans.
    raises: std::collections::BTreeMap<String, IoLimits>,
}

impl Guard {
    /// Starts and stops watchers to match the policy (cheap when nothing changed).
    fn sync(&mut self, policy: &Policy) {
        let want: Vec<(String, GuardConfig)> = policy
            .tenants
            .iter()
            .filter_map(|t| t.replication.clone().map(|g| (t.name.clone(), g)))
            .collect();
        let same = want.len() == self.running.len()
            && want
                .iter()
                .zip(&self.running)
                .all(|(a, b)| a.0 == b.0 && a.1 == b.1);
        if same {
            return;
        }
        self.running.clear(); // dropping the senders stops the old watchers
        if self.tx.is_none() {
            let (tx, rx) = mpsc::channel();
            self.tx = Some(tx);
            self.rx = Some(rx);
        }
        let tx = self.tx.clone().expect("channel made above");
        self.watches
            .retain(|name, _| want.iter().any(|(n, _)| n == name));
        for (name, c) in want {
            let (stop_tx, stop_rx) = mpsc::channel();
            let role = match c.role {
                Role::Primary => "primary",
                Role::Standby => "standby",
            };
            info!(
                tenant = name.as_str(),
                role,
                conninfo = redact_password(&c.conninfo),
                "replication guard watching"
            );
            spawn_watcher(name.clone(), c.clone(), tx.clone(), stop_rx);
            self.running.push((name, c, stop_tx));
        }
    }

    /// Takes the samples that arrived and decides. Returns true when the raises in force
    /// changed (the caller plans with `raises()` and applies). The policy is never edited: a
    /// raise is an adjustment laid over it (`engine::Adjustments::raises`).
    pub fn tick(&mut self, policy: &Policy) -> bool {
        self.sync(policy);
        let mut changed = false;
        let mut fresh = false;
        let samples: Vec<(String, Sample)> = self
            .rx
            .as_ref()
            .map_or_else(Vec::new, |rx| rx.try_iter().collect());
        for (name, s) in samples {
            let Some(t) = policy.tenants.iter().find(|t| t.name == name) else {
                continue;
            };
            let Some(c) = t.replication.clone() else {
                continue;
            };
            let w = self.watches.entry(name.clone()).or_default();
            // The configured limits: what the policy says (a reload may change them).
            w.base = Some(t.io);
            let base = t.io;
            let st = self.status.entry(name.clone()).or_default();
            st.lag_bytes = s.lag_bytes;
            st.lag_seconds = s.lag_seconds;
            for d in w.observe(&c, &base, &s) {
                st.actions += 1;
                match d {
                    Decision::Warn(msg) => {
                        warn!(tenant = name.as_str(), "replication guard: {msg}")
                    }
                    Decision::Raise(_, msg) => warn!(
                        tenant = name.as_str(),
                        "replication guard raises the IO limits: {msg}"
                    ),
                    Decision::Restore(msg) => info!(
                        tenant = name.as_str(),
                        "replication guard lowers the IO limits: {msg}"
                    ),
                }
            }
            st.behind = w.above_since.is_some();
            st.raised_write_bps = w.raised.and_then(|r| r.write_bps);
            st.raised_write_iops = w.raised.and_then(|r| r.write_iops);
            let want = w.raised.filter(|r| *r != base);
            if self.raises.get(&name).copied() != want {
                match want {
                    Some(r) => self.raises.insert(name.clone(), r),
                    None => self.raises.remove(&name),
                };
                changed = true;
            }
            fresh = true;
        }
        // A tenant that left the policy or lost its guard keeps no raise.
        let before = self.raises.len();
        self.raises.retain(|n, _| {
            policy
                .tenants
                .iter()
                .any(|t| &t.name == n && t.replication.is_some())
        });
        changed |= self.raises.len() != before;
        if fresh {
            publish(&policy.agent.root_name, &self.status);
        }
        changed
    }

    /// The IO totals in force while a raise holds, per tenant.
    pub fn raises(&self) -> &std::collections::BTreeMap<String, IoLimits> {
        &self.raises
    }

    pub fn active(&self, policy: &Policy) -> bool {
        !self.running.is_empty() || policy.tenants.iter().any(|t| t.replication.is_some())
    }
}

/// A connection string fit for a log line: the value of `password=` and the password of a URI's
/// `user:password@` replaced by `***`.
pub fn redact_password(conninfo: &str) -> String {
    static KEY: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)").expect("valid regex")
    });
    static URI: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"^(postgres(?:ql)?://[^:@/?]*):[^@/?]*@").expect("valid regex")
    });
    let s = KEY.replace_all(conninfo, "${1}***");
    URI.replace(&s, "${1}:***@").into_owned()
}

#[cfg(test)]
mod tests;
