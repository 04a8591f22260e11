//! Shared by the in-process gRPC tests: a real tonic server on 127.0.0.1:0 over an
//! in-memory SQLite registry, with a clock the test moves, and real clients.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rpingmesh_controller::registry::SqliteRegistry;
use rpingmesh_controller::service::ControllerState;
use rpingmesh_controller::telemetry::AnalyzerMetrics;
use rpingmesh_controller::{start_with_state, ControllerConfig, ServerHandle};
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::operator::operator_service_client::OperatorServiceClient;
use tonic::transport::Channel;

pub const SEC: u64 = 1_000_000_000;

pub struct Harness {
    pub server: ServerHandle,
    /// Unix ns seen by the controller; tests advance it to age registrations and flows.
    pub clock: Arc<AtomicU64>,
    pub ctl: ControllerServiceClient<Channel>,
    pub op: OperatorServiceClient<Channel>,
}

pub async fn harness(cfg: ControllerConfig) -> Harness {
    let clock = Arc::new(AtomicU64::new(1_000_000 * SEC));
    let c = clock.clone();
    let state = ControllerState::with_store(
        &cfg,
        Box::new(SqliteRegistry::open_in_memory().unwrap()),
        AnalyzerMetrics::noop(),
        Arc::new(move || c.load(Ordering::Relaxed)),
    )
    .unwrap();
    let server = start_with_state(&cfg, Arc::new(state)).await.unwrap();
    let url = format!("http://{}", server.local_addr);
    Harness {
        ctl: ControllerServiceClient::connect(url.clone()).await.unwrap(),
        op: OperatorServiceClient::connect(url).await.unwrap(),
        server,
        clock,
    }
}

/// The full (normalized) form of a GID written compressed in a test.
pub fn full(g: &str) -> String {
    rpingmesh_proto::gid::normalize_gid(g).unwrap()
}
