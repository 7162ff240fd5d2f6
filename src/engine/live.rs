//! The policy in force: the policy files' text, the schedule windows open now and the runtime
//! `set` values, laid over each other (`policy::Overlay`) and validated by the very code that
//! validates the files. Precedence, low to high: the files (with `conf.d/90-set-<tenant>.toml`
//! that `set --persist` writes), the schedule windows in force, the runtime `set` values.
//!
//! These overrides are not `Adjustments` of the plan: they are policy text, and a value given
//! to `set` or a schedule must be refused with its location exactly as a file's value is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::policy::{
    self, schedule, FileTrust, Loaded, Overlay, Policy, PolicyPath, SystemAccounts, Tenant,
};

/// The drop-in `set --persist` writes for a tenant.
pub fn persist_path(config: &Path, tenant: &str) -> PathBuf {
    policy::dropin_dir(config).join(format!("90-set-{tenant}.toml"))
}

/// One value in force that an override put there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverrideInfo {
    pub tenant: String,
    pub key: String,
    pub value: String,
    /// `runtime`, `persisted`, or `schedule`.
    pub source: String,
    /// The drop-in file, or the window and where it is written.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// What a key's value becomes in TOML.
#[derive(Clone, Copy, PartialEq)]
pub enum Kind {
    /// A count or a size: a whole number, or text with a unit (`200MiB`).
    Quantity,
    /// `cpu.cores`: a number, possibly fractional.
    Number,
    /// `cpu.cpus`: a cpu list as text (`0-3,8`).
    Text,
    /// `cpu.numa_nodes`: node numbers separated by commas.
    List,
    /// `cpu.migrate_memory`: true or false.
    Bool,
}

/// The keys `set` and schedules may change: the limits, nothing that selects processes or
/// devices.
pub const KEYS: &[(&str, Kind)] = &[
    ("io.read_bps", Kind::Quantity),
    ("io.write_bps", Kind::Quantity),
    ("io.read_iops", Kind::Quantity),
    ("io.write_iops", Kind::Quantity),
    ("cpu.cores", Kind::Number),
    ("cpu.weight", Kind::Quantity),
    ("cpu.cpus", Kind::Text),
    ("cpu.numa_nodes", Kind::List),
    // true: a running tenant whose NUMA nodes change moves its memory now (under the daemon,
    // what `apply --migrate-memory` is without it)
    ("cpu.migrate_memory", Kind::Bool),
    ("memory.max", Kind::Quantity),
    ("memory.high", Kind::Quantity),
    ("memory.low", Kind::Quantity),
    ("memory.swap_max", Kind::Quantity),
];

pub fn key_names() -> String {
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

/// One tenant's `KEY=VALUE` pairs.
pub type TenantValues = (String, BTreeMap<String, String>);

/// `set`'s words after the first tenant: `KEY=VALUE` pairs, and a word without `=` naming the
/// next tenant (`A cpu.cores=4 B cpu.cores=32`). Each tenant once, each with a pair at least.
pub fn parse_tenant_assignments(
    first: &str,
    words: &[String],
) -> Result<Vec<TenantValues>, String> {
    let mut groups: Vec<(String, Vec<String>)> = vec![(first.to_string(), Vec::new())];
    for w in words {
        if w.contains('=') {
            groups.last_mut().expect("one at least").1.push(w.clone());
        } else if groups.iter().any(|(t, _)| t == w) {
            return Err(format!(
                "tenant `{w}` is named twice; give all its values after it once"
            ));
        } else {
            groups.push((w.clone(), Vec::new()));
        }
    }
    groups
        .into_iter()
        .map(|(t, words)| {
            if words.is_empty() {
                return Err(format!(
                    "tenant `{t}` has no KEY=VALUE after it (e.g. `dbcage set {t} cpu.cores=4`)"
                ));
            }
            let values = parse_assignments(&words).map_err(|e| format!("tenant `{t}`: {e}"))?;
            Ok((t, values))
        })
        .collect()
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
            Kind::Bool => Value::Boolean(
                text.parse::<bool>()
                    .map_err(|_| format!("{key}: `{text}` is not true or false"))?,
            ),
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
pub fn fragment_values(text: &str) -> BTreeMap<String, String> {
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
        "cpu.migrate_memory" => Some(t.cpu.migrate_memory.to_string()),
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
    /// Whether the files must be root's (see `policy::FileTrust`); a reload reads them so too.
    pub trust: FileTrust,
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
    pub fn load(config: &PolicyPath) -> Result<(Live, Loaded)> {
        let sources = policy::read_sources(config, config.trust)?;
        let live = Live {
            config: config.path.clone(),
            trust: config.trust,
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
                PathBuf::from(format!("dbcage set {tenant}")),
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
        if next.windows.is_empty() && next.runtime.is_empty() {
            // Nothing laid over the files: the policy in force is the one just read (validating
            // it again was a sixth of the daemon's start at 1,000 tenants).
            return Ok((next, base));
        }
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
