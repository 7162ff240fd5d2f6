//! The Debian package and the documentation that ships in it.
//!
//! `policy_keys_are_documented` (no root needed): every key of the policy schema, read from the
//! field names in src/policy/raw.rs, is accepted by `dbcage::policy::from_str` and appears in
//! man/dbcage.toml.5.
//!
//! `deb_installs_checks_and_purges` (root): builds the .deb with scripts/build-deb.sh (or takes
//! `DBCAGE_DEB`), installs it with dpkg into a fresh root made with `debootstrap
//! --variant=minbase` (or, only when asked with `DBCAGE_TEST_ROOT=host`, an overlay of this
//! machine's own root file system: a chroot of the machine's own packages; a debootstrap that
//! fails is a failure, not a fall-back), runs
//! `dbcage --version` and `dbcage check` on the installed policy inside it (with /proc, /sys and
//! the cgroup mounts bound read-only), `man -l` on each page, `systemd-analyze verify` on the
//! installed unit, reinstalls over an edited conffile, removes and purges. Everything it creates
//! has `dbcage-test` in its name and is unmounted and removed by guards, also on failure.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use crate::common::cannot_run;

const MANIFEST: &str = env!("CARGO_MANIFEST_DIR");

// ---------------------------------------------------------------------------------------------
// policy keys against dbcage.toml(5)

/// One deserialized struct of raw.rs: its name and its TOML keys with their Rust types.
struct RawStruct {
    name: String,
    keys: Vec<(String, String)>,
}

/// Reads the structs that derive `Deserialize` from the source text of src/policy/raw.rs, with
/// each field's TOML key (`#[serde(rename = "...")]` applied).
fn raw_structs() -> Vec<RawStruct> {
    let src = std::fs::read_to_string(Path::new(MANIFEST).join("src/policy/raw.rs")).unwrap();
    let mut out = Vec::new();
    let mut derive_deser = false;
    let mut current: Option<RawStruct> = None;
    let mut rename: Option<String> = None;
    for line in src.lines() {
        let t = line.trim();
        if let Some(s) = current.as_mut() {
            if t == "}" {
                out.push(current.take().unwrap());
                continue;
            }
            if t.starts_with("#[serde(") {
                if let Some(i) = t.find("rename = \"") {
                    let rest = &t[i + 10..];
                    rename = Some(rest[..rest.find('"').unwrap()].to_string());
                }
                continue;
            }
            if let Some(field) = t.strip_prefix("pub ") {
                let (name, ty) = field.split_once(':').expect("a field `name: type`");
                let key = rename.take().unwrap_or_else(|| name.trim().to_string());
                s.keys
                    .push((key, ty.trim().trim_end_matches(',').to_string()));
            }
            continue;
        }
        if t.starts_with("#[derive(") {
            derive_deser = t.contains("Deserialize");
        } else if let Some(rest) = t.strip_prefix("pub struct ") {
            if derive_deser && rest.ends_with('{') {
                current = Some(RawStruct {
                    name: rest.trim_end_matches('{').trim().to_string(),
                    keys: Vec::new(),
                });
            }
            derive_deser = false;
        }
    }
    out
}

/// A value of roughly the right shape for a field type (only the key's acceptance matters).
fn sample_value(ty: &str) -> &'static str {
    if ty.contains("Vec<") {
        "[]"
    } else if ty.contains("bool") {
        "true"
    } else if ty.contains("Quantity") {
        "1"
    } else if ty.contains("Name") {
        "0"
    } else if ty.contains("Raw") {
        "{}"
    } else {
        "\"x\""
    }
}

/// A tiny policy that sets `key = value` in the table the struct is read from.
fn policy_with(strukt: &str, key: &str, value: &str) -> String {
    let tenant = "[[tenant]]\nname = \"t\"\n";
    match strukt {
        "RawFile" => format!("{key} = {value}\n"),
        "RawAgent" => format!("[agent]\n{key} = {value}\n"),
        "RawTenant" if key == "name" => tenant.to_string(),
        "RawTenant" => format!("{tenant}{key} = {value}\n"),
        "RawRule" => format!("{tenant}match = [{{ {key} = {value} }}]\n"),
        "RawIo" => format!("{tenant}[tenant.io]\n{key} = {value}\n"),
        "RawIoDevice" if key == "path" => {
            format!("{tenant}[[tenant.io.device]]\npath = \"/dev/null\"\n")
        }
        "RawIoDevice" => {
            format!("{tenant}[[tenant.io.device]]\npath = \"/dev/null\"\n{key} = {value}\n")
        }
        "RawCpu" => format!("{tenant}[tenant.cpu]\n{key} = {value}\n"),
        "RawMemory" => format!("{tenant}[tenant.memory]\n{key} = {value}\n"),
        "RawReplication" if key == "role" || key == "conninfo" => {
            format!("{tenant}[tenant.replication]\nrole = \"standby\"\nconninfo = \"port=5432\"\n")
        }
        "RawReplication" => format!(
            "{tenant}[tenant.replication]\nrole = \"standby\"\nconninfo = \"port=5432\"\n{key} = {value}\n"
        ),
        "RawSchedule" if key == "from" || key == "to" => {
            format!("{tenant}[[tenant.schedule]]\nfrom = \"22:00\"\nto = \"06:00\"\n")
        }
        "RawSchedule" => format!(
            "{tenant}[[tenant.schedule]]\nfrom = \"22:00\"\nto = \"06:00\"\n{key} = {value}\n"
        ),
        other => panic!(
            "src/policy/raw.rs has a new struct `{other}`: add the table it is read from to \
             policy_with() in tests/it/package.rs, and document its keys in man/dbcage.toml.5"
        ),
    }
}

/// The words a roff page shows as terms: `.TP` tags and section headings.
fn documented_words(man: &str) -> std::collections::BTreeSet<String> {
    let mut words = std::collections::BTreeSet::new();
    let mut after_tp = false;
    for line in man.lines() {
        let heading = line.starts_with(".SH") || line.starts_with(".SS");
        if after_tp || heading {
            let plain = line
                .replace("\\fB", " ")
                .replace("\\fR", " ")
                .replace("\\fI", " ");
            for w in plain.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if !w.is_empty() {
                    words.insert(w.to_string());
                }
            }
        }
        after_tp = line.starts_with(".TP");
    }
    words
}

#[test]
fn policy_keys_are_documented() {
    let structs = raw_structs();
    let names: Vec<&str> = structs.iter().map(|s| s.name.as_str()).collect();
    for expected in [
        "RawFile",
        "RawAgent",
        "RawTenant",
        "RawRule",
        "RawIo",
        "RawCpu",
    ] {
        assert!(
            names.contains(&expected),
            "raw.rs parsing found only {names:?}"
        );
    }
    let man = std::fs::read_to_string(Path::new(MANIFEST).join("man/dbcage.toml.5")).unwrap();
    let words = documented_words(&man);
    let mut missing = Vec::new();
    let mut count = 0;
    for s in &structs {
        for (key, ty) in &s.keys {
            count += 1;
            // The schema accepts the key: no "unknown key" for it (the sample value may still
            // be wrong for the key; that is validation's business, not the schema's).
            let text = policy_with(&s.name, key, sample_value(ty));
            if let Err(e) =
                dbcage::policy::from_str("keys.toml", &text, &dbcage::policy::SystemAccounts)
            {
                let msg = e.to_string();
                assert!(
                    !msg.contains("unknown key"),
                    "{}.{key} read from raw.rs is not accepted by the parser:\n{text}\n{msg}",
                    s.name
                );
            }
            if !words.contains(key) {
                missing.push(format!("{}.{key}", s.name));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "policy keys in src/policy/raw.rs but not documented in man/dbcage.toml.5: {missing:?}"
    );
    println!(
        "{count} policy keys in {} structs: all accepted and documented",
        structs.len()
    );
}

// ---------------------------------------------------------------------------------------------
// the package in a fresh root

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    out
}

fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn have(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Mount points at or under `dir`, from /proc/self/mountinfo.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| m.starts_with(dir))
        .collect()
}

/// A `dbcage-test-pkg-*` directory holding the root; dropping it unmounts whatever is mounted
/// under it (deepest first) and removes it without crossing into any mount that is left.
struct TestDir {
    path: PathBuf,
}

impl TestDir {
    fn new() -> TestDir {
        let path = std::env::temp_dir().join(format!("dbcage-test-pkg-{}", std::process::id()));
        let _ = Command::new("rm")
            .args(["-rf", "--one-file-system"])
            .arg(&path)
            .status();
        std::fs::create_dir(&path).expect("create the test dir");
        TestDir { path }
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let mut mounts = mounts_under(&self.path);
        mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
        for m in &mounts {
            if !run(Command::new("umount").arg(m)).status.success() {
                let _ = run(Command::new("umount").arg("-l").arg(m));
            }
        }
        let left = mounts_under(&self.path);
        if !left.is_empty() {
            eprintln!(
                "cleanup: mounts left under {}: {left:?}; not removing it",
                self.path.display()
            );
            return;
        }
        let _ = Command::new("rm")
            .args(["-rf", "--one-file-system"])
            .arg(&self.path)
            .status();
    }
}

/// Binds `src` at `dst` read-only.
fn bind_ro(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    ok(Command::new("mount").arg("--bind").arg(src).arg(dst));
    ok(Command::new("mount")
        .args(["-o", "remount,bind,ro"])
        .arg(dst));
}

/// Binds /proc, /sys and every mount under /sys/fs/cgroup read-only into `root`; unmounts them
/// when dropped (and `TestDir` unmounts whatever a panic left).
struct ApiMounts {
    mounted: Vec<PathBuf>,
}

impl ApiMounts {
    /// `extra`: more (source, target in the root) pairs to bind read-only.
    fn new(root: &Path, extra: &[(PathBuf, &str)]) -> ApiMounts {
        let mut a = ApiMounts {
            mounted: Vec::new(),
        };
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mut sources = vec![PathBuf::from("/proc")];
        for m in info.lines().filter_map(|l| l.split(' ').nth(4)) {
            if m == "/sys" || m.starts_with("/sys/fs/cgroup") {
                sources.push(PathBuf::from(m));
            }
        }
        for src in sources {
            let dst = root.join(src.strip_prefix("/").unwrap());
            bind_ro(&src, &dst);
            a.mounted.push(dst);
        }
        for (src, target) in extra {
            let dst = root.join(target.trim_start_matches('/'));
            bind_ro(src, &dst);
            a.mounted.push(dst);
        }
        a
    }
}

impl Drop for ApiMounts {
    fn drop(&mut self) {
        for m in self.mounted.iter().rev() {
            if !run(Command::new("umount").arg(m)).status.success() {
                let _ = run(Command::new("umount").arg("-l").arg(m));
            }
        }
    }
}

/// Makes the root: debootstrap minbase (with procps, which the package depends on for the
/// unit's `kill`, and libelf1, which libbpf in the binary links to), or when asked
/// (`DBCAGE_TEST_ROOT=host`) an overlay of this machine's root
/// file system. Returns the root and what it is, or None when debootstrap cannot make the root
/// and the skip is declared (it is not: `cannot_run` fails the test).
fn make_root(dir: &TestDir) -> Option<(PathBuf, String)> {
    let root = dir.path.join("dbcage-test-root");
    let want_host = std::env::var("DBCAGE_TEST_ROOT").is_ok_and(|v| v == "host");
    if !want_host {
        if !have("debootstrap", &["--version"]) {
            cannot_run("debootstrap is missing (scripts/test.sh installs it)");
            return None;
        }
        let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
        let suite = os
            .lines()
            .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
            .unwrap_or("bookworm")
            .trim_matches('"')
            .to_string();
        let mirror = std::env::var("DBCAGE_TEST_MIRROR")
            .unwrap_or_else(|_| "http://deb.debian.org/debian".into());
        let out = run(Command::new("debootstrap")
            .args(["--variant=minbase", "--include=procps,libelf1", &suite])
            .arg(&root)
            .arg(&mirror));
        if out.status.success() {
            return Some((
                root,
                format!("debootstrap --variant=minbase {suite} {mirror}"),
            ));
        }
        let log = String::from_utf8_lossy(&out.stdout);
        let _ = run(Command::new("rm")
            .args(["-rf", "--one-file-system"])
            .arg(&root));
        cannot_run(&format!(
            "debootstrap {suite} {mirror} failed ({}): {} (set DBCAGE_TEST_MIRROR to a reachable mirror)",
            out.status,
            log.lines().last().unwrap_or("")
        ));
        return None;
    }
    // The machine's own packages: its root file system as the lower layer, changes on a tmpfs.
    let layers = dir.path.join("dbcage-test-layers");
    std::fs::create_dir_all(&layers).unwrap();
    ok(Command::new("mount")
        .args(["-t", "tmpfs", "dbcage-test-layers"])
        .arg(&layers));
    for d in ["upper", "work"] {
        std::fs::create_dir(layers.join(d)).unwrap();
    }
    std::fs::create_dir_all(&root).unwrap();
    ok(Command::new("mount")
        .args(["-t", "overlay", "dbcage-test-root", "-o"])
        .arg(format!(
            "lowerdir=/,upperdir={},workdir={}",
            layers.join("upper").display(),
            layers.join("work").display()
        ))
        .arg(&root));
    let status = run(Command::new("chroot")
        .arg(&root)
        .args(["dpkg", "-s", "dbcage"]));
    assert!(
        !status.status.success(),
        "dbcage is installed on this machine; its overlay is no fresh root (use debootstrap)"
    );
    Some((root, "overlay of this machine's root file system".into()))
}

fn chroot(root: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("chroot");
    c.arg(root)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env_remove("DBCAGE_CONFIG");
    c
}

fn mode(p: &Path) -> (u32, u32) {
    let m = std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (m.permissions().mode() & 0o7777, m.uid())
}

fn build_deb() -> PathBuf {
    if let Ok(p) = std::env::var("DBCAGE_DEB") {
        return PathBuf::from(p);
    }
    let out = ok(&mut Command::new(
        Path::new(MANIFEST).join("scripts/build-deb.sh"),
    ));
    PathBuf::from(out.lines().last().expect("build-deb.sh prints the .deb"))
}

#[test]
fn deb_installs_checks_and_purges() {
    if !nix::unistd::Uid::effective().is_root() {
        cannot_run("needs root (dpkg into a chroot)");
        return;
    }
    if std::env::var("DBCAGE_DEB").is_err() && !have("cargo", &["deb", "--version"]) {
        cannot_run("cargo-deb is not installed (scripts/test.sh installs it)");
        return;
    }
    for (program, arg) in [
        ("dpkg", "--version"),
        ("man", "--version"),
        ("chroot", "--version"),
    ] {
        if !have(program, &[arg]) {
            cannot_run(&format!(
                "{program} is missing (scripts/test.sh installs it)"
            ));
            return;
        }
    }
    let t0 = Instant::now();
    let deb = build_deb();
    let t_build = t0.elapsed();
    assert!(deb.is_file(), "{} does not exist", deb.display());

    let dir = TestDir::new();
    let t1 = Instant::now();
    let Some((root, kind)) = make_root(&dir) else {
        return;
    };
    let t_root = t1.elapsed();
    let t2 = Instant::now();
    let r = |p: &str| root.join(p.trim_start_matches('/'));
    std::fs::copy(&deb, r("/tmp/dbcage-test.deb")).unwrap();

    // Install.
    ok(&mut chroot(&root, &["dpkg", "-i", "/tmp/dbcage-test.deb"]));
    assert_eq!(mode(&r("/usr/sbin/dbcage")), (0o755, 0));
    assert_eq!(mode(&r("/etc/dbcage")), (0o700, 0));
    assert_eq!(mode(&r("/etc/dbcage/dbcage.toml")), (0o600, 0));
    assert_eq!(mode(&r("/etc/dbcage/conf.d")), (0o700, 0));
    let example = std::fs::read(Path::new(MANIFEST).join("examples/dbcage.toml")).unwrap();
    assert_eq!(
        std::fs::read(r("/etc/dbcage/dbcage.toml")).unwrap(),
        example
    );
    assert_eq!(
        std::fs::read(r("/usr/share/doc/dbcage/examples/dbcage.toml")).unwrap(),
        example
    );
    for f in [
        "/lib/systemd/system/dbcage.service",
        "/usr/share/bash-completion/completions/dbcage",
        "/usr/share/zsh/vendor-completions/_dbcage",
        "/usr/share/fish/vendor_completions.d/dbcage.fish",
        "/usr/share/man/man5/dbcage.toml.5.gz",
        "/usr/share/man/man8/dbcage.8.gz",
        "/usr/share/man/man8/dbcage-run.8.gz",
    ] {
        assert!(r(f).is_file(), "{f} is not installed");
    }
    let conffiles = ok(&mut chroot(
        &root,
        &["dpkg-query", "-W", "-f", "${Conffiles}", "dbcage"],
    ));
    assert!(conffiles.contains("/etc/dbcage/dbcage.toml"), "{conffiles}");
    // Installed, not enabled (nor started: there is no systemd in the root to start it).
    assert!(!r("/etc/systemd/system/multi-user.target.wants/dbcage.service").exists());

    let version = ok(&mut chroot(&root, &["dbcage", "--version"]));
    assert_eq!(
        version.trim(),
        format!("dbcage {}", env!("CARGO_PKG_VERSION"))
    );

    // `dbcage check` on the installed policy, against this host's /proc, /sys and cgroups.
    // The example's PostgreSQL tenant names /var/lib/postgresql, as a database host has it. In an
    // overlay root no path is on a block device, so there a drop-in moves both tenants' storage
    // to a directory of this machine's disk bound at /var/lib/postgresql.
    std::fs::create_dir_all(r("/var/lib/postgresql")).unwrap();
    let overlay = kind.starts_with("overlay");
    let mut extra = Vec::new();
    let dropin = r("/etc/dbcage/conf.d/dbcage-test.toml");
    if overlay {
        let data = dir.path.join("dbcage-test-pgdata");
        std::fs::create_dir_all(&data).unwrap();
        extra.push((data, "/var/lib/postgresql"));
        std::fs::write(
            &dropin,
            "[[tenant]]\nname = \"DEMO\"\nstorage = [\"/var/lib/postgresql\"]\n",
        )
        .unwrap();
    }
    {
        let _api = ApiMounts::new(&root, &extra);
        let out = ok(&mut chroot(
            &root,
            &["dbcage", "-c", "/etc/dbcage/dbcage.toml", "check"],
        ));
        assert!(
            out.contains("policy OK: /etc/dbcage/dbcage.toml") && out.contains("(2 tenants)"),
            "{out}"
        );
    }
    let _ = std::fs::remove_file(&dropin);

    // Every man page renders.
    let mut pages = Vec::new();
    for sec in ["man5", "man8"] {
        for e in std::fs::read_dir(r(&format!("/usr/share/man/{sec}"))).unwrap() {
            let p = e.unwrap().path();
            if p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("dbcage")
            {
                pages.push(p);
            }
        }
    }
    pages.sort();
    assert!(pages.len() >= 11, "{pages:?}");
    for p in &pages {
        let text = ok(Command::new("man")
            .arg("-l")
            .arg(p)
            .env("MANWIDTH", "80")
            .env("MANPAGER", "cat")
            .env("PAGER", "cat"));
        assert!(
            text.contains("NAME") && text.len() > 200,
            "{}:\n{text}",
            p.display()
        );
    }

    // systemd-analyze verify on the installed unit, its binary and man pages in the root.
    if !have("systemd-analyze", &["--version"]) {
        cannot_run("systemd-analyze is missing (scripts/test.sh installs systemd)");
        return;
    }
    {
        let unit = std::fs::read_to_string(r("/lib/systemd/system/dbcage.service")).unwrap();
        let unit = unit.replace(
            "/usr/sbin/dbcage",
            &r("/usr/sbin/dbcage").display().to_string(),
        );
        let check_dir = dir.path.join("dbcage-test-unit");
        std::fs::create_dir_all(&check_dir).unwrap();
        std::fs::write(check_dir.join("dbcage.service"), unit).unwrap();
        let out = run(Command::new("systemd-analyze")
            .arg("verify")
            .arg(check_dir.join("dbcage.service"))
            .env("MANPATH", r("/usr/share/man")));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.trim().is_empty(),
            "systemd-analyze verify: {}\n{stderr}",
            out.status
        );
    }

    // Reinstalling over the admin's edit keeps it (an unchanged conffile of the same version).
    let edited = format!(
        "{}\n# dbcage-test: the admin's edit\n",
        String::from_utf8_lossy(&example)
    );
    std::fs::write(r("/etc/dbcage/dbcage.toml"), &edited).unwrap();
    ok(&mut chroot(&root, &["dpkg", "-i", "/tmp/dbcage-test.deb"]));
    assert_eq!(
        std::fs::read_to_string(r("/etc/dbcage/dbcage.toml")).unwrap(),
        edited
    );

    // Remove: the program goes, the admin's /etc/dbcage stays.
    ok(&mut chroot(&root, &["dpkg", "-r", "dbcage"]));
    assert!(!r("/usr/sbin/dbcage").exists());
    assert!(!r("/lib/systemd/system/dbcage.service").exists());
    assert_eq!(
        std::fs::read_to_string(r("/etc/dbcage/dbcage.toml")).unwrap(),
        edited
    );
    assert!(r("/etc/dbcage/conf.d").is_dir());
    let state = ok(&mut chroot(
        &root,
        &["dpkg-query", "-W", "-f", "${db:Status-Abbrev}", "dbcage"],
    ));
    assert_eq!(state.trim(), "rc", "after dpkg -r");

    // Purge: /etc/dbcage goes too.
    ok(&mut chroot(&root, &["dpkg", "--purge", "dbcage"]));
    assert!(!r("/etc/dbcage").exists(), "purge left /etc/dbcage");
    let gone = run(&mut chroot(&root, &["dpkg", "-s", "dbcage"]));
    assert!(!gone.status.success());

    println!(
        "package: {} built in {:.1?}; root ({kind}) in {:.1?}; install, check, {} man pages, verify, reinstall, remove, purge in {:.1?}",
        deb.display(),
        t_build,
        t_root,
        pages.len(),
        t2.elapsed()
    );
}
