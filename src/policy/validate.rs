//! Raw policy → `Policy`: parse units, compile regexes, resolve users and groups, check names and
//! ranges. Every problem is collected with its location; the caller gets all of them at once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::raw::{Name, Quantity, RawFile, RawIoValues, RawRule, RawTenant};
use super::source::{with_current_file, Loc, SourceMap};
use super::*;
use crate::units::{parse_bytes, parse_count};

/// Looks up users and groups. The system implementation asks NSS (so LDAP users work); tests
/// use a fixed table.
pub trait Accounts {
    fn uid(&self, name: &str) -> Option<u32>;
    fn gid(&self, name: &str) -> Option<u32>;
}

pub struct SystemAccounts;

impl Accounts for SystemAccounts {
    fn uid(&self, name: &str) -> Option<u32> {
        nix::unistd::User::from_name(name)
            .ok()
            .flatten()
            .map(|u| u.uid.as_raw())
    }
    fn gid(&self, name: &str) -> Option<u32> {
        nix::unistd::Group::from_name(name)
            .ok()
            .flatten()
            .map(|g| g.gid.as_raw())
    }
}

/// Longest tenant name: it becomes a directory name and a metric label.
pub const MAX_TENANT_NAME: usize = 64;

/// Prefixes of control-file names: a tenant named like one would collide with a kernel file
/// in the v1 directory that holds it.
const RESERVED_PREFIXES: &[&str] = &[
    "cgroup.",
    "cpu.",
    "cpuacct.",
    "cpuset.",
    "memory.",
    "blkio.",
    "io.",
    "pids.",
    "hugetlb.",
    "rdma.",
    "misc.",
    "devices.",
    "freezer.",
    "net_cls.",
    "net_prio.",
    "perf_event.",
];
const RESERVED_NAMES: &[&str] = &["tasks", "notify_on_release", "release_agent"];

/// Checks a name that becomes a cgroup directory: letters, digits, `_ . -`, 1 to 64 characters,
/// not `.`/`..`, not starting with a dot, and not a control-file name.
pub fn check_group_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a name must not be empty".into());
    }
    if name.len() > MAX_TENANT_NAME {
        return Err(format!(
            "`{name}` is {} characters long; at most {MAX_TENANT_NAME} are allowed",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "`{name}` contains {c:?}; use only letters, digits, `_`, `.` and `-` (it becomes a directory name)"
        ));
    }
    if name.starts_with('.') {
        return Err(format!("`{name}` must not start with `.`"));
    }
    if RESERVED_NAMES.contains(&name) || RESERVED_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return Err(format!(
            "`{name}` would collide with a cgroup control file; choose another name"
        ));
    }
    Ok(())
}

/// A component of an existing cgroup path (`agent.parent`): systemd names such as
/// `user@1000.service` or `dev-disk-by\x2duuid.mount` are fine; `.`, `..`, control characters
/// and over-long names are not.
fn check_parent_component(c: &str) -> Option<String> {
    if c == "." || c == ".." {
        return Some(format!("the path component `{c}` is not allowed"));
    }
    if c.len() > 255 {
        return Some(format!("the path component `{c}` is longer than 255 bytes"));
    }
    c.chars()
        .find(|ch| ch.is_control() || ch.is_whitespace())
        .map(|ch| format!("the path component {c:?} contains {ch:?}"))
}

struct Ctx<'a> {
    map: &'a SourceMap,
    accounts: &'a dyn Accounts,
    problems: Vec<Problem>,
    warnings: Vec<Problem>,
}

impl Ctx<'_> {
    fn origin<T>(&self, loc: &Loc<T>) -> Origin {
        self.map.origin(loc.file, &loc.span)
    }
    fn error<T>(&mut self, loc: &Loc<T>, msg: impl Into<String>) {
        let o = self.origin(loc);
        self.problems.push(Problem::at(&o, msg));
    }
}

pub(super) fn from_sources(
    sources: &[(PathBuf, String)],
    accounts: &dyn Accounts,
) -> Result<Loaded, PolicyErrors> {
    from_sources_with(sources, &Overlay::default(), accounts)
}

pub(super) fn from_sources_with(
    sources: &[(PathBuf, String)],
    overlay: &Overlay,
    accounts: &dyn Accounts,
) -> Result<Loaded, PolicyErrors> {
    let mut map = SourceMap::default();
    let mut problems = Vec::new();
    let mut files = Vec::new();
    let mut fragments = Vec::new();
    // Every file is read as far as it can be, so one run lists the syntax errors of each file,
    // every unknown key, and (when every file could be read) every validation problem.
    let mut unreadable = false;
    for (i, (path, text)) in sources.iter().chain(&overlay.fragments).enumerate() {
        let idx = if i < sources.len() {
            map.add(path, text)
        } else {
            map.add_unlocated(path, text)
        };
        let toml_problem = |e: toml::de::Error| {
            let msg = e.message().trim().to_string();
            match e.span() {
                Some(span) => Problem::at(&map.origin(idx, &span), msg),
                None => Problem::general(format!("{}: {msg}", path.display())),
            }
        };
        // A file the key walk cannot read (a syntax error, a TOML date where a string belongs)
        // gets its error from the typed read below, which words it best.
        if let Ok(doc) = with_current_file(idx, || toml::from_str::<super::keys::Node>(text)) {
            for (key, msg) in super::keys::unknown_keys(&doc) {
                problems.push(Problem::at(&map.origin(idx, &key.span), msg));
            }
        }
        match with_current_file(idx, || toml::from_str::<RawFile>(text)) {
            Ok(f) if i < sources.len() => files.push(f),
            Ok(f) => fragments.push(f),
            Err(e) => {
                problems.push(toml_problem(e));
                unreadable = true;
            }
        }
    }
    if unreadable {
        return Err(PolicyErrors(problems));
    }

    let mut ctx = Ctx {
        map: &map,
        accounts,
        problems,
        warnings: Vec::new(),
    };
    let (agent, mut tenants) = merge(&mut ctx, files);
    for (name, i) in &overlay.windows {
        let window = tenants
            .iter_mut()
            .find(|t| &t.value.name.value == name)
            .and_then(|t| {
                let w = t.value.schedule.as_ref()?.get(*i)?.value.clone();
                Some((t, w))
            });
        match window {
            Some((t, w)) => t.value.merge_limits(w.io, w.cpu, w.memory),
            None => ctx.problems.push(Problem::general(format!(
                "tenant `{name}` has no schedule window {i}"
            ))),
        }
    }
    for f in fragments {
        if let Some(a) = f.agent {
            let o = [&a.root, &a.parent, &a.metrics]
                .into_iter()
                .flatten()
                .next()
                .map(|l| ctx.origin(l));
            ctx.problems.push(Problem {
                origin: o,
                message: "an override may change tenant limits only, not [agent]".into(),
            });
        }
        for t in f.tenants {
            let t = t.value;
            let name = &t.name.value;
            let Some(existing) = tenants.iter_mut().find(|e| &e.value.name.value == name) else {
                ctx.error(&t.name, format!("no tenant named `{name}` in the policy"));
                continue;
            };
            if t.rules.is_some()
                || t.exempt.is_some()
                || t.storage.is_some()
                || t.storage_level.is_some()
                || t.schedule.is_some()
            {
                ctx.error(
                    &t.name,
                    format!("an override of tenant `{name}` may change only its io, cpu and memory limits"),
                );
                continue;
            }
            existing.value.merge_limits(t.io, t.cpu, t.memory);
        }
    }
    let agent = validate_agent(&mut ctx, agent);
    let same_instance = check_same_instance(&mut ctx, &tenants);
    let mut out = Vec::new();
    for t in tenants {
        if let Some(t) = validate_tenant(&mut ctx, t) {
            out.push(t);
        }
    }
    check_overlaps(&mut ctx, &out, &same_instance);
    check_donors(&mut ctx, &out);
    if ctx.problems.is_empty() {
        Ok(Loaded {
            policy: std::sync::Arc::new(Policy {
                agent,
                matcher: std::sync::Arc::new(super::ruleset::RuleSet::new(&out)),
                tenants: out,
                files: map.paths().map(Path::to_path_buf).collect(),
            }),
            warnings: ctx.warnings,
        })
    } else {
        Err(PolicyErrors(ctx.problems))
    }
}

/// Drop-ins merge into the main file in order. Within one file a tenant name may appear once;
/// a later file that names an existing tenant changes only the keys it sets.
fn merge(ctx: &mut Ctx, files: Vec<RawFile>) -> (super::raw::RawAgent, Vec<Loc<RawTenant>>) {
    let mut agent = super::raw::RawAgent::default();
    let mut tenants: Vec<Loc<RawTenant>> = Vec::new();
    for file in files {
        if let Some(a) = file.agent {
            agent.merge(a);
        }
        let mut seen_here: HashMap<String, Origin> = HashMap::new();
        for t in file.tenants {
            let name = t.value.name.value.clone();
            let here = ctx.origin(&t.value.name);
            if let Some(first) = seen_here.get(&name) {
                let msg =
                    format!("tenant `{name}` is defined twice in this file (first at {first})");
                ctx.problems.push(Problem::at(&here, msg));
                continue;
            }
            seen_here.insert(name.clone(), here);
            match tenants.iter_mut().find(|e| e.value.name.value == name) {
                Some(existing) => existing.value.merge(t.value),
                None => tenants.push(t),
            }
        }
    }
    (agent, tenants)
}

fn validate_agent(ctx: &mut Ctx, raw: super::raw::RawAgent) -> Agent {
    let root_name = match raw.root {
        Some(r) => {
            if let Err(e) = check_group_name(&r.value) {
                ctx.error(&r, format!("agent.root: {e}"));
            }
            r.value
        }
        None => DEFAULT_ROOT.to_string(),
    };
    let parent = match raw.parent {
        None => ParentSpec::HierarchyRoot,
        Some(p) => match p.value.as_str() {
            "root" => ParentSpec::HierarchyRoot,
            "self" => ParentSpec::OwnCgroup,
            path if path.starts_with('/') => {
                let bad = path
                    .split('/')
                    .filter(|c| !c.is_empty())
                    .find_map(check_parent_component);
                match bad {
                    Some(e) => {
                        ctx.error(&p, format!("agent.parent: {e}"));
                        ParentSpec::HierarchyRoot
                    }
                    None => ParentSpec::Path(path.trim_end_matches('/').to_string()),
                }
            }
            other => {
                ctx.error(&p, format!(
                    "agent.parent: `{other}` is not valid; use \"root\" (the hierarchy root), \"self\" (dbcage's own cgroup) or an absolute cgroup path such as \"/system.slice/dbcage.service\""
                ));
                ParentSpec::HierarchyRoot
            }
        },
    };
    let metrics = match raw.metrics {
        None => DEFAULT_METRICS.parse().ok(),
        Some(m) if m.value == "off" => None,
        Some(m) => match m.value.parse::<std::net::SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                ctx.error(&m, format!(
                    "agent.metrics: `{}` is not an address; use IP:PORT such as \"127.0.0.1:9477\", or \"off\"",
                    m.value
                ));
                None
            }
        },
    };
    let manager = match raw.manager {
        None => ManagerChoice::Auto,
        Some(m) => m.value.parse().unwrap_or_else(|e| {
            ctx.error(&m, format!("agent.manager: {e}"));
            ManagerChoice::Auto
        }),
    };
    let accounts = ctx.accounts;
    let control_group = raw.control_group.and_then(|g| {
        let (name, gid) = match &g.value {
            Name::Id(id) if (0..=u32::MAX as i64).contains(id) => {
                (id.to_string(), Some(*id as u32))
            }
            Name::Id(id) => (id.to_string(), None),
            Name::Text(s) => (s.clone(), s.parse::<u32>().ok().or_else(|| accounts.gid(s))),
        };
        match gid {
            Some(gid) => Some(ControlGroup { name, gid }),
            None => {
                ctx.error(
                    &g,
                    format!("agent.control_group: no group named `{name}` on this host"),
                );
                None
            }
        }
    });
    Agent {
        root_name,
        parent,
        metrics,
        control_group,
        manager,
        io_latency: raw.io_latency.is_none_or(|b| b.value),
        favordynmods: raw.favordynmods.is_some_and(|f| f.value),
    }
}

fn validate_tenant(ctx: &mut Ctx, raw: Loc<RawTenant>) -> Option<Tenant> {
    let before = ctx.problems.len();
    let mut t = raw.value;
    for problem in super::preset::expand(&mut t) {
        ctx.error(&problem, problem.value.clone());
    }
    let name = t.name.value.clone();
    if let Err(e) = check_group_name(&name) {
        ctx.error(&t.name, format!("tenant name: {e}"));
    }
    let origin = ctx.origin(&t.name);
    let rules = validate_rules(ctx, &name, "match", t.rules.as_deref().unwrap_or(&[]));
    let exempt = validate_rules(ctx, &name, "exempt", t.exempt.as_deref().unwrap_or(&[]));
    if rules.is_empty() && exempt.is_empty() {
        ctx.warnings.push(Problem::at(
            &origin,
            format!("tenant `{name}` has no match rules: no process will be placed in it"),
        ));
    }

    let mut storage = Vec::new();
    for s in t.storage.iter().flatten() {
        let asm = s.value.strip_prefix("asm:").map(super::asm::AsmSpec::parse);
        if let Some(Err(e)) = asm {
            ctx.error(s, format!("tenant `{name}`: storage `{}`: {e}", s.value));
        } else if asm.is_none() && !s.value.starts_with('/') {
            ctx.error(
                s,
                format!(
                    "tenant `{name}`: storage path `{}` must be absolute",
                    s.value
                ),
            );
        } else {
            storage.push(Sourced {
                value: s.value.clone(),
                origin: ctx.origin(s),
            });
        }
    }
    let storage_level = match &t.storage_level {
        None => StorageLevel::Device,
        Some(l) => match l.value.as_str() {
            "device" => StorageLevel::Device,
            "members" => StorageLevel::Members,
            other => {
                ctx.error(l, format!("tenant `{name}`: storage_level `{other}` is not valid; use \"device\" or \"members\""));
                StorageLevel::Device
            }
        },
    };

    let io_split = match &t.io {
        None => IoSplit::default(),
        Some(io) => validate_split(ctx, &name, io),
    };
    let (io_weight, io_latency_target) = match &t.io {
        None => (None, None),
        Some(io) => validate_protection(ctx, &name, io),
    };
    let io_guard = t.io.as_ref().and_then(|io| {
        let keys = GuardKeys {
            resource: Resource::Io,
            pressure: io.protect_pressure.as_ref(),
            window: io.protect_window.as_ref(),
            donors: &io.protect_donors,
            lever: io.protect_lever.as_ref(),
        };
        validate_guard(ctx, &name, keys)
    });
    let cpu_guard = t.cpu.as_ref().and_then(|c| {
        let keys = GuardKeys {
            resource: Resource::Cpu,
            pressure: c.protect_pressure.as_ref(),
            window: c.protect_window.as_ref(),
            donors: &c.protect_donors,
            lever: None,
        };
        validate_guard(ctx, &name, keys)
    });
    let (io, io_devices) = match &t.io {
        None => (IoLimits::default(), Vec::new()),
        Some(io) => {
            let total = validate_io(ctx, &name, "io", &io.values());
            let mut devices = Vec::new();
            for d in &io.devices {
                let dv = &d.value;
                if !dv.path.value.starts_with('/') {
                    ctx.error(
                        &dv.path,
                        format!(
                            "tenant `{name}`: io.device path `{}` must be absolute",
                            dv.path.value
                        ),
                    );
                }
                let limits = validate_io(ctx, &name, "io.device", &dv.values());
                devices.push(DeviceOverride {
                    path: Sourced {
                        value: dv.path.value.clone(),
                        origin: ctx.origin(&dv.path),
                    },
                    limits,
                });
            }
            (total, devices)
        }
    };
    if (!io.is_empty() || !io_devices.is_empty()) && storage.is_empty() {
        ctx.problems.push(Problem::at(&origin, format!(
            "tenant `{name}` sets IO limits but has no `storage`: list the paths of its data (mount points, directories, block devices or globs)"
        )));
    }

    let cpu = match &t.cpu {
        None => CpuPolicy::default(),
        Some(c) => validate_cpu(ctx, &name, c),
    };
    let memory = match &t.memory {
        None => MemoryPolicy::default(),
        Some(m) => validate_memory(ctx, &name, m),
    };

    let replication = t.replication.as_ref().and_then(|r| {
        super::replication::validate(&name, r)
            .map_err(|problems| {
                for p in problems {
                    ctx.error(&p, p.value.clone());
                }
            })
            .ok()
    });
    if let Some(r) = &t.replication {
        if conninfo_has_password(&r.conninfo.value) {
            let o = ctx.origin(&r.conninfo);
            if let Some(mode) = readable_by_others(&o.file) {
                ctx.warnings.push(Problem::at(&o, format!(
                    "tenant `{name}`: replication.conninfo holds a password, and {} (mode {mode:04o}) can be read by other users; `chmod go-r {}`, or move the password to root's ~/.pgpass (or a file named by passfile=) and drop it from conninfo",
                    o.file.display(),
                    o.file.display()
                )));
            }
        }
    }
    let schedules = validate_schedules(ctx, &name, &t, !storage.is_empty());

    if ctx.problems.len() > before {
        return None;
    }
    Some(Tenant {
        schedules,
        name,
        origin,
        rules,
        exempt,
        storage,
        storage_level,
        io,
        io_devices,
        io_split,
        io_weight,
        io_latency_target,
        io_guard,
        cpu_guard,
        cpu,
        memory,
        replication,
    })
}

/// Whether a libpq connection string carries a password: `password=...` in the key/value form,
/// or `user:secret@` in a `postgres://` / `postgresql://` URI.
pub(crate) fn conninfo_has_password(conninfo: &str) -> bool {
    let c = conninfo.trim();
    if let Some(rest) = c
        .strip_prefix("postgresql://")
        .or_else(|| c.strip_prefix("postgres://"))
    {
        let authority = rest.split(['/', '?']).next().unwrap_or("");
        let userinfo = authority.rsplit_once('@').map(|(u, _)| u).unwrap_or("");
        return userinfo.contains(':') || rest.contains("password=");
    }
    c.split_whitespace().any(|kv| {
        kv.split_once('=')
            .is_some_and(|(k, _)| k.trim() == "password")
    }) || c.contains("password =")
}

/// The mode of a policy file when group or others may read it (`None` if not, or not on disk).
fn readable_by_others(path: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let mode = std::fs::metadata(path).ok()?.mode() & 0o7777;
    (mode & 0o044 != 0).then_some(mode)
}

/// `[[tenant.schedule]]`: the window and its limits, each limit checked as it would be in
/// `[tenant.io]`, `[tenant.cpu]` or `[tenant.memory]`. Windows of one tenant that overlap and set
/// the same key get a warning: the later one wins.
fn validate_schedules(
    ctx: &mut Ctx,
    tenant: &str,
    t: &RawTenant,
    has_storage: bool,
) -> Vec<Schedule> {
    use super::schedule::{label, parse_days, parse_time};
    let mut out: Vec<Schedule> = Vec::new();
    for (i, w) in t.schedule.iter().flatten().enumerate() {
        let before = ctx.problems.len();
        let s = &w.value;
        let what = format!("tenant `{tenant}`: schedule[{i}]");
        let days = match &s.days {
            None => [true; 7],
            Some(d) => parse_days(&d.value).unwrap_or_else(|e| {
                ctx.error(d, format!("{what}.days: {e}"));
                [true; 7]
            }),
        };
        let from = parse_time(&s.from.value, false).unwrap_or_else(|e| {
            ctx.error(&s.from, format!("{what}.from: {e}"));
            0
        });
        let to = parse_time(&s.to.value, true).unwrap_or_else(|e| {
            ctx.error(&s.to, format!("{what}.to: {e}"));
            0
        });
        let mut keys = Vec::new();
        if let Some(io) = &s.io {
            let v = io.values();
            validate_io(ctx, tenant, &format!("schedule[{i}].io"), &v);
            for (k, set) in [
                ("read_bps", v.read_bps.is_some()),
                ("write_bps", v.write_bps.is_some()),
                ("read_iops", v.read_iops.is_some()),
                ("write_iops", v.write_iops.is_some()),
            ] {
                if set {
                    keys.push(format!("io.{k}"));
                }
            }
            if !io.devices.is_empty()
                || io.split.is_some()
                || io.rebalance_interval.is_some()
                || io.floor.is_some()
                || io.smoothing.is_some()
                || io.weight.is_some()
                || io.latency_target.is_some()
            {
                ctx.error(w, format!("{what}: a window may set io.read_bps, io.write_bps, io.read_iops and io.write_iops; io.device, io.split and its tuning, io.weight and io.latency_target belong in [tenant.io]"));
            }
            if !keys.is_empty() && !has_storage {
                ctx.error(
                    w,
                    format!("{what} sets IO limits but tenant `{tenant}` has no `storage`"),
                );
            }
        }
        if let Some(c) = &s.cpu {
            validate_cpu(ctx, tenant, c);
            if let Some(a) = &c.numa {
                ctx.error(
                    a,
                    format!(
                        "{what}: cpu.numa belongs in [tenant.cpu]; a window may set cpu.numa_nodes"
                    ),
                );
            }
            if let Some(l) = c
                .protect_pressure
                .as_ref()
                .or(c.protect_window.as_ref())
                .or(c.protect_donors.first())
            {
                ctx.error(
                    l,
                    format!("{what}: cpu.protect_pressure, protect_window and protect_donors belong in [tenant.cpu]"),
                );
            }
            for (k, set) in [
                ("cpus", c.cpus.is_some()),
                ("numa_nodes", c.numa_nodes.is_some()),
                ("migrate_memory", c.migrate_memory.is_some()),
                ("cores", c.cores.is_some()),
                ("weight", c.weight.is_some()),
            ] {
                if set {
                    keys.push(format!("cpu.{k}"));
                }
            }
        }
        if let Some(m) = &s.memory {
            validate_memory(ctx, tenant, m);
            if let Some(h) = &m.huge_pages {
                ctx.error(
                    h,
                    format!("{what}: memory.huge_pages belongs in [tenant.memory] (it places the tenant, it is no limit)"),
                );
            }
            for (k, set) in [
                ("max", m.max.is_some()),
                ("high", m.high.is_some()),
                ("low", m.low.is_some()),
                ("swap_max", m.swap_max.is_some()),
            ] {
                if set {
                    keys.push(format!("memory.{k}"));
                }
            }
        }
        if keys.is_empty() {
            ctx.warnings.push(Problem::at(
                &ctx.origin(w),
                format!("{what} sets no limits"),
            ));
        }
        if ctx.problems.len() > before {
            continue;
        }
        let sched = Schedule {
            days,
            from,
            to,
            keys,
            origin: ctx.origin(w),
            label: label(&days, from, to),
        };
        let minutes = sched.week_minutes();
        for earlier in &out {
            let common: Vec<&String> = sched
                .keys
                .iter()
                .filter(|k| earlier.keys.contains(k))
                .collect();
            let overlap = earlier
                .week_minutes()
                .iter()
                .zip(&minutes)
                .any(|(a, b)| *a && *b);
            if overlap && !common.is_empty() {
                ctx.warnings.push(Problem::at(&sched.origin, format!(
                    "{what} ({}) overlaps the window {} at {} and sets {} too; where both are open the later one ({}) wins",
                    sched.label,
                    earlier.label,
                    earlier.origin,
                    common.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", "),
                    sched.label
                )));
            }
        }
        out.push(sched);
    }
    out
}

/// The range of `io.latency_target`: blk-iolatency keeps whole microseconds; below 100 us no
/// disk completes an IO, above 10 s nothing is protected.
const LATENCY_TARGET_RANGE: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_micros(100),
    std::time::Duration::from_secs(10),
);

/// `[tenant.io] weight` and `latency_target`.
fn validate_protection(
    ctx: &mut Ctx,
    tenant: &str,
    io: &super::raw::RawIo,
) -> (Option<Sourced<u32>>, Option<Sourced<std::time::Duration>>) {
    let weight = io.weight.as_ref().and_then(|q| match &q.value {
        Quantity::Int(i) if (1..=10000).contains(i) => Some(Sourced {
            value: *i as u32,
            origin: ctx.origin(q),
        }),
        other => {
            let shown = match other {
                Quantity::Int(i) => i.to_string(),
                Quantity::Float(f) => f.to_string(),
                Quantity::Text(s) => format!("{s:?}"),
            };
            ctx.error(q, format!("tenant `{tenant}`: io.weight = {shown} is not valid; it must be a whole number from 1 to 10000 (default 100)"));
            None
        }
    });
    let latency = io.latency_target.as_ref().and_then(|l| {
        let (lo, hi) = LATENCY_TARGET_RANGE;
        match parse_duration(&l.value) {
            Some(d) if d >= lo && d <= hi => Some(Sourced {
                value: d,
                origin: ctx.origin(l),
            }),
            Some(_) => {
                ctx.error(l, format!("tenant `{tenant}`: io.latency_target `{}` is out of range (100us to 10s)", l.value));
                None
            }
            None => {
                ctx.error(l, format!("tenant `{tenant}`: io.latency_target `{}` is not a duration; write e.g. \"5ms\" or \"500us\"", l.value));
                None
            }
        }
    });
    (weight, latency)
}

/// The window of a PSI trigger: the kernel accepts 500ms to 10s.
const GUARD_WINDOW_RANGE: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(10),
);

/// A protection guard's keys in `[tenant.io]` or `[tenant.cpu]` (`protect_lever` is io's alone).
struct GuardKeys<'a> {
    resource: Resource,
    pressure: Option<&'a Loc<String>>,
    window: Option<&'a Loc<String>>,
    donors: &'a [Loc<String>],
    lever: Option<&'a Loc<String>>,
}

/// `[tenant.io]` (or `[tenant.cpu]`) `protect_pressure`, `protect_window`, `protect_donors`,
/// `protect_lever` (donor names are checked against the tenants in `check_donors`).
fn validate_guard(ctx: &mut Ctx, tenant: &str, k: GuardKeys) -> Option<PressureGuard> {
    let r = k.resource.name();
    let Some(p) = k.pressure else {
        if let Some(w) = k.window {
            ctx.error(w, format!("tenant `{tenant}`: {r}.protect_window needs {r}.protect_pressure (the pressure that starts the guard), e.g. protect_pressure = \"20%\""));
        }
        if let Some(d) = k.donors.first() {
            ctx.error(d, format!("tenant `{tenant}`: {r}.protect_donors needs {r}.protect_pressure (the pressure that starts the guard), e.g. protect_pressure = \"20%\""));
        }
        if let Some(l) = k.lever {
            ctx.error(l, format!("tenant `{tenant}`: {r}.protect_lever needs {r}.protect_pressure (the pressure that starts the guard), e.g. protect_pressure = \"20%\""));
        }
        return None;
    };
    let pressure = match p
        .value
        .trim()
        .strip_suffix('%')
        .map(|v| v.trim().parse::<f64>())
    {
        Some(Ok(v)) if v > 0.0 && v <= 100.0 => v / 100.0,
        _ => {
            ctx.error(p, format!("tenant `{tenant}`: {r}.protect_pressure `{}` is not a share of time; write a percentage above 0% up to 100%, such as \"20%\"", p.value));
            return None;
        }
    };
    let window = match k.window {
        None => std::time::Duration::from_secs(1),
        Some(w) => {
            let (lo, hi) = GUARD_WINDOW_RANGE;
            match parse_duration(&w.value) {
                Some(d) if d >= lo && d <= hi => d,
                _ => {
                    ctx.error(w, format!("tenant `{tenant}`: {r}.protect_window `{}` must be a duration from 500ms to 10s (the kernel's range for a pressure trigger), such as \"1s\"", w.value));
                    return None;
                }
            }
        }
    };
    if k.donors.is_empty() {
        ctx.error(p, format!("tenant `{tenant}`: {r}.protect_pressure needs {r}.protect_donors, the tenants whose {r}.weight the guard lowers, e.g. protect_donors = [\"batch\"]"));
        return None;
    }
    let lever = match k.lever.map(|l| l.value.as_str()) {
        None | Some("weight") => GuardLever::Weight,
        Some("caps") => GuardLever::Caps,
        Some(other) => {
            let l = k.lever.expect("matched Some");
            ctx.error(l, format!("tenant `{tenant}`: io.protect_lever `{other}` is not valid; use \"weight\" (the default: the donors' io.weight, which acts under iocost) or \"caps\" (the donors' own IO caps, halved: io.max acts on every disk)"));
            return None;
        }
    };
    Some(PressureGuard {
        resource: k.resource,
        pressure,
        window,
        donors: k
            .donors
            .iter()
            .map(|d| Sourced {
                value: d.value.clone(),
                origin: ctx.origin(d),
            })
            .collect(),
        lever,
        origin: ctx.origin(p),
    })
}

/// Each donor of a protection guard is another tenant of the policy; with `protect_lever =
/// "caps"` it has IO caps of its own to lower.
fn check_donors(ctx: &mut Ctx, tenants: &[Tenant]) {
    for t in tenants {
        for g in t.io_guard.iter().chain(&t.cpu_guard) {
            check_guard_donors(ctx, tenants, t, g);
        }
    }
}

fn check_guard_donors(ctx: &mut Ctx, tenants: &[Tenant], t: &Tenant, g: &PressureGuard) {
    let r = g.resource.name();
    for d in &g.donors {
        let donor = tenants.iter().find(|o| o.name == d.value);
        let msg = if d.value == t.name {
            format!("tenant `{}`: {r}.protect_donors names the tenant itself; name the tenants that give way to it", t.name)
        } else if donor.is_none() {
            format!(
                "tenant `{}`: {r}.protect_donors names `{}`, which is not a tenant of this policy",
                t.name, d.value
            )
        } else if g.lever == GuardLever::Caps && donor.is_some_and(|o| o.io.is_empty()) {
            format!("tenant `{}`: io.protect_lever = \"caps\" lowers the donors' own IO caps, and `{}` has none; give it the caps it may use when nobody is under pressure (e.g. [tenant.io] read_bps = \"400MiB\" in `{}`), or use protect_lever = \"weight\"", t.name, d.value, d.value)
        } else {
            continue;
        };
        ctx.problems.push(Problem::at(&d.origin, msg));
    }
}

/// `"1s"`, `"500ms"`, `"250us"`, `"2.5s"`, `"1m"` → a duration.
pub(crate) fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().ok()?;
    let secs = match unit.trim() {
        "us" => v / 1e6,
        "ms" => v / 1000.0,
        "s" => v,
        "m" | "min" => v * 60.0,
        _ => return None,
    };
    (secs.is_finite() && secs >= 0.0).then(|| std::time::Duration::from_secs_f64(secs))
}

fn validate_split(ctx: &mut Ctx, tenant: &str, io: &super::raw::RawIo) -> IoSplit {
    let mut out = IoSplit::default();
    if let Some(s) = &io.split {
        match s.value.as_str() {
            "equal" => out.split = Split::Equal,
            "demand" => out.split = Split::Demand,
            other => ctx.error(s, format!("tenant `{tenant}`: io.split `{other}` is not valid; use \"equal\" (the default) or \"demand\"")),
        }
    }
    if let Some(i) = &io.rebalance_interval {
        match parse_duration(&i.value) {
            Some(d) if d >= std::time::Duration::from_millis(100) && d <= std::time::Duration::from_secs(3600) => out.interval = d,
            Some(_) => ctx.error(i, format!("tenant `{tenant}`: io.rebalance_interval `{}` is out of range (100ms to 1h)", i.value)),
            None => ctx.error(i, format!("tenant `{tenant}`: io.rebalance_interval `{}` is not a duration; write e.g. \"1s\" or \"500ms\"", i.value)),
        }
    }
    if let Some(f) = &io.floor {
        let v = f.value.trim();
        match v.strip_suffix('%').map(str::trim).and_then(|n| n.parse::<f64>().ok()) {
            Some(p) if (0.0..=100.0).contains(&p) => {
                out.floor = p / 100.0;
                out.floor_origin = Some(ctx.origin(f));
            }
            Some(p) => ctx.error(f, format!("tenant `{tenant}`: io.floor = {p}% is out of range (0% to 100%/number of devices)")),
            None => ctx.error(f, format!("tenant `{tenant}`: io.floor `{}` is not a percentage; write e.g. \"5%\"", f.value)),
        }
    }
    if let Some(q) = &io.smoothing {
        let v = match &q.value {
            Quantity::Int(i) => Some(*i as f64),
            Quantity::Float(f) => Some(*f),
            Quantity::Text(s) => s.trim().parse::<f64>().ok(),
        };
        match v {
            Some(v) if (0.0..1.0).contains(&v) => out.smoothing = v,
            _ => ctx.error(q, format!("tenant `{tenant}`: io.smoothing must be a number from 0 (follow usage at once) to below 1 (default {DEFAULT_SMOOTHING})")),
        }
    }
    let tuned = io.rebalance_interval.is_some() || io.floor.is_some() || io.smoothing.is_some();
    if tuned && out.split != Split::Demand {
        let o = io
            .floor
            .as_ref()
            .map(|f| ctx.origin(f))
            .or_else(|| io.rebalance_interval.as_ref().map(|f| ctx.origin(f)));
        if let Some(o) = o {
            ctx.warnings.push(Problem::at(&o, format!("tenant `{tenant}`: io.rebalance_interval, io.floor and io.smoothing apply only with io.split = \"demand\"")));
        }
    }
    out
}

fn validate_rules(ctx: &mut Ctx, tenant: &str, list: &str, raw: &[Loc<RawRule>]) -> Vec<Rule> {
    let accounts = ctx.accounts;
    let mut out = Vec::new();
    for (i, r) in raw.iter().enumerate() {
        let rv = &r.value;
        let mut parts = Vec::new();
        let mut regex = |ctx: &mut Ctx, key: &str, v: &Option<Loc<String>>| -> Option<Pattern> {
            let v = v.as_ref()?;
            parts.push(format!("{key}=~{}", v.value));
            match Pattern::new(&v.value) {
                Ok(re) => Some(re),
                Err(e) => {
                    let first = e
                        .to_string()
                        .lines()
                        .last()
                        .unwrap_or("")
                        .trim()
                        .trim_start_matches("error: ")
                        .to_string();
                    ctx.error(
                        v,
                        format!(
                            "tenant `{tenant}`: {list}[{i}].{key}: invalid regex `{}`: {first}",
                            v.value
                        ),
                    );
                    None
                }
            }
        };
        let cmdline = regex(ctx, "cmdline", &rv.cmdline);
        let comm = regex(ctx, "comm", &rv.comm);
        let exe = rv.exe.as_ref().map(|e| {
            parts.push(format!("exe={}", e.value));
            if !e.value.starts_with('/') {
                ctx.error(
                    e,
                    format!(
                        "tenant `{tenant}`: {list}[{i}].exe `{}` must be an absolute path",
                        e.value
                    ),
                );
            }
            PathBuf::from(&e.value)
        });
        let uid = rv.user.as_ref().and_then(|u| {
            parts.push(format!("user={}", name_text(&u.value)));
            resolve_name(ctx, u, tenant, list, i, "user", |n| accounts.uid(n))
        });
        let gid = rv.group.as_ref().and_then(|g| {
            parts.push(format!("group={}", name_text(&g.value)));
            resolve_name(ctx, g, tenant, list, i, "group", |n| accounts.gid(n))
        });
        let pidfile = rv.pidfile.as_ref().map(|f| {
            parts.push(format!("pidfile={}", f.value));
            if !f.value.starts_with('/') || f.value.split('/').any(|c| c == "..") {
                ctx.error(
                    f,
                    format!(
                        "tenant `{tenant}`: {list}[{i}].pidfile `{}` must be an absolute path without `..`",
                        f.value
                    ),
                );
            }
            PidFile::new(PathBuf::from(&f.value))
        });
        let unit = rv.unit.as_ref().and_then(|u| {
            parts.push(format!("unit={}", u.value));
            crate::unitname::UnitPattern::parse(&u.value)
                .map_err(|why| {
                    ctx.error(
                        u,
                        format!("tenant `{tenant}`: {list}[{i}].unit `{}` {why}", u.value),
                    )
                })
                .ok()
        });
        let descendants = rv.descendants.unwrap_or(false);
        if parts.is_empty() {
            ctx.error(r, format!(
                "tenant `{tenant}`: {list}[{i}] matches nothing: give at least one of cmdline, comm, exe, user, group, pidfile, unit"
            ));
            continue;
        }
        if descendants {
            parts.push("+descendants".into());
        }
        let within_tenant = rv.within_tenant.unwrap_or(false);
        if within_tenant {
            if list != "exempt" {
                ctx.error(r, format!(
                    "tenant `{tenant}`: {list}[{i}].within_tenant is only for exempt rules (it picks the leaf of processes the tenant already holds)"
                ));
            }
            parts.push("+within_tenant".into());
        }
        out.push(Rule {
            cmdline,
            comm,
            exe,
            uid,
            gid,
            pidfile,
            unit,
            descendants,
            within_tenant,
            label: match rv.preset_name {
                Some(name) => format!("{list}[{i}] {name}: {}", parts.join(" ")),
                None => format!("{list}[{i}] {}", parts.join(" ")),
            },
            origin: ctx.origin(r),
        });
    }
    out
}

fn name_text(n: &Name) -> String {
    match n {
        Name::Id(i) => i.to_string(),
        Name::Text(s) => s.clone(),
    }
}

fn resolve_name(
    ctx: &mut Ctx,
    loc: &Loc<Name>,
    tenant: &str,
    list: &str,
    i: usize,
    key: &str,
    lookup: impl Fn(&str) -> Option<u32>,
) -> Option<u32> {
    match &loc.value {
        Name::Id(id) if (0..=u32::MAX as i64).contains(id) => Some(*id as u32),
        Name::Id(id) => {
            ctx.error(
                loc,
                format!("tenant `{tenant}`: {list}[{i}].{key}: {id} is not a valid id"),
            );
            None
        }
        Name::Text(s) => {
            match s.parse::<u32>().ok().or_else(|| lookup(s)) {
                Some(id) => Some(id),
                None => {
                    ctx.error(loc, format!("tenant `{tenant}`: {list}[{i}].{key}: no {key} named `{s}` on this host"));
                    None
                }
            }
        }
    }
}

fn quantity(ctx: &mut Ctx, tenant: &str, key: &str, q: &Loc<Quantity>, bytes: bool) -> Option<u64> {
    let parsed = match &q.value {
        Quantity::Int(i) if *i >= 0 => Ok(*i as u64),
        Quantity::Int(i) => Err(format!("{i} is negative")),
        Quantity::Float(f) => Err(format!(
            "{f} is not a whole number; write it as a string with a unit, e.g. \"1.5GiB\""
        )),
        Quantity::Text(s) => if bytes {
            parse_bytes(s)
        } else {
            parse_count(s)
        }
        .map_err(|e| e.to_string()),
    };
    let rate = key.ends_with("_bps") || key.ends_with("_iops");
    let parsed = parsed.and_then(|v| match &q.value {
        Quantity::Text(s) if !rate && s.trim().ends_with("/s") => Err(format!(
            "`{s}` is a rate; a memory size has no `/s` (accepted: {BYTE_FORMS})"
        )),
        // The kernel rounds memory limits down to pages: under one page it would write 0.
        _ if !rate && v > 0 && v < 4096 => Err(format!(
            "{v} bytes is less than one page (4096 bytes), which the kernel would round down to 0; a bare number is bytes (accepted: {BYTE_FORMS})"
        )),
        _ => Ok(v),
    });
    match parsed {
        Ok(0) => {
            ctx.error(q, format!("tenant `{tenant}`: {key} = 0 would stop all IO or memory use; remove the key for no limit"));
            None
        }
        Ok(v) => {
            if let Some(w) = implausible(key, v, &q.value) {
                ctx.warnings.push(Problem::at(
                    &ctx.origin(q),
                    format!("tenant `{tenant}`: {w}"),
                ));
            }
            Some(v)
        }
        Err(e) => {
            ctx.error(q, format!("tenant `{tenant}`: {key}: {e}"));
            None
        }
    }
}

/// How byte quantities may be written, for errors and warnings.
const BYTE_FORMS: &str = "a whole number of bytes such as 4096, or a string with a unit: \"50MiB\", \"1.5GB\", \"8GiB\"; KiB/MiB/GiB/TiB (and K/M/G/T) are powers of 1024, kB/MB/GB/TB powers of 1000";
const RATE_FORMS: &str = "bytes per second as a whole number (4096) or a string with a unit: \"50MiB\" (or \"50MiB/s\"), \"1.5GB\"; KiB/MiB/GiB are powers of 1024, kB/MB/GB powers of 1000";

/// Below these a limit almost certainly lost its unit: 80 B/s or 5 IO/s stop a database, 512
/// bytes of memory cannot hold one process. They are allowed (a test rig may want them), with a
/// warning that says what the number means.
const LEAST_PLAUSIBLE_BPS: u64 = 1 << 20;
const LEAST_PLAUSIBLE_IOPS: u64 = 10;
const LEAST_PLAUSIBLE_MEMORY: u64 = 16 << 20;

/// A warning for a value that parses but is implausibly small, saying what it means and how to
/// write what was probably meant.
fn implausible(key: &str, v: u64, raw: &Quantity) -> Option<String> {
    let bare = matches!(raw, Quantity::Int(_));
    let shown = match raw {
        Quantity::Int(i) => i.to_string(),
        Quantity::Float(f) => f.to_string(),
        Quantity::Text(s) => format!("{s:?}"),
    };
    if key.ends_with("_bps") && v < LEAST_PLAUSIBLE_BPS {
        let guess = if bare {
            format!("; a bare number is bytes per second: did you mean \"{v}MiB\"?")
        } else {
            String::new()
        };
        Some(format!(
            "{key} = {shown} is {v} bytes/s ({}/s), which all but stops the instance's IO{guess} (accepted: {RATE_FORMS})",
            crate::units::HumanBytes(v)
        ))
    } else if key.ends_with("_iops") && v < LEAST_PLAUSIBLE_IOPS {
        Some(format!(
            "{key} = {shown} allows {v} IO/s, which all but stops the instance's IO (accepted: a whole number of IO per second, 2000 or \"2k\")"
        ))
    } else if !key.ends_with("_bps") && !key.ends_with("_iops") && v < LEAST_PLAUSIBLE_MEMORY {
        let guess = if bare {
            format!("; a bare number is bytes: did you mean \"{v}MiB\" or \"{v}GiB\"?")
        } else {
            String::new()
        };
        Some(format!(
            "{key} = {shown} is {}, too little for a database instance{guess} (accepted: {BYTE_FORMS})",
            crate::units::HumanBytes(v)
        ))
    } else {
        None
    }
}

fn validate_io(ctx: &mut Ctx, tenant: &str, prefix: &str, raw: &RawIoValues) -> IoLimits {
    let mut get = |key: &str, v: &Option<Loc<Quantity>>, bytes: bool| {
        v.as_ref()
            .and_then(|q| quantity(ctx, tenant, &format!("{prefix}.{key}"), q, bytes))
    };
    IoLimits {
        read_bps: get("read_bps", &raw.read_bps, true),
        write_bps: get("write_bps", &raw.write_bps, true),
        read_iops: get("read_iops", &raw.read_iops, false),
        write_iops: get("write_iops", &raw.write_iops, false),
    }
}

fn validate_cpu(ctx: &mut Ctx, tenant: &str, c: &super::raw::RawCpu) -> CpuPolicy {
    let cpus = c
        .cpus
        .as_ref()
        .and_then(|s| match s.value.parse::<CpuSet>() {
            Ok(set) if set.is_empty() => {
                ctx.error(
                    s,
                    format!(
                        "tenant `{tenant}`: cpu.cpus is empty; remove the key to allow every cpu"
                    ),
                );
                None
            }
            Ok(set) => Some(Sourced {
                value: set,
                origin: ctx.origin(s),
            }),
            Err(e) => {
                ctx.error(s, format!("tenant `{tenant}`: cpu.cpus: {e}"));
                None
            }
        });
    let numa_nodes = c.numa_nodes.as_ref().and_then(|n| {
        if n.value.is_empty() {
            ctx.error(n, format!("tenant `{tenant}`: cpu.numa_nodes is empty"));
            return None;
        }
        if let Some(bad) = n.value.iter().find(|v| !(0..=1024).contains(*v)) {
            ctx.error(
                n,
                format!("tenant `{tenant}`: cpu.numa_nodes: {bad} is not a node number"),
            );
            return None;
        }
        Some(Sourced {
            value: CpuSet::from_iter(n.value.iter().map(|v| *v as u32)),
            origin: ctx.origin(n),
        })
    });
    let cores = c.cores.as_ref().and_then(|q| {
        let v = match &q.value {
            Quantity::Int(i) => *i as f64,
            Quantity::Float(f) => *f,
            Quantity::Text(s) => match s.trim().parse::<f64>() {
                Ok(v) => v,
                Err(_) => {
                    ctx.error(
                        q,
                        format!("tenant `{tenant}`: cpu.cores `{s}` is not a number (e.g. 2.5)"),
                    );
                    return None;
                }
            },
        };
        // The kernel refuses quotas under 1 ms; with the 100 ms period that is 0.01 cores.
        if !(0.01..=4096.0).contains(&v) {
            ctx.error(
                q,
                format!("tenant `{tenant}`: cpu.cores = {v} is out of range (0.01 to 4096)"),
            );
            return None;
        }
        Some(v)
    });
    let weight = c.weight.as_ref().and_then(|q| match &q.value {
        Quantity::Int(i) if (1..=10000).contains(i) => Some(*i as u32),
        other => {
            let shown = match other {
                Quantity::Int(i) => i.to_string(),
                Quantity::Float(f) => f.to_string(),
                Quantity::Text(s) => format!("{s:?}"),
            };
            ctx.error(q, format!("tenant `{tenant}`: cpu.weight = {shown} is not valid; it must be a whole number from 1 to 10000 (default 100)"));
            None
        }
    });
    if let (Some(quota), Some(set), Some(raw)) = (cores, &cpus, &c.cores) {
        if quota > set.value.len() as f64 {
            let o = ctx.origin(raw);
            ctx.warnings.push(Problem::at(&o, format!(
                "tenant `{tenant}`: cpu.cores = {quota} is more than the {} cpu{} of cpu.cpus ({}): the tenant can use at most {} cores' worth, so the quota never binds",
                set.value.len(),
                if set.value.len() == 1 { "" } else { "s" },
                set.value,
                set.value.len()
            )));
        }
    }
    let numa_auto = c.numa.as_ref().and_then(|a| {
        if a.value != "auto" {
            ctx.error(a, format!("tenant `{tenant}`: cpu.numa = {:?} is not valid; the only value is \"auto\" (dbcage chooses the nodes); to choose them yourself use cpu.numa_nodes = [N, ...]", a.value));
            return None;
        }
        if let Some(n) = &c.numa_nodes {
            ctx.error(n, format!("tenant `{tenant}`: cpu.numa = \"auto\" and cpu.numa_nodes are both set; keep one (auto lets dbcage choose the nodes, numa_nodes names them)"));
            return None;
        }
        Some(ctx.origin(a))
    });
    if cpus.is_some() && numa_nodes.is_some() {
        let o = ctx.origin(c.numa_nodes.as_ref().unwrap());
        ctx.warnings.push(Problem::at(&o, format!(
            "tenant `{tenant}`: both cpu.cpus and cpu.numa_nodes are set; the cpus are limited to those of the nodes"
        )));
    }
    CpuPolicy {
        cpus,
        numa_nodes,
        numa_auto,
        migrate_memory: c.migrate_memory.as_ref().is_some_and(|m| m.value),
        cores,
        weight,
    }
}

fn validate_memory(ctx: &mut Ctx, tenant: &str, m: &super::raw::RawMemory) -> MemoryPolicy {
    let mut get = |key: &str, v: &Option<Loc<Quantity>>| {
        v.as_ref().and_then(|q| {
            quantity(ctx, tenant, &format!("memory.{key}"), q, true).map(|b| (b, ctx.origin(q)))
        })
    };
    let max = get("max", &m.max);
    let high = get("high", &m.high);
    let low = get("low", &m.low);
    let swap_max = get("swap_max", &m.swap_max);
    let huge_pages = get("huge_pages", &m.huge_pages);
    if let (Some((max, _)), Some((high, o))) = (&max, &high) {
        if high > max {
            ctx.warnings.push(Problem::at(
                o,
                format!("tenant `{tenant}`: memory.high is above memory.max and will never apply"),
            ));
        }
    }
    if let (Some((max, _)), Some((low, o))) = (&max, &low) {
        if low > max {
            ctx.problems.push(Problem::at(
                o,
                format!(
                    "tenant `{tenant}`: memory.low {} is above memory.max {}",
                    crate::units::HumanBytes(*low),
                    crate::units::HumanBytes(*max)
                ),
            ));
        }
    }
    MemoryPolicy {
        max: max.map(|(v, origin)| Sourced { value: v, origin }),
        high: high.map(|h| h.0),
        low: low.map(|l| l.0),
        swap_max: swap_max.map(|s| s.0),
        huge_pages: huge_pages.map(|h| h.0),
    }
}

/// Two tenants that name the same instance through their presets (the same `sid`, `data_dir`
/// or `datadir`): one error per pair, naming the key, instead of one overlap per rule the
/// presets produce. Returns the pairs reported, for `check_overlaps` to skip.
fn check_same_instance(ctx: &mut Ctx, tenants: &[Loc<RawTenant>]) -> Vec<(String, String)> {
    let identity = |t: &RawTenant| -> Option<(&'static str, Loc<String>)> {
        let (key, v) = match t.preset.as_ref()?.value.as_str() {
            "oracle" => ("sid", t.sid.as_ref()?),
            "postgres" => ("data_dir", t.data_dir.as_ref()?),
            "mysql" => ("datadir", t.datadir.as_ref().or(t.pid_file.as_ref())?),
            _ => return None,
        };
        let value = match key {
            "sid" => v.value.clone(),
            _ => v.value.trim_end_matches('/').to_string(),
        };
        Some((key, v.here(value)))
    };
    // Tenants grouped by (preset, identity), each group in file order: one error per pair in it.
    type Group = Vec<(usize, &'static str, Loc<String>)>;
    let mut groups: HashMap<(&str, String), Group> = HashMap::new();
    for (i, t) in tenants.iter().enumerate() {
        if let Some((key, v)) = identity(&t.value) {
            let preset = t.value.preset.as_ref().map_or("", |p| p.value.as_str());
            groups
                .entry((preset, v.value.clone()))
                .or_default()
                .push((i, key, v));
        }
    }
    // (first tenant, second, key, first's value, second's value)
    type Pair<'a> = (usize, usize, &'static str, &'a Loc<String>, &'a Loc<String>);
    let mut pairs: Vec<Pair> = groups
        .values()
        .flat_map(|g| {
            g.iter().enumerate().flat_map(move |(k, (i, _, va))| {
                g[k + 1..]
                    .iter()
                    .map(move |(j, key, vb)| (*i, *j, *key, va, vb))
            })
        })
        .collect();
    pairs.sort_unstable_by_key(|&(i, j, ..)| (i, j));
    let mut reported = Vec::new();
    for (i, j, key, va, vb) in pairs {
        let (na, nb) = (&tenants[i].value.name.value, &tenants[j].value.name.value);
        let first = ctx.origin(va);
        ctx.error(vb, format!(
            "tenant `{nb}`: {key} `{}` is already tenant `{na}`'s ({first}); one instance belongs to one tenant: remove one of them or correct the {key}",
            vb.value
        ));
        reported.push((na.clone(), nb.clone()));
    }
    reported
}

mod overlaps;
use overlaps::check_overlaps;
#[cfg(test)]
use overlaps::regex_implies;

#[cfg(test)]
mod tests;
