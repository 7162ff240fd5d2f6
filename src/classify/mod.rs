//! Which tenant, and which leaf, each process belongs to. Pure: processes and rules in, decisions
//! out, so the daemon, `apply` and `status -v` share one answer.
//!
//! Order of precedence: a process goes to the first tenant in file order that claims it, either
//! directly (a `match` or `exempt` rule) or as a descendant of a process matched by a rule with
//! `descendants = true`. Within the tenant, an `exempt` rule wins over `match`: such a process
//! lives in the `exempt` leaf, under the tenant's cpu and memory limits but free of its IO limits.

pub mod connector;

use crate::policy::ruleset::{Hits, List, RuleSet, Subject};

use std::collections::HashMap;

use serde::Serialize;

use crate::inventory::ProcInfo;
use crate::policy::{Rule, Tenant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Leaf {
    Limited,
    Exempt,
}

impl Leaf {
    pub fn dir(self) -> &'static str {
        match self {
            Leaf::Limited => "limited",
            Leaf::Exempt => "exempt",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    pub pid: u32,
    pub tenant: usize,
    pub leaf: Leaf,
    /// The rule that decided it, e.g. `match[0] comm=~^ora_p` or `descendant of 812 (match[1] ...)`.
    pub reason: String,
}

impl Rule {
    pub fn matches(&self, p: &ProcInfo) -> bool {
        self.cmdline
            .as_ref()
            .is_none_or(|re| re.is_match(&p.cmdline))
            && self.comm.as_ref().is_none_or(|re| re.is_match(&p.comm))
            && self
                .exe
                .as_ref()
                .is_none_or(|e| p.exe.as_deref() == Some(e.as_path()))
            && self.uid.is_none_or(|u| u == p.uid)
            && self.gid.is_none_or(|g| g == p.gid)
            && self.pidfile.as_ref().is_none_or(|f| f.pid() == Some(p.pid))
            && self
                .unit
                .as_ref()
                .is_none_or(|u| p.unit.as_deref().is_some_and(|unit| u.matches(unit)))
    }
}

/// The process fields the tenants' rules look at (see `procs::Fields`).
pub fn fields_needed(tenants: &[Tenant]) -> crate::inventory::procs::Fields {
    crate::inventory::procs::Fields::needed_by(tenants)
}

/// The placement of one process by direct rules only (no descendant claims): the daemon's fast
/// path when no rule passes a tenant on to descendants. Same precedence as `classify`.
pub fn classify_direct(tenants: &[Tenant], p: &ProcInfo) -> Option<Placement> {
    RuleSet::new(tenants).classify_direct(p)
}

/// Claims of every tenant on one process, in tenant order (for overlap warnings).
pub fn claims(tenants: &[Tenant], p: &ProcInfo) -> Vec<usize> {
    RuleSet::new(tenants).claims_on(p)
}

/// Classifies every process. Processes no tenant claims are absent from the result.
/// (Compiles the rules first: callers use the policy's compiled set, `Policy::matcher`, through
/// `Classifier`.)
pub fn classify(tenants: &[Tenant], procs: &[ProcInfo]) -> Vec<Placement> {
    RuleSet::new(tenants).classify(procs)
}

/// The rules each process matched at the last classification with one rule set, for the next
/// to take for the processes a rescan kept unread (`Inventory::unchanged`: the same fields, so
/// the same hits) instead of matching them again: a fifth of a rescan's CPU at 100,000
/// processes. Only the processes that matched something are kept (in pid order); the rest
/// matched nothing. Not used when a rule has a `pid_file` (its pid changes without any event).
#[derive(Debug, Default)]
pub struct Memo {
    rules: std::sync::Weak<RuleSet>,
    hits: Vec<(u32, Hits)>,
}

impl Memo {
    /// How many processes' hits it holds.
    pub fn len(&self) -> usize {
        self.hits.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hits.is_empty()
    }
}

/// `Classifier::classify`, taking the hits of the processes in `unchanged` (in order) from
/// `memo` when it was made with these `rules`, and leaving this classification's hits in it.
pub fn classify_reusing(
    rules: &std::sync::Arc<RuleSet>,
    procs: &[ProcInfo],
    unchanged: &[u32],
    memo: &mut Memo,
) -> Vec<Placement> {
    if rules.has_pid_files() {
        *memo = Memo::default();
        return rules.classify(procs);
    }
    let same_rules = std::sync::Weak::ptr_eq(&memo.rules, &std::sync::Arc::downgrade(rules));
    // All three in pid order: walked along (no lookup per process).
    let mut before = std::mem::take(&mut memo.hits).into_iter().peekable();
    let mut unchanged = unchanged.iter().peekable();
    let hits: Vec<(usize, Hits)> = (procs.iter().enumerate())
        .map(|(i, p)| {
            while unchanged.next_if(|&&u| u < p.pid).is_some() {}
            while before.next_if(|(pid, _)| *pid < p.pid).is_some() {}
            let had = before.next_if(|(pid, _)| *pid == p.pid).map(|(_, h)| h);
            let kept = same_rules && unchanged.next_if(|&&u| u == p.pid).is_some();
            let hits = match kept {
                true => had.unwrap_or_default(),
                false => rules.hits(&subject(p)),
            };
            (i, hits)
        })
        .filter(|(_, h)| !h.is_empty())
        .collect();
    let placements = rules.classify_hits(procs, &hits);
    memo.rules = std::sync::Arc::downgrade(rules);
    memo.hits = (hits.into_iter()).map(|(i, h)| (procs[i].pid, h)).collect();
    placements
}

/// Classification over the policy's compiled rules (`Policy::matcher`).
pub trait Classifier {
    /// See the free function `classify`.
    fn classify(&self, procs: &[ProcInfo]) -> Vec<Placement>;
    /// See the free function `classify_direct`.
    fn classify_direct(&self, p: &ProcInfo) -> Option<Placement>;
    /// See the free function `claims`.
    fn claims_on(&self, p: &ProcInfo) -> Vec<usize>;
    /// Whether any rule of any tenant (exempt rules included) matches `p`.
    fn hit_by_any_rule(&self, p: &ProcInfo) -> bool;
}

fn subject(p: &ProcInfo) -> Subject<'_> {
    Subject {
        pid: p.pid,
        cmdline: &p.cmdline,
        comm: &p.comm,
        exe: p.exe.as_deref(),
        uid: p.uid,
        gid: p.gid,
        unit: p.unit.as_deref(),
    }
}

fn leaf(list: List) -> Leaf {
    match list {
        List::Exempt => Leaf::Exempt,
        List::Match => Leaf::Limited,
    }
}

impl Classifier for RuleSet {
    fn claims_on(&self, p: &ProcInfo) -> Vec<usize> {
        self.claims(&self.hits(&subject(p)))
    }

    fn hit_by_any_rule(&self, p: &ProcInfo) -> bool {
        !self.hits(&subject(p)).is_empty()
    }

    fn classify_direct(&self, p: &ProcInfo) -> Option<Placement> {
        self.direct_claim(&self.hits(&subject(p)))
            .map(|(tenant, list, label)| Placement {
                pid: p.pid,
                tenant,
                leaf: leaf(list),
                reason: label.to_string(),
            })
    }

    fn classify(&self, procs: &[ProcInfo]) -> Vec<Placement> {
        // Each process's hits, computed once (empty for most processes: not kept).
        let hits: Vec<(usize, Hits)> = (procs.iter().enumerate())
            .map(|(i, p)| (i, self.hits(&subject(p))))
            .filter(|(_, h)| !h.is_empty())
            .collect();
        self.classify_hits(procs, &hits)
    }
}

impl RuleSet {
    /// `classify`, given the processes' hits: `(index in procs, hits)` in order, for the
    /// processes that matched a rule (most match none: a list of every process's hits was a
    /// tenth of classifying 100,000 processes).
    fn classify_hits(&self, procs: &[ProcInfo], hits: &[(usize, Hits)]) -> Vec<Placement> {
        // Direct claims, and which processes pass their tenant on to descendants.
        let mut direct: HashMap<u32, (usize, Leaf, &str)> = HashMap::new();
        // (tenant, leaf its descendants get at least, label); an exempt rule passes on `exempt`
        let mut ancestors_for: HashMap<u32, (usize, Leaf, &str)> = HashMap::new();
        for (i, h) in hits {
            if let Some((ti, list, label)) = self.direct_claim(h) {
                direct.insert(procs[*i].pid, (ti, leaf(list), label));
                if let Some((l, label)) = self.passes_on(ti, h) {
                    ancestors_for.insert(procs[*i].pid, (ti, leaf(l), label));
                }
            }
        }
        // Without a claim that passes on (no `descendants` rule matched anything) no process
        // inherits one: only those that matched are looked at, and there is no walk up the
        // ancestors (a map of every process, and a few lookups each, in every rescan).
        let by_pid: HashMap<u32, &ProcInfo> = if ancestors_for.is_empty() {
            HashMap::new()
        } else {
            procs.iter().map(|p| (p.pid, p)).collect()
        };
        let no_hits = &Hits::default();
        let candidates: Box<dyn Iterator<Item = (&ProcInfo, &Hits)>> = if ancestors_for.is_empty() {
            Box::new(hits.iter().map(|(i, h)| (&procs[*i], h)))
        } else {
            let mut hits = hits.iter().peekable();
            Box::new(procs.iter().enumerate().map(move |(i, p)| {
                let h = hits.next_if(|(at, _)| *at == i).map_or(no_hits, |(_, h)| h);
                (p, h)
            }))
        };
        let mut out = Vec::new();
        for (p, h) in candidates {
            // The nearest-claiming ancestor that passes its tenant on, if any.
            let mut inherited: Option<(usize, Leaf, String)> = None;
            let mut cur = p.ppid;
            let mut hops = 0;
            while cur > 1 && hops < 4096 && !ancestors_for.is_empty() {
                if let Some((ti, l, label)) = ancestors_for.get(&cur) {
                    if inherited.as_ref().is_none_or(|(best, _, _)| ti < best) {
                        inherited = Some((*ti, *l, format!("descendant of {cur} ({label})")));
                    }
                }
                match by_pid.get(&cur) {
                    Some(parent) => cur = parent.ppid,
                    None => break,
                }
                hops += 1;
            }
            let own = direct.get(&p.pid);
            let chosen = match (own, inherited) {
                // an earlier tenant claims it through an ancestor; that tenant's exempt rules apply
                (Some((ti, _, _)), Some((ai, al, alabel))) if ai < *ti => {
                    Some((ai, al.max(leaf_within(self, ai, h)), alabel))
                }
                // within one tenant, exempt wins: also when it comes through an ancestor
                (Some((ti, Leaf::Limited, _)), Some((ai, Leaf::Exempt, alabel))) if ai == *ti => {
                    Some((ai, Leaf::Exempt, alabel))
                }
                (Some((ti, leaf, label)), _) => Some((*ti, *leaf, label.to_string())),
                (None, Some((ai, al, alabel))) => {
                    Some((ai, al.max(leaf_within(self, ai, h)), alabel))
                }
                (None, None) => None,
            };
            if let Some((tenant, leaf, reason)) = chosen {
                out.push(Placement {
                    pid: p.pid,
                    tenant,
                    leaf,
                    reason,
                });
            }
        }
        out
    }
}

/// A descendant lands in `exempt` if it matches one of the tenant's exempt rules.
fn leaf_within(set: &RuleSet, tenant: usize, hits: &Hits) -> Leaf {
    if set.exempt_within(tenant, hits) {
        Leaf::Exempt
    } else {
        Leaf::Limited
    }
}

#[cfg(test)]
mod tests;
