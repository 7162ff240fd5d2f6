//! Database presets: `preset = "<name>"` plus the few facts that preset needs (a data directory,
//! a SID, ...) stand for the match rules, exempt rules and storage paths a DBA would otherwise
//! write by hand.
//!
//! Expansion happens on the raw tenant, before validation, so what a preset adds goes through
//! exactly the checks a hand-written rule does, and every value it adds is located at the
//! tenant's `preset` key (errors point there). The preset's rules come first, in the order the
//! preset documents; rules the user writes in `match`/`exempt` are added after them, and storage
//! the user lists is added to the preset's.

mod mysql;
mod oracle;
mod postgres;

use super::raw::{RawRule, RawTenant};
use super::source::Loc;

/// What a preset contributes to its tenant.
#[derive(Debug, Default)]
pub struct Expansion {
    pub rules: Vec<RawRule>,
    pub exempt: Vec<RawRule>,
    pub storage: Vec<String>,
    /// Names of `rules` then `exempt`, in order, for `preset_omit` (a preset that names none
    /// leaves this empty, and then none of its rules can be omitted).
    pub names: Vec<&'static str>,
}

impl Expansion {
    /// Adds a named match rule (one `preset_omit` can remove).
    pub fn named_rule(&mut self, name: &'static str, mut r: RawRule) {
        r.preset_name = Some(name);
        self.rules.push(r);
        self.names.insert(self.rules.len() - 1, name);
    }
    /// Adds a named exempt rule.
    pub fn named_exempt(&mut self, name: &'static str, mut r: RawRule) {
        r.preset_name = Some(name);
        self.exempt.push(r);
        self.names.push(name);
    }

    /// Drops the rules `omit` names; returns the names that are not the preset's.
    fn omit(&mut self, omit: &[String]) -> Vec<String> {
        let unknown = omit
            .iter()
            .filter(|o| !self.names.contains(&o.as_str()))
            .cloned()
            .collect();
        let n = self.rules.len();
        let keep = |i: usize| !omit.iter().any(|o| self.names.get(i) == Some(&o.as_str()));
        let rules = std::mem::take(&mut self.rules)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| keep(*i))
            .map(|(_, r)| r)
            .collect();
        let exempt = std::mem::take(&mut self.exempt)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| keep(n + i))
            .map(|(_, r)| r)
            .collect();
        self.rules = rules;
        self.exempt = exempt;
        unknown
    }
}

/// Each preset's own keys, so that a key set on a tenant with another preset (or none) is
/// reported instead of silently ignored.
type Keys = fn(&RawTenant) -> Vec<Loc<&'static str>>;

const PRESET_KEYS: &[(&str, Keys)] = &[
    ("oracle", oracle::keys),
    ("mysql", mysql::keys),
    ("postgres", postgres::keys),
];

/// The presets dbcage knows, by name: each reads its own keys from the raw tenant and returns
/// what it adds, or the problems it found (located at the offending key).
type Expander = fn(&RawTenant, &Loc<String>) -> Result<Expansion, Vec<Loc<String>>>;

const PRESETS: &[(&str, Expander)] = &[
    ("oracle", oracle::expand),
    ("mysql", mysql::expand),
    ("postgres", postgres::expand),
];

/// Expands the tenant's preset in place; returns the problems (message as the value, located
/// where they are). A tenant without `preset` is left as it is.
pub fn expand(t: &mut RawTenant) -> Vec<Loc<String>> {
    let known: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
    // An unknown preset is the one problem to report: the keys that belong to the preset the user
    // meant (`sid` under `preset = "oracel"`) are not stray, they wait for the typo's fix.
    let mut expander = None;
    if let Some(key) = &t.preset {
        expander = PRESETS
            .iter()
            .find(|(name, _)| *name == key.value)
            .map(|p| p.1);
        if expander.is_none() {
            let hint = match crate::policy::keys::nearest(&key.value, known.iter().copied()) {
                Some(n) => format!("; did you mean `{n}`?"),
                None => String::new(),
            };
            return vec![key.here(format!(
                "tenant `{}`: unknown preset `{}`{hint} (known presets: {})",
                t.name.value,
                key.value,
                known.join(", ")
            ))];
        }
    }
    let ro: &RawTenant = t;
    let active = ro.preset.as_ref().map(|p| p.value.as_str());
    let mut stray: Vec<Loc<String>> = PRESET_KEYS
        .iter()
        .filter(|(name, _)| Some(*name) != active)
        .flat_map(|(name, keys)| {
            keys(ro).into_iter().map(move |k| {
                k.here(format!(
                    "tenant `{}`: `{}` is a key of `preset = \"{name}\"`, which this tenant does not use",
                    ro.name.value, k.value
                ))
            })
        })
        .collect();
    let Some(key) = t.preset.clone() else {
        if let Some(o) = &t.preset_omit {
            stray.push(o.here(format!(
                "tenant `{}`: `preset_omit` needs a `preset`",
                t.name.value
            )));
        }
        return stray;
    };
    if !stray.is_empty() {
        return stray;
    }
    let Some(expander) = expander else {
        return Vec::new();
    };
    match expander(t, &key) {
        Ok(mut e) => {
            if let Some(omit) = &t.preset_omit {
                let unknown = e.omit(&omit.value);
                if !unknown.is_empty() {
                    return vec![omit.here(format!(
                        "tenant `{}`: preset_omit: `{}` is not a rule of preset `{}`; its rules are: {}",
                        t.name.value,
                        unknown.join("`, `"),
                        key.value,
                        if e.names.is_empty() { "none (unnamed)".to_string() } else { e.names.join(", ") }
                    ))];
                }
            }
            let at = |r: RawRule| key.here(r);
            let mut rules: Vec<Loc<RawRule>> = e.rules.into_iter().map(at).collect();
            rules.extend(t.rules.take().unwrap_or_default());
            let mut exempt: Vec<Loc<RawRule>> = e.exempt.into_iter().map(at).collect();
            exempt.extend(t.exempt.take().unwrap_or_default());
            let mut storage: Vec<Loc<String>> =
                e.storage.into_iter().map(|s| key.here(s)).collect();
            storage.extend(t.storage.take().unwrap_or_default());
            t.rules = Some(rules);
            t.exempt = Some(exempt);
            t.storage = (!storage.is_empty()).then_some(storage);
            Vec::new()
        }
        Err(problems) => problems,
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::FakeAccounts;

    #[test]
    fn unknown_preset_is_located_and_lists_the_known_ones() {
        let text = "[[tenant]]\nname = \"db\"\npreset = \"db2\"\n";
        let err = crate::policy::from_str("p.toml", text, &FakeAccounts).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("p.toml:3:10"), "{msg}");
        assert!(msg.contains("unknown preset `db2`"), "{msg}");
        assert!(
            msg.contains("known presets: oracle, mysql, postgres"),
            "{msg}"
        );
    }

    /// A preset's rules carry their names in their labels (what `plan`, `status -v` and the
    /// overlap messages show), not only their index.
    #[test]
    fn preset_rules_are_labelled_with_their_names() {
        let text = "[[tenant]]\nname = \"BX1\"\npreset = \"oracle\"\nsid = \"BX1\"\n";
        let l = crate::policy::from_str("p.toml", text, &FakeAccounts).unwrap();
        let t = &l.policy.tenants[0];
        assert!(
            t.rules[0]
                .label
                .starts_with("match[0] background: cmdline=~"),
            "{}",
            t.rules[0].label
        );
        assert!(
            t.rules[1].label.starts_with("match[1] foreground: "),
            "{}",
            t.rules[1].label
        );
        assert!(
            t.exempt[0].label.starts_with("exempt[0] log_writers: "),
            "{}",
            t.exempt[0].label
        );
    }

    /// `preset = "oracel"` with `sid`: one error, naming the bad preset, the nearest known one
    /// and all of them; `sid` is not called a key of a preset the tenant does not use.
    #[test]
    fn a_misspelt_preset_is_named_with_a_suggestion() {
        let text = "[[tenant]]\nname = \"DEMO\"\npreset = \"oracel\"\nsid = \"DEMO\"\n";
        let err = crate::policy::from_str("p.toml", text, &FakeAccounts).unwrap_err();
        assert_eq!(err.0.len(), 1, "{err}");
        let msg = err.0[0].to_string();
        assert!(msg.starts_with("p.toml:3:10: "), "{msg}");
        assert!(
            msg.contains("unknown preset `oracel`; did you mean `oracle`?"),
            "{msg}"
        );
        assert!(
            msg.contains("known presets: oracle, mysql, postgres"),
            "{msg}"
        );
        assert!(!msg.contains("does not use"), "{msg}");
    }
}
