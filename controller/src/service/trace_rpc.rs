//! On-demand ECMP traces in the running controller (the analysis leader): StartTrace puts
//! a FOCUS target from the source RNIC to the target over the asked labels (and wakes the
//! agents awaiting the FOCUS generation), each findings tick reads the pair's FOCUS windows
//! into the trace, and a finished trace's target ends.

use rpingmesh_proto::operator::{StartTraceRequest, Trace};
use tonic::{Request, Response, Status};

use super::operator_rpc::operator_caller;
use super::{gid_arg, ControllerState, OperatorSvc};
use crate::pinglist::{is_active, make_target};
use crate::trace::{labels, route_of};
use rpingmesh_proto::controller_agent::PinglistType;

/// A trace probes for this many windows at most (then it expires), plus the settle time.
const TRACE_WINDOWS: u64 = 3;
/// The window length assumed before any window was ingested (the agents' default).
const DEFAULT_WINDOW_NS: u64 = 30_000_000_000;

impl ControllerState {
    pub fn trace(&self, id: u64) -> Option<Trace> {
        self.traces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// Reads the running traces' FOCUS windows; ends the targets of finished ones.
    pub(super) fn advance_traces(&self) {
        let now = self.now_ns();
        let ended = {
            let Some(a) = self.analyzer() else { return };
            let mut t = self.traces.lock().unwrap_or_else(|e| e.into_inner());
            if t.running() == 0 {
                return;
            }
            let idx = self.registry.index();
            let tor = |g: &str| idx.rnic(g).map(|r| r.tor_id.clone()).unwrap_or_default();
            let topo = a.localizer().topology();
            t.advance(
                now,
                |s, d| a.focus_windows(s, d),
                |s, d, l| route_of(topo, &tor(s), &tor(d), s, d, l),
            )
        };
        if ended.is_empty() {
            return;
        }
        let mut f = self.focus.lock().unwrap_or_else(|e| e.into_inner());
        let mut moved = false;
        for id in ended {
            moved |= f.end_trace(id);
        }
        if moved {
            self.focus_moved.send_replace(f.generation());
        }
    }
}

impl OperatorSvc {
    pub(super) async fn start_trace_rpc(
        &self,
        request: Request<StartTraceRequest>,
    ) -> Result<Response<Trace>, Status> {
        const RPC: &str = "StartTrace";
        let caller = operator_caller(&request);
        let req = request.into_inner();
        let target = format!("{} -> {}", req.source_gid, req.target_gid);
        self.require_operator(&caller, RPC, &target)?;
        let st = &self.0;
        let r = (|| {
            if !st.leadership.is_leader() {
                return Err(Status::failed_precondition(
                    match st.leadership.forward_to() {
                        Some(addr) => format!(
                            "{RPC}: this replica does not analyze; ask the leader at {addr}"
                        ),
                        None => format!("{RPC}: no analysis leader is elected yet; retry"),
                    },
                ));
            }
            let src = gid_arg("source_gid", &req.source_gid)?;
            let dst = gid_arg("target_gid", &req.target_gid)?;
            let labels = labels(req.first_label, req.labels)
                .map_err(|e| Status::invalid_argument(format!("{RPC}: {}", e.0)))?;
            let now = st.now_ns();
            let idx = st.registry.index();
            let s = idx.rnic(&src).ok_or_else(|| {
                Status::not_found(format!("{RPC}: source {src} is not registered"))
            })?;
            if !is_active(s, now / 1_000_000_000, st.pinglist.active_threshold_sec) {
                return Err(Status::failed_precondition(format!(
                    "{RPC}: source {src} is not active (its agent stopped heartbeating)"
                )));
            }
            let d = idx.rnic(&dst).ok_or_else(|| {
                Status::not_found(format!("{RPC}: target {dst} is not registered"))
            })?;
            let mut t = make_target(d, PinglistType::Focus, labels.len() as u32, &src);
            t.flow_label = labels[0];
            t.flow_labels = labels.clone();
            drop(idx);
            let (window_ns, settle_ns) = st
                .analyzer()
                .map(|a| (a.window_ns(), a.params().localize_settle_ns))
                .unwrap_or((0, 0));
            let window_ns = if window_ns == 0 {
                DEFAULT_WINDOW_NS
            } else {
                window_ns
            };
            let deadline = now + TRACE_WINDOWS * window_ns + settle_ns;
            let trace = st
                .traces
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .start(src.clone(), dst, &labels, caller.who.clone(), now, deadline)
                .map_err(|e| Status::resource_exhausted(format!("{RPC}: {}", e.0)))?;
            let mut f = st.focus.lock().unwrap_or_else(|e| e.into_inner());
            f.start_trace(trace.id, src, t);
            st.focus_moved.send_replace(f.generation());
            Ok(trace)
        })();
        let result = match &r {
            Ok(t) => format!("ok: trace {} of {} labels", t.id, t.labels.len()),
            Err(s) => format!("error: {}", s.message()),
        };
        st.audit(&caller.who, caller.role.as_str(), RPC, &target, &result);
        r.map(Response::new)
    }
}
