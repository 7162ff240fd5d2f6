//! Classification on hand-made processes: rule fields, AND within a rule, OR across rules, tenant
//! order, exempt leaves and descendants.

use std::path::PathBuf;

use super::*;
use crate::policy::FakeAccounts;

fn tenants(text: &str) -> Vec<Tenant> {
    match crate::policy::from_str("test.toml", text, &FakeAccounts) {
        Ok(l) => std::sync::Arc::unwrap_or_clone(l.policy).tenants,
        Err(e) => panic!("bad test policy:\n{e}"),
    }
}

/// A process with uid/gid 0, no exe, parent 1.
fn proc(pid: u32, comm: &str, cmdline: &str) -> ProcInfo {
    ProcInfo {
        pid,
        ppid: 1,
        comm: comm.into(),
        cmdline: cmdline.into(),
        exe: None,
        uid: 0,
        gid: 0,
        start_time: 1000 + pid as u64,
        unit: None,
    }
}

fn child(pid: u32, ppid: u32, comm: &str) -> ProcInfo {
    ProcInfo {
        ppid,
        ..proc(pid, comm, comm)
    }
}

fn owned(mut p: ProcInfo, uid: u32, gid: u32) -> ProcInfo {
    p.uid = uid;
    p.gid = gid;
    p
}

/// pid → (tenant, leaf) for every placed process.
fn placed(ts: &[Tenant], procs: &[ProcInfo]) -> HashMap<u32, (usize, Leaf)> {
    classify(ts, procs)
        .into_iter()
        .map(|p| (p.pid, (p.tenant, p.leaf)))
        .collect()
}

fn placement(ts: &[Tenant], procs: &[ProcInfo], pid: u32) -> Placement {
    classify(ts, procs)
        .into_iter()
        .find(|p| p.pid == pid)
        .unwrap_or_else(|| panic!("pid {pid} was not placed"))
}

#[test]
fn cmdline_regex() {
    let ts = tenants("[[tenant]]\nname = \"a\"\n[[tenant.match]]\ncmdline = \"LOCAL=NO\"\n");
    let procs = [
        proc(10, "oracle", "oracleBX1 (LOCAL=NO)"),
        proc(11, "oracle", "oracleBX1 (LOCAL=YES)"),
    ];
    let got = placed(&ts, &procs);
    assert_eq!(got.get(&10), Some(&(0, Leaf::Limited)));
    assert_eq!(got.get(&11), None);
    assert_eq!(got.len(), 1);
}

#[test]
fn comm_regex_looks_at_comm_not_cmdline() {
    let ts = tenants("[[tenant]]\nname = \"a\"\n[[tenant.match]]\ncomm = \"^postgres$\"\n");
    let procs = [
        proc(10, "postgres", "postgres: checkpointer"),
        // cmdline says postgres, comm does not
        proc(11, "psql", "postgres"),
        proc(12, "postgres2", "x"),
    ];
    let got = placed(&ts, &procs);
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![10]);
}

#[test]
fn whole_text_patterns_are_looked_up_and_others_searched_alike() {
    // `^postgres$` and `^oracleX$` are looked up by their text (`PatternShape::exact`); the
    // others go through the regex set. Both kinds answer the same in one field and one rule.
    let exact = |p: &str| {
        crate::policy::Pattern::new(p)
            .unwrap()
            .shape()
            .exact
            .clone()
    };
    assert_eq!(exact("^postgres$").as_deref(), Some("postgres"));
    assert_eq!(exact(r"\Aora\.x\z").as_deref(), Some("ora.x"));
    for searched in [
        "^postgres",
        "postgres$",
        "(?i)^postgres$",
        "(?m)^postgres$",
        "^(postgres)$",
        "^post.res$",
    ] {
        assert_eq!(exact(searched), None, "{searched}");
    }
    let ts = tenants(
        "[[tenant]]\nname = \"a\"\n[[tenant.match]]\ncomm = \"^postgres$\"\nuser = \"postgres\"\n\
         [[tenant]]\nname = \"b\"\n[[tenant.match]]\ncomm = \"(?i)^POSTGRES$\"\n\
         [[tenant.match]]\ncomm = \"^ora\"\ncmdline = \"^oracleX$\"\n\
         [[tenant]]\nname = \"c\"\n[[tenant.match]]\ncomm = \"^postgres$\"\n",
    );
    let procs = [
        owned(proc(10, "postgres", "postgres -D /data"), 104, 110),
        proc(11, "postgres", "postgres -D /data"),
        proc(12, "oracle", "oracleX"),
        proc(13, "oracle", "oracleX (LOCAL=NO)"),
        proc(14, "postgres\n", "x"),
        proc(15, "Postgres", "x"),
    ];
    let got = placed(&ts, &procs);
    assert_eq!(got.get(&10), Some(&(0, Leaf::Limited)), "a: comm and user");
    assert_eq!(
        got.get(&11),
        Some(&(1, Leaf::Limited)),
        "b before c: tenant order"
    );
    assert_eq!(
        got.get(&12),
        Some(&(1, Leaf::Limited)),
        "b: comm searched, cmdline exact"
    );
    assert_eq!(got.get(&13), None, "the exact cmdline is the whole text");
    assert_eq!(got.get(&14), None, "`$` is the text's end, not a newline's");
    assert_eq!(
        got.get(&15),
        Some(&(1, Leaf::Limited)),
        "b: case-insensitive, searched"
    );
}

#[test]
fn exe_is_compared_as_a_whole_path() {
    let ts = tenants(
        "[[tenant]]\nname = \"a\"\n[[tenant.match]]\nexe = \"/u01/app/oracle/bin/oracle\"\n",
    );
    let mut a = proc(10, "oracle", "oracleBX1");
    a.exe = Some(PathBuf::from("/u01/app/oracle/bin/oracle").into());
    let mut b = proc(11, "oracle", "oracleBX1");
    b.exe = Some(PathBuf::from("/u01/app/oracle/bin/oracle.old").into());
    let c = proc(12, "oracle", "oracleBX1"); // exe unreadable
    let got = placed(&ts, &[a, b, c]);
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![10]);
}

#[test]
fn user_and_group() {
    let ts = tenants(
        "[[tenant]]\nname = \"ora\"\n[[tenant.match]]\nuser = \"oracle\"\n\
         [[tenant]]\nname = \"pg\"\n[[tenant.match]]\ngroup = \"postgres\"\n",
    );
    let procs = [
        owned(proc(10, "x", "x"), 54321, 1),
        owned(proc(11, "y", "y"), 1, 110),
        owned(proc(12, "z", "z"), 1, 1),
    ];
    let got = placed(&ts, &procs);
    assert_eq!(got.get(&10), Some(&(0, Leaf::Limited)));
    assert_eq!(got.get(&11), Some(&(1, Leaf::Limited)));
    assert_eq!(got.get(&12), None);
}

#[test]
fn fields_of_one_rule_are_anded() {
    let ts = tenants(
        "[[tenant]]\nname = \"a\"\n[[tenant.match]]\ncomm = \"^ora_\"\nuser = \"oracle\"\n\
         cmdline = \"BX1\"\n",
    );
    let procs = [
        owned(proc(10, "ora_pmon_BX1", "ora_pmon_BX1"), 54321, 0),
        // right comm and cmdline, wrong user
        owned(proc(11, "ora_pmon_BX1", "ora_pmon_BX1"), 1000, 0),
        // right user and cmdline, wrong comm
        owned(proc(12, "sqlplus", "sqlplus BX1"), 54321, 0),
        // right user and comm, wrong cmdline
        owned(proc(13, "ora_pmon_BX2", "ora_pmon_BX2"), 54321, 0),
    ];
    let got = placed(&ts, &procs);
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![10]);
}

#[test]
fn rules_of_one_tenant_are_ored() {
    let ts = tenants(
        "[[tenant]]\nname = \"a\"\n[[tenant.match]]\ncomm = \"^ora_\"\n\
         [[tenant.match]]\nuser = \"postgres\"\n",
    );
    let procs = [
        proc(10, "ora_pmon_BX1", "ora_pmon_BX1"),
        owned(proc(11, "anything", "anything"), 104, 0),
        proc(12, "bash", "bash"),
    ];
    let got = placed(&ts, &procs);
    let mut pids: Vec<u32> = got.keys().copied().collect();
    pids.sort();
    assert_eq!(pids, vec![10, 11]);
    assert_eq!(placement(&ts, &procs, 10).reason, "match[0] comm=~^ora_");
    assert_eq!(placement(&ts, &procs, 11).reason, "match[1] user=postgres");
}

#[test]
fn first_tenant_in_file_order_wins() {
    let ts = tenants(
        "[[tenant]]\nname = \"first\"\n[[tenant.match]]\ncomm = \"^ora_\"\n\
         [[tenant]]\nname = \"second\"\n[[tenant.match]]\ncomm = \"BX1$\"\n",
    );
    let procs = [
        proc(10, "ora_pmon_BX1", "x"), // both
        proc(11, "sqlplus_BX1", "x"),  // second only
    ];
    let got = placed(&ts, &procs);
    assert_eq!(got.get(&10), Some(&(0, Leaf::Limited)));
    assert_eq!(got.get(&11), Some(&(1, Leaf::Limited)));
    assert_eq!(claims(&ts, &procs[0]), vec![0, 1]);
    assert_eq!(claims(&ts, &procs[1]), vec![1]);
}

#[test]
fn exempt_wins_over_match_within_a_tenant() {
    let ts = tenants(
        "[[tenant]]\nname = \"bx1\"\n[[tenant.match]]\ncomm = \"_BX1$\"\n\
         [[tenant.exempt]]\ncomm = \"^ora_lgwr_\"\n",
    );
    let procs = [proc(10, "ora_lgwr_BX1", "x"), proc(11, "ora_p001_BX1", "x")];
    let p = placement(&ts, &procs, 10);
    assert_eq!((p.tenant, p.leaf), (0, Leaf::Exempt));
    assert_eq!(p.reason, "exempt[0] comm=~^ora_lgwr_");
    let p = placement(&ts, &procs, 11);
    assert_eq!((p.tenant, p.leaf), (0, Leaf::Limited));
}

#[test]
fn exempt_rules_alone_select_into_the_exempt_leaf() {
    let ts = tenants("[[tenant]]\nname = \"bx1\"\n[[tenant.exempt]]\ncomm = \"^ora_lgwr_BX1$\"\n");
    let procs = [proc(10, "ora_lgwr_BX1", "x"), proc(11, "ora_p001_BX1", "x")];
    let got = placed(&ts, &procs);
    assert_eq!(got.get(&10), Some(&(0, Leaf::Exempt)));
    assert_eq!(got.get(&11), None);
}

#[test]
fn descendants_take_children_and_grandchildren() {
    let ts = tenants(
        "[[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^postmaster$\"\ndescendants = true\n",
    );
    let procs = [
        proc(100, "postmaster", "/usr/bin/postgres -D /data"),
        child(101, 100, "postgres"),
        child(102, 101, "worker"),
        child(103, 102, "sh"),
        // not below the postmaster
        proc(200, "postgres", "postgres"),
        child(201, 200, "worker"),
    ];
    let got = placed(&ts, &procs);
    let mut pids: Vec<u32> = got.keys().copied().collect();
    pids.sort();
    assert_eq!(pids, vec![100, 101, 102, 103]);
    assert!(got.values().all(|v| *v == (0, Leaf::Limited)));
    assert_eq!(
        placement(&ts, &procs, 100).reason,
        "match[0] comm=~^postmaster$ +descendants"
    );
    for pid in [101, 102, 103] {
        let reason = placement(&ts, &procs, pid).reason;
        assert!(
            reason.starts_with("descendant of 100 (match[0] comm=~^postmaster$"),
            "{pid}: {reason}"
        );
    }
}

#[test]
fn without_descendants_children_stay_out() {
    let ts = tenants("[[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^postmaster$\"\n");
    let procs = [proc(100, "postmaster", "x"), child(101, 100, "postgres")];
    let got = placed(&ts, &procs);
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![100]);
}

#[test]
fn descendant_matching_the_exempt_rule_lands_in_exempt() {
    let ts = tenants(
        "[[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^postmaster$\"\ndescendants = true\n\
         [[tenant.exempt]]\ncomm = \"^walwriter$\"\n",
    );
    let procs = [
        proc(100, "postmaster", "x"),
        child(101, 100, "walwriter"),
        child(102, 100, "checkpointer"),
    ];
    let got = placed(&ts, &procs);
    assert_eq!(got.get(&101), Some(&(0, Leaf::Exempt)));
    assert_eq!(got.get(&102), Some(&(0, Leaf::Limited)));
}

#[test]
fn descendants_of_an_exempt_rule_stay_exempt() {
    // an RMAN backup and the channels it starts must all stay free of the IO limits
    let ts = tenants(
        "[[tenant]]\nname = \"bx1\"\n[[tenant.match]]\ncmdline = \"BX1\"\n\
         [[tenant.exempt]]\ncomm = \"^rman$\"\ndescendants = true\n",
    );
    let procs = [
        proc(300, "rman", "rman target /"),
        // a channel: matches the tenant's match rule too
        ProcInfo {
            ppid: 300,
            ..proc(301, "oracle_301_bx1", "oracleBX1 (DESCRIPTION=(LOCAL=YES))")
        },
        child(302, 301, "sh"),
        proc(400, "ora_p000_BX1", "ora_p000_BX1"),
    ];
    let got = placed(&ts, &procs);
    assert_eq!(got.get(&300), Some(&(0, Leaf::Exempt)));
    assert_eq!(got.get(&301), Some(&(0, Leaf::Exempt)));
    assert_eq!(got.get(&302), Some(&(0, Leaf::Exempt)));
    assert_eq!(got.get(&400), Some(&(0, Leaf::Limited)));
    assert_eq!(
        placement(&ts, &procs, 301).reason,
        "descendant of 300 (exempt[0] comm=~^rman$ +descendants)"
    );
    assert_eq!(
        placement(&ts, &procs, 302).reason,
        "descendant of 300 (exempt[0] comm=~^rman$ +descendants)"
    );
}

#[test]
fn descendants_of_a_match_rule_are_limited_even_if_the_parent_is_exempt() {
    // the parent is exempt by its own rule; what it passes on is the match rule's claim
    let ts = tenants(
        "[[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^postmaster$\"\ndescendants = true\n\
         [[tenant.exempt]]\ncomm = \"^postmaster$\"\n",
    );
    let procs = [proc(100, "postmaster", "x"), child(101, 100, "worker")];
    let got = placed(&ts, &procs);
    assert_eq!(got.get(&100), Some(&(0, Leaf::Exempt)));
    assert_eq!(got.get(&101), Some(&(0, Leaf::Limited)));
}

#[test]
fn descendants_through_an_unlisted_parent() {
    // the middle process exited or was not scanned: the chain stops there
    let ts = tenants(
        "[[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^postmaster$\"\ndescendants = true\n",
    );
    let procs = [proc(100, "postmaster", "x"), child(102, 101, "orphan")];
    let got = placed(&ts, &procs);
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![100]);
}

#[test]
fn earlier_tenants_descendant_claim_beats_later_direct_match() {
    let ts = tenants(
        "[[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^postmaster$\"\ndescendants = true\n\
         [[tenant]]\nname = \"shells\"\n[[tenant.match]]\ncomm = \"^sh$\"\n",
    );
    let procs = [
        proc(100, "postmaster", "x"),
        child(101, 100, "sh"),
        proc(200, "sh", "sh"),
    ];
    let got = placed(&ts, &procs);
    assert_eq!(got.get(&101), Some(&(0, Leaf::Limited)));
    assert!(placement(&ts, &procs, 101)
        .reason
        .starts_with("descendant of 100"));
    assert_eq!(got.get(&200), Some(&(1, Leaf::Limited)));
}

#[test]
fn earlier_tenants_direct_match_beats_later_descendant_claim() {
    let ts = tenants(
        "[[tenant]]\nname = \"shells\"\n[[tenant.match]]\ncomm = \"^sh$\"\n\
         [[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^postmaster$\"\ndescendants = true\n",
    );
    let procs = [
        proc(100, "postmaster", "x"),
        child(101, 100, "sh"),
        child(102, 100, "worker"),
        // a grandchild through the shell that tenant 0 took: still pg's descendant
        child(103, 101, "worker"),
    ];
    let got = placed(&ts, &procs);
    assert_eq!(got.get(&100), Some(&(1, Leaf::Limited)));
    assert_eq!(got.get(&101), Some(&(0, Leaf::Limited)));
    assert_eq!(placement(&ts, &procs, 101).reason, "match[0] comm=~^sh$");
    assert_eq!(got.get(&102), Some(&(1, Leaf::Limited)));
    assert_eq!(got.get(&103), Some(&(1, Leaf::Limited)));
}

#[test]
fn the_earliest_tenant_among_ancestors_wins() {
    let ts = tenants(
        "[[tenant]]\nname = \"outer\"\n[[tenant.match]]\ncomm = \"^supervisor$\"\ndescendants = true\n\
         [[tenant]]\nname = \"inner\"\n[[tenant.match]]\ncomm = \"^postmaster$\"\ndescendants = true\n",
    );
    let procs = [
        proc(10, "supervisor", "x"),
        child(100, 10, "postmaster"),
        child(101, 100, "worker"),
    ];
    let got = placed(&ts, &procs);
    // the postmaster itself: tenant 1 matches it directly, tenant 0 claims it as a descendant
    assert_eq!(got.get(&100), Some(&(0, Leaf::Limited)));
    assert_eq!(got.get(&101), Some(&(0, Leaf::Limited)));
    assert!(placement(&ts, &procs, 101)
        .reason
        .starts_with("descendant of 10 "));
}

#[test]
fn a_nearer_ancestor_of_an_earlier_tenant_beats_a_farther_one_of_a_later_tenant() {
    let ts = tenants(
        "[[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^postmaster$\"\ndescendants = true\n\
         [[tenant]]\nname = \"outer\"\n[[tenant.match]]\ncomm = \"^supervisor$\"\ndescendants = true\n",
    );
    let procs = [
        proc(10, "supervisor", "x"),
        child(100, 10, "postmaster"),
        child(101, 100, "worker"),
        child(11, 10, "cron"),
    ];
    let got = placed(&ts, &procs);
    assert_eq!(got.get(&100), Some(&(0, Leaf::Limited)));
    assert_eq!(got.get(&101), Some(&(0, Leaf::Limited)));
    assert!(placement(&ts, &procs, 101)
        .reason
        .starts_with("descendant of 100 "));
    assert_eq!(got.get(&11), Some(&(1, Leaf::Limited)));
}

#[test]
fn within_one_tenant_the_nearest_ancestor_is_named() {
    let ts = tenants(
        "[[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^supervisor$\"\ndescendants = true\n\
         [[tenant.match]]\ncomm = \"^postmaster$\"\ndescendants = true\n",
    );
    let procs = [
        proc(10, "supervisor", "x"),
        child(100, 10, "postmaster"),
        child(101, 100, "worker"),
    ];
    assert_eq!(
        placement(&ts, &procs, 101).reason,
        "descendant of 100 (match[1] comm=~^postmaster$ +descendants)"
    );
}

#[test]
fn unmatched_processes_are_absent() {
    let ts = tenants("[[tenant]]\nname = \"a\"\n[[tenant.match]]\ncomm = \"^nothing-here$\"\n");
    let procs = [proc(10, "bash", "bash"), proc(11, "sshd", "sshd")];
    assert!(classify(&ts, &procs).is_empty());
    assert!(classify(&[], &procs).is_empty());
}

#[test]
fn seed_style_oracle_instance() {
    let ts = tenants(
        r#"
[[tenant]]
name = "bx1"
[[tenant.match]]
comm = "^ora_p[0-9a-z]{3}_BX1$"
[[tenant.match]]
cmdline = "^oracleBX1 \\(LOCAL=NO\\)"
[[tenant.exempt]]
comm = "^ora_(lgwr|dbw[0-9a-z]|ckpt)_BX1$"
"#,
    );
    let ora = |pid, comm: &str, cmdline: &str| owned(proc(pid, comm, cmdline), 54321, 54322);
    let procs = [
        ora(10, "ora_p001_BX1", "ora_p001_BX1"),
        ora(11, "ora_p00a_BX1", "ora_p00a_BX1"),
        ora(12, "oracle_12_bx1", "oracleBX1 (LOCAL=NO)"),
        ora(13, "ora_lgwr_BX1", "ora_lgwr_BX1"),
        ora(
            14,
            "tnslsnr",
            "/u01/app/oracle/product/19c/bin/tnslsnr LISTENER -inherit",
        ),
        // another instance on the same host
        ora(15, "ora_p001_BX2", "ora_p001_BX2"),
        ora(16, "oracle_16_bx2", "oracleBX2 (LOCAL=NO)"),
    ];
    let got = placed(&ts, &procs);
    assert_eq!(got.get(&10), Some(&(0, Leaf::Limited)));
    assert_eq!(got.get(&11), Some(&(0, Leaf::Limited)));
    assert_eq!(got.get(&12), Some(&(0, Leaf::Limited)));
    assert_eq!(got.get(&13), Some(&(0, Leaf::Exempt)));
    assert_eq!(got.get(&14), None);
    assert_eq!(got.get(&15), None);
    assert_eq!(got.get(&16), None);
    assert_eq!(got.len(), 4);
    assert_eq!(
        placement(&ts, &procs, 12).reason,
        r"match[1] cmdline=~^oracleBX1 \(LOCAL=NO\)"
    );
}

#[test]
fn placements_follow_process_order() {
    let ts = tenants("[[tenant]]\nname = \"a\"\n[[tenant.match]]\ncomm = \"^w\"\n");
    let procs = [
        proc(30, "w3", "x"),
        proc(10, "w1", "x"),
        proc(20, "w2", "x"),
    ];
    let pids: Vec<u32> = classify(&ts, &procs).iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![30, 10, 20]);
}

#[test]
fn a_parent_cycle_terminates() {
    // pid reuse can make ppid chains odd; classification must still end
    let ts = tenants(
        "[[tenant]]\nname = \"a\"\n[[tenant.match]]\ncomm = \"^root$\"\ndescendants = true\n",
    );
    let procs = [
        child(10, 11, "x"),
        child(11, 10, "y"),
        proc(12, "root", "x"),
    ];
    let got = placed(&ts, &procs);
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![12]);
}

#[test]
fn classify_direct_agrees_with_classify_without_descendant_rules() {
    let ts = tenants(
        r#"
[[tenant]]
name = "a"
match = [{ cmdline = "^ora_p[0-9a-z]{3}_BX1" }]
exempt = [{ comm = "^ora_lgwr_BX1$" }]
[[tenant]]
name = "b"
match = [{ comm = "^ora_" }]
"#,
    );
    let procs = vec![
        proc(10, "ora_p001_BX1", "ora_p001_BX1"),
        proc(11, "ora_lgwr_BX1", "ora_lgwr_BX1"),
        proc(12, "ora_pmon_BX2", "ora_pmon_BX2"),
        proc(13, "bash", "bash"),
    ];
    let all = classify(&ts, &procs);
    for p in &procs {
        assert_eq!(
            classify_direct(&ts, p).as_ref(),
            all.iter().find(|x| x.pid == p.pid),
            "pid {}",
            p.pid
        );
    }
}

/// A rescan matches only the processes it read again: the others' hits come from the memo (a
/// kept process is the same process, so the same hits; shown here by a kept process whose
/// fields were changed behind the memo's back), unless the rules are not the memo's.
#[test]
fn classify_reusing_matches_only_what_a_rescan_read_again() {
    let ts = tenants(
        r#"
[[tenant]]
name = "a"
match = [{ cmdline = "^ora_p[0-9a-z]{3}_BX1" }]
[[tenant]]
name = "b"
match = [{ comm = "^ora_" }]
"#,
    );
    let rules = std::sync::Arc::new(RuleSet::new(&ts));
    let mut procs = vec![
        proc(10, "ora_p001_BX1", "ora_p001_BX1"),
        proc(11, "ora_pmon_BX2", "ora_pmon_BX2"),
        proc(12, "bash", "bash"),
    ];
    let mut memo = Memo::default();
    let first = classify_reusing(&rules, &procs, &[], &mut memo);
    assert_eq!(first, rules.classify(&procs));
    assert_eq!(memo.len(), 2, "only the processes that matched are kept");
    // 10 and 12 now look like another tenant's: kept unread, they keep their memo's answer.
    procs[0] = proc(10, "ora_lgwr_BX2", "ora_lgwr_BX2");
    procs[2] = proc(12, "ora_smon_BX2", "ora_smon_BX2");
    let kept = classify_reusing(&rules, &procs, &[10, 11, 12], &mut memo);
    assert_eq!(kept, first);
    // Read again (not in `unchanged`), they are matched again.
    let read = classify_reusing(&rules, &procs, &[11], &mut memo);
    assert_eq!(read, rules.classify(&procs));
    assert_eq!(
        read.iter().map(|p| (p.pid, p.tenant)).collect::<Vec<_>>(),
        vec![(10, 1), (11, 1), (12, 1)]
    );
    // Other rules (a reloaded policy): the memo is not theirs, everything is matched.
    procs[0] = proc(10, "ora_p001_BX1", "ora_p001_BX1");
    let reloaded = std::sync::Arc::new(RuleSet::new(&ts));
    let after_reload = classify_reusing(&reloaded, &procs, &[10, 11, 12], &mut memo);
    assert_eq!(after_reload, reloaded.classify(&procs));
    assert_eq!(after_reload[0].tenant, 0);
}

#[test]
fn fields_needed_follow_the_rules() {
    let only_cmdline = tenants("[[tenant]]\nname = \"a\"\nmatch = [{ cmdline = \"x\" }]\n");
    assert_eq!(
        fields_needed(&only_cmdline),
        crate::inventory::procs::Fields {
            ids: false,
            exe: false,
            tree: false,
            comm: false,
            unit: false,
        }
    );
    let with_comm = tenants("[[tenant]]\nname = \"a\"\nmatch = [{ comm = \"x\" }]\n");
    assert!(fields_needed(&with_comm).comm && !fields_needed(&with_comm).tree);
    let with_tree =
        tenants("[[tenant]]\nname = \"a\"\nmatch = [{ comm = \"x\", descendants = true }]\n");
    assert!(fields_needed(&with_tree).tree);
    let with_user = tenants("[[tenant]]\nname = \"a\"\nmatch = [{ user = \"oracle\" }]\n");
    assert!(fields_needed(&with_user).ids && !fields_needed(&with_user).exe);
    let with_exe = tenants("[[tenant]]\nname = \"a\"\nexempt = [{ exe = \"/usr/bin/x\" }]\n");
    assert!(fields_needed(&with_exe).exe && !fields_needed(&with_exe).ids);
}

#[test]
fn pidfile_rule_takes_the_process_named_in_the_file_and_follows_a_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("postmaster.pid");
    let text = format!(
        "[[tenant]]\nname = \"pg\"\n[[tenant.match]]\npidfile = \"{}\"\ndescendants = true\n",
        pidfile.display()
    );
    let ts = tenants(&text);
    let procs = vec![
        proc(500, "postgres", "postgres -D /a"),
        child(501, 500, "postgres"),
        proc(600, "postgres", "postgres -D /b"),
        child(601, 600, "postgres"),
    ];
    let fs = crate::hostfs::HostFs::default();
    let refresh = |ts: &[Tenant]| {
        ts.iter()
            .flat_map(|t| &t.rules)
            .filter_map(|r| r.pidfile.as_ref())
            .fold(false, |c, f| f.refresh(&fs) | c)
    };
    // No file yet: the rule matches nothing.
    assert!(!refresh(&ts));
    assert!(placed(&ts, &procs).is_empty());
    // PostgreSQL's postmaster.pid: the PID first, then the data directory and more.
    std::fs::write(&pidfile, "500\n/a\n1700000000\n5432\n").unwrap();
    assert!(refresh(&ts));
    // The daemon's rescans match every process again under a pid-file rule (its pid changes
    // without an event), even those they kept unread.
    let rules = std::sync::Arc::new(RuleSet::new(&ts));
    let mut memo = Memo::default();
    assert_eq!(classify_reusing(&rules, &procs, &[], &mut memo).len(), 2);
    let got = placed(&ts, &procs);
    assert_eq!(
        got.keys()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        [500, 501].into()
    );
    // A restart writes a new PID: the old tree leaves the rule, the new one is taken.
    std::fs::write(&pidfile, "600\n/a\n").unwrap();
    assert!(refresh(&ts));
    let all = [500, 501, 600, 601];
    let reused: Vec<u32> = classify_reusing(&rules, &procs, &all, &mut memo)
        .iter()
        .map(|p| p.pid)
        .collect();
    assert_eq!(reused, vec![600, 601]);
    let got = placed(&ts, &procs);
    assert_eq!(
        got.keys()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        [600, 601].into()
    );
    // Garbage or a file mid-write gives no PID rather than a wrong one.
    std::fs::write(&pidfile, "").unwrap();
    assert!(refresh(&ts));
    assert!(placed(&ts, &procs).is_empty());
}

#[test]
fn pid_file_first_line_only_and_never_init() {
    use crate::policy::parse_pid_file;
    assert_eq!(
        parse_pid_file("812\n/var/lib/postgresql/15/main\n"),
        Some(812)
    );
    assert_eq!(parse_pid_file(" 812 \n"), Some(812));
    assert_eq!(parse_pid_file("1\n"), None);
    assert_eq!(parse_pid_file("0\n"), None);
    assert_eq!(parse_pid_file("abc\n"), None);
    assert_eq!(parse_pid_file(""), None);
}

/// `unit =` rules, on processes read by the real reader from a /proc tree whose cgroup files
/// are copied from hosts: Debian 12 on cgroup v2, and a v1 hybrid (RHEL 8 style) where the
/// `name=systemd` line names the unit whatever the controllers' lines say.
#[test]
fn unit_rules_match_the_unit_from_proc_pid_cgroup_on_v1_hybrid_and_v2() {
    let dir = tempfile::tempdir().unwrap();
    let fs = crate::hostfs::HostFs::with_root(dir.path());
    let mk = |pid: u32, argv: &str, cgroup: &str| {
        let d = fs.proc().join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cmdline"), format!("{argv}\0")).unwrap();
        std::fs::write(d.join("comm"), format!("{argv}\n")).unwrap();
        std::fs::write(d.join("cgroup"), cgroup).unwrap();
    };
    let v2 = |unit: &str| format!("0::/system.slice/system-postgresql.slice/{unit}\n");
    let hybrid = |unit: &str| {
        format!(
            "12:blkio:/dbcage/other/limited\n11:cpu,cpuacct:/system.slice/{unit}\n\
             1:name=systemd:/system.slice/{unit}\n0::/system.slice/{unit}\n"
        )
    };
    mk(10, "postgres", &v2("postgresql@15-main.service"));
    mk(11, "postgres", &v2("postgresql@16-b.service"));
    mk(
        12,
        "postgres",
        "0::/user.slice/user-0.slice/session-3.scope\n",
    );
    mk(13, "fakedb", &hybrid("fakedb.service"));
    // On a hybrid the named line decides even when the v2 line says otherwise.
    mk(
        14,
        "fakedb",
        "1:name=systemd:/system.slice/fakedb.service/limited\n0::/\n",
    );
    mk(15, "fakedb", &hybrid("fakedb2.service"));
    mk(16, "sshd", "0::/system.slice/ssh.service\n");
    let ts = tenants(
        "[[tenant]]\nname = \"main\"\nmatch = [{ unit = \"postgresql@15-main.service\" }]\n\
         [[tenant]]\nname = \"others\"\nmatch = [{ unit = \"postgresql@*.service\" }]\n\
         [[tenant]]\nname = \"fake\"\nmatch = [{ unit = \"fakedb.service\", comm = \"^fakedb$\" }]\n",
    );
    let fields = fields_needed(&ts);
    assert!(fields.unit, "a unit rule asks the reader for the unit");
    let procs = crate::inventory::procs::scan_fields(&fs, fields).unwrap();
    let unit_of = |pid: u32| procs.iter().find(|p| p.pid == pid).unwrap().unit.clone();
    assert_eq!(unit_of(13).as_deref(), Some("fakedb.service"));
    assert_eq!(unit_of(12).as_deref(), Some("session-3.scope"));
    let got: Vec<(u32, usize, String)> = classify(&ts, &procs)
        .into_iter()
        .map(|p| (p.pid, p.tenant, p.reason))
        .collect();
    assert_eq!(
        got,
        [
            (
                10,
                0,
                "match[0] unit=postgresql@15-main.service".to_string()
            ),
            (11, 1, "match[0] unit=postgresql@*.service".to_string()),
            (
                13,
                2,
                "match[0] comm=~^fakedb$ unit=fakedb.service".to_string()
            ),
            (
                14,
                2,
                "match[0] comm=~^fakedb$ unit=fakedb.service".to_string()
            ),
        ]
    );
    // The daemon's fast path gives the same answer, and without the unit read nothing matches.
    for p in &procs {
        assert_eq!(
            classify_direct(&ts, p).map(|c| c.tenant),
            got.iter().find(|g| g.0 == p.pid).map(|g| g.1)
        );
        assert_eq!(
            ts[0].rules[0].matches(p),
            p.pid == 10,
            "Rule::matches, pid {}",
            p.pid
        );
    }
    let blind = crate::inventory::procs::scan_fields(
        &fs,
        crate::inventory::procs::Fields {
            unit: false,
            ..fields
        },
    )
    .unwrap();
    assert!(classify(&ts, &blind).is_empty());
}
