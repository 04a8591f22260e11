//! gRPC services: `controller_agent.ControllerService` (agents) and
//! `rpingmesh.operator.v1.OperatorService` (operators), over one shared state.
//! Locks are std locks held only for synchronous sections, never across an await.
//!
//! Component findings (the localizer's) move in [`ControllerState::findings_tick`], which
//! the server runs every second: it localizes the settled windows, publishes every change
//! on a broadcast channel (WatchFindings) and writes the changed findings to the store.
//!
//! Map: this file holds [`ControllerState`] (what every RPC shares), its construction and
//! the views the RPCs read; `agent_rpc`, `operator_rpc`, `action_rpc` and `trace_rpc` are
//! the RPCs by family; `findings` moves findings over time; `hosts` keeps Hostping
//! reports; `guard` is what refusals cost and the audit trail; `actions` applies drains
//! and silences.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::controller_service_server::ControllerService;
use rpingmesh_proto::controller_agent::{
    AgentRegistrationRequest, AgentRegistrationResponse, HostHealthAck, HostHealthReport,
    PathSummary, PinglistRequest, PinglistResponse, PinglistType, ProbeAnalysisAck,
    ProbeAnalysisReport, ServiceFlow, ServiceFlowAck, ServiceFlowReport,
};
use rpingmesh_proto::gid::normalize_gid;
use rpingmesh_proto::operator::operator_service_server::OperatorService;
use rpingmesh_proto::operator::{
    Finding, FindingEvent, GetHostRequest, HostHealth, ListFindingsRequest, ListFindingsResponse,
    ListHostsRequest, ListHostsResponse, ListPathsRequest, ListPathsResponse, ListRnicsRequest,
    ListRnicsResponse, ListServicePathsRequest, ListServicePathsResponse, ListTorPairsRequest,
    ListTorPairsResponse, ListViolationsRequest, ListViolationsResponse, RnicStatus, ServicePath,
    TorPairStats, Violation as ViolationMsg, WatchFindingsRequest,
};

use crate::analyzer::{Analyzer, PathFilter, ViolationKind};
use crate::audit::{AuditEntry, AuditLog};
use crate::auth::{agent_rules, AgentAuth, Caller, Denial, OperatorAuth};
use crate::config::{ControllerConfig, DatabaseUri, TlsMode};
use crate::ecmp;
use crate::focus::FocusPlanner;
use crate::leader::Leadership;
use crate::limits::RateLimiter;
use crate::liveness::{heartbeat_interval_sec, StallWatch};
use crate::localize::{ComponentKind, Localizer};
use crate::pinglist::{self, PinglistParams};
use crate::registry::{
    self, AgentRecord, IndexedRegistry, Registry, RegistryError, RegistryIndex, RnicRecord,
};
use crate::service_paths::{ServicePathFilter, ServicePathParams, ServicePathTable, OTHER_SERVICE};
use crate::telemetry::AnalyzerMetrics;

mod action_rpc;
mod actions;
mod agent_rpc;
mod findings;
mod guard;
mod hosts;
mod operator_rpc;
mod trace_rpc;

use findings::restore_baseline;
pub use findings::{
    AWAIT_MARGIN, AWAIT_MAX, BASELINE_KEY, FINDINGS_CHANNEL_CAPACITY, WATCH_SNAPSHOT_RESOLVED,
};
pub use hosts::{MAX_HOSTS, MAX_HOST_FINDINGS, MAX_HOST_REPORT_JSON_BYTES, MAX_HOST_TREE_BYTES};

/// The client TLS replicas forward with: none without TLS; the CA (`tls_ca_file`) under
/// tls and mtls, and under mtls this replica's own certificate as its identity (so the
/// leader knows a replica forwards). The leader's name is its address unless
/// `tls_server_name` says otherwise.
fn replica_tls(
    cfg: &ControllerConfig,
) -> anyhow::Result<Option<tonic::transport::ClientTlsConfig>> {
    let mode = cfg.tls()?;
    if mode == TlsMode::Disabled || cfg.tls_ca_file.trim().is_empty() {
        return Ok(None);
    }
    rpingmesh_proto::endpoint::client_tls_config(
        mode == TlsMode::Mtls,
        &cfg.tls_ca_file,
        &cfg.tls_cert_file,
        &cfg.tls_key_file,
        &cfg.tls_server_name,
    )
    .map(Some)
    .map_err(|e| anyhow::anyhow!("replica forwarding TLS: {e}"))
}

/// Callers whose registration rate is tracked at once (far above any fleet's agents).
const MAX_RATE_LIMITED_CALLERS: usize = 200_000;

/// Wall clock in Unix nanoseconds; injectable so tests can age registrations.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

pub fn system_clock() -> Clock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    })
}

/// What [`ControllerState::liveness_counts`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessCounts {
    pub rnics: u64,
    pub rnics_active: u64,
    pub agents: u64,
    pub agents_active: u64,
}

/// Everything the services share.
pub struct ControllerState {
    pub registry: IndexedRegistry,
    /// Who analyzes (always this controller with SQLite; the elected replica with etcd).
    pub leadership: Arc<Leadership>,
    /// The etcd endpoints when the store is shared (the server then campaigns).
    pub etcd_endpoints: Option<Vec<String>>,
    /// Whether this replica led at the last findings tick (a new leader first takes the
    /// stored findings over).
    led: AtomicBool,
    /// TLS of the channels to the leader (tls_mode tls or mtls: the same CA, and under
    /// mtls this replica's certificate as its client identity).
    replica_tls: Option<tonic::transport::ClientTlsConfig>,
    /// Channels to the leader, by address, for forwarded path reports.
    leader_clients: Mutex<HashMap<String, ControllerServiceClient<Channel>>>,
    /// `None` when `analyzer_enabled` is false.
    pub analyzer: Option<Mutex<Analyzer>>,
    /// Every finding change, as [`Self::findings_tick`] makes it (WatchFindings). Sent
    /// while the analyzer lock is held, so a subscriber that subscribes under that lock
    /// and lists the findings sees each change exactly once, after its snapshot.
    findings_tx: broadcast::Sender<FindingEvent>,
    /// Changed findings the store has not taken yet (a failed write), by id.
    findings_unsaved: Mutex<BTreeMap<u64, Finding>>,
    /// Baseline windows at its last write to the store (u64::MAX: none yet).
    baseline_saved: AtomicU64,
    /// Adaptive probing's FOCUS lists. Lock order: index, analyzer, then this.
    focus: Mutex<FocusPlanner>,
    /// Baseline windows when the FOCUS lists were last planned.
    focus_windows: AtomicU64,
    /// Operators' on-demand ECMP traces (`trace_rpc.rs`). Lock order: after the analyzer,
    /// never with `focus`.
    traces: Mutex<crate::trace::Traces>,
    /// The FOCUS generation, published when it moves (a trace started): agents holding
    /// an await are answered at once.
    focus_moved: watch::Sender<u64>,
    /// The start of the newest window localized (0: none yet), published after the
    /// FOCUS lists followed it: agents awaiting a window's localization wait on it.
    localized: watch::Sender<u64>,
    /// Set when the server shuts down: ends the WatchFindings streams (a graceful
    /// shutdown waits for every open call).
    stopping: watch::Sender<bool>,
    pub metrics: AnalyzerMetrics,
    /// Agent identities under mTLS (what each agent may say: `crate::auth`).
    pub auth: AgentAuth,
    /// Roles on the operator surfaces (`crate::auth::operator`).
    pub operator_auth: OperatorAuth,
    pub audit: AuditLog,
    /// Operators' drains and silences, as the store last had them (`actions.rs`). Lock
    /// order: after the index and the analyzer.
    actions: std::sync::RwLock<crate::actions::Actions>,
    /// Calls refused by the identity rules (also a metric by RPC and reason).
    pub auth_denied: AtomicU64,
    /// Registrations per caller per minute (`max_registrations_per_minute`).
    registrations: Mutex<RateLimiter>,
    pub max_rnics_per_agent: usize,
    pub max_summaries_per_report: usize,
    /// Calls refused by a limit (also a metric by RPC and limit).
    pub limited: AtomicU64,
    pub pinglist: PinglistParams,
    pub pinglist_seed: Option<u64>,
    pub stale_threshold_sec: u64,
    /// Summaries dropped because of an invalid GID (counted, logged).
    pub dropped_summaries: AtomicU64,
    /// Live service paths. Lock order: registry index first, then this, then the analyzer.
    pub service_paths: Mutex<ServicePathTable>,
    /// Agent versions as they registered ("" = a Go agent); in memory only: every agent
    /// registers again within a heartbeat.
    agent_versions: Mutex<HashMap<String, String>>,
    /// Each host's newest Hostping report, by hostname (restored from the store).
    hosts: Mutex<BTreeMap<String, HostHealth>>,
    clock: Clock,
    /// The controller's own timeline (a monotonic clock: the injectable wall clock jumps
    /// in tests that age registrations), watched for stalls.
    stall: Mutex<StallWatch>,
    started: Instant,
}

impl ControllerState {
    /// Opens the store named by `database_uri` and loads the index from it.
    pub fn new(cfg: &ControllerConfig, metrics: AnalyzerMetrics) -> anyhow::Result<Self> {
        let db = cfg.database()?;
        let store =
            registry::open_store(&db, cfg.stale_threshold_sec).context("opening the registry")?;
        let mut st = Self::with_store(cfg, store, metrics, system_clock())?;
        if let DatabaseUri::Etcd(ep) = &db {
            st.etcd_endpoints = Some(registry::etcd_urls(ep));
            st.leadership = Arc::new(Leadership::follower());
            st.led = AtomicBool::new(false);
        }
        Ok(st)
    }

    /// The state over `store`: loads the index, and the findings into the analyzer (open
    /// ones continue, ids continue). Reads `analyzer_topology_file`.
    pub fn with_store(
        cfg: &ControllerConfig,
        store: Box<dyn Registry>,
        metrics: AnalyzerMetrics,
        clock: Clock,
    ) -> anyhow::Result<Self> {
        let topology = if cfg.analyzer_enabled {
            cfg.topology()?
        } else {
            None
        };
        let registry = IndexedRegistry::new(store).context("opening the registry")?;
        let analyzer = match cfg.analyzer_enabled {
            false => None,
            true => {
                let mut a = Analyzer::with_topology(cfg.analyzer_params(), topology);
                let findings = registry
                    .load_findings()
                    .context("loading the stored findings")?;
                if !findings.is_empty() {
                    let open = findings.iter().filter(|f| f.open).count();
                    tracing::info!(
                        open,
                        resolved = findings.len() - open,
                        "findings restored from the store"
                    );
                }
                a.localizer_mut().restore(findings);
                restore_baseline(&registry, &mut a);
                Some(Mutex::new(a))
            }
        };
        let hosts: BTreeMap<String, HostHealth> = registry
            .load_hosts()
            .context("loading the stored host reports")?
            .into_iter()
            .map(|h| (h.hostname.clone(), h))
            .collect();
        let mut actions = crate::actions::Actions::default();
        actions.load(
            registry
                .load_actions()
                .context("loading the stored drains and silences")?,
        );
        let now = clock() / 1_000_000_000;
        let n = registry
            .excuse(u64::MAX, now)
            .context("opening the registry")?;
        if n > 0 {
            tracing::info!(
                rnics = n,
                "registry loaded; its RNICs count as alive for one active threshold"
            );
        }
        Ok(Self {
            registry,
            leadership: Arc::new(Leadership::solo()),
            etcd_endpoints: None,
            led: AtomicBool::new(true),
            replica_tls: replica_tls(cfg)?,
            leader_clients: Mutex::new(HashMap::new()),
            analyzer,
            findings_tx: broadcast::channel(FINDINGS_CHANNEL_CAPACITY).0,
            findings_unsaved: Mutex::new(BTreeMap::new()),
            baseline_saved: AtomicU64::new(u64::MAX),
            focus: Mutex::new(FocusPlanner::new(cfg.focus_params())),
            focus_windows: AtomicU64::new(0),
            localized: watch::channel(0).0,
            traces: Mutex::new(crate::trace::Traces::default()),
            focus_moved: watch::channel(0).0,
            stopping: watch::channel(false).0,
            metrics,
            auth: cfg.agent_auth()?,
            operator_auth: {
                let (on, roles) = cfg.operator_auth_enabled()?;
                OperatorAuth::new(on, &cfg.operator_tokens_file, roles, cfg.agent_auth()?.from)?
            },
            audit: AuditLog::open(&cfg.audit_log_file)?,
            actions: std::sync::RwLock::new(actions),
            auth_denied: AtomicU64::new(0),
            registrations: Mutex::new(RateLimiter::new(
                cfg.max_registrations_per_minute,
                MAX_RATE_LIMITED_CALLERS,
            )),
            max_rnics_per_agent: cfg.max_rnics_per_agent as usize,
            max_summaries_per_report: cfg.max_summaries_per_report as usize,
            limited: AtomicU64::new(0),
            pinglist: PinglistParams {
                active_threshold_sec: cfg.active_threshold_sec,
                inter_tor_sample_size: cfg.inter_tor_sample_size as usize,
                flow_label_count: ecmp::flow_label_count(
                    cfg.ecmp_paths_assumed,
                    cfg.ecmp_coverage_probability,
                    cfg.ecmp_max_flow_labels,
                ),
            },
            pinglist_seed: cfg.pinglist_seed,
            stale_threshold_sec: cfg.stale_threshold_sec,
            dropped_summaries: AtomicU64::new(0),
            service_paths: Mutex::new(ServicePathTable::new(ServicePathParams {
                flow_ttl_sec: cfg.service_flow_ttl_sec,
                max_flows_per_agent: cfg.max_service_flows_per_agent as usize,
                max_services: cfg.max_services as usize,
            })),
            agent_versions: Mutex::new(HashMap::new()),
            hosts: Mutex::new(hosts),
            clock,
            stall: Mutex::new(StallWatch::default()),
            started: Instant::now(),
        })
    }

    pub fn now_ns(&self) -> u64 {
        (self.clock)()
    }

    pub fn now_sec(&self) -> u64 {
        self.now_ns() / 1_000_000_000
    }

    /// The time for a liveness decision. First excuses any time the controller itself
    /// did not run (see [`StallWatch`]): after a SIGSTOP the first pinglist request must
    /// not find every agent inactive because their heartbeats could not be heard. The
    /// watch lock is held while the registry catches up, so a concurrent decision waits
    /// for it. Also called every second by the server's watch tick.
    pub fn liveness_now_sec(&self) -> u64 {
        let mut watch = self.stall.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.now_sec();
        let mono = self.started.elapsed().as_nanos() as u64;
        if let Some(by) = watch.observe(mono) {
            match self.registry.excuse(by, now) {
                Ok(n) => tracing::warn!(
                    unwatched_sec = by,
                    rnics = n,
                    "the controller did not run for a while; that time does not count against agents' liveness"
                ),
                Err(e) => tracing::error!(error = %e, "excusing a controller stall failed"),
            }
        }
        now
    }

    pub(crate) fn analyzer(&self) -> Option<std::sync::MutexGuard<'_, Analyzer>> {
        self.analyzer
            .as_ref()
            .map(|a| a.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Per ToR pair, the latest window of each path still measured (gRPC ListTorPairs,
    /// the web matrix).
    pub fn tor_pairs(&self) -> Vec<TorPairStats> {
        let now = self.now_ns();
        self.analyzer()
            .map(|a| a.tor_pairs(now))
            .unwrap_or_default()
    }

    /// Latest (or every retained) window of the matching paths.
    pub fn paths(&self, filter: &PathFilter<'_>, all_windows: bool) -> Vec<PathSummary> {
        self.analyzer()
            .map(|a| a.paths(filter, all_windows))
            .unwrap_or_default()
    }

    /// Live service paths with their latest SERVICE window.
    pub fn service_paths(&self, filter: &ServicePathFilter<'_>) -> Vec<ServicePath> {
        let now = self.now_ns();
        let mut paths = {
            let idx = self.registry.index();
            self.service_table().list(&idx, filter, now)
        };
        if let Some(a) = self.analyzer() {
            for p in &mut paths {
                p.latest = a
                    .latest_service(&p.source_gid, &p.target_gid, &p.service)
                    .cloned();
            }
        }
        paths
    }

    /// Every RNIC (or one ToR's) with its liveness, sorted by (ToR, GID).
    pub fn rnic_statuses(&self, tor_id: &str) -> Vec<RnicStatus> {
        self.rnic_page(tor_id, 0, usize::MAX).0
    }

    /// One page (`offset`, `limit`) of [`Self::rnic_statuses`] and the number of RNICs:
    /// only the page is copied out of the index.
    pub fn rnic_page(&self, tor_id: &str, offset: usize, limit: usize) -> (Vec<RnicStatus>, usize) {
        let now = self.liveness_now_sec();
        let idx = self.registry.index();
        let mut rows: Vec<&RnicRecord> = if tor_id.is_empty() {
            idx.rnics().collect()
        } else {
            idx.tor_gids(tor_id)
                .iter()
                .filter_map(|g| idx.rnic(g))
                .collect()
        };
        let total = rows.len();
        let order =
            |a: &&RnicRecord, b: &&RnicRecord| (&a.tor_id, &a.gid).cmp(&(&b.tor_id, &b.gid));
        // Only the rows up to the page's end need their order: select, then sort those.
        let end = offset.saturating_add(limit).min(total);
        if end < total && end > 0 {
            rows.select_nth_unstable_by(end - 1, order);
            rows.truncate(end);
        }
        rows.sort_unstable_by(order);
        let page = rows
            .into_iter()
            .skip(offset)
            .take(limit)
            .map(|r| RnicStatus {
                rnic: Some(r.info()),
                agent_id: r.agent_id.clone(),
                last_updated_unix_sec: r.last_updated,
                active: pinglist::is_active(r, now, self.pinglist.active_threshold_sec),
            })
            .collect();
        (page, total)
    }

    /// Open component findings per kind that alert (every kind, 0 when none; silenced and
    /// in-maintenance ones are counted apart); empty without the analyzer.
    pub fn open_findings_by_kind(&self) -> BTreeMap<&'static str, usize> {
        self.open_by_kind_and_suppression().0
    }

    /// Per kind of open component finding (every kind, 0 when none), the workloads
    /// they hurt.
    pub fn affected_services_by_kind(&self) -> BTreeMap<&'static str, usize> {
        self.analyzer()
            .map(|a| a.localizer().affected_services_by_kind())
            .unwrap_or_default()
    }

    /// Open findings per (source ToR, target ToR, kind).
    pub fn open_findings_by_tor_pair(
        &self,
    ) -> std::collections::BTreeMap<(String, String, ViolationKind), u64> {
        self.analyzer()
            .map(|a| a.finding_book().open_by_tor_pair())
            .unwrap_or_default()
    }

    /// (active, inactive) RNICs.
    pub fn rnic_counts(&self) -> (u64, u64) {
        let c = self.liveness_counts();
        (c.rnics_active, c.rnics - c.rnics_active)
    }

    /// RNICs and agents, and how many of each are active (an agent is active while any
    /// of its RNICs is), in one pass over the index.
    pub fn liveness_counts(&self) -> LivenessCounts {
        let now = self.liveness_now_sec();
        let idx = self.registry.index();
        let mut live_agents: std::collections::HashSet<&str> = Default::default();
        let mut rnics_active = 0;
        for r in idx.rnics() {
            if pinglist::is_active(r, now, self.pinglist.active_threshold_sec) {
                rnics_active += 1;
                live_agents.insert(&r.agent_id);
            }
        }
        LivenessCounts {
            rnics: idx.len() as u64,
            rnics_active,
            agents: idx.agent_count() as u64,
            agents_active: live_agents.len() as u64,
        }
    }

    /// Live service paths per (service, monitored).
    pub fn service_path_counts(&self) -> std::collections::BTreeMap<(String, bool), u64> {
        let mut m = std::collections::BTreeMap::new();
        for p in self.service_paths(&ServicePathFilter::default()) {
            *m.entry((p.service, p.monitored)).or_insert(0) += 1;
        }
        m
    }

    pub fn note_agent_version(&self, agent_id: &str, version: &str) {
        let mut v = self
            .agent_versions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if v.get(agent_id).map(String::as_str) != Some(version) {
            v.insert(agent_id.to_string(), version.to_string());
        }
    }

    pub fn agent_version(&self, agent_id: &str) -> Option<String> {
        let v = self
            .agent_versions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        v.get(agent_id).cloned()
    }

    /// The service-path table (poisoning is ignored: every update leaves it consistent).
    pub fn service_table(&self) -> std::sync::MutexGuard<'_, ServicePathTable> {
        self.service_paths.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the agent's whole flow set to the shared store, for the other replicas. A
    /// failure is logged: the flows still apply here, and the next report writes again.
    fn share_service_flows(&self, agent_id: &str, now_ns: u64) {
        let flows = self.service_table().agent_flows(agent_id, now_ns);
        let report = ServiceFlowReport {
            agent_id: agent_id.to_string(),
            full_sync: true,
            upserts: flows
                .into_iter()
                .map(|f| ServiceFlow {
                    local_gid: f.local_gid,
                    local_qpn: f.local_qpn,
                    remote_gid: f.remote_gid,
                    remote_qpn: f.remote_qpn,
                    flow_label: f.flow_label,
                    traffic_class: f.traffic_class,
                    service_level: f.service_level,
                    pid: f.pid,
                    comm: f.comm,
                    cgroup_id: f.cgroup_id,
                    first_seen_unix_ns: f.first_seen_unix_ns,
                    last_seen_unix_ns: f.last_seen_unix_ns,
                    service: f.service,
                    workload: f.workload,
                })
                .collect(),
            removals: Vec::new(),
        };
        if let Err(e) = self.registry.save_service_flows(&report) {
            tracing::warn!(agent_id, error = %e, "sharing service flows with the other replicas failed");
        }
    }

    /// Takes an agent's flow set another replica (or this one) shared through the store.
    pub fn apply_shared_service_flows(&self, report: ServiceFlowReport) {
        let now = self.now_ns();
        let idx = self.registry.index();
        let agent_id = report.agent_id.clone();
        if idx.agent(&agent_id).is_none() {
            return;
        }
        self.service_table()
            .apply(&agent_id, idx.agent_gids(&agent_id), report, now);
    }

    /// Drops the service flows of agents silent past `service_flow_ttl_sec`.
    pub fn expire_service_flows(&self) -> usize {
        let now = self.now_ns();
        self.service_table().expire(now)
    }

    /// Any agent RPC is a sign of life: refreshes the agent's `last_updated` (and its
    /// RNICs'), but writes to the store at most once per quarter of the active threshold,
    /// so frequent RPCs cost a read of the index, not a store write each.
    pub fn note_alive(&self, agent_id: &str) {
        let now = self.liveness_now_sec();
        let refresh_after = (self.pinglist.active_threshold_sec / 4).max(1);
        let due = match self.registry.index().agent(agent_id) {
            Some(a) => now.saturating_sub(a.last_updated) >= refresh_after,
            None => false,
        };
        if due {
            if let Err(e) = self.registry.touch(agent_id, now) {
                tracing::error!(agent_id, error = %e, "refreshing agent liveness failed");
            }
        }
    }

    /// One stale sweep; returns the RNICs removed.
    pub fn remove_stale(&self) -> Result<usize, RegistryError> {
        self.registry
            .remove_stale(self.liveness_now_sec(), self.stale_threshold_sec)
    }

    /// Per-request RNG: fresh entropy, or derived from `pinglist_seed` and the request
    /// so that a seeded controller answers the same request identically.
    fn request_rng(&self, requester: &str, ty: PinglistType) -> SmallRng {
        match self.pinglist_seed {
            None => SmallRng::from_rng(&mut rand::rng()),
            Some(seed) => {
                // FNV-1a: stable across runs and platforms, unlike std's hasher.
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for b in requester.bytes().chain([ty as u8]) {
                    h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
                }
                SmallRng::seed_from_u64(seed ^ h)
            }
        }
    }
}

/// True when `s` is already the full lowercase form (fast path: no allocation).
fn is_normalized_gid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 39
        && b.iter().enumerate().all(|(i, &c)| {
            if i % 5 == 4 {
                c == b':'
            } else {
                c.is_ascii_digit() || (b'a'..=b'f').contains(&c)
            }
        })
}

/// Normalizes in place; on error leaves the text untouched.
fn normalize_in_place(s: &mut String) -> bool {
    if is_normalized_gid(s) {
        return true;
    }
    match normalize_gid(s) {
        Ok(n) => {
            *s = n;
            true
        }
        Err(_) => false,
    }
}

fn gid_arg(field: &str, text: &str) -> Result<String, Status> {
    normalize_gid(text).map_err(|e| Status::invalid_argument(format!("{field}: {e}")))
}

fn shutting_down() -> Status {
    Status::unavailable("the controller is shutting down")
}

/// Hands one WatchFindings item to the response, unless the server stops first (then
/// UNAVAILABLE, when there is room for it) or the client went away. `false`: stop.
async fn forward(
    tx: &mpsc::Sender<Result<FindingEvent, Status>>,
    stopping: &mut watch::Receiver<bool>,
    item: Result<FindingEvent, Status>,
) -> bool {
    tokio::select! {
        r = tx.send(item) => r.is_ok(),
        _ = stopping.changed() => {
            let _ = tx.try_send(Err(shutting_down()));
            false
        }
    }
}

/// "" or one of the component kinds; otherwise InvalidArgument naming the known kinds.
fn check_finding_kind(kind: &str) -> Result<(), Status> {
    if kind.is_empty() || ComponentKind::parse(kind).is_some() {
        return Ok(());
    }
    let known: Vec<&str> = ComponentKind::ALL.iter().map(|k| k.as_str()).collect();
    Err(Status::invalid_argument(format!(
        "unknown finding kind {kind:?} (known: {})",
        known.join(", ")
    )))
}

fn store_err(e: RegistryError) -> Status {
    tracing::error!(error = %e, "registry store failure");
    Status::internal(e.to_string())
}

#[derive(Clone)]
pub struct ControllerSvc(pub Arc<ControllerState>);

#[derive(Clone)]
pub struct OperatorSvc(pub Arc<ControllerState>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalized_fast_path() {
        assert!(is_normalized_gid("fe80:0000:0000:0000:0001:0002:0003:0004"));
        assert!(!is_normalized_gid(
            "FE80:0000:0000:0000:0001:0002:0003:0004"
        ));
        assert!(!is_normalized_gid("fe80::1"));
        let mut s = "FE80::1:2:3:4".to_string();
        assert!(normalize_in_place(&mut s));
        assert_eq!(s, "fe80:0000:0000:0000:0001:0002:0003:0004");
        let mut bad = "garbage".to_string();
        assert!(!normalize_in_place(&mut bad));
        assert_eq!(bad, "garbage");
    }
}
