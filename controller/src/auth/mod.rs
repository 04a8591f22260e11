//! Who is calling and what it may say. `identity`: the agent identity a client
//! certificate names (`tls_mode: mtls`); `cert`: reading the names of a certificate;
//! `agent_rules`: what an agent may say, given who it is; `roles` and `operator`: who may
//! read and who may act on the operator surfaces. Without mTLS nobody is
//! identified and nothing is enforced (a Go fleet without certificates keeps working);
//! the server warns once at start.

pub mod agent_rules;
pub mod cert;
pub mod identity;
pub mod operator;
pub mod roles;

pub use cert::{cert_names, CertNames, IdentitySource};
pub use identity::{AgentAuth, Caller, Denial};
pub use operator::{require, OperatorAuth, OperatorCaller};
pub use roles::Role;
