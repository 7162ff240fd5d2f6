//! `preset = "postgres"`: one PostgreSQL instance, named by its data directory.
//!
//! ```toml
//! [[tenant]]
//! name = "pg15main"
//! preset = "postgres"
//! data_dir = "/var/lib/postgresql/15/main"
//! wal = "exempt"        # or "limited"
//! ```
//!
//! expands to
//! - `match[0]`: `{ pidfile = "<data_dir>/postmaster.pid", descendants = true }`: the postmaster
//!   (followed across restarts: the daemon watches the data directory) and every process it
//!   forks;
//! - with `wal = "exempt"` (the default), `exempt[0]`: the WAL-critical children by their process
//!   titles (`postgres: [CLUSTER: ]walwriter|walsender ...|walreceiver ...|startup ...`), as a
//!   `within_tenant` rule, so it decides the leaf of this instance's children only and never
//!   claims another cluster's walwriter;
//! - storage: `<data_dir>`, `<data_dir>/pg_wal` and, when the instance has tablespaces,
//!   `<data_dir>/pg_tblspc/*`. Storage paths are resolved with `stat`, which follows symlinks,
//!   so a `pg_wal` or a tablespace that lives on another disk puts that disk under the limits;
//!   they are re-resolved at every rescan.
//!
//! What `wal` costs. `"exempt"`: the walwriter's background WAL flushes, the WAL senders' reads,
//! and on a standby the WAL receiver's writes and the startup process's replay (its reads and
//! page writes) are free of the tenant's IO limits (they keep its cpu and memory limits), so a
//! standby that is limited can keep up with its primary; the price is that the instance's IO can
//! exceed its limits by its WAL rate (on a standby: by its whole replay IO). On a primary,
//! committing backends flush their own WAL and stay limited, so limits still bound commits.
//! `"limited"`: every byte counts against the limits; a standby limited below its primary's WAL
//! rate falls behind without bound until the primary recycles WAL the standby still needs.

use std::path::Path;

use super::Expansion;
use crate::policy::raw::{RawRule, RawTenant};
use crate::policy::source::Loc;

/// The process titles of the WAL-critical processes: PostgreSQL sets them as
/// `postgres: [cluster_name: ]walwriter`, `... walsender USER HOST(PORT) streaming 0/3000148`,
/// `... walreceiver streaming 0/3000148`, `... startup recovering 000000010000000000000003`.
pub const WAL_TITLES: &str =
    r"^postgres: (?:[^:]*: )?(?:walwriter|walsender|walreceiver|startup)(?: |$)";

/// This preset's own keys that the tenant sets (for the check that they are not used without it).
pub fn keys(t: &RawTenant) -> Vec<Loc<&'static str>> {
    let mut out = Vec::new();
    if let Some(k) = &t.data_dir {
        out.push(k.here("data_dir"));
    }
    if let Some(k) = &t.wal {
        out.push(k.here("wal"));
    }
    out
}

pub fn expand(t: &RawTenant, key: &Loc<String>) -> Result<Expansion, Vec<Loc<String>>> {
    let tenant = &t.name.value;
    let mut problems = Vec::new();
    let data_dir = match &t.data_dir {
        None => {
            problems.push(key.here(format!(
                "tenant `{tenant}`: preset `postgres` needs `data_dir` (the instance's data directory, where postmaster.pid is)"
            )));
            None
        }
        Some(d) => match check_data_dir(&d.value) {
            Ok(()) => Some(d.value.trim_end_matches('/').to_string()),
            Err(why) => {
                problems.push(d.here(format!(
                    "tenant `{tenant}`: data_dir `{}` {why}",
                    d.value.escape_debug()
                )));
                None
            }
        },
    };
    let exempt_wal = match t.wal.as_ref().map(|w| w.value.as_str()) {
        None | Some("exempt") => true,
        Some("limited") => false,
        Some(other) => {
            let w = t.wal.as_ref().unwrap();
            problems.push(w.here(format!(
                "tenant `{tenant}`: wal `{}` is not valid; use \"exempt\" or \"limited\"",
                other.escape_debug()
            )));
            true
        }
    };
    let Some(dir) = data_dir.filter(|_| problems.is_empty()) else {
        return Err(problems);
    };
    let rules = vec![RawRule {
        pidfile: Some(key.here(format!("{dir}/postmaster.pid"))),
        descendants: Some(true),
        ..RawRule::default()
    }];
    let exempt = if exempt_wal {
        vec![RawRule {
            cmdline: Some(key.here(WAL_TITLES.to_string())),
            within_tenant: Some(true),
            ..RawRule::default()
        }]
    } else {
        Vec::new()
    };
    let mut storage = vec![dir.clone(), format!("{dir}/pg_wal")];
    if has_tablespaces(Path::new(&format!("{dir}/pg_tblspc"))) {
        storage.push(format!("{dir}/pg_tblspc/*"));
    }
    // Named so that `preset_omit` can drop either: the postmaster tree, the WAL exemption.
    let names = if exempt.is_empty() {
        vec!["instance"]
    } else {
        vec!["instance", "wal"]
    };
    Ok(Expansion {
        rules,
        exempt,
        storage,
        names,
    })
}

/// The data directory becomes a pid file path and storage paths (globs among them): absolute,
/// no `..`, no glob or control characters.
fn check_data_dir(d: &str) -> Result<(), &'static str> {
    if !d.starts_with('/') || d.trim_end_matches('/').is_empty() {
        return Err("must be an absolute path (not `/`)");
    }
    if d.split('/').any(|c| c == "..") {
        return Err("must not contain `..`");
    }
    if d.contains(['*', '?', '[', ']']) {
        return Err("must not contain glob characters (`*`, `?`, `[`, `]`)");
    }
    if d.chars().any(char::is_control) {
        return Err("must not contain control characters");
    }
    Ok(())
}

/// True when `pg_tblspc` holds at least one entry (a tablespace's symlink). Read when the policy
/// is loaded: a first tablespace created later is picked up at the next reload; further ones at
/// the next rescan (the glob's directory is watched).
fn has_tablespaces(pg_tblspc: &Path) -> bool {
    std::fs::read_dir(pg_tblspc).is_ok_and(|mut d| d.next().is_some())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use crate::classify::Leaf;
    use crate::policy::FakeAccounts;

    fn policy(text: &str) -> crate::policy::Policy {
        match crate::policy::from_str("p.toml", text, &FakeAccounts) {
            Ok(l) => std::sync::Arc::unwrap_or_clone(l.policy),
            Err(e) => panic!("bad policy:\n{e}"),
        }
    }

    fn errors(text: &str) -> String {
        crate::policy::from_str("p.toml", text, &FakeAccounts)
            .unwrap_err()
            .to_string()
    }

    /// A data directory as initdb leaves it, with pg_wal moved elsewhere (`initdb -X`) and two
    /// tablespaces.
    fn fixture() -> (tempfile::TempDir, String) {
        let root = tempfile::Builder::new()
            .prefix("dbcage-test-pgfix-")
            .tempdir()
            .unwrap();
        let data = root.path().join("data");
        for d in ["data/base", "data/pg_tblspc", "wal", "ts1", "ts2"] {
            std::fs::create_dir_all(root.path().join(d)).unwrap();
        }
        std::fs::write(data.join("PG_VERSION"), "15\n").unwrap();
        symlink(root.path().join("wal"), data.join("pg_wal")).unwrap();
        symlink(root.path().join("ts1"), data.join("pg_tblspc/16384")).unwrap();
        symlink(root.path().join("ts2"), data.join("pg_tblspc/16385")).unwrap();
        let d = data.to_string_lossy().into_owned();
        (root, d)
    }

    #[test]
    fn expands_to_pidfile_wal_exempt_and_storage() {
        let (_root, data) = fixture();
        let p = policy(&format!(
            "[[tenant]]\nname = \"pg\"\npreset = \"postgres\"\ndata_dir = \"{data}/\"\n[tenant.io]\nwrite_bps = \"10MiB\"\n"
        ));
        let t = &p.tenants[0];
        assert_eq!(t.rules.len(), 1);
        let r = &t.rules[0];
        assert_eq!(
            r.pidfile.as_ref().unwrap().path,
            std::path::PathBuf::from(format!("{data}/postmaster.pid"))
        );
        assert!(r.descendants);
        assert_eq!(t.exempt.len(), 1);
        assert!(t.exempt[0].within_tenant);
        let storage: Vec<&str> = t.storage.iter().map(|s| s.value.as_str()).collect();
        assert_eq!(
            storage,
            [
                data.clone(),
                format!("{data}/pg_wal"),
                format!("{data}/pg_tblspc/*")
            ]
        );
        // What the storage entries reach: pg_wal's and each tablespace's real directory.
        let wal = std::fs::canonicalize(format!("{data}/pg_wal")).unwrap();
        assert!(wal.ends_with("wal"), "{}", wal.display());
        let mut ts: Vec<_> = glob::glob(&format!("{data}/pg_tblspc/*"))
            .unwrap()
            .map(|e| std::fs::canonicalize(e.unwrap()).unwrap())
            .collect();
        ts.sort();
        assert!(ts[0].ends_with("ts1") && ts[1].ends_with("ts2"), "{ts:?}");
    }

    #[test]
    fn no_tablespaces_no_glob_and_limited_wal_has_no_exempt_rule() {
        let (root, data) = fixture();
        for e in std::fs::read_dir(format!("{data}/pg_tblspc")).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        let p = policy(&format!(
            "[[tenant]]\nname = \"pg\"\npreset = \"postgres\"\ndata_dir = \"{data}\"\nwal = \"limited\"\nstorage = [\"{}\"]\nexempt = [{{ comm = \"^pg_dump$\" }}]\n",
            root.path().join("ts1").display()
        ));
        let t = &p.tenants[0];
        let storage: Vec<&str> = t.storage.iter().map(|s| s.value.as_str()).collect();
        let ts1 = root.path().join("ts1").to_string_lossy().into_owned();
        assert_eq!(
            storage,
            [data.clone(), format!("{data}/pg_wal"), ts1],
            "the user's storage comes after the preset's"
        );
        // Only the user's exempt rule: the WAL processes share the limits.
        assert_eq!(t.exempt.len(), 1);
        assert!(t.exempt[0].comm.is_some());
    }

    #[test]
    fn bad_keys_are_located() {
        let msg = errors("[[tenant]]\nname = \"pg\"\npreset = \"postgres\"\n");
        assert!(
            msg.contains("p.toml:3:10") && msg.contains("needs `data_dir`"),
            "{msg}"
        );
        for (bad, want) in [
            ("data", "absolute path"),
            ("/", "absolute path"),
            ("/srv/../etc", "`..`"),
            ("/srv/pg*", "glob characters"),
        ] {
            let msg = errors(&format!(
                "[[tenant]]\nname = \"pg\"\npreset = \"postgres\"\ndata_dir = \"{bad}\"\n"
            ));
            assert!(
                msg.contains("p.toml:4:12") && msg.contains(want),
                "{bad}: {msg}"
            );
        }
        let msg = errors(
            "[[tenant]]\nname = \"pg\"\npreset = \"postgres\"\ndata_dir = \"/srv/pg\"\nwal = \"fast\"\n",
        );
        assert!(
            msg.contains("p.toml:5:7") && msg.contains("wal `fast`"),
            "{msg}"
        );
        let msg = errors(
            "[[tenant]]\nname = \"pg\"\ndata_dir = \"/srv/pg\"\nmatch = [{ comm = \"x\" }]\n",
        );
        assert!(
            msg.contains("p.toml:3:12") && msg.contains("preset"),
            "{msg}"
        );
        let msg =
            errors("[[tenant]]\nname = \"pg\"\nmatch = [{ comm = \"x\", within_tenant = true }]\n");
        assert!(msg.contains("only for exempt rules"), "{msg}");
    }

    fn proc(pid: u32, ppid: u32, cmdline: &str) -> crate::inventory::ProcInfo {
        crate::inventory::ProcInfo {
            pid,
            ppid,
            comm: "postgres".into(),
            cmdline: cmdline.into(),
            exe: None,
            uid: 0,
            gid: 0,
            start_time: pid as u64,
            unit: None,
        }
    }

    /// Two clusters side by side: each tenant takes its own postmaster (from its pid file) with
    /// its children, the WAL processes go to the right tenant's exempt leaf, and the first
    /// tenant's title rule does not take the second cluster's walwriter.
    #[test]
    fn two_clusters_each_keep_their_own_processes() {
        let (_ra, a) = fixture();
        let (_rb, b) = fixture();
        std::fs::write(format!("{a}/postmaster.pid"), "100\n/srv/a\n").unwrap();
        std::fs::write(format!("{b}/postmaster.pid"), "200\n/srv/b\n").unwrap();
        let p = policy(&format!(
            "[[tenant]]\nname = \"a\"\npreset = \"postgres\"\ndata_dir = \"{a}\"\n\
             [[tenant]]\nname = \"b\"\npreset = \"postgres\"\ndata_dir = \"{b}\"\nwal = \"limited\"\n"
        ));
        assert!(p.refresh_pid_files(&crate::hostfs::HostFs::default()));
        let procs = vec![
            proc(100, 1, "/usr/lib/postgresql/15/bin/postgres -D /srv/a"),
            proc(101, 100, "postgres: walwriter "),
            proc(102, 100, "postgres: checkpointer "),
            proc(
                103,
                100,
                "postgres: walsender rep 127.0.0.1(5000) streaming 0/3000148",
            ),
            proc(104, 100, "postgres: alice shop [local] idle"),
            proc(200, 1, "/usr/lib/postgresql/15/bin/postgres -D /srv/b"),
            proc(201, 200, "postgres: walwriter "),
            proc(
                202,
                200,
                "postgres: startup recovering 000000010000000000000003",
            ),
            proc(203, 200, "postgres: walreceiver streaming 0/3000148"),
            proc(300, 1, "postgres: walwriter "), // a third cluster nobody governs
        ];
        let placed: std::collections::HashMap<u32, (usize, Leaf)> =
            crate::classify::classify(&p.tenants, &procs)
                .into_iter()
                .map(|x| (x.pid, (x.tenant, x.leaf)))
                .collect();
        let want = [
            (100, 0, Leaf::Limited),
            (101, 0, Leaf::Exempt),
            (102, 0, Leaf::Limited),
            (103, 0, Leaf::Exempt),
            (104, 0, Leaf::Limited),
            (200, 1, Leaf::Limited),
            (201, 1, Leaf::Limited),
            (202, 1, Leaf::Limited),
            (203, 1, Leaf::Limited),
        ];
        for (pid, tenant, leaf) in want {
            assert_eq!(placed.get(&pid), Some(&(tenant, leaf)), "pid {pid}");
        }
        assert_eq!(placed.get(&300), None, "an ungoverned cluster's walwriter");
        assert_eq!(placed.len(), want.len());
        // The same with cluster names in the titles, and b's WAL exempt too.
        let p = policy(&format!(
            "[[tenant]]\nname = \"a\"\npreset = \"postgres\"\ndata_dir = \"{a}\"\n\
             [[tenant]]\nname = \"b\"\npreset = \"postgres\"\ndata_dir = \"{b}\"\n"
        ));
        p.refresh_pid_files(&crate::hostfs::HostFs::default());
        let procs = vec![
            proc(100, 1, "/usr/lib/postgresql/15/bin/postgres -D /srv/a"),
            proc(101, 100, "postgres: 15/a: walwriter "),
            proc(200, 1, "/usr/lib/postgresql/15/bin/postgres -D /srv/b"),
            proc(
                202,
                200,
                "postgres: 15/b: startup recovering 000000010000000000000003",
            ),
            proc(203, 200, "postgres: 15/b: walreceiver streaming 0/3000148"),
            proc(204, 200, "postgres: 15/b: checkpointer "),
        ];
        let placed: Vec<_> = crate::classify::classify(&p.tenants, &procs)
            .into_iter()
            .map(|x| (x.pid, x.tenant, x.leaf))
            .collect();
        assert_eq!(
            placed,
            [
                (100, 0, Leaf::Limited),
                (101, 0, Leaf::Exempt),
                (200, 1, Leaf::Limited),
                (202, 1, Leaf::Exempt),
                (203, 1, Leaf::Exempt),
                (204, 1, Leaf::Limited),
            ]
        );
    }
}
