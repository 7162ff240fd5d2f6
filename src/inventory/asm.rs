//! An ASM diskgroup as storage: the entry `asm:<diskgroup>:<diskstring>` (what `preset =
//! "oracle"` writes for `asm_diskgroup` + `asm_diskstring`) stands for the disks that
//! `asmcmd lsdsk -G <diskgroup> --suppressheader` lists. It is run again at every device
//! resolution (`apply`, each daemon rescan), so a disk added to or dropped from the group changes
//! the tenant's devices and the instance total is divided again over the new count.
//!
//! asmcmd is looked up in `PATH`, then as `<home>/bin/asmcmd` for the first `+ASM` line of
//! /etc/oratab. It runs as the owner of the asmcmd file (the grid user, whose OS authentication
//! ASM accepts), with ORACLE_HOME (the directory above its `bin`) and ORACLE_SID (oratab's `+ASM`
//! entry, else `+ASM`) set unless the environment has them, and is stopped after 60 seconds.
//!
//! `lsdsk` prints one disk per line: a path (`/dev/oracleasm/disks/DATA1`, `/dev/sdc1`), or an
//! ASMLib or filter-driver label (`ORCL:DATA1` → /dev/oracleasm/disks/DATA1, `AFD:DATA1` →
//! /dev/oracleafd/disks/DATA1). Every disk must match the diskstring (comma-separated globs,
//! as ASM_DISKSTRING is written): a disk outside it is an error, not silently limited.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::hostfs::HostFs;

/// How long asmcmd may take before it is stopped (it starts a Perl interpreter and connects to
/// the ASM instance: seconds, not minutes).
const TIMEOUT: Duration = Duration::from_secs(60);

pub use crate::policy::asm::AsmSpec;

/// Why a diskgroup's disks could not be listed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AsmError {
    /// The entry's text (`AsmSpec::parse`) or a listed disk outside the diskstring.
    #[error("{0}")]
    Spec(String),
    #[error("diskgroup {diskgroup}: asmcmd is not in PATH and /etc/oratab has no +ASM home; list the disks with asm_disks instead")]
    NoAsmcmd { diskgroup: String },
    #[error("diskgroup {diskgroup}: {} lsdsk: {reason}", asmcmd.display())]
    Lsdsk {
        diskgroup: String,
        asmcmd: PathBuf,
        reason: RunError,
    },
    #[error("diskgroup {diskgroup}: {reason}")]
    Listing {
        diskgroup: String,
        reason: ListingError,
    },
}

/// Why running asmcmd failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// Reading asmcmd's metadata, starting it or waiting for it (the kernel's message).
    #[error("{0}")]
    Io(String),
    #[error("no answer within {0}s, stopped")]
    Timeout(u64),
    #[error("{status}: {why}")]
    Failed {
        status: std::process::ExitStatus,
        why: String,
    },
}

/// What is wrong with asmcmd's listing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListingError {
    /// A line that is not one disk (an error asmcmd printed with status 0, or several columns).
    #[error("asmcmd: {0}")]
    Line(String),
    #[error("asmcmd lists no disks")]
    Empty,
}

impl From<std::io::Error> for RunError {
    fn from(e: std::io::Error) -> RunError {
        RunError::Io(e.to_string())
    }
}

/// The disks in `asmcmd lsdsk --suppressheader` output, one per line. asmcmd reports some
/// failures on stdout with status 0 (`ASMCMD-8001: diskgroup 'X' does not exist or is not
/// mounted`, `Connected to an idle instance.`): those, and any line with more than one column,
/// are errors. An empty listing is an error too: a mounted diskgroup has disks.
pub fn parse_lsdsk(text: &str) -> Result<Vec<String>, ListingError> {
    let mut disks = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with("ASMCMD-")
            || line.starts_with("ORA-")
            || line.starts_with("Connected to an idle instance")
            || line.split_whitespace().count() != 1
        {
            return Err(ListingError::Line(line.to_string()));
        }
        if line == "Path" {
            continue; // the header, if --suppressheader was not honoured
        }
        disks.push(line.to_string());
    }
    if disks.is_empty() {
        return Err(ListingError::Empty);
    }
    Ok(disks)
}

/// asmcmd, and the ORACLE_HOME and ORACLE_SID it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asmcmd {
    pub path: PathBuf,
    pub home: Option<PathBuf>,
    pub sid: String,
}

/// The first `+ASM` entry of an oratab: (sid, home).
pub fn oratab_asm(text: &str) -> Option<(String, PathBuf)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let mut f = l.split(':');
            let sid = f.next()?;
            let home = f.next()?;
            (sid.starts_with("+ASM") && home.starts_with('/'))
                .then(|| (sid.to_string(), PathBuf::from(home)))
        })
}

pub fn find_asmcmd(fs: &HostFs) -> Option<Asmcmd> {
    let oratab = fs.read_to_string("/etc/oratab").ok();
    let asm = oratab.as_deref().and_then(oratab_asm);
    let sid = asm
        .as_ref()
        .map(|(s, _)| s.clone())
        .unwrap_or_else(|| "+ASM".into());
    let in_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("asmcmd"))
            .find(|c| c.is_absolute() && fs.path(c).is_file())
    });
    let path = in_path.or_else(|| {
        asm.as_ref()
            .map(|(_, h)| h.join("bin/asmcmd"))
            .filter(|c| fs.path(c).is_file())
    })?;
    let home = path
        .parent()
        .filter(|b| b.ends_with("bin"))
        .and_then(Path::parent)
        .map(Path::to_path_buf);
    Some(Asmcmd { path, home, sid })
}

/// How long one asmcmd answer is reused: the daemon rescans every 30 s by default, and each
/// asmcmd run costs seconds of CPU (seed 000 re-read its diskgroup hourly).
const REUSE: Duration = Duration::from_secs(300);

/// One asmcmd answer: when, what the diskstring matched then, and the disks.
type Cache = std::collections::HashMap<(PathBuf, AsmSpec), (Instant, Vec<PathBuf>, Vec<String>)>;
static CACHE: std::sync::Mutex<Option<Cache>> = std::sync::Mutex::new(None);

impl AsmSpec {
    /// The device globs the diskstring stands for (labels live in the ASMLib and AFD dirs).
    pub fn device_globs(&self) -> Vec<String> {
        self.diskstring
            .iter()
            .map(|g| {
                if let Some(l) = g.strip_prefix("ORCL:") {
                    format!("/dev/oracleasm/disks/{l}")
                } else if let Some(l) = g.strip_prefix("AFD:") {
                    format!("/dev/oracleafd/disks/{l}")
                } else {
                    g.clone()
                }
            })
            .collect()
    }

    /// Every path the diskstring matches now (cheap: a glob, no asmcmd).
    fn candidates(&self, fs: &HostFs) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = self
            .device_globs()
            .iter()
            .filter_map(|g| glob::glob(&fs.path(g).to_string_lossy()).ok())
            .flat_map(|paths| paths.flatten())
            .collect();
        out.sort();
        out
    }
}

/// The device paths of the diskgroup's disks, from asmcmd. A successful answer is reused for
/// five minutes, or until the set of devices the diskstring matches changes (a new LUN shows
/// up there before ASM can add it); failures are retried at the next resolution.
pub fn list_disks(fs: &HostFs, spec: &AsmSpec) -> Result<Vec<String>, AsmError> {
    let key = (fs.root().to_path_buf(), spec.clone());
    let candidates = spec.candidates(fs);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((at, seen, disks)) = cache.get_or_insert_with(Default::default).get(&key) {
        if at.elapsed() < REUSE && *seen == candidates {
            return Ok(disks.clone());
        }
    }
    let disks = list_disks_now(fs, spec)?;
    cache
        .get_or_insert_with(Default::default)
        .insert(key, (Instant::now(), candidates, disks.clone()));
    Ok(disks)
}

fn list_disks_now(fs: &HostFs, spec: &AsmSpec) -> Result<Vec<String>, AsmError> {
    let diskgroup = || spec.diskgroup.clone();
    let cmd = find_asmcmd(fs).ok_or_else(|| AsmError::NoAsmcmd {
        diskgroup: diskgroup(),
    })?;
    let out = run(fs, &cmd, &spec.diskgroup).map_err(|reason| AsmError::Lsdsk {
        diskgroup: diskgroup(),
        asmcmd: cmd.path.clone(),
        reason,
    })?;
    let disks = parse_lsdsk(&out).map_err(|reason| AsmError::Listing {
        diskgroup: diskgroup(),
        reason,
    })?;
    disks
        .iter()
        .map(|d| spec.disk_path(d).map_err(AsmError::Spec))
        .collect()
}

fn run(fs: &HostFs, cmd: &Asmcmd, group: &str) -> Result<String, RunError> {
    let exe = fs.path(&cmd.path);
    let meta = std::fs::metadata(&exe)?;
    let mut c = Command::new(&exe);
    c.args(["lsdsk", "-G", group, "--suppressheader"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if std::env::var_os("ORACLE_HOME").is_none() {
        if let Some(h) = &cmd.home {
            c.env("ORACLE_HOME", h);
        }
    }
    if std::env::var_os("ORACLE_SID").is_none() {
        c.env("ORACLE_SID", &cmd.sid);
    }
    if meta.uid() != 0 && nix::unistd::geteuid().is_root() {
        c.uid(meta.uid()).gid(meta.gid());
    }
    let mut child = c.spawn()?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait()? {
            Some(s) => break s,
            None if start.elapsed() > TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(RunError::Timeout(TIMEOUT.as_secs()));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let out = reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    if !status.success() {
        let why = err
            .lines()
            .chain(out.lines())
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(RunError::Failed {
            status,
            why: why.to_string(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `asmcmd lsdsk -G DATA --suppressheader` on an ASMLib host: the Path column alone, one
    /// disk per line (fixture written from the documented format of lsdsk).
    const LSDSK_ASMLIB: &str = include_str!("../../tests/fixtures/asm/lsdsk-asmlib.txt");
    /// The same on a host whose diskstring lists device paths (udev rules).
    const LSDSK_PATHS: &str = include_str!("../../tests/fixtures/asm/lsdsk-paths.txt");

    #[test]
    fn lsdsk_output_is_parsed_and_labels_become_device_paths() {
        let spec = AsmSpec::parse("DATA:ORCL:*").unwrap();
        let disks: Vec<String> = parse_lsdsk(LSDSK_ASMLIB)
            .unwrap()
            .iter()
            .map(|d| spec.disk_path(d).unwrap())
            .collect();
        assert_eq!(
            disks,
            [
                "/dev/oracleasm/disks/DATA01",
                "/dev/oracleasm/disks/DATA02",
                "/dev/oracleasm/disks/DATA03",
                "/dev/oracleasm/disks/DATA04"
            ]
        );
        let spec = AsmSpec::parse("DATA:/dev/oracleasm/disks/*, /dev/mapper/asm*").unwrap();
        let disks = parse_lsdsk(LSDSK_PATHS).unwrap();
        assert_eq!(disks.len(), 3);
        assert_eq!(
            spec.disk_path(&disks[2]).unwrap(),
            "/dev/mapper/asmdata03p1"
        );
    }

    #[test]
    fn a_disk_outside_the_diskstring_is_an_error() {
        let spec = AsmSpec::parse("DATA:/dev/oracleasm/disks/*").unwrap();
        let e = spec.disk_path("/dev/sdc1").unwrap_err();
        assert!(
            e.contains("asm_diskstring `/dev/oracleasm/disks/*` does not match"),
            "{e}"
        );
        let e = spec.disk_path("ORCL:DATA1").unwrap_err();
        assert!(e.contains("does not match"), "{e}");
        // A glob does not cross directories.
        assert!(spec.disk_path("/dev/oracleasm/disks/x/../../sda").is_err());
        assert!(spec.disk_path("/dev/oracleasm/disks/sub/DATA1").is_err());
    }

    #[test]
    fn asmcmd_failures_are_errors_not_empty_diskgroups() {
        for text in [
            "ASMCMD-8001: diskgroup 'FRA' does not exist or is not mounted\n",
            "Connected to an idle instance.\n",
            "ORA-01017: invalid username/password; logon denied\n",
            "",
            "13-JUL-09 13-JUL-09 0 /dev/sdc1\n",
        ] {
            assert!(parse_lsdsk(text).is_err(), "{text:?}");
        }
        assert_eq!(parse_lsdsk("Path\n/dev/sdc1\n").unwrap(), ["/dev/sdc1"]);
    }

    #[test]
    fn specs_are_checked() {
        for bad in [
            "DATA",
            "1DATA:/dev/*",
            "DA TA:/dev/*",
            "DATA:dev/*",
            "DATA:/dev/../x*",
            "DATA:ORCL:",
            "DATA:/dev/[",
        ] {
            assert!(AsmSpec::parse(bad).is_err(), "{bad}");
        }
        let s = AsmSpec::parse("DATA:/dev/oracleasm/disks/*,AFD:*").unwrap();
        assert_eq!(s.diskstring, ["/dev/oracleasm/disks/*", "AFD:*"]);
        assert_eq!(
            s.disk_path("AFD:DATA1").unwrap(),
            "/dev/oracleafd/disks/DATA1"
        );
    }

    #[test]
    fn oratab_gives_the_asm_home() {
        let text = "# comment\nBX1:/u01/app/oracle/product/19.0.0/dbhome_1:N\n+ASM1:/u01/app/19.0.0/grid:N\n";
        assert_eq!(
            oratab_asm(text),
            Some(("+ASM1".into(), PathBuf::from("/u01/app/19.0.0/grid")))
        );
        assert_eq!(oratab_asm("BX1:/u01/x:N\n"), None);
    }
}
