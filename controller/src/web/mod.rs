//! The operator web page and its read-only JSON API, on `http_listen_addr`.
//!
//! The page is one HTML file compiled into the binary (no external fetches); it polls
//! the JSON endpoints every few seconds. Handlers are thin: they read the controller's
//! state and hand it to the pure builders in [`views`].

pub mod https;
pub mod views;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::analyzer::PathFilter;
use crate::pinglist;
use crate::service::ControllerState;
use crate::service_paths::ServicePathFilter;
use rpingmesh_proto::controller_agent::PathSummary;
use rpingmesh_proto::operator::ServicePath;
use views::{AgentRow, Sla};

/// The page, embedded at build time.
pub const INDEX_HTML: &str = include_str!("index.html");

/// Rows of the drill-down and of the RNIC table per request (the page pages through).
const DEFAULT_LIMIT: usize = 500;
const MAX_LIMIT: usize = 5000;

type St = State<Arc<ControllerState>>;

pub fn router(state: Arc<ControllerState>) -> Router {
    // The page itself carries no data: it asks for a token when the API says 401.
    let open = Router::new()
        .route("/", get(index))
        .route("/healthz", get(|| async { "ok\n" }));
    let api = Router::new()
        .route("/api/overview", get(overview))
        .route("/api/tor-pairs", get(tor_pairs))
        .route("/api/paths", get(paths))
        .route("/api/service-paths", get(service_paths))
        .route("/api/findings", get(findings))
        .route("/api/localized", get(localized))
        .route("/api/job", get(job))
        .route("/api/rnics", get(rnics))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_viewer,
        ));
    open.merge(api).with_state(state)
}

/// Lets a request through when it carries a viewer's or operator's bearer token (or when
/// operator auth is off); otherwise 401 with one line. Also guards /metrics.
pub async fn require_viewer(State(st): St, req: Request, next: Next) -> Response {
    let authz = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match st.operator_auth.authenticate(authz, None) {
        Ok(_) => next.run(req).await,
        Err(why) => {
            let surface = if req.uri().path() == "/metrics" {
                "metrics"
            } else {
                "web"
            };
            let status = st.unauthenticated(surface, &why);
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                format!("{}\n", status.message()),
            )
                .into_response()
        }
    }
}

/// Binds `addr` and serves the page until the task is aborted: over TLS when `tls` is
/// given (`http_tls`), plain HTTP otherwise.
pub async fn serve(
    addr: SocketAddr,
    state: Arc<ControllerState>,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    match tls {
        Some(tls) => https::serve(addr, router(state), tls).await,
        None => rpingmesh_metrics_export::serve(addr, router(state)).await,
    }
}

fn no_store(v: Value) -> Response {
    ([(header::CACHE_CONTROL, "no-store")], Json(v)).into_response()
}

async fn index() -> Response {
    ([(header::CACHE_CONTROL, "no-cache")], Html(INDEX_HTML)).into_response()
}

pub fn sla(st: &ControllerState) -> Option<Sla> {
    st.analyzer().map(|a| Sla {
        loss_ratio: a.params().sla_loss_ratio,
        network_rtt_p99_ns: a.params().sla_network_rtt_p99_ns,
    })
}

fn sla_or_default(st: &ControllerState) -> Sla {
    sla(st).unwrap_or(Sla {
        loss_ratio: 1.0,
        network_rtt_p99_ns: 0,
    })
}

/// The named agents with their liveness (an agent is active while any of its RNICs
/// is), sorted by (ToR, agent id).
pub fn agent_rows(st: &ControllerState, ids: &[&str]) -> Vec<AgentRow> {
    let now = st.liveness_now_sec();
    let idx = st.registry.index();
    let mut rows: Vec<AgentRow> = ids
        .iter()
        .filter_map(|id| idx.agent(id))
        .map(|a| {
            let gids = idx.agent_gids(&a.agent_id);
            AgentRow {
                agent_id: a.agent_id.clone(),
                hostname: a.hostname.clone(),
                tor_id: a.tor_id.clone(),
                version: None,
                last_seen_unix_sec: a.last_updated,
                rnics: gids.len(),
                active: gids
                    .iter()
                    .filter_map(|g| idx.rnic(g))
                    .any(|r| pinglist::is_active(r, now, st.pinglist.active_threshold_sec)),
            }
        })
        .collect();
    drop(idx);
    for r in &mut rows {
        r.version = st.agent_version(&r.agent_id);
    }
    rows.sort_by(|a, b| (&a.tor_id, &a.agent_id).cmp(&(&b.tor_id, &b.agent_id)));
    rows
}

fn tor_ids(st: &ControllerState) -> Vec<String> {
    let idx = st.registry.index();
    (0..idx.tor_count())
        .map(|i| idx.tor_at(i).0.to_string())
        .collect()
}

async fn overview(State(st): St) -> Response {
    let c = st.liveness_counts();
    let (open_findings, localized_open) = st
        .analyzer()
        .map(|a| {
            let by_kind = a.localizer().open_by_kind();
            (
                a.finding_book().open_count(),
                by_kind.values().sum::<usize>(),
            )
        })
        .unzip();
    let s = sla(&st);
    no_store(json!({
        "controller_version": env!("CARGO_PKG_VERSION"),
        "now_unix_ms": st.now_ns() / 1_000_000,
        "analyzer_enabled": s.is_some(),
        "sla": s.map(|s| json!({
            "loss_ratio": s.loss_ratio,
            "network_rtt_p99_ns": s.network_rtt_p99_ns,
        })),
        "rnics": { "active": c.rnics_active, "inactive": c.rnics - c.rnics_active },
        "agents": { "total": c.agents, "active": c.agents_active },
        "tors": st.registry.index().tor_count(),
        "findings_open": open_findings,
        "localized_open": localized_open,
        "service_paths": st.service_path_counts().values().sum::<u64>(),
    }))
}

/// ToRs in the matrix unless `max_tors` says otherwise.
const DEFAULT_MAX_TORS: usize = 64;

async fn tor_pairs(State(st): St, Query(q): Query<HashMap<String, String>>) -> Response {
    let max_tors = q
        .get("max_tors")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(DEFAULT_MAX_TORS)
        .clamp(1, 1024);
    let pairs = st.tor_pairs();
    no_store(views::tor_matrix(
        &sla_or_default(&st),
        &tor_ids(&st),
        &pairs,
        max_tors,
    ))
}

#[derive(Debug, Deserialize, Default)]
struct PathsQuery {
    #[serde(default)]
    source_tor: String,
    #[serde(default)]
    target_tor: String,
    limit: Option<usize>,
}

async fn paths(State(st): St, Query(q): Query<PathsQuery>) -> Response {
    let filter = PathFilter {
        source_tor_id: &q.source_tor,
        target_tor_id: &q.target_tor,
        ..Default::default()
    };
    // SERVICE windows re-measure mesh pairs; the drill-down shows network paths.
    let paths: Vec<_> = st
        .paths(&filter, false)
        .into_iter()
        .filter(|s| s.service.is_empty())
        .collect();
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    no_store(views::pair_paths(&sla_or_default(&st), paths, limit))
}

async fn service_paths(State(st): St) -> Response {
    let with_history = paths_with_history(&st, &ServicePathFilter::default());
    no_store(views::service_paths(&sla_or_default(&st), &with_history))
}

/// One workload (`?service=KEY`): its service paths and the findings that hurt it.
async fn job(State(st): St, Query(q): Query<HashMap<String, String>>) -> Response {
    let service = q.get("service").cloned().unwrap_or_default();
    let with_history = paths_with_history(
        &st,
        &ServicePathFilter {
            service: &service,
            ..Default::default()
        },
    );
    let findings = st
        .analyzer()
        .map(|a| a.localizer().list(100, ""))
        .unwrap_or_default();
    no_store(views::job(
        &sla_or_default(&st),
        &service,
        &with_history,
        &findings,
    ))
}

/// Service paths with their retained SERVICE windows (oldest first).
fn paths_with_history(
    st: &ControllerState,
    filter: &ServicePathFilter<'_>,
) -> Vec<(ServicePath, Vec<PathSummary>)> {
    let list = st.service_paths(filter);
    match st.analyzer() {
        Some(a) => list
            .into_iter()
            .map(|p| {
                let h = a
                    .service_windows(&p.source_gid, &p.target_gid, &p.service)
                    .into_iter()
                    .cloned()
                    .collect();
                (p, h)
            })
            .collect(),
        None => list.into_iter().map(|p| (p, Vec::new())).collect(),
    }
}

async fn findings(State(st): St, Query(q): Query<HashMap<String, String>>) -> Response {
    let num = |k: &str, d: usize| q.get(k).and_then(|v| v.parse::<usize>().ok()).unwrap_or(d);
    let list = st
        .analyzer()
        .map(|a| a.findings(num("resolved_limit", 100)))
        .unwrap_or_default();
    no_store(views::findings(
        &sla_or_default(&st),
        &list,
        num("limit", DEFAULT_LIMIT).clamp(1, MAX_LIMIT),
    ))
}

async fn localized(State(st): St, Query(q): Query<HashMap<String, String>>) -> Response {
    let num = |k: &str, d: usize| q.get(k).and_then(|v| v.parse::<usize>().ok()).unwrap_or(d);
    let mut list = st
        .analyzer()
        .map(|a| a.localizer().list(num("resolved_limit", 100), ""))
        .unwrap_or_default();
    st.annotate(&mut list);
    no_store(views::localized(
        &list,
        num("limit", DEFAULT_LIMIT).clamp(1, MAX_LIMIT),
    ))
}

#[derive(Debug, Deserialize, Default)]
struct RnicsQuery {
    #[serde(default)]
    tor: String,
    offset: Option<usize>,
    limit: Option<usize>,
}

/// A page of RNICs, and the agents those RNICs belong to.
async fn rnics(State(st): St, Query(q): Query<RnicsQuery>) -> Response {
    let offset = q.offset.unwrap_or(0);
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let (page, total) = st.rnic_page(&q.tor, offset, limit);
    let mut ids: Vec<&str> = page.iter().map(|r| r.agent_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let agents = agent_rows(&st, &ids);
    let agents_total = st.registry.index().agent_count();
    no_store(views::rnics(&page, total, offset, &agents, agents_total))
}
