//! `preset = "oracle"`: one Oracle database instance, named by its SID.
//!
//! Processes are matched on their command line (argv as `ps -eo args` shows it), never on comm:
//! the kernel truncates comm to 15 characters (`ora_pmon_BXTST02` is 16) and 12c+ foregrounds
//! set comm to `oracle_<pid>_<sid>`. Every pattern is anchored at both ends of the name, so SID
//! `BX1` does not take `BX10`'s processes, and none matches the listener (`tnslsnr`): a listener
//! shared by several instances must stay out of every instance's group, or the sessions it
//! forks would all start in that one instance's group (seed 000's discussion).
//!
//! Rules, in order (names for `preset_omit`):
//! - `background` (match): `^ora_[a-z0-9]+_SID( |$)`: every background process and slave:
//!   pmon, smon, dbw0, ckpt, mmon, reco, arc0, the parallel query slaves p000..p00z, job queue
//!   slaves j000, shared servers s000, dispatchers d000, and so on.
//! - `foreground` (match): `^oracleSID \((LOCAL=(NO|YES)\)|DESCRIPTION=)`: dedicated server
//!   processes, forked by a listener (`(LOCAL=NO)`) or by a local client through bequeath
//!   (`(LOCAL=YES)`, `(DESCRIPTION=(LOCAL=YES)(ADDRESS=(PROTOCOL=beq)))`).
//! - `log_writers` (exempt): `^ora_lg[a-z0-9]{2}_SID( |$)`: lgwr and its workers lg00, lg01...
//!   in the tenant's exempt leaf (its CPU and memory limits, no IO limit), so that commits do
//!   not wait behind the instance's own throttled reads. `preset_omit = ["log_writers"]` puts
//!   them under the IO limits with the other background processes.
//!
//! Storage: `asm_disks` (globs or device paths), and/or `asm_diskgroup` with `asm_diskstring`,
//! which becomes the storage entry `asm:<diskgroup>:<diskstring>`: `asmcmd lsdsk` lists the
//! group's disks at every device resolution (see `inventory::asm`).

use super::Expansion;
use crate::policy::raw::{RawRule, RawTenant};
use crate::policy::source::Loc;

pub fn keys(t: &RawTenant) -> Vec<Loc<&'static str>> {
    let mut out = Vec::new();
    if let Some(k) = &t.sid {
        out.push(k.here("sid"));
    }
    if let Some(k) = &t.asm_disks {
        out.push(k.here("asm_disks"));
    }
    if let Some(k) = &t.asm_diskstring {
        out.push(k.here("asm_diskstring"));
    }
    if let Some(k) = &t.asm_diskgroup {
        out.push(k.here("asm_diskgroup"));
    }
    out
}

/// An ORACLE_SID: letters, digits, `_`, `$`, `#` (no `+`: an ASM instance is not a database).
fn valid_sid(sid: &str) -> bool {
    !sid.is_empty()
        && sid.len() <= 30
        && sid.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && sid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '#'))
}

pub fn background(sid: &str) -> String {
    format!("^ora_[a-z0-9]+_{}( |$)", regex::escape(sid))
}

pub fn foreground(sid: &str) -> String {
    format!(
        r"^oracle{} \((LOCAL=(NO|YES)\)|DESCRIPTION=)",
        regex::escape(sid)
    )
}

pub fn log_writers(sid: &str) -> String {
    format!("^ora_lg[a-z0-9]{{2}}_{}( |$)", regex::escape(sid))
}

fn cmdline_rule(at: &Loc<String>, re: String) -> RawRule {
    RawRule {
        cmdline: Some(at.here(re)),
        ..Default::default()
    }
}

pub fn expand(t: &RawTenant, key: &Loc<String>) -> Result<Expansion, Vec<Loc<String>>> {
    let name = &t.name.value;
    let mut problems = Vec::new();
    let sid = match &t.sid {
        None => {
            problems.push(key.here(format!(
                "tenant `{name}`: preset `oracle` needs `sid` (the instance's ORACLE_SID)"
            )));
            None
        }
        Some(s) if !valid_sid(&s.value) => {
            problems.push(s.here(format!(
                "tenant `{name}`: sid `{}` is not an ORACLE_SID (a letter, then letters, digits, `_`, `$` or `#`)",
                s.value
            )));
            None
        }
        Some(s) => Some(s),
    };
    let mut e = Expansion::default();
    if let Some(disks) = &t.asm_disks {
        let items = disks.value.items();
        if items.is_empty() {
            problems.push(disks.here(format!("tenant `{name}`: asm_disks is empty")));
        }
        for d in items {
            if !d.starts_with('/') || d.split('/').any(|c| c == "..") {
                problems.push(disks.here(format!(
                    "tenant `{name}`: asm_disks entry `{d}` must be an absolute path or glob without `..`"
                )));
            } else {
                e.storage.push(d);
            }
        }
    }
    match (&t.asm_diskgroup, &t.asm_diskstring) {
        (Some(g), Some(s)) => {
            let spec = format!("{}:{}", g.value, s.value);
            match crate::policy::asm::AsmSpec::parse(&spec) {
                Ok(_) => e.storage.push(format!("asm:{spec}")),
                Err(m) => problems.push(g.here(format!("tenant `{name}`: {m}"))),
            }
        }
        (Some(g), None) => problems.push(g.here(format!(
            "tenant `{name}`: asm_diskgroup needs asm_diskstring (ASM's discovery string, e.g. \"/dev/oracleasm/disks/*\")"
        ))),
        (None, Some(s)) => problems.push(s.here(format!(
            "tenant `{name}`: asm_diskstring needs asm_diskgroup (the diskgroup whose disks to limit)"
        ))),
        (None, None) => {}
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let sid = &sid.expect("checked above").value;
    e.named_rule("background", cmdline_rule(key, background(sid)));
    e.named_rule("foreground", cmdline_rule(key, foreground(sid)));
    e.named_exempt("log_writers", cmdline_rule(key, log_writers(sid)));
    Ok(e)
}

#[cfg(test)]
mod tests {
    use crate::classify::{classify, Leaf};
    use crate::inventory::ProcInfo;
    use crate::policy::{from_str, FakeAccounts};

    fn proc(pid: u32, cmdline: &str) -> ProcInfo {
        let comm: String = cmdline
            .split(' ')
            .next()
            .unwrap()
            .chars()
            .take(15)
            .collect();
        ProcInfo {
            pid,
            ppid: 1,
            comm: comm.into(),
            cmdline: cmdline.into(),
            exe: None,
            uid: 54321,
            gid: 54321,
            start_time: 0,
            unit: None,
        }
    }

    const POLICY: &str = r#"
[[tenant]]
name = "BX1"
preset = "oracle"
sid = "BX1"
"#;

    /// (cmdline, where it goes for the BX1 tenant)
    const CASES: &[(&str, Option<Leaf>)] = &[
        ("ora_pmon_BX1", Some(Leaf::Limited)),
        ("ora_smon_BX1", Some(Leaf::Limited)),
        ("ora_dbw0_BX1", Some(Leaf::Limited)),
        ("ora_dbwa_BX1", Some(Leaf::Limited)),
        ("ora_ckpt_BX1", Some(Leaf::Limited)),
        ("ora_mmon_BX1", Some(Leaf::Limited)),
        ("ora_reco_BX1", Some(Leaf::Limited)),
        ("ora_arc0_BX1", Some(Leaf::Limited)),
        ("ora_p000_BX1", Some(Leaf::Limited)),
        ("ora_p00z_BX1", Some(Leaf::Limited)),
        ("ora_p1a9_BX1", Some(Leaf::Limited)),
        ("ora_j000_BX1", Some(Leaf::Limited)),
        ("ora_j013_BX1", Some(Leaf::Limited)),
        ("ora_s000_BX1", Some(Leaf::Limited)),
        ("ora_d000_BX1", Some(Leaf::Limited)),
        ("ora_w00a_BX1", Some(Leaf::Limited)),
        ("ora_lreg_BX1", Some(Leaf::Limited)),
        ("oracleBX1 (LOCAL=NO)", Some(Leaf::Limited)),
        ("oracleBX1 (LOCAL=YES)", Some(Leaf::Limited)),
        (
            "oracleBX1 (DESCRIPTION=(LOCAL=YES)(ADDRESS=(PROTOCOL=beq)))",
            Some(Leaf::Limited),
        ),
        ("ora_lgwr_BX1", Some(Leaf::Exempt)),
        ("ora_lg00_BX1", Some(Leaf::Exempt)),
        ("ora_lg01_BX1", Some(Leaf::Exempt)),
        // Another instance whose SID starts with BX1, or ends with it.
        ("ora_pmon_BX10", None),
        ("ora_lgwr_BX10", None),
        ("ora_p000_BX10", None),
        ("oracleBX10 (LOCAL=NO)", None),
        ("ora_pmon_XBX1", None),
        ("ora_pmon_A_BX1", None),
        ("oracleXBX1 (LOCAL=NO)", None),
        // ASM's own instance, and the listeners (shared or not).
        ("asm_pmon_+ASM", None),
        ("ora_pmon_+ASM", None),
        (
            "/u01/app/oracle/product/19.0.0/dbhome_1/bin/tnslsnr LISTENER -inherit",
            None,
        ),
        ("tnslsnr LISTENER_BX1 -inherit", None),
        (
            "/u01/app/oracle/product/19.0.0/dbhome_1/bin/tnslsnr BX1 -inherit",
            None,
        ),
        // Tools that name the SID in their arguments are not the instance.
        ("sqlplus / as sysdba", None),
        ("grep ora_pmon_BX1", None),
        (
            "tail -f /u01/app/oracle/diag/rdbms/bx1/BX1/trace/alert_BX1.log",
            None,
        ),
        ("oracleBX1", None),
        ("ORA_PMON_BX1", None),
    ];

    #[test]
    fn every_pattern_places_the_seed_names_and_nothing_else() {
        let p = from_str("p.toml", POLICY, &FakeAccounts).unwrap().policy;
        let procs: Vec<ProcInfo> = CASES
            .iter()
            .enumerate()
            .map(|(i, (c, _))| proc(100 + i as u32, c))
            .collect();
        let placed = classify(&p.tenants, &procs);
        for (i, (c, want)) in CASES.iter().enumerate() {
            let got = placed.iter().find(|pl| pl.pid == 100 + i as u32);
            assert_eq!(got.map(|g| g.leaf), *want, "{c}: {got:?}");
        }
    }

    #[test]
    fn a_long_sid_is_matched_on_the_command_line_not_the_truncated_comm() {
        let text = POLICY.replace("BX1", "BXTST02");
        let p = from_str("p.toml", &text, &FakeAccounts).unwrap().policy;
        let procs = [
            proc(10, "ora_pmon_BXTST02"),
            proc(11, "ora_lgwr_BXTST02"),
            proc(12, "oracleBXTST02 (LOCAL=NO)"),
            proc(13, "ora_pmon_BXTST0"),
        ];
        assert_eq!(&*procs[0].comm, "ora_pmon_BXTST0");
        let placed = classify(&p.tenants, &procs);
        let leaf = |pid| placed.iter().find(|p| p.pid == pid).map(|p| p.leaf);
        assert_eq!(leaf(10), Some(Leaf::Limited));
        assert_eq!(leaf(11), Some(Leaf::Exempt));
        assert_eq!(leaf(12), Some(Leaf::Limited));
        assert_eq!(leaf(13), None, "instance BXTST0 is another one");
    }

    #[test]
    fn two_instances_one_prefix_of_the_other_do_not_overlap() {
        let text = format!("{POLICY}{}", POLICY.replace("BX1", "BX10"));
        let loaded = from_str("p.toml", &text, &FakeAccounts).unwrap();
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let procs = [proc(10, "ora_pmon_BX1"), proc(11, "ora_pmon_BX10")];
        let placed = classify(&loaded.policy.tenants, &procs);
        assert_eq!(placed[0].tenant, 0);
        assert_eq!(placed[1].tenant, 1);
    }

    #[test]
    fn the_log_writer_exemption_can_be_omitted_and_rules_added() {
        let text = format!(
            "{POLICY}preset_omit = [\"log_writers\"]\nmatch = [{{ cmdline = '^rman ' }}]\n"
        );
        let p = from_str("p.toml", &text, &FakeAccounts).unwrap().policy;
        let t = &p.tenants[0];
        assert!(t.exempt.is_empty());
        assert_eq!(t.rules.len(), 3);
        let placed = classify(
            &p.tenants,
            &[proc(10, "ora_lgwr_BX1"), proc(11, "rman target /")],
        );
        assert_eq!(placed.len(), 2);
        assert!(placed.iter().all(|p| p.leaf == Leaf::Limited));

        let text = format!("{POLICY}preset_omit = [\"foreground\"]\n");
        let p = from_str("p.toml", &text, &FakeAccounts).unwrap().policy;
        let placed = classify(&p.tenants, &[proc(10, "oracleBX1 (LOCAL=NO)")]);
        assert!(placed.is_empty());
    }

    #[test]
    fn mistakes_are_located_and_explained() {
        let cases: &[(&str, &str, &str)] = &[
            ("", "p.toml:4:10", "needs `sid`"),
            ("sid = \"BX+1\"\n", "p.toml:5:7", "not an ORACLE_SID"),
            (
                "sid = \"BX1\"\npreset_omit = [\"lgwr\"]\n",
                "p.toml:6:15",
                "`lgwr` is not a rule of preset `oracle`; its rules are: background, foreground, log_writers",
            ),
            (
                "sid = \"BX1\"\nasm_disks = \"dev/sdb\"\n",
                "p.toml:6:13",
                "must be an absolute path",
            ),
            (
                "sid = \"BX1\"\nasm_diskgroup = \"DATA\"\n",
                "p.toml:6:17",
                "asm_diskgroup needs asm_diskstring",
            ),
            (
                "sid = \"BX1\"\nasm_diskgroup = \"DA TA\"\nasm_diskstring = \"/dev/sd*\"\n",
                "p.toml:6:17",
                "diskgroup name",
            ),
        ];
        for (extra, at, msg) in cases {
            let text = format!("[[tenant]]\nname = \"BX1\"\n\npreset = \"oracle\"\n{extra}");
            let err = from_str("p.toml", &text, &FakeAccounts)
                .unwrap_err()
                .to_string();
            assert!(err.contains(at) && err.contains(msg), "{extra:?}: {err}");
        }
    }

    #[test]
    fn oracle_keys_without_the_preset_are_reported() {
        let text = "[[tenant]]\nname = \"db\"\nmatch = [{ comm = \"^x$\" }]\nsid = \"BX1\"\n";
        let err = from_str("p.toml", text, &FakeAccounts)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("p.toml:4:7") && err.contains("`sid` is a key of `preset = \"oracle\"`"),
            "{err}"
        );
    }

    #[test]
    fn asm_disks_and_diskgroup_become_storage() {
        let text = format!(
            "{POLICY}asm_disks = [\"/dev/oracleasm/disks/BX1_*\", \"/dev/sdq\"]\nasm_diskgroup = \"DATA\"\nasm_diskstring = \"/dev/oracleasm/disks/*\"\n"
        );
        let p = from_str("p.toml", &text, &FakeAccounts).unwrap().policy;
        let storage: Vec<&str> = p.tenants[0]
            .storage
            .iter()
            .map(|s| s.value.as_str())
            .collect();
        assert_eq!(
            storage,
            [
                "/dev/oracleasm/disks/BX1_*",
                "/dev/sdq",
                "asm:DATA:/dev/oracleasm/disks/*"
            ]
        );
        let one = format!("{POLICY}asm_disks = \"/dev/oracleasm/disks/BX1_*\"\n");
        let p = from_str("p.toml", &one, &FakeAccounts).unwrap().policy;
        assert_eq!(p.tenants[0].storage.len(), 1);
    }
}
