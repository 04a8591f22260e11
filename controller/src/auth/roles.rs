//! Operator roles: who may read (viewer) and who may act (operator), from a bearer token
//! (a file of SHA-256 hashes, never the tokens themselves) or from a client certificate
//! (its OU or its identity mapped to a role in the config). Pure: text and names in,
//! roles out.

use std::collections::HashMap;

use super::cert::CertNames;

/// What a caller may do. `Operator` includes everything a `Viewer` may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Viewer,
    Operator,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s.trim().to_ascii_lowercase().as_str() {
            "viewer" => Some(Role::Viewer),
            "operator" => Some(Role::Operator),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }
}

/// SHA-256 of a token, lowercase hex (what `sha256sum` prints for it).
pub fn token_hash(token: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The bearer tokens (`operator_tokens_file`): one per line, `ROLE SHA256-HEX NAME`
/// (`#` starts a comment). The name is who the audit log says acted.
#[derive(Debug, Clone, Default)]
pub struct TokenTable {
    by_hash: HashMap<String, (Role, String)>,
}

impl TokenTable {
    /// Parses the file's text; an error names the line.
    pub fn parse(text: &str) -> Result<TokenTable, String> {
        let mut by_hash = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let bad = |m: &str| Err(format!("line {}: {m}", i + 1));
            if f.len() != 3 {
                return bad("expected `ROLE SHA256-HEX NAME`");
            }
            let Some(role) = Role::parse(f[0]) else {
                return bad(&format!("role {:?} is not viewer or operator", f[0]));
            };
            let hash = f[1].to_ascii_lowercase();
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return bad("the hash is not 64 hex digits (sha256sum of the token)");
            }
            if by_hash.insert(hash, (role, f[2].to_string())).is_some() {
                return bad("the same token twice");
            }
        }
        Ok(TokenTable { by_hash })
    }

    /// The role and name of `token`.
    pub fn lookup(&self, token: &str) -> Option<(Role, &str)> {
        self.by_hash
            .get(&token_hash(token))
            .map(|(r, n)| (*r, n.as_str()))
    }

    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

/// Certificate names with a role (`tls_operator_roles`: `NAME=ROLE,...`, NAME an OU or an
/// identity of the certificate).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertRoles(Vec<(String, Role)>);

impl CertRoles {
    pub fn parse(text: &str) -> Result<CertRoles, String> {
        let mut out = Vec::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((name, role)) = item.split_once('=') else {
                return Err(format!("{item:?} is not NAME=ROLE"));
            };
            let Some(role) = Role::parse(role) else {
                return Err(format!("{item:?}: role is not viewer or operator"));
            };
            out.push((name.trim().to_string(), role));
        }
        Ok(CertRoles(out))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The highest role any of the certificate's OUs or `identity` has.
    pub fn role_of(&self, names: &CertNames, identity: Option<&str>) -> Option<Role> {
        self.0
            .iter()
            .filter(|(n, _)| names.ous.iter().any(|o| o == n) || identity == Some(n.as_str()))
            .map(|(_, r)| *r)
            .max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_kept_hashed_and_looked_up_by_hash() {
        let h = token_hash("s3cret");
        assert_eq!(
            h,
            "1ec1c26b50d5d3c58d9583181af8076655fe00756bf7285940ba3670f99fcba0"
        );
        assert_eq!(
            token_hash(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let t = TokenTable::parse(&format!(
            "# ops\noperator {h} alice\nviewer {} grafana # read-only\n\n",
            token_hash("view")
        ))
        .unwrap();
        assert_eq!(t.lookup("s3cret"), Some((Role::Operator, "alice")));
        assert_eq!(t.lookup("view"), Some((Role::Viewer, "grafana")));
        assert_eq!(t.lookup("guess"), None);
        assert!(!t.by_hash.keys().any(|k| k.contains("s3cret")));
        for (bad, why) in [
            ("admin aaaa x", "line 1: role \"admin\""),
            ("viewer abc x", "line 1: the hash is not 64 hex"),
            ("viewer", "line 1: expected"),
        ] {
            let e = TokenTable::parse(bad).unwrap_err();
            assert!(e.starts_with(why), "{e}");
        }
        let dup = format!("viewer {h} a\noperator {h} b");
        assert_eq!(
            TokenTable::parse(&dup).unwrap_err(),
            "line 2: the same token twice"
        );
    }

    #[test]
    fn certificates_get_the_highest_role_of_their_names() {
        let r = CertRoles::parse("noc=viewer, sre=operator,alice=operator").unwrap();
        let names = |ous: &[&str]| CertNames {
            ous: ous.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        assert_eq!(r.role_of(&names(&["noc"]), Some("bob")), Some(Role::Viewer));
        assert_eq!(
            r.role_of(&names(&["noc", "sre"]), None),
            Some(Role::Operator)
        );
        assert_eq!(r.role_of(&names(&[]), Some("alice")), Some(Role::Operator));
        assert_eq!(r.role_of(&names(&["dev"]), Some("bob")), None);
        assert!(CertRoles::parse("noc").is_err());
        assert!(CertRoles::parse("noc=root").is_err());
    }
}
