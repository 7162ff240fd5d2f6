use super::*;
use chrono::Utc;

fn values(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const POLICY: &str = r#"
[[tenant]]
name = "DEMO"
match = [{ comm = "^x$" }]
storage = ["/"]
[tenant.io]
read_bps = "50MiB"
[tenant.cpu]
cores = 2
[tenant.memory]
max = "4GiB"

[[tenant.schedule]]
days = "Mon-Fri"
from = "22:00"
to = "06:00"
io.read_bps = "400MiB"
cpu.cores = 4
"#;

fn live() -> Live {
    Live {
        config: PathBuf::from("/nonexistent/dbcage.toml"),
        trust: crate::policy::FileTrust::RootOnly,
        sources: vec![(PathBuf::from("/nonexistent/dbcage.toml"), POLICY.into())],
        runtime: BTreeMap::new(),
        windows: Vec::new(),
        next_change: None,
    }
}

#[test]
fn fragments_carry_only_limit_keys_and_encode_values() {
    let f = fragment(
        "DEMO",
        &values(&[
            ("io.read_bps", "200MiB"),
            ("cpu.cores", "1.5"),
            ("cpu.weight", "300"),
            ("cpu.cpus", "0-3"),
            ("cpu.numa_nodes", "0,1"),
        ]),
    )
    .unwrap();
    let t: toml::Table = f.parse().unwrap();
    let tenant = &t["tenant"][0];
    assert_eq!(tenant["name"].as_str(), Some("DEMO"));
    assert_eq!(tenant["io"]["read_bps"].as_str(), Some("200MiB"));
    assert_eq!(tenant["cpu"]["cores"].as_float(), Some(1.5));
    assert_eq!(tenant["cpu"]["weight"].as_integer(), Some(300));
    assert_eq!(tenant["cpu"]["cpus"].as_str(), Some("0-3"));
    assert_eq!(tenant["cpu"]["numa_nodes"].as_array().unwrap().len(), 2);
    assert_eq!(
        fragment_values(&f),
        values(&[
            ("io.read_bps", "200MiB"),
            ("cpu.cores", "1.5"),
            ("cpu.weight", "300"),
            ("cpu.cpus", "0-3"),
            ("cpu.numa_nodes", "0,1"),
        ])
    );
    for (k, v) in [
        ("match", "x"),
        ("storage", "/"),
        ("io.device", "/dev/sda"),
        ("agent.root", "x"),
        ("io.read_bps.x", "1"),
    ] {
        let e = fragment("DEMO", &values(&[(k, v)])).unwrap_err();
        assert!(e.contains("cannot be set"), "{k}: {e}");
    }
    // A value cannot break out of its string.
    let f = fragment("DEMO", &values(&[("cpu.cpus", "0\"\n[agent]\nroot = \"x")]));
    assert!(f.is_err(), "control characters refused");
    let f = fragment("DEMO", &values(&[("cpu.cpus", "0\" ] [agent] root = \"x")])).unwrap();
    let t: toml::Table = f.parse().unwrap();
    assert!(t.get("agent").is_none());
    assert!(fragment("DEMO", &values(&[("cpu.numa_nodes", "0,x")])).is_err());
}

#[test]
fn tenant_names_that_would_be_paths_are_refused() {
    for bad in [
        "../x",
        "..",
        "a/b",
        "/etc",
        ".hidden",
        "x\0y",
        "",
        "cpu.shares",
        "tasks",
    ] {
        assert!(
            fragment(bad, &values(&[("cpu.cores", "1")])).is_err(),
            "{bad:?}"
        );
        let l = live();
        let policy = l.effective().unwrap().policy;
        let op = Op::Set {
            tenant: bad.into(),
            values: values(&[("cpu.cores", "1")]),
            persist: true,
            also: BTreeMap::new(),
            dry_run: false,
        };
        let e = plan_change(&l, &policy, &op).err().unwrap();
        assert!(
            e.contains("tenant name") || e.contains("no tenant"),
            "{bad:?}: {e}"
        );
    }
}

#[test]
fn set_is_validated_as_the_policy_is_and_wins_over_files_and_windows() {
    let l = live();
    let policy = l.effective().unwrap().policy;
    assert_eq!(policy.tenants[0].io.read_bps, Some(50 << 20));
    let op = |pairs: &[(&str, &str)]| Op::Set {
        tenant: "DEMO".into(),
        values: values(pairs),
        persist: false,
        also: BTreeMap::new(),
        dry_run: false,
    };
    let c = plan_change(
        &l,
        &policy,
        &op(&[("io.read_bps", "200MiB"), ("cpu.cpus", "0-1")]),
    )
    .unwrap()
    .unwrap();
    let t = &c.loaded.policy.tenants[0];
    assert_eq!(t.io.read_bps, Some(200 << 20));
    assert_eq!(t.cpu.cores, Some(2.0), "keys not given stay");
    assert_eq!(t.cpu.cpus.as_ref().unwrap().value.to_string(), "0-1");
    assert!(c.files.is_empty());
    // The same messages as for the file, with the key's place.
    for (k, v, want) in [
        ("cpu.cores", "0", "out of range"),
        ("cpu.weight", "0", "1 to 10000"),
        ("cpu.cpus", "3-1", "cpu.cpus"),
        ("cpu.cpus", "../../x", "cpu.cpus"),
        ("memory.low", "8GiB", "above memory.max"),
        ("io.read_bps", "lots", "io.read_bps"),
        ("io.read_bps", "0", "would stop"),
    ] {
        let e = plan_change(&l, &policy, &op(&[(k, v)])).err().unwrap();
        assert!(e.contains(want), "{k}={v}: {e}");
        assert!(
            e.contains("\n  dbcage set DEMO: tenant `DEMO`"),
            "{k}={v}: the error names its source, without a line of text dbcage wrote: {e}"
        );
        assert!(
            !e.contains("nothing was"),
            "{k}={v}: `handle` says it once: {e}"
        );
    }
    // A window in force, then set on top of it.
    let mut w = l.clone();
    w.windows = vec![("DEMO".into(), 0)];
    let p = w.effective().unwrap().policy;
    assert_eq!(p.tenants[0].io.read_bps, Some(400 << 20));
    assert_eq!(p.tenants[0].cpu.cores, Some(4.0));
    let c = plan_change(&w, &p, &op(&[("cpu.cores", "8")]))
        .unwrap()
        .unwrap();
    assert_eq!(c.loaded.policy.tenants[0].cpu.cores, Some(8.0));
    assert_eq!(c.loaded.policy.tenants[0].io.read_bps, Some(400 << 20));
    let o = c.live.overrides(&c.loaded.policy);
    let find = |k: &str| o.iter().find(|x| x.key == k).unwrap();
    assert_eq!(find("cpu.cores").source, "runtime");
    assert_eq!(find("cpu.cores").value, "8");
    assert_eq!(find("io.read_bps").source, "schedule");
    assert!(find("io.read_bps").detail.contains("Mon-Fri 22:00-06:00"));
    // Reset drops the runtime values; the window stays.
    let r = plan_change(
        &c.live,
        &c.loaded.policy,
        &Op::Reset {
            tenant: "DEMO".into(),
            persist: false,
            keys: vec![],
        },
    )
    .unwrap()
    .unwrap();
    assert_eq!(r.loaded.policy.tenants[0].cpu.cores, Some(4.0));
    assert!(r.live.runtime.is_empty());
}

#[test]
fn persist_builds_a_dropin_that_validates_and_merges_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("dbcage.toml");
    let mut l = live();
    l.config = config.clone();
    l.sources[0].0 = config.clone();
    let later = policy::dropin_dir(&config).join("95-late.toml");
    l.sources.push((
        later.clone(),
        "[[tenant]]\nname = \"DEMO\"\n[tenant.memory]\nhigh = \"1GiB\"\n".into(),
    ));
    let policy = l.effective().unwrap().policy;
    let op = Op::Set {
        tenant: "DEMO".into(),
        values: values(&[("memory.high", "2GiB")]),
        persist: true,
        also: BTreeMap::new(),
        dry_run: false,
    };
    let c = plan_change(&l, &policy, &op).unwrap().unwrap();
    let (path, text) = c.files[0].clone();
    assert_eq!(path, persist_path(&config, "DEMO"));
    assert!(path.ends_with("conf.d/90-set-DEMO.toml"));
    assert_eq!(c.live.sources[1].0, path, "90-set-* sorts before 95-late");
    assert_eq!(
        c.loaded.policy.tenants[0].memory.high,
        Some(1 << 30),
        "a later drop-in still wins over a persisted set"
    );
    write_dropin(&path, text.as_deref()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let md = std::fs::metadata(&path).unwrap();
    assert_eq!(md.permissions().mode() & 0o777, 0o600);
    let on_disk = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        fragment_values(&on_disk),
        values(&[("memory.high", "2GiB")])
    );
    let o = c.live.overrides(&c.loaded.policy);
    assert_eq!(o[0].source, "persisted");
    // Reset --persist removes it.
    let r = plan_change(
        &c.live,
        &c.loaded.policy,
        &Op::Reset {
            tenant: "DEMO".into(),
            persist: true,
            keys: vec![],
        },
    )
    .unwrap()
    .unwrap();
    assert_eq!(r.files, vec![(path.clone(), None)]);
    write_dropin(&path, None).unwrap();
    assert!(!path.exists());
}

#[test]
fn assignments_parse() {
    let w = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        parse_assignments(&w(&["io.read_bps=200MiB", "cpu.cpus=0-31"])).unwrap(),
        values(&[("io.read_bps", "200MiB"), ("cpu.cpus", "0-31")])
    );
    assert!(parse_assignments(&w(&["cpu.cores"])).is_err());
    assert!(parse_assignments(&w(&["cpu.cores=1", "cpu.cores=2"])).is_err());
}

#[test]
fn only_root_and_the_control_group_are_authorized() {
    assert!(server::authorized(0, 0, None));
    assert!(!server::authorized(65534, 65534, None));
    assert!(
        server::authorized(65534, 4242, Some(4242)),
        "primary gid of the peer"
    );
    assert!(!server::authorized(65534, 65534, Some(4242)));
}

/// A governor that records what it would apply.
struct Recorder {
    live: Live,
    policy: std::sync::Arc<Policy>,
    applied: Vec<std::sync::Arc<Policy>>,
}

impl Governor for Recorder {
    type Staged = Loaded;
    fn live(&self) -> &Live {
        &self.live
    }
    fn live_mut(&mut self) -> &mut Live {
        &mut self.live
    }
    fn current(&self) -> &Policy {
        &self.policy
    }
    fn stage(&mut self, loaded: Loaded) -> Result<Loaded> {
        Ok(loaded)
    }
    fn commit(&mut self, live: Live, staged: Loaded) -> Vec<String> {
        self.live = live;
        self.policy = staged.policy.clone();
        self.applied.push(staged.policy);
        Vec::new()
    }
}

#[test]
fn windows_open_and_close_through_the_override_path_with_an_injected_clock() {
    use chrono::TimeZone;
    use chrono_tz::Europe::Berlin;
    let at = |d: u32, h: u32, m: u32| Berlin.with_ymd_and_hms(2026, 3, d, h, m, 0).unwrap();
    // 2026-03-09 is a Monday.
    let (live, loaded) = live().rewindowed(&at(9, 21, 0)).unwrap();
    assert!(live.windows.is_empty());
    assert_eq!(
        live.next_change,
        Some(at(9, 22, 0).with_timezone(&Utc)),
        "the next boundary, computed rather than polled"
    );
    let mut g = Recorder {
        live,
        policy: loaded.policy,
        applied: Vec::new(),
    };
    let cores = |p: &Policy| p.tenants[0].cpu.cores;
    let bps = |p: &Policy| p.tenants[0].io.read_bps;
    assert_eq!(
        tick(&mut g, &at(9, 21, 30)),
        None,
        "no change, nothing applied"
    );
    assert!(g.applied.is_empty());
    let line = tick(&mut g, &at(9, 22, 0)).expect("the window opens");
    assert!(line.contains("DEMO: Mon-Fri 22:00-06:00"), "{line}");
    assert_eq!(cores(&g.policy), Some(4.0));
    assert_eq!(bps(&g.policy), Some(400 << 20));
    assert_eq!(g.live.next_change, Some(at(10, 6, 0).with_timezone(&Utc)));
    // A runtime value set inside the window wins over it, and survives the window's end.
    let r = handle(
        &mut g,
        &Op::Set {
            tenant: "DEMO".into(),
            values: values(&[("cpu.cores", "8")]),
            persist: false,
            also: BTreeMap::new(),
            dry_run: false,
        },
        Instant::now(),
    );
    assert!(r.ok, "{r:?}");
    assert_eq!(cores(&g.policy), Some(8.0));
    let line = tick(&mut g, &at(10, 6, 0)).expect("the window closes");
    assert!(line.contains("in force: none"), "{line}");
    assert_eq!(cores(&g.policy), Some(8.0));
    assert_eq!(bps(&g.policy), Some(50 << 20));
    // Friday night's window lasts into Saturday; Saturday night has none.
    let _ = tick(&mut g, &at(13, 22, 0));
    assert_eq!(bps(&g.policy), Some(400 << 20));
    let _ = tick(&mut g, &at(14, 6, 0));
    assert_eq!(bps(&g.policy), Some(50 << 20));
    assert_eq!(
        g.live.next_change,
        Some(at(16, 22, 0).with_timezone(&Utc)),
        "after Saturday 06:00 the next boundary is Monday 22:00"
    );
    assert_eq!(g.applied.len(), 5);
}

#[test]
fn reset_of_some_keys_keeps_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("dbcage.toml");
    let mut l = live();
    l.config = config.clone();
    l.sources[0].0 = config.clone();
    let policy = l.effective().unwrap().policy;
    let set = |l: &Live, p: &Policy, pairs: &[(&str, &str)], persist: bool| {
        plan_change(
            l,
            p,
            &Op::Set {
                tenant: "DEMO".into(),
                values: values(pairs),
                persist,
                also: BTreeMap::new(),
                dry_run: false,
            },
        )
        .unwrap()
        .unwrap()
    };
    let reset = |l: &Live, p: &Policy, keys: &[&str], persist: bool| {
        plan_change(
            l,
            p,
            &Op::Reset {
                tenant: "DEMO".into(),
                persist,
                keys: keys.iter().map(|k| k.to_string()).collect(),
            },
        )
    };
    // Persisted memory.max and cpu.cores, then runtime io.read_bps and cpu.cores.
    let a = set(
        &l,
        &policy,
        &[("memory.max", "8GiB"), ("cpu.cores", "3")],
        true,
    );
    let mut l2 = a.live.clone();
    let b = set(
        &l2,
        &a.loaded.policy,
        &[("io.read_bps", "200MiB"), ("cpu.cores", "6")],
        false,
    );
    l2 = b.live.clone();
    let p2 = b.loaded.policy.clone();
    assert_eq!(p2.tenants[0].cpu.cores, Some(6.0));

    // Runtime io.read_bps goes back to the file's 50MiB; cpu.cores stays at 6.
    let r = reset(&l2, &p2, &["io.read_bps"], false).unwrap().unwrap();
    assert_eq!(r.loaded.policy.tenants[0].io.read_bps, Some(50 << 20));
    assert_eq!(r.loaded.policy.tenants[0].cpu.cores, Some(6.0));
    assert!(r.files.is_empty());
    assert_eq!(
        r.message,
        "tenant `DEMO`: runtime override of io.read_bps dropped"
    );

    // cpu.cores without --persist: the runtime 6 goes, the persisted 3 is in force again and
    // the message says it stays.
    let r = reset(&l2, &p2, &["cpu.cores"], false).unwrap().unwrap();
    assert_eq!(r.loaded.policy.tenants[0].cpu.cores, Some(3.0));
    assert!(
        r.message.contains("the persisted cpu.cores in"),
        "{}",
        r.message
    );
    assert!(
        r.message.ends_with("stays (add --persist to remove it)"),
        "{}",
        r.message
    );

    // With --persist: the file keeps memory.max only; the policy's cores = 2 is back.
    let r = reset(&l2, &p2, &["cpu.cores"], true).unwrap().unwrap();
    assert_eq!(r.loaded.policy.tenants[0].cpu.cores, Some(2.0));
    assert_eq!(
        r.loaded.policy.tenants[0]
            .memory
            .max
            .as_ref()
            .map(|m| m.value),
        Some(8 << 30)
    );
    assert_eq!(r.loaded.policy.tenants[0].io.read_bps, Some(200 << 20));
    let (path, text) = r.files[0].clone();
    assert_eq!(path, persist_path(&config, "DEMO"));
    assert_eq!(
        fragment_values(text.as_deref().unwrap()),
        values(&[("memory.max", "8GiB")])
    );
    // Its last key: the file goes.
    let r2 = reset(&r.live, &r.loaded.policy, &["memory.max"], true)
        .unwrap()
        .unwrap();
    assert_eq!(r2.files, vec![(path, None)]);
    assert_eq!(
        r2.loaded.policy.tenants[0]
            .memory
            .max
            .as_ref()
            .map(|m| m.value),
        Some(4 << 30)
    );

    // A key nothing overrides, and one `set` does not know.
    let r = reset(&l, &policy, &["memory.high"], false)
        .unwrap()
        .unwrap();
    assert_eq!(
        r.message,
        "tenant `DEMO` has no runtime override of memory.high"
    );
    let Err(e) = reset(&l, &policy, &["io.bogus"], false) else {
        panic!("an unknown key was accepted");
    };
    assert!(
        e.starts_with("`io.bogus` cannot be reset; the keys are io.read_bps"),
        "{e}"
    );
}

/// How requests read in the daemon's log: as the command a user typed, not Rust's Debug.
#[test]
fn ops_read_as_commands_in_the_log() {
    let set = Op::Set {
        tenant: "pg15".into(),
        values: [("io.read_bps".to_string(), "200MiB".to_string())]
            .into_iter()
            .collect(),
        persist: true,
        also: BTreeMap::new(),
        dry_run: false,
    };
    assert_eq!(set.to_string(), "set pg15 io.read_bps=200MiB (persist)");
    let reset = Op::Reset {
        tenant: "pg15".into(),
        persist: false,
        keys: vec!["io.read_bps".into()],
    };
    assert_eq!(reset.to_string(), "reset pg15 io.read_bps");
    assert_eq!(Op::Reload {}.to_string(), "reload");
    assert!(Op::Health {}.is_query() && Op::Overrides {}.is_query());
    assert!(!set.is_query() && !Op::Reload {}.is_query());
}

/// Seed 002's live swap: `set A cpu.cores=1 B cpu.cores=2` is one change (validated and applied
/// together, or refused whole); `--dry-run` applies nothing; `cpu.numa_nodes` pins a tenant the
/// files place with `numa = "auto"`.
#[test]
fn set_of_several_tenants_is_all_or_nothing_and_a_dry_run_changes_nothing() {
    let text = |name: &str, cores: u32| {
        format!("[[tenant]]\nname = \"{name}\"\nmatch = [{{ comm = \"^{name}$\" }}]\n[tenant.cpu]\ncores = {cores}\nnuma = \"auto\"\n")
    };
    let mut l = live();
    l.sources = vec![(
        PathBuf::from("/nonexistent/dbcage.toml"),
        format!("{}{}", text("A", 2), text("B", 1)),
    )];
    let loaded = l.effective().unwrap();
    let mut g = Recorder {
        live: l,
        policy: loaded.policy,
        applied: Vec::new(),
    };
    let swap = |a: &str, b: &str, dry_run: bool| Op::Set {
        tenant: "A".into(),
        values: values(&[("cpu.cores", a)]),
        also: [("B".to_string(), values(&[("cpu.cores", b)]))].into(),
        persist: false,
        dry_run,
    };
    let cores = |p: &Policy| {
        p.tenants
            .iter()
            .map(|t| t.cpu.cores.unwrap())
            .collect::<Vec<_>>()
    };
    // one bad value refuses the whole change: A keeps its 2 cores too
    let r = handle(&mut g, &swap("1", "0", false), Instant::now());
    assert!(!r.ok && r.message.contains("nothing was changed"), "{r:?}");
    assert!(r.message.contains("tenant `B`"), "{}", r.message);
    assert!(g.applied.is_empty() && g.live.runtime.is_empty());
    let r = handle(&mut g, &swap("1", "2", true), Instant::now());
    assert!(
        r.ok && r.message.contains("dry run: nothing was changed"),
        "{r:?}"
    );
    assert!(g.applied.is_empty() && g.live.runtime.is_empty());
    let r = handle(&mut g, &swap("1", "2", false), Instant::now());
    assert!(r.ok, "{r:?}");
    assert!(
        r.message.contains("tenant `A`: cpu.cores=1")
            && r.message.contains("tenant `B`: cpu.cores=2"),
        "{}",
        r.message
    );
    assert_eq!(g.applied.len(), 1, "one apply for both");
    assert_eq!(cores(&g.policy), [1.0, 2.0]);
    // naming the nodes of an auto tenant pins it (no "both set" refusal)
    let pin = Op::Set {
        tenant: "A".into(),
        values: values(&[("cpu.numa_nodes", "1")]),
        also: BTreeMap::new(),
        persist: false,
        dry_run: false,
    };
    let r = handle(&mut g, &pin, Instant::now());
    assert!(r.ok, "{r:?}");
    let a = &g.policy.tenants[0];
    assert_eq!(a.cpu.numa_nodes.as_ref().unwrap().value.to_string(), "1");
    assert!(a.cpu.numa_auto.is_none());
    assert!(g.policy.tenants[1].cpu.numa_auto.is_some());
    // under the daemon, `apply --migrate-memory` is this key
    let migrate = |v: &str| Op::Set {
        tenant: "B".into(),
        values: values(&[("cpu.migrate_memory", v)]),
        also: BTreeMap::new(),
        persist: false,
        dry_run: false,
    };
    let r = handle(&mut g, &migrate("maybe"), Instant::now());
    assert!(r.message.contains("`maybe` is not true or false"), "{r:?}");
    assert!(handle(&mut g, &migrate("true"), Instant::now()).ok);
    assert!(g.policy.tenants[1].cpu.migrate_memory);
}

#[test]
fn set_words_name_tenants_and_their_pairs() {
    let words = |w: &str| w.split(' ').map(String::from).collect::<Vec<_>>();
    let g = parse_tenant_assignments("A", &words("cpu.cores=1 B cpu.cores=2 io.read_bps=1MiB"))
        .unwrap();
    assert_eq!(g.len(), 2);
    assert_eq!((g[0].0.as_str(), g[0].1.len()), ("A", 1));
    assert_eq!((g[1].0.as_str(), g[1].1.len()), ("B", 2));
    for (w, want) in [
        ("cpu.cores=1 B", "tenant `B` has no KEY=VALUE"),
        ("B cpu.cores=1", "tenant `A` has no KEY=VALUE"),
        (
            "cpu.cores=1 B cpu.cores=2 A cpu.cores=3",
            "`A` is named twice",
        ),
        (
            "cpu.cores=1 cpu.cores=2",
            "tenant `A`: `cpu.cores` is given twice",
        ),
    ] {
        let e = parse_tenant_assignments("A", &words(w)).unwrap_err();
        assert!(e.contains(want), "{w}: {e}");
    }
}
