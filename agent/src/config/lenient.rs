//! Deserializers that take what YAML or the environment may type differently: numbers or
//! booleans where a string is meant, a comma-separated string where a list or a map is
//! meant.

use super::*;

/// Strings that YAML or the environment may have typed as numbers or booleans
/// (`tor_id: 1`) are taken as their text.
pub(super) fn lenient_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    d.deserialize_any(LenientString)
}

pub(super) struct LenientString;

impl<'de> serde::de::Visitor<'de> for LenientString {
    type Value = String;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<String, E> {
        Ok(String::new())
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<String, E> {
        Ok(String::new())
    }
}

/// A list given as a sequence, or as one comma-separated string (env: `a,b`).
pub(super) fn string_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    d.deserialize_any(StringList)
}

pub(super) struct StringList;

impl<'de> serde::de::Visitor<'de> for StringList {
    type Value = Vec<String>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of strings or a comma-separated string")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Vec<String>, E> {
        Ok(v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Vec<String>, E> {
        Ok(Vec::new())
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Vec<String>, E> {
        Ok(Vec::new())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
        struct Item(String);
        impl<'de> Deserialize<'de> for Item {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                lenient_string(d).map(Item)
            }
        }
        let mut out = Vec::new();
        while let Some(Item(s)) = seq.next_element()? {
            let s = s.trim().to_string();
            if !s.is_empty() {
                out.push(s);
            }
        }
        Ok(out)
    }
}

/// A map given as a mapping, or as one `key=value,key=value` string (env, CLI).
pub(super) fn string_map<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<std::collections::BTreeMap<String, String>, D::Error> {
    d.deserialize_any(StringMap)
}

pub(super) struct StringMap;

impl<'de> serde::de::Visitor<'de> for StringMap {
    type Value = std::collections::BTreeMap<String, String>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a mapping of strings or a `key=value,key=value` string")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        let mut out = std::collections::BTreeMap::new();
        for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, val) = item
                .split_once('=')
                .ok_or_else(|| E::custom(format!("{item:?} is not key=value")))?;
            out.insert(k.trim().to_string(), val.trim().to_string());
        }
        Ok(out)
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Default::default())
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Default::default())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
        struct Item(String);
        impl<'de> Deserialize<'de> for Item {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                lenient_string(d).map(Item)
            }
        }
        let mut out = std::collections::BTreeMap::new();
        while let Some((Item(k), Item(v))) = m.next_entry()? {
            out.insert(k.trim().to_string(), v.trim().to_string());
        }
        Ok(out)
    }
}
