//! Every tenant's rules compiled into one set (`Policy::matcher`, built when the policy is read;
//! `classify` asks it which rules a process matches): the `cmdline` regexes of all rules form one
//! `RegexSet`, the `comm` regexes another, so a process costs one pass over each field however
//! many tenants there are (a loop over a thousand regexes cost about 400 µs per process, and a
//! search cache per regex 70 MiB). Only the rules one of the sets names (or that have no regex)
//! are then checked for their other fields (user, group, exe, pid file, systemd unit).
//!
//! The matcher holds copies of the rules (a pid file's PID is shared with the policy's copy), so
//! it answers for the tenants it was built from and needs no access to them afterwards.

use regex::{RegexSet, RegexSetBuilder};

use super::{PidFile, Rule, Tenant};

/// The process fields the rules look at (`classify` fills it from a `ProcInfo`).
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub pid: u32,
    pub cmdline: &'a str,
    pub comm: &'a str,
    pub exe: Option<&'a std::path::Path>,
    pub uid: u32,
    pub gid: u32,
    /// The systemd unit its cgroup is in (read only when a rule has `unit`).
    pub unit: Option<&'a str>,
}

/// Which list of its tenant a rule is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    Exempt,
    Match,
}

/// The rules of all tenants, compiled. Rules are numbered in precedence order: tenant by tenant
/// in file order, and within a tenant its `exempt` rules before its `match` rules.
pub struct RuleSet {
    rules: Vec<CompiledRule>,
    /// Per tenant, the range of its rules in `rules`: exempt ones first, then `limited_from..end`.
    tenants: Vec<TenantRules>,
    cmdline: Patterns,
    comm: Patterns,
    /// Rules with no regex: checked for every process.
    unconditional: Vec<u32>,
}

struct TenantRules {
    start: u32,
    limited_from: u32,
    end: u32,
}

struct CompiledRule {
    tenant: u32,
    list: List,
    /// Index of its pattern in `Matcher::cmdline` / `Matcher::comm`.
    cmdline: Option<u32>,
    comm: Option<u32>,
    exe: Option<std::path::PathBuf>,
    uid: Option<u32>,
    gid: Option<u32>,
    pidfile: Option<PidFile>,
    unit: Option<crate::unitname::UnitPattern>,
    descendants: bool,
    within_tenant: bool,
    label: String,
}

/// One field's patterns, and which rule each belongs to: those that match one whole text
/// (`^postgres$`) by that text, the others as one `RegexSet`. A literal costs a map entry
/// where the set took about 2 KiB (its automaton and search caches) and a search.
struct Patterns {
    set: RegexSet,
    /// Index in `set` → pattern index.
    in_set: Vec<u32>,
    /// Exact text → the patterns that match it alone (one per rule naming it).
    exact: std::collections::HashMap<Box<str>, Vec<u32>>,
    rule_of: Vec<u32>,
}

/// The patterns of one field that matched a text, in ascending order.
struct Matched(Vec<u32>);

impl Matched {
    fn contains(&self, pattern: u32) -> bool {
        self.0.binary_search(&pattern).is_ok()
    }
}

/// A pattern set is one automaton over all patterns; its size limit is raised from the default
/// (sized for one regex) so that a thousand tenants' patterns fit. Each pattern alone was
/// checked against the default when the policy was read.
const SET_SIZE_LIMIT: usize = 512 << 20;

impl Patterns {
    fn new(patterns: Vec<(&super::Pattern, u32)>) -> Patterns {
        let rule_of = patterns.iter().map(|(_, r)| *r).collect();
        let mut exact: std::collections::HashMap<Box<str>, Vec<u32>> = Default::default();
        let mut searched = Vec::new();
        let mut in_set = Vec::new();
        for (i, (p, _)) in patterns.iter().enumerate() {
            match &p.shape().exact {
                Some(text) => exact
                    .entry(text.as_str().into())
                    .or_default()
                    .push(i as u32),
                None => {
                    searched.push(p.as_str());
                    in_set.push(i as u32);
                }
            }
        }
        let set = RegexSetBuilder::new(searched)
            .size_limit(SET_SIZE_LIMIT)
            .build()
            // Every pattern compiled on its own when the policy was validated; together they
            // can only exceed the size limit, which is far above what 100,000 simple rules take.
            .unwrap_or_else(|e| panic!("compiling the rules' patterns into one set: {e}"));
        Patterns {
            set,
            in_set,
            exact,
            rule_of,
        }
    }

    /// Which patterns match `text` (None when none does: most processes of a host match no
    /// rule, and walking a thousand patterns' slots for each of them was 5% of a rescan's CPU).
    fn matches(&self, text: &str) -> Option<Matched> {
        let mut found: Vec<u32> = self.exact.get(text).cloned().unwrap_or_default();
        // `is_match` first: it stops at the first match and fills no slot per pattern (the set's
        // `matches` allocates and clears one for each of a thousand patterns on every call).
        if !self.in_set.is_empty() && self.set.is_match(text) {
            let m = self.set.matches(text);
            if m.matched_any() {
                found.extend(m.iter().map(|i| self.in_set[i]));
            }
        }
        if found.is_empty() {
            return None;
        }
        found.sort_unstable();
        Some(Matched(found))
    }
}

impl std::fmt::Debug for RuleSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleSet")
            .field("tenants", &self.tenants.len())
            .field("rules", &self.rules.len())
            .field("cmdline_patterns", &self.cmdline.rule_of.len())
            .field("comm_patterns", &self.comm.rule_of.len())
            .finish()
    }
}

/// The rules one process matches, in precedence order (see `Matcher`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Hits(Vec<u32>);

impl RuleSet {
    /// Whether a rule names a pid file (whose pid changes with no process event).
    pub fn has_pid_files(&self) -> bool {
        self.rules.iter().any(|r| r.pidfile.is_some())
    }

    pub fn new(tenants: &[Tenant]) -> RuleSet {
        let mut rules = Vec::new();
        let mut ranges = Vec::with_capacity(tenants.len());
        let mut cmdline = Vec::new();
        let mut comm = Vec::new();
        let mut unconditional = Vec::new();
        for (ti, t) in tenants.iter().enumerate() {
            let start = rules.len() as u32;
            let mut limited_from = start;
            for (which, list) in [(List::Exempt, &t.exempt), (List::Match, &t.rules)] {
                if which == List::Match {
                    limited_from = rules.len() as u32;
                }
                for r in list {
                    let index = rules.len() as u32;
                    rules.push(CompiledRule::new(
                        ti as u32,
                        which,
                        r,
                        index,
                        &mut cmdline,
                        &mut comm,
                    ));
                    if r.cmdline.is_none() && r.comm.is_none() {
                        unconditional.push(index);
                    }
                }
            }
            ranges.push(TenantRules {
                start,
                limited_from,
                end: rules.len() as u32,
            });
        }
        let cmdline = Patterns::new(cmdline);
        let comm = Patterns::new(comm);
        RuleSet {
            rules,
            tenants: ranges,
            cmdline,
            comm,
            unconditional,
        }
    }

    /// The rules `p` matches (all fields of each), in precedence order.
    pub fn hits(&self, p: &Subject) -> Hits {
        let cmdline = self.cmdline.matches(p.cmdline);
        let comm = self.comm.matches(p.comm);
        let mut candidates = self.unconditional.clone();
        for (patterns, matched) in [(&self.cmdline, &cmdline), (&self.comm, &comm)] {
            if let Some(m) = matched {
                candidates.extend(m.0.iter().map(|&i| patterns.rule_of[i as usize]));
            }
        }
        candidates.sort_unstable();
        candidates.dedup();
        let matched = |set: &Option<Matched>, i: u32| set.as_ref().is_some_and(|m| m.contains(i));
        candidates.retain(|&i| {
            let r = &self.rules[i as usize];
            r.cmdline.is_none_or(|c| matched(&cmdline, c))
                && r.comm.is_none_or(|c| matched(&comm, c))
                && r.uid.is_none_or(|u| u == p.uid)
                && r.gid.is_none_or(|g| g == p.gid)
                && r.exe.as_ref().is_none_or(|e| p.exe == Some(e.as_path()))
                && r.pidfile.as_ref().is_none_or(|f| f.pid() == Some(p.pid))
                && r.unit
                    .as_ref()
                    .is_none_or(|u| p.unit.is_some_and(|unit| u.matches(unit)))
        });
        Hits(candidates)
    }

    /// The tenant that claims `p` by its own rules, the leaf and the deciding rule's label: the
    /// first tenant with a hit; within it, an exempt rule (not `within_tenant`) beats a match
    /// rule. Exempt rules come first in each tenant, so the first such hit decides.
    pub fn direct_claim<'a>(&'a self, hits: &Hits) -> Option<(usize, List, &'a str)> {
        hits.0
            .iter()
            .map(|&i| &self.rules[i as usize])
            .find(|r| !(r.list == List::Exempt && r.within_tenant))
            .map(|r| (r.tenant as usize, r.list, r.label.as_str()))
    }

    /// Every tenant that claims `p` by its own rules, in tenant order.
    pub fn claims(&self, hits: &Hits) -> Vec<usize> {
        let mut out: Vec<usize> = hits
            .0
            .iter()
            .map(|&i| &self.rules[i as usize])
            .filter(|r| !(r.list == List::Exempt && r.within_tenant))
            .map(|r| r.tenant as usize)
            .collect();
        out.dedup();
        out
    }

    /// The first rule of `tenant` with `descendants = true` that `p` matches, exempt rules first
    /// (so an exempt rule passes `exempt` on): the leaf its descendants get at least, and its label.
    pub fn passes_on<'a>(&'a self, tenant: usize, hits: &Hits) -> Option<(List, &'a str)> {
        let range = &self.tenants[tenant];
        hits.0
            .iter()
            .filter(|&&i| (range.start..range.end).contains(&i))
            .map(|&i| &self.rules[i as usize])
            .find(|r| r.descendants)
            .map(|r| (r.list, r.label.as_str()))
    }

    /// Whether a process inherited by `tenant` lands in its exempt leaf: it matches any of the
    /// tenant's exempt rules (`within_tenant` ones included).
    pub fn exempt_within(&self, tenant: usize, hits: &Hits) -> bool {
        let range = &self.tenants[tenant];
        hits.0
            .iter()
            .any(|&i| (range.start..range.limited_from).contains(&i))
    }
}

impl Hits {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl CompiledRule {
    fn new<'a>(
        tenant: u32,
        list: List,
        r: &'a Rule,
        index_of_rule: u32,
        cmdline: &mut Vec<(&'a super::Pattern, u32)>,
        comm: &mut Vec<(&'a super::Pattern, u32)>,
    ) -> CompiledRule {
        let index = |list: &mut Vec<(&'a super::Pattern, u32)>, re: &'a Option<super::Pattern>| {
            re.as_ref().map(|re| {
                list.push((re, index_of_rule));
                (list.len() - 1) as u32
            })
        };
        CompiledRule {
            tenant,
            list,
            cmdline: index(cmdline, &r.cmdline),
            comm: index(comm, &r.comm),
            exe: r.exe.clone(),
            uid: r.uid,
            gid: r.gid,
            pidfile: r.pidfile.clone(),
            unit: r.unit.clone(),
            descendants: r.descendants,
            within_tenant: r.within_tenant,
            label: r.label.clone(),
        }
    }
}
