//! TLS and mTLS on the controller listener, with certificates made by the openssl CLI.

use std::path::Path;

use rpingmesh_controller::telemetry::AnalyzerMetrics;
use rpingmesh_controller::{start, ControllerConfig};
use rpingmesh_proto::operator::operator_service_client::OperatorServiceClient;
use rpingmesh_proto::operator::ListViolationsRequest;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// CA, server cert (SAN 127.0.0.1/localhost) and client cert, all signed by the CA.
fn make_pki(dir: &Path) {
    rpingmesh_test_pki::make_server_client_pki(dir).unwrap();
}

async fn call(addr: std::net::SocketAddr, tls: ClientTlsConfig) -> Result<(), String> {
    let ch = Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    OperatorServiceClient::new(ch)
        .list_violations(ListViolationsRequest { limit: 0 })
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_mtls_listeners() {
    if !rpingmesh_test_pki::have_openssl() {
        eprintln!("SKIP tls_and_mtls_listeners: openssl CLI not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_pki(dir.path());
    let p = |f: &str| dir.path().join(f).display().to_string();
    let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
    let base = ControllerConfig {
        listen_addr: "127.0.0.1:0".into(),
        database_uri: "sqlite::memory:".into(),
        metrics_enabled: false,
        tls_cert_file: p("server.pem"),
        tls_key_file: p("server.key"),
        ..Default::default()
    };
    let ca = || {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read("ca.pem")))
            .domain_name("localhost")
    };

    // tls: server authenticated, client anonymous.
    let cfg = ControllerConfig {
        tls_mode: "tls".into(),
        ..base.clone()
    };
    cfg.validate().unwrap();
    let srv = start(&cfg, AnalyzerMetrics::noop()).await.unwrap();
    call(srv.local_addr, ca()).await.unwrap();
    srv.shutdown().await.unwrap();

    // mtls: a client without a certificate is refused, one with a CA-signed cert is served.
    let cfg = ControllerConfig {
        tls_mode: "mtls".into(),
        tls_ca_file: p("ca.pem"),
        ..base
    };
    cfg.validate().unwrap();
    let srv = start(&cfg, AnalyzerMetrics::noop()).await.unwrap();
    assert!(
        call(srv.local_addr, ca()).await.is_err(),
        "mtls must reject a client without a certificate"
    );
    let with_cert = ca().identity(Identity::from_pem(read("client.pem"), read("client.key")));
    call(srv.local_addr, with_cert).await.unwrap();
    srv.shutdown().await.unwrap();
}
