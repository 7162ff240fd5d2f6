//! Which tenant, and which leaf, each process belongs to. Pure: processes and rules in, decisions
//! out, so the daemon, `apply` and `status -v` share one answer.
//!
//! Order of precedence: a process goes to the first tenant in file order that claims it, either
//! directly (a `match` or `exempt` rule) or as a descendant of a process matched by a rule with
//! `descendants = true`. Within the tenant, an `exempt` rule wins over `match`: such a process
//! lives in the `exempt` leaf, under the tenant's cpu and memory limits but free of its IO limits.

pub mod connector;

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
    }
}

/// The direct claim of one tenant on a process: (leaf, rule).
/// `within_tenant` exempt rules claim nothing by themselves (see `leaf_within`).
fn direct_claim<'a>(t: &'a Tenant, p: &ProcInfo) -> Option<(Leaf, &'a Rule)> {
    if let Some(r) = t.exempt.iter().find(|r| !r.within_tenant && r.matches(p)) {
        return Some((Leaf::Exempt, r));
    }
    t.rules
        .iter()
        .find(|r| r.matches(p))
        .map(|r| (Leaf::Limited, r))
}

/// The process fields the tenants' rules look at (see `procs::Fields`).
pub fn fields_needed(tenants: &[Tenant]) -> crate::inventory::procs::Fields {
    crate::inventory::procs::Fields::needed_by(tenants)
}

/// The placement of one process by direct rules only (no descendant claims): the daemon's fast
/// path when no rule passes a tenant on to descendants. Same precedence as `classify`.
pub fn classify_direct(tenants: &[Tenant], p: &ProcInfo) -> Option<Placement> {
    tenants.iter().enumerate().find_map(|(ti, t)| {
        direct_claim(t, p).map(|(leaf, rule)| Placement {
            pid: p.pid,
            tenant: ti,
            leaf,
            reason: rule.label.clone(),
        })
    })
}

/// Claims of every tenant on one process, in tenant order (for overlap warnings).
pub fn claims(tenants: &[Tenant], p: &ProcInfo) -> Vec<usize> {
    tenants
        .iter()
        .enumerate()
        .filter(|(_, t)| direct_claim(t, p).is_some())
        .map(|(i, _)| i)
        .collect()
}

/// Classifies every process. Processes no tenant claims are absent from the result.
pub fn classify(tenants: &[Tenant], procs: &[ProcInfo]) -> Vec<Placement> {
    let by_pid: HashMap<u32, &ProcInfo> = procs.iter().map(|p| (p.pid, p)).collect();
    // Direct claims, and which processes pass their tenant on to descendants.
    let mut direct: HashMap<u32, (usize, Leaf, String)> = HashMap::new();
    // (tenant, leaf its descendants get at least, label); an exempt rule passes on `exempt`
    let mut ancestors_for: HashMap<u32, (usize, Leaf, String)> = HashMap::new();
    for p in procs {
        for (ti, t) in tenants.iter().enumerate() {
            if let Some((leaf, rule)) = direct_claim(t, p) {
                direct.insert(p.pid, (ti, leaf, rule.label.clone()));
                let exempt = t.exempt.iter().find(|r| r.descendants && r.matches(p));
                let limited = t.rules.iter().find(|r| r.descendants && r.matches(p));
                if let Some((l, r)) = exempt
                    .map(|r| (Leaf::Exempt, r))
                    .or(limited.map(|r| (Leaf::Limited, r)))
                {
                    ancestors_for.insert(p.pid, (ti, l, r.label.clone()));
                }
                break;
            }
        }
    }
    let mut out = Vec::new();
    for p in procs {
        // The nearest-claiming ancestor that passes its tenant on, if any.
        let mut inherited: Option<(usize, Leaf, String)> = None;
        let mut cur = p.ppid;
        let mut hops = 0;
        while cur > 1 && hops < 4096 {
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
                Some((ai, al.max(leaf_within(&tenants[ai], p)), alabel))
            }
            // within one tenant, exempt wins: also when it comes through an ancestor
            (Some((ti, Leaf::Limited, _)), Some((ai, Leaf::Exempt, alabel))) if ai == *ti => {
                Some((ai, Leaf::Exempt, alabel))
            }
            (Some((ti, leaf, label)), _) => Some((*ti, *leaf, label.clone())),
            (None, Some((ai, al, alabel))) => {
                Some((ai, al.max(leaf_within(&tenants[ai], p)), alabel))
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

/// A descendant lands in `exempt` if it matches one of the tenant's exempt rules.
fn leaf_within(t: &Tenant, p: &ProcInfo) -> Leaf {
    if t.exempt.iter().any(|r| r.matches(p)) {
        Leaf::Exempt
    } else {
        Leaf::Limited
    }
}

#[cfg(test)]
mod tests;
