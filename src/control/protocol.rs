//! The control protocol, version 1: one JSON request per connection, one line (at most
//! `MAX_REQUEST` bytes, ending in `\n`), answered by one JSON line. Documented for users in
//! README.md ("Change limits live"); this is the reference.
//!
//! ```text
//! → {"v":1,"op":"set","tenant":"DEMO","values":{"io.read_bps":"200MiB","cpu.cpus":"0-3"},"persist":false}
//! → {"v":1,"op":"reset","tenant":"DEMO","persist":false}
//! → {"v":1,"op":"reset","tenant":"DEMO","persist":false,"keys":["io.read_bps"]}
//! → {"v":1,"op":"reload"}
//! → {"v":1,"op":"overrides"}
//! → {"v":1,"op":"health"}
//! ← {"v":1,"ok":true,"message":"...","applied_us":812,"errors":[],"overrides":[...]}
//! ← {"v":1,"ok":true,"message":"daemon health","daemon":{"pid":812,"mode":"events",...},"overrides":[...]}
//! ← {"v":1,"ok":false,"message":"tenant `DEMO`: cpu.cores = 0 is out of range (0.01 to 4096)"}
//! ```
//!
//! Unknown fields, unknown operations, other versions and oversized or malformed lines are
//! refused with `ok: false` and a message; the connection is then closed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The protocol version this build speaks.
pub const VERSION: u32 = 1;
/// The longest request line accepted, in bytes.
pub const MAX_REQUEST: usize = 64 * 1024;
/// The most values one `set` may carry.
pub const MAX_VALUES: usize = 64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Op {
    /// Override limits of one tenant, and of the tenants in `also` in the same change (all or
    /// nothing: seed 002's live swap of CPU counts between instances); `persist`: also write
    /// them to drop-ins; `dry_run`: validate and plan, say what would change, change nothing.
    Set {
        tenant: String,
        values: BTreeMap<String, String>,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        also: BTreeMap<String, BTreeMap<String, String>>,
        #[serde(default)]
        persist: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        dry_run: bool,
    },
    /// Drop the tenant's runtime overrides (`persist`: and its `90-set-<tenant>.toml`); with
    /// `keys`, only those (`persist`: and only those in the file).
    Reset {
        tenant: String,
        #[serde(default)]
        persist: bool,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        keys: Vec<String>,
    },
    /// Re-read and validate the policy files; keep the running policy if anything is wrong.
    Reload {},
    /// List the values in force that do not come from the policy files' tenant tables.
    Overrides {},
    /// How the daemon is doing (`status` shows it); only `dbcage run` answers it.
    Health {},
}

/// How a request reads in the daemon's log: `set pg15 io.read_bps=200MiB cpu.cpus=0-3
/// (persist)`, `reset pg15 io.read_bps`, `reload`.
impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let persist = |p: &bool| if *p { " (persist)" } else { "" };
        match self {
            Op::Set {
                tenant,
                values,
                also,
                persist: p,
                dry_run,
            } => {
                f.write_str("set")?;
                for (t, values) in std::iter::once((tenant, values)).chain(also) {
                    write!(f, " {t}")?;
                    for (k, v) in values {
                        write!(f, " {k}={v}")?;
                    }
                }
                f.write_str(persist(p))?;
                f.write_str(if *dry_run { " (dry run)" } else { "" })
            }
            Op::Reset {
                tenant,
                persist: p,
                keys,
            } => {
                write!(f, "reset {tenant}")?;
                for k in keys {
                    write!(f, " {k}")?;
                }
                f.write_str(persist(p))
            }
            Op::Reload {} => f.write_str("reload"),
            Op::Overrides {} => f.write_str("overrides"),
            Op::Health {} => f.write_str("health"),
        }
    }
}

impl Op {
    /// Read-only requests (`status` asks `health` every run): logged at debug level only.
    pub fn is_query(&self) -> bool {
        matches!(self, Op::Overrides {} | Op::Health {})
    }
}

/// A request: the version and the operation, sent as one flat JSON object (serde's `flatten`
/// cannot be combined with `deny_unknown_fields`, so `v` is added and removed by hand).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub v: u32,
    pub op: Op,
}

impl Request {
    pub fn new(op: Op) -> Request {
        Request { v: VERSION, op }
    }
    /// The request as one line, `\n` included.
    pub fn line(&self) -> Vec<u8> {
        let mut value = serde_json::to_value(&self.op).expect("an Op serializes");
        if let Some(m) = value.as_object_mut() {
            m.insert("v".into(), self.v.into());
        }
        let mut v = serde_json::to_vec(&value).expect("a Value serializes");
        v.push(b'\n');
        v
    }
}

pub use crate::engine::live::OverrideInfo;

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Response {
    pub v: u32,
    pub ok: bool,
    pub message: String,
    /// Request read → every control-file write done, in microseconds (set, reset, reload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_us: Option<u64>,
    /// Writes that failed while applying (the kernel's errors).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<OverrideInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon: Option<DaemonHealth>,
}

/// How the daemon learns of new processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DaemonMode {
    /// The kernel's process events: each process is placed as it starts.
    #[default]
    Events,
    /// No process events: only rescans, every `rescan_interval_seconds`.
    RescanOnly,
}

/// The running daemon's own state: is it placing processes as they come, and has it lost any.
/// The `health` answer also carries the overrides in force (as `overrides` does), so that
/// `status` asks once.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DaemonHealth {
    pub pid: u32,
    pub uptime_seconds: f64,
    pub mode: DaemonMode,
    pub rescan_interval_seconds: f64,
    /// Process events received, socket overruns (each followed by a rescan), full rescans,
    /// processes moved, reloads refused.
    pub events: u64,
    pub events_lost: u64,
    pub rescans: u64,
    pub moves: u64,
    pub reload_failures: u64,
    /// Since the last full scan of the host's processes.
    pub last_scan_seconds_ago: Option<f64>,
}

impl Response {
    pub fn ok(message: impl Into<String>) -> Response {
        Response {
            v: VERSION,
            ok: true,
            message: message.into(),
            ..Response::default()
        }
    }
    pub fn refuse(message: impl Into<String>) -> Response {
        Response {
            v: VERSION,
            ok: false,
            message: message.into(),
            ..Response::default()
        }
    }
    /// The reply as one line, `\n` included.
    pub fn line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).unwrap_or_else(|_| {
            br#"{"v":1,"ok":false,"message":"the reply could not be encoded"}"#.to_vec()
        });
        v.push(b'\n');
        v
    }
}

/// Parses one request line (without or with its `\n`). Every refusal says what was wrong.
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    if line.len() > MAX_REQUEST {
        return Err(format!(
            "the request is longer than {MAX_REQUEST} bytes; refused"
        ));
    }
    let text = std::str::from_utf8(line).map_err(|_| "the request is not UTF-8".to_string())?;
    let text = text.strip_suffix('\n').unwrap_or(text);
    if text.contains('\n') {
        return Err("one request per line, and one line per connection".into());
    }
    // The version first, so that a newer client gets a clear answer rather than a field error.
    let mut value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("the request is not JSON: {e}"))?;
    match value.get("v").and_then(|v| v.as_u64()) {
        Some(v) if v == VERSION as u64 => {}
        Some(v) => {
            return Err(format!(
                "protocol version {v} is not supported; this daemon speaks version {VERSION}"
            ))
        }
        None => return Err("the request has no protocol version (`\"v\": 1`)".into()),
    }
    if let Some(m) = value.as_object_mut() {
        m.remove("v");
    }
    let op: Op = serde_json::from_value(value).map_err(|e| format!("malformed request: {e}"))?;
    let req = Request { v: VERSION, op };
    if let Op::Set { values, also, .. } = &req.op {
        if values.is_empty() || also.values().any(|v| v.is_empty()) {
            return Err("`set` needs at least one KEY=VALUE for each tenant".into());
        }
        if values.len() + also.values().map(|v| v.len()).sum::<usize>() > MAX_VALUES {
            return Err(format!("`set` takes at most {MAX_VALUES} values"));
        }
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let reqs = [
            Request {
                v: 1,
                op: Op::Set {
                    tenant: "DEMO".into(),
                    values: [("io.read_bps".to_string(), "200MiB".to_string())].into(),
                    persist: true,
                    also: BTreeMap::new(),
                    dry_run: false,
                },
            },
            Request {
                v: 1,
                op: Op::Set {
                    tenant: "ORA1".into(),
                    values: [("cpu.cores".to_string(), "1".to_string())].into(),
                    persist: false,
                    also: [(
                        "ORA2".to_string(),
                        [("cpu.cores".to_string(), "2".to_string())].into(),
                    )]
                    .into(),
                    dry_run: true,
                },
            },
            Request {
                v: 1,
                op: Op::Reset {
                    tenant: "DEMO".into(),
                    persist: false,
                    keys: vec![],
                },
            },
            Request {
                v: 1,
                op: Op::Reset {
                    tenant: "DEMO".into(),
                    persist: true,
                    keys: vec!["io.read_bps".into(), "cpu.cores".into()],
                },
            },
            Request {
                v: 1,
                op: Op::Reload {},
            },
            Request {
                v: 1,
                op: Op::Overrides {},
            },
            Request {
                v: 1,
                op: Op::Health {},
            },
        ];
        for r in reqs {
            let line = r.line();
            assert_eq!(
                parse_request(&line).unwrap(),
                r,
                "{}",
                String::from_utf8_lossy(&line)
            );
        }
        let r = parse_request(br#"{"v":1,"op":"set","tenant":"a","values":{"cpu.cores":"2"}}"#)
            .unwrap();
        assert!(matches!(r.op, Op::Set { persist: false, .. }));
    }

    #[test]
    fn malformed_requests_are_refused_with_a_reason() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "not JSON"),
            (b"{", "not JSON"),
            (b"\xff\xfe", "UTF-8"),
            (br#"{"op":"reload"}"#, "no protocol version"),
            (br#"{"v":2,"op":"reload"}"#, "version 2 is not supported"),
            (br#"{"v":"1","op":"reload"}"#, "no protocol version"),
            (br#"{"v":1,"op":"shutdown"}"#, "malformed"),
            (br#"{"v":1,"op":"reload","x":1}"#, "malformed"),
            (
                br#"{"v":1,"op":"set","tenant":"a","values":{}}"#,
                "at least one",
            ),
            (
                br#"{"v":1,"op":"set","tenant":"a","values":{"k":1}}"#,
                "malformed",
            ),
            (b"[1,2]", "no protocol version"),
            (
                b"{\"v\":1,\"op\":\"reload\"}\n{\"v\":1,\"op\":\"reload\"}",
                "one request",
            ),
        ];
        for (line, want) in cases {
            let e = parse_request(line).unwrap_err();
            assert!(e.contains(want), "{:?}: {e}", String::from_utf8_lossy(line));
        }
        let big = format!(
            r#"{{"v":1,"op":"set","tenant":"a","values":{{"k":"{}"}}}}"#,
            "x".repeat(MAX_REQUEST)
        );
        assert!(parse_request(big.as_bytes())
            .unwrap_err()
            .contains("longer"));
        let many: BTreeMap<String, String> = (0..=MAX_VALUES)
            .map(|i| (format!("k{i}"), "1".into()))
            .collect();
        let req = serde_json::json!({"v":1,"op":"set","tenant":"a","values":many}).to_string();
        assert!(parse_request(req.as_bytes())
            .unwrap_err()
            .contains("at most"));
    }
}
