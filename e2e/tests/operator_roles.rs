//! Operator roles on a real controller process under mTLS: bearer tokens from a hashed
//! token file and client certificates with an OU role, on the gRPC operator API (through
//! rpingmeshctl and its exit codes), the web page's JSON API (over HTTPS with the
//! controller's certificate) and /metrics (HTTP statuses);
//! the token file read again on SIGHUP; each action and refusal in the audit log.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use rpingmesh_e2e::pki::{https_get, make_pki, mtls_channel, CertSpec};
use rpingmesh_e2e::*;
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{AgentRegistrationRequest, RnicInfo};

fn sha256(token: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &format!("printf %s '{token}' | sha256sum")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// The `addr` field of the first log line carrying `message`.
fn logged_addr(stderr: &str, message: &str) -> Option<SocketAddr> {
    let line = stderr.lines().find(|l| l.contains(message))?;
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    v["fields"]["addr"].as_str()?.parse().ok()
}

/// rpingmeshctl over mTLS with certificate `cert`, and `--token-file` when given.
fn ctl(d: &Path, addr: SocketAddr, cert: &str, token: Option<&str>, rest: &[&str]) -> Output {
    let f = |n: &str| d.join(n).display().to_string();
    let mut c = Command::new(bin("rpingmeshctl"));
    c.args(["--controller", &addr.to_string(), "--tls-mode", "mtls"])
        .args([
            "--tls-ca-file",
            &f("ca.pem"),
            "--tls-server-name",
            "127.0.0.1",
        ])
        .args(["--tls-cert-file", &f(&format!("{cert}.pem"))])
        .args(["--tls-key-file", &f(&format!("{cert}.key"))]);
    if let Some(t) = token {
        let path = d.join(format!("token-{t}"));
        std::fs::write(&path, format!("{t}\n")).unwrap();
        c.args(["--token-file", &path.display().to_string()]);
    }
    c.args(rest).output().unwrap()
}

/// (certificate, token, rpingmeshctl arguments, exit code, what stderr says).
type Case<'a> = (&'a str, Option<&'a str>, Vec<&'a str>, i32, &'a str);

fn code_and_err(o: &Output) -> (i32, String) {
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).trim().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_read_operators_act_and_nobody_else_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let spec = |name, subject, extensions| CertSpec {
        name,
        subject,
        extensions,
    };
    make_pki(
        d,
        &[
            spec("server", "/CN=controller", "subjectAltName=IP:127.0.0.1"),
            spec("gpu1", "/CN=gpu1", "subjectAltName=DNS:gpu1"),
            spec("alice", "/OU=sre/CN=alice", "basicConstraints=CA:FALSE"),
            spec("bob", "/OU=noc/CN=bob", "basicConstraints=CA:FALSE"),
            spec("eve", "/CN=eve", "basicConstraints=CA:FALSE"),
        ],
    )
    .unwrap();
    // A certificate from another CA.
    let other = d.join("other");
    std::fs::create_dir(&other).unwrap();
    make_pki(
        &other,
        &[spec(
            "mallory",
            "/OU=sre/CN=mallory",
            "basicConstraints=CA:FALSE",
        )],
    )
    .unwrap();
    for ext in ["pem", "key"] {
        std::fs::copy(
            other.join(format!("mallory.{ext}")),
            d.join(format!("mallory.{ext}")),
        )
        .unwrap();
    }
    let tokens = d.join("tokens");
    std::fs::write(
        &tokens,
        format!(
            "# role hash name\nviewer {} grafana\noperator {} ops\n",
            sha256("v-token"),
            sha256("o-token")
        ),
    )
    .unwrap();
    let f = |n: &str| d.join(n).display().to_string();
    let ctl_proc = spawn_controller(
        d,
        "controller",
        None,
        "127.0.0.1:0",
        &[
            "--tls-mode",
            "mtls",
            "--tls-cert-file",
            &f("server.pem"),
            "--tls-key-file",
            &f("server.key"),
            "--tls-ca-file",
            &f("ca.pem"),
            "--tls-operator-roles",
            "sre=operator,noc=viewer",
            "--operator-tokens-file",
            &f("tokens"),
            "--audit-log-file",
            &f("audit.jsonl"),
            "--http-listen-addr",
            "127.0.0.1:0",
            "--metrics-exporter",
            "prometheus",
            "--prometheus-listen-addr",
            "127.0.0.1:0",
        ],
    )
    .unwrap();
    let addr = ctl_proc.addr;
    let stderr = ctl_proc.proc.stderr();
    let web = logged_addr(&stderr, "operator web page listening").expect("web address");
    let metrics = wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        let s = ctl_proc.proc.stderr();
        async move { logged_addr(&s, "Prometheus /metrics listening") }
    })
    .await
    .expect("metrics address");

    let mut agent =
        ControllerServiceClient::new(mtls_channel(addr, d, "gpu1", "127.0.0.1").await.unwrap());
    agent
        .register_agent(AgentRegistrationRequest {
            agent_id: "gpu1".into(),
            hostname: "gpu1".into(),
            tor_id: "tor-1".into(),
            rnics: vec![RnicInfo {
                gid: "fd00::1".into(),
                device_name: "mlx5_0".into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap();

    // gRPC through rpingmeshctl: 0 ok, 4 refused, 3 unreachable (TLS refused).
    let cases: Vec<Case> = vec![
        ("gpu1", None, vec!["rnics"], 4, "Unauthenticated: OperatorService: the client certificate (gpu1) has no role"),
        ("gpu1", Some("wrong"), vec!["rnics"], 4, "Unauthenticated: OperatorService: the bearer token is not in operator_tokens_file"),
        ("gpu1", Some("v-token"), vec!["rnics"], 0, ""),
        ("gpu1", Some("v-token"), vec!["delete-agent", "gpu1"], 4, "PermissionDenied: DeleteAgent: viewer \"grafana\" may not do this (role operator needed)"),
        ("bob", None, vec!["rnics"], 0, ""),
        ("bob", None, vec!["delete-agent", "gpu1"], 4, "PermissionDenied: DeleteAgent: viewer \"bob\""),
        ("eve", None, vec!["rnics"], 4, "Unauthenticated"),
        ("mallory", None, vec!["rnics"], 3, ""),
        ("gpu1", Some("o-token"), vec!["delete-agent", "gpu1", "--reason", "host retired"], 0, ""),
        ("alice", None, vec!["delete-agent", "gpu1"], 1, "NotFound: DeleteAgent: agent \"gpu1\" is not registered"),
    ];
    for (cert, token, args, code, err) in &cases {
        let o = ctl(d, addr, cert, *token, args);
        let (got, stderr) = code_and_err(&o);
        assert_eq!(got, *code, "{cert} {token:?} {args:?}: {stderr}");
        assert!(stderr.contains(err), "{cert} {token:?} {args:?}: {stderr}");
    }
    let listed = ctl(d, addr, "bob", None, &["rnics"]);
    assert!(
        !String::from_utf8_lossy(&listed.stdout).contains("gpu1"),
        "deleted"
    );

    // The page's JSON API (HTTPS under tls_mode mtls) and /metrics: 401 without a known
    // token, 200 with one.
    let bearer = |t: Option<&str>| t.map(|t| format!("Bearer {t}"));
    let get = |at: SocketAddr, path: &str, token: Option<&str>| {
        let h = bearer(token);
        let headers: Vec<(&str, &str)> = h.iter().map(|v| ("Authorization", v.as_str())).collect();
        let (status, _, body) = http_get_with(at, path, "*/*", &headers).unwrap();
        (status, body)
    };
    let page = |path: &'static str, token: Option<&'static str>| async move {
        let h = bearer(token);
        let headers: Vec<(&str, &str)> = h.iter().map(|v| ("Authorization", v.as_str())).collect();
        https_get(web, d, "127.0.0.1", path, &headers)
            .await
            .unwrap()
    };
    assert_eq!(
        page("/", None).await.0,
        200,
        "the page itself carries no data"
    );
    let (status, body) = page("/api/overview", None).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("no credential"), "{body}");
    assert_eq!(page("/api/overview", Some("wrong")).await.0, 401);
    assert_eq!(page("/api/overview", Some("v-token")).await.0, 200);
    assert!(
        http_get(web, "/", "*/*").map_or(true, |(s, _, _)| s != 200),
        "plain HTTP is not served"
    );
    let (status, body) = get(metrics, "/metrics", None);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("no credential"), "{body}");
    assert_eq!(get(metrics, "/metrics", Some("wrong")).0, 401);
    let (status, scrape) = get(metrics, "/metrics", Some("v-token"));
    assert_eq!(status, 200);
    assert!(
        scrape.contains("rpingmesh_controller_auth_denied_total{"),
        "{scrape}"
    );

    // SIGHUP reads the token file again: the old viewer token goes, a new one comes.
    std::fs::write(&tokens, format!("viewer {} grafana2\n", sha256("v2-token"))).unwrap();
    let pid = ctl_proc.proc.pid().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    let reloaded = wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        let s = ctl_proc.proc.stderr();
        async move { s.contains("operator tokens reloaded").then_some(()) }
    })
    .await;
    assert!(reloaded.is_some(), "{}", ctl_proc.proc.stderr());
    assert_eq!(page("/api/overview", Some("v-token")).await.0, 401);
    assert_eq!(page("/api/overview", Some("v2-token")).await.0, 200);

    // The audit log: the action, who did it and why; the refused tries.
    let audit = std::fs::read_to_string(d.join("audit.jsonl")).unwrap();
    let deletes: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["rpc"] == "DeleteAgent")
        .collect();
    let summary: Vec<(String, String, bool)> = deletes
        .iter()
        .map(|e| {
            (
                e["who"].as_str().unwrap().to_string(),
                e["role"].as_str().unwrap().to_string(),
                e["result"].as_str().unwrap().starts_with("ok"),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("grafana".into(), "viewer".into(), false),
            ("bob".into(), "viewer".into(), false),
            ("ops".into(), "operator".into(), true),
        ]
    );
    assert!(deletes[2]["result"]
        .as_str()
        .unwrap()
        .contains("host retired"));
}
