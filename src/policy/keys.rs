//! Unknown keys, all of them in one pass, each with its nearest valid spelling.
//!
//! serde's `deny_unknown_fields` stops at the first unknown key of a file, so a file with several
//! typos needed one `check` per typo. Instead, the file is first read as a tree of located keys
//! and walked against the raw types' own field lists (taken from their `Deserialize` impls, so
//! they cannot drift from `raw`); every key that no type knows is reported, and the typed read
//! that follows ignores them. Nothing here sees values: types and units are `validate`'s.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::raw::{
    RawAgent, RawCpu, RawIo, RawIoDevice, RawMemory, RawReplication, RawRule, RawSchedule,
    RawTenant,
};
use super::source::Loc;

/// A TOML document reduced to what the walk needs: tables with located keys, and arrays.
#[derive(Debug)]
pub(super) enum Node {
    Table(Vec<(Loc<String>, Node)>),
    Array(Vec<Node>),
    /// A string keeps its text (a tenant's name says which tenant a typo is in).
    Scalar(Option<String>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Node;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any TOML value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
                Ok(Node::Scalar(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
                Ok(Node::Scalar(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
                Ok(Node::Scalar(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
                Ok(Node::Scalar(None))
            }
            fn visit_str<E>(self, s: &str) -> Result<Node, E> {
                Ok(Node::Scalar(Some(s.to_string())))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(n) = seq.next_element::<Node>()? {
                    items.push(n);
                }
                Ok(Node::Array(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(k) = map.next_key::<Loc<String>>()? {
                    let v = map.next_value::<Node>()?;
                    entries.push((k, v));
                }
                Ok(Node::Table(entries))
            }
        }
        d.deserialize_any(V)
    }
}

/// The field names a derived `Deserialize` asks for, read by a deserializer that only listens.
fn fields_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Listen(Option<&'static [&'static str]>);
    impl<'de> Deserializer<'de> for &mut Listen {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("listening only"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = Some(fields);
            Err(de::Error::custom("listening only"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }
    let mut l = Listen(None);
    let _ = T::deserialize(&mut l);
    l.0.unwrap_or(&[])
}

/// One table type of the policy: its keys, and the type of each key that holds a table (or an
/// array of tables).
#[derive(Clone, Copy)]
enum Schema {
    File,
    Agent,
    Tenant,
    Rule,
    Io,
    IoDevice,
    Cpu,
    Memory,
    Replication,
    Schedule,
}

impl Schema {
    fn keys(self) -> &'static [&'static str] {
        match self {
            Schema::File => &["agent", "tenant"],
            Schema::Agent => fields_of::<RawAgent>(),
            Schema::Tenant => fields_of::<RawTenant>(),
            Schema::Rule => fields_of::<RawRule>(),
            Schema::Io => fields_of::<RawIo>(),
            Schema::IoDevice => fields_of::<RawIoDevice>(),
            Schema::Cpu => fields_of::<RawCpu>(),
            Schema::Memory => fields_of::<RawMemory>(),
            Schema::Replication => fields_of::<RawReplication>(),
            Schema::Schedule => fields_of::<RawSchedule>(),
        }
    }

    fn child(self, key: &str) -> Option<Schema> {
        Some(match (self, key) {
            (Schema::File, "agent") => Schema::Agent,
            (Schema::File, "tenant") => Schema::Tenant,
            (Schema::Tenant, "match" | "exempt") => Schema::Rule,
            (Schema::Tenant | Schema::Schedule, "io") => Schema::Io,
            (Schema::Tenant | Schema::Schedule, "cpu") => Schema::Cpu,
            (Schema::Tenant | Schema::Schedule, "memory") => Schema::Memory,
            (Schema::Tenant, "replication") => Schema::Replication,
            (Schema::Tenant, "schedule") => Schema::Schedule,
            (Schema::Io, "device") => Schema::IoDevice,
            _ => return None,
        })
    }
}

/// The valid key nearest to `typo`, if one is close enough to be what was meant.
pub(crate) fn nearest<'a>(typo: &str, valid: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    valid
        .into_iter()
        .map(|v| (strsim::damerau_levenshtein(typo, v), v))
        .filter(|(d, v)| *d <= 2.max(v.len() / 4) && *d < v.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, v)| v)
}

/// Every unknown key of a file: `(where, message)`.
pub(super) fn unknown_keys(doc: &Node) -> Vec<(Loc<String>, String)> {
    let mut out = Vec::new();
    walk(doc, Schema::File, "", None, &mut out);
    out
}

fn walk(
    node: &Node,
    schema: Schema,
    path: &str,
    tenant: Option<&str>,
    out: &mut Vec<(Loc<String>, String)>,
) {
    let entries = match node {
        Node::Table(entries) => entries,
        Node::Array(items) => {
            for i in items {
                walk(i, schema, path, tenant, out);
            }
            return;
        }
        Node::Scalar(_) => return,
    };
    // A tenant's name, so that a typo in one of several tenants says which.
    let own_name = match schema {
        Schema::Tenant => entries
            .iter()
            .find_map(|(k, v)| match (k.value.as_str(), v) {
                ("name", Node::Scalar(Some(n))) => Some(n.as_str()),
                _ => None,
            }),
        _ => None,
    };
    let tenant = own_name.or(tenant);
    let valid = schema.keys();
    for (key, value) in entries {
        let k = key.value.as_str();
        if !valid.contains(&k) {
            let table = if path.is_empty() {
                "at the top level".to_string()
            } else {
                format!("in [{path}]")
            };
            let whose = tenant
                .map(|t| format!(" of tenant `{t}`"))
                .unwrap_or_default();
            let hint = match nearest(k, valid.iter().copied()) {
                Some(n) => format!("; did you mean `{n}`?"),
                None => String::new(),
            };
            out.push((
                key.clone(),
                format!(
                    "unknown key `{k}` {table}{whose}{hint} (valid keys: {})",
                    valid.join(", ")
                ),
            ));
            continue;
        }
        if let Some(child) = schema.child(k) {
            let child_path = if path.is_empty() {
                k.to_string()
            } else {
                format!("{path}.{k}")
            };
            walk(value, child, &child_path, tenant, out);
        }
    }
}
