//! Database presets: `preset = "<name>"` plus the few facts that preset needs (a data directory,
//! a SID, ...) stand for the match rules, exempt rules and storage paths a DBA would otherwise
//! write by hand.
//!
//! Expansion happens on the raw tenant, before validation, so what a preset adds goes through
//! exactly the checks a hand-written rule does, and every value it adds is located at the
//! tenant's `preset` key (errors point there). The preset's rules come first, in the order the
//! preset documents; rules the user writes in `match`/`exempt` are added after them, and storage
//! the user lists is added to the preset's.

mod postgres;

use super::raw::{RawRule, RawTenant};
use super::source::Loc;

/// What a preset contributes to its tenant.
#[derive(Debug, Default)]
pub struct Expansion {
    pub rules: Vec<RawRule>,
    pub exempt: Vec<RawRule>,
    pub storage: Vec<String>,
}

/// The presets dbcage knows, by name: each reads its own keys from the raw tenant and returns
/// what it adds, or the problems it found (located at the offending key).
type Expander = fn(&RawTenant, &Loc<String>) -> Result<Expansion, Vec<Loc<String>>>;

const PRESETS: &[(&str, Expander)] = &[("postgres", postgres::expand)];

/// Expands the tenant's preset in place; returns the problems (message as the value, located
/// where they are). A tenant without `preset` is left as it is.
pub fn expand(t: &mut RawTenant) -> Vec<Loc<String>> {
    let Some(key) = t.preset.clone() else {
        // A preset's own keys mean nothing without it.
        return [("data_dir", &t.data_dir), ("wal", &t.wal)]
            .into_iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
            .map(|(k, v)| {
                v.here(format!(
                    "tenant `{}`: `{k}` is read by a preset (`preset = \"postgres\"`), and this tenant has none",
                    t.name.value
                ))
            })
            .collect();
    };
    let Some((_, expander)) = PRESETS.iter().find(|(name, _)| *name == key.value) else {
        let known: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
        return vec![key.here(format!(
            "tenant `{}`: unknown preset `{}`; known presets: {}",
            t.name.value,
            key.value,
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ))];
    };
    match expander(t, &key) {
        Ok(e) => {
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
    }
}
