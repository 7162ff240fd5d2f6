//! The metrics endpoint as an exporter serves it: TLS and basic auth from a web configuration
//! file (exporter-toolkit's format), checked with curl and a certificate made by openssl for the
//! test; and the refusal to serve off loopback without one.

use std::process::Command;
use std::time::Duration;

use crate::common::*;

fn port() -> u16 {
    (21000 + std::process::id() % 20000) as u16
}

/// curl's HTTP status for a GET of `url` (0 when no HTTP answer came), and the body.
fn curl(args: &[&str], url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[test]
fn metrics_over_tls_with_basic_auth() {
    if skip() {
        return;
    }
    for tool in ["curl", "openssl"] {
        assert!(
            Command::new(tool).arg("--version").output().is_ok()
                || Command::new(tool).arg("version").output().is_ok(),
            "{tool} is missing (scripts/test.sh installs it)"
        );
    }
    let t = Tenancy::new(
        "web",
        &format!(
            "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"{}\" }}]\n[tenant.cpu]\ncores = 1\n",
            name_rule(&format!("ora_p001_{}", sid()))
        ),
    );
    let dir = t.dir();
    // A self-signed certificate for 127.0.0.1, made for this test.
    let ok = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=dbcage-test"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .output()
        .expect("openssl");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let hash = bcrypt::hash("s3cret", 10).unwrap();
    let web = dir.join("web.yml");
    // Relative file names are relative to the configuration's directory.
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  min_version: TLS12\nhttp_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\nbasic_auth_users:\n  prometheus: '{hash}'\n"
        ),
    )
    .unwrap();
    let addr = format!("127.0.0.1:{}", port());
    let web_arg = web.to_string_lossy().into_owned();
    let d = Daemon::start(&t, &["--metrics", &addr, "--web-config-file", &web_arg]);
    assert!(
        d.log().contains(&format!("https://{addr}/metrics")),
        "{}",
        d.log()
    );
    let url = format!("https://{addr}/metrics");
    let cacert = dir.join("cert.pem").to_string_lossy().into_owned();
    let tls = ["--cacert", cacert.as_str()];

    let (code, body) = curl(&[&tls[..], &["-u", "prometheus:s3cret"]].concat(), &url);
    assert_eq!(code, 200, "{body}\n{}", d.log());
    assert!(
        body.contains("dbcage_cpu_quota_cores{tenant=\"db\"} 1"),
        "{body}"
    );
    let findings = crate::observe::promtool_findings(&body);
    assert!(findings.is_empty(), "{findings}");
    // Headers from http_server_config, and the content type a scraper asks for.
    let out = Command::new("curl")
        .args(["-sS", "-D", "-", "-o", "/dev/null", "--cacert", &cacert])
        .args(["-u", "prometheus:s3cret", "-H"])
        .arg(format!("Accept: {}", crate::observe::PROMETHEUS_ACCEPT))
        .arg(&url)
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(head.contains("x-content-type-options: nosniff"), "{head}");
    assert!(
        head.contains("content-type: application/openmetrics-text"),
        "{head}"
    );

    // A wrong password, an unknown user, no credentials: 401 with a challenge, no metrics.
    for auth in [
        &["-u", "prometheus:wrong"][..],
        &["-u", "nobody:s3cret"],
        &[],
    ] {
        let (code, body) = curl(&[&tls[..], auth].concat(), &url);
        assert_eq!(code, 401, "{auth:?}: {body}");
        assert!(!body.contains("dbcage_"), "{body}");
    }
    // Plain HTTP on the TLS port: no HTTP answer at all.
    let (code, body) = curl(
        &["-u", "prometheus:s3cret"],
        &format!("http://{addr}/metrics"),
    );
    assert_eq!(code, 0, "plain HTTP was answered: {body}");
    assert!(crate::observe::scrape(&addr).is_none());
    // A client that does not trust the certificate gets nothing either.
    let (code, _) = curl(&["-u", "prometheus:s3cret"], &url);
    assert_eq!(code, 0);
    drop(d);

    // A broken web configuration: the daemon does not start, and says where.
    std::fs::write(&web, "basic_auth_users:\n  prometheus: plain-text\n").unwrap();
    let out = Command::new("timeout")
        .args(["10", DBCAGE, "-c"])
        .arg(&t.policy)
        .args(["run", "--metrics", &addr, "--web-config-file", &web_arg])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("web.yml") && err.contains("not a bcrypt hash"),
        "{err}"
    );
}

#[test]
fn metrics_off_loopback_need_a_web_config_or_an_explicit_flag() {
    if skip() {
        return;
    }
    let t = Tenancy::new(
        "wildcard",
        &format!(
            "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"{}\" }}]\n",
            name_rule(&format!("ora_p001_{}", sid()))
        ),
    );
    let addr = format!("0.0.0.0:{}", port() + 1);
    // `timeout`: a daemon that wrongly starts is stopped rather than hanging the test.
    let out = Command::new("timeout")
        .args(["10", DBCAGE, "-c"])
        .arg(&t.policy)
        .args(["run", "--metrics", &addr])
        .env_remove("DBCAGE_WEB_CONFIG_FILE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("without TLS or authentication") && err.contains("--metrics-insecure"),
        "{err}"
    );
    // Nothing was applied: the daemon refused before touching the kernel.
    assert!(!t.tenant_dir("cpu", "db").exists());
    // Told so explicitly, it serves there.
    let d = Daemon::start(&t, &["--metrics", &addr, "--metrics-insecure"]);
    let local = format!("127.0.0.1:{}", port() + 1);
    assert!(
        wait_until(Duration::from_secs(5), || crate::observe::scrape(&local)
            .is_some()),
        "{}",
        d.log()
    );
}
