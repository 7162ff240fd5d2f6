//! `preset = "mysql"`: one MySQL or MariaDB server, named by its data directory.
//!
//! The server is one process (mysqld or mariadbd) with a thread per connection; it is found from
//! its pid file, not by name, so several servers on one host never mix. Moving the process moves
//! every one of its threads (cgroup.procs, not tasks).
//!
//! Rules (names for `preset_omit`):
//! - `server` (match): `{ pidfile = <pid_file>, descendants = true }`, where `pid_file` defaults
//!   to `<datadir>/<hostname>.pid`, the server's own default.
//!
//! Storage: `datadir`, plus `innodb_log_group_home_dir` and `tmpdir` when given.

use super::Expansion;
use crate::policy::raw::{RawRule, RawTenant};
use crate::policy::source::Loc;

pub fn keys(t: &RawTenant) -> Vec<Loc<&'static str>> {
    let mut out = Vec::new();
    if let Some(k) = &t.datadir {
        out.push(k.here("datadir"));
    }
    if let Some(k) = &t.pid_file {
        out.push(k.here("pid_file"));
    }
    if let Some(k) = &t.innodb_log_group_home_dir {
        out.push(k.here("innodb_log_group_home_dir"));
    }
    if let Some(k) = &t.tmpdir {
        out.push(k.here("tmpdir"));
    }
    out
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty() && !h.contains('/'))
        .unwrap_or_else(|| "localhost".into())
}

pub fn expand(t: &RawTenant, key: &Loc<String>) -> Result<Expansion, Vec<Loc<String>>> {
    let name = &t.name.value;
    let mut problems = Vec::new();
    let mut path = |k: &str, v: &Option<Loc<String>>| -> Option<String> {
        let v = v.as_ref()?;
        if !v.value.starts_with('/') || v.value.split('/').any(|c| c == "..") {
            problems.push(v.here(format!(
                "tenant `{name}`: {k} `{}` must be an absolute path without `..`",
                v.value
            )));
            return None;
        }
        Some(v.value.trim_end_matches('/').to_string()).filter(|s| !s.is_empty())
    };
    let datadir = path("datadir", &t.datadir);
    let pid_file = path("pid_file", &t.pid_file);
    let logdir = path("innodb_log_group_home_dir", &t.innodb_log_group_home_dir);
    let tmpdir = path("tmpdir", &t.tmpdir);
    if t.datadir.is_none() && t.pid_file.is_none() {
        problems.push(key.here(format!(
            "tenant `{name}`: preset `mysql` needs `datadir` (the server's data directory) or `pid_file`"
        )));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let pid_file = match (pid_file, &datadir) {
        (Some(p), _) => p,
        (None, Some(d)) => format!("{d}/{}.pid", hostname()),
        (None, None) => unreachable!("checked above"),
    };
    let at = t.pid_file.as_ref().unwrap_or(key);
    let mut e = Expansion::default();
    e.named_rule(
        "server",
        RawRule {
            pidfile: Some(at.here(pid_file)),
            descendants: Some(true),
            ..Default::default()
        },
    );
    e.storage.extend(datadir);
    e.storage.extend(logdir);
    e.storage.extend(tmpdir);
    Ok(e)
}

#[cfg(test)]
mod tests {
    use crate::policy::{from_str, FakeAccounts};

    #[test]
    fn datadir_gives_the_pid_file_and_storage() {
        let text = "[[tenant]]\nname = \"shop\"\npreset = \"mysql\"\ndatadir = \"/srv/mysql/shop/\"\ntmpdir = \"/srv/tmp\"\n";
        let p = from_str("p.toml", text, &FakeAccounts).unwrap().policy;
        let t = &p.tenants[0];
        let host = super::hostname();
        let f = t.rules[0].pidfile.as_ref().unwrap();
        assert_eq!(
            f.path,
            std::path::PathBuf::from(format!("/srv/mysql/shop/{host}.pid"))
        );
        assert!(t.rules[0].descendants);
        let storage: Vec<&str> = t.storage.iter().map(|s| s.value.as_str()).collect();
        assert_eq!(storage, ["/srv/mysql/shop", "/srv/tmp"]);
    }

    #[test]
    fn a_given_pid_file_wins_and_mistakes_are_located() {
        let text = "[[tenant]]\nname = \"shop\"\npreset = \"mysql\"\ndatadir = \"/srv/m\"\npid_file = \"/run/mysqld/mysqld.pid\"\n";
        let p = from_str("p.toml", text, &FakeAccounts).unwrap().policy;
        assert_eq!(
            p.tenants[0].rules[0].pidfile.as_ref().unwrap().path,
            std::path::PathBuf::from("/run/mysqld/mysqld.pid")
        );
        let err = from_str(
            "p.toml",
            "[[tenant]]\nname = \"shop\"\npreset = \"mysql\"\n",
            &FakeAccounts,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("p.toml:3:10") && err.contains("needs `datadir`"),
            "{err}"
        );
        let err = from_str(
            "p.toml",
            "[[tenant]]\nname = \"shop\"\npreset = \"mysql\"\ndatadir = \"srv\"\n",
            &FakeAccounts,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("p.toml:4:11") && err.contains("must be an absolute"),
            "{err}"
        );
        let err = from_str(
            "p.toml",
            "[[tenant]]\nname = \"shop\"\npreset = \"oracle\"\nsid = \"X\"\ndatadir = \"/srv\"\n",
            &FakeAccounts,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("`datadir` is a key of `preset = \"mysql\"`"),
            "{err}"
        );
    }
}
