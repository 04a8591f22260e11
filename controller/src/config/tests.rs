//! Tests of `config.rs`.

use clap::Parser;

/// The declarations carry the docs (and `--help`); the README's table names each key.
#[test]
fn every_key_is_documented_here_and_in_the_readme() {
    let readme = include_str!("../../../README.md");
    let start = readme.find("### Controller").unwrap();
    let section = &readme[start..start + readme[start..].find("\n## ").unwrap()];
    for k in KEY_DOCS {
        assert!(!k.doc.trim().is_empty(), "{} has no doc", k.key);
        let named =
            section.contains(k.key) || (k.key.starts_with("tls_") && section.contains("tls_*"));
        assert!(
            named,
            "{} is not in the README's controller key table",
            k.key
        );
    }
}
use super::*;
use std::io::Write;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn yaml(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn defaults_match_the_go_version() {
    let c = ControllerConfig::load(&CliArgs::default(), env(&[])).unwrap();
    assert_eq!(c, ControllerConfig::default());
    assert_eq!(
        c.listen_socket_addr().unwrap(),
        "0.0.0.0:50051".parse().unwrap()
    );
    assert_eq!(c.active_threshold_sec, 300);
    assert_eq!(c.stale_threshold_sec, 900);
    assert_eq!(c.ecmp_max_flow_labels, 64);
    assert_eq!(c.tls().unwrap(), TlsMode::Disabled);
    assert_eq!(c.otel_endpoint(), "http://localhost:4317");
    assert_eq!(default_keys().len(), KEYS.len());
}

#[test]
fn file_then_env_then_flag() {
    let f = yaml("inter_tor_sample_size: 7\nactive_threshold_sec: 100\nlog_level: debug\n");
    let mut cli = CliArgs {
        config: Some(f.path().to_path_buf()),
        ..Default::default()
    };

    let c = ControllerConfig::load(&cli, env(&[])).unwrap();
    assert_eq!(c.inter_tor_sample_size, 7);
    assert_eq!(c.active_threshold_sec, 100);
    assert_eq!(c.log_level, "debug");

    let e = env(&[
        ("RPINGMESH_INTER_TOR_SAMPLE_SIZE", "8"),
        ("RPINGMESH_ACTIVE_THRESHOLD_SEC", "200"),
        // Agent keys in the same environment are ignored, not rejected.
        ("RPINGMESH_TOR_ID", "tor-1"),
        ("OTHER_INTER_TOR_SAMPLE_SIZE", "99"),
    ]);
    let c = ControllerConfig::load(&cli, e.clone()).unwrap();
    assert_eq!(c.inter_tor_sample_size, 8);
    assert_eq!(c.active_threshold_sec, 200);
    assert_eq!(
        c.log_level, "debug",
        "file value kept when env does not set it"
    );

    cli.inter_tor_sample_size = Some(9);
    cli.listen_addr = Some("127.0.0.1:0".into());
    let c = ControllerConfig::load(&cli, e).unwrap();
    assert_eq!(c.inter_tor_sample_size, 9);
    assert_eq!(c.active_threshold_sec, 200);
    assert_eq!(c.listen_socket_addr().unwrap().port(), 0);
}

#[test]
fn env_strings_and_options() {
    let c = ControllerConfig::load(
        &CliArgs::default(),
        env(&[
            ("RPINGMESH_DATABASE_URI", "sqlite::memory:"),
            ("RPINGMESH_LISTEN_ADDR", ":9090"),
            ("RPINGMESH_PINGLIST_SEED", "42"),
            ("RPINGMESH_ANALYZER_ENABLED", "false"),
        ]),
    )
    .unwrap();
    assert_eq!(c.database().unwrap(), DatabaseUri::SqliteMemory);
    assert_eq!(
        c.listen_socket_addr().unwrap(),
        "0.0.0.0:9090".parse().unwrap()
    );
    assert_eq!(c.pinglist_seed, Some(42));
    assert!(!c.analyzer_enabled);
}

#[test]
fn exporter_and_web_addresses_are_checked() {
    let load = |pairs: &[(&str, &str)]| ControllerConfig::load(&CliArgs::default(), env(pairs));
    let e = load(&[("RPINGMESH_METRICS_EXPORTER", "statsd")]).unwrap_err();
    assert!(e.to_string().contains("`metrics_exporter`"), "{e}");
    let e = load(&[
        ("RPINGMESH_METRICS_EXPORTER", "prometheus"),
        ("RPINGMESH_PROMETHEUS_LISTEN_ADDR", "nowhere"),
    ])
    .unwrap_err();
    assert!(e.to_string().contains("`prometheus_listen_addr`"), "{e}");
    let e = load(&[("RPINGMESH_HTTP_LISTEN_ADDR", "nowhere")]).unwrap_err();
    assert!(e.to_string().contains("`http_listen_addr`"), "{e}");
    let c = load(&[("RPINGMESH_HTTP_LISTEN_ADDR", "127.0.0.1:8080")]).unwrap();
    assert_eq!(
        c.http_socket_addr().unwrap(),
        Some("127.0.0.1:8080".parse().unwrap())
    );
    assert_eq!(
        ControllerConfig::default().http_socket_addr().unwrap(),
        None
    );
    // Prometheus alone needs no collector address.
    let c = load(&[
        ("RPINGMESH_METRICS_EXPORTER", "prometheus"),
        ("RPINGMESH_OTEL_COLLECTOR_ADDR", ""),
    ])
    .unwrap();
    assert!(c.exporter().unwrap().prometheus());
}

#[test]
fn unknown_yaml_key_is_named() {
    let f = yaml("listen_addr: \":1\"\nbogus_key: 3\n");
    let cli = CliArgs {
        config: Some(f.path().to_path_buf()),
        ..Default::default()
    };
    let e = ControllerConfig::load(&cli, env(&[]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("bogus_key"), "{e}");
    assert!(!e.contains('\n'), "one line: {e}");
}

#[test]
fn wrong_type_names_the_key() {
    let f = yaml("active_threshold_sec: soon\n");
    let cli = CliArgs {
        config: Some(f.path().to_path_buf()),
        ..Default::default()
    };
    let e = ControllerConfig::load(&cli, env(&[]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("active_threshold_sec"), "{e}");
}

#[test]
fn from_yaml_str_layers_and_validates_as_a_file_does() {
    let text = "inter_tor_sample_size: 7\nlog_level: debug\n";
    let f = yaml(text);
    let cli = CliArgs {
        config: Some(f.path().to_path_buf()),
        ..Default::default()
    };
    let from_file = ControllerConfig::load(&cli, env(&[])).unwrap();
    assert_eq!(ControllerConfig::from_yaml_str(text).unwrap(), from_file);
    let e = ControllerConfig::from_yaml_str("active_threshold_sec: 0\n").unwrap_err();
    assert_eq!(key_of_err(&e), Some("active_threshold_sec"), "{e}");
    let e = ControllerConfig::from_yaml_str("bogus_key: 3\n").unwrap_err();
    assert!(e.to_string().contains("bogus_key"), "{e}");
}

fn key_of_err(e: &ConfigError) -> Option<&'static str> {
    match e {
        ConfigError::Invalid { key, .. } => Some(key),
        ConfigError::Load(_) => None,
    }
}

#[test]
fn missing_config_file_is_an_error() {
    let cli = CliArgs {
        config: Some("/nonexistent/c.yaml".into()),
        ..Default::default()
    };
    let e = ControllerConfig::load(&cli, env(&[]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/c.yaml"), "{e}");
}

fn key_of(c: ControllerConfig) -> &'static str {
    match c.validate().unwrap_err() {
        ConfigError::Invalid { key, .. } => key,
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn validation_names_the_key() {
    let d = ControllerConfig::default;
    assert_eq!(
        key_of(ControllerConfig {
            ecmp_coverage_probability: 1.0,
            ..d()
        }),
        "ecmp_coverage_probability"
    );
    assert_eq!(
        key_of(ControllerConfig {
            ecmp_coverage_probability: 0.0,
            ..d()
        }),
        "ecmp_coverage_probability"
    );
    assert_eq!(
        key_of(ControllerConfig {
            ecmp_paths_assumed: 1,
            ..d()
        }),
        "ecmp_paths_assumed"
    );
    assert_eq!(
        key_of(ControllerConfig {
            ecmp_max_flow_labels: 0,
            ..d()
        }),
        "ecmp_max_flow_labels"
    );
    assert_eq!(
        key_of(ControllerConfig {
            active_threshold_sec: 0,
            ..d()
        }),
        "active_threshold_sec"
    );
    assert_eq!(
        key_of(ControllerConfig {
            active_threshold_sec: 600,
            stale_threshold_sec: 300,
            ..d()
        }),
        "stale_threshold_sec"
    );
    assert_eq!(
        key_of(ControllerConfig {
            analyzer_sla_loss_ratio: 1.5,
            ..d()
        }),
        "analyzer_sla_loss_ratio"
    );
    assert_eq!(
        key_of(ControllerConfig {
            analyzer_sla_loss_ratio: -0.1,
            ..d()
        }),
        "analyzer_sla_loss_ratio"
    );
    assert_eq!(
        key_of(ControllerConfig {
            inter_tor_sample_size: 0,
            ..d()
        }),
        "inter_tor_sample_size"
    );
    assert_eq!(
        key_of(ControllerConfig {
            analyzer_window_retention: 0,
            ..d()
        }),
        "analyzer_window_retention"
    );
    assert_eq!(
        key_of(ControllerConfig {
            log_level: "loud".into(),
            ..d()
        }),
        "log_level"
    );
    assert_eq!(
        key_of(ControllerConfig {
            listen_addr: "nope".into(),
            ..d()
        }),
        "listen_addr"
    );
    assert_eq!(
        key_of(ControllerConfig {
            tls_mode: "maybe".into(),
            ..d()
        }),
        "tls_mode"
    );
    assert_eq!(
        key_of(ControllerConfig {
            tls_mode: "tls".into(),
            ..d()
        }),
        "tls_cert_file"
    );
    assert_eq!(
        key_of(ControllerConfig {
            tls_mode: "mtls".into(),
            tls_cert_file: "/etc/hostname".into(),
            tls_key_file: "/etc/hostname".into(),
            ..d()
        }),
        "tls_ca_file"
    );
    for (c, key) in [
        (
            ControllerConfig {
                service_flow_ttl_sec: 0,
                ..d()
            },
            "service_flow_ttl_sec",
        ),
        (
            ControllerConfig {
                max_service_flows_per_agent: 0,
                ..d()
            },
            "max_service_flows_per_agent",
        ),
        (
            ControllerConfig {
                max_services: 0,
                ..d()
            },
            "max_services",
        ),
    ] {
        assert_eq!(key_of(c), key);
    }
    assert_eq!(
        key_of(ControllerConfig {
            metrics_export_interval_ms: 0,
            ..d()
        }),
        "metrics_export_interval_ms"
    );
    assert_eq!(
        key_of(ControllerConfig {
            database_uri: "mysql://x".into(),
            ..d()
        }),
        "database_uri"
    );
}

#[test]
fn localizer_keys_are_checked_and_mapped() {
    let d = ControllerConfig::default;
    for (c, key) in [
        (
            ControllerConfig {
                analyzer_open_after_windows: 0,
                ..d()
            },
            "analyzer_open_after_windows",
        ),
        (
            ControllerConfig {
                analyzer_resolve_after_windows: 0,
                ..d()
            },
            "analyzer_resolve_after_windows",
        ),
        (
            ControllerConfig {
                analyzer_localize_settle_sec: MAX_LOCALIZE_SETTLE_SEC + 1,
                ..d()
            },
            "analyzer_localize_settle_sec",
        ),
        (
            ControllerConfig {
                analyzer_topology_file: "/nonexistent/topology.yaml".into(),
                ..d()
            },
            "analyzer_topology_file",
        ),
    ] {
        assert_eq!(key_of(c), key);
    }
    let p = d().analyzer_params();
    assert_eq!(p.localize_settle_ns, 10_000_000_000);
    assert_eq!(
        (
            p.localizer.open_after_windows,
            p.localizer.resolve_after_windows
        ),
        (1, 2)
    );
    assert_eq!(p.sla_loss_ratio, 0.02);
    let c = ControllerConfig::load(
        &CliArgs::default(),
        env(&[
            ("RPINGMESH_ANALYZER_LOCALIZE_SETTLE_SEC", "0"),
            ("RPINGMESH_ANALYZER_OPEN_AFTER_WINDOWS", "3"),
            ("RPINGMESH_ANALYZER_RESOLVE_AFTER_WINDOWS", "4"),
        ]),
    )
    .unwrap();
    let p = c.analyzer_params();
    assert_eq!(p.localize_settle_ns, 0);
    assert_eq!(
        (
            p.localizer.open_after_windows,
            p.localizer.resolve_after_windows
        ),
        (3, 4)
    );
    assert_eq!(
        p.localizer.loss_ratio,
        LocalizerParams::default().loss_ratio
    );
    assert_eq!(c.topology().unwrap(), None);
}

#[test]
fn topology_file_is_read_and_its_errors_name_key_and_path() {
    let good = yaml("spines: [s1, s2]\ntors:\n  t1: [s1, s2]\n  t2: [s2, s1]\n");
    let c = ControllerConfig {
        analyzer_topology_file: good.path().display().to_string(),
        ..Default::default()
    };
    c.validate().unwrap();
    let t = c.topology().unwrap().unwrap();
    assert_eq!(t.tor_count(), 2);
    let bad = yaml("spines: []\ntors:\n  t1: [s1]\n");
    let path = bad.path().display().to_string();
    let cli = CliArgs {
        analyzer_topology_file: Some(path.clone()),
        ..Default::default()
    };
    let e = ControllerConfig::load(&cli, env(&[]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`analyzer_topology_file`") && e.contains(&path) && e.contains("spines"),
        "{e}"
    );
    assert!(!e.contains('\n'), "one line: {e}");
    let e = ControllerConfig {
        analyzer_topology_file: "/nonexistent/t.yaml".into(),
        ..Default::default()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`analyzer_topology_file`") && e.contains("/nonexistent/t.yaml"),
        "{e}"
    );
    // Not read when the analyzer is off.
    ControllerConfig {
        analyzer_enabled: false,
        analyzer_topology_file: "/nonexistent/t.yaml".into(),
        ..Default::default()
    }
    .validate()
    .unwrap();
}

#[test]
fn rqlite_uri_gets_the_documented_error() {
    let c = ControllerConfig {
        database_uri: "http://localhost:4001".into(),
        ..Default::default()
    };
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "database_uri http://localhost:4001: rqlite is not supported; \
         use sqlite:<path> (embedded, on disk) or sqlite::memory:"
    );
    let c = ControllerConfig {
        database_uri: "sqlite:/tmp/x.db".into(),
        ..Default::default()
    };
    assert_eq!(
        c.database().unwrap(),
        DatabaseUri::SqliteFile("/tmp/x.db".into())
    );
    let c = ControllerConfig {
        database_uri: "etcd://10.0.0.1:2379".into(),
        ..Default::default()
    };
    assert_eq!(
        c.database().unwrap(),
        DatabaseUri::Etcd("10.0.0.1:2379".into())
    );
}

#[test]
fn flags_parse_kebab_case() {
    let cli = CliArgs::try_parse_from([
        "rpingmesh-controller",
        "--listen-addr",
        ":9090",
        "--ecmp-coverage-probability",
        "0.99",
        "--analyzer-enabled",
        "false",
    ])
    .unwrap();
    let c = ControllerConfig::load(&cli, env(&[])).unwrap();
    assert_eq!(c.listen_addr, ":9090");
    assert_eq!(c.ecmp_coverage_probability, 0.99);
    assert!(!c.analyzer_enabled);
}
