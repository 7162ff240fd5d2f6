//! Rules of two tenants that take the same processes, found without comparing every pair.
//!
//! The first tenant in file order wins a process both match, so a rule of a later tenant that
//! repeats an earlier tenant's rule can never take anything (an error), and one that an earlier
//! tenant's broader rule covers takes nothing either (a warning, since `check` can prove only
//! the cases `shadows` knows, not every regex's).
//!
//! A broad rule can cover a narrow one only if every field it sets, the narrow one sets too, to
//! the same value (exe, user, group, pid file, systemd unit) or to a regex it implies. So the
//! broad side is indexed by which fields a rule sets and by the values of its plain fields (a
//! *bucket*), and within a bucket by the text of one regex field and, for implication, by one
//! `RegexSet` over the bucket's patterns that may imply others; each narrow rule then looks up
//! the buckets of the subsets of its own fields (at most 128). What the proof needs of a pattern
//! comes from the parse that validated it (`PatternShape`). Comparing every pair (and parsing
//! both regexes per pair) cost `dbcage check` 14 s of CPU (release build; 190 s in a debug one)
//! for 1,000 tenants of two rules each; the whole check now takes 0.11 s.

use std::cell::OnceCell;
use std::collections::{HashMap, HashSet};
use std::path::Path;

use regex::{Regex, RegexSet, RegexSetBuilder};

use super::super::{Pattern, PatternShape, Problem, Rule, Tenant};
use super::Ctx;

const EXE: u8 = 1;
const UID: u8 = 2;
const GID: u8 = 4;
const PIDFILE: u8 = 8;
const CMDLINE: u8 = 16;
const COMM: u8 = 32;
const UNIT: u8 = 64;

/// The fields `r` sets.
fn fields(r: &Rule) -> u8 {
    [
        (r.exe.is_some(), EXE),
        (r.uid.is_some(), UID),
        (r.gid.is_some(), GID),
        (r.pidfile.is_some(), PIDFILE),
        (r.cmdline.is_some(), CMDLINE),
        (r.comm.is_some(), COMM),
        (r.unit.is_some(), UNIT),
    ]
    .iter()
    .filter(|(set, _)| *set)
    .fold(0, |acc, (_, bit)| acc | bit)
}

/// Which fields a rule sets and the values of its plain (non-regex) ones, restricted to `mask`:
/// a broad rule covers a narrow one only if they agree on this for the broad rule's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct BucketKey<'a> {
    mask: u8,
    exe: Option<&'a Path>,
    uid: Option<u32>,
    gid: Option<u32>,
    pidfile: Option<&'a Path>,
    /// A `unit =` as written (a glob is compared by its text).
    unit: Option<&'a str>,
}

impl<'a> BucketKey<'a> {
    fn of(r: &'a Rule, mask: u8) -> BucketKey<'a> {
        BucketKey {
            mask,
            exe: r.exe.as_deref().filter(|_| mask & EXE != 0),
            uid: r.uid.filter(|_| mask & UID != 0),
            gid: r.gid.filter(|_| mask & GID != 0),
            pidfile: r
                .pidfile
                .as_ref()
                .map(|f| f.path.as_path())
                .filter(|_| mask & PIDFILE != 0),
            unit: r
                .unit
                .as_ref()
                .map(|u| u.as_str())
                .filter(|_| mask & UNIT != 0),
        }
    }
}

/// The regex field a bucket is indexed by: cmdline when its rules set one, else comm.
fn indexed_field(mask: u8) -> Option<fn(&Rule) -> Option<&Pattern>> {
    if mask & CMDLINE != 0 {
        Some(|r| r.cmdline.as_ref())
    } else if mask & COMM != 0 {
        Some(|r| r.comm.as_ref())
    } else {
        None
    }
}

/// True when every text `narrow` matches is matched by `broad`, proven this way: `narrow` is
/// anchored at the start, so every text it matches begins with one of its literal prefixes
/// (`^postgres: walwriter` → `postgres: walwriter`); `broad` has no end anchor or word boundary,
/// so a match inside a prefix is a match inside any text that begins with it. False means
/// "not proven", not "disjoint".
#[cfg(test)]
pub(super) fn regex_implies(broad: &Pattern, narrow: &Pattern) -> bool {
    let mut regexes = Regexes::default();
    implies(broad.shape(), narrow.shape(), |s| {
        regexes.is_match(broad.as_str(), s)
    })
}

fn implies(
    broad: &PatternShape,
    narrow: &PatternShape,
    mut broad_matches: impl FnMut(&str) -> bool,
) -> bool {
    broad.may_imply
        && narrow
            .prefixes
            .as_ref()
            .is_some_and(|lits| lits.iter().all(|s| broad_matches(s)))
}

/// Regexes compiled for this check only (the policy's `Pattern`s stay uncompiled).
#[derive(Default)]
struct Regexes(HashMap<String, Option<Regex>>);

impl Regexes {
    fn is_match(&mut self, pattern: &str, text: &str) -> bool {
        self.0
            .entry(pattern.to_string())
            .or_insert_with(|| Regex::new(pattern).ok())
            .as_ref()
            .is_some_and(|re| re.is_match(text))
    }
}

/// The broad rules that agree on a `BucketKey`.
struct Bucket {
    /// Entries (indices into `Index::entries`), in precedence order.
    members: Vec<usize>,
    /// By the text of the indexed regex field (empty when the bucket has none).
    by_text: HashMap<String, Vec<usize>>,
    /// The members whose indexed pattern may imply another, and those patterns as one set
    /// (built when a narrow rule first asks; None if it cannot be built: then each is tried).
    implying: Vec<usize>,
    set: OnceCell<Option<RegexSet>>,
}

/// A pattern set over a thousand tenants' patterns is far larger than one regex: the ruleset's
/// limit.
const SET_SIZE_LIMIT: usize = 512 << 20;

struct Entry<'a> {
    tenant: usize,
    /// Position in the tenant's `rules` then `exempt` (the order pairs are reported in).
    pos: usize,
    rule: &'a Rule,
}

struct Index<'a> {
    entries: Vec<Entry<'a>>,
    buckets: HashMap<BucketKey<'a>, Bucket>,
    regexes: Regexes,
}

impl<'a> Index<'a> {
    fn new(tenants: &'a [Tenant]) -> Index<'a> {
        let mut entries = Vec::new();
        let mut buckets: HashMap<BucketKey, Bucket> = HashMap::new();
        for (tenant, t) in tenants.iter().enumerate() {
            for (pos, rule) in t.rules.iter().chain(&t.exempt).enumerate() {
                // `within_tenant` rules claim nothing: they neither cover nor repeat another.
                if rule.within_tenant {
                    continue;
                }
                let e = entries.len();
                entries.push(Entry { tenant, pos, rule });
                let mask = fields(rule);
                let bucket = buckets
                    .entry(BucketKey::of(rule, mask))
                    .or_insert_with(|| Bucket {
                        members: Vec::new(),
                        by_text: HashMap::new(),
                        implying: Vec::new(),
                        set: OnceCell::new(),
                    });
                bucket.members.push(e);
                if let Some(p) = indexed_field(mask).and_then(|f| f(rule)) {
                    bucket
                        .by_text
                        .entry(p.as_str().to_string())
                        .or_default()
                        .push(e);
                    if p.shape().may_imply {
                        bucket.implying.push(e);
                    }
                }
            }
        }
        Index {
            entries,
            buckets,
            regexes: Regexes::default(),
        }
    }

    /// The entries of earlier tenants that may repeat or cover entry `n` (a superset: each is
    /// then checked field by field).
    fn candidates(&self, n: usize) -> Vec<usize> {
        let narrow = self.entries[n].rule;
        let own = fields(narrow);
        let mut out = Vec::new();
        // Every subset of the narrow rule's fields, itself and the empty set included.
        let mut mask = own;
        loop {
            if let Some(b) = self.buckets.get(&BucketKey::of(narrow, mask)) {
                match indexed_field(mask) {
                    None => out.extend(&b.members),
                    Some(field) => {
                        let p = field(narrow).expect("the mask is a subset of its fields");
                        out.extend(b.by_text.get(p.as_str()).into_iter().flatten());
                        if let Some(lits) = &p.shape().prefixes {
                            out.extend(self.implying(b, field, lits));
                        }
                    }
                }
            }
            if mask == 0 {
                break;
            }
            mask = (mask - 1) & own;
        }
        let tenant = self.entries[n].tenant;
        out.retain(|&b| self.entries[b].tenant < tenant);
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The members of `b` whose indexed pattern matches every one of `lits`.
    fn implying(
        &self,
        b: &Bucket,
        field: fn(&Rule) -> Option<&Pattern>,
        lits: &[String],
    ) -> Vec<usize> {
        if b.implying.is_empty() {
            return Vec::new();
        }
        let pattern = |e: usize| field(self.entries[e].rule).map_or("", |p| p.as_str());
        let set = b.set.get_or_init(|| {
            RegexSetBuilder::new(b.implying.iter().map(|&e| pattern(e)))
                .size_limit(SET_SIZE_LIMIT)
                .build()
                .ok()
        });
        let Some(set) = set else {
            // Too large for one set: these few are checked one by one in `check`.
            return b.implying.clone();
        };
        let mut hit = vec![true; b.implying.len()];
        for lit in lits {
            let m = set.matches(lit);
            for (i, h) in hit.iter_mut().enumerate() {
                *h &= m.matched(i);
            }
        }
        b.implying
            .iter()
            .zip(hit)
            .filter(|(_, h)| *h)
            .map(|(&e, _)| e)
            .collect()
    }

    /// Whether every process `narrow` matches is matched by `broad` too (a sufficient test:
    /// each field `broad` sets, `narrow` sets to the same value or, for a regex, to one
    /// `implies` proves narrower).
    fn shadows(&mut self, broad: &Rule, narrow: &Rule) -> bool {
        fn same<T: PartialEq>(b: &Option<T>, n: &Option<T>) -> bool {
            b.is_none() || (n.is_some() && b == n)
        }
        if !(same(&broad.exe, &narrow.exe)
            && same(&broad.uid, &narrow.uid)
            && same(&broad.gid, &narrow.gid)
            && same(
                &broad.pidfile.as_ref().map(|f| &f.path),
                &narrow.pidfile.as_ref().map(|f| &f.path),
            )
            && same(
                &broad.unit.as_ref().map(|u| u.as_str()),
                &narrow.unit.as_ref().map(|u| u.as_str()),
            ))
        {
            return false;
        }
        [
            (&broad.cmdline, &narrow.cmdline),
            (&broad.comm, &narrow.comm),
        ]
        .into_iter()
        .all(|(b, n)| match (b, n) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(b), Some(n)) => {
                b.as_str() == n.as_str()
                    || implies(b.shape(), n.shape(), |s| {
                        self.regexes.is_match(b.as_str(), s)
                    })
            }
        })
    }
}

/// Whether `a` and `b` are the same rule: every field alike.
fn same_rule(a: &Rule, b: &Rule) -> bool {
    a.pidfile.as_ref().map(|f| &f.path) == b.pidfile.as_ref().map(|f| &f.path)
        && a.cmdline.as_ref().map(Pattern::as_str) == b.cmdline.as_ref().map(Pattern::as_str)
        && a.comm.as_ref().map(Pattern::as_str) == b.comm.as_ref().map(Pattern::as_str)
        && a.exe == b.exe
        && a.uid == b.uid
        && a.gid == b.gid
}

/// Repeated rules (errors, one per pair of tenants) and covered rules (warnings), in tenant
/// pair order and within a pair in rule order. Pairs in `reported` (tenants that name the same
/// instance, reported once already) are skipped.
pub(super) fn check_overlaps(ctx: &mut Ctx, tenants: &[Tenant], reported: &[(String, String)]) {
    let reported: HashSet<(&str, &str)> = reported
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let mut index = Index::new(tenants);
    // (broad tenant, narrow tenant, broad pos, narrow pos, broad entry, narrow entry, repeated)
    let mut found = Vec::new();
    for n in 0..index.entries.len() {
        for b in index.candidates(n) {
            let (broad, narrow) = (&index.entries[b], &index.entries[n]);
            let pair = (
                tenants[broad.tenant].name.as_str(),
                tenants[narrow.tenant].name.as_str(),
            );
            if reported.contains(&pair) {
                continue;
            }
            let key = (broad.tenant, narrow.tenant, broad.pos, narrow.pos, b, n);
            let (br, nr) = (broad.rule, narrow.rule);
            if same_rule(br, nr) {
                found.push((key, true));
            } else if index.shadows(br, nr) {
                found.push((key, false));
            }
        }
    }
    found.sort_unstable();
    let mut repeated: Vec<(&Rule, &Rule)> = Vec::new();
    for (i, &((ta, tb, _, _, b, n), is_repeat)) in found.iter().enumerate() {
        let (a, bt) = (&tenants[ta], &tenants[tb]);
        let (ra, rb) = (index.entries[b].rule, index.entries[n].rule);
        if is_repeat {
            repeated.push((ra, rb));
        } else {
            ctx.warnings.push(Problem::at(&rb.origin, format!(
                "rule `{}` of tenant `{}` is covered by rule `{}` of tenant `{}` ({}): every process it matches matches that rule too and goes to `{}`, the first in file order, so this rule takes nothing",
                rb.label, bt.name, ra.label, a.name, ra.origin, a.name
            )));
        }
        let last_of_pair = found
            .get(i + 1)
            .is_none_or(|&((na, nb, ..), _)| (na, nb) != (ta, tb));
        if last_of_pair && !repeated.is_empty() {
            report_repeated(ctx, a, bt, &repeated);
            repeated.clear();
        }
    }
}

/// One error for the rules tenant `b` repeats of tenant `a`.
fn report_repeated(ctx: &mut Ctx, a: &Tenant, b: &Tenant, repeated: &[(&Rule, &Rule)]) {
    let (ra, rb) = repeated[0];
    let labels: Vec<&str> = repeated.iter().map(|(_, rb)| rb.label.as_str()).collect();
    let n = repeated.len();
    ctx.problems.push(Problem::at(&rb.origin, format!(
        "tenant `{}` repeats {} of tenant `{}` ({}{}): `{}`; a process matching {} goes to `{}`, the first in file order, so `{}` never gets it; remove {} from one tenant",
        b.name,
        if n == 1 { "a rule".to_string() } else { format!("{n} rules") },
        a.name,
        ra.origin,
        if n == 1 { "" } else { " and on" },
        labels.join("`, `"),
        if n == 1 { "it" } else { "them" },
        a.name,
        b.name,
        if n == 1 { "it" } else { "them" },
    )));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::source::SourceMap;
    use crate::policy::FakeAccounts;
    use proptest::prelude::*;

    /// The check as issue 21 wrote it: every pair of rules of every pair of tenants.
    fn check_overlaps_pairwise(ctx: &mut Ctx, tenants: &[Tenant]) {
        fn shadows(broad: &Rule, narrow: &Rule) -> bool {
            fn same<T: PartialEq>(b: &Option<T>, n: &Option<T>) -> bool {
                b.is_none() || (n.is_some() && b == n)
            }
            let re = |b: &Option<Pattern>, n: &Option<Pattern>| match (b, n) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(b), Some(n)) => b.as_str() == n.as_str() || regex_implies(b, n),
            };
            same(&broad.exe, &narrow.exe)
                && same(&broad.uid, &narrow.uid)
                && same(&broad.gid, &narrow.gid)
                && same(
                    &broad.pidfile.as_ref().map(|f| &f.path),
                    &narrow.pidfile.as_ref().map(|f| &f.path),
                )
                && re(&broad.cmdline, &narrow.cmdline)
                && re(&broad.comm, &narrow.comm)
        }
        for (i, a) in tenants.iter().enumerate() {
            for b in &tenants[i + 1..] {
                let mut repeated = Vec::new();
                for ra in a.rules.iter().chain(&a.exempt) {
                    for rb in b.rules.iter().chain(&b.exempt) {
                        if ra.within_tenant || rb.within_tenant {
                            continue;
                        }
                        if same_rule(ra, rb) {
                            repeated.push((ra, rb));
                        } else if shadows(ra, rb) {
                            ctx.warnings.push(Problem::at(&rb.origin, format!(
                                "rule `{}` of tenant `{}` is covered by rule `{}` of tenant `{}` ({}): every process it matches matches that rule too and goes to `{}`, the first in file order, so this rule takes nothing",
                                rb.label, b.name, ra.label, a.name, ra.origin, a.name
                            )));
                        }
                    }
                }
                if !repeated.is_empty() {
                    report_repeated(ctx, a, b, &repeated);
                }
            }
        }
    }

    const CMDLINES: &[&str] = &[
        "^postgres",
        "^postgres: walwriter",
        "^postgres: (walwriter|walsender)",
        "walwriter",
        "wal\\b",
        "^ora_p[0-9a-z]{3}_BX1( |$)",
        "^ora_",
        "^ora_pmon_BX1",
        "^mysqld$",
        "postgres: .*",
    ];
    const COMMS: &[&str] = &["^ora", "^ora_pmon", "^pg$", "postgres", "^postgres"];
    const USERS: &[&str] = &["postgres", "oracle", "54321"];

    /// One rule as TOML: each field is absent (0) or one of its pool's values.
    fn rule_toml(c: usize, m: usize, u: usize, e: usize, exempt_within: bool) -> String {
        let mut parts = Vec::new();
        if c > 0 {
            parts.push(format!("cmdline = '{}'", CMDLINES[c - 1]));
        }
        if m > 0 {
            parts.push(format!("comm = '{}'", COMMS[m - 1]));
        }
        if u > 0 {
            let u = USERS[u - 1];
            parts.push(match u.parse::<u32>() {
                Ok(n) => format!("user = {n}"),
                Err(_) => format!("user = \"{u}\""),
            });
        }
        if e > 0 {
            parts.push(format!("exe = \"/usr/bin/db{e}\""));
        }
        if parts.is_empty() {
            parts.push("comm = '^x'".into());
        }
        if exempt_within {
            parts.push("within_tenant = true".into());
        }
        format!("{{ {} }}", parts.join(", "))
    }

    type RuleSpec = (usize, usize, usize, usize, bool, bool);

    fn tenants_of(spec: &[Vec<RuleSpec>]) -> Vec<Tenant> {
        // Each tenant read alone (two tenants' repeated rules would fail the read), so that
        // both checks see exactly the same tenants.
        spec.iter()
            .enumerate()
            .map(|(i, rules)| {
                let (exempt, matching): (Vec<_>, Vec<_>) = rules.iter().partition(|r| r.4);
                let list = |rs: &[&RuleSpec], within: bool| {
                    rs.iter()
                        .map(|&&(c, m, u, e, _, w)| rule_toml(c, m, u, e, within && w))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let text = format!(
                    "[[tenant]]\nname = \"t{i}\"\nmatch = [{}]\nexempt = [{}]\n",
                    list(&matching, false),
                    list(&exempt, true)
                );
                let l = crate::policy::from_str(&format!("t{i}.toml"), &text, &FakeAccounts)
                    .unwrap_or_else(|e| panic!("{text}\n{e}"));
                std::sync::Arc::unwrap_or_clone(l.policy)
                    .tenants
                    .into_iter()
                    .next()
                    .unwrap()
            })
            .collect()
    }

    fn outcome(check: impl FnOnce(&mut Ctx)) -> (Vec<String>, Vec<String>) {
        let map = SourceMap::default();
        let mut ctx = Ctx {
            map: &map,
            accounts: &FakeAccounts,
            problems: Vec::new(),
            warnings: Vec::new(),
        };
        check(&mut ctx);
        let text = |v: &[Problem]| v.iter().map(|p| p.to_string()).collect();
        (text(&ctx.problems), text(&ctx.warnings))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The indexed check reports exactly what comparing every pair reported, in the same
        /// order.
        #[test]
        fn indexed_check_reports_what_the_pairwise_check_did(
            spec in proptest::collection::vec(
                proptest::collection::vec(
                    (0..=CMDLINES.len(), 0..=COMMS.len(), 0..=USERS.len(), 0..=2usize,
                     any::<bool>(), any::<bool>()),
                    1..4),
                2..7)
        ) {
            let tenants = tenants_of(&spec);
            let indexed = outcome(|ctx| check_overlaps(ctx, &tenants, &[]));
            let pairwise = outcome(|ctx| check_overlaps_pairwise(ctx, &tenants));
            prop_assert_eq!(indexed, pairwise);
        }
    }

    /// The pools above make overlaps of every kind: the property is not vacuous.
    #[test]
    fn the_pools_make_repeats_and_covers() {
        let spec = vec![
            vec![(1, 0, 0, 0, false, false), (0, 1, 2, 0, false, false)],
            vec![(2, 0, 1, 0, false, false), (0, 1, 2, 0, false, false)],
            vec![(0, 2, 3, 0, false, false), (7, 0, 0, 0, true, true)],
        ];
        let (problems, warnings) = outcome(|ctx| check_overlaps(ctx, &tenants_of(&spec), &[]));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("tenant `t1` repeats a rule of tenant `t0`"));
        // t2's rule is covered by t0's and by t1's (which repeats t0's)
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings[0].contains("`match[0] cmdline=~^postgres: walwriter user=postgres` of tenant `t1` is covered by rule `match[0] cmdline=~^postgres` of tenant `t0`"), "{warnings:?}");
        assert!(warnings[1].contains("`match[0] comm=~^ora_pmon user=54321` of tenant `t2` is covered by rule `match[1] comm=~^ora user=oracle` of tenant `t0`"), "{warnings:?}");
    }
}
