//! ReportHostHealth / ListHosts / GetHost over real gRPC: a report is kept per host (the
//! newest replaces the one before), bad reports get one INVALID_ARGUMENT naming what is
//! wrong and change nothing, an unknown host is NOT_FOUND.

mod common;

use rpingmesh_controller::ControllerConfig;
use rpingmesh_proto::controller_agent::{HostFinding, HostHealthReport};
use rpingmesh_proto::operator::{GetHostRequest, ListHostsRequest};
use tonic::Code;

fn report(host: &str, findings: usize) -> HostHealthReport {
    HostHealthReport {
        agent_id: format!("agent-{host}"),
        hostname: host.into(),
        checked_unix_ns: 42,
        tree: format!("host {host}\nsocket 0\n"),
        mode: "idle".into(),
        findings: (0..findings)
            .map(|i| HostFinding {
                kind: "pcie_downgrade".into(),
                location: format!("0000:3b:00.{i}"),
                detail: "x8 of x16".into(),
            })
            .collect(),
        report_json: "{\"ok\":true}".into(),
    }
}

#[tokio::test]
async fn host_reports_are_kept_replaced_and_checked() {
    let mut h = common::harness(ControllerConfig {
        listen_addr: "127.0.0.1:0".into(),
        database_uri: "sqlite::memory:".into(),
        metrics_enabled: false,
        ..Default::default()
    })
    .await;
    h.ctl.report_host_health(report("h1", 2)).await.unwrap();
    h.ctl.report_host_health(report("h2", 0)).await.unwrap();
    let all =
        h.op.list_hosts(ListHostsRequest {
            problems_only: false,
        })
        .await
        .unwrap()
        .into_inner()
        .hosts;
    assert_eq!(
        all.iter().map(|x| x.hostname.as_str()).collect::<Vec<_>>(),
        vec!["h1", "h2"]
    );
    assert!(
        all.iter().all(|x| x.report_json.is_empty()),
        "the listing leaves the JSON out"
    );
    let bad =
        h.op.list_hosts(ListHostsRequest {
            problems_only: true,
        })
        .await
        .unwrap()
        .into_inner()
        .hosts;
    assert_eq!(bad.len(), 1);
    let one =
        h.op.get_host(GetHostRequest {
            hostname: "h1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            one.findings.len(),
            one.report_json.as_str(),
            one.agent_id.as_str()
        ),
        (2, "{\"ok\":true}", "agent-h1")
    );
    assert!(one.received_unix_ns > 0);
    // The newest report replaces the one before.
    h.ctl.report_host_health(report("h1", 0)).await.unwrap();
    let one =
        h.op.get_host(GetHostRequest {
            hostname: "h1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(one.findings.is_empty());

    let e =
        h.op.get_host(GetHostRequest {
            hostname: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    let cases: Vec<(HostHealthReport, &str)> = vec![
        (
            HostHealthReport {
                agent_id: String::new(),
                ..report("h3", 0)
            },
            "agent_id",
        ),
        (
            HostHealthReport {
                hostname: " ".into(),
                ..report("h3", 0)
            },
            "hostname",
        ),
        (
            HostHealthReport {
                mode: "sleepy".into(),
                ..report("h3", 0)
            },
            "mode",
        ),
        (
            HostHealthReport {
                tree: "x".repeat(300 * 1024),
                ..report("h3", 0)
            },
            "tree",
        ),
        (report("h3", 2000), "findings"),
        (
            HostHealthReport {
                findings: vec![HostFinding {
                    kind: String::new(),
                    ..Default::default()
                }],
                ..report("h3", 0)
            },
            "no kind",
        ),
    ];
    for (r, what) in cases {
        let e = h.ctl.report_host_health(r).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e}");
        assert!(e.message().contains(what), "{what}: {}", e.message());
    }
    let all =
        h.op.list_hosts(ListHostsRequest {
            problems_only: false,
        })
        .await
        .unwrap()
        .into_inner()
        .hosts;
    assert_eq!(all.len(), 2, "bad reports change nothing");
}
