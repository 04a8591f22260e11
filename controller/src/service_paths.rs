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
            // The remote RNIC's probe responder (its QPN, not the service QP's), on
            // exactly the service's path: one label, no rotation set.
            out.push(PingTarget {
                flow_label: label,
                flow_label_seed: label,
                traffic_class: tc,
                service_level: sl,
                service: service.to_string(),
                ..crate::pinglist::make_target(r, PinglistType::Service, 1, "")
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
mod tests;
