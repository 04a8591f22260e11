//! The page over HTTPS (`http_tls`): the controller's own certificate (`tls_cert_file`,
//! `tls_key_file`), no client certificate asked (browsers; tokens authorize). Each
//! connection is its own task, with a bounded handshake and at most `MAX_CONNECTIONS` at
//! once, so a slow or hostile client holds up nobody else.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_CONNECTIONS: usize = 1024;

/// The server side of TLS from PEM files (h2 and http/1.1 offered).
pub fn server_config(cert_file: &str, key_file: &str) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .and_then(|it| it.collect())
        .with_context(|| format!("tls_cert_file {cert_file:?}: no PEM certificate"))?;
    let key = PrivateKeyDer::from_pem_file(key_file)
        .with_context(|| format!("tls_key_file {key_file:?}: no PEM private key"))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS protocol versions")?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .context("the web page's TLS certificate and key")?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Binds `addr` and serves `router` over TLS until the task is aborted.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    tls: Arc<rustls::ServerConfig>,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let acceptor = TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let join = tokio::spawn(async move {
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "web page: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (acceptor, svc) = (acceptor.clone(), TowerToHyperService::new(router.clone()));
            tokio::spawn(async move {
                let _permit = permit;
                let stream =
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "web page: TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                if let Err(e) = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await
                {
                    tracing::debug!(%peer, error = %e, "web page: connection ended");
                }
            });
        }
    });
    Ok((local, join))
}
