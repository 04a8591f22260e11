//! The caller of an agent RPC: the identity its verified client certificate names.

use tonic::Request;

use super::cert::{cert_names, IdentitySource};

/// One refusal: the RPC, a short reason (a metric attribute, bounded), one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub rpc: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// The caller of an agent RPC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// No client certificate is required (tls_mode disabled or tls): not enforced.
    Unchecked,
    /// The agent its certificate names.
    Agent(String),
    /// A controller replica (`tls_replica_identities`): it forwards agents' path
    /// reports, which it checked against their senders.
    Replica(String),
}

impl Caller {
    /// The identity rules apply to, if any.
    pub fn identity(&self) -> Option<&str> {
        match self {
            Caller::Unchecked => None,
            Caller::Agent(id) | Caller::Replica(id) => Some(id),
        }
    }

    /// The caller's role in the audit log.
    pub fn role(&self) -> &'static str {
        match self {
            Caller::Unchecked => "unauthenticated",
            Caller::Agent(_) => "agent",
            Caller::Replica(_) => "replica",
        }
    }

    /// For logs and the audit log: the identity, or "unauthenticated".
    pub fn who(&self) -> &str {
        self.identity().unwrap_or("unauthenticated")
    }
}

/// How agent identities are read (from the config).
#[derive(Debug, Clone)]
pub struct AgentAuth {
    /// mTLS: every agent RPC carries a verified client certificate.
    pub enforce: bool,
    pub from: IdentitySource,
    /// Identities of the controller replicas' certificates.
    pub replicas: Vec<String>,
}

impl AgentAuth {
    pub fn unchecked() -> Self {
        AgentAuth {
            enforce: false,
            from: IdentitySource::Auto,
            replicas: Vec::new(),
        }
    }

    /// The caller of `req` for `rpc`.
    pub fn caller<T>(&self, rpc: &'static str, req: &Request<T>) -> Result<Caller, Denial> {
        if !self.enforce {
            return Ok(Caller::Unchecked);
        }
        let refuse = |reason, message: String| Denial {
            rpc,
            reason,
            message: format!("{rpc}: {message}"),
        };
        let certs = req.peer_certs();
        let Some(leaf) = certs.as_ref().and_then(|c| c.first()) else {
            return Err(refuse("no_certificate", "no client certificate".into()));
        };
        let names = cert_names(leaf.as_ref()).map_err(|e| refuse("certificate", e.to_string()))?;
        match names.identity(self.from) {
            Some(id) if self.replicas.iter().any(|r| r == id) => {
                Ok(Caller::Replica(id.to_string()))
            }
            Some(id) => Ok(Caller::Agent(id.to_string())),
            None => Err(refuse(
                "no_identity",
                format!(
                    "the client certificate has no {} (tls_identity_from)",
                    match self.from {
                        IdentitySource::Auto => "SAN DNS name, SAN URI or subject CN",
                        IdentitySource::SanDns => "SAN DNS name",
                        IdentitySource::SanUri => "SAN URI",
                        IdentitySource::Cn => "subject CN",
                    }
                ),
            )),
        }
    }
}
