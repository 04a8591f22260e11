//! An agent without CAP_BPF/CAP_PERFMON (root with those capabilities, and CAP_SYS_ADMIN,
//! removed from its bounding set by `setpriv`) says in exactly one line why service tracing
//! is off, and keeps probing: its paths reach the controller with successful probes.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use rpingmesh_e2e::*;

const UNPRIVILEGED_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 6, 1);
const PEER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 6, 2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_bpf_capabilities_tracing_is_off_and_probing_goes_on() {
    if skip_unless_root("without_bpf_capabilities_tracing_is_off_and_probing_goes_on") {
        return;
    }
    let setpriv = Path::new("/usr/bin/setpriv");
    assert!(
        setpriv.is_file(),
        "setpriv (util-linux) is needed to drop capabilities"
    );
    let dir = tempfile::tempdir().unwrap();
    let ctl = spawn_controller(
        dir.path(),
        "controller",
        None,
        "127.0.0.1:0",
        &["--metrics-enabled", "false"],
    )
    .unwrap();
    let common = |a: AgentArgs| {
        a.flag("--metrics-enabled", "false")
            .flag("--probe-interval-ms", "50")
            .flag("--analysis-window-sec", "2")
            .flag("--pinglist-update-interval-sec", "2")
            .flag("--service-tracing-mode", "auto")
    };
    let mut args = vec![
        "--bounding-set".to_string(),
        "-bpf,-perfmon,-sys_admin".to_string(),
        "--".to_string(),
        bin(AGENT_BIN).display().to_string(),
    ];
    args.extend(
        common(AgentArgs::new(
            "unprivileged",
            "tor-p",
            &ctl.addr.to_string(),
            UNPRIVILEGED_IP,
        ))
        .to_args(),
    );
    let mut unprivileged = Proc::spawn(dir.path(), "unprivileged", None, setpriv, &args).unwrap();
    let _peer = spawn_agent(
        dir.path(),
        None,
        &common(AgentArgs::new(
            "peer",
            "tor-p",
            &ctl.addr.to_string(),
            PEER_IP,
        )),
    )
    .unwrap();

    let src = gid_of(UNPRIVILEGED_IP);
    let dst = gid_of(PEER_IP);
    let mut op = operator(&ctl.endpoint()).await.unwrap();
    let probed = wait_for(Duration::from_secs(30), Duration::from_millis(300), || {
        let mut op = op.clone();
        let (src, dst) = (src.clone(), dst.clone());
        async move {
            let ws = all_windows(&mut op).await.ok()?;
            ws.iter()
                .find(|w| w.source_gid == src && w.target_gid == dst && w.probe_success > 0)
                .map(|w| w.probe_success)
        }
    })
    .await;
    let log = unprivileged.stderr();
    assert!(
        probed.is_some(),
        "the unprivileged agent's probes never reached the controller:\n{}",
        tail_lines(&log, 30)
    );
    let off: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("service tracing off"))
        .collect();
    assert_eq!(off.len(), 1, "want one 'service tracing off' line:\n{log}");
    assert!(
        off[0].contains("CAP_BPF") && off[0].contains("CAP_PERFMON"),
        "the line must say which capabilities are missing: {}",
        off[0]
    );
    assert!(!log.contains("service tracing on"), "{log}");
    assert!(unprivileged.alive());
    let _ = list_rnics(&mut op).await.unwrap();
}
