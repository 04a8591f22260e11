//! gRPC services: `controller_agent.ControllerService` (agents) and
//! `rpingmesh.operator.v1.OperatorService` (operators), over one shared state.
//! Locks are std locks held only for synchronous sections, never across an await.
//!
//! Component findings (the localizer's) move in [`ControllerState::findings_tick`], which
//! the server runs every second: it localizes the settled windows, publishes every change
//! on a broadcast channel (WatchFindings) and writes the changed findings to the store.

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
    ProbeAnalysisReport, RnicInfo, ServiceFlow, ServiceFlowAck, ServiceFlowReport,
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
mod operator_rpc;
mod trace_rpc;

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

/// Finding changes a WatchFindings subscriber may fall behind by before it is cut off
/// with DATA_LOSS (it then calls again for a fresh snapshot). This bounds what the server
/// buffers per subscriber.
pub const FINDINGS_CHANNEL_CAPACITY: usize = 4096;

/// Resolved findings in a WatchFindings snapshot (the most recently resolved; every open
/// finding is in it).
pub const WATCH_SNAPSHOT_RESOLVED: usize = 100;

/// Changed findings kept for the next tick while the store fails to take them; past this
/// the oldest ids are given up (logged).
const UNSAVED_FINDINGS_CAP: usize = 10_000;

/// The store key of the gray detector's learned baseline, and how many windows it learns
/// between two writes (five minutes of 30 s windows).
/// Sets the impact (`crate::impact`) of every finding `events` open or update, on the
/// events and on the analyzer's findings.
fn attach_impact(
    a: &mut Analyzer,
    idx: &RegistryIndex,
    paths: &[ServicePath],
    events: &mut [FindingEvent],
) {
    for e in events.iter_mut() {
        let Some(f) = e.finding.as_mut().filter(|f| f.open) else {
            continue;
        };
        f.impact = crate::impact::impact(f, paths, idx, a.localizer().topology());
        a.localizer_mut().set_impact(f.id, f.impact.clone());
    }
}

/// An agent awaiting a window's localization (adaptive probing) is answered at most this
/// long after the window's settle time, and after at most [`AWAIT_MAX`] (below the
/// agents' 10 s RPC timeout; an agent answered before the window was localized awaits
/// again).
pub const AWAIT_MARGIN: Duration = Duration::from_secs(2);
pub const AWAIT_MAX: Duration = Duration::from_secs(8);

pub const BASELINE_KEY: &str = "gray_baseline";
const BASELINE_SAVE_WINDOWS: u64 = 10;

/// Takes the stored baseline over, if there is one (a damaged one: logged, start cold).
fn restore_baseline(registry: &IndexedRegistry, a: &mut Analyzer) {
    match registry.load_state(BASELINE_KEY) {
        Ok(Some(json)) => match a.localizer_mut().restore_baseline(&json) {
            Ok(()) => tracing::info!(
                windows = a.localizer().baseline_windows(),
                "learned baseline restored from the store"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "the stored baseline cannot be read; learning anew")
            }
        },
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "cannot load the learned baseline; learning anew"),
    }
}

/// Hosts whose Hostping reports are kept (a report from one more is refused).
pub const MAX_HOSTS: usize = 200_000;
/// Bounds of one host report.
pub const MAX_HOST_TREE_BYTES: usize = 256 * 1024;
pub const MAX_HOST_REPORT_JSON_BYTES: usize = 2 * 1024 * 1024;
pub const MAX_HOST_FINDINGS: usize = 1024;
const MAX_HOST_FIELD_BYTES: usize = 4096;

/// A host report's one clear error, or nothing.
fn check_host_report(r: &HostHealthReport) -> Result<(), Status> {
    let bad = |m: String| Err(Status::invalid_argument(format!("host report: {m}")));
    if r.agent_id.trim().is_empty() {
        return bad("agent_id is empty".into());
    }
    if r.hostname.trim().is_empty() || r.hostname.len() > 255 {
        return bad(format!(
            "hostname {:?} is empty or longer than 255 bytes",
            r.hostname
        ));
    }
    if r.tree.len() > MAX_HOST_TREE_BYTES {
        return bad(format!(
            "tree of {} bytes (at most {MAX_HOST_TREE_BYTES})",
            r.tree.len()
        ));
    }
    if r.report_json.len() > MAX_HOST_REPORT_JSON_BYTES {
        return bad(format!(
            "report_json of {} bytes (at most {MAX_HOST_REPORT_JSON_BYTES})",
            r.report_json.len()
        ));
    }
    if r.findings.len() > MAX_HOST_FINDINGS {
        return bad(format!(
            "{} findings (at most {MAX_HOST_FINDINGS})",
            r.findings.len()
        ));
    }
    if !matches!(r.mode.as_str(), "" | "idle" | "busy" | "abnormal") {
        return bad(format!("mode {:?} (idle, busy or abnormal)", r.mode));
    }
    for (i, f) in r.findings.iter().enumerate() {
        if f.kind.trim().is_empty() {
            return bad(format!("finding {i} has no kind"));
        }
        if [&f.kind, &f.location, &f.detail]
            .iter()
            .any(|x| x.len() > MAX_HOST_FIELD_BYTES)
        {
            return bad(format!(
                "finding {i}: a field longer than {MAX_HOST_FIELD_BYTES} bytes"
            ));
        }
    }
    Ok(())
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
                rnic: Some(RnicInfo {
                    gid: r.gid.clone(),
                    qpn: r.qpn,
                    ip_address: r.ip_address.clone(),
                    host_name: r.host_name.clone(),
                    tor_id: r.tor_id.clone(),
                    device_name: r.device_name.clone(),
                }),
                agent_id: r.agent_id.clone(),
                last_updated_unix_sec: r.last_updated,
                active: pinglist::is_active(r, now, self.pinglist.active_threshold_sec),
            })
            .collect();
        (page, total)
    }

    /// Localizes the windows that have settled (see [`Analyzer::tick`]), publishes the
    /// changes to WatchFindings and writes the changed findings to the store. The server
    /// calls it every second, off the async workers (the store write blocks). Returns the
    /// changes.
    pub fn findings_tick(&self) -> Vec<FindingEvent> {
        if !self.lead_now() {
            return Vec::new();
        }
        let now = self.now_ns();
        // What the findings a window moves hurt: the live service paths, read before the
        // analyzer lock is taken (lock order: index, service paths, analyzer).
        let due = self.analyzer().is_some_and(|a| a.window_due(now));
        let services = due.then(|| self.service_paths(&ServicePathFilter::default()));
        let events = self.step_findings(|a, idx| {
            let mut events = a.tick(now, idx);
            self.refocus(a, idx, now / 1_000_000_000);
            if let Some(paths) = &services {
                attach_impact(a, idx, paths, &mut events);
            }
            self.annotate_events(idx, &mut events);
            events
        });
        self.save_baseline();
        self.advance_traces();
        if let Some(through) = self.analyzer().and_then(|a| a.localized_through()) {
            self.localized.send_if_modified(|v| {
                let moved = *v != through;
                *v = through;
                moved
            });
        }
        events
    }

    /// Waits until the window starting at `start` is localized (so the FOCUS lists
    /// follow it), when this replica analyzes and holds unlocalized summaries of a window
    /// that has ended; at most until the window's settle time has passed by
    /// [`AWAIT_MARGIN`], and never past shutdown. Anything else answers at once.
    pub async fn await_localized(&self, start: u64) {
        if !self.leadership.is_leader() {
            return;
        }
        let Some((window_ns, settle_ns)) = self
            .analyzer()
            .and_then(|a| Some((a.pending_window(start)?, a.params().localize_settle_ns)))
        else {
            return;
        };
        let now = self.now_ns();
        let end = start.saturating_add(window_ns);
        if end > now.saturating_add(AWAIT_MARGIN.as_nanos() as u64) {
            return; // not over yet: its summaries are not all in
        }
        let deadline = end
            .saturating_add(settle_ns)
            .saturating_add(AWAIT_MARGIN.as_nanos() as u64);
        let wait = Duration::from_nanos(deadline.saturating_sub(now)).min(AWAIT_MAX);
        let mut localized = self.localized.subscribe();
        let mut stopping = self.stopping.subscribe();
        // A new FOCUS generation (an operator's trace) answers at once too: the agent
        // fetches it, then awaits the window again.
        let mut moved = self.focus_moved.subscribe();
        moved.borrow_and_update();
        tokio::select! {
            _ = tokio::time::timeout(wait, localized.wait_for(|&s| s >= start)) => {}
            _ = moved.changed() => {}
            _ = stopping.wait_for(|s| *s) => {}
        }
    }

    /// The start of the newest window localized (0: none yet).
    pub fn localized_through(&self) -> u64 {
        *self.localized.borrow()
    }

    /// After a window was localized: the FOCUS lists follow the gray detector's suspects
    /// (adaptive probing). Runs under the index and analyzer locks (that order).
    fn refocus(&self, a: &Analyzer, idx: &RegistryIndex, now_sec: u64) {
        let windows = a.localizer().baseline_windows();
        if self.focus_windows.swap(windows, Ordering::Relaxed) == windows {
            return;
        }
        let mut f = self.focus.lock().unwrap_or_else(|e| e.into_inner());
        if f.update(
            a.localizer().suspects(),
            idx,
            a.localizer().topology(),
            now_sec,
        ) {
            tracing::info!(
                generation = f.generation(),
                targets = f.target_count(),
                focused = ?f.focused().collect::<Vec<_>>(),
                "FOCUS pinglists changed (adaptive probing)"
            );
            self.focus_moved.send_replace(f.generation());
        }
    }

    /// (FOCUS targets handed out now, FOCUS probes ingested so far): what adaptive
    /// probing costs.
    pub fn focus_stats(&self) -> (u64, u64) {
        let probes = self.analyzer().map_or(0, |a| a.focus_probes_total());
        let targets = self
            .focus
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .target_count();
        (targets as u64, probes)
    }

    /// The FOCUS lists' generation agents compare with theirs (acks carry it).
    pub fn focus_generation(&self) -> u64 {
        self.focus
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .generation()
    }

    /// Writes the gray detector's learned baseline to the store after its first window,
    /// then every `BASELINE_SAVE_WINDOWS` windows it learns (no lock held during the
    /// write).
    fn save_baseline(&self) {
        let Some(a) = self.analyzer() else { return };
        let windows = a.localizer().baseline_windows();
        let saved = self.baseline_saved.load(Ordering::Relaxed);
        // The first window learned is stored at once, then every few.
        if windows == 0
            || (saved != u64::MAX && windows < saved.saturating_add(BASELINE_SAVE_WINDOWS))
        {
            return;
        }
        let json = a.localizer().baseline_json();
        drop(a);
        match self.registry.save_state(BASELINE_KEY, &json) {
            Ok(()) => self.baseline_saved.store(windows, Ordering::Relaxed),
            Err(e) => {
                tracing::warn!(error = %e, "storing the learned baseline failed; retrying later")
            }
        }
    }

    /// Whether this replica analyzes now. At the first tick after it was elected, it takes
    /// over the stored findings (the previous leader's), so they continue with their ids
    /// and none is opened twice.
    fn lead_now(&self) -> bool {
        let leads = self.leadership.is_leader();
        let led = self.led.swap(leads, Ordering::SeqCst);
        if leads && !led {
            match self.registry.load_findings() {
                Ok(f) => {
                    let open = f.iter().filter(|f| f.open).count();
                    if let Some(mut a) = self.analyzer() {
                        a.localizer_mut().reset_to(f);
                        restore_baseline(&self.registry, &mut a);
                    }
                    tracing::info!(
                        open,
                        "analysis taken over; the stored findings continue here"
                    );
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot load the findings to take over analysis; retrying");
                    self.led.store(false, Ordering::SeqCst);
                    return false;
                }
            }
        }
        leads
    }

    /// Sends agents' path reports to the leader when another replica leads. None: this
    /// replica takes them (it leads, no leader is known, or the leader cannot be reached).
    pub async fn forward_to_leader(&self, req: &ProbeAnalysisReport) -> Option<ProbeAnalysisAck> {
        let addr = self.leadership.forward_to()?;
        let client = {
            let mut m = self
                .leader_clients
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match m.get(&addr) {
                Some(c) => c.clone(),
                None => {
                    let scheme = if self.replica_tls.is_some() {
                        "https"
                    } else {
                        "http"
                    };
                    let mut ep =
                        tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}"))
                            .ok()?
                            .connect_timeout(Duration::from_secs(2))
                            .timeout(Duration::from_secs(5));
                    if let Some(tls) = &self.replica_tls {
                        ep = match ep.tls_config(tls.clone()) {
                            Ok(ep) => ep,
                            Err(e) => {
                                tracing::warn!(leader = %addr, error = %e, "TLS to the analysis leader cannot be set up; report kept here");
                                return None;
                            }
                        };
                    }
                    let c = ControllerServiceClient::new(ep.connect_lazy());
                    m.insert(addr.clone(), c.clone());
                    c
                }
            }
        };
        match client.clone().report_probe_analysis(req.clone()).await {
            Ok(r) => Some(r.into_inner()),
            Err(e) => {
                tracing::warn!(leader = %addr, error = %e, "forwarding a path report to the analysis leader failed; kept here");
                None
            }
        }
    }

    /// One step of the findings with `step` (the tick; tests and tools drive the
    /// localizer with their own blames through it): `step` runs under the registry index
    /// read lock and the analyzer lock (that order, as everywhere), its changes are
    /// published before the analyzer lock is released, and stored after, with no lock of
    /// the index or the analyzer held during the store write. A failed write is logged
    /// and the findings are written again at the next step.
    pub fn step_findings(
        &self,
        step: impl FnOnce(&mut Analyzer, &RegistryIndex) -> Vec<FindingEvent>,
    ) -> Vec<FindingEvent> {
        let Some(analyzer) = &self.analyzer else {
            return Vec::new();
        };
        let events = {
            let idx = self.registry.index();
            let mut a = analyzer.lock().unwrap_or_else(|e| e.into_inner());
            let events = step(&mut a, &idx);
            for e in &events {
                // No subscriber is not an error.
                let _ = self.findings_tx.send(e.clone());
            }
            events
        };
        for e in &events {
            let Some(f) = &e.finding else { continue };
            let detail = f.evidence.as_ref().map_or("", |v| v.detail.as_str());
            macro_rules! log {
                ($level:ident) => {
                    tracing::$level!(
                        change = %e.change,
                        id = f.id,
                        kind = %f.kind,
                        location = %f.location,
                        symptom = %f.symptom,
                        confidence = f.confidence,
                        detail = %detail,
                        "finding"
                    )
                };
            }
            // An open finding is updated by every window that still blames it.
            if e.change == "updated" {
                log!(debug);
            } else {
                log!(info);
            }
        }
        self.persist_findings(&events);
        events
    }

    /// Writes the findings of `events` (and any a failed write left) to the store.
    fn persist_findings(&self, events: &[FindingEvent]) {
        let mut unsaved = self
            .findings_unsaved
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for f in events.iter().filter_map(|e| e.finding.as_ref()) {
            unsaved.insert(f.id, f.clone());
        }
        if unsaved.is_empty() {
            return;
        }
        let batch: Vec<Finding> = unsaved.values().cloned().collect();
        match self.registry.save_findings(&batch) {
            Ok(()) => unsaved.clear(),
            Err(e) => {
                let mut given_up = 0;
                while unsaved.len() > UNSAVED_FINDINGS_CAP {
                    unsaved.pop_first();
                    given_up += 1;
                }
                tracing::error!(
                    error = %e,
                    pending = unsaved.len(),
                    given_up,
                    "storing findings failed; retrying at the next tick"
                );
            }
        }
    }

    /// Component findings: open ones (oldest first), then resolved ones (most recently
    /// resolved first, at most `resolved_limit`, 0 = all retained); `kind` "" = all.
    /// Unknown kinds are refused with the known ones named.
    pub fn findings(&self, resolved_limit: usize, kind: &str) -> Result<Vec<Finding>, Status> {
        check_finding_kind(kind)?;
        if !self.leadership.is_leader() {
            // A follower's analyzer is idle: the leader's findings are in the store.
            if let Some(a) = self.analyzer() {
                let mut l = Localizer::new(*a.localizer().params(), None);
                drop(a);
                l.restore(self.registry.load_findings().map_err(store_err)?);
                let mut list = l.list(resolved_limit, kind);
                self.annotate(&mut list);
                return Ok(list);
            }
        }
        let mut list = self
            .analyzer()
            .map(|a| a.localizer().list(resolved_limit, kind))
            .unwrap_or_default();
        self.annotate(&mut list);
        Ok(list)
    }

    /// Subscribes to finding changes and takes the snapshot under the analyzer lock, so
    /// the stream continues the snapshot exactly. The snapshot: every open finding and
    /// the [`WATCH_SNAPSHOT_RESOLVED`] most recently resolved, of `kind` ("" = all).
    pub fn watch_findings(
        &self,
        kind: &str,
    ) -> Result<(Vec<Finding>, broadcast::Receiver<FindingEvent>), Status> {
        check_finding_kind(kind)?;
        if !self.leadership.is_leader() {
            // A follower's findings do not move: only the leader's changes are live.
            return Err(Status::failed_precondition(
                match self.leadership.forward_to() {
                    Some(addr) => {
                        format!("this replica does not analyze; watch the leader at {addr}")
                    }
                    None => {
                        "this replica does not analyze and no leader is elected yet; retry".into()
                    }
                },
            ));
        }
        match self.analyzer() {
            Some(a) => {
                let rx = self.findings_tx.subscribe();
                let mut list = a.localizer().list(WATCH_SNAPSHOT_RESOLVED, kind);
                drop(a);
                self.annotate(&mut list);
                Ok((list, rx))
            }
            None => Ok((Vec::new(), self.findings_tx.subscribe())),
        }
    }

    /// Ends every WatchFindings stream (UNAVAILABLE) and refuses new ones: the server is
    /// shutting down.
    /// Turns true when the server stops.
    pub fn stopping(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }

    pub fn stop_watches(&self) {
        self.stopping.send_replace(true);
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

    /// Takes a host's Hostping report: checked, kept as the host's newest, stored.
    pub fn report_host(&self, r: HostHealthReport) -> Result<(), Status> {
        check_host_report(&r)?;
        let h = HostHealth {
            hostname: r.hostname,
            agent_id: r.agent_id,
            checked_unix_ns: r.checked_unix_ns,
            received_unix_ns: self.now_ns(),
            tree: r.tree,
            mode: r.mode,
            findings: r.findings,
            report_json: r.report_json,
        };
        {
            let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
            if !hosts.contains_key(&h.hostname) && hosts.len() >= MAX_HOSTS {
                return Err(Status::resource_exhausted(format!(
                    "host report: {MAX_HOSTS} hosts known already; {:?} not taken",
                    h.hostname
                )));
            }
            hosts.insert(h.hostname.clone(), h.clone());
        }
        self.registry.save_host(&h).map_err(|e| {
            tracing::error!(hostname = %h.hostname, error = %e, "storing a host report failed");
            Status::unavailable(format!("host report: the store failed: {e}"))
        })?;
        self.note_alive(&h.agent_id);
        Ok(())
    }

    /// Every host's newest report (without its JSON), by hostname.
    pub fn hosts(&self, problems_only: bool) -> Vec<HostHealth> {
        let hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        hosts
            .values()
            .filter(|h| !problems_only || !h.findings.is_empty())
            .map(|h| HostHealth {
                report_json: String::new(),
                ..h.clone()
            })
            .collect()
    }

    /// One host's newest report.
    pub fn host(&self, hostname: &str) -> Option<HostHealth> {
        self.hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(hostname)
            .cloned()
    }

    /// (hostname, finding kind) -> findings, over the hosts with any (the metric).
    pub fn host_findings_by_kind(&self) -> BTreeMap<(String, String), u64> {
        let mut out = BTreeMap::new();
        for h in self
            .hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            for f in &h.findings {
                *out.entry((h.hostname.clone(), f.kind.clone())).or_default() += 1;
            }
        }
        out
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
