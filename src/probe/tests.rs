//! Unit tests: the knee, the seed-000 histogram layout, units and option parsing, the shape of
//! verify's checks, and the in-use checks on a fixture /sys tree.

use super::report::*;
use super::verify::{bps_block_size, plan_checks, LimitKind};
use super::*;
use crate::kernel::DevNum;
use crate::policy::IoLimits;

fn step(bs: u64, parallelism: usize, p99_us: f64, iops: f64) -> StepResult {
    StepResult {
        bs,
        parallelism,
        seconds: 2.0,
        ios: (iops * 2.0) as u64,
        bytes: (iops * 2.0) as u64 * bs,
        iops,
        mib_s: iops * bs as f64 / (1 << 20) as f64,
        latency_us: Latency {
            mean: p99_us / 3.0,
            min: 1.0,
            p50: p99_us / 4.0,
            p95: p99_us / 2.0,
            p99: p99_us,
            p99_9: p99_us * 2.0,
            max: p99_us * 3.0,
        },
        interrupted: false,
        histogram: Vec::new(),
        buckets: Buckets::default(),
    }
}

#[test]
fn knee_is_the_last_step_before_p99_first_reaches_the_target() {
    assert_eq!(knee_index(&[1.0, 2.0, 5.0, 12.0, 30.0], 10.0), Some(2));
    // A later dip under the target does not count: p99 must *stay* under it.
    assert_eq!(knee_index(&[1.0, 11.0, 5.0, 9.0], 10.0), Some(0));
    // Reaching the target exactly is not under it.
    assert_eq!(knee_index(&[1.0, 10.0], 10.0), Some(0));
    assert_eq!(knee_index(&[15.0, 20.0], 10.0), None);
    assert_eq!(knee_index(&[1.0, 2.0], 10.0), Some(1));
    assert_eq!(knee_index(&[], 10.0), None);
}

#[test]
fn knees_per_block_size_with_throughput_and_bounds() {
    // Seed 004: 1 to 3 cores stay under 10 ms, 4 cores reach it.
    let steps = vec![
        step(1 << 20, 1, 2_000.0, 292.0),
        step(1 << 20, 2, 3_000.0, 582.0),
        step(1 << 20, 4, 11_000.0, 1020.0),
        step(4096, 1, 200.0, 5000.0),
        step(4096, 2, 300.0, 9000.0),
        step(65536, 1, 20_000.0, 100.0),
    ];
    let k = knees(&steps, 10_000.0);
    assert_eq!(k.len(), 3);
    assert_eq!(k[0].bs, 1 << 20);
    assert_eq!(k[0].parallelism, Some(2));
    assert_eq!(k[0].iops, Some(582.0));
    assert!((k[0].mib_s.unwrap() - 582.0).abs() < 1e-9);
    assert!(k[0].bounded);
    // Every step under the target: the knee is the last one, flagged as not bounded.
    assert_eq!(k[1].parallelism, Some(2));
    assert!(!k[1].bounded);
    assert_eq!(k[2].parallelism, None);
    let line = knee_line(&k[0], 10_000.0);
    assert!(
        line.contains("knee at bs 1m: 2 jobs") && line.contains("582 IOPS"),
        "{line}"
    );
    assert!(knee_line(&k[1], 10_000.0).contains("higher --jobs-max"));
    assert!(knee_line(&k[2], 10_000.0).contains("none"));
}

/// The table of seed 000, rebuilt from its own figures, must come out character for character.
/// Seed 000's layout and its figures from 5 ms up; below 5 ms the finer ranges, and every
/// column with its unit.
#[test]
fn histogram_keeps_the_seed_000_layout_with_finer_ranges_and_units() {
    let want = "\
RANGE {min ≤ e < max}  DURATION (s)       %   CALLS  MEAN (ms)   MIN (ms)   MAX (ms)
---------------------  ------------  ------  ------  ---------  ---------  ---------
 1.     0ms    100us       0.000840    0.0%      10      0.084      0.052      0.099
 2.   100us    250us
 3.   250us    500us
 4.   500us      1ms
 5.     1ms      2ms
 6.     2ms      5ms       6.010682    2.0%   2,290      2.625      2.001      4.999
 7.     5ms     10ms      26.712672    9.0%   3,662      7.295      5.002      9.997
 8.    10ms     15ms      12.935713    4.4%   1,090     11.868     10.003     14.998
 9.    15ms     20ms       6.828035    2.3%     398     17.156     15.003     19.980
10.    20ms     25ms       4.846490    1.6%     218     22.232     20.039     24.902
11.    25ms     50ms      17.002454    5.7%     471     36.099     25.085     49.976
12.    50ms    100ms     182.104408   61.6%   2,338     77.889     50.053     99.991
13.   100ms  1,000ms      39.354627   13.3%     326    120.720    100.008    410.570
14. 1,000ms       +∞
---------------------  ------------  ------  ------  ---------  ---------  ---------
TOTAL (14)               295.795921  100.0%  10,803     27.381      0.052    410.570
";
    let rows: [(usize, f64, u64, f64, f64); 9] = [
        (0, 0.000840, 10, 0.000052, 0.000099),
        (5, 6.010682, 2290, 0.002001, 0.004999),
        (6, 26.712672, 3662, 0.005002, 0.009997),
        (7, 12.935713, 1090, 0.010003, 0.014998),
        (8, 6.828035, 398, 0.015003, 0.019980),
        (9, 4.846490, 218, 0.020039, 0.024902),
        (10, 17.002454, 471, 0.025085, 0.049976),
        (11, 182.104408, 2338, 0.050053, 0.099991),
        (12, 39.354627, 326, 0.100008, 0.410570),
    ];
    let mut b = Buckets::default();
    for (i, dur, calls, min, max) in rows {
        b.0[i] = Bucket {
            calls,
            sum_ns: (dur * 1e9).round() as u128,
            min_ns: (min * 1e9).round() as u64,
            max_ns: (max * 1e9).round() as u64,
        };
    }
    assert_eq!(histogram_table(&b), want);
}

#[test]
fn buckets_follow_min_inclusive_max_exclusive() {
    let ms = |m: f64| (m * 1e6) as u64;
    assert_eq!(Buckets::index(0), 0);
    assert_eq!(Buckets::index(ms(0.1) - 1), 0);
    assert_eq!(Buckets::index(ms(0.1)), 1);
    assert_eq!(Buckets::index(ms(0.3)), 2);
    assert_eq!(Buckets::index(ms(5.0) - 1), 5);
    assert_eq!(Buckets::index(ms(5.0)), 6);
    assert_eq!(Buckets::index(ms(24.9)), 9);
    assert_eq!(Buckets::index(ms(25.0)), 10);
    assert_eq!(Buckets::index(ms(999.9)), 12);
    assert_eq!(Buckets::index(ms(1000.0)), 13);
    assert_eq!(Buckets::index(ms(60_000.0)), 13);
    let mut a = Buckets::default();
    a.record(ms(2.0));
    a.record(ms(3.0));
    let mut b = Buckets::default();
    b.record(ms(2.5));
    b.record(ms(7.0));
    a.merge(&b);
    assert_eq!(a.0[5].calls, 3);
    assert_eq!(a.0[5].min_ns, ms(2.0));
    assert_eq!(a.0[5].max_ns, ms(3.0));
    assert_eq!(a.0[6].calls, 1);
    let rows = a.rows();
    assert_eq!(rows[1].min_ms, 0.1);
    assert_eq!(rows[13].max_ms, None);
    let total: f64 = rows.iter().map(|r| r.percent).sum();
    assert!((total - 100.0).abs() < 1e-9);
    // An empty histogram prints the ranges and a bare total.
    let empty = histogram_table(&Buckets::default());
    assert!(empty.ends_with("TOTAL (14)\n"), "{empty}");
}

#[test]
fn thousands_separators() {
    assert_eq!(thousands(0), "0");
    assert_eq!(thousands(999), "999");
    assert_eq!(thousands(1000), "1,000");
    assert_eq!(thousands(10793), "10,793");
    assert_eq!(thousands(1234567), "1,234,567");
}

#[test]
fn block_size_lists_use_binary_units() {
    assert_eq!(
        parse_bs_list("4k,64k,1m").unwrap(),
        vec![4096, 65536, 1 << 20]
    );
    assert_eq!(parse_bs_list("512, 4KiB,4k").unwrap(), vec![512, 4096]);
    for bad in ["", "4k,", "4x", "0", "128m"] {
        let e = parse_bs_list(bad).unwrap_err().0;
        assert!(e.starts_with("--bs"), "{bad}: {e}");
    }
    assert_eq!(bs_label(4096), "4k");
    assert_eq!(bs_label(1 << 20), "1m");
    assert_eq!(bs_label(1536), "1536");
}

#[test]
fn parallelism_steps() {
    assert_eq!(depth_steps(16).unwrap(), vec![1, 2, 4, 8, 16]);
    assert_eq!(depth_steps(1).unwrap(), vec![1]);
    assert_eq!(depth_steps(6).unwrap(), vec![1, 2, 4, 6]);
    assert!(depth_steps(0).is_err());
    assert_eq!(parse_depths("8,1,3,3").unwrap(), vec![1, 3, 8]);
    assert!(parse_depths("0").is_err());
    assert!(parse_depths("two").unwrap_err().0.contains("`two`"));
}

#[test]
fn tolerance_as_percent_or_fraction() {
    assert_eq!(parse_tolerance("10%").unwrap(), 0.1);
    assert_eq!(parse_tolerance("0.05").unwrap(), 0.05);
    assert_eq!(parse_tolerance(" 12.5 % ").unwrap(), 0.125);
    for bad in ["", "ten", "150%", "-1%"] {
        assert!(parse_tolerance(bad).is_err(), "{bad}");
    }
}

#[test]
fn latency_labels() {
    assert_eq!(lat(850.0), "850us");
    assert_eq!(lat(4_200.0), "4.20ms");
    assert_eq!(lat(12_345.0), "12.3ms");
    assert_eq!(lat(1_200_000.0), "1.20s");
}

#[test]
fn verify_shapes_each_check_so_its_own_limit_binds() {
    // 64 IOs per second, between 64k and 1m.
    assert_eq!(bps_block_size(8 << 20, None), 128 << 10);
    assert_eq!(bps_block_size(1 << 20, None), 64 << 10);
    assert_eq!(bps_block_size(1 << 30, None), 1 << 20);
    // With 100 IOPS allowed, 8 MiB/s needs blocks of at least 160 KiB to stay half used.
    assert_eq!(bps_block_size(8 << 20, Some(100)), 256 << 10);

    let dev = DevNum::new(7, 3);
    let limits = IoLimits {
        read_bps: Some(8 << 20),
        read_iops: Some(3000),
        write_bps: Some(4 << 20),
        write_iops: None,
    };
    let (checks, skipped) = plan_checks(dev, "loop3", &limits, 512, 4, None);
    assert_eq!(checks.len(), 2);
    assert_eq!(checks[0].limit, LimitKind::ReadBps);
    assert_eq!(checks[0].rw, Rw::Read);
    assert_eq!(checks[0].target, std::path::PathBuf::from("/dev/loop3"));
    assert_eq!(checks[1].limit, LimitKind::ReadIops);
    assert_eq!((checks[1].rw, checks[1].bs), (Rw::Randread, 4096));
    // 3000 IOs of 4k is 11.7 MiB/s: the 8 MiB/s limit binds first, and verify says so.
    assert!((checks[1].expected - 2048.0).abs() < 1e-9);
    assert!(checks[1].note.as_deref().unwrap().contains("binds first"));
    assert_eq!(skipped.len(), 1);
    assert!(skipped[0].contains("write_bps") && skipped[0].contains("--write"));

    let f = std::path::Path::new("/data/dbcage-test.dat");
    let (checks, skipped) = plan_checks(dev, "loop3", &limits, 4096, 2, Some(f));
    assert!(skipped.is_empty());
    let w = checks
        .iter()
        .find(|c| c.limit == LimitKind::WriteBps)
        .unwrap();
    assert_eq!((w.rw, w.target.as_path(), w.parallelism), (Rw::Write, f, 2));
}

/// A fixture /sys: loop3 (7:3) with partition loop3p1 (259:0), and sdb (8:16) held by dm-0.
fn fixture_sys() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("dbcage-test-sys-")
        .tempdir()
        .unwrap();
    let s = d.path();
    let mk = |p: &str| std::fs::create_dir_all(s.join(p)).unwrap();
    let put = |p: &str, v: &str| std::fs::write(s.join(p), v).unwrap();
    mk("devices/virtual/block/loop3/loop3p1");
    mk("devices/virtual/block/loop3/queue");
    mk("devices/virtual/block/loop3/holders");
    mk("devices/virtual/block/loop3/loop3p1/holders");
    put("devices/virtual/block/loop3/dev", "7:3\n");
    put(
        "devices/virtual/block/loop3/queue/logical_block_size",
        "4096\n",
    );
    put("devices/virtual/block/loop3/loop3p1/dev", "259:0\n");
    put("devices/virtual/block/loop3/loop3p1/partition", "1\n");
    mk("devices/pci/block/sdb/holders/dm-0");
    mk("devices/pci/block/sdb/queue");
    put("devices/pci/block/sdb/dev", "8:16\n");
    put("devices/pci/block/sdb/queue/logical_block_size", "512\n");
    mk("dev/block");
    mk("class/block");
    let link =
        |target: &str, at: &str| std::os::unix::fs::symlink(s.join(target), s.join(at)).unwrap();
    link("devices/virtual/block/loop3", "dev/block/7:3");
    link("devices/virtual/block/loop3/loop3p1", "dev/block/259:0");
    link("devices/pci/block/sdb", "dev/block/8:16");
    link("devices/virtual/block/loop3", "class/block/loop3");
    link("devices/virtual/block/loop3/loop3p1", "class/block/loop3p1");
    link("devices/pci/block/sdb", "class/block/sdb");
    d
}

#[test]
fn devices_in_use_are_found_through_partitions_holders_and_swap() {
    use super::engine::{device_in_use, logical_block_size};
    let sys = fixture_sys();
    let s = sys.path();
    let loop3 = DevNum::new(7, 3);
    let none = "";
    let swaps_header = "Filename\tType\tSize\tUsed\tPriority\n";
    assert_eq!(device_in_use(s, none, swaps_header, loop3), None);
    let mounted = "36 25 259:0 / /srv/dbcage-test rw,relatime shared:1 - ext4 /dev/loop3p1 rw\n";
    let why = device_in_use(s, mounted, swaps_header, loop3).unwrap();
    assert!(
        why.contains("loop3p1") && why.contains("/srv/dbcage-test"),
        "{why}"
    );
    let swap = format!("{swaps_header}/dev/loop3p1 partition 1024 0 -2\n");
    assert!(device_in_use(s, none, &swap, loop3)
        .unwrap()
        .contains("swap"));
    let held = device_in_use(s, none, swaps_header, DevNum::new(8, 16)).unwrap();
    assert!(held.contains("dm-0"), "{held}");
    // A partition's logical block size is its disk's.
    assert_eq!(logical_block_size(s, DevNum::new(259, 0)), Some(4096));
    assert_eq!(logical_block_size(s, DevNum::new(8, 16)), Some(512));
    assert_eq!(logical_block_size(s, DevNum::new(9, 9)), None);
}

/// A loop device (or a partition of one) without direct IO to its backing file gets the
/// page-cache warning; with dio on, or a real disk, none.
#[test]
fn loop_devices_reading_through_the_page_cache_are_flagged() {
    use super::engine::loop_without_direct_io;
    let d = fixture_sys();
    let s = d.path();
    let dev = |t: &str| t.parse::<crate::kernel::DevNum>().unwrap();
    // No loop/ directory: a loop device of a kernel that does not say; nothing to flag.
    assert_eq!(loop_without_direct_io(s, dev("7:3")), None);
    std::fs::create_dir_all(s.join("devices/virtual/block/loop3/loop")).unwrap();
    std::fs::write(
        s.join("devices/virtual/block/loop3/loop/backing_file"),
        "/var/tmp/disk.img\n",
    )
    .unwrap();
    std::fs::write(s.join("devices/virtual/block/loop3/loop/dio"), "0\n").unwrap();
    let w = loop_without_direct_io(s, dev("7:3")).expect("dio 0 is flagged");
    assert!(
        w.starts_with("loop3 reads /var/tmp/disk.img through the page cache"),
        "{w}"
    );
    assert!(w.contains("losetup --direct-io=on /dev/loop3"), "{w}");
    let p = loop_without_direct_io(s, dev("259:0")).expect("a partition of it too");
    assert!(p.starts_with("loop3 reads"), "{p}");
    assert_eq!(loop_without_direct_io(s, dev("8:16")), None);
    std::fs::write(s.join("devices/virtual/block/loop3/loop/dio"), "1\n").unwrap();
    assert_eq!(loop_without_direct_io(s, dev("7:3")), None);
}

/// The plot: throughput on a log axis (4k and 1m both readable), latency and its target on one
/// axis of their own, the knee ringed and named, labels without `.0`.
#[test]
fn plot_has_two_panels_knees_and_plain_labels() {
    let steps: Vec<StepResult> = [(4096, 1, 900.0, 1800.0), (4096, 2, 2_000.0, 3500.0)]
        .into_iter()
        .chain([(1 << 20, 1, 4_000.0, 300.0), (1 << 20, 2, 16_000.0, 420.0)])
        .map(|(bs, jobs, p99, iops)| step(bs, jobs, p99, iops))
        .collect();
    let r = ProbeReport {
        target: engine::Target {
            path: "/dev/loop0".into(),
            kind: engine::Kind::BlockDevice,
            size: 1 << 30,
            logical_block_size: 512,
            missing: false,
            cache_warning: None,
        },
        rw: Rw::Read,
        engine: ENGINE,
        step_seconds: 2.0,
        ramp_seconds: 0.0,
        latency_target_us: 10_000.0,
        interrupted: false,
        knees: report::knees(&steps, 10_000.0),
        steps,
    };
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("p.svg");
    plot::draw(&svg, &r).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    for want in [
        "MiB/s (log scale)",
        "p99 latency, ms",
        "latency target 10 ms",
        "knee 4k (2 jobs)",
        "knee 1m (1 job)",
    ] {
        assert!(text.contains(want), "`{want}` not in the plot");
    }
    let labels = regex::Regex::new(r">-?[0-9]+\.0<").unwrap();
    assert!(
        !labels.is_match(&text),
        "a label ends in .0: {:?}",
        labels.find(&text)
    );
    assert_eq!(plot::axis_label(16000.0), "16k");
    assert_eq!(plot::axis_label(250.0), "250");
    assert_eq!(plot::axis_label(2.5), "2.5");
    assert_eq!(plot::axis_label(3.0), "3");
    assert_eq!(plot::axis_label(0.25), "0.25");
}
