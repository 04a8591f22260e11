//! `controller_agent.ControllerService`: what agents call (register, pinglists, path
//! reports, service flows, host health), each checked against the caller's identity
//! under mTLS (`crate::auth`).

use super::*;

impl ControllerSvc {
    /// The caller of `req`. Under mTLS a request whose certificate names nobody is
    /// refused here.
    fn caller<T>(&self, rpc: &'static str, req: &Request<T>) -> Result<Caller, Status> {
        self.0.auth.caller(rpc, req).map_err(|d| {
            let who = match req.remote_addr() {
                Some(a) => format!("unidentified@{a}"),
                None => "unidentified".into(),
            };
            self.0.refuse(&who, "unauthenticated", "", d)
        })
    }

    /// Whom a limit counts against: the certificate's agent, else the agent_id the
    /// request claims (without mTLS there is no other identity; the peer address would
    /// put every agent behind one address, or on one test host, in one budget).
    fn limit_key(caller: &Caller, claimed: &str) -> String {
        caller.identity().unwrap_or(claimed).to_string()
    }

    /// Applies one identity rule under the index read lock, refusing (after the lock is
    /// released) what it denies.
    fn check(
        &self,
        caller: &Caller,
        target: &str,
        rule: impl FnOnce(&str, &RegistryIndex) -> Result<(), Denial>,
    ) -> Result<(), Status> {
        let Some(id) = caller.identity() else {
            return Ok(());
        };
        let verdict = rule(id, &self.0.registry.index());
        verdict.map_err(|d| self.0.refuse(id, caller.role(), target, d))
    }
}

#[tonic::async_trait]
impl ControllerService for ControllerSvc {
    async fn report_host_health(
        &self,
        request: Request<HostHealthReport>,
    ) -> Result<Response<HostHealthAck>, Status> {
        let caller = self.caller("ReportHostHealth", &request)?;
        let r = request.into_inner();
        self.check(&caller, &r.hostname, |id, idx| {
            agent_rules::host_report(id, &r.agent_id, &r.hostname, idx)
        })?;
        let (host, n) = (r.hostname.clone(), r.findings.len());
        self.0.report_host(r)?;
        tracing::info!(hostname = %host, findings = n, "host report taken");
        Ok(Response::new(HostHealthAck { accepted: true }))
    }

    async fn report_service_flows(
        &self,
        request: Request<ServiceFlowReport>,
    ) -> Result<Response<ServiceFlowAck>, Status> {
        let caller = self.caller("ReportServiceFlows", &request)?;
        let req = request.into_inner();
        self.check(&caller, &req.agent_id, |id, _| {
            agent_rules::agent_id("ReportServiceFlows", id, &req.agent_id)
        })?;
        if req.agent_id.trim().is_empty() {
            return Err(Status::invalid_argument(
                "service flow report: agent_id is empty",
            ));
        }
        let st = &self.0;
        let agent_id = req.agent_id.clone();
        let (full_sync, n_up, n_rm) = (req.full_sync, req.upserts.len(), req.removals.len());
        let now = st.now_ns();
        let out = {
            let idx = st.registry.index();
            if idx.agent(&agent_id).is_none() {
                return Err(Status::not_found(format!(
                    "service flow report: agent {agent_id:?} is not registered (register first)"
                )));
            }
            st.service_table()
                .apply(&agent_id, idx.agent_gids(&agent_id), req, now)
        };
        st.note_alive(&agent_id);
        if st.registry.is_shared() {
            st.share_service_flows(&agent_id, now);
        }
        if out.dropped_bad_gid > 0 {
            tracing::warn!(
                agent_id = %agent_id,
                dropped = out.dropped_bad_gid,
                example = %out.example_bad_gid.as_deref().unwrap_or_default(),
                "dropped service flows with invalid GIDs"
            );
        }
        if let Some(g) = &out.first_foreign_source {
            // Once per agent: a tracer seeing other hosts' GIDs would otherwise flood.
            tracing::warn!(
                agent_id = %agent_id,
                local_gid = %g,
                "dropped service flows whose local GID is not one of the agent's registered RNICs (logged once per agent)"
            );
        }
        if out.rejected_over_limit > 0 {
            tracing::warn!(
                agent_id = %agent_id,
                rejected = out.rejected_over_limit,
                flows_known = out.flows_known,
                "service flows over max_service_flows_per_agent rejected"
            );
        }
        tracing::debug!(
            agent_id = %agent_id,
            full_sync,
            upserts = n_up,
            removals = n_rm,
            flows_known = out.flows_known,
            resync_required = out.resync_required,
            "service flows reported"
        );
        Ok(Response::new(ServiceFlowAck {
            accepted: true,
            resync_required: out.resync_required,
            flows_known: out.flows_known,
        }))
    }

    async fn register_agent(
        &self,
        request: Request<AgentRegistrationRequest>,
    ) -> Result<Response<AgentRegistrationResponse>, Status> {
        let caller = self.caller("RegisterAgent", &request)?;
        let req = request.into_inner();
        let who = Self::limit_key(&caller, &req.agent_id);
        self.0.take_registration(&who)?;
        if req.rnics.len() > self.0.max_rnics_per_agent {
            return Err(self.0.over_limit(
                &who,
                "RegisterAgent",
                "max_rnics_per_agent",
                &req.agent_id,
                format!(
                    "agent {:?} registers {} RNICs, at most {}",
                    req.agent_id,
                    req.rnics.len(),
                    self.0.max_rnics_per_agent
                ),
            ));
        }
        if req.agent_id.trim().is_empty() {
            return Err(Status::invalid_argument("registration: agent_id is empty"));
        }
        if req.tor_id.trim().is_empty() {
            return Err(Status::invalid_argument(format!(
                "registration of agent {:?}: tor_id is empty",
                req.agent_id
            )));
        }
        if req.rnics.is_empty() {
            return Err(Status::invalid_argument(format!(
                "registration of agent {:?} has no RNICs",
                req.agent_id
            )));
        }
        let mut rnics: Vec<RnicRecord> = Vec::with_capacity(req.rnics.len());
        for r in &req.rnics {
            let gid = normalize_gid(&r.gid).map_err(|e| {
                Status::invalid_argument(format!("registration of agent {:?}: {e}", req.agent_id))
            })?;
            if rnics.iter().any(|x| x.gid == gid) {
                return Err(Status::invalid_argument(format!(
                    "registration of agent {:?}: duplicate GID {gid}",
                    req.agent_id
                )));
            }
            let mut rnic = RnicRecord::of_info(r.clone(), &req.agent_id, 0);
            rnic.gid = gid;
            if rnic.host_name.is_empty() {
                rnic.host_name = req.hostname.clone();
            }
            // RNICs inherit the agent's ToR unless they name their own (multi-rail).
            if rnic.tor_id.is_empty() {
                rnic.tor_id = req.tor_id.clone();
            }
            rnics.push(rnic);
        }
        self.check(&caller, &req.agent_id, |id, idx| {
            let gids: Vec<&str> = rnics.iter().map(|r| r.gid.as_str()).collect();
            agent_rules::registration(id, &req.agent_id, &req.hostname, &gids, idx)
        })?;
        let agent = AgentRecord {
            agent_id: req.agent_id.clone(),
            agent_ip: req.agent_ip.clone(),
            hostname: req.hostname.clone(),
            tor_id: req.tor_id.clone(),
            last_updated: 0,
        };
        let now = self.0.liveness_now_sec();
        // A heartbeat repeats the registration: only one that changes what is held is
        // a change for the audit log.
        let changes = registration_changes(&self.0.registry.index(), &agent, &rnics);
        let stored = self.0.registry.register_agent(&agent, &rnics, now);
        let target = format!("agent {} ({} RNICs)", agent.agent_id, rnics.len());
        let role = caller.role();
        let result = match &stored {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("error: {e}"),
        };
        if changes || stored.is_err() {
            self.0
                .audit(caller.who(), role, "RegisterAgent", &target, &result);
        }
        stored.map_err(store_err)?;
        self.0
            .note_agent_version(&agent.agent_id, &req.agent_version);
        tracing::info!(agent_id = %agent.agent_id, tor_id = %agent.tor_id, rnics = rnics.len(), "agent registered");
        Ok(Response::new(AgentRegistrationResponse {
            success: true,
            message: format!(
                "registered {} RNIC(s) for agent {}",
                rnics.len(),
                agent.agent_id
            ),
            heartbeat_interval_sec: heartbeat_interval_sec(self.0.pinglist.active_threshold_sec),
        }))
    }

    async fn get_pinglist(
        &self,
        request: Request<PinglistRequest>,
    ) -> Result<Response<PinglistResponse>, Status> {
        let caller = self.caller("GetPinglist", &request)?;
        let req = request.into_inner();
        let ty = PinglistType::try_from(req.r#type).map_err(|_| {
            Status::invalid_argument(format!("unknown pinglist type {}", req.r#type))
        })?;
        let requester = if req.requester_gid.is_empty() {
            None
        } else {
            Some(gid_arg("requester_gid", &req.requester_gid)?)
        };
        self.check(&caller, &req.agent_id, |id, idx| {
            agent_rules::pinglist(id, &req.agent_id, requester.as_deref(), idx)
        })?;
        let st = &self.0;
        let now = st.liveness_now_sec();
        let idx = st.registry.index();
        if !req.agent_id.is_empty() && idx.agent(&req.agent_id).is_none() {
            return Err(Status::not_found(format!(
                "agent {:?} is not registered",
                req.agent_id
            )));
        }
        let (tor, exclude): (String, Vec<&str>) = match &requester {
            Some(g) => {
                let r = idx.rnic(g).ok_or_else(|| {
                    Status::not_found(format!("requester GID {g} is not registered"))
                })?;
                (r.tor_id.clone(), vec![g.as_str()])
            }
            None if !req.agent_id.is_empty() => {
                let a = idx.agent(&req.agent_id).expect("checked above");
                (
                    a.tor_id.clone(),
                    idx.agent_gids(&req.agent_id)
                        .iter()
                        .map(String::as_str)
                        .collect(),
                )
            }
            None => {
                return Err(Status::invalid_argument(
                    "pinglist request names neither requester_gid nor agent_id",
                ))
            }
        };
        let requester_key = requester.as_deref().unwrap_or(&req.agent_id);
        let mut rng = st.request_rng(requester_key, ty);
        let targets = match ty {
            PinglistType::TorMesh => {
                pinglist::tor_mesh(&idx, &tor, &exclude, requester_key, now, &st.pinglist)
            }
            PinglistType::InterTor => {
                pinglist::inter_tor(&idx, &tor, requester_key, now, &st.pinglist, &mut rng)
            }
            PinglistType::Focus => {
                let f = st.focus.lock().unwrap_or_else(|e| e.into_inner());
                exclude
                    .iter()
                    .flat_map(|g| f.targets_for(g).iter().cloned())
                    .collect()
            }
            PinglistType::Service => {
                let sources: Vec<&str> = match &requester {
                    Some(g) => vec![g.as_str()],
                    None => exclude.clone(),
                };
                let now_ns = st.now_ns();
                let table = st.service_table();
                let mut out = Vec::new();
                for g in sources {
                    let Some(owner) = idx.rnic(g).map(|r| r.agent_id.as_str()) else {
                        continue;
                    };
                    out.extend(table.pinglist(
                        &idx,
                        owner,
                        g,
                        now_ns,
                        st.pinglist.active_threshold_sec,
                    ));
                }
                out
            }
        };
        let mut targets = targets;
        // A drained RNIC neither probes nor is probed.
        st.drop_drained(&idx, &exclude, &mut targets);
        let owner = match &requester {
            Some(g) => idx.rnic(g).map(|r| r.agent_id.clone()),
            None => Some(req.agent_id.clone()),
        };
        drop(idx);
        if let Some(agent) = owner {
            st.note_alive(&agent);
        }
        Ok(Response::new(PinglistResponse {
            targets,
            r#type: ty as i32,
        }))
    }

    async fn report_probe_analysis(
        &self,
        request: Request<ProbeAnalysisReport>,
    ) -> Result<Response<ProbeAnalysisAck>, Status> {
        let caller = self.caller("ReportProbeAnalysis", &request)?;
        let st = &self.0;
        let n = request.get_ref().summaries.len();
        if n > st.max_summaries_per_report {
            let agent = &request.get_ref().agent_id;
            let who = Self::limit_key(&caller, agent);
            return Err(st.over_limit(
                &who,
                "ReportProbeAnalysis",
                "max_summaries_per_report",
                agent,
                format!(
                    "agent {agent:?} reports {n} path summaries at once, at most {}",
                    st.max_summaries_per_report
                ),
            ));
        }
        let mut req = request.into_inner();
        // GIDs as the analyzer keys them; an invalid one stays as sent and is dropped
        // below (counted), never taken for someone's.
        let mut valid = Vec::with_capacity(req.summaries.len());
        for s in &mut req.summaries {
            let ok_src = normalize_in_place(&mut s.source_gid);
            let ok_dst = normalize_in_place(&mut s.target_gid);
            valid.push(ok_src && ok_dst);
        }
        // A replica forwards what it checked against the sending agent, and is the
        // last hop (no forwarding loops).
        let forwarded = matches!(caller, Caller::Replica(_));
        if !forwarded {
            self.check(&caller, &req.agent_id, |id, idx| {
                let sources = req
                    .summaries
                    .iter()
                    .zip(&valid)
                    .filter(|(_, ok)| **ok)
                    .map(|(s, _)| s.source_gid.as_str());
                agent_rules::path_sources(id, &req.agent_id, sources, idx)
            })?;
            st.note_alive(&req.agent_id);
            if req.summaries.is_empty() && req.await_window_unix_ns > 0 {
                // Adaptive probing: answered when the window is localized, its ack
                // with the FOCUS generation that followed it. Only the analysis leader
                // plans FOCUS lists: another replica answers at once.
                st.await_localized(req.await_window_unix_ns).await;
                return Ok(Response::new(ProbeAnalysisAck {
                    accepted: true,
                    sla_violations: 0,
                    focus_generation: st.focus_generation(),
                    localized_through_unix_ns: st.localized_through(),
                }));
            }
            if let Some(ack) = st.forward_to_leader(&req).await {
                return Ok(Response::new(ack));
            }
        }
        let Some(analyzer) = &st.analyzer else {
            return Ok(Response::new(ProbeAnalysisAck {
                accepted: false,
                sla_violations: 0,
                focus_generation: 0,
                localized_through_unix_ns: 0,
            }));
        };
        let total = req.summaries.len();
        let mut batch: Vec<PathSummary> = Vec::with_capacity(total);
        let mut first_bad: Option<String> = None;
        for (s, ok) in req.summaries.into_iter().zip(valid) {
            if ok {
                batch.push(s);
            } else if first_bad.is_none() {
                first_bad = Some(if is_normalized_gid(&s.source_gid) {
                    s.target_gid
                } else {
                    s.source_gid
                });
            }
        }
        let dropped = total - batch.len();
        let now_ns = st.now_ns();
        let report = analyzer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ingest(batch, now_ns);
        st.metrics.summaries_ingested(report.ingested as u64);
        let has_service = report
            .violations
            .iter()
            .any(|v| v.summary.pinglist_type == PinglistType::Service as i32);
        // Agent-supplied names become metric attributes only when the table hands them out.
        let table = has_service.then(|| st.service_table());
        for v in &report.violations {
            let s = &v.summary;
            let service = match &table {
                Some(t) if s.pinglist_type == PinglistType::Service as i32 => {
                    Some(if t.is_known_service(&s.service) {
                        s.service.as_str()
                    } else {
                        OTHER_SERVICE
                    })
                }
                _ => None,
            };
            st.metrics
                .violation(&s.source_tor_id, &s.target_tor_id, v.kind, service);
            tracing::warn!(
                kind = v.kind.as_str(),
                source_gid = %s.source_gid,
                target_gid = %s.target_gid,
                source_tor = %s.source_tor_id,
                target_tor = %s.target_tor_id,
                window_start_unix_ns = s.window_start_unix_ns,
                probe_total = s.probe_total,
                probe_failed = s.probe_failed,
                network_rtt_p99_ns = s.network_rtt_p99_ns,
                service = %s.service,
                "SLA violation"
            );
        }
        drop(table);
        if dropped > 0 {
            st.dropped_summaries
                .fetch_add(dropped as u64, Ordering::Relaxed);
            tracing::warn!(
                agent_id = %req.agent_id,
                dropped,
                example_gid = ?first_bad.unwrap_or_default(),
                "dropped path summaries with invalid GIDs"
            );
        }
        Ok(Response::new(ProbeAnalysisAck {
            accepted: dropped == 0 || report.ingested > 0,
            sla_violations: report.violations.len() as u32,
            focus_generation: st.focus_generation(),
            localized_through_unix_ns: 0,
        }))
    }
}

/// Whether registering `agent` with `rnics` changes what `idx` holds (ignoring times).
fn registration_changes(idx: &RegistryIndex, agent: &AgentRecord, rnics: &[RnicRecord]) -> bool {
    let Some(old) = idx.agent(&agent.agent_id) else {
        return true;
    };
    let same_agent = (&old.agent_ip, &old.hostname, &old.tor_id)
        == (&agent.agent_ip, &agent.hostname, &agent.tor_id);
    let held = idx.agent_gids(&agent.agent_id);
    !same_agent
        || held.len() != rnics.len()
        || rnics.iter().any(|r| {
            idx.rnic(&r.gid).is_none_or(|o| {
                o.agent_id != r.agent_id
                    || (
                        o.qpn,
                        &o.ip_address,
                        &o.host_name,
                        &o.tor_id,
                        &o.device_name,
                    ) != (
                        r.qpn,
                        &r.ip_address,
                        &r.host_name,
                        &r.tor_id,
                        &r.device_name,
                    )
            })
        })
}
