//! docs/operations.md's mTLS example runs as written: its OpenSSL commands make the
//! certificates, a controller in `tls_mode: mtls` takes an agent that shows its
//! certificate, refuses one that shows none, and refuses an agent that shows another
//! agent's certificate.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rpingmesh_e2e::*;

/// The shell block after the `<!-- mtls-example -->` marker.
fn mtls_example() -> String {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
    )
    .unwrap();
    let after = doc
        .split("<!-- mtls-example -->")
        .nth(1)
        .expect("docs/operations.md has no mtls-example marker");
    let body = after
        .split_once("```sh\n")
        .expect("a ```sh block after the marker")
        .1;
    body.split_once("\n```")
        .expect("the block ends")
        .0
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runbooks_mtls_example_makes_certificates_the_controller_and_agent_accept() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = Command::new("sh")
        .args(["-e", "-c", &mtls_example()])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the example failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
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
