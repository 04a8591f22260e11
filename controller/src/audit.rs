//! The audit log: one JSON line per call that changes what the controller holds (agent
//! registrations, operator actions) and per refusal, with who asked, as what, for what,
//! and what came of it. Reports (paths, flows, host health) are data, not changes, and
//! are not audited unless refused.
//!
//! Sink (`audit_log_file`): a file the lines are appended to (one write per line, so
//! lines of concurrent calls never interleave), or, when empty, the controller's log on
//! stderr (target `audit`).

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;

use anyhow::Context;
use serde::Serialize;

/// One audited call.
#[derive(Debug, Clone, Serialize)]
pub struct AuditEntry<'a> {
    pub time_unix_ns: u64,
    /// The identity that asked ("unauthenticated" without one).
    pub who: &'a str,
    /// agent, operator, viewer, replica or unauthenticated.
    pub role: &'a str,
    pub rpc: &'a str,
    /// What the call was about (an agent id, a GID, a finding).
    pub target: &'a str,
    /// "ok", or "denied: <why>" / "error: <why>".
    pub result: &'a str,
}

pub struct AuditLog {
    file: Option<Mutex<File>>,
}

impl AuditLog {
    /// `path` empty: entries go to the log.
    pub fn open(path: &str) -> anyhow::Result<Self> {
        let file = if path.trim().is_empty() {
            None
        } else {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("audit_log_file {path:?}: cannot open for append"))?;
            Some(Mutex::new(f))
        };
        Ok(AuditLog { file })
    }

    /// Writes one entry. A failed write is logged: auditing never fails the call.
    pub fn record(&self, e: &AuditEntry<'_>) {
        let mut line = serde_json::to_string(e).unwrap_or_default();
        match &self.file {
            Some(f) => {
                line.push('\n');
                let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(err) = f.write_all(line.as_bytes()) {
                    tracing::error!(error = %err, "audit log write failed");
                }
            }
            None => tracing::info!(target: "audit", entry = %line, "audit"),
        }
    }
}
