//! `rpingmeshctl findings` run as a process against a controller on 127.0.0.1:0 with its
//! registry (and findings) in a SQLite file. The controller's localizer is driven with
//! chosen blames through its own step (`ControllerState::step_findings`: publish and
//! store), so these check the CLI, not the localization rules.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use rpingmesh_controller::localize::{Blame, ComponentKind, Symptom};
use rpingmesh_controller::ControllerConfig;
use rpingmesh_controller::ServerHandle;
use rpingmesh_proto::operator::FindingEvidence;

const SEC: u64 = 1_000_000_000;

fn blame(kind: ComponentKind, location: &str, detail: &str) -> Blame {
    Blame {
        kind,
        location: location.into(),
        symptom: Symptom::Down,
        confidence: 0.9,
        evidence: FindingEvidence {
            windows: 1,
            paths_total: 10,
            probe_total: 600,
            probe_failed: 600,
            detail: detail.into(),
            ..Default::default()
        },
    }
}

fn step(server: &ServerHandle, window: u64, blames: Vec<Blame>) {
    let now = server.state.now_ns();
    server
        .state
        .step_findings(|a, _| a.localizer_mut().apply(window * SEC, blames, now));
}

/// A controller on a file, with an open RNIC finding (id 2) and a resolved link one (id 1).
async fn controller(dir: &std::path::Path) -> ServerHandle {
    let cfg = ControllerConfig {
        database_uri: format!("sqlite:{}", dir.join("c.db").display()),
        analyzer_resolve_after_windows: 1,
        ..plain_config()
    };
    let server = start(&cfg).await;
    step(
        &server,
        1,
        vec![blame(ComponentKind::Link, "tor-a/uplink", "uplink loss")],
    );
    step(
        &server,
        2,
        vec![blame(
            ComponentKind::Rnic,
            "host-a/mlx5_0",
            "loss 100% to its peers, 100% from them",
        )],
    );
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn findings_table_json_and_bad_kind() {
    let dir = tempfile::tempdir().unwrap();
    let server = controller(dir.path()).await;
    let addr = server.local_addr.to_string();

    let out = stdout(&ctl(args(&addr, &["findings"])).await);
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        [
            "ID",
            "KIND",
            "LOCATION",
            "SYMPTOM",
            "SEVERITY",
            "CONF",
            "OPENED",
            "LAST_SEEN",
            "RESOLVED",
            "IMPACT",
            "DETAIL"
        ],
        "{out}"
    );
    assert_eq!(rows.len(), 3, "{out}");
    assert_eq!(
        rows[1][..6],
        ["2", "rnic", "host-a/mlx5_0", "down", "down", "0.90"],
        "{out}"
    );
    assert_eq!(rows[1][8], "-", "open: no resolution time");
    assert_eq!(rows[1][9], "-", "no service paths: no impact");
    assert_eq!(
        rows[1][10..].join(" "),
        "loss 100% to its peers, 100% from them"
    );
    assert_eq!(rows[2][..3], ["1", "link", "tor-a/uplink"], "{out}");
    assert!(rows[2][8].ends_with('Z'), "resolved: {out}");

    let out = stdout(
        &ctl(args(
            &addr,
            &["findings", "--resolved-limit", "0", "--kind", "rnic"],
        ))
        .await,
    );
    assert_eq!(out.lines().count(), 2, "{out}");

    let out = stdout(&ctl(args(&addr, &["--json", "findings"])).await);
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["id"], 2);
    assert_eq!(rows[0]["open"], true);
    assert_eq!(rows[0]["evidence"]["probe_failed"], 600);
    assert_eq!(rows[1]["kind"], "link");
    assert!(rows[1]["resolved_unix_ns"].as_u64().unwrap() > 0);

    // The controller checks the kind: its error status is exit 1, one line.
    for extra in [&[][..], &["--watch"]] {
        let mut a = vec!["findings", "--kind", "switch"];
        a.extend(extra);
        let o = ctl(args(&addr, &a)).await;
        let err = fails(&o, 1);
        assert!(
            err.contains("InvalidArgument") && err.contains("known: rnic, host, tor, link"),
            "{err}"
        );
    }
    let o = ctl(args(&addr, &["findings", "--count", "1"])).await;
    assert_eq!(o.status.code(), Some(2), "--count needs --watch");
    server.shutdown().await.unwrap();

    // Findings outlive the controller: a new one on the same file lists the same.
    let again = start(&ControllerConfig {
        database_uri: format!("sqlite:{}", dir.path().join("c.db").display()),
        ..plain_config()
    })
    .await;
    let out2 = stdout(&ctl(args(&again.local_addr.to_string(), &["--json", "findings"])).await);
    assert_eq!(out2, out, "same findings after a restart");
    again.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn findings_watch_prints_the_snapshot_then_the_changes() {
    let dir = tempfile::tempdir().unwrap();
    let server = controller(dir.path()).await;
    let addr = server.local_addr.to_string();

    let (o, took) = ctl_env(
        args(&addr, &["findings", "--watch", "--count", "1"]),
        vec![],
    )
    .await;
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.starts_with(
            "snapshot id=2 kind=rnic location=host-a/mlx5_0 symptom=down severity=down confidence=0.90 opened="
        ) && out.contains(" resolved=- ")
            && out
                .trim_end()
                .ends_with("detail=\"loss 100% to its peers, 100% from them\""),
        "{out}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");

    // Snapshot (open, then resolved), then live changes, JSON; --count ends it.
    let mut child = ctl_cmd(
        &args(&addr, &["--json", "findings", "--watch", "--count", "4"]),
        &[],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let read = move |out: &mut BufReader<std::process::ChildStdout>| {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        serde_json::from_str::<serde_json::Value>(&l).unwrap_or_else(|e| panic!("{l:?}: {e}"))
    };
    let (mut out, snap) = tokio::task::spawn_blocking(move || {
        let a = read(&mut out);
        let b = read(&mut out);
        (out, (a, b))
    })
    .await
    .unwrap();
    assert_eq!(
        (&snap.0["change"], &snap.0["finding"]["id"]),
        (&"snapshot".into(), &2.into())
    );
    assert_eq!(
        (&snap.1["change"], &snap.1["finding"]["id"]),
        (&"snapshot".into(), &1.into())
    );
    // The watcher is subscribed (it printed its snapshot): the host breaks, the RNIC heals.
    step(
        &server,
        3,
        vec![blame(ComponentKind::Host, "host-b", "stalled")],
    );
    let (live, status) = tokio::task::spawn_blocking(move || {
        let a = read(&mut out);
        let b = read(&mut out);
        (vec![a, b], child.wait().unwrap())
    })
    .await
    .unwrap();
    let mut seen: Vec<(String, u64)> = live
        .iter()
        .map(|v| {
            (
                v["change"].as_str().unwrap().to_string(),
                v["finding"]["id"].as_u64().unwrap(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(seen, vec![("opened".into(), 3), ("resolved".into(), 2)]);
    assert_eq!(status.code(), Some(0), "--count 4 reached");

    // The controller going away ends a watch with exit 3, one line.
    let child = ctl_cmd(&args(&addr, &["findings", "--watch"]), &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.shutdown().await.unwrap();
    let o = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("shutting down"), "{err}");
}
