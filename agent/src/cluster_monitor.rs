//! Keeps each RNIC's pinglists fresh: fetched at start and every
//! `pinglist_update_interval_sec`; on error the cached lists stay and the fetch is retried
//! with backoff; NotFound (the controller restarted and lost us) re-registers first.
//! Keeps the agent alive at the controller: it registers again every heartbeat interval
//! (the Go agent's way, so a Go controller keeps us active too; ours says how often).
//! Nothing here gates the responder: probes are answered whatever the controller does.

use std::sync::Arc;
use std::time::Duration;

use rpingmesh_proto::controller_agent::AgentRegistrationRequest;
use rpingmesh_protocol::PinglistKind;
use tokio::sync::{watch, Mutex};

use crate::controller_client::{ControllerClient, ControllerError};
use crate::targets::{convert_list, Pinglists};

/// Registers the agent (all RNICs at once) and remembers whether the controller knows it.
pub struct Registrar {
    client: ControllerClient,
    state: Mutex<RegState>,
    /// As the controller last asked (DEFAULT_HEARTBEAT until it says otherwise). A watch,
    /// so that a heartbeat loop already waiting out the default learns the controller's
    /// interval at the first registration instead of sleeping 60 s on.
    heartbeat: watch::Sender<Duration>,
}

struct RegState {
    /// Changes when an RNIC is re-opened (its QPN changes).
    request: AgentRegistrationRequest,
    registered: bool,
    failing: bool,
}

/// The Go agent's heartbeat, used when the controller does not name one.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(60);

/// The heartbeat to keep: the controller's, else the Go agent's 60 s.
pub fn heartbeat_interval(controller_sec: u32) -> Duration {
    if controller_sec == 0 {
        DEFAULT_HEARTBEAT
    } else {
        Duration::from_secs(controller_sec as u64)
    }
}

impl Registrar {
    pub fn new(client: ControllerClient, request: AgentRegistrationRequest) -> Self {
        Registrar {
            client,
            state: Mutex::new(RegState {
                request,
                registered: false,
                failing: false,
            }),
            heartbeat: watch::Sender::new(DEFAULT_HEARTBEAT),
        }
    }

    /// Replaces the RNIC registered as `device_name` (after a re-open gave it a new QPN);
    /// the next `ensure_registered` registers the agent again. False if no such RNIC.
    pub async fn replace_rnic(&self, device_name: &str, gid: &str, qpn: u32) -> bool {
        let mut st = self.state.lock().await;
        let Some(r) = st
            .request
            .rnics
            .iter_mut()
            .find(|r| r.device_name == device_name)
        else {
            return false;
        };
        r.gid = gid.to_string();
        r.qpn = qpn;
        st.registered = false;
        true
    }

    /// The registration the next `ensure_registered` sends.
    pub async fn request(&self) -> AgentRegistrationRequest {
        self.state.lock().await.request.clone()
    }

    /// Registers unless already registered. The first failure of a streak is logged as
    /// one error line; repeats are debug until it works again.
    pub async fn ensure_registered(&self) -> Result<(), ControllerError> {
        let mut st = self.state.lock().await;
        if st.registered {
            return Ok(());
        }
        self.register_locked(&mut st, false).await
    }

    /// Registers again whatever the state: the heartbeat that keeps this agent's RNICs
    /// active at the controller. A failure marks the agent unregistered, so the cluster
    /// monitors register before their next fetch as well.
    pub async fn heartbeat(&self) -> Result<(), ControllerError> {
        let mut st = self.state.lock().await;
        self.register_locked(&mut st, true).await
    }

    /// How often to heartbeat, as the controller last asked.
    pub fn heartbeat_interval(&self) -> Duration {
        *self.heartbeat.borrow()
    }

    /// The heartbeat interval, following every change the controller asks for.
    pub fn heartbeat_watch(&self) -> watch::Receiver<Duration> {
        self.heartbeat.subscribe()
    }

    async fn register_locked(
        &self,
        st: &mut RegState,
        heartbeat: bool,
    ) -> Result<(), ControllerError> {
        match self.client.register(st.request.clone()).await {
            Ok(hb) => {
                let was = st.registered;
                st.registered = true;
                st.failing = false;
                let every = heartbeat_interval(hb);
                self.heartbeat
                    .send_if_modified(|v| std::mem::replace(v, every) != every);
                if heartbeat && was {
                    tracing::debug!(agent_id = %st.request.agent_id, "heartbeat");
                } else {
                    tracing::info!(
                        controller = self.client.addr(),
                        agent_id = %st.request.agent_id,
                        rnics = st.request.rnics.len(),
                        heartbeat_sec = every.as_secs(),
                        "registered with controller"
                    );
                }
                Ok(())
            }
            Err(e) => {
                if !st.failing {
                    tracing::error!(
                        controller = self.client.addr(),
                        error = %e,
                        "cannot register with the controller; retrying with backoff (probes are still answered)"
                    );
                } else {
                    tracing::debug!(controller = self.client.addr(), error = %e, "registration retry failed");
                }
                st.failing = true;
                st.registered = false;
                Err(e)
            }
        }
    }

    /// The controller no longer knows us: the next `ensure_registered` registers again.
    pub async fn invalidate(&self) {
        self.state.lock().await.registered = false;
    }

    pub async fn is_registered(&self) -> bool {
        self.state.lock().await.registered
    }
}

/// Registers again every heartbeat interval until shutdown (a failed heartbeat is
/// retried at the next one; the cluster monitors also register on their own).
pub async fn run_heartbeat(registrar: Arc<Registrar>, mut shutdown: watch::Receiver<bool>) {
    let mut every = registrar.heartbeat_watch();
    loop {
        let wait = *every.borrow_and_update();
        let beat = tokio::select! {
            _ = tokio::time::sleep(wait) => true,
            // The controller asked for another interval (at start: the first registration
            // replaces the 60 s default): wait again with it.
            changed = every.changed() => {
                if changed.is_err() {
                    return;
                }
                false
            }
            _ = shutdown.wait_for(|s| *s) => return,
        };
        if beat {
            let _ = registrar.heartbeat().await;
        }
    }
}

/// Backoff after the `n`th consecutive failure (1 s doubling), capped at `cap`.
pub fn backoff(failures: u32, cap: Duration) -> Duration {
    let secs = 1u64
        .checked_shl(failures.saturating_sub(1).min(16))
        .unwrap_or(u64::MAX);
    Duration::from_secs(secs)
        .min(cap)
        .max(Duration::from_millis(100).min(cap))
}

pub struct MonitorParams {
    pub agent_id: String,
    pub tor_id: String,
    /// This RNIC's GID, full form (the pinglist requester).
    pub requester_gid: String,
    pub update_interval: Duration,
    /// Lists fetched every interval (SERVICE only while service tracing is configured).
    pub kinds: Vec<PinglistKind>,
    /// Bumped by the service-flow reporter after it reported changes: the SERVICE list is
    /// fetched again at once (new service paths get probed within seconds).
    pub service_kick: Option<watch::Receiver<u64>>,
    /// The controller's FOCUS generation (from report acks): the FOCUS list is fetched
    /// when it moves, and only then (adaptive probing; a Go controller never moves it).
    pub focus_kick: Option<watch::Receiver<u64>>,
}

/// Lists fetched by default: ToR-mesh and inter-ToR, plus SERVICE when `service`.
pub fn monitored_kinds(service: bool) -> Vec<PinglistKind> {
    let mut k = vec![PinglistKind::TorMesh, PinglistKind::InterTor];
    if service {
        k.push(PinglistKind::Service);
    }
    k
}

/// Runs until `shutdown` turns true (or its sender is dropped).
pub async fn run_cluster_monitor(
    registrar: Arc<Registrar>,
    client: ControllerClient,
    mut params: MonitorParams,
    tx: watch::Sender<Arc<Pinglists>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut cached = Pinglists::default();
    let mut failures = 0u32;
    let cap = params.update_interval.min(Duration::from_secs(60));
    let mut kick = params.service_kick.take();
    let mut focus = params.focus_kick.take();
    let mut kinds = params.kinds.clone();
    let mut service = kinds.contains(&PinglistKind::Service);
    loop {
        let (ok, service_unsupported) =
            refresh(&registrar, &client, &params, &kinds, &mut cached, &tx).await;
        if service_unsupported && service {
            tracing::info!(gid = %params.requester_gid, "the controller has no SERVICE pinglists (a Go controller?); fetching ToR-mesh and inter-ToR only");
            kinds.retain(|k| *k != PinglistKind::Service);
            service = false;
            kick = None;
        }
        let wait = if ok {
            if failures > 0 {
                tracing::info!(gid = %params.requester_gid, "pinglists fetched again");
            }
            failures = 0;
            params.update_interval
        } else {
            failures += 1;
            backoff(failures, cap)
        };
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            enum Wake {
                Period,
                Shutdown,
                Kick(bool),
                Focus(bool),
            }
            let wake = tokio::select! {
                _ = tokio::time::sleep_until(deadline) => Wake::Period,
                _ = shutdown.wait_for(|s| *s) => Wake::Shutdown,
                r = async { kick.as_mut().expect("guarded").changed().await }, if kick.is_some() => Wake::Kick(r.is_ok()),
                r = async { focus.as_mut().expect("guarded").changed().await }, if focus.is_some() => Wake::Focus(r.is_ok()),
            };
            // Out of schedule (the periodic refresh keeps its deadline): the one list asked.
            let asked = match wake {
                Wake::Period => break,
                Wake::Shutdown => return,
                Wake::Focus(false) => {
                    focus = None;
                    continue;
                }
                Wake::Focus(true) => PinglistKind::Focus,
                // The reporter is gone: periodic refreshes only.
                Wake::Kick(false) => {
                    kick = None;
                    continue;
                }
                Wake::Kick(true) if service => PinglistKind::Service,
                Wake::Kick(true) => continue,
            };
            let _ = refresh(&registrar, &client, &params, &[asked], &mut cached, &tx).await;
        }
    }
}

/// One refresh of `kinds`: (all fetched, the controller does not support SERVICE lists).
/// A list that fails keeps its cached value; an unsupported SERVICE list is emptied and
/// does not count as a failure (ToR-mesh and inter-ToR refresh on their schedule).
async fn refresh(
    registrar: &Registrar,
    client: &ControllerClient,
    p: &MonitorParams,
    kinds: &[PinglistKind],
    cached: &mut Pinglists,
    tx: &watch::Sender<Arc<Pinglists>>,
) -> (bool, bool) {
    if registrar.ensure_registered().await.is_err() {
        return (false, false);
    }
    let mut all_ok = true;
    let mut service_unsupported = false;
    let mut changed = false;
    for &kind in kinds {
        let mut res = client
            .get_pinglist(&p.agent_id, &p.tor_id, &p.requester_gid, kind)
            .await;
        if matches!(&res, Err(e) if e.is_not_found()) {
            tracing::warn!(gid = %p.requester_gid, "controller does not know this agent (restarted?); registering again");
            registrar.invalidate().await;
            if registrar.ensure_registered().await.is_err() {
                return (false, false);
            }
            res = client
                .get_pinglist(&p.agent_id, &p.tor_id, &p.requester_gid, kind)
                .await;
        }
        match res {
            Ok(list) => {
                let (targets, bad) = convert_list(&list, kind);
                for b in bad {
                    tracing::warn!(error = %b, ?kind, "pinglist entry skipped");
                }
                if cached.list(kind) != targets.as_slice() {
                    tracing::info!(gid = %p.requester_gid, ?kind, targets = targets.len(), "pinglist updated");
                    *cached.list_mut(kind) = targets;
                    changed = true;
                }
            }
            Err(e) if kind == PinglistKind::Service && e.is_unsupported() => {
                service_unsupported = true;
                if !cached.list(kind).is_empty() {
                    cached.list_mut(kind).clear();
                    changed = true;
                }
            }
            Err(e) => {
                all_ok = false;
                tracing::warn!(gid = %p.requester_gid, ?kind, error = %e, "pinglist fetch failed; keeping the cached list");
            }
        }
    }
    if changed {
        tx.send_replace(Arc::new(cached.clone()));
    }
    // Every refresh, changed or not (the soak measures pinglist convergence with it).
    tracing::debug!(
        gid = %p.requester_gid, ok = all_ok,
        tor_mesh = cached.list(PinglistKind::TorMesh).len(),
        inter_tor = cached.list(PinglistKind::InterTor).len(),
        service = cached.list(PinglistKind::Service).len(),
        focus = cached.list(PinglistKind::Focus).len(),
        "pinglists refreshed"
    );
    (all_ok, service_unsupported)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_follows_the_controller_else_go_default() {
        assert_eq!(heartbeat_interval(0), Duration::from_secs(60));
        assert_eq!(heartbeat_interval(2), Duration::from_secs(2));
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let cap = Duration::from_secs(30);
        assert_eq!(backoff(1, cap), Duration::from_secs(1));
        assert_eq!(backoff(2, cap), Duration::from_secs(2));
        assert_eq!(backoff(4, cap), Duration::from_secs(8));
        assert_eq!(backoff(6, cap), Duration::from_secs(30));
        assert_eq!(backoff(1000, cap), Duration::from_secs(30));
        // A short refresh interval caps the backoff too.
        assert_eq!(backoff(3, Duration::from_secs(2)), Duration::from_secs(2));
    }
}
