//! Test certificates (`rpingmesh-test-pki`: the openssl CLI, as docs/operations.md does
//! it), and TLS channels that show them.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

pub use rpingmesh_test_pki::{make_pki, CertSpec};

/// An HTTPS GET (HTTP/1.1) to `addr`, its certificate checked against `ca.pem` in `dir`
/// for `server_name`: (status, body).
pub async fn https_get(
    addr: SocketAddr,
    dir: &Path,
    server_name: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String)> {
    use rustls_pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(dir.join("ca.pem"))? {
        roots.add(c?)?;
    }
    let cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls_pki_types::ServerName::try_from(server_name.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
        .connect(name, tcp)
        .await?;
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {server_name}\r\n{extra}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut raw = Vec::new();
    // A server may close without close_notify once the response is out.
    let _ = tls.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("GET {path}: no header end in {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("GET {path}: bad status line"))?;
    Ok((status, body.to_string()))
}

/// An mTLS channel to `addr` (its certificate checked against `ca.pem` for `server_name`)
/// that shows certificate `name`.
pub async fn mtls_channel(
    addr: SocketAddr,
    dir: &Path,
    name: &str,
    server_name: &str,
) -> Result<Channel> {
    let read = |f: String| std::fs::read(dir.join(&f)).with_context(|| f);
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read("ca.pem".into())?))
        .domain_name(server_name)
        .identity(Identity::from_pem(
            read(format!("{name}.pem"))?,
            read(format!("{name}.key"))?,
        ));
    Ok(Channel::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .connect()
        .await?)
}
