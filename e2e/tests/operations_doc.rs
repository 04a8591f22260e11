//! docs/operations.md's TLS blocks run as written. The mTLS example's OpenSSL commands
//! make the certificates, a controller in `tls_mode: mtls` takes an agent that shows its
//! certificate, refuses one that shows none, and refuses an agent that shows another
//! agent's certificate. The operator example's certificate (an OU role) and viewer token,
//! and the replica example's certificates, work with a controller configured as the
//! runbook says: its operator commands run as written, the replica's certificate may pass
//! on another agent's report, the viewer may not act.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rpingmesh_e2e::*;

/// The shell block after the `<!-- NAME -->` marker.
fn doc_block(name: &str) -> String {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .unwrap();
    let marker = format!("<!-- {name} -->");
    let after = doc
        .split(marker.as_str())
        .nth(1)
        .unwrap_or_else(|| panic!("docs/operations.md has no {marker} marker"));
    let body = after
        .split_once("```sh\n")
        .expect("a ```sh block after the marker")
        .1;
    body.split_once("\n```")
        .expect("the block ends")
        .0
        .to_string()
}

/// Runs block `name` with `sh -e` in `dir` (and `env`), failing with its stderr.
fn run_block(name: &str, dir: &Path, env: &[(&str, String)]) -> std::process::Output {
    let out = Command::new("sh")
        .args(["-e", "-c", &doc_block(name)])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the runbook's {name} block failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runbooks_mtls_example_makes_certificates_the_controller_and_agent_accept() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_block("mtls-example", d, &[]);
    let f = |n: &str| d.join(n).display().to_string();
    let ctl = spawn_controller(
        d,
        "controller",
        None,
        "127.0.0.1:0",
        &[
            "--metrics-enabled",
            "false",
            "--tls-mode",
            "mtls",
            "--tls-cert-file",
            &f("controller.crt"),
            "--tls-key-file",
            &f("controller.key"),
            "--tls-ca-file",
            &f("ca.crt"),
        ],
    )
    .unwrap();
    let addr = ctl.addr.to_string();
    let base = |id: &str, ip: [u8; 4]| {
        AgentArgs::new(id, "tor-t", &addr, std::net::Ipv4Addr::from(ip))
            .flag("--metrics-enabled", "false")
            .flag("--service-tracing-mode", "off")
            .flag("--hostping-enabled", "false")
            .flag("--tls-mode", "mtls")
            .flag("--tls-ca-file", f("ca.crt"))
            .flag("--tls-server-name", "controller.example")
    };
    let _good = spawn_agent(
        d,
        None,
        &base("gpu001", [127, 0, 8, 1])
            .flag("--tls-cert-file", f("agent.crt"))
            .flag("--tls-key-file", f("agent.key")),
    )
    .unwrap();
    // Same CA, no client certificate: the handshake fails (tls, not mtls, on its side).
    let bad = spawn_agent(
        d,
        None,
        &AgentArgs::new(
            "no-cert",
            "tor-t",
            &addr,
            std::net::Ipv4Addr::new(127, 0, 8, 2),
        )
        .flag("--metrics-enabled", "false")
        .flag("--service-tracing-mode", "off")
        .flag("--hostping-enabled", "false")
        .flag("--tls-mode", "tls")
        .flag("--tls-ca-file", f("ca.crt"))
        .flag("--tls-server-name", "controller.example"),
    )
    .unwrap();
    // gpu001's certificate on an agent that says it is gpu002.
    let impostor = spawn_agent(
        d,
        None,
        &base("gpu002", [127, 0, 8, 3])
            .flag("--tls-cert-file", f("agent.crt"))
            .flag("--tls-key-file", f("agent.key")),
    )
    .unwrap();
    let registered = wait_for(Duration::from_secs(20), Duration::from_millis(200), || {
        let s = ctl.proc.stderr();
        async move {
            (s.contains("agent registered") && s.contains("\"agent_id\":\"gpu001\"")).then_some(())
        }
    })
    .await;
    assert!(
        registered.is_some(),
        "the agent with a certificate never registered:\n{}",
        ctl.proc.stderr()
    );
    let refused = wait_for(Duration::from_secs(20), Duration::from_millis(200), || {
        let s = bad.stderr();
        async move {
            s.contains("cannot register with the controller")
                .then_some(())
        }
    })
    .await;
    assert!(
        refused.is_some(),
        "the agent without a certificate was not refused:\n{}",
        bad.stderr()
    );
    assert!(!ctl.proc.stderr().contains("\"agent_id\":\"no-cert\""));
    let denied = wait_for(Duration::from_secs(20), Duration::from_millis(200), || {
        let s = impostor.stderr();
        async move {
            (s.contains("cannot register with the controller")
                && s.contains("certificate names agent")
                && s.contains("request speaks for agent"))
            .then_some(())
        }
    })
    .await;
    assert!(
        denied.is_some(),
        "the agent with another agent's certificate was not refused:\n{}",
        impostor.stderr()
    );
    assert!(ctl
        .proc
        .stderr()
        .contains("refused: RegisterAgent: certificate names agent"));
}

/// The controller's `addr` field of its first log line carrying `message`.
fn logged_addr(stderr: &str, message: &str) -> Option<std::net::SocketAddr> {
    let line = stderr.lines().find(|l| l.contains(message))?;
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    v["fields"]["addr"].as_str()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runbooks_operator_and_replica_certificates_and_tokens_work_as_written() {
    use rpingmesh_e2e::pki::mtls_channel;
    use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
    use rpingmesh_proto::controller_agent::{
        AgentRegistrationRequest, PathSummary, PinglistType, ProbeAnalysisReport, RnicInfo,
    };

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for block in ["mtls-example", "operator-example", "replica-example"] {
        run_block(block, d, &[]);
    }
    // mtls_channel reads NAME.pem.
    for (from, to) in [
        ("ca.crt", "ca.pem"),
        ("agent.crt", "agent.pem"),
        ("ctl2.crt", "ctl2.pem"),
    ] {
        std::fs::copy(d.join(from), d.join(to)).unwrap();
    }
    let f = |n: &str| d.join(n).display().to_string();
    let ctl = spawn_controller(
        d,
        "controller",
        None,
        "127.0.0.1:0",
        &[
            "--metrics-enabled",
            "false",
            "--http-listen-addr",
            "127.0.0.1:0",
            "--tls-mode",
            "mtls",
            "--tls-cert-file",
            &f("controller.crt"),
            "--tls-key-file",
            &f("controller.key"),
            "--tls-ca-file",
            &f("ca.crt"),
            "--operator-tokens-file",
            &f("operator-tokens"),
            "--tls-operator-roles",
            "sre=operator,noc=viewer",
            "--tls-replica-identities",
            "ctl1.example,ctl2.example,ctl3.example",
        ],
    )
    .unwrap();
    let web = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let s = ctl.proc.stderr();
        async move { logged_addr(&s, "operator web page listening") }
    })
    .await
    .unwrap_or_else(|| panic!("no web page:\n{}", ctl.proc.stderr()));

    // gpu001 registers with its certificate; a replica's certificate passes on its report.
    let gid = rpingmesh_proto::gid::normalize_gid("fd00::1:1").unwrap();
    let mut agent = ControllerServiceClient::new(
        mtls_channel(ctl.addr, d, "agent", "127.0.0.1")
            .await
            .unwrap(),
    );
    agent
        .register_agent(AgentRegistrationRequest {
            agent_id: "gpu001".into(),
            hostname: "gpu001".into(),
            tor_id: "tor-1".into(),
            rnics: vec![RnicInfo {
                gid: gid.clone(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    let mut replica = ControllerServiceClient::new(
        mtls_channel(ctl.addr, d, "ctl2", "127.0.0.1")
            .await
            .unwrap(),
    );
    let ack = replica
        .report_probe_analysis(ProbeAnalysisReport {
            agent_id: "gpu001".into(),
            summaries: vec![PathSummary {
                source_gid: gid.clone(),
                source_tor_id: "tor-1".into(),
                target_gid: gid,
                target_tor_id: "tor-1".into(),
                window_start_unix_ns: 1_700_000_000_000_000_000,
                probe_total: 10,
                probe_success: 10,
                pinglist_type: PinglistType::TorMesh as i32,
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ack.accepted);

    // The viewer token may read, not act (exit 4).
    let ctl_bin = bin("rpingmeshctl");
    let viewer_acts = Command::new(&ctl_bin)
        .args(["--controller", &ctl.addr.to_string(), "--tls-mode", "tls"])
        .args([
            "--tls-ca-file",
            &f("ca.crt"),
            "--token-file",
            &f("grafana.token"),
        ])
        .args(["delete-agent", "gpu001"])
        .output()
        .unwrap();
    assert_eq!(
        viewer_acts.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&viewer_acts.stderr)
    );

    // The operator commands, as written.
    let path = format!(
        "{}:{}",
        ctl_bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = run_block(
        "operator-use",
        d,
        &[
            ("CONTROLLER", ctl.addr.to_string()),
            ("WEB", format!("https://{web}")),
            ("PATH", path),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("deleted agent gpu001") && stdout.contains("\"agents\":{"),
        "{stdout}"
    );
    // The trail takes the store's lines once a second.
    let audit = |c: &Path| {
        let o = Command::new(&ctl_bin)
            .args(["--controller", &ctl.addr.to_string(), "--tls-mode", "mtls"])
            .args([
                "--tls-ca-file",
                &f("ca.crt"),
                "--tls-cert-file",
                &f("alice.crt"),
            ])
            .args(["--tls-key-file", &f("alice.key"), "audit"])
            .current_dir(c)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let seen = wait_for(Duration::from_secs(10), Duration::from_millis(300), || {
        let out = audit(d);
        async move {
            out.lines()
                .any(|l| l.contains("alice") && l.contains("DeleteAgent") && l.contains(" ok"))
                .then_some(())
        }
    })
    .await;
    assert!(seen.is_some(), "{}", audit(d));
}
