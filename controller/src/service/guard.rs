//! What a refused, unauthenticated or over-limit call costs the caller (counted, logged,
//! audited, the one-line status) and the audit trail's writes.

use super::*;

impl ControllerState {
    /// Refuses a call the identity rules deny: counted, logged, audited, and
    /// PERMISSION_DENIED with the one line naming both identities.
    pub fn refuse(&self, who: &str, role: &str, target: &str, d: Denial) -> Status {
        self.auth_denied.fetch_add(1, Ordering::Relaxed);
        self.metrics.auth_denied(d.rpc, d.reason);
        tracing::warn!(
            who,
            rpc = d.rpc,
            reason = d.reason,
            "refused: {}",
            d.message
        );
        self.audit(who, role, d.rpc, target, &format!("denied: {}", d.message));
        Status::permission_denied(d.message)
    }

    /// Refuses an operator-side call without a valid credential: counted, logged,
    /// audited, UNAUTHENTICATED.
    pub fn unauthenticated(&self, surface: &'static str, why: &str) -> Status {
        self.auth_denied.fetch_add(1, Ordering::Relaxed);
        self.metrics.auth_denied(surface, "unauthenticated");
        tracing::warn!(surface, "refused: {why}");
        self.audit(
            "unidentified",
            "unauthenticated",
            surface,
            "",
            &format!("denied: {why}"),
        );
        Status::unauthenticated(format!("{surface}: {why}"))
    }

    /// Refuses a call over a limit: counted, logged, audited, RESOURCE_EXHAUSTED.
    pub fn over_limit(
        &self,
        who: &str,
        rpc: &'static str,
        limit: &'static str,
        target: &str,
        message: String,
    ) -> Status {
        let message = format!("{rpc}: {message} ({limit})");
        self.limited.fetch_add(1, Ordering::Relaxed);
        self.metrics.limited(rpc, limit);
        tracing::warn!(who, rpc, limit, "refused: {message}");
        self.audit(who, "agent", rpc, target, &format!("limited: {message}"));
        Status::resource_exhausted(message)
    }

    /// Takes one registration of `caller` from its budget, or says when the next fits.
    pub fn take_registration(&self, caller: &str) -> Result<(), Status> {
        let now = self.now_ns();
        let mut l = self.registrations.lock().unwrap_or_else(|e| e.into_inner());
        let verdict = l.try_take(caller, now);
        let per_minute = l.per_minute();
        drop(l);
        verdict.map_err(|wait_ns| {
            self.over_limit(
                caller,
                "RegisterAgent",
                "max_registrations_per_minute",
                caller,
                format!(
                    "{caller:?} registered {per_minute} times within a minute; the next is taken in {:.1} s",
                    wait_ns as f64 / 1e9
                ),
            )
        })
    }

    /// One audit log entry, timed now.
    pub fn audit(&self, who: &str, role: &str, rpc: &str, target: &str, result: &str) {
        self.audit.record(&AuditEntry {
            time_unix_ns: self.now_ns(),
            who,
            role,
            rpc,
            target,
            result,
        });
    }

    /// Hands the audit lines written since the last call to the store's trail (every
    /// replica, once a second, off the workers); a failed write keeps them for the next.
    pub fn flush_audit(&self) {
        if let Err(e) = self.audit.flush(|lines| self.registry.append_audit(lines)) {
            tracing::warn!(error = %e, "audit trail write failed; the lines are kept for a retry");
        }
    }
}
