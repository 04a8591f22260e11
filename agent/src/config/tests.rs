//! Tests of `config.rs`.

use super::*;
use clap::Parser;

fn cli(args: &[&str]) -> CliArgs {
    let mut v = vec!["rpingmesh-agent"];
    v.extend_from_slice(args);
    CliArgs::try_parse_from(v).unwrap()
}

fn yaml(text: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), text).unwrap();
    f
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn defaults_match_the_go_readme() {
    let c = AgentConfig::default();
    assert_eq!(c.controller_addr, "localhost:50051");
    assert_eq!(c.probe_interval_ms, 500);
    assert_eq!(c.target_probe_rate_per_second, 10.0);
    assert_eq!(c.tor_mesh_probe_rate_per_second, 0.0);
    assert_eq!(c.pinglist_update_interval_sec, 300);
    assert_eq!(c.flow_label_rotation_period_sec, 3600);
    assert_eq!(c.otel_collector_addr, "localhost:4317");
    assert_eq!(c.analysis_window_sec, 30);
    assert_eq!(c.throttle_memory_ratio, 0.9);
    assert_eq!(c.throttle_cpu_percent, 90.0);
    assert_eq!(c.tls_mode, TlsMode::Disabled);
    assert_eq!(c.transport, Transport::Udp);
    assert_eq!(c.udp_addresses, vec!["127.0.0.1".to_string()]);
    assert_eq!(c.udp_port, 18515);
    assert_eq!(c.report_batch_max, 256);
    assert_eq!(c.agent_id, local_hostname());
    assert!(c.metrics_enabled && c.analysis_report_enabled && !c.responder_only);
    // The per-type rates inherit the uniform one.
    assert_eq!(c.tor_mesh_rate(), 10.0);
    assert_eq!(c.inter_tor_rate(), 10.0);
}

#[test]
fn tor_id_is_required() {
    let e = AgentConfig::load_from(&cli(&[]), &[]).unwrap_err();
    assert!(e.0.starts_with("tor_id is required"), "{e}");
}

#[test]
fn file_then_env_then_cli() {
    let f = yaml(
        "tor_id: tor-file\nprobe_interval_ms: 100\ncontroller_addr: file:1\n\
         tor_mesh_probe_rate_per_second: 10\ninter_tor_probe_rate_per_second: 1\n\
         udp_addresses: [127.0.0.2, 127.0.0.3]\n",
    );
    let path = f.path().to_str().unwrap();
    // File only.
    let c = AgentConfig::load_from(&cli(&["--config", path]), &[]).unwrap();
    assert_eq!(c.tor_id, "tor-file");
    assert_eq!(c.probe_interval_ms, 100);
    assert_eq!(c.udp_addresses, vec!["127.0.0.2", "127.0.0.3"]);
    assert_eq!(c.inter_tor_rate(), 1.0);
    assert_eq!(c.tor_mesh_rate(), 10.0);
    // Env beats the file.
    let e = env(&[
        ("RPINGMESH_TOR_ID", "tor-env"),
        ("RPINGMESH_PROBE_INTERVAL_MS", "200"),
        ("RPINGMESH_UDP_ADDRESSES", "127.0.0.4,127.0.0.5"),
        ("RPINGMESH_LISTEN_ADDR", ":1"), // a controller key: ignored, not an error
        ("OTHER_TOR_ID", "x"),
    ]);
    let c = AgentConfig::load_from(&cli(&["--config", path]), &e).unwrap();
    assert_eq!(c.tor_id, "tor-env");
    assert_eq!(c.probe_interval_ms, 200);
    assert_eq!(c.udp_addresses, vec!["127.0.0.4", "127.0.0.5"]);
    assert_eq!(c.controller_addr, "file:1");
    // CLI beats both.
    let c = AgentConfig::load_from(
        &cli(&[
            "--config",
            path,
            "--tor-id",
            "tor-cli",
            "--udp-addresses",
            "::1,127.0.0.9",
            "--metrics-enabled",
            "false",
        ]),
        &e,
    )
    .unwrap();
    assert_eq!(c.tor_id, "tor-cli");
    assert_eq!(c.probe_interval_ms, 200);
    assert_eq!(c.udp_addresses, vec!["::1", "127.0.0.9"]);
    assert!(!c.metrics_enabled);
}

#[test]
fn numeric_tor_id_is_text() {
    let f = yaml("tor_id: 7\n");
    let c = AgentConfig::load_from(&cli(&["--config", f.path().to_str().unwrap()]), &[]).unwrap();
    assert_eq!(c.tor_id, "7");
    let c = AgentConfig::load_from(&cli(&[]), &env(&[("RPINGMESH_TOR_ID", "12")])).unwrap();
    assert_eq!(c.tor_id, "12");
}

#[test]
fn unknown_yaml_key_is_named() {
    let f = yaml("tor_id: t\nprobe_intervall_ms: 5\n");
    let e =
        AgentConfig::load_from(&cli(&["--config", f.path().to_str().unwrap()]), &[]).unwrap_err();
    assert!(e.0.contains("probe_intervall_ms"), "{e}");
    assert!(e.0.contains("unknown config key"), "{e}");
    assert!(!e.0.contains('\n'));
}

#[test]
fn wrong_type_names_the_key() {
    let f = yaml("tor_id: t\nprobe_interval_ms: fast\n");
    let e =
        AgentConfig::load_from(&cli(&["--config", f.path().to_str().unwrap()]), &[]).unwrap_err();
    assert!(e.0.contains("probe_interval_ms"), "{e}");
    assert!(!e.0.contains('\n'));
    let e = AgentConfig::load_from(
        &cli(&[]),
        &env(&[("RPINGMESH_TOR_ID", "t"), ("RPINGMESH_UDP_PORT", "99999")]),
    )
    .unwrap_err();
    assert!(e.0.contains("udp_port"), "{e}");
    let e = AgentConfig::load_from(
        &cli(&["--tor-id", "t"]),
        &env(&[("RPINGMESH_TLS_MODE", "ssl")]),
    )
    .unwrap_err();
    assert!(e.0.contains("tls_mode"), "{e}");
}

#[test]
fn missing_config_file_is_named() {
    let e =
        AgentConfig::load_from(&cli(&["--config", "/nonexistent/agent.yaml"]), &[]).unwrap_err();
    assert!(e.0.contains("/nonexistent/agent.yaml"), "{e}");
}

#[test]
fn bad_yaml_is_one_line() {
    let f = yaml("tor_id: [unterminated\n");
    let e =
        AgentConfig::load_from(&cli(&["--config", f.path().to_str().unwrap()]), &[]).unwrap_err();
    assert!(!e.0.contains('\n'), "{e}");
    assert!(e.0.contains("YAML"), "{e}");
}

fn invalid(mutate: impl FnOnce(&mut AgentConfig)) -> String {
    let mut c = AgentConfig {
        tor_id: "t".into(),
        ..AgentConfig::default()
    };
    c.validate().unwrap();
    mutate(&mut c);
    c.validate().unwrap_err().0
}

#[test]
fn each_range_error_names_its_key() {
    assert!(invalid(|c| c.gid_index = 256).starts_with("gid_index"));
    assert!(invalid(|c| c.gid_index = -1).starts_with("gid_index"));
    assert!(invalid(|c| c.service_level = 8).starts_with("service_level"));
    assert!(invalid(|c| c.traffic_class = 300).starts_with("traffic_class"));
    assert!(invalid(|c| c.probe_interval_ms = 0).starts_with("probe_interval_ms"));
    assert!(invalid(|c| c.target_probe_rate_per_second = 0.0)
        .starts_with("target_probe_rate_per_second"));
    assert!(invalid(|c| c.tor_mesh_probe_rate_per_second = -1.0)
        .starts_with("tor_mesh_probe_rate_per_second"));
    assert!(invalid(|c| c.inter_tor_probe_rate_per_second = f64::NAN)
        .starts_with("inter_tor_probe_rate_per_second"));
    assert!(
        invalid(|c| c.pinglist_update_interval_sec = 0).starts_with("pinglist_update_interval_sec")
    );
    assert!(invalid(|c| c.analysis_window_sec = 0).starts_with("analysis_window_sec"));
    assert!(invalid(|c| c.watchdog_interval_sec = 0).starts_with("watchdog_interval_sec"));
    assert!(invalid(|c| c.throttle_memory_ratio = 1.5).starts_with("throttle_memory_ratio"));
    assert!(invalid(|c| c.throttle_cpu_percent = 0.0).starts_with("throttle_cpu_percent"));
    assert!(invalid(|c| c.log_level = "verbose".into()).starts_with("log_level"));
    assert!(invalid(|c| c.udp_addresses = vec![]).starts_with("udp_addresses"));
    assert!(invalid(|c| c.udp_addresses = vec!["host".into()]).starts_with("udp_addresses"));
    assert!(invalid(|c| c.probe_timeout_ms = 0).starts_with("probe_timeout_ms"));
    assert!(invalid(|c| c.report_batch_max = 0).starts_with("report_batch_max"));
    assert!(invalid(|c| c.metrics_export_interval_ms = 0).starts_with("metrics_export_interval_ms"));
    assert!(invalid(|c| c.controller_addr = " ".into()).starts_with("controller_addr"));
    assert!(invalid(|c| c.metrics_exporter = "statsd".into()).starts_with("metrics_exporter"));
    assert!(invalid(|c| {
        c.metrics_exporter = "both".into();
        c.prometheus_listen_addr = "nowhere".into();
    })
    .starts_with("prometheus_listen_addr"));
}

#[test]
fn tls_files_must_exist_for_the_mode() {
    let e = invalid(|c| c.tls_mode = TlsMode::Tls);
    assert!(
        e.starts_with("tls_ca_file is required when tls_mode is tls"),
        "{e}"
    );
    let e = invalid(|c| {
        c.tls_mode = TlsMode::Tls;
        c.tls_ca_file = "/nonexistent/ca.pem".into();
    });
    assert!(
        e.starts_with("tls_ca_file: file /nonexistent/ca.pem does not exist"),
        "{e}"
    );
    let ca = yaml("ca");
    let ca_path = ca.path().to_str().unwrap().to_string();
    let e = invalid(|c| {
        c.tls_mode = TlsMode::Mtls;
        c.tls_ca_file = ca_path.clone();
    });
    assert!(
        e.starts_with("tls_cert_file is required when tls_mode is mtls"),
        "{e}"
    );
    let mut c = AgentConfig {
        tor_id: "t".into(),
        tls_mode: TlsMode::Mtls,
        ..AgentConfig::default()
    };
    c.tls_ca_file = ca_path.clone();
    c.tls_cert_file = ca_path.clone();
    c.tls_key_file = ca_path;
    c.validate().unwrap();
}

#[test]
fn shipped_config_loads() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/agent.yaml");
    // tor_id is per host: the shipped file leaves it to env or CLI.
    let e = AgentConfig::load_from(&cli(&["--config", path]), &[]).unwrap_err();
    assert!(e.0.starts_with("tor_id is required"), "{e}");
    let c = AgentConfig::load_from(&cli(&["--config", path, "--tor-id", "tor-a"]), &[]).unwrap();
    assert_eq!(c.tor_mesh_rate(), 10.0);
    assert_eq!(c.inter_tor_rate(), 1.0);
}

#[test]
fn from_yaml_str_layers_and_validates_as_a_file_does() {
    let text = "tor_id: tor-a\nagent_id: a1\nprobe_interval_ms: 250\n";
    let f = yaml(text);
    let from_file =
        AgentConfig::load_from(&cli(&["--config", f.path().to_str().unwrap()]), &[]).unwrap();
    assert_eq!(AgentConfig::from_yaml_str(text).unwrap(), from_file);
    let e = AgentConfig::from_yaml_str("agent_id: a1\n").unwrap_err();
    assert!(e.0.starts_with("tor_id is required"), "{e}");
    let e = AgentConfig::from_yaml_str("tor_id: t\nno_such_key: 1\n").unwrap_err();
    assert!(e.0.contains("unknown config key `no_such_key`"), "{e}");
}

#[test]
fn every_key_is_a_field_and_a_flag() {
    let json = serde_json::to_value(AgentConfig::default()).unwrap();
    let fields: Vec<&String> = json.as_object().unwrap().keys().collect();
    assert_eq!(fields.len(), KEYS.len());
    for k in KEYS {
        assert!(json.get(*k).is_some(), "{k} is not a field");
        let flag = format!("--{}", k.replace('_', "-"));
        let cmd = <CliArgs as clap::CommandFactory>::command();
        assert!(
            cmd.get_arguments()
                .any(|a| a.get_long() == Some(&flag[2..])),
            "{flag} is not a CLI flag"
        );
    }
}

/// The declarations carry the docs: each key has one (its `--help` text too), and the
/// README's key tables name every key.
#[test]
fn every_key_is_documented_here_and_in_the_readme() {
    let readme = include_str!("../../../README.md");
    let section =
        &readme[readme.find("### Agent").unwrap()..readme.find("### Controller").unwrap()];
    for k in KEY_DOCS {
        assert!(!k.doc.trim().is_empty(), "{} has no doc", k.key);
        assert!(
            section.contains(&format!("| {}", k.key))
                || section.contains(&format!(" {},", k.key))
                || section.contains(&format!(" {})", k.key))
                || section.contains(&format!("/ {} ", k.key)),
            "{} is not in the README's agent key tables",
            k.key
        );
    }
    let help = <CliArgs as clap::CommandFactory>::command()
        .render_long_help()
        .to_string();
    assert!(
        help.contains("Each RNIC probes one other RNIC of the host this often"),
        "{help}"
    );
}

#[test]
fn service_keys_default_and_layer() {
    let c = AgentConfig::load_from(&cli(&["--tor-id", "t"]), &[]).unwrap();
    assert_eq!(c.service_tracing_mode, ServiceTracingMode::Auto);
    assert_eq!(c.service_probe_rate_per_second, 0.0);
    assert_eq!(
        c.service_rate(),
        10.0,
        "0 inherits target_probe_rate_per_second"
    );
    assert!(c.service_tracing_uprobe_targets.is_empty());
    assert!(c.service_names.is_empty());
    assert_eq!(c.max_service_names, 32);
    assert_eq!(c.service_flow_report_interval_ms, 1000);

    let f = yaml(
        "tor_id: t\nservice_tracing_mode: uprobe\nservice_probe_rate_per_second: 2\n\
         service_tracing_uprobe_targets: [/opt/app/lib/libibverbs.so.1]\n\
         service_names: {python3: training, nccl-test: 42}\nmax_service_names: 4\n\
         service_flow_report_interval_ms: 500\n",
    );
    let path = f.path().to_str().unwrap();
    let c = AgentConfig::load_from(&cli(&["--config", path]), &[]).unwrap();
    assert_eq!(c.service_tracing_mode, ServiceTracingMode::Uprobe);
    assert_eq!(c.service_rate(), 2.0);
    assert_eq!(
        c.service_tracing_uprobe_targets,
        vec!["/opt/app/lib/libibverbs.so.1"]
    );
    assert_eq!(
        c.service_names.get("python3").map(String::as_str),
        Some("training")
    );
    assert_eq!(
        c.service_names.get("nccl-test").map(String::as_str),
        Some("42")
    );
    assert_eq!(
        (c.max_service_names, c.service_flow_report_interval_ms),
        (4, 500)
    );

    // env over file, flags over env.
    let c = AgentConfig::load_from(
        &cli(&[
            "--config",
            path,
            "--service-tracing-mode",
            "off",
            "--service-names",
            "a=b",
        ]),
        &env(&[
            ("RPINGMESH_SERVICE_TRACING_MODE", "kprobe"),
            ("RPINGMESH_SERVICE_NAMES", "x=y, z=w"),
            ("RPINGMESH_SERVICE_TRACING_UPROBE_TARGETS", "/a/b,/c/d"),
            ("RPINGMESH_MAX_SERVICE_NAMES", "7"),
        ]),
    )
    .unwrap();
    assert_eq!(c.service_tracing_mode, ServiceTracingMode::Off);
    assert_eq!(c.service_names.len(), 1);
    assert_eq!(c.service_names["a"], "b");
    assert_eq!(c.service_tracing_uprobe_targets, vec!["/a/b", "/c/d"]);
    assert_eq!(c.max_service_names, 7);
    let c = AgentConfig::load_from(
        &cli(&["--config", path]),
        &env(&[("RPINGMESH_SERVICE_NAMES", "x=y, z=w")]),
    )
    .unwrap();
    assert_eq!(c.service_names.len(), 2);
    assert_eq!(c.service_names["z"], "w");
}

#[test]
fn rc_ring_keys_default_to_service_targets_and_name_bad_values() {
    let c = AgentConfig::load_from(&cli(&["--tor-id", "t"]), &[]).unwrap();
    assert_eq!(
        c.rc_ring_kinds(),
        vec![rpingmesh_protocol::PinglistKind::Service]
    );
    let c = AgentConfig::load_from(
        &cli(&["--tor-id", "t", "--rc-ring-pinglists", "tor_mesh,inter_tor"]),
        &[],
    )
    .unwrap();
    assert_eq!(c.rc_ring_kinds().len(), 2);
    let off = AgentConfig::load_from(
        &cli(&["--tor-id", "t"]),
        &env(&[("RPINGMESH_RC_RING_PINGLISTS", "")]),
    )
    .unwrap();
    assert!(off.rc_ring_kinds().is_empty(), "empty = off");
    assert!(invalid(|c| c.rc_ring_pinglists = vec!["host".into()])
        .starts_with("rc_ring_pinglists: \"host\""));
    assert!(invalid(|c| c.rc_ring_port = 0).starts_with("rc_ring_port"));
    assert!(invalid(|c| c.rc_ring_budget_bytes = 511).starts_with("rc_ring_budget_bytes"));
    assert!(invalid(|c| c.rc_ring_ack_timeout_exp = 32).starts_with("rc_ring_ack_timeout_exp"));
    assert!(invalid(|c| c.rc_ring_max_rings = 0).starts_with("rc_ring_max_rings"));
    assert!(invalid(|c| c.rc_ring_probe_interval_ms = 5).starts_with("rc_ring_probe_interval_ms"));
    assert!(invalid(|c| c.rc_ring_probe_timeout_ms = 2000).starts_with("rc_ring_probe_timeout_ms"));
    assert!(invalid(|c| c.rc_ring_hot_wait_us = 0).starts_with("rc_ring_hot_wait_us"));
    assert!(invalid(|c| c.rc_ring_poll_lead_us = 2_000_000).starts_with("rc_ring_poll_lead_us"));
}

#[test]
fn bad_service_keys_name_the_key() {
    let e = AgentConfig::load_from(
        &cli(&["--tor-id", "t"]),
        &env(&[("RPINGMESH_SERVICE_TRACING_MODE", "sometimes")]),
    )
    .unwrap_err();
    assert!(e.0.contains("service_tracing_mode"), "{e}");
    let e = AgentConfig::load_from(
        &cli(&["--tor-id", "t"]),
        &env(&[("RPINGMESH_SERVICE_NAMES", "novalue")]),
    )
    .unwrap_err();
    assert!(
        e.0.contains("service_names") && e.0.contains("novalue"),
        "{e}"
    );
    assert!(invalid(|c| c.service_probe_rate_per_second = -1.0)
        .starts_with("service_probe_rate_per_second"));
    assert!(invalid(|c| c.max_service_names = 0).starts_with("max_service_names"));
    assert!(invalid(|c| c.service_flow_report_interval_ms = 0)
        .starts_with("service_flow_report_interval_ms"));
    assert!(invalid(|c| c.service_flow_report_interval_ms = 200_000)
        .starts_with("service_flow_report_interval_ms"));
    assert!(
        invalid(|c| c.service_tracing_uprobe_targets = vec!["lib.so".into()])
            .starts_with("service_tracing_uprobe_targets")
    );
    assert!(invalid(|c| {
        c.service_names.insert("comm".into(), " ".into());
    })
    .starts_with("service_names"));
}
