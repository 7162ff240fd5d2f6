use super::*;
use crate::policy::{Origin, Sourced};

fn guard(pressure: f64) -> IoGuard {
    let origin = Origin {
        file: std::sync::Arc::new(PathBuf::from("dbcage.toml")),
        line: 1,
        col: 1,
    };
    IoGuard {
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
