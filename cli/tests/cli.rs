//! rpingmeshctl run as a process against a real controller on 127.0.0.1:0: output,
//! exit statuses, deadlines and --watch.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{
    PathSummary, PinglistType, ProbeAnalysisReport, ServiceFlow, ServiceFlowReport,
};

fn flow(qpn: u32, remote: &str) -> ServiceFlow {
    ServiceFlow {
        local_gid: GID_A.into(),
        local_qpn: qpn,
        remote_gid: remote.into(),
        remote_qpn: 900,
        flow_label: 0x12345,
        traffic_class: 96,
        service_level: 3,
        comm: "nccl-test".into(),
        service: "allreduce".into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_lists_service_paths_of_a_real_controller() {
    let server = start(&plain_config()).await;
    let addr = server.local_addr.to_string();
    let mut c = ControllerServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    register_a_and_b(&mut c).await;
    c.report_service_flows(ServiceFlowReport {
        agent_id: "agent-a".into(),
        full_sync: true,
        upserts: vec![flow(100, GID_B), flow(101, GID_B), flow(102, GID_X)],
        removals: vec![],
    })
    .await
    .unwrap();
    c.report_probe_analysis(ProbeAnalysisReport {
        agent_id: "agent-a".into(),
        summaries: vec![PathSummary {
            source_gid: GID_A.into(),
            source_tor_id: "tor-1".into(),
            target_gid: GID_B.into(),
            target_tor_id: "tor-2".into(),
            window_start_unix_ns: 1_700_000_000_000_000_000,
            probe_total: 200,
            probe_success: 195,
            probe_failed: 5,
            network_rtt_p50_ns: 4_200,
            network_rtt_p99_ns: 12_500,
            pinglist_type: PinglistType::Service as i32,
            service: "allreduce".into(),
            ..Default::default()
        }],
        ..Default::default()
    })
    .await
    .unwrap();

    // Table: header plus one row per path, aligned, RTT in us and loss in %.
    let out = stdout(&ctl(args(&addr, &["service-paths"])).await);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("SERVICE") && lines[0].contains("RTT_P99_US"),
        "{out}"
    );
    let row_b = lines.iter().find(|l| l.contains(GID_B)).expect("path to B");
    for want in [
        "allreduce",
        "tor-1",
        "tor-2",
        GID_A,
        "yes",
        "0x12345",
        "200",
        "2.50",
        "4.2",
        "12.5",
        "100->900 0/nccl-test, 101->900 0/nccl-test",
    ] {
        assert!(row_b.contains(want), "{want} missing in {row_b:?}");
    }
    let col = lines[0].find("DST_GID").unwrap();
    assert_eq!(
        &row_b[col..col + GID_B.len()],
        GID_B,
        "columns aligned under their header"
    );
    let row_x = lines
        .iter()
        .find(|l| l.contains(GID_X))
        .expect("unmonitored path");
    assert!(row_x.contains(" no "), "{row_x}");

    // JSON rows, filtered by ToR pair.
    let out = stdout(
        &ctl(args(
            &addr,
            &["service-paths", "--json", "--tor-pair", "tor-1,tor-2"],
        ))
        .await,
    );
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0]["target_gid"], GID_B);
    assert_eq!(rows[0]["flows"], 2);
    assert_eq!(rows[0]["qps"][1]["local_qpn"], 101);
    assert_eq!(rows[0]["qps"][1]["remote_qpn"], 900);
    assert_eq!(rows[0]["qps"][1]["comm"], "nccl-test");
    assert_eq!(rows[0]["monitored"], true);
    assert_eq!(rows[0]["flow_label"], 0x12345);
    assert_eq!(rows[0]["latest"]["probe_failed"], 5);
    assert_eq!(rows[0]["latest"]["loss_ratio"], 0.025);
    let out = stdout(
        &ctl(args(
            &addr,
            &["service-paths", "--json", "--service", "nope"],
        ))
        .await,
    );
    assert!(out.is_empty(), "{out}");

    // The other subcommands answer too.
    let out = stdout(&ctl(args(&addr, &["rnics", "--tor", "tor-2"])).await);
    assert!(out.contains(GID_B) && !out.contains(GID_A), "{out}");
    let out = stdout(&ctl(args(&addr, &["paths", "--gid", "fd00::b:1"])).await);
    assert!(out.contains("service") && out.contains("2.50"), "{out}");
    let out = stdout(&ctl(args(&addr, &["violations", "--json", "--limit", "5"])).await);
    let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(v["kind"], "loss");
    assert_eq!(v["summary"]["service"], "allreduce");
    let out = stdout(&ctl(args(&addr, &["tor-pairs"])).await);
    assert_eq!(
        out.lines().count(),
        1,
        "service windows are not ToR-pair rows: {out}"
    );

    // A bad filter is the server's one-line InvalidArgument, exit 1.
    let o = ctl(args(&addr, &["service-paths", "--gid", "zzz"])).await;
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("InvalidArgument") && err.contains("zzz"),
        "{err}"
    );

    // Address from the environment.
    let (o, _) = ctl_env(
        vec!["service-paths".into(), "--json".into()],
        vec![("RPINGMESH_CONTROLLER_ADDR", addr.clone())],
    )
    .await;
    assert_eq!(stdout(&o).lines().count(), 2);

    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_controller_is_one_line_and_exit_3() {
    let addr = dead_addr();
    for cmd in [
        &["service-paths"][..],
        &["rnics", "--json"],
        // --watch: an unreachable controller at the first query ends the watch.
        &["paths", "--watch", "--interval", "0.2", "--count", "5"],
    ] {
        let (o, took) = ctl_env(args(&addr, cmd), vec![]).await;
        let err = fails(&o, 3);
        assert!(
            err.starts_with(&format!(
                "rpingmeshctl: cannot reach controller at {addr}: "
            )) && err.contains("refused"),
            "{err}"
        );
        assert!(took < Duration::from_secs(5), "{cmd:?} took {took:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_controller_is_exit_3_within_the_timeout() {
    // Accepts TCP (the kernel does) but never speaks HTTP/2.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (o, took) = ctl_env(args(&addr, &["--timeout", "1", "paths"]), vec![]).await;
    let err = fails(&o, 3);
    assert!(
        err.contains("cannot reach controller") && err.contains("within 1s"),
        "{err}"
    );
    assert!(took < Duration::from_secs(4), "took {took:?}");
    drop(l);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_flags_and_tls_input_are_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("x.pem");
    std::fs::write(
        &pem,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let pem = pem.display().to_string();
    let addr = dead_addr();
    // mtls without a key: one line naming the key, before any connection attempt.
    let err = fails(
        &ctl(args(
            &addr,
            &[
                "--tls-mode",
                "mtls",
                "--tls-ca-file",
                &pem,
                "--tls-cert-file",
                &pem,
                "rnics",
            ],
        ))
        .await,
        2,
    );
    assert!(
        err.contains("tls_key_file is required when tls_mode is mtls"),
        "{err}"
    );
    // tls without a CA, as the agent: required.
    let err = fails(&ctl(args(&addr, &["--tls-mode", "tls", "paths"])).await, 2);
    assert!(err.contains("tls_ca_file is required"), "{err}");
    // A CA file that does not exist.
    let err = fails(
        &ctl(args(
            &addr,
            &[
                "--tls-mode",
                "tls",
                "--tls-ca-file",
                "/nonexistent/ca.pem",
                "paths",
            ],
        ))
        .await,
        2,
    );
    assert!(err.contains("/nonexistent/ca.pem does not exist"), "{err}");
    // A CA file that is not PEM.
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let err = fails(
        &ctl(args(
            &addr,
            &[
                "--tls-mode",
                "tls",
                "--tls-ca-file",
                junk.to_str().unwrap(),
                "paths",
            ],
        ))
        .await,
        2,
    );
    assert!(err.contains("tls_ca_file") && err.contains("PEM"), "{err}");
    // Mode from the environment, checked like the flag.
    let (o, _) = ctl_env(
        args(&addr, &["rnics"]),
        vec![("RPINGMESH_TLS_MODE", "mtls".into())],
    )
    .await;
    assert!(fails(&o, 2).contains("tls_ca_file is required"));
    // A missing --config file.
    let err = fails(
        &ctl(args(
            &addr,
            &["--config", "/nonexistent/agent.yaml", "rnics"],
        ))
        .await,
        2,
    );
    assert!(err.contains("/nonexistent/agent.yaml"), "{err}");
    // clap's usage errors: 2 as well.
    for bad in [
        &["--tls-mode", "ssl", "rnics"][..],
        &["paths", "--count", "3"],
        &["rnics", "--watch"],
        &["paths", "--watch", "--interval", "0"],
        &["bogus"],
    ] {
        let o = ctl(args(&addr, bad)).await;
        assert_eq!(o.status.code(), Some(2), "{bad:?}");
    }
    let o = ctl(vec!["--help".into()]).await;
    let help = stdout(&o);
    assert!(
        help.contains("Exit status") && help.contains("3  the controller could not be reached")
    );
}

async fn seeded_controller() -> rpingmesh_controller::ServerHandle {
    let server = start(&plain_config()).await;
    let mut c = ControllerServiceClient::connect(format!("http://{}", server.local_addr))
        .await
        .unwrap();
    register_a_and_b(&mut c).await;
    c.report_service_flows(ServiceFlowReport {
        agent_id: "agent-a".into(),
        full_sync: true,
        upserts: vec![flow(100, GID_B)],
        removals: vec![],
    })
    .await
    .unwrap();
    server
}

/// Splits non-tty watch output at its separator lines.
fn refreshes(out: &str) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for l in out.lines() {
        if l.starts_with("--- ") {
            assert!(l.ends_with(" ---") && l.contains(" refresh "), "{l}");
            v.push(String::new());
        } else {
            let cur = v.last_mut().expect("output starts with a separator");
            cur.push_str(l);
            cur.push('\n');
        }
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_count_refreshes() {
    let server = seeded_controller().await;
    let addr = server.local_addr.to_string();
    let (o, took) = ctl_env(
        args(
            &addr,
            &["paths", "--watch", "--count", "3", "--interval", "1"],
        ),
        vec![],
    )
    .await;
    let out = stdout(&o);
    assert!(
        !out.contains('\x1b'),
        "no ANSI when stdout is not a terminal"
    );
    let r = refreshes(&out);
    assert_eq!(r.len(), 3, "{out}");
    for (i, body) in r.iter().enumerate() {
        assert!(body.starts_with("SRC_TOR"), "refresh {i}: {body}");
    }
    assert!(out.lines().next().unwrap().ends_with("refresh 1 ---"));
    assert!(took >= Duration::from_secs(2), "two intervals: {took:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");

    // JSON rows between the separators.
    let (o, _) = ctl_env(
        args(
            &addr,
            &[
                "service-paths",
                "--json",
                "--watch",
                "--count",
                "2",
                "--interval",
                "0.2",
            ],
        ),
        vec![],
    )
    .await;
    let out = stdout(&o);
    let r = refreshes(&out);
    assert_eq!(r.len(), 2, "{out}");
    for body in &r {
        let rows: Vec<serde_json::Value> = body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 1, "{body}");
        assert_eq!(rows[0]["target_gid"], GID_B);
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_keeps_going_when_the_controller_goes_away() {
    let server = seeded_controller().await;
    let addr = server.local_addr.to_string();
    let mut child = ctl_cmd(
        &args(
            &addr,
            &[
                "service-paths",
                "--watch",
                "--count",
                "3",
                "--interval",
                "1",
            ],
        ),
        &[],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // Wait for the first refresh (separator + table header + one row), then stop the controller.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (first, out) = tokio::task::spawn_blocking(move || {
        let mut first = String::new();
        for _ in 0..3 {
            out.read_line(&mut first).unwrap();
        }
        (first, out)
    })
    .await
    .unwrap();
    assert!(first.contains(GID_B), "{first}");
    server.shutdown().await.unwrap();
    let (rest, err, status) = tokio::task::spawn_blocking(move || {
        let mut out = out;
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (rest, err, child.wait().unwrap())
    })
    .await
    .unwrap();
    assert!(status.success(), "{status:?} {err}");
    let all = format!("{first}{rest}");
    assert_eq!(refreshes(&all).len(), 3, "{all}");
    let errs: Vec<&str> = err.lines().collect();
    assert_eq!(errs.len(), 2, "one line per failed refresh: {err}");
    assert!(
        errs[0].starts_with("rpingmeshctl: refresh 2 at ") && errs[0].contains("cannot reach"),
        "{err}"
    );
    assert!(errs[1].starts_with("rpingmeshctl: refresh 3 at "), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_stops_on_ctrl_c() {
    let server = seeded_controller().await;
    let addr = server.local_addr.to_string();
    let mut child = ctl_cmd(&args(&addr, &["paths", "--watch", "--interval", "30"]), &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let (out, status, took) = tokio::task::spawn_blocking(move || {
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        out.read_line(&mut first).unwrap();
        let t0 = std::time::Instant::now();
        let kill = std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap();
        assert!(kill.success());
        let status = child.wait().unwrap();
        (first, status, t0.elapsed())
    })
    .await
    .unwrap();
    assert!(
        out.contains("refresh 1") && out.contains("SRC_TOR"),
        "{out}"
    );
    assert_eq!(status.code(), Some(0), "Ctrl-C ends a watch normally");
    assert!(took < Duration::from_secs(5), "{took:?}");
    server.shutdown().await.unwrap();
}
