//! Who is calling the operator surfaces (gRPC OperatorService, the web page's JSON API,
//! /metrics) and with which role: a bearer token from `operator_tokens_file` (reloaded on
//! SIGHUP), or a client certificate with a role in `tls_operator_roles`. Off, everyone
//! acts (as before; the server warns when a listener is not on loopback).

use std::sync::RwLock;

use anyhow::Context;

use super::cert::{cert_names, IdentitySource};
use super::roles::{CertRoles, Role, TokenTable};

/// An authenticated operator-side caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorCaller {
    /// The token's name or the certificate's identity ("anyone" when auth is off).
    pub who: String,
    pub role: Role,
}

impl OperatorCaller {
    /// Auth off: everyone may do everything.
    pub fn anyone() -> Self {
        OperatorCaller {
            who: "anyone".into(),
            role: Role::Operator,
        }
    }
}

pub struct OperatorAuth {
    pub enabled: bool,
    tokens_file: String,
    tokens: RwLock<TokenTable>,
    cert_roles: CertRoles,
    from: IdentitySource,
}

fn read_tokens(path: &str) -> anyhow::Result<TokenTable> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("operator_tokens_file {path:?}: cannot read"))?;
    TokenTable::parse(&text).map_err(|e| anyhow::anyhow!("operator_tokens_file {path:?}: {e}"))
}

impl OperatorAuth {
    /// Reads the token file now (an unreadable or malformed one stops startup).
    pub fn new(
        enabled: bool,
        tokens_file: &str,
        cert_roles: CertRoles,
        from: IdentitySource,
    ) -> anyhow::Result<Self> {
        let tokens = if tokens_file.trim().is_empty() {
            TokenTable::default()
        } else {
            read_tokens(tokens_file)?
        };
        Ok(OperatorAuth {
            enabled,
            tokens_file: tokens_file.trim().to_string(),
            tokens: RwLock::new(tokens),
            cert_roles,
            from,
        })
    }

    /// Reads the token file again (SIGHUP). On error the tokens in use stay.
    pub fn reload(&self) -> anyhow::Result<usize> {
        if self.tokens_file.is_empty() {
            return Ok(0);
        }
        let t = read_tokens(&self.tokens_file)?;
        let n = t.len();
        *self.tokens.write().unwrap_or_else(|e| e.into_inner()) = t;
        Ok(n)
    }

    /// The caller presenting `authorization` (an HTTP/gRPC header value) and/or the TLS
    /// leaf certificate `cert`. Err: one line saying what was missing or wrong.
    pub fn authenticate(
        &self,
        authorization: Option<&str>,
        cert: Option<&[u8]>,
    ) -> Result<OperatorCaller, String> {
        if !self.enabled {
            return Ok(OperatorCaller::anyone());
        }
        if let Some(h) = authorization {
            let Some(token) = h
                .strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
            else {
                return Err("the authorization header is not `Bearer TOKEN`".into());
            };
            let tokens = self.tokens.read().unwrap_or_else(|e| e.into_inner());
            return match tokens.lookup(token.trim()) {
                Some((role, name)) => Ok(OperatorCaller {
                    who: name.to_string(),
                    role,
                }),
                None => Err("the bearer token is not in operator_tokens_file".into()),
            };
        }
        if let Some(der) = cert {
            let names = cert_names(der).map_err(|e| e.to_string())?;
            let id = names.identity(self.from);
            return match self.cert_roles.role_of(&names, id) {
                Some(role) => Ok(OperatorCaller {
                    who: id.unwrap_or("certificate").to_string(),
                    role,
                }),
                None => Err(format!(
                    "the client certificate ({}) has no role in tls_operator_roles",
                    id.unwrap_or("no name")
                )),
            };
        }
        Err("no credential: a bearer token (operator_tokens_file) or a client certificate with a role (tls_operator_roles) is required".into())
    }
}

/// `caller` may do what needs `need`, or the one line why not.
pub fn require(caller: &OperatorCaller, need: Role, rpc: &str) -> Result<(), String> {
    if caller.role >= need {
        return Ok(());
    }
    Err(format!(
        "{rpc}: {} {:?} may not do this (role {} needed)",
        caller.role.as_str(),
        caller.who,
        need.as_str()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::roles::token_hash;

    #[test]
    fn tokens_roles_and_reload() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tokens");
        std::fs::write(&f, format!("viewer {} grafana\n", token_hash("v"))).unwrap();
        let a = OperatorAuth::new(
            true,
            f.to_str().unwrap(),
            CertRoles::default(),
            IdentitySource::Auto,
        )
        .unwrap();
        let v = a.authenticate(Some("Bearer v"), None).unwrap();
        assert_eq!((v.who.as_str(), v.role), ("grafana", Role::Viewer));
        assert!(require(&v, Role::Operator, "DeleteAgent")
            .unwrap_err()
            .starts_with("DeleteAgent: viewer \"grafana\" may not do this"));
        assert!(a.authenticate(Some("Bearer o"), None).is_err());
        assert!(a
            .authenticate(None, None)
            .unwrap_err()
            .starts_with("no credential"));
        assert!(a.authenticate(Some("Basic x"), None).is_err());
        std::fs::write(&f, format!("operator {} alice\n", token_hash("o"))).unwrap();
        assert_eq!(a.reload().unwrap(), 1);
        assert_eq!(
            a.authenticate(Some("Bearer o"), None).unwrap().role,
            Role::Operator
        );
        assert!(a.authenticate(Some("Bearer v"), None).is_err());
        // A broken file keeps the tokens in use.
        std::fs::write(&f, "operator nothex alice\n").unwrap();
        assert!(a.reload().is_err());
        assert!(a.authenticate(Some("Bearer o"), None).is_ok());
        let off = OperatorAuth::new(false, "", CertRoles::default(), IdentitySource::Auto).unwrap();
        assert_eq!(
            off.authenticate(None, None).unwrap(),
            OperatorCaller::anyone()
        );
    }
}
