//! Validation of the policy: every bad input is reported with `FILE:LINE:COL: message`, all of
//! them in one go; a good policy parses into the expected values; drop-ins merge key by key.

use super::*;
use crate::policy::FakeAccounts;

const NAME: &str = "dbcage.toml";

fn parse(text: &str) -> Result<Loaded, PolicyErrors> {
    crate::policy::from_str(NAME, text, &FakeAccounts)
}

fn ok(text: &str) -> Loaded {
    match parse(text) {
        Ok(l) => l,
        Err(e) => panic!("policy should be valid, got:\n{e}"),
    }
}

/// Every problem of an invalid policy, as the user sees them.
fn errors(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(_) => panic!("policy should be rejected:\n{text}"),
        Err(e) => e.0.iter().map(|p| p.to_string()).collect(),
    }
}

/// The only problem of an invalid policy.
fn error(text: &str) -> String {
    let e = errors(text);
    assert_eq!(e.len(), 1, "expected exactly one error, got {e:#?}");
    e.into_iter().next().unwrap()
}

/// `NAME:LINE:COL: ` of byte offset `off` of `text` (1-based, counted here rather than through
/// `source::line_col`).
fn loc(name: &str, text: &str, off: usize) -> String {
    let before = &text[..off];
    let line = before.matches('\n').count() + 1;
    let col = off - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    format!("{name}:{line}:{col}: ")
}

/// The location of the `nth` occurrence of `needle`.
fn at_nth(name: &str, text: &str, needle: &str, nth: usize) -> String {
    let off = text
        .match_indices(needle)
        .nth(nth)
        .unwrap_or_else(|| panic!("`{needle}` (occurrence {nth}) not in the text"))
        .0;
    loc(name, text, off)
}

/// The location just past the first occurrence of `prefix` (for values such as `= 0`).
fn after(text: &str, prefix: &str) -> String {
    let off = text.find(prefix).expect("prefix in text") + prefix.len();
    loc(NAME, text, off)
}

fn at(text: &str, needle: &str) -> String {
    at_nth(NAME, text, needle, 0)
}

/// Asserts that `msg` starts with the location of `needle` and mentions every one of `parts`.
#[track_caller]
fn assert_located(msg: &str, text: &str, needle: &str, parts: &[&str]) {
    let loc = at(text, needle);
    assert!(msg.starts_with(&loc), "`{msg}` should start with `{loc}`");
    for p in parts {
        assert!(msg.contains(p), "`{msg}` should mention `{p}`");
    }
}

/// Like `assert_located`, for a value located just past `prefix`.
#[track_caller]
fn assert_after(msg: &str, text: &str, prefix: &str, parts: &[&str]) {
    let loc = after(text, prefix);
    assert!(msg.starts_with(&loc), "`{msg}` should start with `{loc}`");
    for p in parts {
        assert!(msg.contains(p), "`{msg}` should mention `{p}`");
    }
}

fn tenant_named(name: &str) -> String {
    format!("[[tenant]]\nname = \"{name}\"\n[[tenant.match]]\ncomm = \"^x$\"\n")
}

// ---------------------------------------------------------------- syntax and unknown keys

#[test]
fn unknown_top_level_key() {
    let text = "[agent]\nroot = \"dbcage\"\n\nfrobnicate = 1\n";
    // `frobnicate` after [agent] belongs to the agent table; put it before to hit the top level
    let top = "frobnicate = 1\n[agent]\nroot = \"dbcage\"\n";
    let msg = error(top);
    assert_located(
        &msg,
        top,
        "frobnicate",
        &["unknown key `frobnicate` at the top level", "agent, tenant"],
    );
    let msg = error(text);
    assert_located(
        &msg,
        text,
        "frobnicate",
        &["unknown key `frobnicate` in [agent]", "control_group"],
    );
}

#[test]
fn unknown_key_in_tenant() {
    let text = "[[tenant]]\nname = \"bx1\"\nstorge = [\"/u01\"]\n";
    let msg = error(text);
    assert_located(
        &msg,
        text,
        "storge",
        &[
            "unknown key `storge` in [tenant] of tenant `bx1`",
            "did you mean `storage`?",
        ],
    );
}

#[test]
fn unknown_key_in_tenant_io() {
    let text = "[[tenant]]\nname = \"bx1\"\nstorage = [\"/u01\"]\n\
                [tenant.io]\nread_bps = \"50MiB\"\nread_bw = \"10MiB\"\n";
    let msg = error(text);
    assert_located(
        &msg,
        text,
        "read_bw",
        &[
            "unknown key `read_bw` in [tenant.io]",
            "did you mean `read_bps`?",
        ],
    );
}

#[test]
fn unknown_key_in_rule() {
    let text = "[[tenant]]\nname = \"bx1\"\n[[tenant.match]]\nprocess = \"ora\"\n";
    // The rule is then empty, which is reported too.
    let msg = errors(text).remove(0);
    assert_located(
        &msg,
        text,
        "process",
        &["unknown key `process` in [tenant.match]", "cmdline"],
    );
}

#[test]
fn toml_syntax_error_is_located() {
    let text = "[[tenant]]\nname = \"bx1\n";
    let msg = error(text);
    assert!(msg.starts_with(&format!("{NAME}:2:")), "{msg}");
}

// ---------------------------------------------------------------- quantities

fn io_tenant(io_lines: &str) -> String {
    format!("[[tenant]]\nname = \"bx1\"\nstorage = [\"/u01\"]\n[tenant.io]\n{io_lines}")
}

#[test]
fn bad_unit() {
    let text = io_tenant("read_bps = \"5XB\"\n");
    let msg = error(&text);
    assert_located(
        &msg,
        &text,
        "\"5XB\"",
        &["bx1", "io.read_bps", "`5XB`", "byte size"],
    );
}

#[test]
fn bytes_unit_on_a_count() {
    let text = io_tenant("write_iops = \"2MiB\"\n");
    let msg = error(&text);
    assert_located(
        &msg,
        &text,
        "\"2MiB\"",
        &["io.write_iops", "`2MiB`", "count"],
    );
}

#[test]
fn float_where_bytes_are_needed() {
    let text = io_tenant("write_bps = 1.5\n");
    let msg = error(&text);
    assert_located(&msg, &text, "1.5", &["io.write_bps", "1.5", "whole number"]);

    let text = "[[tenant]]\nname = \"bx1\"\n[tenant.memory]\nmax = 2.5\n";
    let msg = error(text);
    assert_located(&msg, text, "2.5", &["memory.max", "2.5", "whole number"]);
}

#[test]
fn negative_bytes() {
    let text = io_tenant("read_bps = -5\n");
    let msg = error(&text);
    assert_located(&msg, &text, "-5", &["io.read_bps", "-5 is negative"]);
}

#[test]
fn zero_limits() {
    let text = io_tenant("read_iops = 0\n");
    let msg = error(&text);
    assert_after(&msg, &text, "read_iops = ", &["bx1", "io.read_iops = 0"]);

    let text = io_tenant("write_bps = \"0MiB\"\n");
    let msg = error(&text);
    assert_located(&msg, &text, "\"0MiB\"", &["io.write_bps = 0"]);

    let text = "[[tenant]]\nname = \"bx1\"\n[tenant.memory]\nmax = 0\n";
    let msg = error(text);
    assert_after(&msg, text, "max = ", &["memory.max = 0"]);
}

#[test]
fn bad_value_in_a_device_override() {
    let text = io_tenant("[[tenant.io.device]]\npath = \"/dev/vdb\"\nread_bps = \"lots\"\n");
    let msg = error(&text);
    assert_located(&msg, &text, "\"lots\"", &["io.device.read_bps", "`lots`"]);

    let text = io_tenant("[[tenant.io.device]]\npath = \"vdb\"\nread_bps = \"1MiB\"\n");
    let msg = error(&text);
    assert_located(
        &msg,
        &text,
        "\"vdb\"",
        &["io.device path `vdb`", "absolute"],
    );
}

// ---------------------------------------------------------------- rules

#[test]
fn invalid_regex() {
    let text = "[[tenant]]\nname = \"bx1\"\n[[tenant.match]]\ncomm = \"^ora_(p[0-9]{3}\"\n";
    let msg = error(text);
    assert_located(
        &msg,
        text,
        "\"^ora_(p",
        &["bx1", "match[0].comm", "invalid regex", "`^ora_(p[0-9]{3}`"],
    );
}

#[test]
fn invalid_regex_in_exempt_cmdline() {
    let text = "[[tenant]]\nname = \"bx1\"\n[[tenant.exempt]]\ncomm = \"ok\"\n\
                [[tenant.exempt]]\ncmdline = \"[lgwr\"\n";
    let msg = error(text);
    assert_located(&msg, text, "\"[lgwr\"", &["exempt[1].cmdline", "`[lgwr`"]);
}

#[test]
fn unknown_user_and_group() {
    let text = "[[tenant]]\nname = \"bx1\"\n[[tenant.match]]\nuser = \"oracel\"\n\
                [[tenant.match]]\ngroup = \"dab\"\n";
    let e = errors(text);
    assert_eq!(e.len(), 2, "{e:#?}");
    assert_located(
        &e[0],
        text,
        "\"oracel\"",
        &["match[0].user", "no user named `oracel`"],
    );
    assert_located(
        &e[1],
        text,
        "\"dab\"",
        &["match[1].group", "no group named `dab`"],
    );
}

#[test]
fn users_and_groups_by_name_and_number() {
    let text = "[[tenant]]\nname = \"bx1\"\n\
                [[tenant.match]]\nuser = \"oracle\"\ngroup = \"dba\"\n\
                [[tenant.match]]\nuser = 1001\n\
                [[tenant.match]]\ngroup = \"2002\"\n";
    let l = ok(text);
    let r = &l.policy.tenants[0].rules;
    assert_eq!((r[0].uid, r[0].gid), (Some(54321), Some(54322)));
    assert_eq!((r[1].uid, r[1].gid), (Some(1001), None));
    assert_eq!((r[2].uid, r[2].gid), (None, Some(2002)));

    let text = "[[tenant]]\nname = \"bx1\"\n[[tenant.match]]\nuser = -1\n";
    let msg = error(text);
    assert_located(&msg, text, "-1", &["match[0].user", "-1 is not a valid id"]);
}

#[test]
fn exe_must_be_absolute() {
    let text = "[[tenant]]\nname = \"bx1\"\n[[tenant.match]]\nexe = \"bin/oracle\"\n";
    let msg = error(text);
    assert_located(
        &msg,
        text,
        "\"bin/oracle\"",
        &["match[0].exe", "`bin/oracle`", "absolute"],
    );
}

#[test]
fn pidfile_must_be_absolute_without_dotdot() {
    for bad in ["run/mysqld.pid", "/var/lib/../../etc/shadow"] {
        let text = format!("[[tenant]]\nname = \"db\"\n[[tenant.match]]\npidfile = \"{bad}\"\n");
        let msg = error(&text);
        assert_located(
            &msg,
            &text,
            &format!("\"{bad}\""),
            &["match[0].pidfile", "absolute path without `..`"],
        );
    }
}

#[test]
fn unit_must_be_a_valid_service_or_scope_name() {
    for (bad, why) in [
        ("postgresql", "no unit type"),
        ("system.slice", "names a slice"),
        ("pg/../x.service", "`/`"),
        ("pg main.service", "` `"),
        ("db[.service", "not a valid glob"),
    ] {
        let text = format!("[[tenant]]\nname = \"db\"\nmatch = [{{ unit = \"{bad}\" }}]\n");
        let msg = error(&text);
        assert_located(
            &msg,
            &text,
            &format!("\"{bad}\""),
            &["tenant `db`: match[0].unit", &format!("`{bad}`"), why],
        );
    }
    let ok = parse("[[tenant]]\nname = \"db\"\nmatch = [{ unit = \"postgresql@*.service\" }]\n")
        .unwrap();
    let rule = &ok.policy.tenants[0].rules[0];
    assert_eq!(rule.label, "match[0] unit=postgresql@*.service");
    assert!(rule
        .unit
        .as_ref()
        .unwrap()
        .matches("postgresql@15-main.service"));
}

#[test]
fn rule_with_no_fields() {
    let text = "[[tenant]]\nname = \"bx1\"\n[[tenant.match]]\ncomm = \"x\"\n\
                [[tenant.match]]\ndescendants = true\n";
    let msg = error(text);
    assert_located(
        &msg,
        text,
        "[[tenant.match]]\ndescendants",
        &["bx1", "match[1] matches nothing"],
    );

    let text = "[[tenant]]\nname = \"bx1\"\nexempt = [ {} ]\n";
    let msg = error(text);
    assert_located(&msg, text, "{}", &["exempt[0] matches nothing"]);
}

// ---------------------------------------------------------------- tenant names

#[test]
fn bad_tenant_names() {
    let long = "a".repeat(65);
    let cases: [(&str, &str); 7] = [
        ("bx/1", "'/'"),
        ("..", "`..`"),
        ("../etc", "'/'"),
        ("bx 1", "' '"),
        (&long, "65 characters"),
        (".hidden", "must not start with `.`"),
        ("cpu.shares", "control file"),
    ];
    for (name, why) in cases {
        let text = tenant_named(name);
        let msg = error(&text);
        let quoted = format!("\"{name}\"");
        assert_located(
            &msg,
            &text,
            &quoted,
            &["tenant name", &format!("`{name}`"), why],
        );
    }
    for name in ["tasks", "memory.limit_in_bytes", "cgroup.procs", ""] {
        let text = tenant_named(name);
        let msg = error(&text);
        assert!(
            msg.starts_with(&format!("{NAME}:2:8: tenant name")),
            "{msg}"
        );
    }
    // 64 characters is the limit, not past it
    ok(&tenant_named(&"a".repeat(64)));
    ok(&tenant_named("BX1_prod-2.a"));
}

#[test]
fn check_group_name_directly() {
    assert!(check_group_name("bx1").is_ok());
    assert!(check_group_name("system.slice").is_ok());
    assert!(check_group_name(".").is_err());
    assert!(check_group_name("a\nb").is_err());
    assert!(check_group_name("blkio.weight").is_err());
    assert!(check_group_name("notify_on_release").is_err());
}

#[test]
fn duplicate_tenant_in_one_file() {
    let text =
        "[[tenant]]\nname = \"bx1\"\n\n[[tenant]]\nname = \"bx2\"\n\n[[tenant]]\nname = \"bx1\"\n";
    let msg = error(text);
    let first = at_nth(NAME, text, "\"bx1\"", 0);
    let first = first.trim_end_matches(": ");
    let loc = at_nth(NAME, text, "\"bx1\"", 1);
    assert!(msg.starts_with(&loc), "{msg} should start with {loc}");
    assert!(msg.contains("`bx1` is defined twice"), "{msg}");
    assert!(msg.contains(&format!("first at {first}")), "{msg}");
}

// ---------------------------------------------------------------- cpu

fn cpu_tenant(cpu_lines: &str) -> String {
    format!("[[tenant]]\nname = \"bx1\"\n[tenant.cpu]\n{cpu_lines}")
}

#[test]
fn cores_out_of_range() {
    for (v, shown) in [
        ("0", "0"),
        ("0.001", "0.001"),
        ("5000", "5000"),
        ("-2", "-2"),
    ] {
        let text = cpu_tenant(&format!("cores = {v}\n"));
        let msg = error(&text);
        assert_after(
            &msg,
            &text,
            "cores = ",
            &[&format!("cpu.cores = {shown}"), "out of range"],
        );
    }
    let text = cpu_tenant("cores = \"two\"\n");
    let msg = error(&text);
    assert_located(
        &msg,
        &text,
        "\"two\"",
        &["cpu.cores", "`two`", "not a number"],
    );
}

#[test]
fn weight_out_of_range() {
    for v in ["0", "10001", "-1", "1.5", "\"100\""] {
        let text = cpu_tenant(&format!("weight = {v}\n"));
        let msg = error(&text);
        assert_after(&msg, &text, "weight = ", &["cpu.weight", v, "1 to 10000"]);
    }
}

#[test]
fn cpus_list_invalid() {
    let text = cpu_tenant("cpus = \"3-1\"\n");
    let msg = error(&text);
    assert_located(&msg, &text, "\"3-1\"", &["cpu.cpus", "`3-1`", "backwards"]);

    let text = cpu_tenant("cpus = \"0-3,x\"\n");
    let msg = error(&text);
    assert_located(&msg, &text, "\"0-3,x\"", &["cpu.cpus", "`x`"]);

    let text = cpu_tenant("cpus = \"\"\n");
    let msg = error(&text);
    assert_located(&msg, &text, "\"\"", &["cpu.cpus is empty"]);
}

#[test]
fn numa_nodes_invalid() {
    let text = cpu_tenant("numa_nodes = []\n");
    let msg = error(&text);
    assert_located(&msg, &text, "[]", &["cpu.numa_nodes is empty"]);

    let text = cpu_tenant("numa_nodes = [0, -1]\n");
    let msg = error(&text);
    assert_located(
        &msg,
        &text,
        "[0, -1]",
        &["cpu.numa_nodes", "-1 is not a node number"],
    );
}

#[test]
fn numa_auto_is_the_only_value_and_excludes_numa_nodes() {
    let text = cpu_tenant("numa = \"yes\"\n");
    let msg = error(&text);
    assert_located(&msg, &text, "\"yes\"", &["cpu.numa = \"yes\"", "\"auto\""]);

    let text = cpu_tenant("numa = \"auto\"\nnuma_nodes = [1]\n");
    let msg = error(&text);
    assert_located(&msg, &text, "[1]", &["both set", "keep one"]);

    let l = ok(&cpu_tenant("numa = \"auto\"\n"));
    assert!(l.policy.tenants[0].cpu.numa_auto.is_some());
}

// ---------------------------------------------------------------- memory, io, storage

#[test]
fn memory_low_above_max() {
    let text = "[[tenant]]\nname = \"bx1\"\n[tenant.memory]\nmax = \"1GiB\"\nlow = \"2GiB\"\n";
    let msg = error(text);
    assert_located(
        &msg,
        text,
        "\"2GiB\"",
        &["bx1", "memory.low 2GiB", "above memory.max 1GiB"],
    );
}

#[test]
fn memory_high_above_max_is_only_a_warning() {
    let text = "[[tenant]]\nname = \"bx1\"\n[[tenant.match]]\ncomm = \"x\"\n\
                [tenant.memory]\nmax = \"1GiB\"\nhigh = \"2GiB\"\n";
    let l = ok(text);
    assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
    let w = l.warnings[0].to_string();
    assert_located(&w, text, "\"2GiB\"", &["memory.high is above memory.max"]);
}

#[test]
fn io_limits_without_storage() {
    let text = "[[tenant]]\nname = \"bx1\"\n[tenant.io]\nread_bps = \"50MiB\"\n";
    let msg = error(text);
    assert_located(
        &msg,
        text,
        "\"bx1\"",
        &["`bx1` sets IO limits but has no `storage`"],
    );

    // a device override alone is an IO limit too
    let text =
        "[[tenant]]\nname = \"bx1\"\n[[tenant.io.device]]\npath = \"/dev/vdb\"\nread_iops = 100\n";
    let msg = error(text);
    assert_located(&msg, text, "\"bx1\"", &["has no `storage`"]);
}

#[test]
fn storage_must_be_absolute_and_level_known() {
    let text =
        "[[tenant]]\nname = \"bx1\"\nstorage = [\"/u01\", \"u02\"]\nstorage_level = \"disks\"\n";
    let e = errors(text);
    assert_eq!(e.len(), 2, "{e:#?}");
    assert_located(
        &e[0],
        text,
        "\"u02\"",
        &["storage path `u02` must be absolute"],
    );
    assert_located(&e[1], text, "\"disks\"", &["storage_level `disks`"]);
}

// ---------------------------------------------------------------- agent

fn agent(parent: &str) -> Result<Loaded, PolicyErrors> {
    parse(&format!("[agent]\nparent = \"{parent}\"\n"))
}

#[test]
fn agent_parent_valid() {
    let l = parse("").unwrap();
    assert_eq!(l.policy.agent.parent, ParentSpec::HierarchyRoot);
    assert_eq!(l.policy.agent.root_name, DEFAULT_ROOT);
    assert_eq!(
        agent("root").unwrap().policy.agent.parent,
        ParentSpec::HierarchyRoot
    );
    assert_eq!(
        agent("self").unwrap().policy.agent.parent,
        ParentSpec::OwnCgroup
    );
    assert_eq!(
        agent("/system.slice/x").unwrap().policy.agent.parent,
        ParentSpec::Path("/system.slice/x".into())
    );
    assert_eq!(
        agent("/system.slice/x/").unwrap().policy.agent.parent,
        ParentSpec::Path("/system.slice/x".into())
    );
}

#[test]
fn agent_parent_accepts_systemd_unit_names() {
    let p = "/user.slice/user-1000.slice/user@1000.service/app.slice";
    assert_eq!(
        agent(p).unwrap().policy.agent.parent,
        ParentSpec::Path(p.to_string())
    );
}

#[test]
fn agent_parent_invalid() {
    for (parent, why) in [
        ("/a/../b", "`..`"),
        ("/a/./b", "`.`"),
        ("system.slice", "`system.slice` is not valid"),
        ("", "`` is not valid"),
        ("/a b", "' '"),
    ] {
        let text = format!("[agent]\nparent = \"{parent}\"\n");
        let e = match agent(parent) {
            Ok(_) => panic!("parent {parent:?} should be rejected"),
            Err(e) => e.0,
        };
        assert_eq!(e.len(), 1, "{e:?}");
        let msg = e[0].to_string();
        assert_located(
            &msg,
            &text,
            &format!("\"{parent}\""),
            &["agent.parent", why],
        );
    }
}

#[test]
fn agent_root_name_checked() {
    let text = "[agent]\nroot = \"db/cage\"\n";
    let msg = error(text);
    assert_located(&msg, text, "\"db/cage\"", &["agent.root", "`db/cage`"]);
    let l = ok("[agent]\nroot = \"governor\"\n");
    assert_eq!(l.policy.agent.root_name, "governor");
}

// ---------------------------------------------------------------- all at once

#[test]
fn every_error_is_reported_in_one_go() {
    let text = r#"
[agent]
parent = "/a/../b"

[[tenant]]
name = "bx 1"
[[tenant.match]]
comm = "("
[[tenant.match]]
user = "nobody-here"
[tenant.io]
read_bps = "5XB"
write_bps = 1.5
read_iops = 100
[tenant.cpu]
cores = 0
weight = 20000
cpus = "3-1"

[[tenant]]
name = "pg"
[[tenant.match]]
descendants = true
[tenant.memory]
max = "1GiB"
low = "2GiB"
"#;
    let e = errors(text);
    // agent.parent, name, regex, user, read_bps, write_bps, no storage, cpus, cores, weight,
    // empty rule, memory.low
    assert_eq!(e.len(), 12, "{e:#?}");
    // (the error is located just past this text, what it is about)
    let expect = [
        ("parent = ", "agent.parent: the path component `..`"),
        ("name = ", "tenant name: `bx 1`"),
        ("comm = ", "invalid regex `(`"),
        ("user = ", "no user named `nobody-here`"),
        ("read_bps = ", "`5XB`"),
        ("write_bps = ", "io.write_bps: 1.5"),
        ("\nname = ", "`bx 1` sets IO limits but has no `storage`"),
        ("cpus = ", "`3-1`"),
        ("cores = ", "cpu.cores = 0"),
        ("weight = ", "cpu.weight = 20000"),
        ("name = \"pg\"\n", "`pg`: match[0] matches nothing"),
        ("low = ", "memory.low"),
    ];
    for (prefix, what) in expect {
        let want = after(text, prefix);
        assert!(
            e.iter().any(|m| m.starts_with(&want) && m.contains(what)),
            "no error `{what}` at {want} in {e:#?}"
        );
    }
    let shown = parse(text).unwrap_err().to_string();
    assert!(
        shown.starts_with("the policy has 12 errors; nothing was applied:"),
        "{shown}"
    );
}

// ---------------------------------------------------------------- a good policy

const COMPLETE: &str = r#"
[agent]
root = "dbcage"
parent = "/system.slice/dbcage.service"

[[tenant]]
name = "bx1"
storage = ["/u01/oradata/BX1", "/dev/vdb"]
storage_level = "members"

[[tenant.match]]
comm = "^ora_p[0-9a-z]{3}_BX1$"
user = "oracle"
descendants = true

[[tenant.match]]
cmdline = "^oracleBX1 \\(LOCAL=NO\\)"
group = "dba"

[[tenant.exempt]]
comm = "^ora_lgwr_BX1$"

[tenant.io]
read_bps = "50MiB"
write_bps = "1.5GB"
read_iops = 2000
write_iops = "2k"

[[tenant.io.device]]
path = "/dev/vdb"
read_bps = "10MiB"

[tenant.cpu]
cpus = "0-3,8"
numa_nodes = [0, 1]
cores = 2.5
weight = 200

[tenant.memory]
max = "8GiB"
high = "6GiB"
low = "1GiB"
swap_max = "512MiB"

[[tenant]]
name = "pg"
[[tenant.match]]
exe = "/usr/lib/postgresql/16/bin/postgres"
[tenant.cpu]
cores = 2
"#;

#[test]
fn complete_policy_parses_into_expected_values() {
    let l = ok(COMPLETE);
    let p = &l.policy;
    assert_eq!(p.agent.root_name, "dbcage");
    assert_eq!(
        p.agent.parent,
        ParentSpec::Path("/system.slice/dbcage.service".into())
    );
    assert_eq!(p.files, vec![PathBuf::from(NAME)]);
    assert_eq!(p.tenants.len(), 2);

    let t = &p.tenants[0];
    assert_eq!(t.name, "bx1");
    assert_eq!(
        t.origin.to_string(),
        at(COMPLETE, "\"bx1\"").trim_end_matches(": ")
    );
    let storage: Vec<&str> = t.storage.iter().map(|s| s.value.as_str()).collect();
    assert_eq!(storage, ["/u01/oradata/BX1", "/dev/vdb"]);
    assert_eq!(
        t.storage[1].origin.to_string(),
        at(COMPLETE, "\"/dev/vdb\"").trim_end_matches(": ")
    );
    assert_eq!(t.storage_level, StorageLevel::Members);

    assert_eq!(t.rules.len(), 2);
    let r0 = &t.rules[0];
    assert_eq!(r0.comm.as_ref().unwrap().as_str(), "^ora_p[0-9a-z]{3}_BX1$");
    assert_eq!(r0.uid, Some(54321));
    assert!(r0.descendants);
    assert_eq!(
        r0.label,
        "match[0] comm=~^ora_p[0-9a-z]{3}_BX1$ user=oracle +descendants"
    );
    let r1 = &t.rules[1];
    assert!(r1
        .cmdline
        .as_ref()
        .unwrap()
        .is_match("oracleBX1 (LOCAL=NO)"));
    assert_eq!(r1.gid, Some(54322));
    assert!(!r1.descendants);
    assert_eq!(t.exempt.len(), 1);
    assert_eq!(t.exempt[0].label, "exempt[0] comm=~^ora_lgwr_BX1$");

    assert_eq!(
        t.io,
        IoLimits {
            read_bps: Some(50 * 1024 * 1024),
            write_bps: Some(1_500_000_000),
            read_iops: Some(2000),
            write_iops: Some(2000),
        }
    );
    assert_eq!(t.io_devices.len(), 1);
    assert_eq!(t.io_devices[0].path.value, "/dev/vdb");
    assert_eq!(
        t.io_devices[0].limits,
        IoLimits {
            read_bps: Some(10 << 20),
            ..Default::default()
        }
    );
    assert!(t.has_io_limits());
    assert!(t.sets_write_limits());

    assert_eq!(t.cpu.cpus.as_ref().unwrap().value.to_string(), "0-3,8");
    assert_eq!(t.cpu.cpus.as_ref().unwrap().value.len(), 5);
    assert_eq!(t.cpu.numa_nodes.as_ref().unwrap().value.to_string(), "0-1");
    assert_eq!(t.cpu.cores, Some(2.5));
    assert_eq!(t.cpu.weight, Some(200));

    assert_eq!(t.memory.max.as_ref().unwrap().value, 8 << 30);
    assert_eq!(
        t.memory.max.as_ref().unwrap().origin.to_string(),
        at(COMPLETE, "\"8GiB\"").trim_end_matches(": ")
    );
    assert_eq!(t.memory.high, Some(6 << 30));
    assert_eq!(t.memory.low, Some(1 << 30));
    assert_eq!(t.memory.swap_max, Some(512 << 20));

    let pg = &p.tenants[1];
    assert_eq!(pg.name, "pg");
    assert_eq!(pg.cpu.cores, Some(2.0));
    assert_eq!(pg.cpu.weight, None);
    assert_eq!(
        pg.rules[0].exe.as_deref(),
        Some(Path::new("/usr/lib/postgresql/16/bin/postgres"))
    );
    assert_eq!(pg.storage_level, StorageLevel::Device);
    assert!(!pg.has_io_limits());

    // cpus together with numa_nodes is allowed, with a warning at numa_nodes
    assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
    let w = l.warnings[0].to_string();
    assert_located(
        &w,
        COMPLETE,
        "[0, 1]",
        &["both cpu.cpus and cpu.numa_nodes"],
    );
}

#[test]
fn tenant_without_rules_is_a_warning() {
    let text = "[[tenant]]\nname = \"idle\"\n";
    let l = ok(text);
    assert_eq!(l.policy.tenants.len(), 1);
    assert_eq!(l.warnings.len(), 1);
    let w = l.warnings[0].to_string();
    assert_located(&w, text, "\"idle\"", &["`idle` has no match rules"]);
}

// ---------------------------------------------------------------- static overlaps

/// The same rule in two tenants: the second can never get a process. An error, located at the
/// second tenant's rule, naming both.
#[test]
fn same_rule_in_two_tenants_is_an_error() {
    let text = "[[tenant]]\nname = \"a\"\n[[tenant.match]]\ncomm = \"^ora_\"\n\
                [[tenant]]\nname = \"b\"\n[[tenant.match]]\ncomm = \"^pg\"\n\
                [[tenant.match]]\ncomm = \"^ora_\"\n";
    let e = error(text);
    let second = at_nth(NAME, text, "[[tenant.match]]", 2);
    assert!(e.starts_with(&second), "{e} should start with {second}");
    assert!(e.contains("tenant `b` repeats a rule of tenant `a`"), "{e}");
    assert!(e.contains("match[1] comm=~^ora_"), "{e}");
    assert!(e.contains("goes to `a`"), "{e}");
}

/// Two oracle tenants with the same SID: one error naming the SID, not one per preset rule.
#[test]
fn same_sid_in_two_tenants_is_one_error() {
    let text = "[[tenant]]\nname = \"A\"\npreset = \"oracle\"\nsid = \"DEMO\"\n\
                [[tenant]]\nname = \"B\"\npreset = \"oracle\"\nsid = \"DEMO\"\n";
    let e = error(text);
    let second = at_nth(NAME, text, "\"DEMO\"", 1);
    assert!(e.starts_with(&second), "{e} should start with {second}");
    assert!(e.contains("sid `DEMO` is already tenant `A`'s"), "{e}");
}

/// A later tenant's narrower rule under an earlier tenant's broader one is found statically.
#[test]
fn narrower_rule_shadowed_by_an_earlier_tenant_warns() {
    let text = "[[tenant]]\nname = \"pg\"\nmatch = [{ cmdline = '^postgres' }]\n\
                [[tenant]]\nname = \"wal\"\nmatch = [{ cmdline = '^postgres: (walwriter|walsender)', user = \"postgres\" }]\n";
    let l = ok(text);
    assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
    let w = l.warnings[0].to_string();
    assert!(w.starts_with(&at_nth(NAME, text, "{", 1)), "{w}");
    assert!(
        w.contains("rule `match[0] cmdline=~^postgres: (walwriter|walsender) user=postgres` of tenant `wal` is covered by rule `match[0] cmdline=~^postgres` of tenant `pg`"),
        "{w}"
    );
}

/// What `regex_implies` may and may not conclude.
#[test]
fn regex_implication_is_only_claimed_when_proven() {
    let r = |s: &str| Pattern::new(s).unwrap();
    assert!(regex_implies(&r("^postgres"), &r("^postgres: walwriter")));
    assert!(regex_implies(&r("walwriter"), &r("^postgres: walwriter")));
    assert!(regex_implies(&r("^ora_"), &r("^ora_(pmon|smon)_BX1$")));
    // an end anchor or word boundary in the broad one: not proven
    assert!(!regex_implies(&r("^ora_pmon$"), &r("^ora_pmon_BX1")));
    assert!(!regex_implies(&r("wal\\b"), &r("^postgres: wal")));
    // an unanchored narrow one can match anywhere
    assert!(!regex_implies(&r("^postgres"), &r("postgres: walwriter")));
    // disjoint
    assert!(!regex_implies(&r("^ora_.*_BX1( |$)"), &r("^ora_pmon_BX10")));
    assert!(!regex_implies(&r("^mysqld"), &r("^postgres")));
}

#[test]
fn same_user_in_two_tenants_warns() {
    let text = "[[tenant]]\nname = \"a\"\n[[tenant.match]]\nuser = \"oracle\"\n\
                [[tenant]]\nname = \"b\"\n[[tenant.match]]\nuser = 54321\ncomm = \"^ora\"\n";
    let l = ok(text);
    assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
    let w = l.warnings[0].to_string();
    assert!(w.contains("user=oracle") && w.contains("user=54321"), "{w}");
    assert!(w.contains("first in file order"), "{w}");
}

#[test]
fn distinct_rules_do_not_warn() {
    let text = "[[tenant]]\nname = \"a\"\n[[tenant.match]]\nuser = \"oracle\"\n\
                [[tenant]]\nname = \"b\"\n[[tenant.match]]\nuser = \"postgres\"\n\
                [[tenant.match]]\ncomm = \"^ora\"\n";
    let l = ok(text);
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
}

// ---------------------------------------------------------------- drop-ins

struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new(main: &str) -> Tree {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("dbcage.toml"), main).unwrap();
        std::fs::create_dir(dir.path().join("conf.d")).unwrap();
        Tree { dir }
    }
    fn dropin(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join("conf.d").join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
    fn main(&self) -> PathBuf {
        self.dir.path().join("dbcage.toml")
    }
    fn load(&self) -> Result<Loaded, PolicyErrors> {
        crate::policy::load(&self.main(), &FakeAccounts)
    }
}

const MAIN: &str = r#"[[tenant]]
name = "bx1"
storage = ["/u01"]
[[tenant.match]]
comm = "^ora_"
[tenant.io]
read_bps = "50MiB"
write_bps = "20MiB"
[tenant.memory]
max = "4GiB"
"#;

#[test]
fn dropin_changes_only_the_keys_it_sets() {
    let tree = Tree::new(MAIN);
    let a = tree.dropin(
        "10-a.toml",
        "[[tenant]]\nname = \"bx1\"\n[tenant.io]\nread_bps = \"10MiB\"\n",
    );
    let l = tree.load().unwrap();
    assert_eq!(l.policy.files, vec![tree.main(), a]);
    assert_eq!(l.policy.tenants.len(), 1);
    let t = &l.policy.tenants[0];
    assert_eq!(t.io.read_bps, Some(10 << 20));
    assert_eq!(t.io.write_bps, Some(20 << 20));
    assert_eq!(t.memory.max.as_ref().unwrap().value, 4 << 30);
    assert_eq!(t.rules.len(), 1);
    assert_eq!(t.storage.len(), 1);
    // the tenant stays where the main file defines it
    assert_eq!(*t.origin.file, tree.main());
}

#[test]
fn dropin_adds_a_tenant_and_later_dropin_wins() {
    let tree = Tree::new(MAIN);
    tree.dropin(
        "10-a.toml",
        "[[tenant]]\nname = \"bx1\"\n[tenant.io]\nread_bps = \"10MiB\"\n\
         [[tenant]]\nname = \"pg\"\n[[tenant.match]]\ncomm = \"^postgres\"\n[tenant.cpu]\ncores = 1\n",
    );
    tree.dropin(
        "20-b.toml",
        "[[tenant]]\nname = \"bx1\"\n[tenant.io]\nread_bps = \"30MiB\"\n\
         [[tenant]]\nname = \"pg\"\n[tenant.cpu]\nweight = 50\n",
    );
    // not drop-ins: they must be ignored, even though they would be errors
    std::fs::write(tree.dir.path().join("conf.d/30-c.toml.bak"), "garbage = [").unwrap();
    std::fs::write(tree.dir.path().join("conf.d/README"), "not toml").unwrap();
    std::fs::write(tree.dir.path().join("conf.d/40-d.conf"), "bogus = 1").unwrap();

    let l = tree.load().unwrap();
    assert_eq!(l.policy.files.len(), 3, "{:?}", l.policy.files);
    assert_eq!(l.policy.tenants.len(), 2);
    let bx1 = &l.policy.tenants[0];
    assert_eq!(bx1.name, "bx1");
    assert_eq!(bx1.io.read_bps, Some(30 << 20), "the later drop-in wins");
    assert_eq!(bx1.io.write_bps, Some(20 << 20));
    let pg = &l.policy.tenants[1];
    assert_eq!(pg.name, "pg");
    assert_eq!(pg.cpu.cores, Some(1.0), "kept from 10-a");
    assert_eq!(pg.cpu.weight, Some(50), "added by 20-b");
    assert_eq!(pg.rules.len(), 1);
}

#[test]
fn dropin_order_is_by_name_not_creation() {
    let tree = Tree::new(MAIN);
    // created last to first; each sets read_bps to its number, so only name order ends at 90
    for i in (10..=90).rev().step_by(10) {
        tree.dropin(
            &format!("{i}-x.toml"),
            &format!("[[tenant]]\nname = \"bx1\"\n[tenant.io]\nread_bps = \"{i}MiB\"\n"),
        );
    }
    let l = tree.load().unwrap();
    assert_eq!(l.policy.tenants[0].io.read_bps, Some(90 << 20));
    let names: Vec<String> = l.policy.files[1..]
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let sorted: Vec<String> = (10..=90)
        .step_by(10)
        .map(|i| format!("{i}-x.toml"))
        .collect();
    assert_eq!(names, sorted);
}

#[test]
fn error_in_a_dropin_names_the_dropin() {
    let tree = Tree::new(MAIN);
    tree.dropin(
        "10-a.toml",
        "[[tenant]]\nname = \"bx1\"\n[tenant.io]\nread_bps = \"10MiB\"\n",
    );
    let b_text = "# tighter\n[[tenant]]\nname = \"bx1\"\n[tenant.io]\nwrite_bps = \"5XB\"\n";
    let b = tree.dropin("20-b.toml", b_text);
    let e = tree.load().unwrap_err();
    assert_eq!(e.0.len(), 1, "{e}");
    let msg = e.0[0].to_string();
    let loc = at_nth(&b.display().to_string(), b_text, "\"5XB\"", 0);
    assert!(msg.starts_with(&loc), "{msg} should start with {loc}");
    assert!(msg.contains("`5XB`"), "{msg}");
}

#[test]
fn syntax_errors_in_main_and_dropin_are_both_reported() {
    let main_text = "[[tenant]]\nname = \"bx1\"\nsurprise = 1\n";
    let tree = Tree::new(main_text);
    let d_text = "[[tenant]]\nname = \"pg\"\n[tenant.io]\nread_bps = \"1MiB\"\nwhatever = 2\n";
    let d = tree.dropin("10-a.toml", d_text);
    let e = tree.load().unwrap_err();
    // Both unknown keys, and the drop-in tenant's missing storage: all in one run.
    assert_eq!(e.0.len(), 3, "{e}");
    assert!(e.0[2].to_string().contains("has no `storage`"), "{e}");
    let m0 = e.0[0].to_string();
    let m1 = e.0[1].to_string();
    let l0 = at_nth(&tree.main().display().to_string(), main_text, "surprise", 0);
    let l1 = at_nth(&d.display().to_string(), d_text, "whatever", 0);
    assert!(m0.starts_with(&l0), "{m0} should start with {l0}");
    assert!(m1.starts_with(&l1), "{m1} should start with {l1}");
}

#[test]
fn duplicate_in_a_dropin_is_an_error_but_across_files_a_merge() {
    let tree = Tree::new(MAIN);
    let d_text = "[[tenant]]\nname = \"pg\"\n[[tenant]]\nname = \"pg\"\n";
    let d = tree.dropin("10-a.toml", d_text);
    let e = tree.load().unwrap_err();
    assert_eq!(e.0.len(), 1, "{e}");
    let msg = e.0[0].to_string();
    let loc = at_nth(&d.display().to_string(), d_text, "\"pg\"", 1);
    assert!(msg.starts_with(&loc), "{msg} should start with {loc}");
    assert!(msg.contains("defined twice"), "{msg}");
}

#[test]
fn warnings_across_dropins() {
    let tree = Tree::new(MAIN);
    let d_text = "[[tenant]]\nname = \"other\"\n[[tenant.match]]\ncomm = \"^ora_pmon\"\n";
    let d = tree.dropin("10-a.toml", d_text);
    let l = tree.load().unwrap();
    assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
    let w = l.warnings[0].to_string();
    let loc = at_nth(&d.display().to_string(), d_text, "[[tenant.match]]", 0);
    assert!(w.starts_with(&loc), "{w} should start with {loc}");
    assert!(w.contains("is covered by"), "{w}");
}

#[test]
fn missing_policy_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.toml");
    let e = crate::policy::load(&path, &FakeAccounts).unwrap_err();
    assert_eq!(e.0.len(), 1);
    let msg = e.0[0].to_string();
    assert!(
        msg.contains("cannot read policy") && msg.contains("nope.toml"),
        "{msg}"
    );
}

#[test]
fn agent_metrics_address() {
    let default = ok("");
    assert_eq!(
        default.policy.agent.metrics,
        Some("127.0.0.1:9477".parse().unwrap())
    );
    assert_eq!(
        ok("[agent]\nmetrics = \"off\"\n").policy.agent.metrics,
        None
    );
    assert_eq!(
        ok("[agent]\nmetrics = \"0.0.0.0:9100\"\n")
            .policy
            .agent
            .metrics,
        Some("0.0.0.0:9100".parse().unwrap())
    );
    let text = "[agent]\nmetrics = \"localhost\"\n";
    let msg = error(text);
    assert_located(
        &msg,
        text,
        "\"localhost\"",
        &["agent.metrics", "`localhost`", "off"],
    );
}

#[test]
fn agent_manager_choice() {
    assert_eq!(ok("").policy.agent.manager, ManagerChoice::Auto);
    for (text, want) in [
        ("auto", ManagerChoice::Auto),
        ("systemd", ManagerChoice::Systemd),
        ("cgroupfs", ManagerChoice::Cgroupfs),
    ] {
        let l = ok(&format!("[agent]\nmanager = \"{text}\"\n"));
        assert_eq!(l.policy.agent.manager, want);
        assert_eq!(want.as_str(), text);
    }
    let text = "[agent]\nmanager = \"systemctl\"\n";
    let msg = error(text);
    assert_located(
        &msg,
        text,
        "\"systemctl\"",
        &["agent.manager", "`systemctl`", "\"cgroupfs\""],
    );
}

#[test]
fn io_split_keys_parse_with_defaults() {
    let base = "[[tenant]]\nname = \"a\"\nmatch = [{ comm = \"x\" }]\nstorage = [\"/data\"]\n";
    let l = ok(&format!("{base}[tenant.io]\nread_bps = \"12MiB\"\n"));
    let s = &l.policy.tenants[0].io_split;
    assert_eq!(s.split, Split::Equal);
    assert_eq!(s.interval, DEFAULT_REBALANCE);
    assert_eq!(s.floor, DEFAULT_FLOOR);
    assert_eq!(s.smoothing, DEFAULT_SMOOTHING);
    let l = ok(&format!(
        "{base}[tenant.io]\nread_bps = \"12MiB\"\nsplit = \"demand\"\nrebalance_interval = \"500ms\"\nfloor = \"5%\"\nsmoothing = 0.5\n"
    ));
    let s = &l.policy.tenants[0].io_split;
    assert_eq!(s.split, Split::Demand);
    assert_eq!(s.interval, std::time::Duration::from_millis(500));
    assert!((s.floor - 0.05).abs() < 1e-12);
    assert_eq!(s.smoothing, 0.5);
}

#[test]
fn io_split_errors_are_located() {
    let base = "[[tenant]]\nname = \"a\"\nmatch = [{ comm = \"x\" }]\nstorage = [\"/data\"]\n";
    let e = errors(&format!(
        "{base}[tenant.io]\nread_bps = \"12MiB\"\nsplit = \"load\"\nrebalance_interval = \"fast\"\nfloor = \"120%\"\nsmoothing = 1.5\n"
    ));
    assert_eq!(e.len(), 4, "{e:?}");
    assert!(
        e[0].starts_with("dbcage.toml:7:9:") && e[0].contains("io.split `load`"),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("dbcage.toml:8:22:") && e[1].contains("not a duration"),
        "{e:?}"
    );
    assert!(
        e[2].starts_with("dbcage.toml:9:9:") && e[2].contains("io.floor"),
        "{e:?}"
    );
    assert!(
        e[3].starts_with("dbcage.toml:10:13:") && e[3].contains("io.smoothing"),
        "{e:?}"
    );
    let e = errors(&format!(
        "{base}[tenant.io]\nread_bps = \"12MiB\"\nrebalance_interval = \"10ms\"\nfloor = \"5\"\n"
    ));
    assert!(
        e.iter().any(|m| m.contains("out of range (100ms to 1h)")),
        "{e:?}"
    );
    assert!(e.iter().any(|m| m.contains("not a percentage")), "{e:?}");
}

#[test]
fn schedules_are_validated_with_locations_and_overlaps_warn() {
    let base = "[[tenant]]\nname = \"s\"\nmatch = [{ comm = \"^x$\" }]\nstorage = [\"/\"]\n[tenant.io]\nread_bps = \"50MiB\"\n";
    let good = format!(
        "{base}[[tenant.schedule]]\ndays = \"Mon-Fri\"\nfrom = \"22:00\"\nto = \"06:00\"\nio.read_bps = \"400MiB\"\ncpu.cores = 4\n\
         [[tenant.schedule]]\ndays = \"Fri\"\nfrom = \"23:00\"\nto = \"23:30\"\nio.read_bps = \"1GiB\"\n\
         [[tenant.schedule]]\ndays = \"Sat\"\nfrom = \"10:00\"\nto = \"11:00\"\nio.read_bps = \"1GiB\"\n"
    );
    let l = ok(&good);
    let s = &l.policy.tenants[0].schedules;
    assert_eq!(s.len(), 3);
    assert_eq!(s[0].label, "Mon-Fri 22:00-06:00");
    assert_eq!(s[0].keys, vec!["io.read_bps", "cpu.cores"]);
    assert_eq!(
        l.policy.tenants[0].io.read_bps,
        Some(50 << 20),
        "windows change nothing outside the overlay"
    );
    // The Friday window overlaps the weekday night and sets the same key; Saturday's does not.
    let w: Vec<String> = l.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(w.len(), 1, "{w:#?}");
    assert_located(
        &w[0],
        &good,
        "[[tenant.schedule]]\ndays = \"Fri\"",
        &[
            "overlaps the window Mon-Fri 22:00-06:00",
            "io.read_bps",
            "later one",
        ],
    );

    let bad = format!(
        "{base}[[tenant.schedule]]\ndays = \"Mon-Fry\"\nfrom = \"25:00\"\nto = \"6\"\ncpu.cores = 0\nio.split = \"demand\"\n"
    );
    let e = errors(&bad);
    assert_eq!(e.len(), 5, "{e:#?}");
    assert_located(&e[0], &bad, "\"Mon-Fry\"", &["schedule[0].days", "Fry"]);
    assert_located(&e[1], &bad, "\"25:00\"", &["schedule[0].from"]);
    assert_located(&e[2], &bad, "\"6\"", &["schedule[0].to", "HH:MM"]);
    assert!(
        e.iter()
            .any(|x| x.contains("cpu.cores = 0 is out of range")),
        "{e:#?}"
    );
    assert!(e.iter().any(|x| x.contains("io.split")), "{e:#?}");
    // IO limits in a window need storage, as in [tenant.io].
    let e = error(&format!(
        "{}[[tenant.schedule]]\nfrom = \"1:00\"\nto = \"2:00\"\nio.write_iops = 10\n",
        tenant_named("n")
    ));
    assert!(e.contains("has no `storage`"), "{e}");
}

#[test]
fn overlay_windows_then_fragments_in_that_order() {
    let text = format!(
        "{}[tenant.cpu]\ncores = 1\n[[tenant.schedule]]\nfrom = \"00:00\"\nto = \"00:00\"\ncpu.cores = 2\ncpu.weight = 50\n",
        tenant_named("o")
    );
    let sources = vec![(PathBuf::from(NAME), text)];
    let overlay = Overlay {
        windows: vec![("o".into(), 0)],
        fragments: vec![(
            PathBuf::from("set o"),
            "[[tenant]]\nname = \"o\"\n[tenant.cpu]\ncores = 3\n".into(),
        )],
    };
    let l = from_sources_with(&sources, &overlay, &FakeAccounts).unwrap();
    assert_eq!(l.policy.tenants[0].cpu.cores, Some(3.0));
    assert_eq!(l.policy.tenants[0].cpu.weight, Some(50));
    // A fragment may not add tenants, change rules or the agent.
    for (frag, want) in [
        ("[[tenant]]\nname = \"new\"\n", "no tenant named `new`"),
        (
            "[[tenant]]\nname = \"o\"\nstorage = [\"/\"]\n",
            "only its io, cpu and memory",
        ),
        ("[agent]\nroot = \"x\"\n", "not [agent]"),
    ] {
        let overlay = Overlay {
            windows: vec![],
            fragments: vec![(PathBuf::from("set o"), frag.into())],
        };
        let e = from_sources_with(&sources, &overlay, &FakeAccounts)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{frag}: {e}");
    }
}

// ---------------------------------------------------------------- a DBA's first hour (issue 21)

/// Eight mistakes of different kinds in one file: one run reports all of them (unknown keys with
/// suggestions, bad values, a bad regex), not one round per kind.
#[test]
fn eight_mistakes_are_reported_in_one_run() {
    let text = r#"[agent]
root = "dbcage"
bogus = 1
[[tenant]]
name = "DEMO"
preset = "oracel"
sid = "DEMO"
storage = ["/"]
[tenant.io]
read_iop = 5
write_bps = "5XB"
[tenant.cpu]
wieght = 3
cores = 0
[[tenant]]
name = "pg15"
match = [{ cmdline = "(", comand = "x" }]
[tenant.memory]
max = "1GiB/s"
"#;
    let e = errors(text);
    let expect = [
        ("bogus", "unknown key `bogus` in [agent]"),
        ("read_iop", "did you mean `read_iops`?"),
        ("wieght", "did you mean `weight`?"),
        (
            "comand",
            "unknown key `comand` in [tenant.match] of tenant `pg15`",
        ),
        (
            "\"oracel\"",
            "unknown preset `oracel`; did you mean `oracle`?",
        ),
        ("\"5XB\"", "io.write_bps"),
        ("0\n", "cpu.cores = 0"),
        ("\"(\"", "invalid regex"),
        ("\"1GiB/s\"", "a memory size has no `/s`"),
    ];
    assert_eq!(e.len(), expect.len(), "{e:#?}");
    for (needle, part) in expect {
        let loc = at(text, needle);
        assert!(
            e.iter().any(|m| m.starts_with(&loc) && m.contains(part)),
            "no error at {loc} mentioning `{part}` in {e:#?}"
        );
    }
}

/// A bare `read_bps = 80` is 80 bytes/s: allowed, with a warning that says so, suggests the unit
/// that was probably meant and lists the accepted forms; likewise for IOPS and memory.
#[test]
fn implausibly_small_limits_warn_with_the_accepted_forms() {
    let text = "[[tenant]]\nname = \"db\"\nstorage = [\"/u01\"]\nmatch = [{ comm = \"^x$\" }]\n\
                [tenant.io]\nread_bps = 80\nwrite_bps = \"50MB/s\"\nwrite_iops = 5\n\
                [tenant.memory]\nmax = 5120\n";
    let l = ok(text);
    let w: Vec<String> = l.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(w.len(), 3, "{w:#?}");
    assert_after(
        &w[0],
        text,
        "read_bps = ",
        &[
            "io.read_bps = 80 is 80 bytes/s",
            "a bare number is bytes per second: did you mean \"80MiB\"?",
            "\"50MiB\"",
            "kB/MB/GB powers of 1000",
        ],
    );
    assert_after(
        &w[1],
        text,
        "write_iops = ",
        &["io.write_iops = 5 allows 5 IO/s", "\"2k\""],
    );
    assert_after(
        &w[2],
        text,
        "max = ",
        &["memory.max = 5120 is 5KiB", "did you mean \"5120MiB\""],
    );
    // Under one page the kernel would write 0: refused.
    let e = error(&text.replace("max = 5120", "max = 5"));
    assert!(
        e.contains("memory.max: 5 bytes is less than one page"),
        "{e}"
    );
    // a plausible rate, with or without `/s`, warns about nothing
    assert_eq!(
        ok(&text.replace("read_bps = 80", "read_bps = \"80MiB/s\""))
            .warnings
            .len(),
        2
    );
}

#[test]
fn cores_beyond_the_tenants_cpus_warn() {
    let text = "[[tenant]]\nname = \"db\"\nmatch = [{ comm = \"^x$\" }]\n\
                [tenant.cpu]\ncores = 7\ncpus = \"0-1\"\n";
    let l = ok(text);
    assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
    assert_after(
        &l.warnings[0].to_string(),
        text,
        "cores = ",
        &[
            "cpu.cores = 7 is more than the 2 cpus of cpu.cpus (0-1)",
            "never binds",
        ],
    );
    assert!(ok(&text.replace("cores = 7", "cores = 2"))
        .warnings
        .is_empty());
}

/// A password in `conninfo` is worth a warning when the policy file is readable by others.
#[test]
fn conninfo_password_in_a_readable_policy_warns() {
    use std::os::unix::fs::PermissionsExt;
    let policy = |conninfo: &str| {
        format!(
            "[[tenant]]\nname = \"pg\"\nmatch = [{{ comm = \"^postgres$\" }}]\n\
             [tenant.replication]\nrole = \"primary\"\nconninfo = \"{conninfo}\"\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dbcage.toml");
    let load = |text: &str, mode: u32| {
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        crate::policy::from_sources_with(
            &[(path.clone(), text.to_string())],
            &Overlay::default(),
            &FakeAccounts,
        )
        .unwrap()
        .warnings
        .iter()
        .map(|w| w.to_string())
        .collect::<Vec<_>>()
    };
    let secret = policy("host=/run/postgresql password=s3cret dbname=postgres");
    let w = load(&secret, 0o644);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("conninfo holds a password"), "{w:?}");
    assert!(
        w[0].contains("mode 0644") && w[0].contains("chmod go-r"),
        "{w:?}"
    );
    assert!(load(&secret, 0o600).is_empty());
    assert!(load(&policy("host=/run/postgresql dbname=postgres"), 0o644).is_empty());
    assert_eq!(
        load(&policy("postgresql://rep:s3cret@localhost/postgres"), 0o644).len(),
        1
    );
    assert!(load(&policy("postgresql://rep@localhost/postgres"), 0o644).is_empty());
}

#[test]
fn io_weight_and_latency_target_parse_and_their_errors_are_located() {
    let base = "[[tenant]]\nname = \"a\"\nmatch = [{ comm = \"x\" }]\nstorage = [\"/data\"]\n";
    let l = ok(&format!(
        "{base}[tenant.io]\nweight = 300\nlatency_target = \"500us\"\n"
    ));
    let t = &l.policy.tenants[0];
    assert_eq!(t.io_weight.as_ref().map(|w| w.value), Some(300));
    assert_eq!(
        t.io_latency_target.as_ref().map(|d| d.value),
        Some(std::time::Duration::from_micros(500))
    );
    let l = ok(&format!("{base}[tenant.io]\nread_bps = \"1MiB\"\n"));
    assert!(l.policy.tenants[0].io_weight.is_none());
    assert!(l.policy.tenants[0].io_latency_target.is_none());

    let e = errors(&format!(
        "{base}[tenant.io]\nweight = 0\nlatency_target = \"soon\"\n"
    ));
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with("dbcage.toml:6:10:") && e[0].contains("io.weight = 0 is not valid"),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("dbcage.toml:7:18:") && e[1].contains("not a duration"),
        "{e:?}"
    );
    let e = errors(&format!(
        "{base}[tenant.io]\nweight = 10001\nlatency_target = \"20s\"\n"
    ));
    assert!(e[0].contains("from 1 to 10000"), "{e:?}");
    assert!(e[1].contains("out of range (100us to 10s)"), "{e:?}");
    // a window cannot set them
    let e = errors(&format!(
        "{base}[[tenant.schedule]]\ndays = \"Mon-Fri\"\nfrom = \"09:00\"\nto = \"17:00\"\nio.weight = 50\n"
    ));
    assert!(
        e.iter()
            .any(|m| m.contains("io.weight and io.latency_target belong in [tenant.io]")),
        "{e:?}"
    );
}

#[test]
fn protection_guard_keys_parse_and_their_errors_are_located() {
    let t = |name: &str, extra: &str| {
        format!("[[tenant]]\nname = \"{name}\"\nmatch = [{{ comm = \"{name}\" }}]\nstorage = [\"/data\"]\n[tenant.io]\n{extra}")
    };
    let l = ok(&format!(
        "{}{}",
        t(
            "db",
            "protect_pressure = \"20%\"\nprotect_donors = [\"batch\"]\n"
        ),
        t("batch", "weight = 200\n")
    ));
    let g = l.policy.tenants[0].io_guard.as_ref().unwrap();
    assert_eq!(g.pressure, 0.2);
    assert_eq!(g.window, std::time::Duration::from_secs(1));
    assert_eq!(g.donors[0].value, "batch");
    assert!(l.policy.tenants[1].io_guard.is_none());

    let e = errors(&format!(
        "{}{}",
        t(
            "db",
            "protect_pressure = \"20\"\nprotect_window = \"100ms\"\nprotect_donors = [\"batch\"]\n"
        ),
        t("batch", "")
    ));
    assert!(
        e[0].starts_with("dbcage.toml:6:20:") && e[0].contains("not a share of time"),
        "{e:?}"
    );
    let e = errors(&t(
        "db",
        "protect_pressure = \"20%\"\nprotect_window = \"20s\"\nprotect_donors = [\"batch\"]\n",
    ));
    assert!(e[0].contains("from 500ms to 10s"), "{e:?}");
    let e = errors(&t("db", "protect_pressure = \"20%\"\n"));
    assert!(e[0].contains("needs io.protect_donors"), "{e:?}");
    let e = errors(&t("db", "protect_donors = [\"batch\"]\n"));
    assert!(e[0].contains("needs io.protect_pressure"), "{e:?}");
    let e = errors(&t(
        "db",
        "protect_pressure = \"20%\"\nprotect_donors = [\"db\", \"nobody\"]\n",
    ));
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(e[0].contains("names the tenant itself"), "{e:?}");
    assert!(
        e[1].starts_with("dbcage.toml:7:")
            && e[1].contains("`nobody`, which is not a tenant of this policy"),
        "{e:?}"
    );
    assert_eq!(g.lever, GuardLever::Weight);

    // protect_lever = "caps": the donors need caps of their own
    let caps =
        "protect_pressure = \"20%\"\nprotect_donors = [\"batch\"]\nprotect_lever = \"caps\"\n";
    let l = ok(&format!(
        "{}{}",
        t("db", caps),
        t("batch", "read_iops = 2000\n")
    ));
    let g = l.policy.tenants[0].io_guard.as_ref().unwrap();
    assert_eq!(g.lever, GuardLever::Caps);
    let e = errors(&format!(
        "{}{}",
        t("db", caps),
        t("batch", "weight = 200\n")
    ));
    assert!(
        e[0].starts_with("dbcage.toml:7:") && e[0].contains("`batch` has none; give it the caps"),
        "{e:?}"
    );
    let e = errors(&format!(
        "{}{}",
        t("db", &caps.replace("\"caps\"", "\"cap\"")),
        t("batch", "read_iops = 2000\n")
    ));
    assert!(
        e[0].starts_with("dbcage.toml:8:") && e[0].contains("io.protect_lever `cap` is not valid"),
        "{e:?}"
    );
    let e = errors(&t("db", "protect_lever = \"caps\"\n"));
    assert!(
        e[0].contains("io.protect_lever needs io.protect_pressure"),
        "{e:?}"
    );
}

#[test]
fn cpu_protection_guard_keys_parse_and_their_errors_are_located() {
    let t = |name: &str, extra: &str| {
        format!("[[tenant]]\nname = \"{name}\"\nmatch = [{{ comm = \"{name}\" }}]\n[tenant.cpu]\n{extra}")
    };
    let l = ok(&format!(
        "{}{}",
        t(
            "db",
            "protect_pressure = \"30%\"\nprotect_window = \"2s\"\nprotect_donors = [\"batch\"]\n"
        ),
        t("batch", "weight = 200\n")
    ));
    let g = l.policy.tenants[0].cpu_guard.as_ref().unwrap();
    assert_eq!(g.resource, Resource::Cpu);
    assert_eq!(g.pressure, 0.3);
    assert_eq!(g.window, std::time::Duration::from_secs(2));
    assert_eq!(g.donors[0].value, "batch");
    assert!(l.policy.tenants[0].io_guard.is_none());
    assert!(l.policy.tenants[1].cpu_guard.is_none());

    let e = errors(&format!(
        "{}{}",
        t(
            "db",
            "protect_pressure = \"30\"\nprotect_donors = [\"batch\"]\n"
        ),
        t("batch", "")
    ));
    assert!(
        e[0].starts_with("dbcage.toml:5:20:")
            && e[0].contains("cpu.protect_pressure `30` is not a share of time"),
        "{e:?}"
    );
    let e = errors(&t(
        "db",
        "protect_pressure = \"30%\"\nprotect_window = \"50ms\"\nprotect_donors = [\"batch\"]\n",
    ));
    assert!(
        e[0].starts_with("dbcage.toml:6:") && e[0].contains("cpu.protect_window `50ms`"),
        "{e:?}"
    );
    let e = errors(&t("db", "protect_pressure = \"30%\"\n"));
    assert!(
        e[0].contains("needs cpu.protect_donors, the tenants whose cpu.weight"),
        "{e:?}"
    );
    let e = errors(&t("db", "protect_window = \"1s\"\n"));
    assert!(
        e[0].contains("cpu.protect_window needs cpu.protect_pressure"),
        "{e:?}"
    );
    let e = errors(&t(
        "db",
        "protect_pressure = \"30%\"\nprotect_donors = [\"nobody\"]\n",
    ));
    assert!(
        e[0].starts_with("dbcage.toml:6:")
            && e[0].contains("cpu.protect_donors names `nobody`, which is not a tenant"),
        "{e:?}"
    );
    // io's lever is io's alone
    let e = errors(&t(
        "db",
        "protect_pressure = \"30%\"\nprotect_donors = [\"db\"]\nprotect_lever = \"caps\"\n",
    ));
    assert!(e.iter().any(|m| m.contains("protect_lever")), "{e:?}");
    // a schedule window may not set them
    let e = errors(&format!(
        "{}[[tenant.schedule]]\ndays = \"Mon-Fri\"\nfrom = \"09:00\"\nto = \"17:00\"\ncpu.protect_pressure = \"30%\"\n",
        t("db", "weight = 100\n")
    ));
    assert!(
        e.iter().any(|m| m.contains("belong in [tenant.cpu]")),
        "{e:?}"
    );
}
