//! rpingmesh-agent binary: config, logging, transport, run until SIGINT/SIGTERM.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rpingmesh_agent::config::{AgentConfig, CliArgs, Transport};
use rpingmesh_agent::telemetry::{init_logging, Telemetry};
use rpingmesh_agent::{agent, telemetry};
use rpingmesh_verbs::VerbsError;

fn main() -> ExitCode {
    let cli = CliArgs::parse();
    let cfg = match AgentConfig::load(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rpingmesh-agent: config error: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(&cfg.log_level);
    if cfg.self_protection_enabled {
        tracing::warn!("self_protection_enabled: the resource watchdog is not implemented yet; probing is not throttled");
    }
    // Before anything contacts the controller: no half-registered agent.
    if cfg.transport == Transport::Rdma {
        let device = cfg
            .allowed_device_names
            .first()
            .map(String::as_str)
            .unwrap_or("");
        if let Err(e) = rpingmesh_verbs::rdma::open_rdma(device) {
            eprintln!("rpingmesh-agent: {e}");
            return ExitCode::from(1);
        }
        // An rdma build would drive RdmaEndpoint here; this build has no such backend.
        eprintln!("rpingmesh-agent: {}", VerbsError::RdmaNotBuilt);
        return ExitCode::from(1);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rpingmesh-agent: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    rt.block_on(run(cfg))
}

async fn run(cfg: AgentConfig) -> ExitCode {
    let endpoints = match agent::bind_udp(&cfg) {
        Ok(eps) => eps,
        Err(e) => {
            eprintln!("rpingmesh-agent: {e}");
            return ExitCode::from(1);
        }
    };
    let telemetry = Telemetry::init(
        cfg.metrics_enabled,
        &cfg.otel_collector_addr,
        Duration::from_millis(cfg.metrics_export_interval_ms),
    );
    let running = match agent::start(&cfg, endpoints, telemetry.metrics.clone()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rpingmesh-agent: {e}");
            return ExitCode::from(1);
        }
    };
    wait_for_signal().await;
    tracing::info!("shutting down");
    running.shutdown().await;
    // The final export blocks on the exporter: keep it off the async workers.
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    tracing::info!(service = telemetry::SERVICE_NAME, "stopped");
    ExitCode::SUCCESS
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch SIGTERM; only SIGINT stops the agent");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
