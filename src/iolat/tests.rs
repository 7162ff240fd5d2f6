use super::*;

fn hist(points: &[(usize, u64, u64)]) -> Hist {
    let mut h = Hist::default();
    for &(slot, n, ns) in points {
        h.slots[slot] += n;
        h.fine[slot * SUB] += n;
        h.slot_ns[slot] += ns;
        h.count += n;
        h.sum_ns += ns;
    }
    h
}

#[test]
fn quantiles_fall_in_the_slot_that_holds_the_rank() {
    // 90 requests in [64, 128) us, 10 in [16384, 32768) us.
    let h = hist(&[(6, 90, 90 * 100_000), (14, 10, 10 * 20_000_000)]);
    let p50 = h.quantile(0.5).unwrap();
    assert!((64e-6..128e-6).contains(&p50), "p50 {p50}");
    let p99 = h.quantile(0.99).unwrap();
    assert!((16384e-6..32768e-6).contains(&p99), "p99 {p99}");
    assert_eq!(Hist::default().quantile(0.5), None);
    assert!((h.mean().unwrap() - (90.0 * 100e-6 + 10.0 * 20e-3) / 100.0).abs() < 1e-12);
}

#[test]
fn quantiles_are_within_a_sixteenth_with_the_fine_buckets() {
    // 1000 requests spread evenly over 100..=1099 us, as the program files them.
    let mut fine = [0u64; FINE];
    for us in 100u64..1100 {
        let slot = 63 - us.leading_zeros() as usize;
        let part = ((us >> (slot - 3)) & 7) as usize;
        fine[slot * SUB + part] += 1;
    }
    let h = Hist::from_fine(fine);
    for (q, want) in [(0.5, 600e-6), (0.99, 1090e-6), (0.1, 200e-6)] {
        let got = h.quantile(q).unwrap();
        assert!(
            (got - want).abs() / want < 1.0 / 16.0,
            "q{q}: {got} vs {want}"
        );
    }
}

#[test]
fn since_subtracts_an_earlier_read_and_keeps_new_keys() {
    let key = Key {
        cgroup_id: 7,
        dev: Dev { major: 7, minor: 0 },
        op: Op::Read,
    };
    let other = Key {
        op: Op::Write,
        ..key
    };
    let mut before = Snapshot::default();
    before.entries.insert(
        key,
        Stages {
            total: hist(&[(3, 5, 50_000)]),
            ..Default::default()
        },
    );
    let mut after = before.clone();
    after
        .entries
        .get_mut(&key)
        .unwrap()
        .total
        .add(&hist(&[(3, 2, 20_000)]));
    after.entries.insert(
        other,
        Stages {
            total: hist(&[(4, 1, 20_000)]),
            ..Default::default()
        },
    );
    let d = after.since(&before);
    assert_eq!(d.entries[&key].total.slots[3], 2);
    assert_eq!(d.entries[&key].total.count, 2);
    assert_eq!(d.entries[&other].total.count, 1);
}

#[test]
fn cgroups_fold_into_their_tenants_and_strangers_are_left_out() {
    let owners = CgroupOwners::from_pairs([
        (10, "a".to_string()),
        (11, "a".to_string()),
        (20, "b".to_string()),
    ]);
    let dev = Dev { major: 7, minor: 1 };
    let mut snap = Snapshot::default();
    for (cg, n) in [(10, 1), (11, 2), (20, 4), (99, 8)] {
        snap.entries.insert(
            Key {
                cgroup_id: cg,
                dev,
                op: Op::Read,
            },
            Stages {
                total: hist(&[(2, n, n * 5_000)]),
                ..Default::default()
            },
        );
    }
    let by = snap.by_tenant(&owners);
    let count = |t: &str| {
        by[&TenantKey {
            tenant: t.into(),
            dev,
            op: Op::Read,
        }]
            .total
            .count
    };
    assert_eq!(count("a"), 3);
    assert_eq!(count("b"), 4);
    assert_eq!(by.len(), 2, "cgroup 99 belongs to no tenant");
}

#[test]
fn a_walk_is_kept_until_the_program_sees_a_cgroup_it_does_not_know() {
    let dev = Dev { major: 7, minor: 1 };
    let with = |ids: &[u64]| {
        let mut snap = Snapshot::default();
        for &cgroup_id in ids {
            let key = Key {
                cgroup_id,
                dev,
                op: Op::Read,
            };
            snap.entries.insert(key, Stages::default());
        }
        snap
    };
    let walks = std::cell::Cell::new(0);
    let walk = || {
        walks.set(walks.get() + 1);
        CgroupOwners::from_pairs([(10, "a".to_string())])
    };
    let mut kept = KeptOwners::default();
    assert_eq!(kept.of(&with(&[10, 99]), walk).tenant_of(10), Some("a"));
    assert_eq!(walks.get(), 1, "nothing kept yet");
    let owners = kept.of(&with(&[10, 99]), walk);
    assert_eq!(owners.tenant_of(99), None, "known as no tenant's");
    assert_eq!(walks.get(), 1, "99 was seen before the walk: no walk again");
    kept.of(&with(&[10, 99, 100]), walk);
    assert_eq!(
        walks.get(),
        2,
        "a cgroup made after the walk (maybe a tenant's new leaf) needs a new walk"
    );
    kept.forget();
    kept.of(&with(&[10]), walk);
    assert_eq!(walks.get(), 3, "forgotten: walked again");
}

/// Under systemd a tenant's processes are in its units' cgroups, not in a group of dbcage's:
/// the histograms of those cgroups (and of a delegated unit's leaves) are the tenant's.
#[test]
fn under_systemd_the_units_cgroups_are_the_tenants() {
    use crate::cgroup::{Controller, Hierarchy, Layout, Setup, Version};
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let unified = tmp.path().join("unified");
    let text = "[agent]\nmanager = \"systemd\"\n\n[[tenant]]\nname = \"pg\"\nmatch = [{ unit = \"postgresql@15-main.service\" }]\n";
    let loaded = crate::policy::from_str("dbcage.toml", text, &crate::policy::FakeAccounts)
        .unwrap_or_else(|e| panic!("{e}"));
    let setup = Setup {
        hierarchies: vec![Hierarchy {
            version: Version::V2,
            mount_point: unified.clone(),
            mount_root: "/".into(),
            controllers: vec![Controller::Io, Controller::Cpu],
            mount_controllers: Vec::new(),
            own_path: "/".into(),
        }],
        missing: Vec::new(),
    };
    let mut layout = Layout::new(setup, &loaded.policy.agent).unwrap();
    let unit = "/system.slice/system-postgresql.slice/postgresql@15-main.service";
    layout.units.insert("pg".into(), vec![unit.into()]);
    let unit_dir = unified.join(&unit[1..]);
    std::fs::create_dir_all(unit_dir.join("limited")).unwrap();
    let owners = super::command::owners(&layout, &["pg".to_string()]);
    for d in [unit_dir.clone(), unit_dir.join("limited")] {
        let ino = std::fs::metadata(&d).unwrap().ino();
        assert_eq!(owners.tenant_of(ino), Some("pg"), "{}", d.display());
    }
    let slice = std::fs::metadata(unit_dir.parent().unwrap()).unwrap().ino();
    assert_eq!(
        owners.tenant_of(slice),
        None,
        "the slice above is not the tenant's"
    );
}

#[test]
fn cgroup_owners_are_the_inodes_of_the_tenant_directories() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    std::fs::create_dir_all(a.join("limited")).unwrap();
    std::fs::create_dir_all(a.join("exempt")).unwrap();
    let owners = CgroupOwners::read([
        ("a", a.as_path()),
        ("gone", dir.path().join("gone").as_path()),
    ]);
    for d in [a.clone(), a.join("limited"), a.join("exempt")] {
        let ino = std::fs::metadata(&d).unwrap().ino();
        assert_eq!(owners.tenant_of(ino), Some("a"), "{}", d.display());
    }
    assert_eq!(
        owners.tenant_of(std::fs::metadata(dir.path()).unwrap().ino()),
        None
    );
}

#[test]
fn prometheus_buckets_hold_whole_slots_and_end_at_infinity() {
    // slot 1 = [2,4) us, slot 2 = [4,8) us, slot 23 = 8.4 s and above
    let h = hist(&[(1, 3, 9_000), (2, 5, 25_000), (23, 1, 9_000_000_000)]);
    let b = prom_buckets(&h);
    assert_eq!(b.len(), 12);
    assert_eq!(b[0], (4e-6, 3), "le=4us holds slots 0 and 1");
    assert_eq!(b[1], (16e-6, 5), "le=16us holds slots 2 and 3");
    assert_eq!(
        b[11],
        (f64::MAX, 1),
        "the 8.4 s request is above every finite bound"
    );
    assert_eq!(b.iter().map(|x| x.1).sum::<u64>(), 9);
    assert!(b.windows(2).all(|w| w[0].0 < w[1].0));
}

#[test]
fn the_text_histogram_reads_like_the_seed() {
    let h = hist(&[(3, 2, 2 * 10_000), (5, 6, 6 * 40_000)]);
    let text = render::histogram_table(&h);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("RANGE {min ≤ e < max}"), "{text}");
    assert!(
        lines[2].contains("8µs") && lines[2].contains("16µs"),
        "{text}"
    );
    assert!(
        lines[3].trim_end().ends_with("32µs"),
        "empty slot row: {text}"
    );
    assert!(
        lines[4].contains("92.3%") && lines[4].contains(" 6 "),
        "{text}"
    );
    assert!(lines.last().unwrap().starts_with("TOTAL (2)") && text.contains("100.0%"));
    assert_eq!(render::us_label(1 << 10), "1.024ms");
    assert_eq!(render::us_label(1 << 20), "1.049s");
}

#[test]
fn uncounted_requests_say_why_per_reason() {
    let none = Snapshot::default();
    assert!(none.uncounted_notes().is_empty());
    let both = Snapshot {
        dropped: 7,
        raced: 2,
        ..Snapshot::default()
    };
    let notes = both.uncounted_notes();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[0].starts_with("requests not counted: 7 (every one of the 1024 histograms is taken")
    );
    assert!(notes[1].starts_with("requests not counted: 2 (CPUs completing"));
    // `since` keeps each reason apart
    let later = Snapshot {
        dropped: 9,
        raced: 2,
        ..Snapshot::default()
    };
    let d = later.since(&both);
    assert_eq!((d.dropped, d.raced), (2, 0));
}
