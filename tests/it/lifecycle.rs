//! Apply, re-apply, release, races with exiting processes, scale, and bad input.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// `sleep 120` with argv[0] = `name`.
fn sleeper(name: &str) -> Child {
    let mut cmd = Command::new("sleep");
    cmd.arg0(name)
        .arg("120")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Child::spawn(cmd, name)
}

fn tenant(name: &str, matches: &str, extra: &str) -> String {
    format!(
        "[[tenant]]\nname = \"{name}\"\nmatch = [{{ cmdline = \"{}\" }}]\n{extra}\n",
        name_rule(matches)
    )
}

/// Asserts that `pid` is in `dir` (relative to each hierarchy) in every controller.
fn assert_in_everywhere(pid: u32, want: impl Fn(&str) -> String) {
    let groups = proc_cgroups(pid);
    for c in CONTROLLERS {
        assert_eq!(groups[c], want(c), "pid {pid} in the {c} hierarchy");
    }
}

/// Where a process of `tenant`'s `leaf` belongs in each hierarchy: that leaf where the tenant
/// has groups, and elsewhere the group it started in (the test's own: dbcage's parent), which a
/// tenant whose settings do not use the hierarchy leaves it in.
fn in_tenant<'a>(
    t: &'a Tenancy,
    own: &'a BTreeMap<String, String>,
    tenant: &'a str,
    leaf: &'a str,
) -> impl Fn(&str) -> String + 'a {
    let grouped = t.grouped(tenant);
    move |c| match grouped.contains(&c) {
        true => join(&own[c], &format!("{}/{tenant}/{leaf}", t.root)),
        false => own[c].clone(),
    }
}

fn join(parent: &str, child: &str) -> String {
    format!("{}/{child}", parent.trim_end_matches('/'))
}

#[test]
fn idempotent_apply() {
    if skip() {
        return;
    }
    let sid = sid();
    let (main, lgwr) = (format!("ora_p001_{sid}"), format!("ora_lgwr_{sid}"));
    let body = format!(
        "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"{}\" }}]\nexempt = [{{ cmdline = \"{}\" }}]\n\n\
         [tenant.cpu]\ncores = 1.5\nweight = 200\n\n[tenant.memory]\nmax = \"1000000000\"\nhigh = \"512MiB\"\n",
        name_rule(&main),
        name_rule(&lgwr)
    );
    let t = Tenancy::new("idem", &body);
    let p = sleeper(&main);
    let q = sleeper(&lgwr);

    let plan = t.json(&["plan", "--json"]);
    let steps = plan["steps"].as_array().unwrap();
    let mv = |pid: u32| {
        steps
            .iter()
            .find(|s| s["action"] == "move" && s["pid"] == pid)
            .unwrap_or_else(|| panic!("no move of {pid} in the plan: {plan:#}"))
    };
    let (mp, mq) = (mv(p.pid), mv(q.pid));
    println!(
        "plan: {} steps; move {} -> {} ({}); move {} -> {} ({})",
        steps.len(),
        p.pid,
        mp["leaf"],
        mp["reason"],
        q.pid,
        mq["leaf"],
        mq["reason"]
    );
    assert_eq!(mp["tenant"], "db");
    assert_eq!(mp["leaf"], "limited");
    assert_eq!(
        mp["reason"],
        format!("match[0] cmdline=~{}", name_rule(&main))
    );
    assert_eq!(mq["leaf"], "exempt");
    assert_eq!(
        mq["reason"],
        format!("exempt[0] cmdline=~{}", name_rule(&lgwr))
    );
    // The kernel's comm, not argv[0]'s name: no rule looks at comm, so the scan read it only
    // for the processes the rules matched.
    assert_eq!(
        (&mp["comm"], &mq["comm"]),
        (&"sleep".into(), &"sleep".into())
    );
    // cpu, memory, blkio and cpuacct on v1 (no cpuset: it pins nothing), the one tree on v2
    let want_targets = match cgroup_version() {
        Version::V2 => 1,
        Version::V1 => 4,
    };
    assert_eq!(mp["targets"].as_array().unwrap().len(), want_targets);

    let first = t.ok(&["apply"]);
    assert!(first.contains("applied:"), "{first}");
    assert!(first.contains("2 processes moved"), "{first}");
    let second = t.ok(&["apply"]);
    println!("second apply: {}", second.trim());
    assert!(second.contains("nothing to do"), "{second}");
    let third = t.json(&["apply", "--json"]);
    assert_eq!(third["plan"]["steps"], serde_json::json!([]), "{third:#}");
    assert_eq!(third["outcome"]["moved"], 0);
    assert_eq!(third["outcome"]["written"], 0);
    assert_eq!(third["outcome"]["created"], 0);
    let plan = t.ok(&["plan"]);
    assert!(plan.contains("no changes"), "{plan}");

    let own = parent_paths();
    assert_in_everywhere(p.pid, in_tenant(&t, &own, "db", "limited"));
    assert_in_everywhere(q.pid, in_tenant(&t, &own, "db", "exempt"));
}

#[test]
fn release_moves_back_and_removes() {
    if skip() {
        return;
    }
    let sid = sid();
    let (n1, n2) = (format!("ora_p001_{sid}"), format!("ora_p002_{sid}"));
    let body = format!(
        "{}{}",
        tenant("one", &n1, "[tenant.cpu]\ncores = 1\n"),
        tenant("two", &n2, "[tenant.memory]\nmax = \"512MiB\"\n")
    );
    let t = Tenancy::new("release", &body);
    let p1 = sleeper(&n1);
    let p2 = sleeper(&n2);
    t.ok(&["apply"]);
    let own = parent_paths();
    assert_in_everywhere(p1.pid, in_tenant(&t, &own, "one", "limited"));
    assert_in_everywhere(p2.pid, in_tenant(&t, &own, "two", "limited"));

    if cgroup_version() == Version::V2 {
        // The parent has controllers enabled for its children, so v2 lets it hold no process:
        // release says so and leaves the processes in their groups (a non-root parent).
        let o = t.run(&["release", "one"]);
        let err = String::from_utf8_lossy(&o.stderr);
        println!("release one on v2 under a delegated parent: {}", err.trim());
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("the processes stay where they are"), "{err}");
        assert_in_everywhere(p1.pid, in_tenant(&t, &own, "one", "limited"));
        return;
    }
    let out = t.ok(&["release", "one"]);
    println!("release one: {}", out.trim().replace('\n', "; "));
    assert!(out.contains("1 process moved back"), "{out}");
    assert_in_everywhere(p1.pid, |c| own[c].clone());
    assert_in_everywhere(p2.pid, in_tenant(&t, &own, "two", "limited"));
    for c in CONTROLLERS {
        let gone = t.tenant_dir(c, "one");
        assert!(!gone.exists(), "{} still exists", gone.display());
    }
    for c in t.grouped("two") {
        assert!(t.leaf_dir(c, "two", "limited").is_dir());
    }
    let status = t.json(&["status", "--json", "two"]);
    assert_eq!(status["tenants"][0]["processes"], 1);

    // Releasing it again is an input error: it has no groups any more.
    let again = t.run(&["release", "one"]);
    assert_eq!(again.status.code(), Some(2));

    let out = t.ok(&["release", "--all"]);
    println!("release --all: {}", out.trim().replace('\n', "; "));
    assert_in_everywhere(p2.pid, |c| own[c].clone());
    for c in CONTROLLERS {
        let root = t.root_dir(c);
        assert!(!root.exists(), "{} still exists", root.display());
    }
}

#[test]
fn process_exits_between_scan_and_move() {
    if skip() {
        return;
    }
    // Hundreds of short-lived processes load the machine: keep measurements away.
    let _m = measure_lock();
    let name = format!("ora_p001_{}", sid());
    let t = Tenancy::new("race", &tenant("db", &name, "[tenant.cpu]\nweight = 50\n"));
    t.ok(&["apply"]);
    let started = std::sync::atomic::AtomicBool::new(false);
    let finished = std::sync::atomic::AtomicBool::new(false);
    let (mut applies, mut moved, mut vanished) = (0, 0, 0);
    std::thread::scope(|s| {
        let spawner = s.spawn(|| {
            let mut spawned = 0;
            // Batches of 20 alive at once; half exit at once, half after a few milliseconds.
            for batch in 0..10 {
                let mut kids: Vec<Child> = (0..20)
                    .map(|i| {
                        let script = if i % 2 == 0 { "exit 0" } else { "sleep 0.0$1" };
                        let mut cmd = Command::new("/bin/sh");
                        cmd.arg0(&name)
                            .args(["-c", script, "sh", &(batch % 9 + 1).to_string()])
                            .stdin(Stdio::null())
                            .stdout(Stdio::null())
                            .stderr(Stdio::null());
                        Child::spawn(cmd, &name)
                    })
                    .collect();
                spawned += kids.len();
                started.store(true, std::sync::atomic::Ordering::SeqCst);
                for k in &mut kids {
                    let (status, _) = k.finish(Duration::from_secs(30));
                    assert!(status.success(), "{status}");
                }
            }
            finished.store(true, std::sync::atomic::Ordering::SeqCst);
            spawned
        });
        wait_until(Duration::from_secs(10), || {
            started.load(std::sync::atomic::Ordering::SeqCst)
        });
        while applies < 5 || !finished.load(std::sync::atomic::Ordering::SeqCst) {
            let out = t.run(&["apply", "--json"]);
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "apply failed while processes came and went ({}):\n{text}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["outcome"]["errors"], serde_json::json!([]), "{v:#}");
            moved += v["outcome"]["moved"].as_u64().unwrap();
            vanished += v["outcome"]["vanished"].as_u64().unwrap();
            applies += 1;
        }
        let spawned = spawner.join().expect("spawner");
        println!(
            "{spawned} short-lived processes, {applies} applies, all exit 0: {moved} moved, {vanished} exited before their move"
        );
    });
    // Nothing of them is left in the group, and the group still works.
    let final_apply = t.ok(&["apply"]);
    assert!(final_apply.contains("nothing to do"), "{final_apply}");
}

/// `dbcage -c POLICY ARGS...`, run behind `wrapper` (e.g. `unshare ...`; empty: directly), with
/// its debug log on stderr and the process names read from `comm_source` (`DBCAGE_COMM_SOURCE`;
/// `None`: the default choice). Asserts exit 0; returns (stdout, stderr).
fn run_logged(
    t: &Tenancy,
    wrapper: &[&str],
    args: &[&str],
    comm_source: Option<&str>,
) -> (String, String) {
    let mut cmd = dbcage_behind(wrapper);
    cmd.arg("-c")
        .arg(&t.policy)
        .args(args)
        .env("DBCAGE_LOG", "dbcage=debug")
        .env_remove("DBCAGE_CONFIG")
        .env_remove("DBCAGE_COMM_SOURCE");
    if let Some(source) = comm_source {
        cmd.env("DBCAGE_COMM_SOURCE", source);
    }
    let out = cmd.output().expect("run dbcage");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "{wrapper:?} dbcage {args:?} (comm from {comm_source:?}): {stdout}{stderr}"
    );
    (stdout, stderr)
}

#[test]
fn two_thousand_processes() {
    if skip() {
        return;
    }
    // Thousands of processes load the machine: keep measurements away.
    let _m = measure_lock();
    const N: usize = 2000;
    // Matched by `comm` (the program's name: `sleep` run through a symlink of that name), so
    // that the scan of more than 2,000 processes reads the names from the task iterator.
    let name = comm_tag("dbc2k");
    let t = Tenancy::new(
        "many",
        &format!("[[tenant]]\nname = \"db\"\nmatch = [{{ comm = '^{name}$' }}]\n"),
    );
    let program = t.dir().join(&name);
    let sleep = ["/usr/bin/sleep", "/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("sleep in /usr/bin or /bin");
    std::os::unix::fs::symlink(sleep, &program).expect("symlink to sleep");
    let t0 = Instant::now();
    let kids: Vec<Child> = (0..N)
        .map(|_| {
            let mut cmd = Command::new(&program);
            cmd.arg("120")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            Child::spawn(cmd, &name)
        })
        .collect();
    let spawn_time = t0.elapsed();

    let t0 = Instant::now();
    let (out, log) = run_logged(&t, &[], &["apply"], None);
    let apply_time = t0.elapsed();
    let iterated = log.lines().find(|l| l.contains("from the task iterator"));
    println!(
        "{N} processes: started in {:.2}s; apply took {:.2}s: {}; {}",
        spawn_time.as_secs_f64(),
        apply_time.as_secs_f64(),
        out.trim(),
        iterated.unwrap_or("(comm from /proc)")
    );
    assert!(out.contains(&format!("{N} processes moved")), "{out}");
    assert!(
        iterated.is_some(),
        "the scan did not use the task iterator: {log}"
    );
    let want: BTreeSet<u32> = kids.iter().map(|k| k.pid).collect();
    for c in t.grouped("db") {
        let inside: BTreeSet<u32> = procs_in(&t.leaf_dir(c, "db", "limited"))
            .into_iter()
            .collect();
        let missing: Vec<&u32> = want.difference(&inside).take(5).collect();
        assert!(
            missing.is_empty(),
            "{c}: {} of {N} processes are not in the limited leaf, e.g. {missing:?}",
            want.difference(&inside).count()
        );
    }
    let status = t.json(&["status", "--json"]);
    assert_eq!(status["tenants"][0]["processes"], N);
    let t0 = Instant::now();
    drop(kids);
    println!(
        "{N} processes killed and reaped in {:.2}s",
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn bad_input_changes_nothing() {
    if skip() {
        return;
    }
    let sid = sid();
    let name = format!("ora_p001_{sid}");
    let p = sleeper(&name);
    let own = own_cgroups();
    let good = tenant("db", &name, "");
    let cases = [
        (
            "invalid regex",
            format!(
                "{good}[[tenant]]\nname = \"other\"\nmatch = [{{ cmdline = \"^ora_p009_{sid}(\" }}]\n"
            ),
            format!("^ora_p009_{sid}("),
        ),
        (
            "missing storage path",
            format!(
                "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"{}\" }}]\nstorage = [\"/nonexistent/dbcage-test-{sid}\"]\n\n[tenant.io]\nread_bps = \"8MiB\"\n",
                name_rule(&name)
            ),
            format!("/nonexistent/dbcage-test-{sid}"),
        ),
    ];
    for (what, body, bad) in cases {
        let t = Tenancy::new("bad", &body);
        // Where the bad value starts: its opening quote, 1-based.
        let text = t.policy_text(&body);
        let (line, col) = text
            .lines()
            .enumerate()
            .find_map(|(i, l)| l.find(&format!("\"{bad}\"")).map(|c| (i + 1, c + 1)))
            .unwrap();
        let location = format!("{}:{line}:{col}", t.policy.display());
        for cmd in [&["apply"][..], &["check"], &["plan", "--json"]] {
            let out = t.run(cmd);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{what}: {cmd:?}: {stderr}");
            assert!(
                stderr.contains(&location),
                "{what}: {cmd:?}: stderr does not name {location}:\n{stderr}"
            );
            assert!(out.stdout.is_empty(), "{what}: {cmd:?} printed a plan");
        }
        println!(
            "{what}: exit 2, {}",
            String::from_utf8_lossy(&t.run(&["apply"]).stderr)
                .lines()
                .find(|l| l.contains(&location))
                .unwrap()
                .trim()
        );
        for c in CONTROLLERS {
            let root = t.root_dir(c);
            assert!(!root.exists(), "{what}: {} was created", root.display());
        }
        assert_in_everywhere(p.pid, |c| own[c].clone());
    }
}

/// A tenant with only an IO limit gets no cpuset or memory group: its process moves in blkio,
/// cpu and cpuacct and stays in the cpuset and memory groups it was in (made here, under the
/// test's own groups). Pinned by a policy change, the tenant gets a cpuset group and the
/// process moves in; unpinned again, the group is removed and the process is back in dbcage's
/// parent there. Each `apply` leaves nothing for a second one to do.
#[test]
fn an_io_only_tenant_keeps_its_processes_cpuset_and_memory_groups() {
    if skip_unless_v1("cgroup v1 only: separate cpuset and memory hierarchies") {
        return;
    }
    let disk = LoopDisk::new(64);
    let sid = sid();
    let name = format!("ora_p004_{sid}");
    let body = |cpu: &str| {
        format!(
            "[[tenant]]\nname = \"db\"\nmatch = [{{ cmdline = \"{}\" }}]\nstorage = [\"{}\"]\n\
             [tenant.io]\nread_bps = \"8MiB\"\n{cpu}",
            name_rule(&name),
            disk.mount_str()
        )
    };
    let t = Tenancy::new("iogroups", &body(""));
    // Its own cpuset and memory groups before dbcage sees it (cpuset: the parent's sets).
    let prior_name = format!("dbcage-test-prior-{sid}");
    let prior: BTreeMap<&str, TestGroup> = ["cpuset", "memory"]
        .into_iter()
        .map(|c| (c, TestGroup::new(&parent_dir(c), &prior_name)))
        .collect();
    for f in ["cpuset.cpus", "cpuset.mems"] {
        let v = std::fs::read_to_string(parent_dir("cpuset").join(f)).unwrap();
        std::fs::write(prior["cpuset"].dir.join(f), v.trim()).unwrap();
    }
    let p = sleeper(&name);
    for g in prior.values() {
        std::fs::write(g.dir.join("cgroup.procs"), p.pid.to_string()).unwrap();
    }
    let own = parent_paths();
    let before = proc_cgroups(p.pid);
    for c in ["cpuset", "memory"] {
        assert_eq!(before[c], join(&own[c], &prior_name), "{c}: set up");
    }

    let first = t.json(&["apply", "--json"]);
    assert!(
        first["outcome"]["errors"].as_array().unwrap().is_empty(),
        "{first:#}"
    );
    let now = proc_cgroups(p.pid);
    for c in ALWAYS_GROUPED {
        assert_eq!(
            now[c],
            join(&own[c], &format!("{}/db/limited", t.root)),
            "{c}"
        );
    }
    for c in ["cpuset", "memory"] {
        assert_eq!(
            now[c], before[c],
            "{c}: the process left the group it was in"
        );
        assert!(
            !t.tenant_dir(c, "db").exists(),
            "{c}: a group for an io-only tenant"
        );
    }
    let again = t.json(&["apply", "--json"]);
    assert_eq!(again["plan"]["steps"], serde_json::json!([]), "{again:#}");
    // status still counts it and reads its IO and CPU time
    let status = t.json(&["status", "--json", "db"]);
    assert_eq!(status["tenants"][0]["processes"], 1, "{status:#}");
    assert!(
        status["tenants"][0]["cpu"]["usage_seconds"].is_number(),
        "{status:#}"
    );

    // Pinned: a cpuset group of its own, the process in it; still no memory group.
    t.set_policy(&body("[tenant.cpu]\ncpus = \"0\"\n"));
    let pinned = t.json(&["apply", "--json"]);
    assert!(
        pinned["outcome"]["errors"].as_array().unwrap().is_empty(),
        "{pinned:#}"
    );
    let now = proc_cgroups(p.pid);
    assert_eq!(
        now["cpuset"],
        join(&own["cpuset"], &format!("{}/db/limited", t.root))
    );
    assert_eq!(t.knob("db", Knob::Cpus), "0");
    assert_eq!(now["memory"], before["memory"]);
    assert!(!t.tenant_dir("memory", "db").exists());

    // Unpinned: the group goes, the process is in dbcage's parent's cpuset (the root's set).
    t.set_policy(&body(""));
    let unpinned = t.json(&["apply", "--json"]);
    assert!(
        unpinned["outcome"]["errors"].as_array().unwrap().is_empty(),
        "{unpinned:#}"
    );
    let steps = unpinned["plan"]["steps"].as_array().unwrap();
    assert!(
        steps.iter().any(|s| s["action"] == "remove"),
        "no group removed: {unpinned:#}"
    );
    assert!(
        !t.tenant_dir("cpuset", "db").exists(),
        "the cpuset group is left"
    );
    let now = proc_cgroups(p.pid);
    assert_eq!(now["cpuset"], own["cpuset"]);
    assert_eq!(now["memory"], before["memory"]);
    for c in ALWAYS_GROUPED {
        assert_eq!(
            now[c],
            join(&own[c], &format!("{}/db/limited", t.root)),
            "{c}"
        );
    }
    let last = t.json(&["apply", "--json"]);
    assert_eq!(last["plan"]["steps"], serde_json::json!([]), "{last:#}");
    println!(
        "io-only tenant: groups in {:?}; pinned, then unpinned: cpuset group made, then removed ({} steps)",
        ALWAYS_GROUPED,
        steps.len()
    );
    drop(p);
}

/// cgroup v2 forbids processes in a group that enables controllers for its children: a plan
/// that moves a group's processes into its leaves and then enables a controller there (a
/// systemd unit's delegated cgroup) is refused with EBUSY when one of them forks between the
/// plan's reading and its move, the child left behind in the group. `execute` moves such a
/// child after its parent and writes again. Deterministic here: the child is forked after the
/// plan is made and before it runs.
#[test]
fn a_fork_into_the_group_during_its_moves_follows_its_parent() {
    if skip() {
        return;
    }
    if cgroup_version() != Version::V2
        && cannot_run("cgroup v2 only: no group on v1 refuses controllers for holding processes")
    {
        return;
    }
    // cpu offered to the test's group (as dbcage's plans offer it to their root group).
    let parent = parent_dir("cpu");
    std::fs::write(parent.join("cgroup.subtree_control"), "+cpu").unwrap();
    let group = TestGroup::new(&parent, &format!("dbcage-test-forked-{}", sid()));
    let tmp = tempfile::Builder::new()
        .prefix("dbcage-test-fifo")
        .tempdir()
        .unwrap();
    let fifo = tmp.path().join("go");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    // Forks its child when the fifo gives it a line, not before.
    let script = format!("read x < {}; sleep 300 & wait", fifo.display());
    let forker = Child::named("dbcage-test-forker", "/bin/sh", &["-c", &script]);
    std::fs::write(group.dir.join("cgroup.procs"), forker.pid.to_string()).unwrap();

    let leaf = group.dir.join("dbcage-test-leaf");
    let subtree_control = group.dir.join("cgroup.subtree_control");
    let plan = dbcage::plan::Plan {
        steps: vec![
            dbcage::plan::Step::Mkdir {
                path: leaf.clone(),
                reason: "the test's leaf".into(),
            },
            dbcage::plan::Step::Move {
                pid: forker.pid,
                comm: "sh".into(),
                tenant: "t".into(),
                leaf: dbcage::classify::Leaf::Limited,
                targets: vec![leaf.join("cgroup.procs")],
                leave: Vec::new(),
                reason: "into the leaf".into(),
            },
            dbcage::plan::Step::Write {
                path: subtree_control.clone(),
                value: "+cpu".into(),
                current: None,
                reason: "cpu for the leaves".into(),
            },
        ],
        ..Default::default()
    };
    std::fs::write(&fifo, "go\n").unwrap();
    /// The forked child is the test's too: ended by its pid, pass or fail, before the group
    /// is removed (declared after `group`, so dropped first).
    struct Forked(u32);
    impl Drop for Forked {
        fn drop(&mut self) {
            if self.0 != 0 {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(self.0 as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    let mut forked = Forked(0);
    let mut child = 0;
    assert!(
        wait_until(Duration::from_secs(10), || {
            child = procs_in(&group.dir)
                .into_iter()
                .find(|&p| p != forker.pid)
                .unwrap_or(0);
            forked.0 = child;
            child != 0
        }),
        "the forked child never showed in {}",
        group.dir.display()
    );
    let out = dbcage::engine::execute(&plan);
    let in_leaf = procs_in(&leaf);
    let enabled = std::fs::read_to_string(&subtree_control).unwrap_or_default();
    let parent_pid = forker.pid;
    drop(forked);
    drop(forker);
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!((out.written, out.moved, out.skipped), (1, 2, 0), "{out:?}");
    assert!(
        in_leaf.contains(&parent_pid) && in_leaf.contains(&child),
        "parent {} and child {child} in the leaf: {in_leaf:?}",
        parent_pid
    );
    assert!(enabled.split_whitespace().any(|c| c == "cpu"), "{enabled}");
    assert_eq!(out.recovered.len(), 1, "{:?}", out.recovered);
    assert!(
        out.recovered[0].contains(&format!("pids [{child}], forked into its group")),
        "{}",
        out.recovered[0]
    );
}

/// Rules on `comm` read each process's name from the task iterator (eBPF) when a scan is
/// large and from /proc/PID/comm otherwise (`DBCAGE_COMM_SOURCE` forces either): the iterator
/// gives every process the name /proc gives it, and a plan places the same process either way,
/// here one whose comm is not its argv[0] (it renamed itself), which only the kernel's comm
/// tells.
#[test]
fn comm_rules_see_the_same_names_from_the_task_iterator_as_from_proc() {
    if skip() {
        return;
    }
    let pids = || -> BTreeSet<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .collect()
    };
    let before = pids();
    let comms = dbcage::inventory::tasks::Comms::read()
        .unwrap_or_else(|e| panic!("the task iterator did not load as root: {e}"));
    let mut compared = 0;
    let mut renamed_since = Vec::new();
    let mut left_out = Vec::new();
    for pid in before.intersection(&pids()).copied() {
        let (Ok(text), Ok(argv)) = (
            std::fs::read_to_string(format!("/proc/{pid}/comm")),
            std::fs::read(format!("/proc/{pid}/cmdline")),
        ) else {
            continue; // gone since
        };
        let proc_name = text.trim_end_matches('\n').as_bytes();
        match comms.get(pid) {
            Some(name) if name == proc_name => compared += 1,
            Some(_) => renamed_since.push(pid),
            // A kernel thread has no argv and no record.
            None if argv.is_empty() => {}
            None => left_out.push(pid),
        }
    }
    // A process may rename itself between the two reads; a few may, not many. One the
    // iterator leaves out is read from /proc by the scan: on the development host (kernel
    // 6.18, firecracker's init as pid 1) the iterator leaves out pid 1, for reasons not looked
    // into; in the systemd guest (6.1) it names every process.
    println!(
        "{} processes in the iterator, {compared} named as /proc names them, renamed since: \
         {renamed_since:?}, left out: {left_out:?}",
        comms.len()
    );
    assert!(compared >= 5, "only {compared} processes compared");
    assert!(renamed_since.len() <= 2, "names differ: {renamed_since:?}");
    assert!(
        left_out.len() <= 1,
        "processes without a record: {left_out:?}"
    );
    assert_eq!(comms.get(2), None, "kthreadd is a kernel thread: no record");

    let name = comm_tag("dbcit");
    let t = Tenancy::new(
        "itercomm",
        &format!("[[tenant]]\nname = \"db\"\nmatch = [{{ comm = '^{name}$' }}]\n\n[tenant.cpu]\nweight = 300\n"),
    );
    let script = format!(
        "import ctypes, time\nctypes.CDLL(None).prctl(15, b'{name}', 0, 0, 0)\ntime.sleep(120)"
    );
    let mut cmd = Command::new(python());
    cmd.args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let renamed = Child::spawn(cmd, &name);
    let comm_is = |want: &str| {
        std::fs::read_to_string(format!("/proc/{}/comm", renamed.pid))
            .is_ok_and(|c| c.trim_end() == want)
    };
    assert!(
        wait_until(Duration::from_secs(10), || comm_is(&name)),
        "python did not rename itself to {name}"
    );
    let mut plans = Vec::new();
    for source in ["iterator", "proc"] {
        let (stdout, stderr) = run_logged(&t, &[], &["plan", "--json"], Some(source));
        assert_eq!(
            stderr.contains("from the task iterator"),
            source == "iterator",
            "comm from {source}: {stderr}"
        );
        let plan: serde_json::Value = serde_json::from_str(&stdout).expect("plan --json");
        let moved: Vec<(u64, String)> = plan["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["action"] == "move")
            .map(|s| {
                (
                    s["pid"].as_u64().unwrap(),
                    s["comm"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        plans.push(moved);
    }
    // In a pid namespace of its own the iterator's pids (the host's) are not /proc's: refused,
    // and the names come from /proc.
    let unshare = ["unshare", "--pid", "--fork", "--mount-proc"];
    let (_, stderr) = run_logged(&t, &unshare, &["plan"], Some("iterator"));
    assert!(
        stderr.contains("in a pid namespace of its own")
            && !stderr.contains("from the task iterator"),
        "plan in a pid namespace: {stderr}"
    );
    println!(
        "moves with comm from the iterator: {:?}, from /proc: {:?}",
        plans[0], plans[1]
    );
    assert_eq!(plans[0], vec![(renamed.pid as u64, name.clone())]);
    assert_eq!(plans[0], plans[1]);
}
