//! rpingmeshctl against a controller running TLS and mTLS (PKI made by the openssl CLI).

mod common;

use common::*;
use rpingmesh_controller::ControllerConfig;
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{
    PathSummary, PinglistType, ProbeAnalysisReport, ServiceFlow, ServiceFlowReport,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// Registers two agents, one service flow and one window over mTLS, as agents would: each
/// agent with its own certificate (the controller reads the identity from the CN here:
/// agent "client" on tor-1 with GID_A, agent "server" on tor-2 with GID_B).
async fn seed(addr: std::net::SocketAddr, dir: &std::path::Path) {
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
    let connect = |name: &str| {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read("ca.pem")))
            .identity(Identity::from_pem(
                read(&format!("{name}.pem")),
                read(&format!("{name}.key")),
            ));
        async move {
            let ch = Channel::from_shared(format!("https://{addr}"))
                .unwrap()
                .tls_config(tls)
                .unwrap()
                .connect()
                .await
                .unwrap();
            ControllerServiceClient::new(ch)
        }
    };
    let mut b = connect("server").await;
    b.register_agent(reg("server", "tor-2", GID_B))
        .await
        .unwrap();
    let mut c = connect("client").await;
    c.register_agent(reg("client", "tor-1", GID_A))
        .await
        .unwrap();
    c.report_service_flows(ServiceFlowReport {
        agent_id: "client".into(),
        full_sync: true,
        upserts: vec![ServiceFlow {
            local_gid: GID_A.into(),
            local_qpn: 100,
            remote_gid: GID_B.into(),
            remote_qpn: 900,
            comm: "nccl-test".into(),
            service: "allreduce".into(),
            ..Default::default()
        }],
        removals: vec![],
    })
    .await
    .unwrap();
    c.report_probe_analysis(ProbeAnalysisReport {
        agent_id: "client".into(),
        summaries: vec![PathSummary {
            source_gid: GID_A.into(),
            source_tor_id: "tor-1".into(),
            target_gid: GID_B.into(),
            target_tor_id: "tor-2".into(),
            window_start_unix_ns: 1_700_000_000_000_000_000,
            probe_total: 100,
            probe_success: 100,
            network_rtt_p50_ns: 4_200,
            network_rtt_p99_ns: 9_000,
            pinglist_type: PinglistType::TorMesh as i32,
            ..Default::default()
        }],
        ..Default::default()
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_against_tls_and_mtls_controllers() {
    if !have_openssl() {
        eprintln!("SKIP cli_against_tls_and_mtls_controllers: openssl CLI not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_pki(dir.path());
    let p = |f: &str| dir.path().join(f).display().to_string();
    let base = ControllerConfig {
        tls_cert_file: p("server.pem"),
        tls_key_file: p("server.key"),
        ..plain_config()
    };
    let srv = start(&ControllerConfig {
        tls_mode: "mtls".into(),
        tls_ca_file: p("ca.pem"),
        tls_identity_from: "cn".into(),
        ..base.clone()
    })
    .await;
    let addr = srv.local_addr.to_string();
    seed(srv.local_addr, dir.path()).await;

    let (ca, cert, key) = (p("ca.pem"), p("client.pem"), p("client.key"));
    let mtls: Vec<&str> = vec![
        "--tls-mode",
        "mtls",
        "--tls-ca-file",
        &ca,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
    ];
    let with = |extra: &[&str]| {
        let mut v = mtls.clone();
        v.extend(extra);
        args(&addr, &v)
    };

    // CA + client certificate: every listing answers.
    let out = stdout(&ctl(with(&["rnics"])).await);
    assert!(out.contains(GID_A) && out.contains(GID_B), "{out}");
    let out = stdout(&ctl(with(&["paths"])).await);
    assert!(out.contains("tor-mesh") || out.contains(GID_B), "{out}");
    assert!(out.contains("9.0"), "{out}");
    let out = stdout(&ctl(with(&["service-paths", "--json"])).await);
    let row: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(row["service"], "allreduce");
    assert_eq!(row["target_gid"], GID_B);
    // The name checked can be overridden (the certificate has DNS:localhost too).
    stdout(&ctl(with(&["--tls-server-name", "localhost", "tor-pairs"])).await);
    // --watch over mTLS.
    let out = stdout(
        &ctl(with(&[
            "service-paths",
            "--watch",
            "--count",
            "2",
            "--interval",
            "0.2",
        ]))
        .await,
    );
    assert_eq!(out.matches("--- ").count(), 2, "{out}");

    // The same settings from RPINGMESH_* variables, as the agent reads them.
    let (o, _) = ctl_env(
        vec!["rnics".into()],
        vec![
            ("RPINGMESH_CONTROLLER_ADDR", addr.clone()),
            ("RPINGMESH_TLS_MODE", "mtls".into()),
            ("RPINGMESH_TLS_CA_FILE", ca.clone()),
            ("RPINGMESH_TLS_CERT_FILE", cert.clone()),
            ("RPINGMESH_TLS_KEY_FILE", key.clone()),
        ],
    )
    .await;
    assert!(stdout(&o).contains(GID_A));

    // ... and from an agent YAML (its other keys are ignored).
    let yaml = dir.path().join("agent.yaml");
    std::fs::write(
        &yaml,
        format!(
            "tor_id: tor-1\nprobe_interval_ms: 100\ncontroller_addr: {addr}\ntls_mode: mtls\n\
             tls_ca_file: {ca}\ntls_cert_file: {cert}\ntls_key_file: {key}\n\
             tls_server_name: localhost\n"
        ),
    )
    .unwrap();
    let o = ctl(vec![
        "--config".into(),
        yaml.display().to_string(),
        "rnics".into(),
    ])
    .await;
    assert!(stdout(&o).contains(GID_A));

    // No client certificate: the controller refuses the handshake; exit 3, one line.
    let (o, took) = ctl_env(
        args(&addr, &["--tls-mode", "tls", "--tls-ca-file", &ca, "rnics"]),
        vec![],
    )
    .await;
    let err = fails(&o, 3);
    assert!(
        err.starts_with(&format!(
            "rpingmeshctl: cannot reach controller at {addr}: "
        )),
        "{err}"
    );
    assert!(err.contains("client certificate"), "{err}");
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");

    // Plaintext against the TLS port: exit 3, one line.
    let (o, took) = ctl_env(args(&addr, &["rnics"]), vec![]).await;
    let err = fails(&o, 3);
    assert!(
        err.contains("cannot reach controller") && err.contains("running TLS?"),
        "{err}"
    );
    assert!(took < std::time::Duration::from_secs(6), "{took:?}");

    // A CA that did not sign the server's certificate: exit 3.
    let other = tempfile::tempdir().unwrap();
    make_pki(other.path());
    let other_ca = other.path().join("ca.pem").display().to_string();
    let o = ctl(args(
        &addr,
        &[
            "--tls-mode",
            "mtls",
            "--tls-ca-file",
            &other_ca,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "rnics",
        ],
    ))
    .await;
    let err = fails(&o, 3);
    assert!(err.contains("certificate"), "{err}");

    // A name the certificate does not carry: exit 3.
    let o = ctl(with(&["--tls-server-name", "wrong.example", "rnics"])).await;
    let err = fails(&o, 3);
    assert!(err.contains("certificate"), "{err}");
    srv.shutdown().await.unwrap();

    // tls (server authenticated only): the CA alone is enough.
    let srv = start(&ControllerConfig {
        tls_mode: "tls".into(),
        ..base
    })
    .await;
    let addr = srv.local_addr.to_string();
    let o = ctl(args(
        &addr,
        &["--tls-mode", "tls", "--tls-ca-file", &ca, "violations"],
    ))
    .await;
    stdout(&o);
    srv.shutdown().await.unwrap();
}
