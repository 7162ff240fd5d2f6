//! The guard's decisions on hand-made samples, psql output parsing, and the policy keys.

use super::*;
use crate::policy::FakeAccounts;

const MIB: u64 = 1 << 20;

fn config(text: &str) -> GuardConfig {
    let policy = format!(
        "[[tenant]]\nname = \"s\"\nmatch = [{{ comm = \"x\" }}]\n[tenant.replication]\n{text}\n"
    );
    match crate::policy::from_str("p.toml", &policy, &FakeAccounts) {
        Ok(l) => l.policy.tenants[0].replication.clone().unwrap(),
        Err(e) => panic!("{e}"),
    }
}

fn errors(text: &str) -> String {
    let policy = format!(
        "[[tenant]]\nname = \"s\"\nmatch = [{{ comm = \"x\" }}]\n[tenant.replication]\n{text}\n"
    );
    crate::policy::from_str("p.toml", &policy, &FakeAccounts)
        .unwrap_err()
        .to_string()
}

fn limits(bps: u64, iops: u64) -> IoLimits {
    IoLimits {
        write_bps: Some(bps),
        write_iops: Some(iops),
        ..IoLimits::default()
    }
}

fn sample(t0: Instant, secs: u64, lag_mib: u64) -> Sample {
    Sample {
        at: t0 + Duration::from_secs(secs),
        lag_bytes: lag_mib * MIB,
        lag_seconds: 0.0,
        standby: None,
        retained: None,
        slot_trouble: None,
    }
}

#[test]
fn keys_and_defaults() {
    let c = config("role = \"standby\"\nconninfo = \"host=/tmp port=5432\"");
    assert_eq!(c.role, Role::Standby);
    assert_eq!(c.lag_bytes, 64 * MIB);
    assert_eq!(c.hold, Duration::from_secs(10));
    assert_eq!(c.interval, Duration::from_secs(1));
    assert_eq!(c.action, Action::Warn);
    assert_eq!(c.user, None);
    assert_eq!(c.psql, "/usr/bin/psql");
    let c = config(
        "role = \"standby\"\nconninfo = \"port=5433\"\nuser = \"postgres\"\nlag_bytes = \"16MiB\"\nlag_seconds = 30\nfor = \"5s\"\naction = \"raise\"\nraise_to = \"200MiB\"\nraise_iops_to = 4000",
    );
    assert_eq!(c.lag_bytes, 16 * MIB);
    assert_eq!(c.lag_seconds, Some(30.0));
    assert_eq!(c.hold, Duration::from_secs(5));
    assert_eq!(c.raise_to, Some(200 * MIB));
    assert_eq!(c.raise_iops_to, Some(4000));
    assert_eq!(c.user.as_deref(), Some("postgres"));
}

#[test]
fn bad_keys_are_located() {
    let e = errors("role = \"leader\"\nconninfo = \"port=1\"");
    assert!(
        e.contains("p.toml:5:8") && e.contains("role `leader`"),
        "{e}"
    );
    let e = errors("role = \"standby\"\nconninfo = \"port=1\"\naction = \"raise\"");
    assert!(e.contains("needs a ceiling"), "{e}");
    let e = errors(
        "role = \"primary\"\nconninfo = \"port=1\"\naction = \"raise\"\nraise_to = \"1GiB\"",
    );
    assert!(
        e.contains("needs role = \\\"standby\\\"") || e.contains("needs role = \"standby\""),
        "{e}"
    );
    let e = errors("role = \"standby\"\nconninfo = \"port=1\"\nfor = \"soon\"");
    assert!(e.contains("p.toml:7:7") && e.contains("for `soon`"), "{e}");
    let e = errors("role = \"standby\"\nconninfo = \"port=1\"\npsql = \"psql\"");
    assert!(e.contains("absolute path"), "{e}");
    let e = errors("role = \"standby\"\nconninfo = \"port=1\"\nlag_bytes = \"lots\"");
    assert!(e.contains("lag_bytes"), "{e}");
}

/// Warn after `for` above the threshold, double the limits after each further `for` while the
/// lag grows (up to the ceiling), restore after `for` under half the threshold.
#[test]
fn raise_step_by_step_then_restore() {
    let c = config(
        "role = \"standby\"\nconninfo = \"port=1\"\nlag_bytes = \"64MiB\"\nfor = \"10s\"\naction = \"raise\"\nraise_to = \"20MiB\"\nraise_iops_to = 1000",
    );
    let base = limits(4 * MIB, 200);
    let t0 = Instant::now();
    let mut w = Watch::default();
    assert!(w.observe(&c, &base, &sample(t0, 0, 10)).is_empty());
    assert!(
        w.observe(&c, &base, &sample(t0, 1, 70)).is_empty(),
        "above, not yet for 10 s"
    );
    assert!(w.observe(&c, &base, &sample(t0, 5, 90)).is_empty());
    let d = w.observe(&c, &base, &sample(t0, 11, 120));
    assert_eq!(d.len(), 2, "{d:?}");
    assert!(
        matches!(&d[0], Decision::Warn(m) if m.contains("120MiB") || m.contains("120 MiB")),
        "{d:?}"
    );
    let Decision::Raise(to, msg) = &d[1] else {
        panic!("{d:?}")
    };
    assert_eq!(*to, limits(8 * MIB, 400));
    assert!(
        msg.contains("4MiB/s -> 8MiB/s") && msg.contains("200 -> 400"),
        "{msg}"
    );
    // Not again before another 10 s.
    assert!(w.observe(&c, &base, &sample(t0, 15, 150)).is_empty());
    let d = w.observe(&c, &base, &sample(t0, 21, 160));
    assert!(
        matches!(&d[..], [Decision::Raise(l, _)] if *l == limits(16 * MIB, 800)),
        "{d:?}"
    );
    // Lag no longer growing: no further raise.
    assert!(w.observe(&c, &base, &sample(t0, 31, 100)).is_empty());
    // Growing again: to the ceiling, not past it.
    let d = w.observe(&c, &base, &sample(t0, 41, 130));
    assert!(
        matches!(&d[..], [Decision::Raise(l, _)] if *l == limits(20 * MIB, 1000)),
        "{d:?}"
    );
    let d = w.observe(&c, &base, &sample(t0, 51, 200));
    assert!(d.is_empty(), "at the ceiling: {d:?}");
    // Between half and the threshold: nothing; under half for 10 s: restore and say so.
    assert!(w.observe(&c, &base, &sample(t0, 52, 40)).is_empty());
    assert!(w.observe(&c, &base, &sample(t0, 53, 20)).is_empty());
    assert!(w.observe(&c, &base, &sample(t0, 60, 10)).is_empty());
    let d = w.observe(&c, &base, &sample(t0, 63, 5));
    assert!(
        matches!(&d[0], Decision::Restore(m) if m.contains("4MiB/s")),
        "{d:?}"
    );
    assert!(
        matches!(&d[1], Decision::Warn(m) if m.contains("caught up")),
        "{d:?}"
    );
    assert_eq!(w.raised, None);
}

#[test]
fn warn_only_and_lag_seconds() {
    let c = config(
        "role = \"standby\"\nconninfo = \"port=1\"\nlag_bytes = \"1GiB\"\nlag_seconds = 30\nfor = \"2s\"",
    );
    let base = limits(4 * MIB, 200);
    let t0 = Instant::now();
    let mut w = Watch::default();
    let mut s = sample(t0, 0, 1);
    s.lag_seconds = 45.0;
    assert!(w.observe(&c, &base, &s).is_empty());
    s.at = t0 + Duration::from_secs(3);
    let d = w.observe(&c, &base, &s);
    assert!(
        matches!(&d[..], [Decision::Warn(m)] if m.contains("45.0 s behind")),
        "{d:?}"
    );
    s.at = t0 + Duration::from_secs(6);
    assert!(
        w.observe(&c, &base, &s).is_empty(),
        "one warning per episode"
    );
    assert_eq!(w.raised, None);
}

#[test]
fn primary_warns_before_retained_wal_is_outrun() {
    let c = config("role = \"primary\"\nconninfo = \"port=1\"\nlag_bytes = \"1GiB\"");
    let t0 = Instant::now();
    let out = "walreceiver|700000000|12.5|1073741824|\nother|1000|0.1|1073741824|\n";
    let s = parse(Role::Primary, t0, out).unwrap();
    assert_eq!(s.lag_bytes, 700_000_000);
    assert_eq!(s.standby.as_deref(), Some("walreceiver"));
    assert_eq!(s.retained, Some(1 << 30));
    let mut w = Watch::default();
    assert!(
        w.observe(&c, &IoLimits::default(), &s).is_empty(),
        "65% of what is kept"
    );
    let s = parse(Role::Primary, t0, "walreceiver|900000000|20|1073741824|\n").unwrap();
    let d = w.observe(&c, &IoLimits::default(), &s);
    assert!(
        matches!(&d[..], [Decision::Warn(m)] if m.contains("walreceiver") && m.contains("1GiB")),
        "{d:?}"
    );
    let s = parse(Role::Primary, t0, "r|10|0|-1|lost\n").unwrap();
    assert_eq!(s.slot_trouble.as_deref(), Some("r"));
    assert_eq!(s.retained, None);
}

#[test]
fn standby_output() {
    let t0 = Instant::now();
    let s = parse(Role::Standby, t0, "52428800|3.5\n").unwrap();
    assert_eq!((s.lag_bytes, s.lag_seconds), (50 * MIB, 3.5));
    // Caught up: the time since the last replayed transaction is not lag.
    let s = parse(Role::Standby, t0, "0|300\n").unwrap();
    assert_eq!((s.lag_bytes, s.lag_seconds), (0, 0.0));
    assert!(parse(Role::Standby, t0, "x|y\n").is_none());
}

#[test]
fn published_state_is_read_back_while_its_daemon_runs_and_removed_on_exit() {
    if !nix::unistd::Uid::effective().is_root() {
        return; // /run/dbcage is root's
    }
    let root = format!("dbcage-test-unit-repl-{}", std::process::id());
    let mut status = std::collections::BTreeMap::new();
    status.insert(
        "standby".to_string(),
        GuardStatus {
            lag_bytes: 48 << 20,
            lag_seconds: 2.5,
            behind: true,
            raised_write_bps: Some(64 << 20),
            raised_write_iops: None,
            actions: 3,
        },
    );
    publish(&root, &status);
    let got = read_published(&root);
    unpublish(&root);
    assert_eq!(got, Some(status));
    assert_eq!(read_published(&root), None);
    assert!(!published_path(&root).exists());
}

/// The daemon logs the conninfo it watches; a password in it must not reach the journal.
#[test]
fn passwords_are_redacted_for_the_log() {
    use super::redact_password as r;
    assert_eq!(
        r("host=/run/postgresql password=s3cret dbname=postgres"),
        "host=/run/postgresql password=*** dbname=postgres"
    );
    assert_eq!(
        r("password = 'a b\\'c' port=5432"),
        "password = *** port=5432"
    );
    assert_eq!(
        r("postgresql://rep:s3cret@db1:5432/postgres?sslmode=require"),
        "postgresql://rep:***@db1:5432/postgres?sslmode=require"
    );
    assert_eq!(
        r("postgres://db1/postgres?password=x&sslmode=require"),
        "postgres://db1/postgres?password=***&sslmode=require"
    );
    assert_eq!(
        r("host=/run/postgresql user=postgres"),
        "host=/run/postgresql user=postgres"
    );
}
