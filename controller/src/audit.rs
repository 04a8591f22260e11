//! The audit log: one JSON line per call that changes what the controller holds (agent
//! registrations that change the registry, deletions, operator actions) and per refusal,
//! with who asked, as what, for what, and what came of it. Reports (paths, flows, host
//! health) and heartbeats that change nothing are data, not changes, and are not audited
//! unless refused.
//!
//! Two sinks. The log sink (`audit_log_file`): a file the lines are appended to (one
//! write per line, so lines of concurrent calls never interleave), or, when empty, the
//! controller's log on stderr (target `audit`). The trail: every line also goes to the
//! registry's store (SQLite, or etcd where every replica reads every replica's lines),
//! which `ListAudit` reads. The trail is written off the calls' path: lines wait in a
//! bounded queue that a background tick hands to the store; past its bound the oldest
//! are dropped and counted, so a storm of refusals cannot grow the controller.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// Lines waiting for the store, at most.
pub const TRAIL_QUEUE_CAP: usize = 10_000;
/// Lines a store keeps (the newest); about 20 MB.
pub const TRAIL_KEPT: usize = 100_000;

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

/// An audit line read back from the trail.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct AuditRecord {
    pub time_unix_ns: u64,
    pub who: String,
    pub role: String,
    pub rpc: String,
    pub target: String,
    pub result: String,
}

impl AuditRecord {
    /// A stored line; one that is not an audit entry (a store edited by hand) is
    /// returned whole as the result of an entry without a time, never dropped silently.
    pub fn parse(line: &str) -> AuditRecord {
        serde_json::from_str(line).unwrap_or_else(|e| AuditRecord {
            result: format!("unreadable audit line ({e}): {line}"),
            ..AuditRecord::default()
        })
    }
}

pub struct AuditLog {
    file: Option<Mutex<File>>,
    /// Lines the store has not taken yet, oldest first.
    pending: Mutex<VecDeque<String>>,
    /// Lines dropped from `pending` at its bound (the log sink still has them).
    trail_dropped: AtomicU64,
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
        Ok(AuditLog {
            file,
            pending: Mutex::new(VecDeque::new()),
            trail_dropped: AtomicU64::new(0),
        })
    }

    /// Writes one entry to the log sink and queues it for the trail. A failed write is
    /// logged: auditing never fails the call.
    pub fn record(&self, e: &AuditEntry<'_>) {
        let line = serde_json::to_string(e).unwrap_or_default();
        match &self.file {
            Some(f) => {
                let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(err) = f.write_all(format!("{line}\n").as_bytes()) {
                    tracing::error!(error = %err, "audit log write failed");
                }
            }
            None => tracing::info!(target: "audit", entry = %line, "audit"),
        }
        self.queue(vec![line], false);
    }

    /// Adds lines to the trail's queue, at its back (`front`: lines the store refused,
    /// which go before newer ones). Past the bound the oldest go.
    fn queue(&self, lines: Vec<String>, front: bool) {
        let mut q = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if front {
            for l in lines.into_iter().rev() {
                q.push_front(l);
            }
        } else {
            q.extend(lines);
        }
        let over = q.len().saturating_sub(TRAIL_QUEUE_CAP);
        if over > 0 {
            q.drain(..over);
            let before = self.trail_dropped.fetch_add(over as u64, Ordering::Relaxed);
            if before == 0 || (before + over as u64).is_power_of_two() {
                tracing::warn!(
                    dropped_total = before + over as u64,
                    "audit trail queue full: oldest lines dropped from the store (the audit log sink has them)"
                );
            }
        }
    }

    /// Hands the queued lines to `store` (one call per tick); lines it refuses stay
    /// queued for the next tick.
    pub fn flush<E: std::fmt::Display>(
        &self,
        store: impl FnOnce(&[String]) -> Result<(), E>,
    ) -> Result<usize, E> {
        let lines: Vec<String> = {
            let mut q = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            q.drain(..).collect()
        };
        if lines.is_empty() {
            return Ok(0);
        }
        match store(&lines) {
            Ok(()) => Ok(lines.len()),
            Err(e) => {
                self.queue(lines, true);
                Err(e)
            }
        }
    }

    /// Lines dropped from the trail's queue so far.
    pub fn trail_dropped(&self) -> u64 {
        self.trail_dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(i: u64) -> String {
        format!("{i}")
    }

    fn log() -> AuditLog {
        AuditLog::open("").unwrap()
    }

    fn record(l: &AuditLog, i: u64) {
        l.record(&AuditEntry {
            time_unix_ns: i,
            who: "a",
            role: "agent",
            rpc: "RegisterAgent",
            target: &entry(i),
            result: "ok",
        });
    }

    #[test]
    fn lines_reach_the_store_in_order_and_a_refusal_keeps_them() {
        let l = log();
        for i in 0..3 {
            record(&l, i);
        }
        assert!(l.flush(|_| Err("etcd down")).is_err());
        record(&l, 3);
        let mut got = Vec::new();
        assert_eq!(
            l.flush(|lines| {
                got.extend(lines.iter().map(|s| AuditRecord::parse(s).time_unix_ns));
                Ok::<(), String>(())
            }),
            Ok(4)
        );
        assert_eq!(got, [0, 1, 2, 3]);
        assert_eq!(l.flush(|_| Err("never called")), Ok(0));
    }

    #[test]
    fn the_queue_is_bounded_and_drops_the_oldest() {
        let l = log();
        for i in 0..(TRAIL_QUEUE_CAP as u64 + 5) {
            record(&l, i);
        }
        assert_eq!(l.trail_dropped(), 5);
        let mut first = None;
        l.flush(|lines| {
            assert_eq!(lines.len(), TRAIL_QUEUE_CAP);
            first = Some(AuditRecord::parse(&lines[0]).time_unix_ns);
            Ok::<(), String>(())
        })
        .unwrap();
        assert_eq!(first, Some(5));
    }

    #[test]
    fn an_unreadable_line_is_shown_whole() {
        let r = AuditRecord::parse("not json");
        assert_eq!(r.time_unix_ns, 0);
        assert!(r.result.contains("not json"), "{r:?}");
        let ok = AuditRecord::parse(
            r#"{"time_unix_ns":7,"who":"w","role":"operator","rpc":"DeleteAgent","target":"t","result":"ok"}"#,
        );
        assert_eq!((ok.time_unix_ns, ok.rpc.as_str()), (7, "DeleteAgent"));
    }
}
