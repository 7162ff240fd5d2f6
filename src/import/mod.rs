//! `dbcage import-libcgroup`: a libcgroup setup (cgconfig.conf groups and their parameters,
//! cgrules.conf placement rules) turned into an equivalent dbcage policy.
//!
//! Each `group` becomes a tenant; each cgrules line whose destination is a group becomes a match
//! rule of that tenant; parameters become dbcage limits in dbcage's units. What has no dbcage
//! equivalent is kept as a comment that says why, next to where it would go. Parse errors are
//! collected for both files (`file:line: message`); the caller prints nothing unless forced.

pub mod cgconfig;
pub mod cgrules;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::hostfs::HostFs;
use crate::kernel::{CpuSet, DevNum};
use cgconfig::{Item, Param};
use cgrules::Who;

/// The converted policy, and every problem found while reading the inputs.
#[derive(Debug, Clone, Default)]
pub struct Imported {
    pub policy: String,
    /// `file:line: message`.
    pub errors: Vec<String>,
}

/// One input file: its path (for messages) and its text.
pub struct Input<'a> {
    pub path: &'a Path,
    pub text: &'a str,
}

#[derive(Debug, Default)]
struct Tenant {
    group: String,
    name: String,
    /// Comments above the tenant.
    notes: Vec<String>,
    /// (inline table, comment) or, for a rule left out, (commented-out table, comment).
    rules: Vec<(String, String)>,
    storage: Vec<String>,
    /// device path → (key, value, comment).
    devices: BTreeMap<String, Vec<(String, String, String)>>,
    cpu: Vec<(String, String, String)>,
    memory: Vec<(String, String, String)>,
    /// Controllers the group sets parameters for (libcgroup names).
    controllers: Vec<String>,
    /// perm.task uid, for the suggestion when no rule places processes.
    task_uid: Option<String>,
    in_cgconfig: bool,
}

fn quote(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// A byte count in the largest exact binary unit (`8GiB`), or plain bytes.
fn bytes(n: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if n > 0 && n.is_multiple_of(1u64 << shift) {
            return quote(&format!("{}{unit}", n >> shift));
        }
    }
    n.to_string()
}

/// The kernel's memparse: digits and an optional binary suffix (k, m, g, t, p, e). `-1` is none.
fn memparse(v: &str) -> Result<Option<u64>, String> {
    let v = v.trim();
    if v == "-1" {
        return Ok(None);
    }
    let (num, shift) = match v.chars().last() {
        Some(c) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_lowercase() {
                'k' => 10,
                'm' => 20,
                'g' => 30,
                't' => 40,
                'p' => 50,
                'e' => 60,
                _ => {
                    return Err(format!(
                        "`{v}` is not a byte count (digits, then k, m, g or t)"
                    ))
                }
            };
            (&v[..v.len() - 1], shift)
        }
        _ => (v, 0),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{v}` is not a byte count (digits, then k, m, g or t)"))?;
    n.checked_mul(1u64 << shift)
        .map(Some)
        .ok_or_else(|| format!("`{v}` is too large"))
}

/// A libcgroup group path as a tenant name: `/` becomes `-`, anything else a tenant name may
/// not hold becomes `_`.
fn tenant_name(group: &str) -> String {
    let mut n: String = group
        .chars()
        .map(|c| match c {
            '/' => '-',
            c if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') => c,
            _ => '_',
        })
        .collect();
    if crate::policy::check_group_name(&n).is_err() {
        n = format!("lc-{n}");
    }
    n.chars().take(64).collect()
}

fn norm_group(g: &str) -> String {
    g.trim_matches('/').to_string()
}

/// `/dev/<name>` of a device number, from /sys/dev/block/MAJ:MIN/uevent.
pub fn device_path(fs: &HostFs, dev: DevNum) -> Option<String> {
    let text = fs
        .read_to_string(format!("/sys/dev/block/{dev}/uevent"))
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .map(|n| format!("/dev/{}", n.trim()))
        .filter(|p| !p.contains(".."))
}

struct Converter<'a> {
    fs: &'a HostFs,
    tenants: Vec<Tenant>,
    /// Notes for the top of the file.
    notes: Vec<String>,
    errors: Vec<String>,
}

impl Converter<'_> {
    fn tenant(&mut self, group: &str) -> &mut Tenant {
        let g = norm_group(group);
        if let Some(i) = self.tenants.iter().position(|t| t.group == g) {
            return &mut self.tenants[i];
        }
        let name = tenant_name(&g);
        let mut t = Tenant {
            group: g.clone(),
            name: name.clone(),
            ..Default::default()
        };
        if name != g {
            t.notes.push(format!(
                "libcgroup group `{g}`: the tenant is named `{name}` (a tenant name is one directory)"
            ));
        }
        self.tenants.push(t);
        self.tenants.last_mut().unwrap()
    }

    fn group(&mut self, file: &str, g: &cgconfig::Group) {
        let fs = self.fs;
        let mut errors = Vec::new();
        let t = self.tenant(&g.name);
        t.in_cgconfig = true;
        for p in &g.perm {
            let owner: Vec<String> = p
                .params
                .iter()
                .map(|x| format!("{} = {}", x.key, x.value))
                .collect();
            if p.name == "task" {
                t.task_uid = p
                    .params
                    .iter()
                    .find(|x| x.key == "uid")
                    .map(|x| x.value.clone());
            }
            t.notes.push(format!(
                "{file}:{}: perm {} {{ {} }}: who may write the group's files; dbcage's groups stay root's and dbcage places processes itself, by the match rules",
                p.line,
                p.name,
                owner.join("; ")
            ));
        }
        // cpu quota and period are read together.
        let mut quota: Option<&Param> = None;
        let mut period: Option<&Param> = None;
        let mut memory_limit: Option<u64> = None;
        let mut memsw: Option<&Param> = None;
        for b in &g.controllers {
            if !b.params.is_empty() && !t.controllers.contains(&b.name) {
                t.controllers.push(b.name.clone());
            }
            for p in &b.params {
                let at = format!("{file}:{}: {} = {}", p.line, p.key, p.value);
                let mut err = |m: String| errors.push(format!("{file}:{}: {}: {m}", p.line, p.key));
                match (b.name.as_str(), p.key.as_str()) {
                    ("cpuset", "cpuset.cpus") => match p.value.parse::<CpuSet>() {
                        Ok(_) => t.cpu.push(("cpus".into(), quote(p.value.trim()), at)),
                        Err(e) => err(e.to_string()),
                    },
                    ("cpuset", "cpuset.mems") => match p.value.parse::<CpuSet>() {
                        Ok(set) => {
                            let nodes: Vec<String> = set.iter().map(|n| n.to_string()).collect();
                            t.cpu.push((
                                "numa_nodes".into(),
                                format!("[{}]", nodes.join(", ")),
                                format!("{at} (numa_nodes also keeps the cpus to these nodes' cpus; libcgroup set cpus and mems apart)"),
                            ));
                        }
                        Err(e) => err(e.to_string()),
                    },
                    ("cpu", "cpu.shares") => match p.value.trim().parse::<u64>() {
                        Ok(s) if s >= 2 => {
                            let w = ((s as f64 / 10.24).round() as u64).clamp(1, 10000);
                            let back = (w as f64 * 10.24).round() as u64;
                            let exact = if back == s {
                                String::new()
                            } else {
                                format!(" (dbcage writes cpu.shares = {back}: weight × 10.24)")
                            };
                            t.cpu
                                .push(("weight".into(), w.to_string(), format!("{at}{exact}")));
                        }
                        _ => err(format!("`{}` is not a share count (2 or more)", p.value)),
                    },
                    ("cpu", "cpu.cfs_quota_us") => quota = Some(p),
                    ("cpu", "cpu.cfs_period_us") => period = Some(p),
                    ("memory", "memory.limit_in_bytes") => match memparse(&p.value) {
                        Ok(Some(n)) => {
                            memory_limit = Some(n);
                            t.memory.push(("max".into(), bytes(n), at));
                        }
                        Ok(None) => t.notes.push(format!("{at}: no limit, the default")),
                        Err(e) => err(e),
                    },
                    ("memory", "memory.soft_limit_in_bytes") => match memparse(&p.value) {
                        Ok(Some(n)) => t.memory.push(("high".into(), bytes(n), at)),
                        Ok(None) => t.notes.push(format!("{at}: no limit, the default")),
                        Err(e) => err(e),
                    },
                    ("memory", "memory.memsw.limit_in_bytes") => memsw = Some(p),
                    ("blkio", key)
                        if key.starts_with("blkio.throttle.") && key.ends_with("_device") =>
                    {
                        let what = &key["blkio.throttle.".len()..key.len() - "_device".len()];
                        if !matches!(what, "read_bps" | "write_bps" | "read_iops" | "write_iops") {
                            t.notes.push(format!(
                                "{at}: not a blk-throttle limit dbcage knows; dropped"
                            ));
                            continue;
                        }
                        let mut parts = p.value.split_whitespace();
                        let (Some(dev), Some(n), None) = (parts.next(), parts.next(), parts.next())
                        else {
                            err(format!("`{}` must be `MAJ:MIN VALUE`", p.value));
                            continue;
                        };
                        let Ok(dev) = dev.parse::<DevNum>() else {
                            err(format!("`{dev}` is not a device number MAJ:MIN"));
                            continue;
                        };
                        let Ok(n) = n.parse::<u64>() else {
                            err(format!("`{n}` is not a number"));
                            continue;
                        };
                        if n == 0 {
                            t.notes
                                .push(format!("{at}: 0 removes the limit; nothing to convert"));
                            continue;
                        }
                        let (path, found) = match device_path(fs, dev) {
                            Some(p) => (p, true),
                            None => (format!("/dev/block/{dev}"), false),
                        };
                        let note = if found {
                            format!("{at} ({path} is {dev})")
                        } else {
                            format!(
                                "{at} (device {dev} is not on this host; name it by its path here)"
                            )
                        };
                        let value = if what.ends_with("bps") {
                            bytes(n)
                        } else {
                            n.to_string()
                        };
                        if !t.storage.contains(&path) {
                            t.storage.push(path.clone());
                        }
                        t.devices
                            .entry(path)
                            .or_default()
                            .push((what.to_string(), value, note));
                    }
                    ("blkio", k)
                        if k.starts_with("blkio.weight") || k.starts_with("blkio.leaf_weight") =>
                    {
                        t.notes.push(format!("{at}: proportional IO weights have no dbcage equivalent (dbcage sets bps/iops limits); dropped"));
                    }
                    ("cpuacct", _) => t.notes.push(format!(
                        "{at}: cpuacct only accounts; dbcage reads it for status, nothing to set"
                    )),
                    ("cpu" | "cpuset" | "memory" | "blkio", _) => {
                        t.notes.push(format!("{at}: no dbcage equivalent; dropped"))
                    }
                    (c, _) => t.notes.push(format!(
                        "{at}: dbcage does not drive the `{c}` controller; dropped"
                    )),
                }
            }
        }
        if let Some(q) = quota {
            let at = format!("{file}:{}: cpu.cfs_quota_us = {}", q.line, q.value);
            let per = period.map(|p| p.value.trim().parse::<i64>());
            match (q.value.trim().parse::<i64>(), per) {
                (Ok(-1), _) => t.notes.push(format!("{at}: no quota, the default")),
                (Ok(qv), None) if qv > 0 => {
                    t.cpu.push(("cores".into(), format!("{}", qv as f64 / 100_000.0), at));
                }
                (Ok(qv), Some(Ok(pv))) if qv > 0 && pv > 0 => {
                    let note = if pv == 100_000 {
                        format!("{at}, cpu.cfs_period_us = {pv}")
                    } else {
                        format!("{at}, cpu.cfs_period_us = {pv} (dbcage uses a 100 ms period: the same share of time)")
                    };
                    t.cpu.push(("cores".into(), format!("{}", qv as f64 / pv as f64), note));
                }
                _ => errors.push(format!(
                    "{file}:{}: cpu.cfs_quota_us / cpu.cfs_period_us: `{}` / `{}` are not a quota and a period in microseconds",
                    q.line,
                    q.value,
                    period.map(|p| p.value.as_str()).unwrap_or("100000")
                )),
            }
        } else if let Some(p) = period {
            t.notes.push(format!(
                "{file}:{}: cpu.cfs_period_us = {} without a quota: nothing to convert",
                p.line, p.value
            ));
        }
        if let Some(m) = memsw {
            let at = format!(
                "{file}:{}: memory.memsw.limit_in_bytes = {}",
                m.line, m.value
            );
            match (memparse(&m.value), memory_limit) {
                (Ok(None), _) => t.notes.push(format!("{at}: no limit, the default")),
                (Ok(Some(sw)), Some(lim)) if sw >= lim => t.memory.push((
                    "swap_max".into(),
                    bytes(sw - lim),
                    format!("{at} (memory + swap; swap_max is the swap part)"),
                )),
                (Ok(Some(_)), _) => t.notes.push(format!(
                    "{at}: needs memory.limit_in_bytes at or below it to become swap_max; dropped"
                )),
                (Err(e), _) => errors.push(format!(
                    "{file}:{}: memory.memsw.limit_in_bytes: {e}",
                    m.line
                )),
            }
        }
        self.errors.extend(errors);
    }

    fn rules(&mut self, file: &str, rules: &[cgrules::Rule]) {
        // The tenant each rule went to, for continuations and order notes.
        let mut placed: Vec<Option<String>> = Vec::new();
        let mut order_noted = false;
        for r in rules {
            let at = format!("{file}:{}: {}", r.line, r.text);
            let prev = placed.last().cloned().flatten();
            placed.push(None);
            if r.options.iter().any(|o| o == "ignore") {
                self.notes.push(format!("{at}: `ignore` (cgred leaves matching processes where they are): dbcage leaves processes no rule matches alone; not converted"));
                continue;
            }
            if r.destination.contains('%') {
                self.notes.push(format!("{at}: destination templates (%u, %g, %p: a group per user or process, created on demand) have no dbcage equivalent; not converted"));
                continue;
            }
            let dest = norm_group(&r.destination);
            if dest.is_empty() {
                self.notes.push(format!("{at}: the hierarchy's root: dbcage leaves processes no rule matches where they are; not converted"));
                continue;
            }
            if r.continuation {
                let same = prev.as_deref() == Some(dest.as_str());
                if !same {
                    self.notes.push(format!("{at}: a dbcage process belongs to one tenant for every controller; this line sends the previous line's processes to another group for some controllers; not converted"));
                }
                placed.pop();
                placed.push(prev);
                if same {
                    let t = self.tenant(&dest);
                    if let Some(last) = t.rules.last_mut() {
                        last.1
                            .push_str(&format!("; {}:{}: {}", file, r.line, r.text));
                    }
                }
                continue;
            }
            let mut keys = Vec::new();
            let mut extra = String::new();
            match &r.who {
                Who::User(u) => keys.push(format!("user = {}", id_or_name(u))),
                Who::Group(g) => keys.push(format!("group = {}", id_or_name(g))),
                Who::Anyone => {}
            }
            if let Some(p) = &r.process {
                if p.starts_with('/') {
                    keys.push(format!("exe = {}", quote(p)));
                } else {
                    let short: String = p.chars().take(15).collect();
                    if short != *p {
                        extra = format!(" (comm holds 15 characters: `{short}`)");
                    }
                    keys.push(format!(
                        "comm = {}",
                        quote(&format!("^{}$", regex::escape(&short)))
                    ));
                }
            }
            let before = self.tenants.iter().position(|t| t.group == dest);
            let t = self.tenant(&dest);
            if !r.controllers.is_empty() {
                let missing: Vec<&String> = t
                    .controllers
                    .iter()
                    .filter(|c| DRIVEN.contains(&c.as_str()) && !r.controllers.contains(c))
                    .collect();
                if !missing.is_empty() {
                    extra.push_str(&format!(
                        " (libcgroup moved these processes for {} only; dbcage moves them in every hierarchy, so the group's {} settings apply to them too)",
                        r.controllers.join(","),
                        missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",")
                    ));
                }
            }
            if keys.is_empty() {
                t.rules.push((
                    "# { comm = \"\" },".into(),
                    format!("{at}: every process; uncomment if that is meant (dbcage would take every process of the host not claimed by an earlier tenant)"),
                ));
            } else {
                t.rules.push((
                    format!("{{ {} }},", keys.join(", ")),
                    format!("{at}{extra}"),
                ));
            }
            let name = t.group.clone();
            // A rule for an earlier tenant after one for a later tenant: the order differs.
            if let Some(i) = before {
                let later_seen = placed.iter().flatten().any(|g| {
                    self.tenants
                        .iter()
                        .position(|t| &t.group == g)
                        .is_some_and(|j| j > i)
                });
                if later_seen && !order_noted {
                    order_noted = true;
                    self.notes.push(format!("{file}:{}: cgred uses the first matching line, dbcage the first matching tenant in file order (tenants are in the order of their first line): a process matched by rules of two tenants may be placed differently; check `dbcage plan`", r.line));
                }
            }
            *placed.last_mut().unwrap() = Some(name);
        }
    }

    fn render(&self, sources: &[String]) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "# dbcage policy converted by `dbcage import-libcgroup` from {}.",
            sources.join(" and ")
        );
        o.push_str("# Each libcgroup group is a tenant: dbcage creates it as dbcage/<tenant> in every hierarchy\n");
        o.push_str("# (libcgroup: <mount point>/<group>), with `limited` and `exempt` leaves.\n");
        o.push_str("# Review it, then: dbcage -c FILE check && dbcage -c FILE plan\n");
        for n in &self.notes {
            let _ = writeln!(o, "#\n# {n}");
        }
        for t in &self.tenants {
            o.push('\n');
            for n in &t.notes {
                let _ = writeln!(o, "# {n}");
            }
            if !t.in_cgconfig {
                let _ = writeln!(
                    o,
                    "# group `{}` is not defined in cgconfig.conf: a tenant without limits",
                    t.group
                );
            }
            o.push_str("[[tenant]]\n");
            let _ = writeln!(o, "name = {}", quote(&t.name));
            if t.rules.iter().any(|(r, _)| !r.starts_with('#')) {
                o.push_str("match = [\n");
                for (r, c) in &t.rules {
                    let _ = writeln!(o, "  {r} # {c}");
                }
                o.push_str("]\n");
            } else {
                for (r, c) in &t.rules {
                    let _ = writeln!(
                        o,
                        "# match = [{}] # {c}",
                        r.trim_start_matches("# ").trim_end_matches(',')
                    );
                }
                match &t.task_uid {
                    Some(u) => {
                        let _ = writeln!(o, "# No cgrules.conf line places processes here; perm.task.uid suggests:\n# match = [{{ user = {} }}]", id_or_name(u));
                    }
                    None => o.push_str(
                        "# No cgrules.conf line places processes here: add match rules.\n",
                    ),
                }
            }
            if !t.storage.is_empty() {
                let s: Vec<String> = t.storage.iter().map(|p| quote(p)).collect();
                let _ = writeln!(o, "storage = [{}]", s.join(", "));
            }
            if !t.cpu.is_empty() {
                o.push_str("\n[tenant.cpu]\n");
                for (k, v, c) in &t.cpu {
                    let _ = writeln!(o, "{k} = {v} # {c}");
                }
            }
            if !t.memory.is_empty() {
                o.push_str("\n[tenant.memory]\n");
                for (k, v, c) in &t.memory {
                    let _ = writeln!(o, "{k} = {v} # {c}");
                }
            }
            for (path, limits) in &t.devices {
                o.push_str("\n[[tenant.io.device]]\n");
                let _ = writeln!(o, "path = {}", quote(path));
                for (k, v, c) in limits {
                    let _ = writeln!(o, "{k} = {v} # {c}");
                }
            }
        }
        o
    }
}

/// The v1 controllers whose settings dbcage converts.
const DRIVEN: [&str; 4] = ["cpu", "cpuset", "memory", "blkio"];

fn id_or_name(s: &str) -> String {
    match s.parse::<u32>() {
        Ok(n) => n.to_string(),
        Err(_) => quote(s),
    }
}

/// Converts the inputs; `fs` is where device numbers are looked up (/sys/dev/block).
pub fn convert(cgconfig: Option<Input>, cgrules: Option<Input>, fs: &HostFs) -> Imported {
    let mut c = Converter {
        fs,
        tenants: Vec::new(),
        notes: Vec::new(),
        errors: Vec::new(),
    };
    let mut sources = Vec::new();
    // cgrules first: tenants follow the order of the first line that names them (dbcage's
    // precedence is tenant order); groups no line names follow in cgconfig.conf's order.
    let parsed_rules = cgrules.as_ref().map(|r| {
        let (rules, errors) = cgrules::parse(r.text);
        let file = r.path.display().to_string();
        for (line, m) in errors {
            c.errors.push(format!("{file}:{line}: {m}"));
        }
        (file, rules)
    });
    if let Some((file, rules)) = &parsed_rules {
        for r in rules {
            let d = norm_group(&r.destination);
            if !d.is_empty()
                && !d.contains('%')
                && !r.options.iter().any(|o| o == "ignore")
                && !r.continuation
            {
                c.tenant(&d);
            }
        }
        let _ = file;
    }
    if let Some(cfg) = &cgconfig {
        let file = cfg.path.display().to_string();
        sources.push(file.clone());
        let (items, errors) = cgconfig::parse(cfg.text);
        for (line, m) in errors {
            c.errors.push(format!("{file}:{line}: {m}"));
        }
        for item in &items {
            match item {
                Item::Mount { line, params } => {
                    let m: Vec<String> = params.iter().map(|p| format!("{} = {}", p.key, p.value)).collect();
                    c.notes.push(format!("{file}:{line}: mount {{ {} }}: dbcage finds the mounted hierarchies itself (/proc/self/mountinfo) and mounts none", m.join("; ")));
                }
                Item::Namespace { line, .. } => c.notes.push(format!("{file}:{line}: namespace: dbcage's tenants live under its own root group (`[agent] root` and `parent`); not converted")),
                Item::Other { kind, name, line } => c.notes.push(format!(
                    "{file}:{line}: {kind}{}{name}: {}; not converted",
                    if name.is_empty() { "" } else { " " },
                    if kind == "default" { "default permissions for groups: dbcage's groups stay root's" } else { "groups created on demand by cgred from a template have no dbcage equivalent" }
                )),
                Item::Group(g) if matches!(norm_group(&g.name).as_str(), "" | ".") => {
                    c.notes.push(format!("{file}:{}: group {}: the hierarchy's root group; dbcage changes only its own groups; not converted", g.line, g.name));
                }
                Item::Group(g) => c.group(&file, g),
            }
        }
    }
    if let (Some((file, rules)), Some(r)) = (&parsed_rules, &cgrules) {
        sources.push(r.path.display().to_string());
        c.rules(file, rules);
    }
    // The first cgrules pass created tenants in line order before cgconfig filled them in.
    Imported {
        policy: c.render(&sources),
        errors: c.errors,
    }
}

#[cfg(test)]
mod tests;
