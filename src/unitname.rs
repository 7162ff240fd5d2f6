//! systemd's unit names as text: which names are valid (systemd's `unit_name_is_valid`), the
//! policy's `unit =` patterns, the unit a cgroup path belongs to (`cg_path_get_unit`), and the
//! line of /proc/PID/cgroup that systemd's hierarchy is on. Pure, and below both the policy
//! (which validates `unit =`) and the process reader (which reads each process's unit), so that
//! neither needs the `systemd` module, which talks to the manager.

/// Unit types that have cgroups at all, as systemd names them in the tree.
const CGROUP_UNIT_SUFFIXES: &[&str] =
    &[".service", ".scope", ".slice", ".socket", ".mount", ".swap"];

/// Unit types whose units hold a database's processes for its life (a `unit =` may name them,
/// and a tenant's processes may be governed in them).
pub const PROCESS_UNIT_SUFFIXES: &[&str] = &[".service", ".scope"];

/// systemd's UNIT_NAME_MAX (256, with the terminating NUL).
const UNIT_NAME_MAX: usize = 255;

/// Characters systemd allows in a unit name's prefix and instance (`VALID_CHARS` plus the
/// backslash of its escapes, `\x2d`).
fn valid_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, ':' | '-' | '_' | '.' | '\\')
}

/// The unit a cgroup path belongs to, as systemd decides it (`cg_path_get_unit`): slices are
/// skipped from the top, and the first component that is not a slice is the unit, whatever lies
/// below it (a delegated unit's own subgroups belong to it). `None` for a path that ends in a
/// slice or holds no unit name (`/`, dbcage's own `/dbcage/...` groups).
pub fn unit_of_cgroup_path(path: &str) -> Option<&str> {
    for component in path.split('/').filter(|c| !c.is_empty()) {
        if component.ends_with(".slice") {
            continue;
        }
        return CGROUP_UNIT_SUFFIXES
            .iter()
            .any(|s| component.len() > s.len() && component.ends_with(s))
            .then_some(component);
    }
    None
}

/// The path of a process in systemd's own hierarchy, from /proc/PID/cgroup: the v2 line
/// (`0::/system.slice/x.service`) on unified hosts, the `name=systemd` line on v1 and hybrid
/// hosts (where the v2 line, if any, may be empty or belong to another manager).
pub fn systemd_cgroup_of(proc_cgroup: &str) -> Option<&str> {
    // `ID:controllers:path`.
    let lines = || {
        proc_cgroup.lines().filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let _id = parts.next()?;
            Some((parts.next()?, parts.next()?))
        })
    };
    lines()
        .find(|(ctrls, _)| ctrls.split(',').any(|c| c == "name=systemd"))
        .or_else(|| lines().find(|(ctrls, _)| ctrls.is_empty()))
        .map(|(_, path)| path)
}

/// The unit a process lives in, from the text of its /proc/PID/cgroup.
pub fn unit_of_proc_cgroup(proc_cgroup: &str) -> Option<&str> {
    systemd_cgroup_of(proc_cgroup).and_then(unit_of_cgroup_path)
}

/// A policy's `unit =`: one unit's name (`postgresql@15-main.service`) or a glob over names
/// (`postgresql@*.service`: `*`, `?` and `[...]` as in `systemctl list-units PATTERN`).
#[derive(Debug, Clone)]
pub enum UnitPattern {
    Name(String),
    Glob(glob::Pattern),
}

impl UnitPattern {
    /// Validates `text` by systemd's rules for unit names: at most 255 characters, a prefix of
    /// letters, digits and `:-_.\`, an optional `@instance` of the same, and a `.service` or
    /// `.scope` suffix (the unit types whose processes a tenant can hold; a slice holds units,
    /// not processes). A glob may use `*?[]` before the suffix; the suffix is literal. The error
    /// says what is wrong and how a valid name looks.
    pub fn parse(text: &str) -> Result<UnitPattern, String> {
        if text.len() > UNIT_NAME_MAX {
            return Err(format!(
                "is {} characters long; systemd's unit names have at most {UNIT_NAME_MAX}",
                text.len()
            ));
        }
        let Some(suffix) = PROCESS_UNIT_SUFFIXES.iter().find(|s| text.ends_with(*s)) else {
            let kind = text
                .rfind('.')
                .map(|i| &text[i..])
                .filter(|k| CGROUP_UNIT_SUFFIXES.contains(k));
            return Err(match kind {
                Some(".slice") => "names a slice, which holds units, not processes: name the \
                     services or scopes in it (a glob such as \"postgresql@*.service\" takes several)"
                    .to_string(),
                Some(k) => format!(
                    "names a {} unit, which holds no database's processes: name a .service or .scope",
                    &k[1..]
                ),
                None => "has no unit type: end it in .service or .scope \
                     (e.g. \"postgresql@15-main.service\")"
                    .to_string(),
            });
        };
        let stem = &text[..text.len() - suffix.len()];
        let (prefix, instance) = match stem.split_once('@') {
            Some((p, i)) => (p, Some(i)),
            None => (stem, None),
        };
        let glob_char = |c: char| matches!(c, '*' | '?' | '[' | ']' | '!');
        let is_glob = stem.chars().any(glob_char);
        if prefix.is_empty() {
            return Err("has an empty name before the unit type or `@`".to_string());
        }
        for part in std::iter::once(prefix).chain(instance) {
            if let Some(bad) = part.chars().find(|&c| !valid_char(c) && !glob_char(c)) {
                return Err(format!(
                    "holds `{bad}`, which systemd does not allow in a unit name (letters, digits \
                     and `:-_.\\`, one `@` before an instance; `*?[]` in a glob)"
                ));
            }
        }
        if !is_glob {
            return Ok(UnitPattern::Name(text.to_string()));
        }
        glob::Pattern::new(text)
            .map(UnitPattern::Glob)
            .map_err(|e| format!("is not a valid glob: {e}"))
    }

    /// Whether a process in `unit` is in a unit this pattern names.
    pub fn matches(&self, unit: &str) -> bool {
        match self {
            UnitPattern::Name(n) => n == unit,
            UnitPattern::Glob(g) => g.matches(unit),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            UnitPattern::Name(n) => n,
            UnitPattern::Glob(g) => g.as_str(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_is_read_from_the_systemd_line_of_v1_hybrid_and_v2_hosts() {
        // Copied from hosts: Debian 12 (cgroup v2), and a RHEL 8 style hybrid where dbcage
        // (cgroupfs) moved the process in the v1 controllers but systemd's named hierarchy
        // still names its unit.
        let v2 = "0::/system.slice/system-postgresql.slice/postgresql@15-main.service\n";
        assert_eq!(unit_of_proc_cgroup(v2), Some("postgresql@15-main.service"));
        let hybrid = "12:blkio:/dbcage/pg/limited\n11:cpu,cpuacct:/dbcage/pg\n\
                      5:memory:/system.slice/postgresql@15-main.service\n\
                      1:name=systemd:/system.slice/postgresql@15-main.service\n\
                      0::/system.slice/postgresql@15-main.service\n";
        assert_eq!(
            unit_of_proc_cgroup(hybrid),
            Some("postgresql@15-main.service")
        );
        // Hybrid with a v2 line that is not systemd's: the named line still decides.
        let other = "1:name=systemd:/user.slice/user-0.slice/session-3.scope\n0::/dbcage/x\n";
        assert_eq!(unit_of_proc_cgroup(other), Some("session-3.scope"));
        // A delegated unit's subgroup, a bare slice, the root, no systemd line at all.
        assert_eq!(
            unit_of_proc_cgroup("0::/system.slice/fakedb.service/limited\n"),
            Some("fakedb.service")
        );
        assert_eq!(unit_of_proc_cgroup("0::/system.slice\n"), None);
        assert_eq!(unit_of_proc_cgroup("0::/\n"), None);
        assert_eq!(unit_of_proc_cgroup("4:cpu:/x.service\n"), None);
        assert_eq!(unit_of_proc_cgroup(""), None);
    }

    #[test]
    fn unit_names_follow_systemds_rules() {
        for ok in [
            "postgresql@15-main.service",
            "fakedb.service",
            "mariadb.service",
            "session-3.scope",
            "oracle\\x2dbx1.service",
            "a:b_c.d.service",
        ] {
            assert!(
                matches!(UnitPattern::parse(ok), Ok(UnitPattern::Name(_))),
                "{ok}"
            );
        }
        let err = |s: &str| UnitPattern::parse(s).unwrap_err();
        assert!(err("postgresql").contains("no unit type"));
        assert!(err("system.slice").contains("slice"));
        assert!(err("var-lib.mount").contains("mount unit"));
        assert!(err(".service").contains("empty name"));
        assert!(err("@x.service").contains("empty name"));
        assert!(err("pg/../x.service").contains("`/`"));
        assert!(err("pg main.service").contains("` `"));
        assert!(err("pg$.service").contains("`$`"));
        assert!(err(&format!("{}.service", "a".repeat(250))).contains("at most 255"));
    }

    #[test]
    fn globs_take_a_template_s_instances() {
        let g = UnitPattern::parse("postgresql@*.service").unwrap();
        assert!(matches!(g, UnitPattern::Glob(_)));
        assert!(g.matches("postgresql@15-main.service"));
        assert!(g.matches("postgresql@16-b.service"));
        assert!(!g.matches("postgresql.service"));
        assert!(!g.matches("postgresql@15-main.scope"));
        assert!(!g.matches("mypostgresql@15-main.service"));
        let q = UnitPattern::parse("db[12].service").unwrap();
        assert!(q.matches("db1.service") && !q.matches("db3.service"));
        assert_eq!(q.as_str(), "db[12].service");
        assert!(UnitPattern::parse("db[.service")
            .unwrap_err()
            .contains("not a valid glob"));
        // The suffix is literal: a glob cannot reach slices or other unit types.
        assert!(UnitPattern::parse("*").is_err());
        assert!(UnitPattern::parse("*.slice").is_err());
        let exact = UnitPattern::parse("fakedb.service").unwrap();
        assert!(exact.matches("fakedb.service") && !exact.matches("fakedb2.service"));
    }
}
