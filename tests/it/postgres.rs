//! `preset = "postgres"` on real PostgreSQL 15 servers, governed by the daemon: the postmaster
//! found from postmaster.pid, all its children in the tenant (the WAL processes in `exempt`),
//! the loop disk under the IO limits, and a `pg_ctl restart` (a new postmaster PID) followed
//! within a second with no process outside the tenant. Each cluster runs on its own loop disk
//! (see `pg`); the tests print what they measured.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::pg::*;

/// The leaf `pid` is in, when it is in `tenant` in every hierarchy it has groups in.
fn leaf_of(t: &Tenancy, pid: u32, tenant: &str) -> Option<&'static str> {
    let groups = proc_cgroups(pid);
    ["limited", "exempt"].into_iter().find(|leaf| {
        let m = t.marker(tenant, leaf);
        t.grouped(tenant)
            .iter()
            .all(|c| groups.get(*c).is_some_and(|p| p.ends_with(&m)))
    })
}

/// The leaf a process of cluster `name` belongs in under `wal = "exempt"`.
fn wanted_leaf(name: &str, cmdline: &str) -> &'static str {
    let title = cmdline
        .strip_prefix(&format!("postgres: {name}: "))
        .unwrap_or("");
    if ["walwriter", "walsender", "walreceiver", "startup"]
        .iter()
        .any(|w| title == *w || title.starts_with(&format!("{w} ")))
    {
        "exempt"
    } else {
        "limited"
    }
}

/// The postmaster and every child of it, with where each is: (pid, title, leaf or None).
fn cluster_procs(t: &Tenancy, pm: u32) -> Vec<(u32, String, Option<&'static str>)> {
    let mut v = vec![(pm, "postmaster".to_string(), leaf_of(t, pm, "pg"))];
    for (pid, c) in children_of(pm) {
        let l = leaf_of(t, pid, "pg");
        // A backend that exited between the listing and the look (gone, or a zombie) is no
        // escape.
        if l.is_none() && !alive(pid) {
            continue;
        }
        v.push((pid, c, l));
    }
    v
}

/// True while `pid` exists and is not exiting (PF_EXITING: past cgroup_exit, the kernel shows
/// it in the root groups) nor a zombie.
fn alive(pid: u32) -> bool {
    const PF_EXITING: u64 = 0x4;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return false;
    };
    let f: Vec<&str> = rest.split(' ').collect();
    let flags: u64 = f.get(6).and_then(|x| x.parse().ok()).unwrap_or(PF_EXITING);
    !matches!(f[0], "Z" | "X") && flags & PF_EXITING == 0
}

/// True when every process is in the tenant and, with `leaves`, in the leaf it belongs in.
fn all_in(name: &str, procs: &[(u32, String, Option<&'static str>)], leaves: bool) -> bool {
    procs.iter().enumerate().all(|(i, (_, c, l))| match l {
        None => false,
        Some(l) => {
            !leaves
                || *l
                    == if i == 0 {
                        "limited"
                    } else {
                        wanted_leaf(name, c)
                    }
        }
    })
}

fn describe(procs: &[(u32, String, Option<&'static str>)]) -> String {
    procs
        .iter()
        .map(|(p, c, l)| match l {
            Some(l) => format!("{p} {c:?} in {l}"),
            None => format!(
                "{p} {c:?} outside: {:?}, {:?}",
                proc_cgroups(*p),
                std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default()
            ),
        })
        .collect::<Vec<_>>()
        .join("\n  ")
}

#[test]
fn postgres_preset_follows_restart() {
    if skip() {
        return;
    }
    let Some(user) = pg_user() else { return };
    let _m = measure_lock();
    // Declared before the cluster, so the server is stopped before the groups are released.
    let t = Tenancy::new("pgpre", "");
    let c = PgCluster::init(&user, "pre", 256, &["shared_buffers = 16MB"]);
    t.set_policy(
        &format!(
            "[[tenant]]\nname = \"pg\"\npreset = \"postgres\"\ndata_dir = \"{}\"\n[tenant.io]\nwrite_bps = \"64MiB\"\n",
            c.data.display()
        ),
    );
    // The preset's storage reaches the cluster's loop disk.
    let plan = t.ok(&["plan"]);
    assert!(
        plan.contains(&c.disk.devnum()),
        "plan does not limit {} ({}):\n{plan}",
        c.disk.devnum(),
        c.disk.dev()
    );
    let d = Daemon::start(&t, &[]);

    // First start: every process in its leaf within a second of pg_ctl's return.
    c.start();
    let started = Instant::now();
    let pm = c.postmaster_pid().expect("postmaster.pid after start");
    let ok = wait_until(Duration::from_secs(1), || {
        all_in(&c.name, &cluster_procs(&t, pm), true)
    });
    assert!(
        ok,
        "after start, not every process is where it belongs:\n  {}\ndaemon log:\n{}",
        describe(&cluster_procs(&t, pm)),
        d.log()
    );
    println!(
        "start: {} processes in place {:.0} ms after pg_ctl returned",
        cluster_procs(&t, pm).len(),
        started.elapsed().as_secs_f64() * 1000.0
    );
    assert_eq!(c.sql("show cluster_name"), c.name);
    let limits = std::fs::read_to_string(
        t.leaf_dir("blkio", "pg", "limited")
            .join("blkio.throttle.write_bps_device"),
    )
    .unwrap();
    assert!(
        limits.contains(&format!("{} {}", c.disk.devnum(), 64u64 << 20)),
        "write_bps on {}: {limits}",
        c.disk.devnum()
    );

    // Restart: note when postmaster.pid names a new PID (polled every millisecond).
    let new_pid = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (new_pid, stop) = (new_pid.clone(), stop.clone());
        let path = c.data.join("postmaster.pid");
        std::thread::spawn(move || -> Option<Instant> {
            while !stop.load(Ordering::Relaxed) {
                let pid = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|s| s.lines().next()?.trim().parse::<u32>().ok());
                if let Some(p) = pid.filter(|p| *p != pm) {
                    new_pid.store(p, Ordering::Relaxed);
                    return Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            None
        })
    };
    c.restart();
    stop.store(true, Ordering::Relaxed);
    let written = watcher
        .join()
        .unwrap()
        .expect("postmaster.pid never named a new PID");
    let pm2 = new_pid.load(Ordering::Relaxed);
    assert_ne!(pm2, pm);
    // The new postmaster and every child in the tenant within a second of the file's change.
    let mut placed_at = None;
    let mut pm_at = None;
    while written.elapsed() < Duration::from_secs(1) {
        if pm_at.is_none() && leaf_of(&t, pm2, "pg").is_some() {
            pm_at = Some(written.elapsed());
        }
        let procs = cluster_procs(&t, pm2);
        if all_in(&c.name, &procs, false) && procs.len() > 3 {
            placed_at = Some(written.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        placed_at.is_some(),
        "1 s after the new postmaster.pid ({pm2}), not every process is in the tenant:\n  {}\ndaemon log:\n{}",
        describe(&cluster_procs(&t, pm2)),
        d.log()
    );
    // For the next 1.5 s, with backends coming and going, no process is ever outside it.
    let mut sessions = Vec::new();
    let mut checks = 0;
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        if checks % 50 == 0 {
            let mut cmd = c.command("psql", &["-XAtq", "-c", "select pg_sleep(0.2)"]);
            cmd.stdout(std::process::Stdio::null());
            sessions.push(Child::spawn(cmd, "psql"));
        }
        let procs = cluster_procs(&t, pm2);
        assert!(
            all_in(&c.name, &procs, false),
            "a process of the restarted cluster is outside the tenant:\n  {}\ndaemon log:\n{}",
            describe(&procs),
            d.log()
        );
        checks += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    for mut s in sessions {
        let (status, _) = s.finish(Duration::from_secs(10));
        assert!(status.success(), "psql session: {status}");
    }
    // Past the fork re-checks: each process in its leaf (the walwriter in exempt).
    std::thread::sleep(Duration::from_millis(600));
    let procs = cluster_procs(&t, pm2);
    assert!(
        all_in(&c.name, &procs, true),
        "after the restart, not every process is in its leaf:\n  {}",
        describe(&procs)
    );
    println!(
        "restart: postmaster {pm} -> {pm2}, in the tenant {:.1} ms after postmaster.pid changed (2 ms polls), all {} processes {:.1} ms after; {checks} checks over 1.5 s with backends coming and going, none outside; leaves:\n  {}",
        pm_at.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0),
        procs.len(),
        placed_at.unwrap().as_secs_f64() * 1000.0,
        describe(&procs)
    );
    drop(d);
    drop(c);
}
