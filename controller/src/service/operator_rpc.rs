//! `rpingmesh.operator.v1.OperatorService`: what operators and tools read, and the
//! actions (role operator, audited). Every call has passed the server's interceptor,
//! which put its [`OperatorCaller`] in the request (`crate::server`).

use super::*;
use crate::audit::AuditRecord;
use crate::auth::{require, OperatorCaller, Role};
use rpingmesh_proto::operator::{
    Action, AuditEntry as AuditEntryMsg, DeleteAgentRequest, DeleteAgentResponse, DrainRequest,
    EndActionRequest, GetTraceRequest, ListActionsRequest, ListActionsResponse, ListAuditRequest,
    ListAuditResponse, SilenceRequest, StartTraceRequest, Trace,
};

/// ListAudit's entries when the request says none, and at most.
const AUDIT_DEFAULT_LIMIT: usize = 100;
const AUDIT_MAX_LIMIT: usize = 10_000;

/// The caller the interceptor authenticated (everyone acts when no interceptor ran).
pub(super) fn operator_caller<T>(req: &Request<T>) -> OperatorCaller {
    req.extensions()
        .get::<OperatorCaller>()
        .cloned()
        .unwrap_or_else(OperatorCaller::anyone)
}

impl OperatorSvc {
    /// `caller` may act, or PERMISSION_DENIED (counted, logged, audited).
    pub(super) fn require_operator(
        &self,
        caller: &OperatorCaller,
        rpc: &'static str,
        target: &str,
    ) -> Result<(), Status> {
        require(caller, Role::Operator, rpc).map_err(|message| {
            self.0.refuse(
                &caller.who,
                caller.role.as_str(),
                target,
                Denial {
                    rpc,
                    reason: "role",
                    message,
                },
            )
        })
    }
}

fn optional_gid(field: &str, text: &str) -> Result<String, Status> {
    if text.is_empty() {
        Ok(String::new())
    } else {
        gid_arg(field, text)
    }
}

#[tonic::async_trait]
impl OperatorService for OperatorSvc {
    async fn delete_agent(
        &self,
        request: Request<DeleteAgentRequest>,
    ) -> Result<Response<DeleteAgentResponse>, Status> {
        const RPC: &str = "DeleteAgent";
        let caller = operator_caller(&request);
        let req = request.into_inner();
        self.require_operator(&caller, RPC, &req.agent_id)?;
        if self.0.registry.index().agent(&req.agent_id).is_none() {
            return Err(Status::not_found(format!(
                "{RPC}: agent {:?} is not registered",
                req.agent_id
            )));
        }
        let removed = self.0.registry.delete_agent(&req.agent_id);
        let result = match &removed {
            Ok(n) => format!("ok: {n} RNICs removed; reason: {}", req.reason),
            Err(e) => format!("error: {e}"),
        };
        self.0.audit(
            &caller.who,
            caller.role.as_str(),
            RPC,
            &req.agent_id,
            &result,
        );
        let n = removed.map_err(store_err)?;
        tracing::info!(agent_id = %req.agent_id, rnics = n, by = %caller.who, reason = %req.reason, "agent deleted by an operator");
        Ok(Response::new(DeleteAgentResponse {
            removed_rnics: n as u32,
        }))
    }

    async fn list_audit(
        &self,
        request: Request<ListAuditRequest>,
    ) -> Result<Response<ListAuditResponse>, Status> {
        let limit = match request.into_inner().limit as usize {
            0 => AUDIT_DEFAULT_LIMIT,
            n => n.min(AUDIT_MAX_LIMIT),
        };
        // The store may be etcd (a blocking call with its own bound): off the workers.
        let st = self.0.clone();
        let lines = tokio::task::spawn_blocking(move || st.registry.recent_audit(limit))
            .await
            .map_err(|e| Status::internal(format!("ListAudit: {e}")))?
            .map_err(store_err)?;
        let entries = lines
            .iter()
            .map(|l| {
                let r = AuditRecord::parse(l);
                AuditEntryMsg {
                    time_unix_ns: r.time_unix_ns,
                    who: r.who,
                    role: r.role,
                    rpc: r.rpc,
                    target: r.target,
                    result: r.result,
                }
            })
            .collect();
        Ok(Response::new(ListAuditResponse { entries }))
    }

    async fn drain(&self, request: Request<DrainRequest>) -> Result<Response<Action>, Status> {
        self.drain_rpc(request).await
    }

    async fn silence(&self, request: Request<SilenceRequest>) -> Result<Response<Action>, Status> {
        self.silence_rpc(request).await
    }

    async fn end_action(
        &self,
        request: Request<EndActionRequest>,
    ) -> Result<Response<Action>, Status> {
        self.end_action_rpc(request).await
    }

    async fn list_actions(
        &self,
        _request: Request<ListActionsRequest>,
    ) -> Result<Response<ListActionsResponse>, Status> {
        Ok(Response::new(ListActionsResponse {
            actions: self.0.actions_in_force(),
        }))
    }

    async fn start_trace(
        &self,
        request: Request<StartTraceRequest>,
    ) -> Result<Response<Trace>, Status> {
        self.start_trace_rpc(request).await
    }

    async fn get_trace(
        &self,
        request: Request<GetTraceRequest>,
    ) -> Result<Response<Trace>, Status> {
        let id = request.into_inner().id;
        self.0
            .trace(id)
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("GetTrace: no trace {id}")))
    }

    type WatchFindingsStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<FindingEvent, Status>> + Send>>;

    async fn list_hosts(
        &self,
        request: Request<ListHostsRequest>,
    ) -> Result<Response<ListHostsResponse>, Status> {
        let hosts = self.0.hosts(request.into_inner().problems_only);
        Ok(Response::new(ListHostsResponse { hosts }))
    }

    async fn get_host(
        &self,
        request: Request<GetHostRequest>,
    ) -> Result<Response<HostHealth>, Status> {
        let name = request.into_inner().hostname;
        self.0
            .host(&name)
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("host {name:?} has sent no Hostping report")))
    }

    async fn list_findings(
        &self,
        request: Request<ListFindingsRequest>,
    ) -> Result<Response<ListFindingsResponse>, Status> {
        let req = request.into_inner();
        let findings = self.0.findings(req.resolved_limit as usize, &req.kind)?;
        Ok(Response::new(ListFindingsResponse { findings }))
    }

    /// One "snapshot" event per current finding, then the live changes. What the server
    /// holds per subscriber is bounded by [`FINDINGS_CHANNEL_CAPACITY`]: a subscriber
    /// that falls further behind gets DATA_LOSS (which ends the call; calling again gives
    /// a fresh snapshot), never an unbounded buffer.
    async fn watch_findings(
        &self,
        request: Request<WatchFindingsRequest>,
    ) -> Result<Response<Self::WatchFindingsStream>, Status> {
        let kind = request.into_inner().kind;
        let mut stopping = self.0.stopping.subscribe();
        if *stopping.borrow_and_update() {
            return Err(shutting_down());
        }
        let (snapshot, mut changes) = self.0.watch_findings(&kind)?;
        // A small hand-off to the response: what waits for a slow client is the broadcast
        // receiver's backlog, bounded by the channel's capacity.
        let (tx, rx) = mpsc::channel::<Result<FindingEvent, Status>>(16);
        tokio::spawn(async move {
            for f in snapshot {
                let e = FindingEvent {
                    change: "snapshot".into(),
                    finding: Some(f),
                };
                if !forward(&tx, &mut stopping, Ok(e)).await {
                    return;
                }
            }
            loop {
                let next = tokio::select! {
                    r = changes.recv() => r,
                    _ = stopping.changed() => {
                        let _ = tx.try_send(Err(shutting_down()));
                        return;
                    }
                    _ = tx.closed() => return,
                };
                let out = match next {
                    Ok(e) if kind.is_empty() || e.finding.as_ref().is_some_and(|f| f.kind == kind) => {
                        Ok(e)
                    }
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(n)) => Err(Status::data_loss(format!(
                        "WatchFindings: this watcher fell {n} changes behind; call WatchFindings again for a fresh snapshot"
                    ))),
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let last = out.is_err();
                if !forward(&tx, &mut stopping, out).await || last {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
    async fn list_service_paths(
        &self,
        request: Request<ListServicePathsRequest>,
    ) -> Result<Response<ListServicePathsResponse>, Status> {
        let req = request.into_inner();
        let gid = optional_gid("gid", &req.gid)?;
        let paths = self.0.service_paths(&ServicePathFilter {
            service: &req.service,
            gid: &gid,
            source_tor_id: &req.source_tor_id,
            target_tor_id: &req.target_tor_id,
        });
        Ok(Response::new(ListServicePathsResponse { paths }))
    }

    async fn list_paths(
        &self,
        request: Request<ListPathsRequest>,
    ) -> Result<Response<ListPathsResponse>, Status> {
        let req = request.into_inner();
        let source_gid = optional_gid("source_gid", &req.source_gid)?;
        let target_gid = optional_gid("target_gid", &req.target_gid)?;
        let filter = PathFilter {
            source_tor_id: &req.source_tor_id,
            target_tor_id: &req.target_tor_id,
            source_gid: &source_gid,
            target_gid: &target_gid,
        };
        let paths = self.0.paths(&filter, req.all_windows);
        Ok(Response::new(ListPathsResponse { paths }))
    }

    async fn list_tor_pairs(
        &self,
        _request: Request<ListTorPairsRequest>,
    ) -> Result<Response<ListTorPairsResponse>, Status> {
        let pairs = self.0.tor_pairs();
        Ok(Response::new(ListTorPairsResponse { pairs }))
    }

    async fn list_rnics(
        &self,
        request: Request<ListRnicsRequest>,
    ) -> Result<Response<ListRnicsResponse>, Status> {
        let rnics = self.0.rnic_statuses(&request.into_inner().tor_id);
        Ok(Response::new(ListRnicsResponse { rnics }))
    }

    async fn list_violations(
        &self,
        request: Request<ListViolationsRequest>,
    ) -> Result<Response<ListViolationsResponse>, Status> {
        let limit = request.into_inner().limit as usize;
        let violations = match &self.0.analyzer {
            Some(a) => a
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .violations(limit)
                .into_iter()
                .map(|v| ViolationMsg {
                    kind: v.kind.as_str().to_string(),
                    summary: Some(v.summary),
                    detected_unix_ns: v.detected_unix_ns,
                })
                .collect(),
            None => Vec::new(),
        };
        Ok(Response::new(ListViolationsResponse { violations }))
    }
}
