//! The operator actions on drains and silences (role operator, each audited): what
//! `OperatorService::{drain, silence, end_action}` do.

use rpingmesh_proto::operator::{Action, DrainRequest, EndActionRequest, SilenceRequest};
use tonic::{Request, Response, Status};

use super::operator_rpc::operator_caller;
use super::{gid_arg, store_err, OperatorSvc};
use crate::actions::{DRAIN, SILENCE};
use crate::auth::OperatorCaller;
use crate::localize::ComponentKind;

impl OperatorSvc {
    /// Audits the action (or its refusal) and answers with it.
    fn taken(
        &self,
        caller: &OperatorCaller,
        rpc: &'static str,
        target: &str,
        r: Result<Action, Status>,
    ) -> Result<Response<Action>, Status> {
        let result = match &r {
            Ok(a) => format!(
                "ok: action {} until {}; reason: {}",
                a.id,
                if a.expires_unix_ns == 0 {
                    "ended".to_string()
                } else {
                    format!("{} ns", a.expires_unix_ns)
                },
                a.reason
            ),
            Err(s) => format!("error: {}", s.message()),
        };
        self.0
            .audit(&caller.who, caller.role.as_str(), rpc, target, &result);
        if let Ok(a) = &r {
            tracing::info!(id = a.id, kind = %a.kind, target_kind = %a.target_kind, target = %a.target, by = %caller.who, reason = %a.reason, "operator action");
        }
        r.map(Response::new)
    }

    fn take(
        &self,
        caller: &OperatorCaller,
        kind: &str,
        target_kind: &str,
        target: String,
        reason: String,
        duration_sec: u32,
    ) -> Result<Action, Status> {
        self.0
            .take_action(
                kind,
                target_kind,
                target,
                reason,
                caller.who.clone(),
                duration_sec,
            )
            .map_err(store_err)?
            .map_err(|e| Status::invalid_argument(e.0))
    }

    pub(super) async fn drain_rpc(
        &self,
        request: Request<DrainRequest>,
    ) -> Result<Response<Action>, Status> {
        const RPC: &str = "Drain";
        let caller = operator_caller(&request);
        let req = request.into_inner();
        let target = if req.rnic_gid.is_empty() {
            req.host.clone()
        } else {
            req.rnic_gid.clone()
        };
        self.require_operator(&caller, RPC, &target)?;
        let r = (|| {
            let (target_kind, target) = match (req.rnic_gid.is_empty(), req.host.is_empty()) {
                (false, true) => {
                    let gid = gid_arg("rnic_gid", &req.rnic_gid)?;
                    if self.0.registry.index().rnic(&gid).is_none() {
                        return Err(Status::not_found(format!(
                            "{RPC}: RNIC {gid} is not registered"
                        )));
                    }
                    ("rnic", gid)
                }
                (true, false) => {
                    let known = self
                        .0
                        .registry
                        .index()
                        .rnics()
                        .any(|r| r.host_name == req.host);
                    if !known {
                        return Err(Status::not_found(format!(
                            "{RPC}: no RNIC is registered on host {:?}",
                            req.host
                        )));
                    }
                    ("host", req.host.clone())
                }
                _ => {
                    return Err(Status::invalid_argument(format!(
                        "{RPC}: name exactly one of rnic_gid and host"
                    )))
                }
            };
            self.take(
                &caller,
                DRAIN,
                target_kind,
                target,
                req.reason.clone(),
                req.duration_sec,
            )
        })();
        self.taken(&caller, RPC, &target, r)
    }

    pub(super) async fn silence_rpc(
        &self,
        request: Request<SilenceRequest>,
    ) -> Result<Response<Action>, Status> {
        const RPC: &str = "Silence";
        let caller = operator_caller(&request);
        let req = request.into_inner();
        let target = if req.finding_id != 0 {
            format!("finding {}", req.finding_id)
        } else {
            format!("{} {}", req.component_kind, req.location)
        };
        self.require_operator(&caller, RPC, &target)?;
        let r = (|| {
            let (target_kind, t) = if req.finding_id != 0 {
                let known = self
                    .0
                    .findings(0, "")?
                    .iter()
                    .any(|f| f.id == req.finding_id);
                if !known {
                    return Err(Status::not_found(format!(
                        "{RPC}: no finding {}",
                        req.finding_id
                    )));
                }
                ("finding".to_string(), req.finding_id.to_string())
            } else {
                let kind = ComponentKind::parse(&req.component_kind).ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "{RPC}: component_kind must be rnic, host, tor or link, not {:?} (or give a finding_id)",
                        req.component_kind
                    ))
                })?;
                if req.location.trim().is_empty() {
                    return Err(Status::invalid_argument(format!(
                        "{RPC}: a component needs its location"
                    )));
                }
                (kind.as_str().to_string(), req.location.clone())
            };
            self.take(
                &caller,
                SILENCE,
                &target_kind,
                t,
                req.reason.clone(),
                req.duration_sec,
            )
        })();
        self.taken(&caller, RPC, &target, r)
    }

    pub(super) async fn end_action_rpc(
        &self,
        request: Request<EndActionRequest>,
    ) -> Result<Response<Action>, Status> {
        const RPC: &str = "EndAction";
        let caller = operator_caller(&request);
        let id = request.into_inner().id;
        let target = format!("action {id}");
        self.require_operator(&caller, RPC, &target)?;
        let r = match self.0.end_action(id).map_err(store_err) {
            Ok(Some(a)) => Ok(a),
            Ok(None) => Err(Status::not_found(format!("{RPC}: no action {id} in force"))),
            Err(e) => Err(e),
        };
        self.taken(&caller, RPC, &target, r)
    }
}
