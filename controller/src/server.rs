//! Server assembly: bind, optional TLS/mTLS, both services, stale sweeper, the findings
//! tick, graceful shutdown. Used by the binary, the tests and the benchmark.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use rpingmesh_proto::controller_agent::controller_service_server::ControllerServiceServer;
use rpingmesh_proto::operator::operator_service_server::OperatorServiceServer;

use crate::config::{ControllerConfig, TlsMode};
use crate::service::{ControllerState, ControllerSvc, OperatorSvc};
use crate::telemetry::AnalyzerMetrics;

/// A running controller server.
pub struct ServerHandle {
    pub local_addr: SocketAddr,
    /// The web page's address, when `http_listen_addr` is set.
    pub http_addr: Option<SocketAddr>,
    http: Option<JoinHandle<()>>,
    pub state: Arc<ControllerState>,
    shutdown: Option<oneshot::Sender<()>>,
    join: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl ServerHandle {
    /// Stops accepting, drains in-flight RPCs and waits for the server task.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        // Open WatchFindings streams never end on their own; the drain would wait for them.
        self.state.stop_watches();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.http.take() {
            h.abort();
        }
        self.join
            .await
            .context("server task")?
            .context("gRPC server")?;
        // The last second's audit lines.
        let st = self.state.clone();
        let _ = tokio::task::spawn_blocking(move || st.flush_audit()).await;
        Ok(())
    }
}

/// Reads the TLS material the config names (already validated as readable).
pub fn tls_config(cfg: &ControllerConfig) -> anyhow::Result<Option<ServerTlsConfig>> {
    let mode = cfg.tls()?;
    if mode == TlsMode::Disabled {
        return Ok(None);
    }
    let read = |key: &str, path: &str| {
        std::fs::read(path).with_context(|| format!("{key} {path:?}: cannot read"))
    };
    let cert = read("tls_cert_file", &cfg.tls_cert_file)?;
    let key = read("tls_key_file", &cfg.tls_key_file)?;
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
    if mode == TlsMode::Mtls {
        tls = tls.client_ca_root(Certificate::from_pem(read(
            "tls_ca_file",
            &cfg.tls_ca_file,
        )?));
        // Operator tokens are for scripts without a certificate: the handshake then lets
        // them in, and every call is still checked (an agent RPC needs a certificate
        // that names the agent, an operator call a token or a certificate's role).
        if !cfg.operator_tokens_file.trim().is_empty() {
            tls = tls.client_auth_optional(true);
        }
    }
    Ok(Some(tls))
}

/// Sweep period: stale_threshold/10, between 1 s and 60 s.
/// Runs `work` on the blocking pool every `period` (a tick missed while it ran is run late,
/// not twice) and hands what came of it to `done`: the controller's periodic chores that
/// read or write the store.
fn every<T: Send + 'static>(
    period: Duration,
    state: &Arc<ControllerState>,
    work: impl Fn(&ControllerState) -> T + Send + Sync + Copy + 'static,
    done: impl Fn(Result<T, tokio::task::JoinError>) + Send + Sync + 'static,
) -> JoinHandle<()> {
    let state = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let st = state.clone();
            done(tokio::task::spawn_blocking(move || work(&st)).await);
        }
    })
}

pub fn sweep_interval(stale_threshold_sec: u64) -> Duration {
    Duration::from_secs((stale_threshold_sec / 10).clamp(1, 60))
}

/// How often the analyzer localizes settled windows and findings move.
pub const FINDINGS_TICK: Duration = Duration::from_secs(1);
/// How often audit lines go to the store's trail.
pub const AUDIT_FLUSH: Duration = Duration::from_secs(1);
/// How often each replica reads the drains and silences back from the store.
pub const ACTIONS_REFRESH: Duration = Duration::from_secs(2);

/// Opens the registry named by the config and starts serving on `listen_addr`.
pub async fn start(
    cfg: &ControllerConfig,
    metrics: AnalyzerMetrics,
) -> anyhow::Result<ServerHandle> {
    let state = ControllerState::new(cfg, metrics)?;
    start_with_state(cfg, Arc::new(state)).await
}

/// Starts serving `state` on `listen_addr` (port 0 picks a free port).
pub async fn start_with_state(
    cfg: &ControllerConfig,
    state: Arc<ControllerState>,
) -> anyhow::Result<ServerHandle> {
    let addr = cfg.listen_socket_addr()?;
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("listen_addr {addr}: bind failed"))?;
    let local_addr = listener.local_addr()?;
    let mut builder = Server::builder();
    match tls_config(cfg)? {
        Some(tls) => builder = builder.tls_config(tls).context("TLS configuration")?,
        None => tracing::warn!("tls_mode=disabled: controller gRPC is plaintext"),
    }
    if !state.auth.enforce {
        tracing::warn!(
            tls_mode = %cfg.tls_mode,
            "agent identities are not enforced: any client can register and report as any agent (tls_mode=mtls binds each agent to its certificate)"
        );
    }
    if !state.operator_auth.enabled && !local_addr.ip().is_loopback() {
        tracing::warn!(
            addr = %local_addr,
            "the operator API has no authentication on a non-loopback listener: anyone who reaches it reads everything and acts (set operator_tokens_file or tls_operator_roles)"
        );
    }
    let operators = {
        let state = state.clone();
        move |mut req: tonic::Request<()>| {
            let authz = req
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let certs = req.peer_certs();
            let leaf = certs.as_ref().and_then(|c| c.first()).map(|c| c.as_ref());
            match state.operator_auth.authenticate(authz.as_deref(), leaf) {
                Ok(caller) => {
                    req.extensions_mut().insert(caller);
                    Ok(req)
                }
                Err(m) => Err(state.unauthenticated("OperatorService", &m)),
            }
        }
    };
    let router = builder
        .add_service(ControllerServiceServer::new(ControllerSvc(state.clone())))
        .add_service(OperatorServiceServer::with_interceptor(
            OperatorSvc(state.clone()),
            operators,
        ));

    // SIGHUP: the operator tokens are read again.
    let reload = {
        let state = state.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let Ok(mut hup) = signal(SignalKind::hangup()) else {
                tracing::warn!("no SIGHUP handler: operator tokens are read at start only");
                return;
            };
            while hup.recv().await.is_some() {
                match state.operator_auth.reload() {
                    Ok(n) => tracing::info!(tokens = n, "operator tokens reloaded"),
                    Err(e) => {
                        tracing::error!(error = %format!("{e:#}"), "operator tokens not reloaded; the previous ones stay")
                    }
                }
            }
        })
    };

    let sweeper = every(
        sweep_interval(state.stale_threshold_sec),
        &state,
        |st| {
            let expired = st.expire_service_flows();
            if expired > 0 {
                tracing::info!(flows = expired, "expired service flows of silent agents");
            }
            st.remove_stale()
        },
        |r| match r {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(removed = n, "removed stale RNICs"),
            Ok(Err(e)) => tracing::error!(error = %e, "stale RNIC removal failed"),
            Err(e) => tracing::error!(error = %e, "stale RNIC removal task"),
        },
    );

    // The controller's own watch: notices when the process did not run (see
    // `ControllerState::liveness_now_sec`).
    let watch = every(
        Duration::from_nanos(crate::liveness::WATCH_TICK_NS),
        &state,
        ControllerState::liveness_now_sec,
        drop,
    );

    // The audit trail: lines to the store once a second (the write blocks, so off the
    // workers).
    let audit = every(AUDIT_FLUSH, &state, ControllerState::flush_audit, drop);

    // Operators' drains and silences: what the store holds (another replica may have
    // taken or ended some), expired ones deleted.
    let actions = every(
        ACTIONS_REFRESH,
        &state,
        ControllerState::refresh_actions,
        |r| match r {
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading the drains and silences from the store failed; the ones held stay")
            }
            Err(e) => tracing::error!(error = %e, "actions refresh task"),
            Ok(Ok(())) => {}
        },
    );

    // Replicas on etcd: every replica's service flows into this one's table.
    if let Some(mut rx) = state.registry.shared_service_flows() {
        let state = state.clone();
        tokio::spawn(async move {
            while let Some(r) = rx.recv().await {
                state.apply_shared_service_flows(r);
            }
        });
    }

    // Replicas on etcd: campaign for the analysis (see `crate::leader`).
    if let Some(eps) = state.etcd_endpoints.clone() {
        let me = match cfg.advertise_addr.trim() {
            "" => local_addr.to_string(),
            a => a.to_string(),
        };
        tokio::spawn(crate::leader::run_election(
            eps,
            me,
            cfg.leader_lease_ttl_sec,
            state.leadership.clone(),
            state.stopping(),
        ));
    }

    // Findings: localize settled windows, publish, store (see
    // `ControllerState::findings_tick`; the store write blocks, so off the workers).
    let findings = state.analyzer.is_some().then(|| {
        every(FINDINGS_TICK, &state, ControllerState::findings_tick, |r| {
            if let Err(e) = r {
                tracing::error!(error = %e, "findings tick task");
            }
        })
    });

    let (http_addr, http) = match cfg.http_socket_addr()? {
        Some(addr) => {
            let tls = match cfg.http_tls()? {
                true => Some(crate::web::https::server_config(
                    &cfg.tls_cert_file,
                    &cfg.tls_key_file,
                )?),
                false => None,
            };
            let scheme = if tls.is_some() { "https" } else { "http" };
            let (bound, join) = crate::web::serve(addr, state.clone(), tls)
                .await
                .with_context(|| format!("http_listen_addr {addr}: bind failed"))?;
            tracing::info!(addr = %bound, url = %format!("{scheme}://{bound}/"), "operator web page listening");
            if !state.operator_auth.enabled && !bound.ip().is_loopback() {
                tracing::warn!(
                    addr = %bound,
                    "the web page's JSON API has no authentication on a non-loopback listener (set operator_tokens_file)"
                );
            }
            (Some(bound), Some(join))
        }
        None => (None, None),
    };

    let (tx, rx) = oneshot::channel::<()>();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let join = tokio::spawn(async move {
        let r = router
            .serve_with_incoming_shutdown(incoming, async {
                let _ = rx.await;
            })
            .await;
        sweeper.abort();
        watch.abort();
        reload.abort();
        audit.abort();
        actions.abort();
        if let Some(f) = findings {
            f.abort();
        }
        r
    });
    Ok(ServerHandle {
        local_addr,
        http_addr,
        http,
        state,
        shutdown: Some(tx),
        join,
    })
}
