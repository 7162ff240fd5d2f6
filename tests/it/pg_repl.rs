//! Replication under IO limits (seed 001): a primary and a streaming standby (pg_basebackup),
//! each on its own loop disk; the standby governed by dbcage through the postgres preset with a
//! low `write_bps`, the primary loaded with bulk inserts. With `wal = "limited"` the WAL receiver
//! and the startup process share the standby's limit and the lag grows without bound; with
//! `wal = "exempt"` it stays bounded. Each test prints the lag series (bytes behind the
//! primary's current WAL position, from pg_stat_replication, once a second).

use std::time::{Duration, Instant};

use crate::common::*;
use crate::pg::*;
use crate::pg_bench::Pgbench;

fn phase_secs() -> u64 {
    std::env::var("DBCAGE_PG_REPL_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12)
}

/// One sample: seconds since the load started, bytes the standby has flushed and replayed
/// behind the primary's current WAL position.
#[derive(Debug, Clone, Copy)]
pub struct Lag {
    pub at: f64,
    pub flush: i64,
    pub replay: i64,
}

pub const PRIMARY_CONF: &[&str] = &[
    "shared_buffers = 16MB",
    "max_wal_size = 256MB",
    "wal_keep_size = 1024MB",
    "synchronous_commit = off",
];

/// A primary, started, and its standby made by pg_basebackup (`-R`: it streams from the
/// primary's socket), started and streaming.
pub fn primary_and_standby(user: &nix::unistd::User, disk_mib: u64) -> (PgCluster, PgCluster) {
    let p = PgCluster::init(user, "p", disk_mib, PRIMARY_CONF);
    p.start();
    let s = PgCluster::on_disk(user, "s", LoopDisk::new(disk_mib));
    let t0 = Instant::now();
    p.run_ok(
        "pg_basebackup",
        &["-D", &s.data_str(), "-R", "-X", "stream", "-c", "fast"],
    );
    s.configure(&["shared_buffers = 16MB", "hot_standby = on"]);
    s.start();
    let streaming = wait_until(Duration::from_secs(20), || {
        p.sql("select count(*) from pg_stat_replication where state = 'streaming'") == "1"
    });
    assert!(
        streaming,
        "the standby does not stream; its log:\n{}",
        s.server_log()
    );
    println!(
        "standby {} streaming from {} ({:.1} s)",
        s.name,
        p.name,
        t0.elapsed().as_secs_f64()
    );
    (p, s)
}

/// Flush and replay lag in bytes, read on the primary.
pub fn lag_now(p: &PgCluster) -> Option<(i64, i64)> {
    let out = p.sql(
        "select pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint, \
         pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint from pg_stat_replication",
    );
    let mut f = out.split('|');
    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
}

fn mib(b: i64) -> f64 {
    b as f64 / (1 << 20) as f64
}

pub fn series_text(v: &[Lag]) -> String {
    v.iter()
        .map(|l| format!("{:.0}s {:.0}/{:.0}", l.at, mib(l.flush), mib(l.replay)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The bulk-insert load (~5 MB of rows per transaction, `-R` transactions a second) on the
/// primary for `secs`, sampling the lag every second.
pub fn load_and_watch(p: &PgCluster, secs: u64, rate: &str) -> Vec<Lag> {
    if p.sql("select to_regclass('batch') is null") == "t" {
        p.sql("create table batch (id int, v text)");
    }
    let script = p.disk.mount.join("dbcage-test-pg/batch.sql");
    std::fs::write(&script, crate::pg_bench::BATCH).unwrap();
    let script = script.to_string_lossy().into_owned();
    let dur = secs.to_string();
    let load = Pgbench::start(
        p,
        "dbcage-test-pgbench-p",
        &["-c", "1", "-R", rate, "-T", &dur, "-n", "-f", &script],
    );
    let t0 = Instant::now();
    let mut out = Vec::new();
    for i in 1..=secs {
        let next = t0 + Duration::from_secs(i);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        if let Some((flush, replay)) = lag_now(p) {
            out.push(Lag {
                at: t0.elapsed().as_secs_f64(),
                flush,
                replay,
            });
        }
    }
    let b = load.finish(p, Duration::from_secs(120));
    println!("  primary load: {:.2} tps of ~5 MB bulk inserts", b.tps);
    out
}

fn standby_policy(s: &PgCluster, wal: &str, extra: &str) -> String {
    format!(
        "[[tenant]]\nname = \"s\"\npreset = \"postgres\"\ndata_dir = \"{}\"\nwal = \"{wal}\"\n\
         [tenant.io]\nwrite_bps = \"4MiB\"\nwrite_iops = 200\n{extra}\n",
        s.data.display()
    )
}

/// The same standby, limited, with its WAL processes first limited, then exempt: the lag grows
/// without bound, then stays bounded.
#[test]
fn pg_replication_lag_limited_vs_exempt() {
    if skip() {
        return;
    }
    let Some(user) = pg_user() else { return };
    let _m = measure_lock();
    let secs = phase_secs();
    let t = Tenancy::new("pgrepl", "");
    let (p, s) = primary_and_standby(&user, 3072);

    t.set_policy(&standby_policy(&s, "limited", ""));
    let mut d = Daemon::start(&t, &[]);
    println!(
        "wal = \"limited\", standby write_bps 4MiB, write_iops 200 (lag MiB flushed/replayed):"
    );
    let limited = load_and_watch(&p, secs, "4");
    println!("  {}", series_text(&limited));

    // Let the standby catch up (its limit lifted), then the same with the WAL processes exempt.
    t.set_policy(
        &standby_policy(&s, "exempt", "").replace("write_bps = \"4MiB\"\nwrite_iops = 200\n", ""),
    );
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let caught_up = wait_until(Duration::from_secs(120), || {
        lag_now(&p).is_some_and(|(_, r)| r < 1 << 20)
    });
    assert!(caught_up, "the standby did not catch up once unlimited");
    let before = d.log().matches("policy reloaded").count();
    t.set_policy(&standby_policy(&s, "exempt", ""));
    d.signal(nix::sys::signal::Signal::SIGHUP);
    assert!(wait_until(Duration::from_secs(10), || d
        .log()
        .matches("policy reloaded")
        .count()
        > before));
    println!("wal = \"exempt\", same limits:");
    let exempt = load_and_watch(&p, secs, "4");
    println!("  {}", series_text(&exempt));
    drop(d);

    let last = |v: &[Lag]| v.last().map_or(0, |l| l.replay);
    let third = |v: &[Lag]| v.get(v.len() / 3).map_or(0, |l| l.replay);
    assert!(
        last(&limited) > 2 * third(&limited) && last(&limited) > 64 << 20,
        "with wal = \"limited\" the lag should grow: {}",
        series_text(&limited)
    );
    let max_exempt = exempt.iter().map(|l| l.replay).max().unwrap_or(0);
    assert!(
        max_exempt < last(&limited) / 2,
        "with wal = \"exempt\" the lag should stay bounded: {}",
        series_text(&exempt)
    );
}
