//! The address-handle resolver threads: a dead peer's neighbour timeout is spent here, on
//! nobody's send path; parked sends are posted or failed when their handle resolves.

use super::*;

/// The AH resolver thread: makes each requested address handle (this is where a dead
/// peer's one-second neighbour timeout is spent, on nobody's send path), then posts the
/// sends parked for it or fails them.
pub(super) fn run_resolver(shared: Arc<Shared>, mut next: impl FnMut() -> Option<AhRequest>) {
    while let Some(req) = next() {
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        let made = Ah::create(&shared.pd, &req.spec).map_err(|e| match e {
            RdmaError::Verbs { source, .. } => format!("ibv_create_ah: {source}"),
            other => other.to_string(),
        });
        let now = clock::monotonic_ns();
        let mut failed = Vec::new();
        {
            let mut guard = shared.lock_send();
            let SendState {
                ahs,
                parked,
                parked_total,
                retired,
                posted,
                ..
            } = &mut *guard;
            let waiting = parked.remove(&req.key).unwrap_or_default();
            *parked_total -= waiting.len();
            let error = made.as_ref().err().cloned();
            let usable = match ahs.resolved(req.key, made, now) {
                Resolved::Ready { retire } => {
                    if let Some(old) = retire {
                        // Sends posted so far may still reference it.
                        retired.push((*posted, old));
                    }
                    true
                }
                Resolved::KeptOld => true,
                Resolved::Failed { first } => {
                    if first {
                        tracing::warn!(
                            "rdma device {}: no address handle for {} ({}); its probes fail until a retry succeeds",
                            shared.device(),
                            req.key.gid,
                            error.unwrap_or_default()
                        );
                    }
                    false
                }
            };
            match ahs.peek(&req.key) {
                Some(ah) if usable && !shared.stop.load(Ordering::Acquire) => {
                    for p in waiting {
                        if shared
                            .post(ah, posted, p.qpn, &p.payload[..p.len], p.id)
                            .is_err()
                        {
                            failed.push(p.id);
                        }
                    }
                }
                _ => failed.extend(waiting.iter().map(|p| p.id)),
            }
        }
        shared.sends_failed(failed);
    }
}
