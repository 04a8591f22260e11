//! Config keys declared once (rust-analyzer's config table is the model): each key is one
//! entry of a [`config_table!`] invocation, and from it follow
//!
//! - the config struct's field (its YAML key, serde attributes and doc),
//! - its default (the `Default` impl),
//! - its command-line flag (a `clap` field, kebab case, `Option` so unset flags do not
//!   override),
//! - its environment variable (`<PREFIX><KEY>` upper case; only listed keys are taken),
//! - its line in the generated docs ([`KeyDoc`]).
//!
//! The layering itself (defaults < YAML < environment < flags) stays with each binary,
//! which names its sources and words its errors; the pieces they share are here.

use figment::value::{Dict, Map, Value};
use figment::{Metadata, Profile, Provider};

/// One key as the docs show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDoc {
    pub key: &'static str,
    /// The default, as written in the declaration.
    pub default: &'static str,
    /// The declaration's doc comment, lines joined.
    pub doc: &'static str,
}

impl KeyDoc {
    /// `--key-name`.
    pub fn flag(&self) -> String {
        format!("--{}", self.key.replace('_', "-"))
    }

    /// `<PREFIX>KEY_NAME`.
    pub fn env(&self, prefix: &str) -> String {
        format!("{prefix}{}", self.key.to_ascii_uppercase())
    }
}

/// Declares a config struct, its `Default`, its clap flags struct, `KEYS` and `KEY_DOCS`
/// from one entry per key:
///
/// ```
/// use rpingmesh_config_table::config_table;
/// config_table! {
///     #[serde(default, deny_unknown_fields)]
///     pub struct AgentConfig;
///     #[command(name = "rpingmesh-agent")]
///     pub struct CliArgs;
///     keys {
///         /// How often each target is probed.
///         probe_interval_ms: u64 = 500, flag u64;
///         /// Local IPs, one pseudo-RNIC each.
///         #[arg(value_delimiter = ',')]
///         udp_addresses: Vec<String> = vec!["127.0.0.1".into()], flag Vec<String>;
///     }
/// }
/// assert_eq!(KEYS, &["probe_interval_ms", "udp_addresses"]);
/// assert_eq!(AgentConfig::default().probe_interval_ms, 500);
/// ```
///
/// `#[serde(..)]` attributes go to the config field, `#[arg(..)]` to the flag (which is
/// always `--key-name`, optional); the flag's type may differ (an enum is taken as text
/// and checked where the config is deserialized). `CliArgs` also gets `--config FILE`.
#[macro_export]
macro_rules! config_table {
    (
        $(#[$cfg_meta:meta])*
        pub struct $cfg:ident;
        $(#[$cli_meta:meta])*
        pub struct $cli:ident;
        keys {
            $(
                $(#[doc = $doc:literal])*
                $(#[serde($($serde:tt)*)])*
                $(#[arg($($arg:tt)*)])*
                $name:ident : $ty:ty = $default:expr, flag $fty:ty;
            )*
        }
    ) => {
        #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
        $(#[$cfg_meta])*
        pub struct $cfg {
            $(
                $(#[doc = $doc])*
                $(#[serde($($serde)*)])*
                pub $name: $ty,
            )*
        }

        impl Default for $cfg {
            fn default() -> Self {
                $cfg { $($name: $default,)* }
            }
        }

        /// Command-line flags: one optional kebab-case flag per key; unset flags do not
        /// override.
        #[derive(Debug, Default, Clone, clap::Parser, serde::Serialize)]
        $(#[$cli_meta])*
        pub struct $cli {
            /// YAML config file.
            #[arg(long)]
            #[serde(skip)]
            pub config: Option<std::path::PathBuf>,
            $(
                $(#[doc = $doc])*
                #[arg(long)]
                $(#[arg($($arg)*)])*
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $name: Option<$fty>,
            )*
        }

        /// Every key (YAML key = environment suffix = flag in kebab case).
        pub const KEYS: &[&str] = &[$(stringify!($name)),*];

        /// Every key with its default and doc, in declaration order.
        pub const KEY_DOCS: &[$crate::KeyDoc] = &[$(
            $crate::KeyDoc {
                key: stringify!($name),
                default: stringify!($default),
                doc: concat!($($doc, "\n"),*),
            }
        ),*];
    };
}

/// The `<prefix><KEY>` variables of known keys, typed as figment types them (`10` a
/// number, `true` a bool, `[a, b]` a list). Other variables with the prefix (another
/// binary's keys) are left alone.
pub fn env_dict(prefix: &str, keys: &[&str], env: &[(String, String)]) -> Dict {
    let mut dict = Dict::new();
    for (k, v) in env {
        let Some(suffix) = k.strip_prefix(prefix) else {
            continue;
        };
        let key = suffix.to_ascii_lowercase();
        if keys.contains(&key.as_str()) {
            let value: Value = v.parse().unwrap_or_else(|_| Value::from(v.clone()));
            dict.insert(key, value);
        }
    }
    dict
}

/// A figment source over a dictionary, named for error messages.
pub struct NamedDict {
    pub name: &'static str,
    pub dict: Dict,
}

impl Provider for NamedDict {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.name)
    }
    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.dict.clone()))
    }
}

/// The docs table of `keys`: one Markdown row per key (key, default, doc).
pub fn markdown_table(keys: &[KeyDoc]) -> String {
    let mut out = String::from("| key | default | meaning |\n|---|---|---|\n");
    for k in keys {
        let doc = k.doc.split_whitespace().collect::<Vec<_>>().join(" ");
        out.push_str(&format!("| {} | `{}` | {} |\n", k.key, k.default, doc));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    mod demo {
        config_table! {
            #[serde(default, deny_unknown_fields)]
            pub struct DemoConfig;
            #[command(name = "demo")]
            pub struct DemoArgs;
            keys {
                /// How often, ms.
                interval_ms: u64 = 100, flag u64;
                /// Local addresses.
                #[arg(value_delimiter = ',')]
                addresses: Vec<String> = vec!["127.0.0.1".into()], flag Vec<String>;
            }
        }
    }

    #[test]
    fn one_declaration_gives_field_default_flag_env_and_doc() {
        use clap::Parser;
        let d = demo::DemoConfig::default();
        assert_eq!(d.interval_ms, 100);
        assert_eq!(d.addresses, vec!["127.0.0.1".to_string()]);
        assert_eq!(demo::KEYS, &["interval_ms", "addresses"]);
        let a = demo::DemoArgs::parse_from(["demo", "--interval-ms", "7", "--addresses", "a,b"]);
        assert_eq!(a.interval_ms, Some(7));
        assert_eq!(a.addresses, Some(vec!["a".into(), "b".into()]));
        assert_eq!(demo::DemoArgs::parse_from(["demo"]).interval_ms, None);
        let k = demo::KEY_DOCS[0];
        assert_eq!(
            (k.key, k.default, k.doc.trim()),
            ("interval_ms", "100", "How often, ms.")
        );
        assert_eq!(k.flag(), "--interval-ms");
        assert_eq!(k.env("X_"), "X_INTERVAL_MS");
        let env = vec![
            ("X_INTERVAL_MS".to_string(), "9".to_string()),
            ("X_OTHER".to_string(), "1".to_string()),
        ];
        let dict = env_dict("X_", demo::KEYS, &env);
        assert_eq!(dict.len(), 1);
        assert!(markdown_table(demo::KEY_DOCS).contains("| interval_ms | `100` | How often, ms. |"));
    }
}
