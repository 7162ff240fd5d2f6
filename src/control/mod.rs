//! Live changes: the overrides `dbcage set` makes, the schedule windows in force, `reload`, and
//! the local socket the daemon takes them on.
//!
//! Nothing here writes a control file or has a second idea of what a limit means. A change is a
//! drop-in shaped fragment (`[[tenant]] name = "DEMO" [tenant.io] read_bps = "200MiB"`) laid over
//! the policy files (`policy::Overlay`), validated by the very code that validates the files,
//! then handed to the caller's plan → apply path (`Governor`). Precedence, low to high: the
//! files (with `conf.d/90-set-<tenant>.toml` that `set --persist` writes), the schedule windows
//! in force, the runtime `set` values.
//!
//! Every change is checked in full before anything is touched: a request that fails validation,
//! device resolution or planning changes neither the running policy nor the kernel.

pub mod client;
pub mod protocol;
pub mod server;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use chrono::{DateTime, Utc};

use crate::policy::{self, schedule, Loaded, Overlay, Policy, SystemAccounts, Tenant};
pub use protocol::{DaemonHealth, DaemonMode, Op, OverrideInfo, Request, Response};
pub use server::Server;

/// Where the daemons' sockets live (one per root group: `/run/dbcage/<root>.sock`).
pub const SOCKET_DIR: &str = crate::rundir::RUN_DIR;

/// The socket of the daemon that serves the root group `root` (a validated group name).
pub fn socket_path(root: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("{root}.sock"))
}

/// The drop-in `set --persist` writes for a tenant.
pub fn persist_path(config: &Path, tenant: &str) -> PathBuf {
    policy::dropin_dir(config).join(format!("90-set-{tenant}.toml"))
}

/// What a key's value becomes in TOML.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// A count or a size: a whole number, or text with a unit (`200MiB`).
    Quantity,
    /// `cpu.cores`: a number, possibly fractional.
    Number,
    /// `cpu.cpus`: a cpu list as text (`0-3,8`).
    Text,
    /// `cpu.numa_nodes`: node numbers separated by commas.
    List,
}

/// The keys `set` and schedules may change: the limits, nothing that selects processes or
/// devices.
const KEYS: &[(&str, Kind)] = &[
    ("io.read_bps", Kind::Quantity),
    ("io.write_bps", Kind::Quantity),
    ("io.read_iops", Kind::Quantity),
    ("io.write_iops", Kind::Quantity),
    ("cpu.cores", Kind::Number),
    ("cpu.weight", Kind::Quantity),
    ("cpu.cpus", Kind::Text),
    ("cpu.numa_nodes", Kind::List),
    ("memory.max", Kind::Quantity),
    ("memory.high", Kind::Quantity),
    ("memory.low", Kind::Quantity),
    ("memory.swap_max", Kind::Quantity),
];

fn key_names() -> String {
    KEYS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
}

/// Parses `KEY=VALUE` words from the command line.
pub fn parse_assignments(words: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for w in words {
        let (k, v) = w
            .split_once('=')
            .ok_or_else(|| format!("`{w}` is not KEY=VALUE (e.g. io.read_bps=200MiB)"))?;
        if out
            .insert(k.trim().to_string(), v.trim().to_string())
            .is_some()
        {
            return Err(format!("`{}` is given twice", k.trim()));
        }
    }
    Ok(out)
}

/// The drop-in shaped fragment for a tenant's values. Keys outside `KEYS` are refused; the
/// values are encoded by the TOML serializer (no text is pasted into TOML), and are validated
/// later with the policy.
pub fn fragment(tenant: &str, values: &BTreeMap<String, String>) -> Result<String, String> {
    use toml::Value;
    policy::check_group_name(tenant).map_err(|e| format!("tenant name: {e}"))?;
    let mut tables: BTreeMap<&str, toml::Table> = BTreeMap::new();
    for (key, text) in values {
        let Some((_, kind)) = KEYS.iter().find(|(k, _)| k == key) else {
            return Err(format!(
                "`{key}` cannot be set; the keys are {}",
                key_names()
            ));
        };
        let (section, name) = key.split_once('.').expect("KEYS are dotted");
        if text.len() > 256 || text.chars().any(|c| c.is_control()) {
            return Err(format!(
                "{key}: the value is too long or has control characters"
            ));
        }
        let value = match kind {
            Kind::Quantity => text
                .parse::<i64>()
                .map(Value::Integer)
                .unwrap_or_else(|_| Value::String(text.clone())),
            Kind::Number => text
                .parse::<i64>()
                .map(Value::Integer)
                .or_else(|_| text.parse::<f64>().map(Value::Float))
                .unwrap_or_else(|_| Value::String(text.clone())),
            Kind::Text => Value::String(text.clone()),
            Kind::List => Value::Array(
                text.split(',')
                    .map(|n| n.trim().parse::<i64>().map(Value::Integer))
                    .collect::<Result<_, _>>()
                    .map_err(|_| {
                        format!("{key}: `{text}` is not a list of node numbers (e.g. 0,1)")
                    })?,
            ),
        };
        tables
            .entry(section)
            .or_default()
            .insert(name.to_string(), value);
    }
    let mut t = toml::Table::new();
    t.insert("name".into(), Value::String(tenant.to_string()));
    for (section, table) in tables {
        t.insert(section.to_string(), Value::Table(table));
    }
    let mut file = toml::Table::new();
    file.insert("tenant".into(), Value::Array(vec![Value::Table(t)]));
    toml::to_string(&file).map_err(|e| format!("encoding the override: {e}"))
}

/// The values of a fragment written by `fragment` (a persisted drop-in), back as `KEY=VALUE`.
fn fragment_values(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(file) = text.parse::<toml::Table>() else {
        return out;
    };
    let tenants = file.get("tenant").and_then(|t| t.as_array());
    for t in tenants.into_iter().flatten().filter_map(|t| t.as_table()) {
        for (section, table) in t.iter().filter_map(|(k, v)| Some((k, v.as_table()?))) {
            for (name, v) in table {
                let text = match v {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Array(a) => a
                        .iter()
                        .map(|x| x.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                    other => other.to_string(),
                };
                out.insert(format!("{section}.{name}"), text);
            }
        }
    }
    out
}

/// How a key's value in force reads (`200.0 MiB`, `0-3`), from the validated tenant.
pub fn value_in_force(t: &Tenant, key: &str) -> String {
    use crate::units::HumanBytes;
    let bytes = |v: Option<u64>| v.map(|b| HumanBytes(b).to_string());
    let num = |v: Option<u64>| v.map(|b| b.to_string());
    let v = match key {
        "io.read_bps" => bytes(t.io.read_bps),
        "io.write_bps" => bytes(t.io.write_bps),
        "io.read_iops" => num(t.io.read_iops),
        "io.write_iops" => num(t.io.write_iops),
        "cpu.cores" => t.cpu.cores.map(|c| c.to_string()),
        "cpu.weight" => t.cpu.weight.map(|w| w.to_string()),
        "cpu.cpus" => t.cpu.cpus.as_ref().map(|c| c.value.to_string()),
        "cpu.numa_nodes" => t.cpu.numa_nodes.as_ref().map(|c| c.value.to_string()),
        "memory.max" => bytes(t.memory.max.as_ref().map(|m| m.value)),
        "memory.high" => bytes(t.memory.high),
        "memory.low" => bytes(t.memory.low),
        "memory.swap_max" => bytes(t.memory.swap_max),
        _ => None,
    };
    v.unwrap_or_else(|| "-".into())
}

/// The policy as the daemon holds it: the files' text (as last loaded), the runtime overrides,
/// and the schedule windows in force.
#[derive(Debug, Clone)]
pub struct Live {
    pub config: PathBuf,
    pub sources: Vec<(PathBuf, String)>,
    /// tenant → key → value, as given to `set` (validated with the policy).
    pub runtime: BTreeMap<String, BTreeMap<String, String>>,
    /// `(tenant, schedule index)` of the windows in force.
    pub windows: Vec<(String, usize)>,
    /// When a window next opens or closes.
    pub next_change: Option<DateTime<Utc>>,
}

/// The clock the daemon reads (a function so that tests can inject one).
pub fn now_local() -> DateTime<chrono::Local> {
    chrono::Local::now()
}

impl Live {
    /// Reads the policy files and lays the windows open now over them.
    pub fn load(config: &Path) -> Result<(Live, Loaded)> {
        let sources = policy::read_sources(config)?;
        let live = Live {
            config: config.to_path_buf(),
            sources,
            runtime: BTreeMap::new(),
            windows: Vec::new(),
            next_change: None,
        };
        Ok(live.rewindowed(&now_local())?)
    }

    fn overlay(&self) -> Result<Overlay, String> {
        let mut fragments = Vec::new();
        for (tenant, values) in &self.runtime {
            fragments.push((
                PathBuf::from(format!("set {tenant}")),
                fragment(tenant, values)?,
            ));
        }
        Ok(Overlay {
            windows: self.windows.clone(),
            fragments,
        })
    }

    /// The policy in force: files, windows, runtime overrides.
    pub fn effective(&self) -> Result<Loaded, policy::PolicyErrors> {
        let overlay = self
            .overlay()
            .map_err(|e| policy::PolicyErrors(vec![policy::Problem::general(e)]))?;
        policy::from_sources_with(&self.sources, &overlay, &SystemAccounts)
    }

    /// This state with the windows open at `now` (from the files' schedules), validated.
    pub fn rewindowed<Tz: chrono::TimeZone>(
        &self,
        now: &DateTime<Tz>,
    ) -> Result<(Live, Loaded), policy::PolicyErrors> {
        let base = policy::from_sources_with(&self.sources, &Overlay::default(), &SystemAccounts)?;
        let mut next = self.clone();
        next.windows = schedule::open_windows(&base.policy, now);
        next.next_change = schedule::next_change(&base.policy, now);
        let loaded = next.effective()?;
        Ok((next, loaded))
    }

    /// Whether the windows in force would differ at `now`.
    pub fn windows_due(&self, now: DateTime<Utc>) -> bool {
        self.next_change.is_some_and(|c| c <= now)
    }

    /// The monotonic instant of the next window change, for the daemon's poll timeout.
    pub fn next_change_instant(&self) -> Option<Instant> {
        let c = self.next_change?;
        let wait = (c - Utc::now()).to_std().unwrap_or_default();
        Some(Instant::now() + wait)
    }

    /// The overrides in force, highest precedence first per key.
    pub fn overrides(&self, policy: &Policy) -> Vec<OverrideInfo> {
        let mut out: Vec<OverrideInfo> = Vec::new();
        let mut push = |tenant: &str, key: &str, source: &str, detail: String| {
            if out.iter().any(|o| o.tenant == tenant && o.key == key) {
                return; // shadowed by a higher one
            }
            let value = policy
                .tenants
                .iter()
                .find(|t| t.name == tenant)
                .map(|t| value_in_force(t, key))
                .unwrap_or_default();
            out.push(OverrideInfo {
                tenant: tenant.into(),
                key: key.into(),
                value,
                source: source.into(),
                detail,
            });
        };
        for (tenant, values) in &self.runtime {
            for k in values.keys() {
                push(tenant, k, "runtime", String::new());
            }
        }
        for (tenant, i) in self.windows.iter().rev() {
            if let Some(s) = policy
                .tenants
                .iter()
                .find(|t| &t.name == tenant)
                .and_then(|t| t.schedules.get(*i))
            {
                for k in &s.keys {
                    push(tenant, k, "schedule", format!("{} ({})", s.label, s.origin));
                }
            }
        }
        for (path, text) in &self.sources {
            let persisted = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("90-set-"))
                .and_then(|n| n.strip_suffix(".toml"));
            if let Some(tenant) = persisted {
                for k in fragment_values(text).keys() {
                    push(tenant, k, "persisted", path.display().to_string());
                }
            }
        }
        out.sort_by(|a, b| (&a.tenant, &a.key).cmp(&(&b.tenant, &b.key)));
        out
    }
}

/// What a request changes: the next state, and a drop-in to write or remove first.
struct Change {
    live: Live,
    loaded: Loaded,
    file: Option<(PathBuf, Option<String>)>,
    message: String,
}

fn known_tenant(live: &Live, policy: &Policy, tenant: &str) -> Result<(), String> {
    policy::check_group_name(tenant).map_err(|e| format!("tenant name: {e}"))?;
    if !policy.tenants.iter().any(|t| t.name == tenant) {
        return Err(format!(
            "no tenant named `{tenant}` in {}",
            live.config.display()
        ));
    }
    Ok(())
}

/// `sources` with the drop-in at `path` set to `text` (or removed), in merge order.
fn with_source(
    sources: &[(PathBuf, String)],
    path: &Path,
    text: Option<&str>,
) -> Vec<(PathBuf, String)> {
    let mut out: Vec<(PathBuf, String)> =
        sources.iter().filter(|(p, _)| p != path).cloned().collect();
    if let Some(t) = text {
        // Drop-ins follow the main file in name order.
        let at = out
            .iter()
            .skip(1)
            .position(|(p, _)| p.as_path() > path)
            .map(|i| i + 1)
            .unwrap_or(out.len());
        out.insert(at, (path.to_path_buf(), t.to_string()));
    }
    out
}

fn errors_text(e: policy::PolicyErrors) -> String {
    e.to_string().trim_end().to_string()
}

/// The text of a tenant's `90-set-<tenant>.toml`.
fn persisted_text(tenant: &str, values: &BTreeMap<String, String>) -> Result<String, String> {
    Ok(format!(
        "# Written by `dbcage set --persist`; `dbcage set {tenant} --reset --persist` removes it.\n{}",
        fragment(tenant, values)?
    ))
}

/// `reset` of some keys: those runtime overrides are dropped and, with `persist`, those keys
/// leave the persisted file (removed once empty); the tenant's other overrides stay.
fn reset_keys(live: &Live, tenant: &str, persist: bool, keys: &[String]) -> Result<Change, String> {
    if let Some(k) = keys.iter().find(|k| !KEYS.iter().any(|(n, _)| n == k)) {
        return Err(format!(
            "`{k}` cannot be reset; the keys are {}",
            key_names()
        ));
    }
    let mut next = live.clone();
    let mut dropped: Vec<&str> = Vec::new();
    if let Some(r) = next.runtime.get_mut(tenant) {
        dropped.extend(
            keys.iter()
                .filter(|k| r.remove(*k).is_some())
                .map(|k| k.as_str()),
        );
        if r.is_empty() {
            next.runtime.remove(tenant);
        }
    }
    let path = persist_path(&live.config, tenant);
    let persisted = live
        .sources
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, t)| fragment_values(t))
        .unwrap_or_default();
    let in_file: Vec<&str> = keys
        .iter()
        .filter(|k| persisted.contains_key(*k))
        .map(|k| k.as_str())
        .collect();
    let mut file = None;
    if persist && !in_file.is_empty() {
        let mut kept = persisted.clone();
        kept.retain(|k, _| !keys.contains(k));
        let text = if kept.is_empty() {
            None
        } else {
            Some(persisted_text(tenant, &kept)?)
        };
        next.sources = with_source(&live.sources, &path, text.as_deref());
        file = Some((path.clone(), text));
    }
    let loaded = next.effective().map_err(errors_text)?;
    let mut parts = Vec::new();
    if !dropped.is_empty() {
        parts.push(format!("runtime override of {} dropped", dropped.join(" ")));
    }
    if file.is_some() {
        parts.push(format!(
            "{} removed from {}",
            in_file.join(" "),
            path.display()
        ));
    }
    let mut message = if parts.is_empty() {
        format!(
            "tenant `{tenant}` has no runtime override of {}",
            keys.join(" ")
        )
    } else {
        format!("tenant `{tenant}`: {}", parts.join("; "))
    };
    if !persist && !in_file.is_empty() {
        message.push_str(&format!(
            "; the persisted {} in {} stays (add --persist to remove it)",
            in_file.join(" "),
            path.display()
        ));
    }
    Ok(Change {
        live: next,
        loaded,
        file,
        message,
    })
}

/// Works out a request's next state without touching anything.
fn plan_change(live: &Live, current: &Policy, op: &Op) -> Result<Option<Change>, String> {
    match op {
        Op::Set {
            tenant,
            values,
            persist,
        } => {
            known_tenant(live, current, tenant)?;
            let mut next = live.clone();
            let mut file = None;
            if *persist {
                let path = persist_path(&live.config, tenant);
                let mut kept = live
                    .sources
                    .iter()
                    .find(|(p, _)| *p == path)
                    .map(|(_, t)| fragment_values(t))
                    .unwrap_or_default();
                kept.extend(values.clone());
                let text = persisted_text(tenant, &kept)?;
                next.sources = with_source(&live.sources, &path, Some(&text));
                // Persisted values replace runtime ones of the same keys.
                if let Some(r) = next.runtime.get_mut(tenant) {
                    r.retain(|k, _| !values.contains_key(k));
                    if r.is_empty() {
                        next.runtime.remove(tenant);
                    }
                }
                file = Some((path, Some(text)));
            } else {
                fragment(tenant, values)?; // the keys and values, before merging
                next.runtime
                    .entry(tenant.clone())
                    .or_default()
                    .extend(values.clone());
            }
            let loaded = next.effective().map_err(errors_text)?;
            let list: Vec<String> = values.iter().map(|(k, v)| format!("{k}={v}")).collect();
            Ok(Some(Change {
                live: next,
                loaded,
                file,
                message: format!(
                    "tenant `{tenant}`: {} ({})",
                    list.join(" "),
                    if *persist {
                        "persisted"
                    } else {
                        "until reload or restart"
                    }
                ),
            }))
        }
        Op::Reset {
            tenant,
            persist,
            keys,
        } if !keys.is_empty() => {
            known_tenant(live, current, tenant)?;
            reset_keys(live, tenant, *persist, keys).map(Some)
        }
        Op::Reset {
            tenant, persist, ..
        } => {
            known_tenant(live, current, tenant)?;
            let mut next = live.clone();
            let had = next.runtime.remove(tenant).is_some();
            let mut file = None;
            let path = persist_path(&live.config, tenant);
            let persisted = live.sources.iter().any(|(p, _)| *p == path) || path.exists();
            if *persist && persisted {
                next.sources = with_source(&live.sources, &path, None);
                file = Some((path.clone(), None));
            }
            let loaded = next.effective().map_err(errors_text)?;
            let mut message = match (had, file.is_some()) {
                (false, false) => format!("tenant `{tenant}` has no runtime overrides"),
                (true, false) => format!("tenant `{tenant}`: runtime overrides dropped"),
                (_, true) => format!(
                    "tenant `{tenant}`: overrides dropped and {} removed",
                    path.display()
                ),
            };
            if persisted && !persist {
                message.push_str(&format!(
                    "; the persisted values in {} stay (add --persist to remove them)",
                    path.display()
                ));
            }
            Ok(Some(Change {
                live: next,
                loaded,
                file,
                message,
            }))
        }
        Op::Reload {} => {
            let sources = policy::read_sources(&live.config).map_err(errors_text)?;
            let fresh = Live {
                config: live.config.clone(),
                sources,
                runtime: BTreeMap::new(),
                windows: Vec::new(),
                next_change: None,
            };
            let (next, loaded) = fresh.rewindowed(&now_local()).map_err(errors_text)?;
            let dropped = live.runtime.values().map(|v| v.len()).sum::<usize>();
            Ok(Some(Change {
                message: format!(
                    "policy reloaded: {} ({} tenants){}",
                    loaded
                        .policy
                        .files
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    loaded.policy.tenants.len(),
                    if dropped > 0 {
                        format!("; {dropped} runtime override(s) dropped")
                    } else {
                        String::new()
                    }
                ),
                live: next,
                loaded,
                file: None,
            }))
        }
        Op::Overrides {} | Op::Health {} => Ok(None),
    }
}

/// Writes (atomically: a temporary file in the same directory, then rename) or removes a
/// drop-in. Written files are root's, mode 0600, like the policy.
pub fn write_dropin(path: &Path, text: Option<&str>) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = path.parent().context("a drop-in has a directory")?;
    match text {
        None => match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
        },
        Some(text) => {
            if !dir.is_dir() {
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            let mut tmp = tempfile::Builder::new()
                .prefix(".dbcage-set-")
                .suffix(".tmp")
                .tempfile_in(dir)
                .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
            tmp.as_file()
                .set_permissions(std::fs::Permissions::from_mode(0o600))
                .context("chmod 0600")?;
            tmp.write_all(text.as_bytes())
                .and_then(|()| tmp.as_file().sync_all())
                .with_context(|| format!("writing {}", tmp.path().display()))?;
            tmp.persist(path)
                .with_context(|| format!("renaming into {}", path.display()))?;
            Ok(())
        }
    }
}

/// The daemon (or a one-shot `set --direct`) as seen from here: it holds the state, prepares a
/// policy for the plan → apply path, and applies it.
pub trait Governor {
    /// A policy checked against the host and planned, ready to apply.
    type Staged;
    fn live(&self) -> &Live;
    fn live_mut(&mut self) -> &mut Live;
    fn current(&self) -> &Policy;
    /// Everything that can fail before a write: device resolution, layout, planning.
    fn stage(&mut self, loaded: Loaded) -> Result<Self::Staged>;
    /// Applies and adopts; returns the writes that failed.
    fn commit(&mut self, live: Live, staged: Self::Staged) -> Vec<String>;
}

/// Serves one request: check the change in full, write the drop-in if any, apply.
pub fn handle<G: Governor>(g: &mut G, op: &Op, received: Instant) -> Response {
    match op {
        Op::Overrides {} => {
            let mut r = Response::ok("overrides in force");
            r.overrides = g.live().overrides(g.current());
            return r;
        }
        Op::Health {} => {
            return Response::refuse("`health` is answered by the daemon (`dbcage run`) only")
        }
        _ => {}
    }
    let change = match plan_change(g.live(), g.current(), op) {
        Ok(Some(c)) => c,
        Ok(None) => return Response::ok(""),
        Err(e) => return Response::refuse(format!("{e}\nnothing was changed")),
    };
    let staged = match g.stage(change.loaded) {
        Ok(s) => s,
        Err(e) => return Response::refuse(format!("{e:#}\nnothing was changed")),
    };
    if let Some((path, text)) = &change.file {
        if let Err(e) = write_dropin(path, text.as_deref()) {
            return Response::refuse(format!("{e:#}\nnothing was changed"));
        }
    }
    let errors = g.commit(change.live, staged);
    let mut r = if errors.is_empty() {
        Response::ok(change.message)
    } else {
        Response::refuse(format!(
            "{}; but {} write(s) failed",
            change.message,
            errors.len()
        ))
    };
    r.errors = errors;
    r.applied_us = Some(received.elapsed().as_micros() as u64);
    r
}

/// Re-evaluates the schedule windows at `now`; applies when the set in force changed.
/// Returns a line for the log when something happened.
pub fn tick<G: Governor, Tz: chrono::TimeZone>(g: &mut G, now: &DateTime<Tz>) -> Option<String>
where
    Tz::Offset: std::fmt::Display,
{
    let (next, loaded) = match g.live().rewindowed(now) {
        Ok(x) => x,
        Err(e) => {
            return Some(format!(
                "schedule change at {now} refused, the limits in force stay: {}",
                errors_text(e)
            ))
        }
    };
    if next.windows == g.live().windows {
        // Only the next change moved (or the clock jumped): nothing to apply.
        g.live_mut().next_change = next.next_change;
        return None;
    }
    let describe = |l: &Live, p: &Policy| -> String {
        let w: Vec<String> = l
            .windows
            .iter()
            .filter_map(|(t, i)| {
                let s = p.tenants.iter().find(|x| &x.name == t)?.schedules.get(*i)?;
                Some(format!("{t}: {}", s.label))
            })
            .collect();
        if w.is_empty() {
            "none".into()
        } else {
            w.join(", ")
        }
    };
    let before = describe(g.live(), g.current());
    let after = describe(&next, &loaded.policy);
    match g.stage(loaded) {
        Ok(staged) => {
            let errors = g.commit(next, staged);
            Some(format!(
                "schedule windows in force: {after} (were: {before}){}",
                if errors.is_empty() {
                    String::new()
                } else {
                    format!("; {} write(s) failed: {}", errors.len(), errors.join("; "))
                }
            ))
        }
        Err(e) => Some(format!(
            "schedule change to {after} refused, the limits in force stay: {e:#}"
        )),
    }
}

/// `dbcage set --direct` and friends: the same request, applied once by this process.
pub struct Direct {
    pub live: Live,
    pub ctx: crate::cli::Context_,
}

impl Governor for Direct {
    type Staged = (crate::cli::Context_, crate::plan::Plan);
    fn live(&self) -> &Live {
        &self.live
    }
    fn live_mut(&mut self) -> &mut Live {
        &mut self.live
    }
    fn current(&self) -> &Policy {
        &self.ctx.loaded.policy
    }
    fn stage(&mut self, loaded: Loaded) -> Result<Self::Staged> {
        let ctx = crate::cli::prepare_with(loaded)?;
        let plan = crate::cli::make_plan(&ctx)?;
        Ok((ctx, plan))
    }
    fn commit(&mut self, live: Live, (ctx, plan): Self::Staged) -> Vec<String> {
        let outcome = crate::cgroup::apply::execute(&plan);
        self.live = live;
        self.ctx = ctx;
        outcome.errors.iter().map(|e| e.to_string()).collect()
    }
}

#[cfg(test)]
mod tests;
