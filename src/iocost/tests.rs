use super::*;

const DEV: DevNum = DevNum {
    major: 254,
    minor: 16,
};

/// What a 6.1 kernel prints after `254:16 enable=1` (the kernel's own model).
const MODEL_AUTO: &str = "254:16 ctrl=auto model=linear rbps=2706339840 rseqiops=89698 rrandiops=110036 wbps=1063126016 wseqiops=135560 wrandiops=130734\n";
const QOS_ON_AUTO: &str =
    "254:16 enable=1 ctrl=auto rpct=0.00 rlat=250000 wpct=0.00 wlat=250000 min=1.00 max=10000.00\n";
const QOS_USER: &str =
    "254:16 enable=1 ctrl=user rpct=95.00 rlat=1200 wpct=0.00 wlat=250000 min=1.00 max=10000.00\n";

#[test]
fn parses_the_kernels_lines() {
    let m = Model::find(MODEL_AUTO, DEV).unwrap();
    assert!(!m.user);
    assert_eq!(
        (m.rbps, m.rrandiops, m.wrandiops),
        (2706339840, 110036, 130734)
    );
    let q = Qos::find(QOS_USER, DEV).unwrap();
    assert!(q.enable && q.user);
    assert_eq!((q.rpct, q.rlat, q.min, q.max), (9500, 1200, 100, 1_000_000));
    assert_eq!(Model::find(MODEL_AUTO, DevNum::new(8, 0)), None);
}

#[test]
fn proposes_only_the_measured_keys() {
    let m = Measured {
        rbps: 200 << 20,
        rseqiops: 9000,
        rrandiops: 7000,
        rlat: QueueLatency {
            saturated_jobs: 8,
            saturated_p95_us: 2700,
            target_jobs: 16,
            target_p95_us: 5_234,
            deepest_jobs: 32,
            deepest_p95_us: 10_234,
        },
        writes: None,
    };
    let p = propose(DEV, &m);
    assert_eq!(
        p.model_line,
        "254:16 ctrl=user model=linear rbps=209715200 rseqiops=9000 rrandiops=7000"
    );
    assert_eq!(
        p.qos_line,
        "254:16 enable=1 ctrl=user rpct=90.00 rlat=5300 min=50.00 max=115.00"
    );
    // each number of the QoS line says where it comes from
    for key in ["rlat=5300", "pct=90.00", "min=50.00", "max=115.00"] {
        assert!(
            p.why.iter().any(|w| w.starts_with(key)),
            "{key} in {:?}",
            p.why
        );
    }
    assert!(
        p.why[0].contains("with 16 in flight, twice the 8 at which the disk saturated (p95 2.7 ms; 10.2 ms at the probe's deepest queue, 32)"),
        "{}",
        p.why[0]
    );
    // a probe that stopped at the saturation depth says so, and how to go deeper
    let shallow = QueueLatency {
        saturated_jobs: 8,
        saturated_p95_us: 540,
        target_jobs: 8,
        target_p95_us: 540,
        deepest_jobs: 8,
        deepest_p95_us: 540,
    };
    let s = propose(DEV, &Measured { rlat: shallow, ..m });
    assert!(
        s.why[0].starts_with("rlat=600: the p95 of 4 KiB random reads with 8 in flight, the probe's deepest step, where twice the 8 at which the disk saturated (p95 0.5 ms) would be deeper: a larger --jobs-max measures it"),
        "{}",
        s.why[0]
    );
    // and iocost stays at the model: tenants as deep as the probe would never miss that target
    assert!(
        s.qos_line.ends_with(" min=50.00 max=100.00"),
        "{}",
        s.qos_line
    );
    assert!(s.why.iter().any(|w| w.starts_with("max=100.00: ")));
    let w = propose(
        DEV,
        &Measured {
            writes: Some(MeasuredWrites {
                wbps: 100,
                wseqiops: 2,
                wrandiops: 3,
                wlat: QueueLatency::default(),
            }),
            ..m
        },
    );
    assert!(w.model_line.ends_with(" wbps=100 wseqiops=2 wrandiops=3"));
    // the write target sits at the probe's deepest queue (here both are 0): no room above the model
    assert!(w.qos_line.ends_with(" max=100.00 wpct=90.00 wlat=100"));
    assert!(w
        .why
        .iter()
        .any(|w| w.starts_with("max=100.00: iocost never issues more")));
    assert!(w.why.iter().any(|w| w.starts_with("wlat=100")));
}

fn record(model_written: Model, qos_written: Qos) -> Record {
    Record {
        device: DEV,
        name: "vdb".into(),
        model_before: None,
        qos_before: None,
        model_written,
        qos_written,
        queue_before: None,
        queue_written: None,
    }
}

#[test]
fn tells_who_set_the_values() {
    let model = Model::find(MODEL_AUTO, DEV);
    let off = Qos {
        enable: false,
        ..Qos::find(QOS_ON_AUTO, DEV).unwrap()
    };
    assert_eq!(
        owner(model.as_ref(), Some(&off), None, vec![]),
        Owner::Nobody
    );
    assert_eq!(owner(None, None, None, vec![]), Owner::Nobody);
    let on = Qos::find(QOS_ON_AUTO, DEV);
    let Owner::Unknown { what } = owner(model.as_ref(), on.as_ref(), None, vec![]) else {
        panic!("enable=1 by someone else is foreign");
    };
    assert!(what.contains("enable=1"), "{what}");
    let user = Qos::find(QOS_USER, DEV);
    let props = vec!["IOCOST_SOLUTIONS=isolation isolated-bandwidth".to_string()];
    let who = owner(model.as_ref(), user.as_ref(), None, props.clone());
    assert_eq!(who, Owner::Udev { properties: props });
    assert!(who.to_string().contains("90-iocost.rules"), "{who}");
    // dbcage's own values, as its record has them: its own, even with udev properties.
    let r = record(model.unwrap(), user.unwrap());
    assert_eq!(
        owner(model.as_ref(), user.as_ref(), Some(&r), vec![]),
        Owner::Dbcage
    );
    // changed since dbcage wrote: not its own any more.
    let changed = Qos {
        rlat: 5000,
        ..user.unwrap()
    };
    assert!(matches!(
        owner(model.as_ref(), Some(&changed), Some(&r), vec![]),
        Owner::Unknown { .. }
    ));
}

#[test]
fn restores_what_was_there() {
    let mut r = record(Model::default(), Qos::default());
    assert_eq!(
        restore_lines(&r),
        (
            "254:16 ctrl=auto".into(),
            "254:16 enable=0 ctrl=auto".into()
        )
    );
    r.qos_before = Qos::find(QOS_ON_AUTO, DEV);
    assert_eq!(restore_lines(&r).1, "254:16 enable=1 ctrl=auto");
    r.qos_before = Qos::find(QOS_USER, DEV);
    r.model_before = Some(Model {
        user: true,
        ..Model::find(MODEL_AUTO, DEV).unwrap()
    });
    let (m, q) = restore_lines(&r);
    assert_eq!(m, "254:16 ctrl=user model=linear rbps=2706339840 rseqiops=89698 rrandiops=110036 wbps=1063126016 wseqiops=135560 wrandiops=130734");
    assert_eq!(
        q,
        "254:16 enable=1 ctrl=user rpct=95.00 rlat=1200 wpct=0.00 wlat=250000 min=1.00 max=10000.00"
    );
    // what restore writes parses back to what was recorded
    assert_eq!(Qos::find(&q, DEV), r.qos_before);
}

#[test]
fn udev_properties_come_from_the_disks_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = HostFs::with_root(tmp.path());
    assert!(udev_iocost_properties(&fs, DEV).is_empty());
    std::fs::create_dir_all(fs.path("/run/udev/data")).unwrap();
    std::fs::write(
        udev_entry(&fs, DEV),
        "S:disk/by-id/virtio-x\nE:ID_SERIAL=x\nE:IOCOST_SOLUTIONS=isolation\nE:IOCOST_MODEL_ISOLATION=rbps=1\n",
    )
    .unwrap();
    assert_eq!(
        udev_iocost_properties(&fs, DEV),
        vec![
            "IOCOST_SOLUTIONS=isolation",
            "IOCOST_MODEL_ISOLATION=rbps=1"
        ]
    );
}

#[test]
fn record_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = HostFs::with_root(tmp.path());
    let r = record(
        Model::find(MODEL_AUTO, DEV).unwrap(),
        Qos::find(QOS_USER, DEV).unwrap(),
    );
    write_record(&fs, &r).unwrap();
    assert_eq!(read_record(&fs, DEV), Some(r.clone()));
    assert!(record_path(&fs, DEV).ends_with("run/dbcage/iocost/254:16.json"));
    // Without --queue the record has no queue keys, as records of dbcage before the option
    // had; they read back as no queue (what --revert then leaves alone).
    let text = std::fs::read_to_string(record_path(&fs, DEV)).unwrap();
    assert!(!text.contains("queue"), "{text}");
    let deepened = Record {
        queue_before: Some(QueueSetting {
            scheduler: "none".into(),
            nr_requests: 8,
        }),
        queue_written: Some(QueueSetting {
            scheduler: "mq-deadline".into(),
            nr_requests: 64,
        }),
        ..r
    };
    write_record(&fs, &deepened).unwrap();
    assert_eq!(read_record(&fs, DEV), Some(deepened));
}

#[test]
fn latency_target_is_the_p95_at_twice_the_saturation_depth() {
    let l = QueueLatency {
        saturated_jobs: 8,
        saturated_p95_us: 2650,
        target_jobs: 16,
        target_p95_us: 5_401,
        deepest_jobs: 32,
        deepest_p95_us: 10_801,
    };
    assert_eq!(l.target_us(), 5_500);
    // a disk that got faster at depth than at saturation (a noisy probe) keeps the larger
    let noisy = QueueLatency {
        target_p95_us: 900,
        ..l
    };
    assert_eq!(noisy.target_us(), 2700);
    assert_eq!(QueueLatency::default().target_us(), 100);
}

/// A probe step with `iops` and a p95 of `p95_us`.
fn step(parallelism: usize, iops: f64, p95_us: f64) -> crate::probe::report::StepResult {
    use crate::probe::report::{Buckets, Latency, StepResult};
    StepResult {
        bs: 4096,
        parallelism,
        seconds: 2.0,
        ios: (iops * 2.0) as u64,
        bytes: (iops * 2.0) as u64 * 4096,
        iops,
        mib_s: iops * 4096.0 / (1 << 20) as f64,
        latency_us: Latency {
            mean: p95_us / 2.0,
            min: 1.0,
            p50: p95_us / 2.0,
            p95: p95_us,
            p99: p95_us * 2.0,
            p99_9: p95_us * 3.0,
            max: p95_us * 4.0,
        },
        interrupted: false,
        histogram: Vec::new(),
        buckets: Buckets::default(),
    }
}

/// What `queue_latency` makes of the probe steps of null_blk (8 tags, 2 ms) below.
const NULL_BLK_LATENCY: QueueLatency = QueueLatency {
    saturated_jobs: 8,
    saturated_p95_us: 2700,
    target_jobs: 16,
    target_p95_us: 5300,
    deepest_jobs: 32,
    deepest_p95_us: 10_700,
};

#[test]
fn queue_latency_takes_saturation_twice_its_depth_and_the_deepest_step() {
    // null_blk with 8 tags and a 2 ms timer, as the probe saw it on a quiet host
    let steps = [
        step(1, 480.0, 2300.0),
        step(2, 950.0, 2300.0),
        step(4, 1850.0, 2400.0),
        step(8, 3150.0, 2700.0),
        step(16, 3230.0, 5300.0),
        step(32, 3210.0, 10_700.0),
    ];
    assert_eq!(command::queue_latency(&steps), NULL_BLK_LATENCY);
    // steps as (jobs, IOPS, p95 us); then the saturation depth, target depth, target p95
    type Probe = &'static [(usize, f64, f64)];
    let cases: [(Probe, usize, usize, u64); 3] = [
        // a probe that stopped at twice the saturation depth
        (
            &[
                (4, 1850.0, 2400.0),
                (8, 3150.0, 2700.0),
                (16, 3230.0, 5300.0),
            ],
            8,
            16,
            5300,
        ),
        // the first step twice as deep is the target, not the deepest
        (
            &[
                (1, 300.0, 3000.0),
                (2, 900.0, 2200.0),
                (4, 1000.0, 4000.0),
                (8, 990.0, 9000.0),
            ],
            2,
            4,
            4000,
        ),
        // saturated only at the deepest step: the deepest step is the target
        (
            &[(1, 300.0, 3000.0), (2, 600.0, 3000.0), (4, 1200.0, 3100.0)],
            4,
            4,
            3100,
        ),
    ];
    for (probe, saturated, target, p95) in cases {
        let steps: Vec<_> = probe
            .iter()
            .map(|&(j, iops, p95)| step(j, iops, p95))
            .collect();
        let l = command::queue_latency(&steps);
        assert_eq!(
            (l.saturated_jobs, l.target_jobs, l.target_p95_us),
            (saturated, target, p95),
            "{probe:?}"
        );
    }
    assert_eq!(command::queue_latency(&[]), QueueLatency::default());
}

#[test]
fn probe_line_names_each_depth_once() {
    let l = NULL_BLK_LATENCY;
    let at_deepest = QueueLatency {
        deepest_jobs: 16,
        deepest_p95_us: 5300,
        ..l
    };
    let shallow = QueueLatency {
        target_jobs: 8,
        target_p95_us: 2700,
        deepest_jobs: 8,
        deepest_p95_us: 2700,
        ..l
    };
    for (latency, line) in [
        (l, "p95 2700 us at saturation (8 in flight), 5300 us at 16 in flight, 10700 us at 32 in flight"),
        (at_deepest, "p95 2700 us at saturation (8 in flight), 5300 us at 16 in flight"),
        (shallow, "p95 2700 us at saturation (8 in flight)"),
    ] {
        assert_eq!(command::show_latency(&latency), line);
    }
}
