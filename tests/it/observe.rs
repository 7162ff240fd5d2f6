//! What a DBA reads: `status` against fio's own count, the Prometheus endpoint parsed by the
//! reference parser, and the `top` view driven in tmux.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;

fn fio_available() -> bool {
    Command::new("fio")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Sum of a tenant's per-device read bytes in `status --json --interval 0`.
fn tenant_read_bytes(t: &Tenancy, tenant: &str) -> u64 {
    let s = t.json(&["status", "--json", "--interval", "0", tenant]);
    s["tenants"][0]["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| d["read_bytes"].as_u64().unwrap_or(0))
        .sum()
}

#[test]
fn status_bytes_agree_with_fio() {
    if skip() || (!fio_available() && cannot_run("needs fio (scripts/test.sh installs it)")) {
        return;
    }
    let _m = measure_lock();
    let disk = LoopDisk::new(320);
    let file = disk.fill("dbcage-test-fio.dat", 192);
    let t = Tenancy::new(
        "fio",
        &format!(
            "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"{}\" }}]\nstorage = [\"{}\"]\n",
            name_rule(&format!("ora_p001_{}", sid())),
            disk.mount_str()
        ),
    );
    t.ok(&["apply"]);
    let before = tenant_read_bytes(&t, "db");
    // fio inside the tenant from its first instant (`dbcage exec`), so every byte it reads is
    // charged to the tenant.
    let out = Command::new(DBCAGE)
        .args(["-c", &t.policy.to_string_lossy(), "exec", "db", "--"])
        .args([
            "fio",
            "--name=dbcage-test",
            &format!("--filename={file}"),
            "--rw=read",
            "--bs=64k",
            "--direct=1",
            "--ioengine=psync",
            "--size=192M",
            "--output-format=json",
        ])
        .output()
        .expect("fio");
    assert!(
        out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fio: serde_json::Value = serde_json::from_slice(&out.stdout).expect("fio json");
    let fio_bytes = fio["jobs"][0]["read"]["io_bytes"]
        .as_u64()
        .expect("io_bytes");
    let after = tenant_read_bytes(&t, "db");
    let seen = after - before;
    let ratio = seen as f64 / fio_bytes as f64;
    println!("status counted {seen} bytes, fio read {fio_bytes} bytes: ratio {ratio:.4}");
    assert_near("status bytes / fio bytes", ratio, 1.0, 0.02, 0.02);
}

/// What Prometheus 2.x sends as its Accept header.
pub(crate) const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// GET http://addr/metrics over a plain TCP connection, as Prometheus asks (OpenMetrics).
pub(crate) fn scrape(addr: &str) -> Option<String> {
    scrape_as(addr, Some(PROMETHEUS_ACCEPT)).map(|(_, body)| body)
}

/// GET http://addr/metrics with this Accept header (none: `None`): the Content-Type and body of
/// a 200 answer.
pub(crate) fn scrape_as(addr: &str, accept: Option<&str>) -> Option<(String, String)> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let accept = accept
        .map(|a| format!("Accept: {a}\r\n"))
        .unwrap_or_default();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n{accept}\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status_line = head.lines().next()?;
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    status_line
        .split_whitespace()
        .nth(1)
        .is_some_and(|c| c == "200")
        .then(|| (content_type, body.to_string()))
}

/// Runs `promtool check metrics` on exposition text: its findings (empty when clean).
pub(crate) fn promtool_findings(text: &str) -> String {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; scripts/test.sh installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.success(),
        findings.trim().is_empty(),
        "promtool's status and output disagree: {findings}"
    );
    findings
}

/// Parses exposition text with the Python prometheus_client OpenMetrics parser and returns
/// `{family: [[labels, value], ...]}`.
pub(crate) fn parse_with_prometheus_client(text: &str) -> serde_json::Value {
    let script = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    out[fam.name] = {"type": fam.type, "samples": [[s.name, s.labels, s.value] for s in fam.samples]}
print(json.dumps(out))
"#;
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the reference parser rejected the exposition:\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn metrics_endpoint_parses_with_the_reference_parser() {
    if skip() {
        return;
    }
    if Command::new("/usr/bin/python3")
        .args(["-c", "import prometheus_client"])
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        panic!("python3-prometheus-client is missing (scripts/test.sh installs it)");
    }
    let disk = LoopDisk::new(128);
    let name = format!("ora_p001_{}", sid());
    let t = Tenancy::new(
        "metrics",
        &format!(
            "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"{}\" }}]\nstorage = [\"{}\"]\n[tenant.io]\nread_bps = \"8MiB\"\nwrite_iops = 100\n[tenant.cpu]\ncores = 1.5\n[tenant.memory]\nmax = \"256MiB\"\n",
            name_rule(&name),
            disk.mount_str()
        ),
    );
    let addr = format!("127.0.0.1:{}", 20000 + std::process::id() % 20000);
    let mut d = Daemon::start(&t, &["--metrics", &addr, "--rescan-interval", "1s"]);
    let _sleeper = Child::named(&name, "sleep", &["30"]);
    assert!(wait_until(Duration::from_secs(5), || procs_in(
        &t.leaf_dir("cpu", "db", "limited")
    )
    .len()
        == 1));
    // The daemon loads the IO latency program after it is ready: the reads below must come after.
    assert!(
        wait_until(Duration::from_secs(20), || d
            .log()
            .contains("IO latency histograms on")),
        "the IO latency program did not load; daemon log:\n{}",
        d.log()
    );
    // A scrape before the reads walks the tenants' groups for the histograms' owners; the
    // scrape after them keeps that walk (the tenant's leaf was there; unless other IO on the host
    // brought a cgroup it did not know) and must still name the tenant's histograms.
    scrape(&addr).unwrap_or_else(|| panic!("no answer at {addr}; daemon log:\n{}", d.log()));
    // 64 direct reads in the tenant, for the IO latency histogram.
    let dd = Command::new(DBCAGE)
        .arg("-c")
        .arg(&t.policy)
        .args([
            "exec",
            "db",
            "--",
            "dd",
            "bs=4k",
            "count=64",
            "iflag=direct",
            "of=/dev/null",
        ])
        .arg(format!("if={}", disk.dev()))
        .output()
        .expect("dd");
    assert!(dd.status.success(), "dd: {dd:?}");
    let start = std::time::Instant::now();
    let text =
        scrape(&addr).unwrap_or_else(|| panic!("no answer at {addr}; daemon log:\n{}", d.log()));
    println!("scrape took {:?}", start.elapsed());
    let fams = parse_with_prometheus_client(&text);
    let value = |fam: &str, pred: &dyn Fn(&serde_json::Value) -> bool| -> f64 {
        fams[fam]["samples"]
            .as_array()
            .unwrap_or_else(|| panic!("no family {fam} in:\n{text}"))
            .iter()
            .find(|s| pred(&s[1]))
            .unwrap_or_else(|| panic!("no matching sample of {fam}:\n{text}"))[2]
            .as_f64()
            .unwrap()
    };
    let db = |l: &serde_json::Value| l["tenant"] == "db";
    assert_eq!(fams["dbcage_io_bytes"]["type"], "counter");
    assert_eq!(value("dbcage_processes", &db), 1.0);
    assert_eq!(
        value("dbcage_io_limit_bytes_per_second", &|l| db(l)
            && l["direction"] == "read"
            && l["device"] == disk.devnum().as_str()),
        (8 << 20) as f64
    );
    assert_eq!(
        value("dbcage_io_limit_operations_per_second", &|l| db(l)
            && l["direction"] == "write"),
        100.0
    );
    assert_eq!(value("dbcage_cpu_quota_cores", &db), 1.5);
    // The kernel-side latency histogram of those reads (eBPF; this host's kernel has BTF).
    assert_eq!(
        fams["dbcage_io_latency_seconds"]["type"], "histogram",
        "{text}"
    );
    let on_disk = |l: &serde_json::Value| {
        db(l)
            && l["op"] == "read"
            && l["device"] == disk.devnum().as_str()
            && l["name"] == disk.name().as_str()
    };
    let sample = |name: &str, pred: &dyn Fn(&serde_json::Value) -> bool| -> f64 {
        fams["dbcage_io_latency_seconds"]["samples"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s[0] == name && pred(&s[1]))
            .unwrap_or_else(|| panic!("no matching {name}:\n{text}"))[2]
            .as_f64()
            .unwrap()
    };
    assert_eq!(sample("dbcage_io_latency_seconds_count", &on_disk), 64.0);
    assert_eq!(
        sample("dbcage_io_latency_seconds_bucket", &|l| on_disk(l)
            && l["le"] == "+Inf"),
        64.0
    );
    // Nothing left unrecorded with one tenant on one disk; each reason is its own series.
    for reason in ["full", "raced"] {
        assert_eq!(
            value("dbcage_io_latency_uncounted", &|l| l["reason"] == reason),
            0.0,
            "{text}"
        );
    }
    assert_eq!(value("dbcage_memory_limit_bytes", &db), (256 << 20) as f64);
    assert!(
        value("dbcage_events", &|_| true) >= 1.0,
        "the daemon handled the sleeper's exec"
    );
    assert!(value("dbcage_moves", &|_| true) >= 1.0);
    assert!(value("dbcage_last_scan_timestamp_seconds", &|_| true) > 1.6e9);
    for fam in [
        "dbcage_io_bytes",
        "dbcage_io_operations",
        "dbcage_cpu_usage_seconds",
        "dbcage_cpu_throttled_seconds",
        "dbcage_memory_usage_bytes",
        "dbcage_memory_oom_kills",
        "dbcage_events_lost",
        "dbcage_rescans",
        "dbcage_rescan_processes_read",
        "dbcage_rescan_processes_kept",
    ] {
        assert!(fams.get(fam).is_some(), "family {fam} missing:\n{text}");
    }

    // Without an Accept header: the Prometheus text format, clean for promtool.
    let (ctype, om_text) = scrape_as(&addr, Some(PROMETHEUS_ACCEPT)).unwrap();
    assert!(
        ctype.starts_with("application/openmetrics-text; version=1.0.0"),
        "{ctype}"
    );
    assert!(om_text.ends_with("# EOF\n"));
    assert!(!om_text.contains("{}"), "an empty label set:\n{om_text}");
    let text004 = || {
        let (ctype, text) = scrape_as(&addr, None).expect("a text-format scrape");
        assert_eq!(ctype, "text/plain; version=0.0.4; charset=utf-8");
        text
    };
    let plain = text004();
    let findings = promtool_findings(&plain);
    assert!(
        findings.is_empty(),
        "promtool check metrics:\n{findings}\n{plain}"
    );
    assert!(
        !plain.contains("{}"),
        "a series with an empty label set:\n{plain}"
    );
    assert!(!plain.contains("# EOF"));
    let line = |text: &str, series: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    };
    let build = format!(
        "dbcage_build_info{{version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(line(&plain, &build), Some(1.0), "{plain}");
    assert_eq!(line(&plain, "dbcage_events_connected"), Some(1.0));
    assert_eq!(line(&plain, "dbcage_policy_stale"), Some(0.0), "{plain}");
    assert_eq!(
        line(&plain, "dbcage_policy_last_reload_successful"),
        Some(1.0)
    );
    let hash_of = |text: &str| -> String {
        let l = text
            .lines()
            .find(|l| l.starts_with("dbcage_policy_info{hash=\""))
            .unwrap_or_else(|| panic!("no dbcage_policy_info:\n{text}"));
        l["dbcage_policy_info{hash=\"".len()..][..16].to_string()
    };
    let hash = hash_of(&plain);
    // The same files read from another directory give the same hash: hosts that run the same
    // policy agree.
    let copy = tempfile::Builder::new()
        .prefix("dbcage-test-hash-")
        .tempdir()
        .unwrap();
    std::fs::copy(&t.policy, copy.path().join("dbcage.toml")).unwrap();
    let sources = dbcage::policy::read_sources(
        &copy.path().join("dbcage.toml"),
        dbcage::policy::FileTrust::RootOnly,
    )
    .unwrap();
    assert_eq!(dbcage::metrics::policy_hash(&sources), hash);

    // A runtime override shows as a series.
    t.ok(&["set", "db", "cpu.cores=1"]);
    let over = "dbcage_override_info{tenant=\"db\",key=\"cpu.cores\",source=\"runtime\"}";
    assert_eq!(line(&text004(), over), Some(1.0), "{}", text004());

    // Every series the mixin's dashboards, recording rules and alerts query exists in a real
    // scrape, and every expression parses.
    let served: std::collections::BTreeSet<String> = text004()
        .lines()
        .chain(om_text.lines())
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect();
    check_mixin_queries(&served);

    // A limit changed behind the daemon's back is corrected by the next rescan, and counted.
    let corrections = line(&plain, "dbcage_kernel_corrections_total").expect("corrections");
    let quota_file = t.tenant_dir("cpu", "db").join("cpu.cfs_quota_us");
    std::fs::write(&quota_file, "300000").unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || line(
            &text004(),
            "dbcage_kernel_corrections_total"
        )
        .is_some_and(|c| c > corrections)),
        "no correction counted:\n{}",
        d.log()
    );
    assert_eq!(
        std::fs::read_to_string(&quota_file).unwrap().trim(),
        "100000"
    );

    // Files edited and not reloaded: stale, the same hash in force; reloaded: a new hash.
    let body = std::fs::read_to_string(&t.policy).unwrap();
    std::fs::write(&t.policy, format!("{body}\n# edited\n")).unwrap();
    let edited = text004();
    assert_eq!(line(&edited, "dbcage_policy_stale"), Some(1.0));
    assert_eq!(hash_of(&edited), hash);
    t.ok(&["reload"]);
    let reloaded = text004();
    assert_eq!(line(&reloaded, "dbcage_policy_stale"), Some(0.0));
    assert_ne!(hash_of(&reloaded), hash);
    assert_eq!(line(&reloaded, over), None, "reload ends runtime overrides");
    // A refused reload: the old policy stays in force, and both gauges say so.
    std::fs::write(&t.policy, format!("{body}\n[[tenant]]\nname = \"\"\n")).unwrap();
    assert!(!t.run(&["reload"]).status.success());
    let refused = text004();
    assert_eq!(
        line(&refused, "dbcage_policy_last_reload_successful"),
        Some(0.0)
    );
    assert_eq!(line(&refused, "dbcage_policy_stale"), Some(1.0));
    assert_eq!(line(&refused, "dbcage_reload_failures_total"), Some(1.0));
    assert!(promtool_findings(&refused).is_empty());
    d.stop(Duration::from_secs(5));
}

/// Series the mixin queries that a scrape of this host's test tenancy cannot show, and why.
const NOT_IN_THIS_SCRAPE: [(&str, &str); 2] = [
    (
        "dbcage_pressure_",
        "PSI is kept per cgroup on v2 only; this host's tenants are on v1",
    ),
    (
        "dbcage_io_share_ratio",
        "only with io.split = \"demand\", after the balancer's first round",
    ),
];

/// Series the replication guard exports (checked in pg_repl's scrape, which runs a guard).
const REPLICATION_SERIES: [&str; 4] = [
    "dbcage_replication_lag_bytes",
    "dbcage_replication_lag_seconds",
    "dbcage_replication_behind",
    "dbcage_replication_raised",
];

/// The mixin's dashboards and rules: every `dbcage_*` series they query is in `served` (or
/// declared above), every recorded series they read is recorded by rules.yml, and every
/// expression parses (`promtool check rules` over them, variables replaced).
fn check_mixin_queries(served: &std::collections::BTreeSet<String>) {
    let mixin = concat!(env!("CARGO_MANIFEST_DIR"), "/dist/mixin");
    let read = |f: &str| std::fs::read_to_string(format!("{mixin}/{f}")).unwrap();
    let rules = read("rules.yml");
    let recorded: Vec<String> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record: "))
        .map(|r| r.trim().to_string())
        .collect();
    let mut exprs: Vec<String> = Vec::new();
    for d in [
        "dashboards/dbcage-fleet.json",
        "dashboards/dbcage-tenant.json",
    ] {
        let json: serde_json::Value = serde_json::from_str(&read(d)).unwrap();
        let panels = json["panels"].as_array().unwrap();
        assert!(panels.len() > 5, "{d}");
        for p in panels {
            for t in p["targets"].as_array().into_iter().flatten() {
                exprs.push(t["expr"].as_str().unwrap().to_string());
            }
        }
        let vars: Vec<&str> = json["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert!(
            vars.contains(&"job") && vars.contains(&"instance"),
            "{d}: {vars:?}"
        );
    }
    let n_dashboard = exprs.len();
    // Every alert links to its own section of the runbook.
    let runbook = read("runbook.md");
    let alerts = read("alerts.yml");
    let names: Vec<&str> = alerts
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    let links: Vec<&str> = alerts
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url: "))
        .collect();
    assert_eq!(names.len(), links.len(), "an alert without a runbook_url");
    for (name, link) in names.iter().zip(&links) {
        assert!(
            link.ends_with(&format!("runbook.md#{}", name.to_lowercase())),
            "{name}: {link}"
        );
        assert!(
            runbook.lines().any(|l| l == format!("## {name}")),
            "runbook.md has no section for {name}"
        );
    }
    for f in ["rules.yml", "alerts.yml"] {
        let text = read(f);
        let mut lines = text.lines().peekable();
        while let Some(l) = lines.next() {
            let Some(e) = l.trim().strip_prefix("expr:") else {
                continue;
            };
            let mut expr = e.trim().trim_start_matches('|').to_string();
            while lines
                .peek()
                .is_some_and(|n| n.starts_with("          ") && !n.trim().contains(": "))
            {
                expr.push(' ');
                expr.push_str(lines.next().unwrap().trim());
            }
            exprs.push(expr);
        }
    }
    let mut queried = std::collections::BTreeSet::new();
    for e in &exprs {
        let mut chars = e.char_indices().peekable();
        let mut prev: Option<char> = None;
        while let Some((i, c)) = chars.next() {
            let starts = (c.is_ascii_alphabetic() || c == '_' || c == ':')
                && !prev
                    .is_some_and(|p| p.is_ascii_alphanumeric() || p == '_' || p == ':' || p == '$');
            prev = Some(c);
            if !starts {
                continue;
            }
            let mut end = i + c.len_utf8();
            while let Some(&(j, d)) = chars.peek() {
                if d.is_ascii_alphanumeric() || d == '_' || d == ':' {
                    end = j + d.len_utf8();
                    prev = Some(d);
                    chars.next();
                } else {
                    break;
                }
            }
            let name = &e[i..end];
            if name.contains(':') && name.contains("dbcage_") {
                assert!(
                    recorded.iter().any(|r| r == name),
                    "{name} is queried but rules.yml does not record it"
                );
            } else if name.starts_with("dbcage_") {
                queried.insert(name.to_string());
            }
        }
    }
    for name in &queried {
        if served.contains(name) || REPLICATION_SERIES.contains(&name.as_str()) {
            continue;
        }
        let declared = NOT_IN_THIS_SCRAPE
            .iter()
            .find(|(prefix, _)| name.starts_with(prefix));
        match declared {
            Some((_, why)) => println!("{name}: not in this scrape ({why})"),
            None => panic!("the mixin queries {name}, which the endpoint does not serve"),
        }
    }
    println!(
        "mixin: {} expressions ({n_dashboard} in dashboards), {} dbcage series, all served or declared",
        exprs.len(),
        queried.len()
    );
    // promtool parses every expression (as recording rules; Grafana's variables replaced).
    let mut parse = String::from("groups:\n  - name: dbcage-test-parse\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let e = e
            .replace("$__rate_interval", "5m")
            .replace("$job", "dbcage")
            .replace("$instance", "a")
            .replace("$tenant", "t");
        parse.push_str(&format!(
            "      - record: dbcage_test_parse_{i}\n        expr: '{}'\n",
            e.replace('\'', "''")
        ));
    }
    let dir = tempfile::Builder::new()
        .prefix("dbcage-test-mixin-")
        .tempdir()
        .unwrap();
    let file = dir.path().join("exprs.yml");
    std::fs::write(&file, parse).unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool");
    assert!(
        out.status.success(),
        "a mixin expression does not parse:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().expect("tmux");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct TmuxSession(String);
impl Drop for TmuxSession {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output();
    }
}

#[test]
fn top_marks_sorts_quits_and_restores_the_terminal() {
    if skip()
        || (Command::new("tmux").arg("-V").output().is_err()
            && cannot_run("needs tmux (scripts/test.sh installs it)"))
    {
        return;
    }
    let _m = measure_lock();
    let tag = sid();
    let busy = format!("ora_p001_{tag}");
    let idle = format!("ora_p002_{tag}");
    let reader = format!("ora_p003_{tag}");
    let disk = LoopDisk::new(128);
    let t = Tenancy::new(
        "top",
        &format!(
            "[[tenant]]\nname = \"busy\"\nmatch = [{{ cmdline = \"{}\" }}]\n[tenant.cpu]\ncores = 0.3\n\n[[tenant]]\nname = \"idle\"\nmatch = [{{ cmdline = \"{}\" }}]\n\n[[tenant]]\nname = \"io\"\nmatch = [{{ cmdline = \"{}\" }}]\nstorage = [\"{}\"]\n",
            name_rule(&busy),
            name_rule(&idle),
            name_rule(&reader),
            disk.mount_str()
        ),
    );
    let _spin = Child::named(&busy, "sh", &["-c", "while :; do :; done"]);
    let _sleep = Child::named(&idle, "sleep", &["60"]);
    // Direct reads for a minute: latency for `l` to show.
    let file = disk.fill("dbcage-test-read.dat", 64);
    let marker = t.marker("io", "limited");
    let _reader = Child::ioload(
        &reader,
        &["--marker", &marker, "--duration", "60", "read", &file],
    );
    t.ok(&["apply"]);
    let session = TmuxSession(format!("dbcage-test-top-{}", std::process::id()));
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session.0,
        "-x",
        "80",
        "-y",
        "20",
        "bash",
        "--norc",
    ]);
    let cmd = format!("{DBCAGE} -c {} top", t.policy.display());
    tmux(&["send-keys", "-t", &session.0, &cmd, "Enter"]);
    let screen = || tmux(&["capture-pane", "-p", "-t", &session.0]);
    let row_of = |s: &str, name: &str| {
        s.lines()
            .position(|l| l.trim_start_matches('*').starts_with(name))
    };
    // The busy tenant sits at its 0.3-core quota: marked.
    assert!(
        wait_until(Duration::from_secs(8), || screen()
            .lines()
            .any(|l| l.starts_with("*busy"))),
        "busy tenant not marked at its limit:\n{}",
        screen()
    );
    let s = screen();
    assert!(s.contains("q quit"), "keys not shown:\n{s}");
    assert!(s.lines().all(|l| l.chars().count() <= 80));
    // Sort by CPU (column 6): busy first; reversed: busy last.
    tmux(&["send-keys", "-t", &session.0, "6"]);
    assert!(wait_until(Duration::from_secs(3), || {
        let s = screen();
        matches!((row_of(&s, "busy"), row_of(&s, "idle")), (Some(b), Some(i)) if b < i)
    }));
    tmux(&["send-keys", "-t", &session.0, "r"]);
    assert!(
        wait_until(Duration::from_secs(3), || {
            let s = screen();
            matches!((row_of(&s, "busy"), row_of(&s, "idle")), (Some(b), Some(i)) if b > i)
        }),
        "reverse sort did not reorder:\n{}",
        screen()
    );
    // `l`: the IOPS columns show each tenant's IO latency (eBPF) instead: the reader's p50
    // and p99 in ms, the others' `-`.
    tmux(&["send-keys", "-t", &session.0, "l"]);
    let io_latency = |s: &str| {
        let cols: Vec<&str> = s
            .lines()
            .find(|l| l.trim_start_matches('*').starts_with("io "))?
            .split_whitespace()
            .collect();
        Some((
            cols.get(4)?.parse::<f64>().ok()?,
            cols.get(5)?.parse::<f64>().ok()?,
        ))
    };
    assert!(
        wait_until(Duration::from_secs(10), || {
            let s = screen();
            s.contains("IO p50 ms")
                && io_latency(&s).is_some_and(|(p50, p99)| p50 > 0.0 && p50 <= p99)
        }),
        "no IO latency for the reading tenant:\n{}",
        screen()
    );
    assert!(screen().lines().all(|l| l.chars().count() <= 80));
    tmux(&["send-keys", "-t", &session.0, "q"]);
    // Back at the shell: the alternate screen is off and the prompt is usable.
    assert!(
        wait_until(Duration::from_secs(3), || tmux(&[
            "display-message",
            "-p",
            "-t",
            &session.0,
            "#{alternate_on}"
        ])
        .trim()
            == "0"),
        "the terminal was not restored:\n{}",
        screen()
    );
    tmux(&[
        "send-keys",
        "-t",
        &session.0,
        "echo dbcage-test-$((40+2))",
        "Enter",
    ]);
    assert!(
        wait_until(Duration::from_secs(3), || screen()
            .contains("dbcage-test-42")),
        "shell not usable after top:\n{}",
        screen()
    );
}

/// `[agent] io_latency = false` (issue 25): the daemon loads no eBPF program, says so once, and
/// serves everything but the latency series.
#[test]
fn io_latency_off_loads_no_program() {
    if skip() {
        return;
    }
    let disk = LoopDisk::new(64);
    let body = format!(
        "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"^dbcage-test-never\" }}]\nstorage = [\"{}\"]\n",
        disk.mount_str()
    );
    let t = Tenancy::new("iolat-off", &body);
    let text = t
        .policy_text(&body)
        .replacen("\n\n", "\nio_latency = false\n\n", 1);
    std::fs::write(&t.policy, text).unwrap();
    let addr = format!("127.0.0.1:{}", 20000 + (std::process::id() + 7) % 20000);
    let d = Daemon::start(&t, &["--metrics", &addr]);
    let text =
        scrape(&addr).unwrap_or_else(|| panic!("no answer at {addr}; daemon log:\n{}", d.log()));
    let log = d.log();
    assert!(
        log.contains("IO latency histograms off (agent.io_latency = false)")
            && !log.contains("IO latency histograms on"),
        "{log}"
    );
    assert!(text.contains("dbcage_processes"), "{text}");
    assert!(!text.contains("dbcage_io_latency"), "{text}");
}

/// Without CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN (issue 25): the daemon says once why it has no
/// IO latency histograms and goes on placing processes and serving every other metric;
/// `dbcage iolat` refuses with the same reason.
#[test]
fn io_latency_without_bpf_capabilities_goes_on() {
    if skip() {
        return;
    }
    let name = format!("ora_p001_{}", sid());
    let body = format!(
        "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"{}\" }}]\n[tenant.cpu]\nweight = 50\n",
        name_rule(&name)
    );
    let t = Tenancy::new("iolat-nocap", &body);
    let setpriv = setpriv_without("-bpf,-perfmon,-sys_admin");
    let setpriv: Vec<&str> = setpriv.iter().map(String::as_str).collect();
    let addr = format!("127.0.0.1:{}", 20000 + (std::process::id() + 11) % 20000);
    let d = Daemon::start_wrapped(&t, &setpriv, &["--metrics", &addr]);
    let eff = cap_eff(d.pid);
    // CAP_SYS_ADMIN 21, CAP_PERFMON 38, CAP_BPF 39.
    assert_eq!(eff & (1 << 21 | 1 << 38 | 1 << 39), 0, "CapEff {eff:#x}");

    let why = "running without IO latency histograms: this process lacks";
    assert!(
        wait_until(Duration::from_secs(20), || d.log().contains(why)),
        "no word on the missing capabilities; daemon log:\n{}",
        d.log()
    );
    let _sleeper = Child::named(&name, "sleep", &["30"]);
    assert!(
        wait_until(Duration::from_secs(5), || procs_in(
            &t.leaf_dir("cpu", "db", "limited")
        )
        .len()
            == 1),
        "the daemon without eBPF did not place {name}; daemon log:\n{}",
        d.log()
    );
    for _ in 0..2 {
        let text = scrape(&addr)
            .unwrap_or_else(|| panic!("no answer at {addr}; daemon log:\n{}", d.log()));
        assert!(
            text.lines().any(|l| l.starts_with("dbcage_processes{")
                && l.contains("tenant=\"db\"")
                && l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
                    == Some(1.0)),
            "{text}"
        );
        assert!(!text.contains("dbcage_io_latency_seconds_bucket"), "{text}");
    }
    let log = d.log();
    assert_eq!(log.matches(why).count(), 1, "said more than once:\n{log}");
    assert!(
        log.contains("CAP_BPF") && log.contains("CAP_PERFMON"),
        "{log}"
    );

    let out = Command::new(setpriv[0])
        .args(&setpriv[1..])
        .arg(DBCAGE)
        .arg("-c")
        .arg(&t.policy)
        .args(["iolat", "--duration", "1s"])
        .output()
        .expect("run setpriv (util-linux)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("lacks") && err.contains("CAP_BPF"),
        "dbcage iolat without CAP_BPF: {:?}\n{err}",
        out.status
    );
}
