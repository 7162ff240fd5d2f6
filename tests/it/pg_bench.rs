//! Noisy neighbours on real PostgreSQL servers: two clusters A and B, each on its own loop disk,
//! with `shared_buffers = 16MB` so their IO reaches the disks. B runs pgbench; A is the noise.
//! dbcage governs A through the postgres preset (no hand-moved PIDs) and the tests measure what
//! B keeps. Each phase runs `DBCAGE_PG_BENCH_SECS` seconds (default 5: CI-sized; bench/pg-noisy.sh
//! runs them longer). Everything runs under `measure_lock`.
//!
//! v1 blkio throttles only the IO a process issues itself: buffered writes reach the disk from
//! the kernel's flusher threads, outside any group. So A runs with `backend_flush_after`
//! (and PostgreSQL's default checkpoint/bgwriter flush-after): PostgreSQL then starts writeback of
//! what it wrote with sync_file_range in its own context, where the limit applies.

use std::os::unix::process::CommandExt as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::pg::*;

fn phase_secs() -> u64 {
    std::env::var("DBCAGE_PG_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
}

/// What one pgbench run did.
#[derive(Debug, Clone)]
pub struct Bench {
    pub tps: f64,
    pub p99_ms: f64,
    /// Transactions per second as pgbench reported them each second (`-P 1`). pgbench skips the
    /// reports of seconds it was stuck in (one line then covers them all), so an index is not a
    /// second: judge by `completed_at` where time matters.
    pub series: Vec<f64>,
    /// When each transaction completed (Unix time, s), from the per-transaction logs.
    pub completed_at: Vec<f64>,
    /// When no transaction completed: pgbench's last lines (progress, errors), for the report.
    pub stalled: Option<String>,
}

/// A pgbench client started as the postgres user, with argv[0] = `name` (so a rule can take it),
/// per-transaction logs for the latency percentiles and a progress line per second.
pub struct Pgbench {
    child: Child,
    log_prefix: String,
}

impl Pgbench {
    pub fn start(c: &PgCluster, name: &str, args: &[&str]) -> Pgbench {
        let log_prefix = format!("dbcage-test-pgbench-{name}");
        let mut cmd = c.command("pgbench", args);
        cmd.arg0(name)
            .args(["-P", "1", "-l", &format!("--log-prefix={log_prefix}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Pgbench {
            child: Child::spawn(cmd, name),
            log_prefix,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.pid
    }

    pub fn finish(mut self, c: &PgCluster, timeout: Duration) -> Bench {
        let (status, stdout, stderr) = self.child.finish_output(timeout);
        assert!(
            status.success(),
            "pgbench on {}: {status}\n{stdout}\n{stderr}",
            c.name
        );
        let series = stderr
            .lines()
            .filter_map(|l| l.strip_prefix("progress: "))
            .filter_map(|l| l.split(", ").nth(1)?.strip_suffix(" tps")?.parse().ok())
            .collect();
        // pgbench prints no tps (nor latencies) when no transaction completed in the run: a
        // figure of the service, 0, that the caller judges (with what pgbench said about it).
        if stdout.contains("number of transactions actually processed: 0\n") {
            let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            self.remove_logs(c);
            return Bench {
                tps: 0.0,
                p99_ms: f64::INFINITY,
                series,
                completed_at: Vec::new(),
                stalled: Some(format!(
                    "pgbench on {} completed no transaction; its stderr ended: {}",
                    c.name,
                    tail.join(" | ")
                )),
            };
        }
        let tps = stdout
            .lines()
            .find_map(|l| l.strip_prefix("tps = "))
            .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no tps in pgbench output:\n{stdout}\n{stderr}"));
        let logged = self.remove_logs(c);
        assert!(
            !logged.is_empty(),
            "no pgbench transaction logs in {}",
            c.disk.mount.join("dbcage-test-pg").display()
        );
        let mut lat: Vec<u64> = logged.iter().map(|&(us, _)| us).collect();
        lat.sort_unstable();
        let p99_ms = lat[(lat.len() * 99 / 100).min(lat.len() - 1)] as f64 / 1000.0;
        let mut completed_at: Vec<f64> = logged.iter().map(|&(_, at)| at).collect();
        completed_at.sort_by(f64::total_cmp);
        Bench {
            tps,
            p99_ms,
            series,
            completed_at,
            stalled: None,
        }
    }

    /// Removes the run's per-transaction logs (`client_id transaction_no time_us script_no
    /// epoch epoch_us`), giving each transaction's latency in microseconds and when it
    /// completed (Unix time, s).
    fn remove_logs(&self, c: &PgCluster) -> Vec<(u64, f64)> {
        let dir = c.disk.mount.join("dbcage-test-pg");
        let mut logged = Vec::new();
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with(&format!("{}.", self.log_prefix)) {
                let text = std::fs::read_to_string(e.path()).unwrap();
                logged.extend(text.lines().filter_map(|l| {
                    let f: Vec<&str> = l.split(' ').collect();
                    let us: u64 = f.get(2)?.parse().ok()?;
                    let epoch: f64 = f.get(4)?.parse().ok()?;
                    let epoch_us: f64 = f.get(5)?.parse().ok()?;
                    Some((us, epoch + epoch_us / 1e6))
                }));
                std::fs::remove_file(e.path()).unwrap();
            }
        }
        logged
    }
}

/// The time now as Unix time in seconds, as pgbench's per-transaction logs give it.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Sectors written to a block device so far, in bytes (/sys/block/NAME/stat, field 7).
fn written_bytes(dev: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/sys/block/{dev}/stat")).unwrap();
    s.split_whitespace().nth(6).unwrap().parse::<u64>().unwrap() * 512
}

/// Each cluster's settings: small shared_buffers (IO reaches the disk), writeback started by the
/// writer itself (see the module comment).
const CONF: &[&str] = &[
    "shared_buffers = 16MB",
    "backend_flush_after = 256kB",
    "max_wal_size = 256MB",
    "checkpoint_timeout = 30s",
];

/// A's batch: bulk inserts of ~5 MB per transaction (WAL written and flushed at commit by the
/// backend), with the table truncated now and then so the disk does not fill.
pub const BATCH: &str = "\\set r random(1, 40)\n\
\\if :r = 1\n\
truncate batch;\n\
\\else\n\
insert into batch select g, repeat('x', 900) from generate_series(1, 5000) g;\n\
\\endif\n";

/// (pgbench argv[0], tenant policy lines) for a tenant governing `c` and its pgbench client.
fn pg_tenant(name: &str, c: &PgCluster, extra: &str) -> String {
    format!(
        "[[tenant]]\nname = \"{name}\"\npreset = \"postgres\"\ndata_dir = \"{}\"\n\
         match = [{{ cmdline = \"^dbcage-test-pgbench-{name} \" }}]\n{extra}\n",
        c.data.display()
    )
}

fn row(label: &str, b: &Bench, reference: &Bench, extra: &str) -> String {
    format!(
        "  {label:<22} {:8.1}  {:5.2}  {:8.1}  {:5.2}  {extra}",
        b.tps,
        b.tps / reference.tps,
        b.p99_ms,
        b.p99_ms / reference.p99_ms
    )
}

/// Bounds on B's service with A next to it, as fractions of B alone (see `pg_noisy_neighbour_cpu`).
const PINNED_TPS: f64 = 0.7;
const PINNED_P99: f64 = 2.0;
const CAPPED_TPS: f64 = 0.6;
const CAPPED_P99: f64 = 3.0;

/// The mean of two runs (B alone before and after the others, so drift shows in neither).
fn mean(x: &Bench, y: &Bench) -> Bench {
    Bench {
        tps: (x.tps + y.tps) / 2.0,
        p99_ms: (x.p99_ms + y.p99_ms) / 2.0,
        series: Vec::new(),
        completed_at: Vec::new(),
        stalled: x.stalled.clone().or_else(|| y.stalled.clone()),
    }
}

/// Noisy neighbour, IO: B's TPC-B-like pgbench alone, next to A's bulk inserts unconstrained,
/// and next to A limited by dbcage (`write_bps` through the preset, `wal = "limited"`); then A
/// alone, its limit raised mid-run by a policy reload, its TPS following.
#[test]
fn pg_noisy_neighbour_io() {
    if skip() {
        return;
    }
    let Some(user) = pg_user() else { return };
    let _m = measure_lock();
    let secs = phase_secs();
    let limit_mib = 8u64;
    let t = Tenancy::new("pgio", "");
    let a = PgCluster::init(&user, "a", 2048, CONF);
    let b = PgCluster::init(&user, "b", 1024, CONF);
    a.start();
    b.start();
    let t0 = Instant::now();
    b.run_ok("pgbench", &["-i", "-q", "-s", "10"]);
    a.sql("create table batch (id int, v text)");
    let script = a.disk.mount.join("dbcage-test-pg/batch.sql");
    std::fs::write(&script, BATCH).unwrap();
    let script = script.to_string_lossy().into_owned();
    println!(
        "setup: pgbench -i -s 10 on B {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let dur = secs.to_string();
    let b_args = ["-c", "4", "-j", "2", "-T", &dur, "-n"];
    let a_args = ["-c", "2", "-T", &dur, "-n", "-f", &script];
    let timeout = Duration::from_secs(3 * secs + 60);
    // Every phase starts from the same state: B's tables made afresh (TPC-B on a small buffer
    // pool slows down as its tables grow, several-fold within a minute here), both clusters
    // checkpointed, the page cache written back.
    let settle = || {
        b.run_ok("pgbench", &["-i", "-q", "-s", "10"]);
        a.sql("checkpoint");
        b.sql("checkpoint");
        nix::unistd::sync();
    };
    let b_run = || {
        settle();
        Pgbench::start(&b, "dbcage-test-pgbench-b", &b_args).finish(&b, timeout)
    };
    // B next to A's batch: (B, A, A's disk writes in MiB/s).
    let b_with_a = || {
        settle();
        let wa0 = written_bytes(&a.disk.name());
        let at = Instant::now();
        let noise = Pgbench::start(&a, "dbcage-test-pgbench-a", &a_args);
        let bb = Pgbench::start(&b, "dbcage-test-pgbench-b", &b_args).finish(&b, timeout);
        let aa = noise.finish(&a, timeout);
        let mib = (written_bytes(&a.disk.name()) - wa0) as f64
            / at.elapsed().as_secs_f64()
            / (1 << 20) as f64;
        (bb, aa, mib)
    };

    // B alone, B next to A free; the daemon governs A; B next to A limited; B alone again.
    let solo1 = b_run();
    let (noisy, a_free, a_free_mib) = b_with_a();
    let body = |mib: u64| {
        pg_tenant(
            "a",
            &a,
            &format!("wal = \"limited\"\n[tenant.io]\nwrite_bps = \"{mib}MiB\""),
        )
    };
    t.set_policy(&body(limit_mib));
    let mut d = Daemon::start(&t, &[]);
    let (limited, a_lim, a_lim_mib) = b_with_a();
    let solo2 = b_run();
    let solo = mean(&solo1, &solo2);

    // Live change: A alone at limit/2, raised to 4x that halfway through by a reload.
    settle();
    let low = limit_mib / 2;
    let high = limit_mib * 2;
    d.reload_with(&t, &body(low));
    let dur2 = (2 * secs).to_string();
    let sampler = {
        let dev = a.disk.name();
        let n = 2 * secs;
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut last = written_bytes(&dev);
            for _ in 0..n {
                std::thread::sleep(Duration::from_secs(1));
                let now = written_bytes(&dev);
                out.push((now - last) as f64 / (1 << 20) as f64);
                last = now;
            }
            out
        })
    };
    let live_start = unix_now();
    let live = Pgbench::start(
        &a,
        "dbcage-test-pgbench-a",
        &["-c", "2", "-T", &dur2, "-n", "-f", &script],
    );
    assert!(
        wait_until(Duration::from_secs(2), || proc_cgroups(live.pid())["blkio"]
            .ends_with(&t.marker("a", "limited"))),
        "A's pgbench client is not in a/limited; daemon log:\n{}",
        d.log()
    );
    std::thread::sleep(Duration::from_secs(secs));
    d.reload_with(&t, &body(high));
    let raised_at = unix_now();
    let live = live.finish(&a, timeout);
    let rates = sampler.join().unwrap();
    drop(d);

    println!(
        "noisy neighbour, IO ({secs} s per phase; B: pgbench -c 4 -j 2 TPC-B-like, scale 10; A: 2 clients of ~5 MB bulk inserts; shared_buffers 16MB):"
    );
    println!("  phase                   B tps  B/solo  B p99 ms  p99/solo  A tps, A's disk writes");
    println!("{}", row("B alone (before)", &solo1, &solo, ""));
    println!("{}", row("B alone (after)", &solo2, &solo, ""));
    println!(
        "{}",
        row(
            "A unconstrained",
            &noisy,
            &solo,
            &format!("{:.2} tps, {a_free_mib:.1} MiB/s", a_free.tps)
        )
    );
    println!(
        "{}",
        row(
            &format!("A write_bps {limit_mib}MiB"),
            &limited,
            &solo,
            &format!("{:.2} tps, {a_lim_mib:.1} MiB/s", a_lim.tps)
        )
    );
    for (l, x) in [
        ("alone before", &solo1),
        ("A free", &noisy),
        ("A limited", &limited),
        ("alone after", &solo2),
    ] {
        println!("  B tps per second, {l}: {:?}", x.series);
    }
    let half = rates.len() / 2;
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    // The first second after each change is a transition.
    let before = avg(&rates[1..half]);
    let after = avg(&rates[half + 1..]);
    // A's transactions counted by when they completed: before the reload, and from a second
    // after it to the end of pgbench's run.
    let ended_at = live_start + (2 * secs) as f64;
    let done_in = |from: f64, to: f64| {
        let n = live
            .completed_at
            .iter()
            .filter(|&&at| at >= from && at < to)
            .count();
        n as f64 / (to - from)
    };
    let tps_before = done_in(live_start, raised_at);
    let tps_after = done_in(raised_at + 1.0, ended_at);
    println!(
        "live change: A alone at {low} MiB/s, raised to {high} MiB/s after {secs} s by a reload: A's disk writes MiB/s per second {:?}; mean {before:.1} before, {after:.1} after; A tps (~5 MB transactions, by when they completed) {tps_before:.2} before the reload at {:.1} s, {tps_after:.2} from a second after it; pgbench's progress reports {:?}",
        rates.iter().map(|r| (r * 10.0).round() / 10.0).collect::<Vec<_>>(),
        raised_at - live_start,
        live.series
    );
    // A's disk sees about its limit (slack: writeback the kernel starts by itself is not
    // throttled on v1).
    assert!(
        a_lim_mib <= limit_mib as f64 * 1.25,
        "A wrote {a_lim_mib:.1} MiB/s under a {limit_mib} MiB/s limit"
    );
    assert!(
        a_lim.tps > 0.0,
        "A made no progress under its limit: {:?}",
        a_lim.stalled
    );
    assert!(
        before <= low as f64 * 1.5 && after >= high as f64 * 0.6,
        "A's writes did not follow its limit from {low} to {high} MiB/s: {before:.1} -> {after:.1} MiB/s"
    );
    assert!(
        tps_after > 1.5 * tps_before,
        "A's tps did not follow its limit: {tps_before:.2} -> {tps_after:.2}"
    );
}

/// Noisy neighbour, CPU: B's select-only pgbench (server and client) next to A's with many
/// clients. Pinned: A on cpu 0 and B on cpu 1 (`cpus`), B alone under the same pinning as the
/// reference; cap-only: A at `cores = 0.5`, nothing pinned; and nothing limited.
#[test]
fn pg_noisy_neighbour_cpu() {
    if skip() {
        return;
    }
    let Some(user) = pg_user() else { return };
    // The cpus this test may use: its own cpuset (wherever the hierarchy is mounted).
    let cpus = std::fs::read_to_string(own_dir("cpuset").join("cpuset.cpus")).unwrap_or_default();
    let cpus = cpus.trim();
    if !(cpus == "0-1" || cpus.starts_with("0-") || cpus.starts_with("0,1"))
        && cannot_run(&format!(
            "needs 2 cpus: cpus 0 and 1 in its cpuset (it has {cpus:?})"
        ))
    {
        return;
    }
    let _m = measure_lock();
    let secs = phase_secs();
    let t = Tenancy::new("pgcpu", "");
    let a = PgCluster::init(&user, "ca", 512, &["shared_buffers = 32MB"]);
    let b = PgCluster::init(&user, "cb", 512, &["shared_buffers = 32MB"]);
    a.start();
    b.start();
    a.run_ok("pgbench", &["-i", "-q", "-s", "2"]);
    b.run_ok("pgbench", &["-i", "-q", "-s", "2"]);
    let dur = secs.to_string();
    let b_args = ["-S", "-c", "2", "-j", "1", "-T", &dur, "-n"];
    let a_args = ["-S", "-c", "16", "-j", "2", "-T", &dur, "-n"];
    let timeout = Duration::from_secs(secs + 60);
    let b_alone = || Pgbench::start(&b, "dbcage-test-pgbench-b", &b_args).finish(&b, timeout);
    let b_with_a = || {
        let noise = Pgbench::start(&a, "dbcage-test-pgbench-a", &a_args);
        let bb = b_alone();
        (bb, noise.finish(&a, timeout))
    };
    let policy = |a_cpu: &str, b_cpu: &str| {
        format!(
            "{}{}",
            pg_tenant("a", &a, &format!("[tenant.cpu]\n{a_cpu}")),
            pg_tenant("b", &b, &format!("[tenant.cpu]\n{b_cpu}"))
        )
    };
    // Warm-up.
    Pgbench::start(
        &b,
        "dbcage-test-pgbench-b",
        &["-S", "-c", "2", "-T", "2", "-n"],
    )
    .finish(&b, timeout);

    // One measurement of every phase; returns the bounds B missed (empty: all held).
    let measure = || -> Vec<String> {
        // B also outweighs whatever else runs on the host (cpu.shares 102400 against 1024 per
        // process in the root group): with cpu 0 busy, the rest of the host moves to cpu 1.
        t.set_policy(&policy("cpus = \"0\"", "cpus = \"1\"\nweight = 10000"));
        let mut d = Daemon::start(&t, &[]);
        let pinned_alone = b_alone();
        let (pinned, a_pinned) = b_with_a();
        let bpm = b.postmaster_pid().unwrap();
        let allowed = status_field(bpm, "Cpus_allowed_list");
        assert_eq!(
            allowed.as_deref(),
            Some("1"),
            "B's postmaster is not on cpu 1"
        );

        let apm = a.postmaster_pid().unwrap();
        assert_eq!(
            status_field(apm, "Cpus_allowed_list").as_deref(),
            Some("0"),
            "A's postmaster is not on cpu 0"
        );

        d.reload_with(&t, &policy("cores = 0.5", "weight = 100"));
        let free_alone = b_alone();
        let usage = || {
            std::fs::read_to_string(t.tenant_dir("cpuacct", "a").join("cpuacct.usage"))
                .unwrap()
                .trim()
                .parse::<u64>()
                .unwrap()
        };
        let (u0, c0) = (usage(), Instant::now());
        let (capped, a_capped) = b_with_a();
        let a_cores = (usage() - u0) as f64 / 1e9 / c0.elapsed().as_secs_f64();
        // A's usage is its group's: it says something only if A is in the group.
        let a_cpu = proc_cgroups(a.postmaster_pid().unwrap())
            .get("cpu")
            .cloned()
            .unwrap_or_default();
        assert!(
            a_cpu.ends_with(&t.marker("a", "limited")),
            "A's postmaster is in cpu cgroup {a_cpu}, not tenant a's limited leaf"
        );
        d.reload_with(&t, &policy("weight = 100", "weight = 100"));
        let (unlimited, a_unl) = b_with_a();
        drop(d);

        println!(
            "noisy neighbour, CPU ({secs} s per phase; select-only pgbench, scale 2; B: 2 clients; A: 16 clients):"
        );
        println!(
            "  phase                   B tps  B/ref   B p99 ms  p99/ref   A tps   (reference)"
        );
        println!(
            "{}",
            row("B alone, B on cpu 1", &pinned_alone, &pinned_alone, "")
        );
        println!(
            "{}",
            row(
                "A on cpu 0, B on cpu 1",
                &pinned,
                &pinned_alone,
                &format!("{:8.1}  B alone pinned", a_pinned.tps)
            )
        );
        println!("{}", row("B alone, unpinned", &free_alone, &free_alone, ""));
        println!(
            "{}",
            row(
                "A cores = 0.5",
                &capped,
                &free_alone,
                &format!("{:8.1}  B alone unpinned", a_capped.tps)
            )
        );
        println!(
            "{}",
            row(
                "A unconstrained",
                &unlimited,
                &free_alone,
                &format!("{:8.1}  B alone unpinned", a_unl.tps)
            )
        );
        println!(
            "  B with A pinned vs B alone unpinned: {:.2}",
            pinned.tps / free_alone.tps
        );
        println!("  A's cpu use under cores = 0.5: {a_cores:.2} cores (cpuacct.usage)");
        assert!(
            a_cores <= 0.55,
            "A used {a_cores:.2} cores under cores = 0.5"
        );
        // Every run made progress: a pgbench that completed nothing in a phase is a miss,
        // reported with what pgbench said (measured again once, as the bounds below are).
        let mut missed: Vec<String> = [&pinned_alone, &pinned, &a_pinned, &free_alone]
            .into_iter()
            .chain([&capped, &a_capped, &unlimited, &a_unl])
            .filter_map(|run| run.stalled.clone())
            .collect();
        // What dbcage promises B: pinned apart, B keeps most of what it does alone on its cpu;
        // with A capped at half a core, B keeps most of what it does alone with both cpus.
        // B's figures depend on what else runs on this shared 2-core host (other builds are not
        // under the measure lock): the bounds are ones a calm host holds with room, and a miss
        // is measured again once before it fails.
        let mut bound = |what: &str, value: f64, ok: bool, want: &str| {
            if !ok {
                missed.push(format!("{what} {value:.2} (want {want})"));
            }
        };
        let (pt, pp) = (
            pinned.tps / pinned_alone.tps,
            pinned.p99_ms / pinned_alone.p99_ms,
        );
        let (ct, cp) = (
            capped.tps / free_alone.tps,
            capped.p99_ms / free_alone.p99_ms,
        );
        bound(
            "B's tps with A pinned apart / B alone pinned",
            pt,
            pt >= PINNED_TPS,
            &format!(">= {PINNED_TPS}"),
        );
        bound(
            "B's p99 with A pinned apart / B alone pinned",
            pp,
            pp <= PINNED_P99,
            &format!("<= {PINNED_P99}"),
        );
        bound(
            "B's tps with A at cores = 0.5 / B alone",
            ct,
            ct >= CAPPED_TPS,
            &format!(">= {CAPPED_TPS}"),
        );
        bound(
            "B's p99 with A at cores = 0.5 / B alone",
            cp,
            cp <= CAPPED_P99,
            &format!("<= {CAPPED_P99}"),
        );
        missed
    };
    let first = measure();
    if first.is_empty() {
        return;
    }
    println!("B missed: {first:?}; measuring again once");
    let second = measure();
    assert!(
        second.is_empty(),
        "B's service under a noisy neighbour, twice out of bounds: first {first:?}, then {second:?}"
    );
}
