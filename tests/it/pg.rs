//! PostgreSQL servers for the tests: each cluster on its own loop-backed ext4 file system,
//! reachable only through a unix socket in a directory on that file system, started with
//! `pg_ctl` as the `postgres` user. Dropping a `PgCluster` stops the server (immediate shutdown;
//! SIGKILL of the postmaster named by its pid file if that fails) before the disk is unmounted.
//! Also the daemon tests' helpers for a postmaster run directly as a child.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::common::*;

pub const BIN: &str = "/usr/lib/postgresql/15/bin";
pub const POSTGRES: &str = "/usr/lib/postgresql/15/bin/postgres";
pub const INITDB: &str = "/usr/lib/postgresql/15/bin/initdb";

/// The `postgres` account; fails the test (`cannot_run`, naming what is missing) when
/// PostgreSQL 15 is not installed.
pub fn pg_user() -> Option<nix::unistd::User> {
    let Ok(Some(u)) = nix::unistd::User::from_name("postgres") else {
        cannot_run("no postgres user (scripts/test.sh installs postgresql-15)");
        return None;
    };
    for b in [
        "postgres",
        "initdb",
        "pg_ctl",
        "pgbench",
        "pg_basebackup",
        "psql",
    ] {
        if !Path::new(BIN).join(b).exists() {
            cannot_run(&format!(
                "{BIN}/{b} is not installed (scripts/test.sh installs postgresql-15)"
            ));
            return None;
        }
    }
    Some(u)
}

/// A PostgreSQL postmaster run by the test as its child; dropping it asks for a fast shutdown
/// (SIGINT, by pid) and waits, then kills it if it is still there.
pub struct Postmaster {
    pub child: Child,
}

impl Drop for Postmaster {
    fn drop(&mut self) {
        if self.child.alive() {
            let pid = nix::unistd::Pid::from_raw(self.child.pid as i32);
            let _ = nix::sys::signal::kill(pid, Signal::SIGINT);
            if !wait_until(Duration::from_secs(15), || !self.child.alive()) {
                eprintln!(
                    "cleanup: postgres {} did not shut down; killing it",
                    self.child.pid
                );
            }
        }
    }
}

/// (pid, cmdline) of every child of `ppid`.
pub fn children_of(ppid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        if rest.split(' ').nth(1).and_then(|p| p.parse::<u32>().ok()) != Some(ppid) {
            continue;
        }
        let raw = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&raw)
            .split('\0')
            .collect::<Vec<_>>()
            .join(" ")
            .trim_end()
            .to_string();
        out.push((pid, cmdline));
    }
    out
}

/// One cluster on its own loop disk. Field order matters: the disk is unmounted after `Drop`
/// has stopped the server.
pub struct PgCluster {
    /// `dbcage-test-<sid>-<tag>`: the `cluster_name`, so process titles name the cluster.
    pub name: String,
    pub data: PathBuf,
    /// The unix socket directory (`psql -h`).
    pub sock: PathBuf,
    pub log: PathBuf,
    pub port: u16,
    user: nix::unistd::User,
    pub disk: LoopDisk,
}

impl PgCluster {
    /// `initdb` on a fresh `size_mib` loop disk, with `conf` lines appended to postgresql.conf.
    pub fn init(user: &nix::unistd::User, tag: &str, size_mib: u64, conf: &[&str]) -> PgCluster {
        let disk = LoopDisk::new(size_mib);
        let c = PgCluster::on_disk(user, tag, disk);
        std::fs::create_dir(&c.data).unwrap();
        c.chown(&c.data);
        let t0 = Instant::now();
        c.run_ok(
            "initdb",
            &[
                "-D",
                &c.data_str(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        );
        c.configure(conf);
        println!("{}: initdb {:.1} s", c.name, t0.elapsed().as_secs_f64());
        c
    }

    /// A cluster directory layout on `disk` without a data directory yet (for pg_basebackup).
    pub fn on_disk(user: &nix::unistd::User, tag: &str, disk: LoopDisk) -> PgCluster {
        // The disk's temp dir is private: the postgres user must be able to enter it.
        let parent = disk.mount.parent().unwrap().to_path_buf();
        std::fs::set_permissions(&parent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let base = disk.mount.join("dbcage-test-pg");
        let c = PgCluster {
            name: format!("dbcage-test-{}-{tag}", sid()),
            data: base.join("data"),
            sock: base.join("sock"),
            log: base.join("server.log"),
            port: 5432,
            user: user.clone(),
            disk,
        };
        for d in [&base, &c.sock] {
            std::fs::create_dir(d).unwrap();
            c.chown(d);
        }
        c
    }

    /// Appends the test settings (socket only, in `sock`; the cluster name) and `conf`.
    pub fn configure(&self, conf: &[&str]) {
        let mut text = format!(
            "\n# dbcage test\nlisten_addresses = ''\nunix_socket_directories = '{}'\nport = {}\ncluster_name = '{}'\n",
            self.sock.display(),
            self.port,
            self.name
        );
        for l in conf {
            text.push_str(l);
            text.push('\n');
        }
        let path = self.data.join("postgresql.conf");
        let mut old = std::fs::read_to_string(&path).unwrap_or_default();
        old.push_str(&text);
        std::fs::write(&path, old).unwrap();
    }

    fn chown(&self, p: &Path) {
        nix::unistd::chown(p, Some(self.user.uid), Some(self.user.gid)).unwrap();
    }

    pub fn data_str(&self) -> String {
        self.data.to_string_lossy().into_owned()
    }

    /// `BIN/program args...` as the postgres user.
    pub fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(Path::new(BIN).join(program));
        cmd.args(args)
            .uid(self.user.uid.as_raw())
            .gid(self.user.gid.as_raw())
            .current_dir(self.disk.mount.join("dbcage-test-pg"))
            .env("LC_ALL", "C")
            .env("PGHOST", &self.sock)
            .env("PGPORT", self.port.to_string())
            .env("PGUSER", "postgres")
            .env("PGDATABASE", "postgres")
            .env_remove("PGDATA")
            .stdin(Stdio::null());
        cmd
    }

    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        self.command(program, args)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"))
    }

    pub fn run_ok(&self, program: &str, args: &[&str]) -> String {
        let out = self.run(program, args);
        assert!(
            out.status.success(),
            "{}: {program} {args:?}: {}\n{}\nserver log:\n{}",
            self.name,
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.server_log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `pg_ctl start -w`: returns once the server accepts connections.
    pub fn start(&self) {
        let log = self.log.to_string_lossy().into_owned();
        self.run_ok(
            "pg_ctl",
            &[
                "start",
                "-w",
                "-t",
                "60",
                "-D",
                &self.data_str(),
                "-l",
                &log,
            ],
        );
    }

    pub fn restart(&self) {
        let log = self.log.to_string_lossy().into_owned();
        self.run_ok(
            "pg_ctl",
            &[
                "restart",
                "-w",
                "-t",
                "60",
                "-m",
                "fast",
                "-D",
                &self.data_str(),
                "-l",
                &log,
            ],
        );
    }

    /// The PID on postmaster.pid's first line, if the file is there.
    pub fn postmaster_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// `psql -XAtq -c SQL`, its output trimmed (panics on failure).
    pub fn sql(&self, sql: &str) -> String {
        self.run_ok("psql", &["-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .trim()
            .to_string()
    }

    pub fn server_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.postmaster_pid().is_none() {
            return;
        }
        let out = self.run(
            "pg_ctl",
            &[
                "stop",
                "-w",
                "-t",
                "30",
                "-m",
                "immediate",
                "-D",
                &self.data_str(),
            ],
        );
        if out.status.success() {
            return;
        }
        eprintln!(
            "cleanup: pg_ctl stop for {}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        // Kill the postmaster we started, named by its pid file, if it still runs this data dir.
        if let Some(pid) = self.postmaster_pid() {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&self.data_str()) {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
                wait_until(Duration::from_secs(10), || {
                    !Path::new(&format!("/proc/{pid}")).exists() && children_of(pid).is_empty()
                });
            }
        }
    }
}
