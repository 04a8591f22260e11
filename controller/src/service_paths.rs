//! Live service-path table (pure, no I/O, no clock: `now` is always an argument).
//!
//! Agents report the service QPs their tracer sees (`ReportServiceFlows`). Per agent the
//! table keeps flows keyed by (local GID, local QPN); reports are incremental upserts and
//! removals, or a full sync that replaces the agent's set. An agent that has not reported
//! for `flow_ttl_sec` (an empty report is a heartbeat) is treated as gone and its flows
//! are dropped. Paths are flows grouped by (source GID, remote GID, flow label, SL, TC,
//! service); the remote end is resolved against the registry index: registered ->
//! monitored and probed through a SERVICE pinglist, unknown -> listed as unmonitored.

use std::collections::{BTreeMap, HashMap};

use rpingmesh_proto::controller_agent::{
    PingTarget, PinglistType, ServiceFlow, ServiceFlowKey, ServiceFlowReport, Workload,
};
use rpingmesh_proto::gid::normalize_gid;
use rpingmesh_proto::operator::{ServicePath, ServicePathQp};

use crate::pinglist::is_active;
use crate::registry::RegistryIndex;

/// Service name used once `max_services` distinct names are in use.
pub const OTHER_SERVICE: &str = "other";
/// Service name of a flow with neither a service nor a comm.
pub const UNKNOWN_SERVICE: &str = "unknown";
/// Longest service name kept (longer names are cut on a char boundary).
pub const MAX_SERVICE_NAME_LEN: usize = 64;
/// Longest workload field kept (a cgroup path may be longer: [`MAX_CGROUP_PATH_LEN`]).
pub const MAX_WORKLOAD_FIELD_LEN: usize = 256;
pub const MAX_CGROUP_PATH_LEN: usize = 1024;

const NS_PER_SEC: u64 = 1_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServicePathParams {
    /// An agent silent for longer than this loses its flows.
    pub flow_ttl_sec: u64,
    /// Flows held per agent; new keys beyond it are rejected and counted.
    pub max_flows_per_agent: usize,
    /// Distinct service names in use at once; further names become [`OTHER_SERVICE`].
    pub max_services: usize,
}

impl Default for ServicePathParams {
    fn default() -> Self {
        Self {
            flow_ttl_sec: 120,
            max_flows_per_agent: 4096,
            max_services: 64,
        }
    }
}

/// One service flow as the controller keeps it: GIDs normalized, service name bounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowRecord {
    pub local_gid: String,
    pub local_qpn: u32,
    pub remote_gid: String,
    pub remote_qpn: u32,
    /// The path's flow label: the service's, or for 0 the one the NIC derives from the
    /// QPNs (`flowlabel::service_path_label`).
    pub flow_label: u32,
    pub traffic_class: u32,
    pub service_level: u32,
    pub pid: u32,
    pub comm: String,
    pub cgroup_id: u64,
    pub first_seen_unix_ns: u64,
    pub last_seen_unix_ns: u64,
    /// Bounded name: the flow's `service`, else its comm, else "unknown"; "other" past the cap.
    pub service: String,
    /// The workload its agent resolved (fields bounded), if the agent sent one.
    pub workload: Option<Workload>,
}

#[derive(Debug, Default)]
struct AgentFlows {
    flows: HashMap<(String, u32), FlowRecord>,
    last_report_unix_ns: u64,
    /// The foreign-source warning was already handed out for this agent.
    foreign_logged: bool,
}

/// Lifetime counters of the table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ServicePathStats {
    pub reports: u64,
    pub flows_upserted: u64,
    pub flows_removed: u64,
    /// Flows with an unparsable local or remote GID.
    pub dropped_bad_gid: u64,
    /// Flows whose local GID is not one of the reporting agent's registered RNICs.
    pub dropped_foreign_source: u64,
    /// New flows refused because the agent was at `max_flows_per_agent`.
    pub rejected_over_limit: u64,
    /// Flows whose name was replaced by "other" because of `max_services`.
    pub services_capped: u64,
    /// Flows dropped because their agent stopped reporting.
    pub flows_expired: u64,
}

/// What one report did; the caller logs and acks from it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ApplyOutcome {
    /// No state was held for the agent and the report was incremental: ask for a full sync.
    pub resync_required: bool,
    /// Flows held for the agent after the report.
    pub flows_known: u32,
    pub upserted: u32,
    pub removed: u32,
    pub dropped_bad_gid: u32,
    pub dropped_foreign_source: u32,
    pub rejected_over_limit: u32,
    /// First offending flow (text) of each drop reason, for one log line.
    pub example_bad_gid: Option<String>,
    /// Set only the first time an agent reports a foreign source GID.
    pub first_foreign_source: Option<String>,
}

/// Filters of [`ServicePathTable::list`]; empty strings match everything. `gid` must be
/// normalized and matches either end.
#[derive(Debug, Default, Clone)]
pub struct ServicePathFilter<'a> {
    pub service: &'a str,
    pub gid: &'a str,
    pub source_tor_id: &'a str,
    pub target_tor_id: &'a str,
}

#[derive(Debug, Default)]
pub struct ServicePathTable {
    params: ServicePathParams,
    agents: HashMap<String, AgentFlows>,
    /// Service name -> flows using it. A name leaves when its last flow does, so the cap
    /// bounds names in use, not names ever seen.
    services: HashMap<String, usize>,
    stats: ServicePathStats,
}

/// Cuts `s` to at most `max` bytes on a char boundary.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// A workload as an agent sent it, every field cut to its bound.
fn bounded_workload(w: Workload) -> Workload {
    let t = |s: String| truncate(s, MAX_WORKLOAD_FIELD_LEN);
    Workload {
        kind: t(w.kind),
        key: t(w.key),
        name: t(w.name),
        namespace: t(w.namespace),
        id: t(w.id),
        part: t(w.part),
        cgroup_path: truncate(w.cgroup_path, MAX_CGROUP_PATH_LEN),
    }
}

/// The raw service identity of a flow before the cap: `service`, else comm, else "unknown".
pub fn raw_service_name(service: &str, comm: &str) -> String {
    let pick = if !service.trim().is_empty() {
        service.trim()
    } else if !comm.trim().is_empty() {
        comm.trim()
    } else {
        UNKNOWN_SERVICE
    };
    // Control characters would garble log lines and tables.
    let clean: String = pick
        .chars()
        .map(|c| if c.is_control() { '_' } else { c })
        .collect();
    truncate(clean, MAX_SERVICE_NAME_LEN)
}

impl ServicePathTable {
    pub fn new(params: ServicePathParams) -> Self {
        Self {
            params,
            ..Default::default()
        }
    }

    pub fn params(&self) -> &ServicePathParams {
        &self.params
    }

    pub fn stats(&self) -> ServicePathStats {
        self.stats
    }

    /// Distinct service names currently in use (excluding "other").
    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// True when `name` is a name the table currently hands out ("other" included), so
    /// callers can bound metric attributes taken from agent input.
    pub fn is_known_service(&self, name: &str) -> bool {
        name == OTHER_SERVICE || self.services.contains_key(name)
    }

    fn is_live(&self, a: &AgentFlows, now_unix_ns: u64) -> bool {
        now_unix_ns.saturating_sub(a.last_report_unix_ns)
            <= self.params.flow_ttl_sec.saturating_mul(NS_PER_SEC)
    }

    /// Flows held for a live agent (0 for unknown or expired agents).
    pub fn flows_known(&self, agent_id: &str, now_unix_ns: u64) -> usize {
        self.agents
            .get(agent_id)
            .filter(|a| self.is_live(a, now_unix_ns))
            .map_or(0, |a| a.flows.len())
    }

    /// All flows of a live agent, sorted by key (tests, debugging).
    pub fn agent_flows(&self, agent_id: &str, now_unix_ns: u64) -> Vec<FlowRecord> {
        let mut v: Vec<FlowRecord> = self
            .agents
            .get(agent_id)
            .filter(|a| self.is_live(a, now_unix_ns))
            .map(|a| a.flows.values().cloned().collect())
            .unwrap_or_default();
        v.sort_by(|a, b| (&a.local_gid, a.local_qpn).cmp(&(&b.local_gid, b.local_qpn)));
        v
    }

    fn admit_service(&mut self, raw: String) -> String {
        if let Some(n) = self.services.get_mut(&raw) {
            *n += 1;
            return raw;
        }
        if raw == OTHER_SERVICE {
            return raw;
        }
        if self.services.len() < self.params.max_services {
            self.services.insert(raw.clone(), 1);
            raw
        } else {
            self.stats.services_capped += 1;
            OTHER_SERVICE.to_string()
        }
    }

    fn release_service(services: &mut HashMap<String, usize>, name: &str) {
        if let Some(n) = services.get_mut(name) {
            *n -= 1;
            if *n == 0 {
                services.remove(name);
            }
        }
    }

    fn drop_agent_flows(&mut self, agent_id: &str) -> usize {
        let Some(a) = self.agents.get_mut(agent_id) else {
            return 0;
        };
        let n = a.flows.len();
        for (_, f) in a.flows.drain() {
            Self::release_service(&mut self.services, &f.service);
        }
        n
    }

    /// Drops the state of agents silent for longer than the TTL; returns flows dropped.
    pub fn expire(&mut self, now_unix_ns: u64) -> usize {
        let dead: Vec<String> = self
            .agents
            .iter()
            .filter(|(_, a)| !self.is_live(a, now_unix_ns))
            .map(|(id, _)| id.clone())
            .collect();
        let mut n = 0;
        for id in dead {
            n += self.drop_agent_flows(&id);
            self.agents.remove(&id);
        }
        self.stats.flows_expired += n as u64;
        n
    }

    /// Applies one report of `agent_id`, whose registered RNIC GIDs (normalized) are
    /// `agent_gids`. Removals are applied before upserts, so a QPN reused within one
    /// report ends up as the new flow. Bad flows are dropped and counted; the rest apply.
    pub fn apply(
        &mut self,
        agent_id: &str,
        agent_gids: &[String],
        report: ServiceFlowReport,
        now_unix_ns: u64,
    ) -> ApplyOutcome {
        let mut out = ApplyOutcome::default();
        self.stats.reports += 1;
        // An agent past its TTL is as good as unknown: its flows are gone.
        let held = self
            .agents
            .get(agent_id)
            .is_some_and(|a| self.is_live(a, now_unix_ns));
        if !held {
            if self.agents.contains_key(agent_id) {
                let n = self.drop_agent_flows(agent_id);
                self.stats.flows_expired += n as u64;
            }
            self.agents.remove(agent_id);
        }
        out.resync_required = !held && !report.full_sync;
        if report.full_sync {
            self.drop_agent_flows(agent_id);
        }
        self.agents
            .entry(agent_id.to_string())
            .or_default()
            .last_report_unix_ns = now_unix_ns;

        if !report.full_sync {
            for k in report.removals {
                let Some(gid) = normalize_gid(&k.local_gid).ok() else {
                    // Removing an unparsable key is a no-op; nothing can match it.
                    continue;
                };
                let a = self.agents.get_mut(agent_id).expect("inserted above");
                if let Some(f) = a.flows.remove(&(gid, k.local_qpn)) {
                    Self::release_service(&mut self.services, &f.service);
                    out.removed += 1;
                }
            }
        }

        for f in report.upserts {
            let (local_gid, remote_gid) =
                match (normalize_gid(&f.local_gid), normalize_gid(&f.remote_gid)) {
                    (Ok(l), Ok(r)) => (l, r),
                    (l, _) => {
                        out.dropped_bad_gid += 1;
                        if out.example_bad_gid.is_none() {
                            out.example_bad_gid = Some(if l.is_err() {
                                format!("local_gid {:?}", f.local_gid)
                            } else {
                                format!("remote_gid {:?}", f.remote_gid)
                            });
                        }
                        continue;
                    }
                };
            if !agent_gids.contains(&local_gid) {
                out.dropped_foreign_source += 1;
                let a = self.agents.get_mut(agent_id).expect("inserted above");
                if !a.foreign_logged {
                    a.foreign_logged = true;
                    out.first_foreign_source = Some(local_gid);
                }
                continue;
            }
            let key = (local_gid, f.local_qpn);
            let a = self.agents.get_mut(agent_id).expect("inserted above");
            let old = a.flows.remove(&key);
            if old.is_none() && a.flows.len() >= self.params.max_flows_per_agent {
                out.rejected_over_limit += 1;
                continue;
            }
            if let Some(old) = &old {
                Self::release_service(&mut self.services, &old.service);
            }
            let service = self.admit_service(raw_service_name(&f.service, &f.comm));
            let ServiceFlow {
                remote_qpn,
                flow_label,
                traffic_class,
                service_level,
                pid,
                comm,
                cgroup_id,
                first_seen_unix_ns,
                last_seen_unix_ns,
                workload,
                ..
            } = f;
            let rec = FlowRecord {
                local_gid: key.0.clone(),
                local_qpn: key.1,
                remote_gid,
                remote_qpn,
                // The path's label: the service's own, or for 0 the one the NIC derives
                // from the QPNs, so SERVICE probes take the service's ECMP path.
                flow_label: rpingmesh_protocol::flowlabel::service_path_label(
                    flow_label, key.1, remote_qpn,
                ),
                traffic_class: traffic_class & 0xFF,
                service_level: service_level & 0xF,
                pid,
                comm: truncate(comm, MAX_SERVICE_NAME_LEN),
                cgroup_id,
                first_seen_unix_ns,
                last_seen_unix_ns,
                service,
                workload: workload.map(bounded_workload),
            };
            let a = self.agents.get_mut(agent_id).expect("inserted above");
            a.flows.insert(key, rec);
            out.upserted += 1;
        }

        out.flows_known = self.agents[agent_id].flows.len() as u32;
        self.stats.flows_upserted += out.upserted as u64;
        self.stats.flows_removed += out.removed as u64;
        self.stats.dropped_bad_gid += out.dropped_bad_gid as u64;
        self.stats.dropped_foreign_source += out.dropped_foreign_source as u64;
        self.stats.rejected_over_limit += out.rejected_over_limit as u64;
        out
    }

    /// Service paths of every live agent, grouped, resolved against `index` and
    /// filtered; ordered by (service, source GID, target GID, flow label, SL, TC).
    /// `latest` is left empty for the caller to join with the analyzer.
    pub fn list(
        &self,
        index: &RegistryIndex,
        filter: &ServicePathFilter<'_>,
        now_unix_ns: u64,
    ) -> Vec<ServicePath> {
        type Key<'a> = (&'a str, &'a str, &'a str, u32, u32, u32);
        let mut groups: BTreeMap<Key<'_>, (&str, Option<&Workload>, Vec<ServicePathQp>)> =
            BTreeMap::new();
        for (agent_id, a) in &self.agents {
            if !self.is_live(a, now_unix_ns) {
                continue;
            }
            for f in a.flows.values() {
                if !filter.service.is_empty() && f.service != filter.service {
                    continue;
                }
                if !filter.gid.is_empty() && f.local_gid != filter.gid && f.remote_gid != filter.gid
                {
                    continue;
                }
                let key = (
                    f.service.as_str(),
                    f.local_gid.as_str(),
                    f.remote_gid.as_str(),
                    f.flow_label,
                    f.service_level,
                    f.traffic_class,
                );
                let g = groups
                    .entry(key)
                    .or_insert((agent_id.as_str(), None, Vec::new()));
                g.1 = g.1.or(f.workload.as_ref());
                g.2.push(ServicePathQp {
                    local_qpn: f.local_qpn,
                    remote_qpn: f.remote_qpn,
                    pid: f.pid,
                    comm: f.comm.clone(),
                    first_seen_unix_ns: f.first_seen_unix_ns,
                    workload_part: f
                        .workload
                        .as_ref()
                        .map(|w| w.part.clone())
                        .unwrap_or_default(),
                });
            }
        }
        let mut out = Vec::with_capacity(groups.len());
        for ((service, src, dst, label, sl, tc), (agent_id, workload, mut qps)) in groups {
            qps.sort_by_key(|q| q.local_qpn);
            let source_tor_id = index
                .rnic(src)
                .map(|r| r.tor_id.clone())
                .unwrap_or_default();
            let target = index.rnic(dst);
            let target_tor_id = target.map(|r| r.tor_id.clone()).unwrap_or_default();
            if !filter.source_tor_id.is_empty() && source_tor_id != filter.source_tor_id {
                continue;
            }
            if !filter.target_tor_id.is_empty() && target_tor_id != filter.target_tor_id {
                continue;
            }
            out.push(ServicePath {
                source_gid: src.to_string(),
                source_tor_id,
                source_agent_id: agent_id.to_string(),
                target_gid: dst.to_string(),
                target_tor_id,
                monitored: target.is_some(),
                service: service.to_string(),
                flow_label: label,
                traffic_class: tc,
                service_level: sl,
                flows: qps.len() as u32,
                latest: None,
                qps,
                workload: workload.cloned(),
            });
        }
        out
    }

    /// SERVICE pinglist of `requester_gid` (owned by `agent_id`): one target per
    /// monitored path from that RNIC whose remote RNIC is registered and active, probed
    /// on exactly the service's flow label with its SL/TC. Paths with the same (target,
    /// label, SL, TC) are probed once, named after the alphabetically first service.
    pub fn pinglist(
        &self,
        index: &RegistryIndex,
        agent_id: &str,
        requester_gid: &str,
        now_unix_ns: u64,
        active_threshold_sec: u64,
    ) -> Vec<PingTarget> {
        let Some(a) = self
            .agents
            .get(agent_id)
            .filter(|a| self.is_live(a, now_unix_ns))
        else {
            return Vec::new();
        };
        let now_sec = now_unix_ns / NS_PER_SEC;
        // (target, label, sl, tc) -> smallest service name.
        let mut uniq: BTreeMap<(&str, u32, u32, u32), &str> = BTreeMap::new();
        for f in a.flows.values() {
            if f.local_gid != requester_gid || f.remote_gid == requester_gid {
                continue;
            }
            let e = uniq
                .entry((
                    f.remote_gid.as_str(),
                    f.flow_label,
                    f.service_level,
                    f.traffic_class,
                ))
                .or_insert(f.service.as_str());
            if f.service.as_str() < *e {
                *e = f.service.as_str();
            }
        }
        let mut out = Vec::with_capacity(uniq.len());
        for ((dst, label, sl, tc), service) in uniq {
            let Some(r) = index.rnic(dst) else { continue };
            if !is_active(r, now_sec, active_threshold_sec) {
                continue;
            }
            out.push(PingTarget {
                target_gid: r.gid.clone(),
                // The remote RNIC's probe responder, not the service QP.
                target_qpn: r.qpn,
                target_ip: r.ip_address.clone(),
                target_hostname: r.host_name.clone(),
                target_tor_id: r.tor_id.clone(),
                target_device_name: r.device_name.clone(),
                source_port: 0,
                flow_label: label,
                priority: 0,
                // Exactly the service's path: one label, no rotation set.
                flow_label_count: 1,
                flow_label_seed: label,
                pinglist_type: PinglistType::Service as i32,
                traffic_class: tc,
                service_level: sl,
                service: service.to_string(),
                flow_labels: Vec::new(),
            });
        }
        out
    }
}

/// Removal key helper (tests and agents' convenience).
pub fn flow_key(local_gid: &str, local_qpn: u32) -> ServiceFlowKey {
    ServiceFlowKey {
        local_gid: local_gid.to_string(),
        local_qpn,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{AgentRecord, RnicRecord};

    const SEC: u64 = NS_PER_SEC;
    const T0: u64 = 1_000_000 * SEC;

    fn g(s: &str) -> String {
        normalize_gid(s).unwrap()
    }

    fn index(rnics: &[(&str, &str, &str)]) -> RegistryIndex {
        // (agent, gid, tor); registered at T0.
        let mut idx = RegistryIndex::default();
        let mut by_agent: BTreeMap<&str, Vec<RnicRecord>> = BTreeMap::new();
        for (agent, gid, tor) in rnics {
            by_agent.entry(agent).or_default().push(RnicRecord {
                gid: g(gid),
                qpn: 4000,
                ip_address: "10.0.0.1".into(),
                host_name: format!("host-{agent}"),
                tor_id: tor.to_string(),
                device_name: "mlx5_0".into(),
                agent_id: agent.to_string(),
                last_updated: 0,
            });
        }
        for (agent, rs) in by_agent {
            let a = AgentRecord {
                agent_id: agent.into(),
                tor_id: rs[0].tor_id.clone(),
                ..Default::default()
            };
            idx.register_agent(&a, &rs, T0 / SEC);
        }
        idx
    }

    fn flow(local: &str, qpn: u32, remote: &str, label: u32, svc: &str) -> ServiceFlow {
        ServiceFlow {
            local_gid: local.into(),
            local_qpn: qpn,
            remote_gid: remote.into(),
            remote_qpn: qpn + 1,
            flow_label: label,
            traffic_class: 96,
            service_level: 3,
            pid: 42,
            comm: "trainer".into(),
            service: svc.into(),
            ..Default::default()
        }
    }

    fn inc(upserts: Vec<ServiceFlow>, removals: Vec<ServiceFlowKey>) -> ServiceFlowReport {
        ServiceFlowReport {
            agent_id: "a".into(),
            full_sync: false,
            upserts,
            removals,
        }
    }

    fn full(upserts: Vec<ServiceFlow>) -> ServiceFlowReport {
        ServiceFlowReport {
            full_sync: true,
            ..inc(upserts, vec![])
        }
    }

    fn gids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| g(s)).collect()
    }

    #[test]
    fn upsert_remove_and_full_sync_are_idempotent() {
        let mut t = ServicePathTable::new(ServicePathParams::default());
        let mine = gids(&["fd00::1"]);
        let r = t.apply(
            "a",
            &mine,
            full(vec![flow("fd00::1", 10, "fd00::2", 5, "")]),
            T0,
        );
        assert!(!r.resync_required, "full sync never asks for a resync");
        assert_eq!((r.flows_known, r.upserted), (1, 1));
        // Same upsert again: same state.
        let before = t.agent_flows("a", T0);
        let r = t.apply(
            "a",
            &mine,
            inc(vec![flow("fd00::1", 10, "fd00::2", 5, "")], vec![]),
            T0,
        );
        assert!(!r.resync_required);
        assert_eq!(r.flows_known, 1);
        assert_eq!(t.agent_flows("a", T0), before);
        // An upsert replaces by key (label changed), a second key adds.
        t.apply(
            "a",
            &mine,
            inc(
                vec![
                    flow("FD00::1", 10, "fd00::2", 6, ""),
                    flow("fd00::1", 11, "fd00::3", 7, ""),
                ],
                vec![],
            ),
            T0,
        );
        let f = t.agent_flows("a", T0);
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].local_qpn, f[0].flow_label), (10, 6));
        assert_eq!(f[0].service, "trainer", "comm when no service is set");
        // Removal, twice (second is a no-op), plus an unknown and an unparsable key.
        for _ in 0..2 {
            t.apply(
                "a",
                &mine,
                inc(
                    vec![],
                    vec![
                        flow_key("fd00::1", 10),
                        flow_key("fd00::1", 99),
                        flow_key("zz", 1),
                    ],
                ),
                T0,
            );
            assert_eq!(t.flows_known("a", T0), 1);
        }
        // Removal + upsert of the same key in one report: the new flow wins.
        let r = t.apply(
            "a",
            &mine,
            inc(
                vec![flow("fd00::1", 11, "fd00::4", 8, "")],
                vec![flow_key("fd00::1", 11)],
            ),
            T0,
        );
        assert_eq!((r.removed, r.upserted, r.flows_known), (1, 1, 1));
        assert_eq!(t.agent_flows("a", T0)[0].remote_gid, g("fd00::4"));
        // Full sync replaces everything, and is idempotent.
        let set = vec![
            flow("fd00::1", 20, "fd00::5", 1, ""),
            flow("fd00::1", 21, "fd00::5", 2, ""),
        ];
        t.apply("a", &mine, full(set.clone()), T0);
        let once = t.agent_flows("a", T0);
        t.apply("a", &mine, full(set), T0);
        assert_eq!(t.agent_flows("a", T0), once);
        assert_eq!(
            once.iter().map(|f| f.local_qpn).collect::<Vec<_>>(),
            vec![20, 21]
        );
        // An empty full sync clears the set but keeps the agent known.
        let r = t.apply("a", &mine, full(vec![]), T0);
        assert_eq!(r.flows_known, 0);
        let r = t.apply("a", &mine, inc(vec![], vec![]), T0);
        assert!(!r.resync_required);
        assert_eq!(t.service_count(), 0, "names released with their flows");
    }

    #[test]
    fn resync_after_restart_and_after_expiry() {
        let mine = gids(&["fd00::1"]);
        // A fresh table is a restarted controller.
        let mut t = ServicePathTable::new(ServicePathParams::default());
        let r = t.apply("a", &mine, inc(vec![], vec![]), T0);
        assert!(
            r.resync_required,
            "incremental report to an empty controller"
        );
        let r = t.apply(
            "a",
            &mine,
            full(vec![flow("fd00::1", 1, "fd00::2", 1, "")]),
            T0,
        );
        assert!(!r.resync_required);
        let r = t.apply("a", &mine, inc(vec![], vec![]), T0 + SEC);
        assert!(!r.resync_required);
        assert_eq!(r.flows_known, 1);
        // Other agents do not count as state for this one.
        assert!(
            t.apply("b", &gids(&["fd00::9"]), inc(vec![], vec![]), T0)
                .resync_required
        );
        // Silent past the TTL: flows gone, next incremental report asks for a resync.
        let late = T0 + SEC + 121 * SEC;
        assert_eq!(t.flows_known("a", late), 0);
        let r = t.apply("a", &mine, inc(vec![], vec![]), late);
        assert!(r.resync_required);
        assert_eq!(r.flows_known, 0);
    }

    #[test]
    fn expiry_by_ttl_with_heartbeats() {
        let mine = gids(&["fd00::1"]);
        let mut t = ServicePathTable::new(ServicePathParams {
            flow_ttl_sec: 10,
            ..Default::default()
        });
        t.apply(
            "a",
            &mine,
            full(vec![flow("fd00::1", 1, "fd00::2", 1, "svc")]),
            T0,
        );
        t.apply(
            "b",
            &gids(&["fd00::2"]),
            full(vec![flow("fd00::2", 1, "fd00::1", 1, "svc")]),
            T0,
        );
        // Empty reports from a keep its flows alive; b goes quiet.
        for s in [5, 10, 15] {
            t.apply("a", &mine, inc(vec![], vec![]), T0 + s * SEC);
        }
        let now = T0 + 15 * SEC;
        assert_eq!(t.flows_known("a", now), 1);
        assert_eq!(
            t.flows_known("b", T0 + 10 * SEC),
            1,
            "exactly at the TTL stays"
        );
        assert_eq!(
            t.flows_known("b", now),
            0,
            "expired for queries before any sweep"
        );
        let idx = index(&[("a", "fd00::1", "t1"), ("b", "fd00::2", "t1")]);
        let listed = t.list(&idx, &ServicePathFilter::default(), now);
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].source_agent_id, "a");
        assert_eq!(t.expire(now), 1);
        assert_eq!(t.stats().flows_expired, 1);
        assert_eq!(t.service_count(), 1, "a still uses the name");
        assert_eq!(t.expire(now + 11 * SEC), 1);
        assert_eq!(t.service_count(), 0);
    }

    #[test]
    fn per_agent_bound_rejects_and_counts() {
        let mine = gids(&["fd00::1"]);
        let mut t = ServicePathTable::new(ServicePathParams {
            max_flows_per_agent: 3,
            ..Default::default()
        });
        let many: Vec<_> = (0..5)
            .map(|q| flow("fd00::1", q, "fd00::2", q, ""))
            .collect();
        let r = t.apply("a", &mine, full(many), T0);
        assert_eq!(
            (r.upserted, r.rejected_over_limit, r.flows_known),
            (3, 2, 3)
        );
        // Updating an existing key at the bound is fine; a new key is not.
        let r = t.apply(
            "a",
            &mine,
            inc(
                vec![
                    flow("fd00::1", 0, "fd00::3", 9, ""),
                    flow("fd00::1", 50, "fd00::3", 9, ""),
                ],
                vec![],
            ),
            T0,
        );
        assert_eq!((r.upserted, r.rejected_over_limit), (1, 1));
        // Other agents have their own budget.
        let r = t.apply(
            "b",
            &gids(&["fd00::7"]),
            full(vec![flow("fd00::7", 0, "fd00::1", 0, "")]),
            T0,
        );
        assert_eq!(r.upserted, 1);
        assert_eq!(t.stats().rejected_over_limit, 3);
        // A flood stays bounded.
        let flood: Vec<_> = (0..100_000)
            .map(|q| flow("fd00::1", q, "fd00::2", q, ""))
            .collect();
        t.apply("a", &mine, full(flood), T0);
        assert_eq!(t.flows_known("a", T0), 3);
    }

    #[test]
    fn bad_and_foreign_gids_are_dropped_and_counted() {
        let mine = gids(&["fd00::1"]);
        let mut t = ServicePathTable::new(ServicePathParams::default());
        let r = t.apply(
            "a",
            &mine,
            full(vec![
                flow("garbage", 1, "fd00::2", 1, ""),
                flow("fd00::1", 2, "", 1, ""),
                flow("fd00::99", 3, "fd00::2", 1, ""),
                flow("fd00::98", 4, "fd00::2", 1, ""),
                flow("fd00::1", 5, "fd00::2", 1, ""),
            ]),
            T0,
        );
        assert_eq!(
            (r.dropped_bad_gid, r.dropped_foreign_source, r.upserted),
            (2, 2, 1)
        );
        assert!(r.example_bad_gid.unwrap().contains("garbage"));
        assert_eq!(r.first_foreign_source, Some(g("fd00::99")));
        // Logged once per agent: the next foreign flow is counted but not reported again.
        let r = t.apply(
            "a",
            &mine,
            inc(vec![flow("fd00::97", 6, "fd00::2", 1, "")], vec![]),
            T0,
        );
        assert_eq!(r.dropped_foreign_source, 1);
        assert_eq!(r.first_foreign_source, None);
        let s = t.stats();
        assert_eq!((s.dropped_bad_gid, s.dropped_foreign_source), (2, 3));
    }

    #[test]
    fn unknown_remote_gids_are_listed_unmonitored_and_not_probed() {
        let idx = index(&[("a", "fd00::1", "t1"), ("b", "fd00::2", "t2")]);
        let mine = gids(&["fd00::1"]);
        let mut t = ServicePathTable::new(ServicePathParams::default());
        t.apply(
            "a",
            &mine,
            full(vec![
                flow("fd00::1", 1, "fd00::2", 0x12345, "allreduce"),
                flow("fd00::1", 2, "fd00::2", 0x12345, "allreduce"),
                flow("fd00::1", 3, "fd00::77", 9, "allreduce"),
            ]),
            T0,
        );
        let rows = t.list(&idx, &ServicePathFilter::default(), T0);
        assert_eq!(rows.len(), 2);
        let known = rows.iter().find(|r| r.target_gid == g("fd00::2")).unwrap();
        assert!(known.monitored);
        assert_eq!(
            (
                known.flows,
                known.source_tor_id.as_str(),
                known.target_tor_id.as_str()
            ),
            (2, "t1", "t2")
        );
        assert_eq!(
            (known.flow_label, known.service_level, known.traffic_class),
            (0x12345, 3, 96)
        );
        let unknown = rows.iter().find(|r| r.target_gid == g("fd00::77")).unwrap();
        assert!(!unknown.monitored);
        assert_eq!(unknown.target_tor_id, "");

        let pl = t.pinglist(&idx, "a", &g("fd00::1"), T0, 300);
        assert_eq!(
            pl.len(),
            1,
            "two flows on one path probed once; unknown GID absent"
        );
        let p = &pl[0];
        assert_eq!(p.target_gid, g("fd00::2"));
        assert_eq!(p.target_qpn, 4000, "the responder QPN, not the service QP");
        assert_eq!(
            (p.flow_label, p.flow_label_count, p.flow_label_seed),
            (0x12345, 1, 0x12345)
        );
        assert_eq!((p.service_level, p.traffic_class), (3, 96));
        assert_eq!(p.pinglist_type, PinglistType::Service as i32);
        assert_eq!(
            (p.service.as_str(), p.target_tor_id.as_str(), p.priority),
            ("allreduce", "t2", 0)
        );
        // Inactive remote RNIC: still listed, not probed.
        assert!(t
            .pinglist(&idx, "a", &g("fd00::1"), T0 + 301 * SEC, 300)
            .is_empty());
        // Another RNIC of nobody: nothing.
        assert!(t.pinglist(&idx, "a", &g("fd00::2"), T0, 300).is_empty());
    }

    #[test]
    fn label_zero_services_are_probed_on_the_label_the_nic_derives() {
        let idx = index(&[("a", "fd00::1", "t1"), ("b", "fd00::2", "t2")]);
        let mut t = ServicePathTable::new(ServicePathParams::default());
        // flow() pairs local QPN q with remote q + 1. Two QP pairs left at label 0 take
        // two ECMP paths (the kernel derives each from its QPNs): two SERVICE targets.
        t.apply(
            "a",
            &gids(&["fd00::1"]),
            full(vec![
                flow("fd00::1", 0x11, "fd00::2", 0, "nccl"),
                flow("fd00::1", 0x21, "fd00::2", 0, "nccl"),
            ]),
            T0,
        );
        let mut labels: Vec<u32> = t
            .pinglist(&idx, "a", &g("fd00::1"), T0, 300)
            .iter()
            .map(|p| p.flow_label)
            .collect();
        labels.sort_unstable();
        let want = |l: u32, r: u32| rpingmesh_protocol::flowlabel::rc_flow_label(l, r);
        let mut expect = vec![want(0x11, 0x12), want(0x21, 0x22)];
        expect.sort_unstable();
        assert_eq!(labels, expect);
        assert_eq!(expect, vec![0x132, 0x462]);
    }

    #[test]
    fn pinglist_dedupes_identical_paths_across_services() {
        let idx = index(&[("a", "fd00::1", "t1"), ("b", "fd00::2", "t1")]);
        let mine = gids(&["fd00::1"]);
        let mut t = ServicePathTable::new(ServicePathParams::default());
        let mut other_sl = flow("fd00::1", 4, "fd00::2", 7, "zeta");
        other_sl.service_level = 5;
        t.apply(
            "a",
            &mine,
            full(vec![
                flow("fd00::1", 1, "fd00::2", 7, "zeta"),
                flow("fd00::1", 2, "fd00::2", 7, "alpha"),
                flow("fd00::1", 3, "fd00::2", 8, "zeta"),
                other_sl,
            ]),
            T0,
        );
        let pl = t.pinglist(&idx, "a", &g("fd00::1"), T0, 300);
        let got: Vec<_> = pl
            .iter()
            .map(|p| (p.flow_label, p.service_level, p.service.as_str()))
            .collect();
        assert_eq!(got, vec![(7, 3, "alpha"), (7, 5, "zeta"), (8, 3, "zeta")]);
        // Listing keeps the services apart.
        assert_eq!(t.list(&idx, &ServicePathFilter::default(), T0).len(), 4);
    }

    #[test]
    fn service_names_are_capped_and_released() {
        let mine = gids(&["fd00::1"]);
        let mut t = ServicePathTable::new(ServicePathParams {
            max_services: 2,
            ..Default::default()
        });
        let mut nameless = flow("fd00::1", 9, "fd00::2", 1, "");
        nameless.comm = String::new();
        t.apply(
            "a",
            &mine,
            full(vec![
                flow("fd00::1", 1, "fd00::2", 1, "svc-a"),
                flow("fd00::1", 2, "fd00::2", 1, "svc-b"),
                flow("fd00::1", 3, "fd00::2", 1, "svc-c"),
                flow("fd00::1", 4, "fd00::2", 1, "svc-a"),
                flow("fd00::1", 5, "fd00::2", 1, &"x".repeat(500)),
            ]),
            T0,
        );
        let names: Vec<_> = t
            .agent_flows("a", T0)
            .into_iter()
            .map(|f| f.service)
            .collect();
        assert_eq!(names, vec!["svc-a", "svc-b", "other", "svc-a", "other"]);
        assert_eq!(t.service_count(), 2);
        assert_eq!(t.stats().services_capped, 2);
        assert!(t.is_known_service("other") && t.is_known_service("svc-b"));
        assert!(!t.is_known_service("svc-c"));
        // svc-b's only flow goes away: its slot frees up for a new name.
        t.apply(
            "a",
            &mine,
            inc(vec![nameless], vec![flow_key("fd00::1", 2)]),
            T0,
        );
        let f = t.agent_flows("a", T0);
        assert_eq!(f.last().unwrap().service, "unknown");
        assert!(!t.is_known_service("svc-b"));
        assert_eq!(t.service_count(), 2);
        assert_eq!(
            raw_service_name("", &"y".repeat(100)).len(),
            MAX_SERVICE_NAME_LEN
        );
        assert_eq!(raw_service_name(" a\nb ", "c"), "a_b");
    }

    #[test]
    fn list_filters() {
        let idx = index(&[
            ("a", "fd00::1", "t1"),
            ("b", "fd00::2", "t2"),
            ("c", "fd00::3", "t3"),
        ]);
        let mut t = ServicePathTable::new(ServicePathParams::default());
        t.apply(
            "a",
            &gids(&["fd00::1"]),
            full(vec![flow("fd00::1", 1, "fd00::2", 1, "s1")]),
            T0,
        );
        t.apply(
            "c",
            &gids(&["fd00::3"]),
            full(vec![flow("fd00::3", 1, "fd00::1", 1, "s2")]),
            T0,
        );
        let n = |f: ServicePathFilter<'_>| t.list(&idx, &f, T0).len();
        assert_eq!(n(ServicePathFilter::default()), 2);
        assert_eq!(
            n(ServicePathFilter {
                service: "s1",
                ..Default::default()
            }),
            1
        );
        let one = g("fd00::1");
        assert_eq!(
            n(ServicePathFilter {
                gid: &one,
                ..Default::default()
            }),
            2,
            "either end"
        );
        let two = g("fd00::2");
        assert_eq!(
            n(ServicePathFilter {
                gid: &two,
                ..Default::default()
            }),
            1
        );
        assert_eq!(
            n(ServicePathFilter {
                source_tor_id: "t3",
                ..Default::default()
            }),
            1
        );
        assert_eq!(
            n(ServicePathFilter {
                source_tor_id: "t1",
                target_tor_id: "t2",
                ..Default::default()
            }),
            1
        );
        assert_eq!(
            n(ServicePathFilter {
                target_tor_id: "t9",
                ..Default::default()
            }),
            0
        );
    }
}
