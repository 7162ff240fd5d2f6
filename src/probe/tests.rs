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
        line.contains("parallelism 2") && line.contains("582 IOPS"),
        "{line}"
    );
    assert!(knee_line(&k[1], 10_000.0).contains("higher --depth-max"));
    assert!(knee_line(&k[2], 10_000.0).contains("none"));
}

/// The table of seed 000, rebuilt from its own figures, must come out character for character.
#[test]
fn histogram_reproduces_the_seed_000_layout() {
    let seed = "\
RANGE {min ≤ e < max}    DURATION       %   CALLS      MEAN       MIN       MAX
---------------------  ----------  ------  ------  --------  --------  --------
 1.     0ms      5ms     6.010682    2.0%   2,290  0.002625  0.000252  0.004999
 2.     5ms     10ms    26.712672    9.0%   3,662  0.007295  0.005002  0.009997
 3.    10ms     15ms    12.935713    4.4%   1,090  0.011868  0.010003  0.014998
 4.    15ms     20ms     6.828035    2.3%     398  0.017156  0.015003  0.019980
 5.    20ms     25ms     4.846490    1.6%     218  0.022232  0.020039  0.024902
 6.    25ms     50ms    17.002454    5.7%     471  0.036099  0.025085  0.049976
 7.    50ms    100ms   182.104408   61.6%   2,338  0.077889  0.050053  0.099991
 8.   100ms  1,000ms    39.354627   13.3%     326  0.120720  0.100008  0.410570
 9. 1,000ms       +∞
---------------------  ----------  ------  ------  --------  --------  --------
TOTAL (9)              295.795081  100.0%  10,793  0.027406  0.000252  0.410570
";
    let rows: [(f64, u64, f64, f64); 8] = [
        (6.010682, 2290, 0.000252, 0.004999),
        (26.712672, 3662, 0.005002, 0.009997),
        (12.935713, 1090, 0.010003, 0.014998),
        (6.828035, 398, 0.015003, 0.019980),
        (4.846490, 218, 0.020039, 0.024902),
        (17.002454, 471, 0.025085, 0.049976),
        (182.104408, 2338, 0.050053, 0.099991),
        (39.354627, 326, 0.100008, 0.410570),
    ];
    let mut b = Buckets::default();
    for (i, (dur, calls, min, max)) in rows.iter().enumerate() {
        b.0[i] = Bucket {
            calls: *calls,
            sum_ns: (dur * 1e9).round() as u128,
            min_ns: (min * 1e9).round() as u64,
            max_ns: (max * 1e9).round() as u64,
        };
    }
    assert_eq!(histogram_table(&b), seed);
}

#[test]
fn buckets_follow_min_inclusive_max_exclusive() {
    let ms = |m: f64| (m * 1e6) as u64;
    assert_eq!(Buckets::index(0), 0);
    assert_eq!(Buckets::index(ms(5.0) - 1), 0);
    assert_eq!(Buckets::index(ms(5.0)), 1);
    assert_eq!(Buckets::index(ms(24.9)), 4);
    assert_eq!(Buckets::index(ms(25.0)), 5);
    assert_eq!(Buckets::index(ms(999.9)), 7);
    assert_eq!(Buckets::index(ms(1000.0)), 8);
    assert_eq!(Buckets::index(ms(60_000.0)), 8);
    let mut a = Buckets::default();
    a.record(ms(1.0));
    a.record(ms(3.0));
    let mut b = Buckets::default();
    b.record(ms(0.5));
    b.record(ms(7.0));
    a.merge(&b);
    assert_eq!(a.0[0].calls, 3);
    assert_eq!(a.0[0].min_ns, ms(0.5));
    assert_eq!(a.0[0].max_ns, ms(3.0));
    assert_eq!(a.0[1].calls, 1);
    let rows = a.rows();
    assert_eq!(rows[8].max_ms, None);
    let total: f64 = rows.iter().map(|r| r.percent).sum();
    assert!((total - 100.0).abs() < 1e-9);
    // An empty histogram prints the ranges and a bare total.
    let empty = histogram_table(&Buckets::default());
    assert!(empty.ends_with("TOTAL (9)\n"), "{empty}");
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
