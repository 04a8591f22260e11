//! rpingmesh-agent binary: config, logging, transport, run until SIGINT/SIGTERM.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use rpingmesh_agent::config::{AgentConfig, CliArgs, Transport};
use rpingmesh_agent::telemetry::{init_logging, Telemetry};
use rpingmesh_agent::{agent, open, telemetry, watchdog_sampler};

fn main() -> ExitCode {
    one_malloc_arena();
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("hostping") {
        return rpingmesh_agent::hostping::main(argv[1..].to_vec());
    }
    let cli = CliArgs::parse();
    let cfg = match AgentConfig::load(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rpingmesh-agent: config error: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(&cfg.log_level);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads(cfg.max_procs))
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rpingmesh-agent: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = rt.block_on(run(cfg));
    // A blocking task still at work (an eBPF load, `rdma res show`) must not hold the exit.
    rt.shutdown_timeout(Duration::from_secs(1));
    code
}

/// One glibc heap for every thread. The agent's threads (tokio workers, the blocking
/// thread that loads eBPF and parses the kernel's BTF, rdma pollers and resolvers) would
/// otherwise each get an arena of their own, which keeps what it once held: the BTF
/// parse alone left 9 MiB resident in its thread's arena. The agent allocates little on
/// its hot paths, so one arena costs no measurable contention.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter, before any thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

async fn run(cfg: AgentConfig) -> ExitCode {
    // Every RNIC is opened before anything contacts the controller: an agent that cannot
    // open its transport exits with one line and leaves no half-registered agent behind.
    let opened = match cfg.transport {
        Transport::Udp => open::bind_udp(&cfg).map(|eps| {
            eps.into_iter()
                .map(open::OpenedRnic::from)
                .collect::<Vec<_>>()
        }),
        Transport::Rdma => open::open_rdma(&cfg),
    };
    let endpoints = match opened {
        Ok(eps) => eps,
        Err(e) => {
            eprintln!("rpingmesh-agent: {e}");
            return ExitCode::from(1);
        }
    };
    let telemetry = Telemetry::init(
        cfg.metrics_enabled,
        cfg.exporter()
            .unwrap_or(rpingmesh_metrics_export::Exporter::Otlp),
        &cfg.otel_collector_addr,
        Duration::from_millis(cfg.metrics_export_interval_ms),
        &cfg.hostname,
    );
    // Served before probing starts; a port in use is a config error like any other.
    let _metrics_server = match telemetry.prometheus_registry() {
        Some(reg) => {
            let addr = match cfg.prometheus_socket_addr() {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("rpingmesh-agent: {e}");
                    return ExitCode::from(2);
                }
            };
            match rpingmesh_metrics_export::serve(addr, rpingmesh_metrics_export::router(reg)).await
            {
                Ok((bound, join)) => {
                    tracing::info!(addr = %bound, "Prometheus /metrics listening");
                    Some(join)
                }
                Err(e) => {
                    eprintln!("rpingmesh-agent: prometheus_listen_addr {addr}: bind failed: {e}");
                    return ExitCode::from(1);
                }
            }
        }
        None => None,
    };
    let running = match agent::start(&cfg, endpoints, telemetry.metrics.clone()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rpingmesh-agent: {e}");
            return ExitCode::from(1);
        }
    };
    // The Go agent's self_throttle gauge exists from start (1.0: unthrottled), so a
    // scrape of a healthy agent has the series a dashboard reads; the watchdog moves it.
    let gauge = telemetry.self_throttle_gauge();
    gauge.record(1.0, &[]);
    let watchdog = running.rate_multiplier.clone().map(|m| {
        let cfg = cfg.clone();
        tokio::spawn(async move { watchdog_sampler::run_watchdog(&cfg, m, gauge).await })
    });
    wait_for_signal().await;
    tracing::info!("shutting down");
    if let Some(w) = watchdog {
        w.abort();
    }
    running.shutdown().await;
    // The final export blocks on the exporter: keep it off the async workers.
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    tracing::info!(service = telemetry::SERVICE_NAME, "stopped");
    ExitCode::SUCCESS
}

/// Two async workers, or fewer when max_procs caps the cores (honored whenever set,
/// independent of self_protection_enabled).
fn worker_threads(max_procs: u64) -> usize {
    const DEFAULT: usize = 2;
    match usize::try_from(max_procs) {
        Ok(0) => DEFAULT,
        Ok(n) => n.min(DEFAULT),
        Err(_) => DEFAULT,
    }
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

#[cfg(test)]
mod tests {
    use super::worker_threads;

    #[test]
    fn max_procs_caps_the_workers() {
        assert_eq!(worker_threads(0), 2);
        assert_eq!(worker_threads(1), 1);
        assert_eq!(worker_threads(8), 2);
    }
}
