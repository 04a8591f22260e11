//! rpingmesh-controller binary: config, logs, metrics, gRPC server, graceful shutdown.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rpingmesh_controller::telemetry::{self, Telemetry};
use rpingmesh_controller::{server, CliArgs, ControllerConfig};

/// How long a SIGTERM/SIGINT waits for open calls to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

fn main() -> ExitCode {
    let cli = CliArgs::parse();
    let cfg = match ControllerConfig::load(&cli, std::env::vars()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rpingmesh-controller: {e}");
            return ExitCode::from(2);
        }
    };
    telemetry::init_logging(&cfg.log_level);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rpingmesh-controller: tokio runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cfg)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "controller failed");
            eprintln!("rpingmesh-controller: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(cfg: ControllerConfig) -> anyhow::Result<()> {
    let telemetry = Telemetry::init(&cfg);
    let handle = match server::start(&cfg, telemetry.metrics.clone()).await {
        Ok(h) => h,
        Err(e) => {
            telemetry.shutdown();
            return Err(e);
        }
    };
    if let Some(meter) = telemetry.meter() {
        rpingmesh_controller::state_gauges::observe_state(&meter, &handle.state);
    }
    let _metrics_server = match telemetry.prometheus_registry() {
        Some(reg) => {
            let addr = cfg.prometheus_socket_addr()?;
            let (bound, join) = rpingmesh_metrics_export::serve(
                addr,
                rpingmesh_metrics_export::router(reg).layer(axum::middleware::from_fn_with_state(
                    handle.state.clone(),
                    rpingmesh_controller::web::require_viewer,
                )),
            )
            .await
            .map_err(|e| anyhow::anyhow!("prometheus_listen_addr {addr}: bind failed: {e}"))?;
            tracing::info!(addr = %bound, "Prometheus /metrics listening");
            Some(join)
        }
        None => None,
    };
    tracing::info!(
        addr = %handle.local_addr,
        database_uri = %cfg.database_uri,
        rnics = handle.state.registry.index().len(),
        "controller listening"
    );
    shutdown_signal().await;
    tracing::info!("shutting down");
    // Open calls are drained (WatchFindings streams are ended first); a client that stops
    // reading cannot hold the exit up past the grace.
    let r = match tokio::time::timeout(SHUTDOWN_GRACE, handle.shutdown()).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!(
                grace_sec = SHUTDOWN_GRACE.as_secs(),
                "open calls did not finish in time; stopping without them"
            );
            Ok(())
        }
    };
    // The provider's shutdown blocks while it flushes; keep it off the async workers.
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    tracing::info!("controller stopped");
    r
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "SIGTERM handler unavailable; waiting for SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
