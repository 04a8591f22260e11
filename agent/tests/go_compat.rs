//! Drop-in for the Go fleet: the Go agent's shipped configuration loads unchanged, with
//! the Go meanings (`agent_id: ""` is the hostname), and the config is found where the Go
//! agent looks when no --config is given.

use std::path::{Path, PathBuf};

use rpingmesh_agent::config::{local_hostname, AgentConfig, CliArgs};

fn go_config(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/go-configs")
        .join(file)
}

#[test]
fn go_agent_yaml_loads_unchanged_with_go_meanings() {
    let cli = CliArgs {
        config: Some(go_config("agent.yaml")),
        // The shipped file leaves tor_id empty: it is per host, given as a flag (or env).
        tor_id: Some("tor-a1".into()),
        ..Default::default()
    };
    let c = AgentConfig::load_from(&cli, &[]).unwrap();
    assert_eq!(
        c.agent_id,
        local_hostname(),
        "agent_id \"\" means the hostname"
    );
    assert_eq!(c.hostname, local_hostname(), "hostname \"\" is detected");
    assert_eq!(c.controller_addr, "localhost:50051");
    assert_eq!(
        (
            c.tor_mesh_probe_rate_per_second,
            c.inter_tor_probe_rate_per_second
        ),
        (10.0, 1.0)
    );
    assert_eq!(c.otel_collector_addr, "localhost:4317");
    // The Go agent's own default collector address form.
    let cli = CliArgs {
        otel_collector_addr: Some("grpc://localhost:4317".into()),
        ..cli
    };
    let c = AgentConfig::load_from(&cli, &[]).unwrap();
    assert_eq!(
        rpingmesh_agent::telemetry::collector_uri(&c.otel_collector_addr),
        "http://localhost:4317"
    );
    // An empty tor_id still stops the agent with the one line naming it.
    let e = AgentConfig::load_from(
        &CliArgs {
            config: Some(go_config("agent.yaml")),
            ..Default::default()
        },
        &[],
    )
    .unwrap_err();
    assert!(e.to_string().starts_with("tor_id is required"), "{e}");
}

#[test]
fn without_config_flag_the_home_directory_config_is_used() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join(".rpingmesh");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("agent.yaml"),
        "tor_id: tor-home\nagent_id: from-home\n",
    )
    .unwrap();
    let env = vec![(
        "HOME".to_string(),
        home.path().to_string_lossy().into_owned(),
    )];
    let c = AgentConfig::load_from(&CliArgs::default(), &env).unwrap();
    assert_eq!(
        (c.tor_id.as_str(), c.agent_id.as_str()),
        ("tor-home", "from-home")
    );
    // Flags still win over the file found.
    let cli = CliArgs {
        agent_id: Some("flag".into()),
        ..Default::default()
    };
    assert_eq!(AgentConfig::load_from(&cli, &env).unwrap().agent_id, "flag");
}
