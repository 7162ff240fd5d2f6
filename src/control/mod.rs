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
use chrono::DateTime;

use crate::policy::{self, Loaded, Policy};
pub use protocol::{DaemonHealth, DaemonMode, Op, OverrideInfo, Request, Response};
pub use server::Server;
// The policy in force (files, windows, runtime values) is the engine's; `set` edits it.
pub use crate::engine::live::*;

/// Where the daemons' sockets live (one per root group: `/run/dbcage/<root>.sock`).
pub const SOCKET_DIR: &str = crate::rundir::RUN_DIR;

/// The socket of the daemon that serves the root group `root` (a validated group name).
pub fn socket_path(root: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("{root}.sock"))
}

/// What a request changes: the next state, and a drop-in to write or remove first.
struct Change {
    live: Live,
    loaded: Loaded,
    /// Drop-ins to write (`Some`) or remove (`None`), before the change is applied.
    files: Vec<(PathBuf, Option<String>)>,
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

/// A refused change's problems, one per line, without `PolicyErrors`' own "nothing was applied"
/// (the caller adds the one "nothing was changed").
fn errors_text(e: policy::PolicyErrors) -> String {
    let n = e.0.len();
    let mut out = format!("{n} error{}:", if n == 1 { "" } else { "s" });
    for p in &e.0 {
        out.push_str(&format!("\n  {p}"));
    }
    out
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
    let mut files = Vec::new();
    if persist && !in_file.is_empty() {
        let mut kept = persisted.clone();
        kept.retain(|k, _| !keys.contains(k));
        let text = if kept.is_empty() {
            None
        } else {
            Some(persisted_text(tenant, &kept)?)
        };
        next.sources = with_source(&live.sources, &path, text.as_deref());
        files.push((path.clone(), text));
    }
    let loaded = next.effective().map_err(errors_text)?;
    let mut parts = Vec::new();
    if !dropped.is_empty() {
        parts.push(format!("runtime override of {} dropped", dropped.join(" ")));
    }
    if !files.is_empty() {
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
        files,
        message,
    })
}

/// Works out a request's next state without touching anything.
fn plan_change(live: &Live, current: &Policy, op: &Op) -> Result<Option<Change>, String> {
    match op {
        Op::Set {
            tenant,
            values,
            also,
            persist,
            dry_run: _,
        } => {
            let mut next = live.clone();
            let mut files = Vec::new();
            let mut said = Vec::new();
            for (tenant, values) in std::iter::once((tenant, values)).chain(also) {
                known_tenant(live, current, tenant)?;
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
                    next.sources = with_source(&next.sources, &path, Some(&text));
                    // Persisted values replace runtime ones of the same keys.
                    if let Some(r) = next.runtime.get_mut(tenant) {
                        r.retain(|k, _| !values.contains_key(k));
                        if r.is_empty() {
                            next.runtime.remove(tenant);
                        }
                    }
                    files.push((path, Some(text)));
                } else {
                    fragment(tenant, values)?; // the keys and values, before merging
                    next.runtime
                        .entry(tenant.clone())
                        .or_default()
                        .extend(values.clone());
                }
                let list: Vec<String> = values.iter().map(|(k, v)| format!("{k}={v}")).collect();
                said.push(format!(
                    "tenant `{tenant}`: {} ({})",
                    list.join(" "),
                    if *persist {
                        format!(
                            "persisted in {}",
                            persist_path(&live.config, tenant).display()
                        )
                    } else {
                        "until reload or restart".to_string()
                    }
                ));
            }
            // all tenants' values at once: one validation, one plan, one apply
            let loaded = next.effective().map_err(errors_text)?;
            Ok(Some(Change {
                live: next,
                loaded,
                files,
                message: said.join("\n"),
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
            let mut files = Vec::new();
            let path = persist_path(&live.config, tenant);
            let persisted = live.sources.iter().any(|(p, _)| *p == path) || path.exists();
            if *persist && persisted {
                next.sources = with_source(&live.sources, &path, None);
                files.push((path.clone(), None));
            }
            let loaded = next.effective().map_err(errors_text)?;
            let mut message = match (had, !files.is_empty()) {
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
                files,
                message,
            }))
        }
        Op::Reload {} => {
            let sources = policy::read_sources(&live.config, live.trust).map_err(errors_text)?;
            let fresh = Live {
                config: live.config.clone(),
                trust: live.trust,
                sources,
                runtime: BTreeMap::new(),
                windows: Vec::new(),
                next_change: None,
            };
            let (next, loaded) = fresh.rewindowed(&now_local()).map_err(errors_text)?;
            let dropped = live.runtime.values().map(|v| v.len()).sum::<usize>();
            Ok(Some(Change {
                message: format!(
                    "policy reloaded: {} ({}){}",
                    loaded
                        .policy
                        .files
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    crate::units::count(loaded.policy.tenants.len(), "tenant", "tenants"),
                    if dropped > 0 {
                        format!(
                            "; {} dropped",
                            crate::units::count(dropped, "runtime override", "runtime overrides")
                        )
                    } else {
                        String::new()
                    }
                ),
                live: next,
                loaded,
                files: Vec::new(),
            }))
        }
        Op::Overrides {} | Op::Health {} => Ok(None),
    }
}

/// Writes or removes the drop-ins of one change; when one fails, those written before it get
/// their old text back, so a `set` of several tenants persists all or none.
fn write_dropins(files: &[(PathBuf, Option<String>)]) -> Result<()> {
    let mut done: Vec<(&PathBuf, Option<String>)> = Vec::new();
    for (path, text) in files {
        let before = std::fs::read_to_string(path).ok();
        if let Err(e) = write_dropin(path, text.as_deref()) {
            for (p, old) in done.iter().rev() {
                if let Err(undo) = write_dropin(p, old.as_deref()) {
                    tracing::warn!("restoring {} after a failed set: {undo:#}", p.display());
                }
            }
            return Err(e);
        }
        done.push((path, before));
    }
    Ok(())
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
    /// The `numa = "auto"` tenants a staged change moves to other nodes, one line each (said by
    /// `set` and `set --dry-run`).
    fn numa_changes(_staged: &Self::Staged) -> Vec<String> {
        Vec::new()
    }
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
    let mut message = change.message;
    for line in G::numa_changes(&staged) {
        message.push('\n');
        message.push_str(&line);
    }
    if matches!(op, Op::Set { dry_run: true, .. }) {
        return Response::ok(format!("{message}\ndry run: nothing was changed"));
    }
    if let Err(e) = write_dropins(&change.files) {
        return Response::refuse(format!("{e:#}\nnothing was changed"));
    }
    let errors = g.commit(change.live, staged);
    let mut r = if errors.is_empty() {
        Response::ok(message)
    } else {
        Response::refuse(format!(
            "{message}; but {} failed",
            crate::units::count(errors.len(), "write", "writes")
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
                    format!(
                        "; {} failed: {}",
                        crate::units::count(errors.len(), "write", "writes"),
                        errors.join("; ")
                    )
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
    pub prepared: crate::engine::Prepared,
}

impl Governor for Direct {
    type Staged = (crate::engine::Prepared, crate::plan::Plan);
    fn live(&self) -> &Live {
        &self.live
    }
    fn live_mut(&mut self) -> &mut Live {
        &mut self.live
    }
    fn current(&self) -> &Policy {
        &self.prepared.loaded.policy
    }
    fn stage(&mut self, loaded: Loaded) -> Result<Self::Staged> {
        use crate::engine;
        let prepared = engine::read_host(loaded, engine::Scan::Full)?;
        // One process, no daemon: no balancer shares, no raises.
        let plan = engine::plan(&prepared, &engine::Adjustments::default())?;
        Ok((prepared, plan))
    }
    fn numa_changes((_, plan): &Self::Staged) -> Vec<String> {
        plan.numa_changes()
    }
    fn commit(&mut self, live: Live, (prepared, plan): Self::Staged) -> Vec<String> {
        let outcome = crate::engine::execute(&plan);
        self.live = live;
        self.prepared = prepared;
        outcome.errors.iter().map(|e| e.to_string()).collect()
    }
}

#[cfg(test)]
mod tests;
