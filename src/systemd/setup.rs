//! `dbcage systemd-setup`: the drop-in that gives a tenant's service `Delegate=yes`, so that
//! its exempt processes get a leaf without the IO limits inside the unit
//! (`cgroup::delegated`). The plan names the units (`TenantSummary::needs_delegate`); this
//! writes one file per unit under /etc/systemd/system and nothing else (the caller reloads
//! the manager once). dbcage never restarts a database: a unit whose cgroup does not offer
//! its subgroups the io controller yet needs a restart, which `check` and `plan` say.

use std::path::PathBuf;

use crate::hostfs::HostFs;
use crate::unitname::UnitPattern;

/// The drop-in's file name: after a package's own drop-ins (which sort lower by convention),
/// so that `Delegate=yes` holds.
pub const DROPIN: &str = "50-dbcage-delegate.conf";

/// Where the drop-in for `unit` goes (a host path, under `fs`'s root).
pub fn dropin_path(fs: &HostFs, unit: &str) -> Result<PathBuf, String> {
    match UnitPattern::parse(unit) {
        Ok(UnitPattern::Name(_)) if unit.ends_with(".service") => {
            Ok(fs.path(format!("/etc/systemd/system/{unit}.d/{DROPIN}")))
        }
        Ok(UnitPattern::Name(_)) => Err(format!(
            "{unit} is a scope: it is started by whoever creates it, with its properties; \
             start it with Delegate=yes (systemd-run --scope -p Delegate=yes), or run the \
             database as a service"
        )),
        Ok(UnitPattern::Glob(_)) => Err(format!("`{unit}` is a glob, not a unit")),
        Err(why) => Err(format!("the unit name `{unit}` {why}")),
    }
}

/// The drop-in's text.
pub fn dropin_text() -> &'static str {
    "# Written by `dbcage systemd-setup`: the unit's cgroup subtree is delegated, so that dbcage\n\
     # keeps the tenant's exempt processes (a WAL or log writer) in a leaf without its IO limits,\n\
     # inside this unit. Remove this file (and run `systemctl daemon-reload`) to undo.\n\
     [Service]\n\
     Delegate=yes\n"
}

/// What `write` did for a unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// The drop-in was written (or would be, with `dry_run`).
    New(PathBuf),
    /// It is there already with this text.
    Unchanged(PathBuf),
}

/// Writes the drop-in for `unit` (atomically: a temporary file renamed over it), unless it is
/// there with the same text. `dry_run`: only says what it would do.
pub fn write(fs: &HostFs, unit: &str, dry_run: bool) -> Result<Written, String> {
    let path = dropin_path(fs, unit)?;
    if std::fs::read_to_string(&path).is_ok_and(|t| t == dropin_text()) {
        return Ok(Written::Unchanged(path));
    }
    if dry_run {
        return Ok(Written::New(path));
    }
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let dir = path.parent().expect("a drop-in has a directory");
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    // A temporary file in the same directory, renamed over the drop-in (as `set` writes its
    // state, control::save): systemd never reads half a file; the `.tmp` name is not a
    // drop-in, and it is removed if anything fails.
    let mut tmp = tempfile::Builder::new()
        .prefix(".dbcage-delegate-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| format!("creating a temporary file in {}: {e}", dir.display()))?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .and_then(|()| tmp.write_all(dropin_text().as_bytes()))
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| format!("writing {}: {e}", tmp.path().display()))?;
    tmp.persist(&path)
        .map_err(|e| format!("renaming into {}: {e}", path.display()))?;
    Ok(Written::New(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_dropin_once_and_refuses_what_is_not_a_service() {
        let dir = tempfile::tempdir().unwrap();
        let fs = HostFs::with_root(dir.path());
        let unit = "postgresql@15-main.service";
        let path = fs.path(format!(
            "/etc/systemd/system/{unit}.d/50-dbcage-delegate.conf"
        ));
        assert_eq!(write(&fs, unit, true), Ok(Written::New(path.clone())));
        assert!(!path.exists(), "a dry run writes nothing");
        assert_eq!(write(&fs, unit, false), Ok(Written::New(path.clone())));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("[Service]\nDelegate=yes\n"), "{text}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o777,
            0o644,
            "a drop-in anyone may read, as unit files are"
        );
        assert_eq!(
            write(&fs, unit, false),
            Ok(Written::Unchanged(path.clone()))
        );
        // Someone's edit is replaced by dbcage's text.
        std::fs::write(&path, "[Service]\nDelegate=no\n").unwrap();
        assert_eq!(write(&fs, unit, false), Ok(Written::New(path.clone())));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), dropin_text());
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, [DROPIN]);

        let scope = write(&fs, "dbcage-pg.scope", false).unwrap_err();
        assert!(scope.contains("is a scope"), "{scope}");
        let bad = write(&fs, "../../etc/passwd.service", false).unwrap_err();
        assert!(bad.contains("does not allow in a unit name"), "{bad}");
        assert!(!fs.path("/etc/passwd.service.d").exists());
    }
}
