//! The importer on the seeds' configurations and on libcgroup's documented grammar: each output
//! is compared with its expected file (tests/fixtures/libcgroup/*.expected.toml; run with
//! DBCAGE_BLESS=1 to rewrite them after a deliberate change) and must itself be a valid policy.

use std::path::{Path, PathBuf};

use super::{convert, Input};
use crate::hostfs::HostFs;
use crate::policy::Accounts;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/libcgroup");

/// Every user and group exists (the seeds name oracle2, oracle3, ...).
struct AnyAccounts;
impl AnyAccounts {
    /// A distinct id per name (two names on one id would be one account, and two tenants with
    /// rules on it an overlap).
    fn id(name: &str) -> u32 {
        if name == "oracle" {
            return 1000;
        }
        1001 + name
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32))
            % 50_000
    }
}
impl Accounts for AnyAccounts {
    fn uid(&self, name: &str) -> Option<u32> {
        Some(Self::id(name))
    }
    fn gid(&self, name: &str) -> Option<u32> {
        Some(Self::id(name))
    }
}

/// A host whose /sys knows 8:16 as sdb (and nothing else).
fn host() -> (tempfile::TempDir, HostFs) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("sys/dev/block/8:16");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("uevent"),
        "MAJOR=8\nMINOR=16\nDEVNAME=sdb\nDEVTYPE=disk\n",
    )
    .unwrap();
    let fs = HostFs::with_root(dir.path());
    (dir, fs)
}

fn run(cgconfig: Option<&str>, cgrules: Option<&str>) -> super::Imported {
    let read = |n: &str| std::fs::read_to_string(Path::new(DIR).join(n)).unwrap();
    let (cfg_text, rules_text) = (cgconfig.map(read), cgrules.map(read));
    let (cfg_path, rules_path): (Option<PathBuf>, Option<PathBuf>) =
        (cgconfig.map(PathBuf::from), cgrules.map(PathBuf::from));
    let (_d, fs) = host();
    convert(
        cfg_path
            .as_deref()
            .zip(cfg_text.as_deref())
            .map(|(path, text)| Input { path, text }),
        rules_path
            .as_deref()
            .zip(rules_text.as_deref())
            .map(|(path, text)| Input { path, text }),
        &fs,
    )
}

fn expect(name: &str, got: &str) {
    let path = Path::new(DIR).join(format!("{name}.expected.toml"));
    if std::env::var_os("DBCAGE_BLESS").is_some() {
        std::fs::write(&path, got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(got, want, "output differs from {}", path.display());
}

fn valid(policy: &str) -> crate::policy::Policy {
    match crate::policy::from_str("imported.toml", policy, &AnyAccounts) {
        Ok(l) => std::sync::Arc::unwrap_or_clone(l.policy),
        Err(e) => panic!("the output is not a valid policy:\n{e}\n{policy}"),
    }
}

#[test]
fn seed_002_four_oracle_groups_pinned_with_cpusets() {
    let out = run(Some("seed002-cgconfig.conf"), None);
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    expect("seed002", &out.policy);
    let p = valid(&out.policy);
    let names: Vec<&str> = p.tenants.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["test1", "test2", "test3", "test4"]);
    for t in &p.tenants {
        assert_eq!(t.cpu.cpus.as_ref().unwrap().value.to_string(), "0-31");
        assert_eq!(t.cpu.numa_nodes.as_ref().unwrap().value.to_string(), "0-3");
        assert!(t.rules.is_empty());
    }
    assert!(out.policy.contains("# match = [{ user = \"oracle2\" }]"));
}

#[test]
fn seed_002_as_printed_reports_the_stray_brace_with_its_line() {
    let out = run(Some("seed002-verbatim-cgconfig.conf"), None);
    let text =
        std::fs::read_to_string(Path::new(DIR).join("seed002-verbatim-cgconfig.conf")).unwrap();
    let stray = text.lines().position(|l| l == "}").map(|i| i + 1);
    // The first `}` alone on a line closes a group; the stray one follows test2's closing brace.
    let lines: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(i, l)| *l == "}" && text.lines().nth(i + 1) == Some("}"))
        .map(|(i, _)| i + 2)
        .collect();
    assert!(stray.is_some());
    assert_eq!(out.errors.len(), 1, "{:?}", out.errors);
    assert_eq!(
        out.errors[0],
        format!("seed002-verbatim-cgconfig.conf:{}: expected `mount`, `group`, `default`, `template` or `namespace`, found `}}`", lines[0])
    );
}

#[test]
fn seed_003_iops_on_one_disk_for_user_oracle() {
    let out = run(Some("seed003-cgconfig.conf"), Some("seed003-cgrules.conf"));
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    expect("seed003", &out.policy);
    let p = valid(&out.policy);
    let t = &p.tenants[0];
    assert_eq!(t.name, "iothrottle");
    assert_eq!(t.rules.len(), 1);
    assert_eq!(t.rules[0].uid, Some(1000));
    assert_eq!(t.storage[0].value, "/dev/sdb");
    assert_eq!(t.io_devices[0].path.value, "/dev/sdb");
    assert_eq!(t.io_devices[0].limits.read_iops, Some(10));
    assert!(t.io.is_empty());
}

#[test]
fn documented_grammar_converts_or_explains_every_line() {
    let out = run(Some("grammar-cgconfig.conf"), Some("grammar-cgrules.conf"));
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    expect("grammar", &out.policy);
    let p = valid(&out.policy);
    let names: Vec<&str> = p.tenants.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["tools", "db-BX1", "pg15", "reports"]);
    let bx1 = &p.tenants[1];
    assert_eq!(bx1.cpu.weight, Some(50));
    assert_eq!(bx1.cpu.cores, Some(2.5));
    assert_eq!(bx1.memory.max.as_ref().unwrap().value, 8 << 30);
    assert_eq!(bx1.memory.high, Some(6 << 30));
    assert_eq!(bx1.memory.swap_max, Some(2 << 30));
    assert_eq!(bx1.rules.len(), 2);
    let devs: Vec<&str> = bx1
        .io_devices
        .iter()
        .map(|d| d.path.value.as_str())
        .collect();
    assert_eq!(devs, ["/dev/block/259:0", "/dev/sdb"]);
    assert_eq!(bx1.io_devices[1].limits.read_bps, Some(50 << 20));
    assert_eq!(bx1.io_devices[1].limits.write_iops, Some(500));
    let pg = &p.tenants[2];
    assert_eq!(pg.cpu.cores, Some(0.25));
    assert_eq!(pg.cpu.weight, Some(98));
    assert!(pg.memory.max.is_none());
    // Every dropped setting is explained.
    for needle in [
        "cpu.rt_runtime_us = 0: no dbcage equivalent",
        "blkio.weight = 500: proportional IO weights",
        "dbcage does not drive the `devices` controller",
        "template users/%u",
        "group .: the hierarchy's root group",
        "namespace:",
        "default:",
        "memory.swappiness = 10: no dbcage equivalent",
        "grammar-cgrules.conf:8: % memory tools: a dbcage process belongs to one tenant",
        "backup * /: the hierarchy's root",
        "users/%u: destination templates",
        "nobody * tools ignore: `ignore`",
        "comm holds 15 characters: `averyveryverylo`",
        "device 259:0 is not on this host",
        "dbcage writes cpu.shares = 1004",
    ] {
        assert!(
            out.policy.contains(needle),
            "missing `{needle}` in:\n{}",
            out.policy
        );
    }
}

#[test]
fn unparsable_lines_are_all_reported() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cgconfig.conf");
    std::fs::write(&cfg, "group a {\n memory { memory.limit_in_bytes = lots; }\n blkio { blkio.throttle.read_bps_device = \"8:16\"; }\n cpuset { cpuset.cpus = 3-1; }\n}\ngroup b {\n cpu { cpu.shares 5; }\n}\n").unwrap();
    let rules = "oracle blkio\n";
    let text = std::fs::read_to_string(&cfg).unwrap();
    let (_d, fs) = host();
    let out = convert(
        Some(Input {
            path: &cfg,
            text: &text,
        }),
        Some(Input {
            path: Path::new("/etc/cgrules.conf"),
            text: rules,
        }),
        &fs,
    );
    let f = cfg.display().to_string();
    let lines: Vec<String> = out
        .errors
        .iter()
        .map(|e| e.split(": ").next().unwrap().to_string())
        .collect();
    assert_eq!(
        lines,
        [
            "/etc/cgrules.conf:1".to_string(),
            format!("{f}:7"),
            format!("{f}:2"),
            format!("{f}:3"),
            format!("{f}:4"),
        ],
        "{:?}",
        out.errors
    );
}
