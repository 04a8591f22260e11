//! ListFindings / WatchFindings over real gRPC against an in-process controller whose
//! localizer is driven with chosen blames (`ControllerState::step_findings`), so these
//! check the service, not the localization rules: limits and order, the kind filter, a
//! watcher that falls behind (DATA_LOSS, bounded), and a controller without analyzer.

mod common;

use std::time::Duration;

use common::SEC;
use rpingmesh_controller::localize::{Blame, ComponentKind, Symptom};
use rpingmesh_controller::service::FINDINGS_CHANNEL_CAPACITY;
use rpingmesh_controller::ControllerConfig;
use rpingmesh_proto::operator::{FindingEvidence, ListFindingsRequest, WatchFindingsRequest};
use tonic::Code;

fn config() -> ControllerConfig {
    ControllerConfig {
        listen_addr: "127.0.0.1:0".into(),
        database_uri: "sqlite::memory:".into(),
        metrics_enabled: false,
        analyzer_resolve_after_windows: 1,
        ..Default::default()
    }
}

fn blame(kind: ComponentKind, location: &str) -> Blame {
    Blame {
        kind,
        location: location.into(),
        symptom: Symptom::Down,
        confidence: 1.0,
        evidence: FindingEvidence {
            detail: format!("{location} is down"),
            ..Default::default()
        },
    }
}

/// One window's blames through the controller's own step (publish + store).
fn step(h: &common::Harness, window: u64, blames: Vec<Blame>) -> usize {
    let now = h.clock.load(std::sync::atomic::Ordering::Relaxed) + window * SEC;
    h.server
        .state
        .step_findings(|a, _| a.localizer_mut().apply(window * SEC, blames, now))
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_orders_limits_and_filters() {
    let h = common::harness(config()).await;
    step(
        &h,
        1,
        vec![
            blame(ComponentKind::Rnic, "h1/mlx5_0"),
            blame(ComponentKind::Link, "tor-a/uplink"),
            blame(ComponentKind::Host, "h2"),
            blame(ComponentKind::Rnic, "h3/mlx5_0"),
        ],
    );
    // h1's and the link's resolve in window 2, h2's in window 3.
    step(
        &h,
        2,
        vec![
            blame(ComponentKind::Host, "h2"),
            blame(ComponentKind::Rnic, "h3/mlx5_0"),
        ],
    );
    step(&h, 3, vec![blame(ComponentKind::Rnic, "h3/mlx5_0")]);
    let list = |limit: u32, kind: &str| {
        let mut op = h.op.clone();
        let req = ListFindingsRequest {
            resolved_limit: limit,
            kind: kind.into(),
        };
        async move {
            op.list_findings(req).await.map(|r| {
                r.into_inner()
                    .findings
                    .into_iter()
                    .map(|f| (f.location, f.open))
                    .collect::<Vec<_>>()
            })
        }
    };
    let all = list(0, "").await.unwrap();
    let loc = |s: &str, open: bool| (s.to_string(), open);
    assert_eq!(
        all,
        vec![
            loc("h3/mlx5_0", true),
            loc("h2", false),
            loc("tor-a/uplink", false),
            loc("h1/mlx5_0", false),
        ],
        "open, then the most recently resolved first (at one time: the larger id)"
    );
    assert_eq!(list(1, "").await.unwrap(), all[..2]);
    assert_eq!(
        list(0, "rnic").await.unwrap(),
        vec![loc("h3/mlx5_0", true), loc("h1/mlx5_0", false)]
    );
    assert_eq!(list(0, "tor").await.unwrap(), vec![]);
    let e = list(0, "RNIC").await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("known: rnic, host, tor, link"),
        "{e:?}"
    );
    h.server.shutdown().await.unwrap();
}

// One thread: while the step publishes, the watcher's forwarding task cannot run, so it
// falls behind by what was published beyond the channel's capacity, whatever the
// transport would have buffered.
#[tokio::test(flavor = "current_thread")]
async fn a_watcher_that_falls_behind_gets_data_loss_then_a_fresh_snapshot() {
    let h = common::harness(config()).await;
    step(&h, 1, vec![blame(ComponentKind::Tor, "tor-z")]);
    let mut op = h.op.clone();
    let mut w = op
        .watch_findings(WatchFindingsRequest { kind: "".into() })
        .await
        .unwrap()
        .into_inner();
    let first = w.message().await.unwrap().unwrap();
    assert_eq!(first.change, "snapshot");
    // More changes at once than the channel holds, while this watcher reads nothing.
    let n = FINDINGS_CHANNEL_CAPACITY + 500;
    let blames: Vec<Blame> = (0..n)
        .map(|i| blame(ComponentKind::Rnic, &format!("h{i}/mlx5_0")))
        .chain([blame(ComponentKind::Tor, "tor-z")])
        .collect();
    assert_eq!(step(&h, 2, blames), n + 1, "n opened, tor-z updated");
    let mut got = 0;
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(10), w.message()).await {
            Ok(Ok(Some(e))) => {
                assert_ne!(e.change, "snapshot");
                got += 1;
            }
            other => break other,
        }
    };
    match status {
        Ok(Err(s)) => {
            assert_eq!(s.code(), Code::DataLoss, "{s:?}");
            assert!(s.message().contains("call WatchFindings again"), "{s:?}");
        }
        other => panic!("expected DATA_LOSS after {got} events, got {other:?}"),
    }
    assert!(got < n, "cut off, not buffered: {got} of {n}");
    // Watching again: a fresh snapshot with every open finding (of the kind asked).
    let mut w = op
        .watch_findings(WatchFindingsRequest { kind: "".into() })
        .await
        .unwrap()
        .into_inner();
    for i in 0..=n {
        let e = w.message().await.unwrap().unwrap();
        assert_eq!(e.change, "snapshot", "event {i}");
        assert!(e.finding.unwrap().open);
    }
    let mut w = op
        .watch_findings(WatchFindingsRequest { kind: "tor".into() })
        .await
        .unwrap()
        .into_inner();
    let e = w.message().await.unwrap().unwrap();
    assert_eq!(
        (e.change.as_str(), e.finding.unwrap().location.as_str()),
        ("snapshot", "tor-z")
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(200), w.message())
            .await
            .is_err(),
        "one tor finding"
    );
    h.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_analyzer_there_are_no_findings() {
    let mut h = common::harness(ControllerConfig {
        analyzer_enabled: false,
        ..config()
    })
    .await;
    let r =
        h.op.list_findings(ListFindingsRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert!(r.findings.is_empty());
    let e =
        h.op.list_findings(ListFindingsRequest {
            resolved_limit: 0,
            kind: "switch".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let mut w =
        h.op.watch_findings(WatchFindingsRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), w.message())
            .await
            .is_err(),
        "an empty snapshot, and nothing ever changes"
    );
    // The stop ends the open watch instead of waiting for it.
    tokio::time::timeout(Duration::from_secs(5), h.server.shutdown())
        .await
        .expect("shutdown with an open watch")
        .unwrap();
    assert_eq!(w.message().await.unwrap_err().code(), Code::Unavailable);
}
