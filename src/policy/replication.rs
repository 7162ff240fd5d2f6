//! The replication guard's configuration (`[tenant.replication]`): the validated form the policy
//! holds. The guard itself (watchers, decisions, raises) is the top-level `replication` module.

use std::time::Duration;

use serde::Serialize;

use super::raw::{Quantity, RawReplication};
use super::source::Loc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Primary,
    Standby,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Warn,
    Raise,
}

/// A tenant's validated `[tenant.replication]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GuardConfig {
    pub role: Role,
    /// libpq connection string of the local server (`host=/run/postgresql port=5432`).
    pub conninfo: String,
    /// The account psql runs as (peer authentication on the socket); `None`: the daemon's own
    /// (then `conninfo` names the database role, and pg_hba/pg_ident let root in as it).
    pub user: Option<String>,
    pub psql: String,
    pub lag_bytes: u64,
    pub lag_seconds: Option<f64>,
    pub hold: Duration,
    pub interval: Duration,
    pub action: Action,
    /// Ceiling of a raise: write (and read) bytes/s.
    pub raise_to: Option<u64>,
    /// Ceiling of a raise: write (and read) IO/s.
    pub raise_iops_to: Option<u64>,
}

/// Validates the raw table; problems are located at the offending key.
pub fn validate(tenant: &str, r: &RawReplication) -> Result<GuardConfig, Vec<Loc<String>>> {
    let mut problems = Vec::new();
    let mut bad = |at: &Loc<String>, msg: String| {
        problems.push(at.here(format!("tenant `{tenant}`: replication.{msg}")));
    };
    let role = match r.role.value.as_str() {
        "primary" => Role::Primary,
        "standby" => Role::Standby,
        other => {
            bad(
                &r.role,
                format!("role `{other}` is not valid; use \"primary\" or \"standby\""),
            );
            Role::Standby
        }
    };
    if r.conninfo.value.chars().any(char::is_control) || r.conninfo.value.trim().is_empty() {
        bad(
            &r.conninfo,
            "conninfo must be a one-line libpq connection string".into(),
        );
    }
    let user = r.user.as_ref().map(|u| {
        if u.value.is_empty()
            || !u
                .value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        {
            bad(
                u,
                format!("user `{}` is not an account name", u.value.escape_debug()),
            );
        }
        u.value.clone()
    });
    let psql = r.psql.as_ref().map_or("/usr/bin/psql".to_string(), |p| {
        if !p.value.starts_with('/') || p.value.split('/').any(|c| c == "..") {
            bad(
                p,
                format!(
                    "psql `{}` must be an absolute path without `..`",
                    p.value.escape_debug()
                ),
            );
        }
        p.value.clone()
    });
    let bytes = |q: &Loc<Quantity>, key: &str, bad: &mut dyn FnMut(&Loc<String>, String)| {
        let (at, text) = quantity_text(q);
        crate::units::parse_bytes(&text)
            .map_err(|e| bad(&at, format!("{key}: {e}")))
            .ok()
    };
    let lag_bytes = r
        .lag_bytes
        .as_ref()
        .and_then(|q| bytes(q, "lag_bytes", &mut bad))
        .unwrap_or(64 << 20);
    let lag_seconds = r.lag_seconds.as_ref().and_then(|s| {
        if s.value.is_finite() && s.value > 0.0 {
            Some(s.value)
        } else {
            bad(
                &s.here(String::new()),
                "lag_seconds must be a positive number".into(),
            );
            None
        }
    });
    let dur = |d: &Option<Loc<String>>,
               key: &str,
               default: Duration,
               bad: &mut dyn FnMut(&Loc<String>, String)| match d {
        None => default,
        Some(d) => match crate::policy::parse_duration(&d.value) {
            Some(v) if v >= Duration::from_millis(200) && v <= Duration::from_secs(3600) => v,
            _ => {
                bad(
                    d,
                    format!(
                        "{key} `{}` is not a duration from 200ms to 1h (\"10s\", \"500ms\")",
                        d.value
                    ),
                );
                default
            }
        },
    };
    let hold = dur(&r.hold, "for", Duration::from_secs(10), &mut bad);
    let interval = dur(&r.interval, "interval", Duration::from_secs(1), &mut bad);
    let action = match r.action.as_ref().map(|a| a.value.as_str()) {
        None | Some("warn") => Action::Warn,
        Some("raise") => Action::Raise,
        Some(other) => {
            bad(
                r.action.as_ref().unwrap(),
                format!("action `{other}` is not valid; use \"warn\" or \"raise\""),
            );
            Action::Warn
        }
    };
    let raise_to = r
        .raise_to
        .as_ref()
        .and_then(|q| bytes(q, "raise_to", &mut bad));
    let raise_iops_to = r.raise_iops_to.as_ref().and_then(|q| {
        let (at, text) = quantity_text(q);
        crate::units::parse_count(&text)
            .map_err(|e| bad(&at, format!("raise_iops_to: {e}")))
            .ok()
    });
    if action == Action::Raise {
        if role == Role::Primary {
            bad(&r.role, "action = \"raise\" needs role = \"standby\" (the tenant that falls behind); a primary's guard warns".into());
        }
        if raise_to.is_none() && raise_iops_to.is_none() {
            bad(
                r.action.as_ref().unwrap(),
                "action = \"raise\" needs a ceiling: raise_to (bytes/s) and/or raise_iops_to"
                    .into(),
            );
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(GuardConfig {
        role,
        conninfo: r.conninfo.value.clone(),
        user,
        psql,
        lag_bytes,
        lag_seconds,
        hold,
        interval,
        action,
        raise_to,
        raise_iops_to,
    })
}

/// A quantity as text (for the unit parsers), and its location.
fn quantity_text(q: &Loc<Quantity>) -> (Loc<String>, String) {
    let text = match &q.value {
        Quantity::Int(i) => i.to_string(),
        Quantity::Float(f) => f.to_string(),
        Quantity::Text(t) => t.clone(),
    };
    (q.here(text.clone()), text)
}
