//! TLS and mTLS on the controller listener, with certificates made by the openssl CLI.

use std::path::Path;
use std::process::Command;

use rpingmesh_controller::telemetry::AnalyzerMetrics;
use rpingmesh_controller::{start, ControllerConfig};
use rpingmesh_proto::operator::operator_service_client::OperatorServiceClient;
use rpingmesh_proto::operator::ListViolationsRequest;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

fn openssl(dir: &Path, args: &[&str]) {
    let st = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        st.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&st.stderr)
    );
}

/// CA, server cert (SAN 127.0.0.1/localhost) and client cert, all signed by the CA.
fn make_pki(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=test-ca",
        ],
    );
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    for name in ["server", "client"] {
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={name}"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.pem"),
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ],
        );
    }
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
    if Command::new("openssl").arg("version").output().is_err() {
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
