use super::*;
use crate::policy::{Origin, Sourced};

fn guard(pressure: f64) -> PressureGuard {
    let origin = Origin {
        file: std::sync::Arc::new(PathBuf::from("dbcage.toml")),
        line: 1,
        col: 1,
    };
    PressureGuard {
        resource: Resource::Io,
        pressure,
        window: Duration::from_secs(1),
        donors: vec![Sourced {
            value: "batch".into(),
            origin: origin.clone(),
        }],
        lever: GuardLever::Weight,
        origin,
    }
}

#[test]
fn steps_at_most_once_per_window_and_up_to_the_limit() {
    let t0 = Instant::now();
    let w = Duration::from_secs(1);
    let mut e = Episode::default();
    assert!(e.fired(t0, w));
    assert!(
        !e.fired(t0 + Duration::from_millis(400), w),
        "within the window"
    );
    assert!(e.fired(t0 + Duration::from_millis(1000), w));
    assert!(e.fired(t0 + Duration::from_millis(2000), w));
    assert_eq!(e.steps, MAX_STEPS);
    assert!(
        !e.fired(t0 + Duration::from_millis(3000), w),
        "at the limit"
    );
    assert_eq!(
        (lowered(100, 0), lowered(100, 1), lowered(100, 3)),
        (100, 50, 12)
    );
    assert_eq!(lowered(2, 3), 1);
}

#[test]
fn restores_after_quiet_windows_only() {
    let g = guard(0.2);
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let mut e = Episode::default();
    assert!(e.fired(t0, g.window));
    // stalls 50% of the time: no restore
    assert!(!e.observe(ms(0), 10.0, &g, false));
    assert!(!e.observe(ms(500), 10.25, &g, false));
    // quiet (stall share 4%, under half the 20% threshold) from 1000 ms on
    let mut total = 10.25;
    let mut restored_at = None;
    for i in 2..20u64 {
        total += 0.02;
        if e.observe(ms(i * 500), total, &g, false) {
            restored_at = Some(i * 500);
            break;
        }
    }
    // quiet from the 1000 ms reading, restored QUIET_WINDOWS windows later
    assert_eq!(restored_at, Some(1000 + 1000 * QUIET_WINDOWS as u64));
    assert_eq!(e.steps, 0);
    // a share just above half the threshold keeps the donors lowered
    let mut e = Episode::default();
    e.fired(t0, g.window);
    let mut total = 0.0;
    for i in 0..30u64 {
        total += 0.06; // 12% over 500 ms
        assert!(!e.observe(ms(i * 500), total, &g, false), "restored at {i}");
    }
}

#[test]
fn a_pressure_trigger_is_written_as_the_kernel_reads_it() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("io.pressure");
    std::fs::write(&f, "").unwrap();
    arm_trigger(&f, &guard(0.15)).unwrap();
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "some 150000 1000000");
}

#[test]
fn a_busy_donor_holds_the_caps_down() {
    let g = guard(0.2);
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let mut e = Episode::default();
    assert!(e.fired(t0, g.window));
    // quiet pressure, but the donor still presses on its lowered cap: held for a minute
    let mut total = 0.0;
    for i in 0..120u64 {
        total += 0.001;
        assert!(!e.observe(ms(i * 500), total, &g, true), "restored at {i}");
    }
    assert_eq!(e.steps, 1);
    // the flood ends: restored QUIET_WINDOWS windows after the first quiet reading
    let mut restored_at = None;
    for i in 120..200u64 {
        total += 0.001;
        if e.observe(ms(i * 500), total, &g, false) {
            restored_at = Some(i * 500);
            break;
        }
    }
    assert_eq!(restored_at, Some(60_000 + 1000 * QUIET_WINDOWS as u64));
}

#[test]
fn caps_halve_each_set_key_and_keep_at_least_one() {
    let base = IoLimits {
        read_bps: Some(400 << 20),
        read_iops: Some(2000),
        write_iops: Some(3),
        write_bps: None,
    };
    let c = lowered_caps(&base, 2);
    assert_eq!(
        (c.read_bps, c.write_bps, c.read_iops, c.write_iops),
        (Some(100 << 20), None, Some(500), Some(1))
    );
    assert_eq!(
        caps_text(&c),
        "read_bps 100MiB/s, read_iops 500, write_iops 1"
    );
    let grown = IoCounters {
        read_ios: 400,
        ..Default::default()
    };
    assert!(presses_on(&c, &grown, 1.0), "400 IO/s on a 500 cap");
    assert!(!presses_on(&c, &grown, 2.0), "200 IO/s on a 500 cap");
    assert!(!presses_on(&IoLimits::default(), &grown, 1.0), "no caps");
}

fn policy(text: &str) -> Policy {
    match crate::policy::from_str("dbcage.toml", text, &crate::policy::FakeAccounts) {
        Ok(l) => std::sync::Arc::unwrap_or_clone(l.policy),
        Err(e) => panic!("{e}"),
    }
}

/// A tenant's io.pressure or cpu.pressure with `total` µs stalled.
fn pressure_text(total: u64) -> String {
    format!("some avg10=0.00 avg60=0.00 avg300=0.00 total={total}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
}

#[test]
fn a_cpu_guard_halves_the_donors_cpu_weight_apart_from_the_io_guard_and_restores_it() {
    let p = policy(
        r#"
[[tenant]]
name = "db"
match = [{ comm = "db" }]
storage = ["/data"]
[tenant.io]
protect_pressure = "20%"
protect_donors = ["batch"]
[tenant.cpu]
protect_pressure = "30%"
protect_donors = ["batch"]

[[tenant]]
name = "batch"
match = [{ comm = "batch" }]
storage = ["/data"]
[tenant.io]
weight = 200
[tenant.cpu]
weight = 400
"#,
    );
    let tmp = tempfile::tempdir().unwrap();
    let (io_file, cpu_file) = (
        tmp.path().join("io.pressure"),
        tmp.path().join("cpu.pressure"),
    );
    std::fs::write(&io_file, pressure_text(0)).unwrap();
    std::fs::write(&cpu_file, pressure_text(0)).unwrap();
    let (io_key, cpu_key) = (
        ("db".to_string(), Resource::Io),
        ("db".to_string(), Resource::Cpu),
    );
    let mut guard = Guard::default();
    let io = p.tenants[0].io_guard.clone().unwrap();
    let cpu = p.tenants[0].cpu_guard.clone().unwrap();
    assert_eq!((io.resource, cpu.resource), (Resource::Io, Resource::Cpu));
    guard
        .watches
        .insert(io_key.clone(), Watch::new(io, io_file.clone(), Vec::new()));
    guard.watches.insert(
        cpu_key.clone(),
        Watch::new(cpu, cpu_file.clone(), Vec::new()),
    );
    let t0 = Instant::now();
    let s = |n: u64| t0 + Duration::from_millis(n);
    // cpu pressure twice, io once: each lever follows its own guard
    assert!(guard.fired(&p, &cpu_key, s(0)));
    assert!(!guard.fired(&p, &cpu_key, s(300)), "within the window");
    assert!(guard.fired(&p, &cpu_key, s(1000)));
    assert!(guard.fired(&p, &io_key, s(1000)));
    let mut adjust = crate::engine::Adjustments::default();
    guard.adjust(&p, &mut adjust);
    assert_eq!(adjust.cpu_weights, [("batch".to_string(), 100)].into());
    assert_eq!(adjust.weights, [("batch".to_string(), 100)].into());
    assert!(adjust.caps.is_empty());
    let planned = adjust.policy(&p);
    assert_eq!(planned.tenants[1].cpu.weight, Some(100));
    assert_eq!(
        planned.tenants[0].cpu.weight, None,
        "the protected tenant keeps its own"
    );
    let st = guard.state(&p);
    let (io_st, cpu_st) = (&st["db"][0], &st["db"][1]);
    assert_eq!((io_st.resource, io_st.step), (Resource::Io, 1));
    assert_eq!(
        (cpu_st.resource, cpu_st.step, cpu_st.lowerings),
        (Resource::Cpu, 2, 2)
    );
    assert_eq!(cpu_st.lowered, [("batch".to_string(), 100)].into());

    assert_eq!(
        base_cpu_weight(&p, "db"),
        100,
        "no cpu.weight: the kernel's 100"
    );
    let mut restored = Vec::new();
    // cpu pressure stalls 50% for a while: nothing restored; then quiet: the cpu.weight comes
    // back QUIET_WINDOWS windows after the first quiet tick, in one change, and the io guard's
    // weight stays lowered (its io pressure stays at 50%)
    let (mut cpu_total, mut io_total) = (0u64, 0u64);
    for i in 2..30u64 {
        io_total += 250_000;
        cpu_total += if i < 6 { 250_000 } else { 1_000 }; // 50%, then 0.2% of each tick
        std::fs::write(&io_file, pressure_text(io_total)).unwrap();
        std::fs::write(&cpu_file, pressure_text(cpu_total)).unwrap();
        let changed = guard.tick(&p, s(i * 500));
        if i < 6 {
            assert!(!changed, "restored under pressure at {i}");
        } else if changed {
            restored.push(i * 500);
        }
    }
    assert_eq!(restored, vec![3000 + 1000 * u64::from(QUIET_WINDOWS)]);
    let mut adjust = crate::engine::Adjustments::default();
    guard.adjust(&p, &mut adjust);
    assert!(adjust.cpu_weights.is_empty());
    assert_eq!(adjust.weights, [("batch".to_string(), 100)].into());
    assert_eq!(adjust.policy(&p).tenants[1].cpu.weight, Some(400));
    let st = guard.state(&p);
    assert_eq!((st["db"][1].step, st["db"][1].restores), (0, 1));
}

#[test]
fn a_cpu_guard_watches_cpu_pressure() {
    let tmp = tempfile::tempdir().unwrap();
    let f = tmp.path().join("cpu.pressure");
    std::fs::write(&f, "").unwrap();
    let mut g = guard(0.3);
    g.resource = Resource::Cpu;
    arm_trigger(&f, &g).unwrap();
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "some 300000 1000000");
    assert_eq!(lever_name(&g), "cpu.weight");
    assert_eq!(lowered(400, 3), 50);
}

#[test]
fn a_cpu_guard_holds_the_weight_down_while_the_donors_still_spin() {
    assert!(still_busy(&[1.6], &[1.3], 0.01), "the hogs run on");
    assert!(!still_busy(&[1.6], &[0.1], 0.01), "the hogs stopped");
    assert!(
        !still_busy(&[0.0], &[0.0], 0.01),
        "an idle donor never holds it"
    );
    let tmp = tempfile::tempdir().unwrap();
    let stat = tmp.path().join("cpu.stat");
    let mut g = guard(0.2);
    g.resource = Resource::Cpu;
    let mut w = Watch::new(
        g.clone(),
        tmp.path().join("cpu.pressure"),
        vec![("batch".into(), stat.clone())],
    );
    w.episode.fired(Instant::now(), g.window);
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let mut used = 0u64;
    let mut at = |w: &mut Watch, n: u64, cpus: f64| {
        used += (cpus * 500_000.0) as u64;
        std::fs::write(
            &stat,
            format!("usage_usec {used}\nuser_usec 0\nsystem_usec 0\n"),
        )
        .unwrap();
        w.donors_busy(Usage::Cpu, ms(n))
    };
    assert!(at(&mut w, 0, 1.6), "first tick: the counters");
    assert!(at(&mut w, 500, 1.6), "second tick: the reference");
    assert!(at(&mut w, 1000, 1.5), "still 94% of the reference");
    assert!(!at(&mut w, 1500, 0.05), "the hogs stopped");
    assert_eq!(cpu_seconds(&tmp.path().join("none")), None);
}

#[test]
fn an_io_weight_guard_holds_the_weight_down_while_the_donors_still_flood() {
    let tmp = tempfile::tempdir().unwrap();
    let stat = tmp.path().join("io.stat");
    let g = guard(0.2);
    assert_eq!(g.lever, GuardLever::Weight);
    let mut w = Watch::new(
        g.clone(),
        tmp.path().join("io.pressure"),
        vec![("batch".into(), stat.clone())],
    );
    w.episode.fired(Instant::now(), g.window);
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let (mut reads, mut writes) = (0u64, 0u64);
    // IOPS over each 500-ms tick, split over two devices' lines
    let mut at = |w: &mut Watch, n: u64, iops: u64| {
        reads += iops / 2 * 3 / 4;
        writes += iops / 2 / 4;
        std::fs::write(
            &stat,
            format!(
                "8:0 rbytes=0 wbytes=0 rios={reads} wios={writes} dbytes=0 dios=0\n\
                 8:16 rbytes=0 wbytes=0 rios={reads} wios={writes} dbytes=0 dios=0\n"
            ),
        )
        .unwrap();
        w.donors_busy(Usage::IoRequests, ms(n))
    };
    assert!(at(&mut w, 0, 4000), "first tick: the counters");
    assert!(at(&mut w, 500, 4000), "second tick: the reference");
    assert!(
        at(&mut w, 1000, 3600),
        "still 90% of the reference: the flood goes on"
    );
    assert!(!at(&mut w, 1500, 400), "the flood ended");
    assert_eq!(io_requests(&tmp.path().join("none")), None);
}
