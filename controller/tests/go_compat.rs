//! Drop-in for the Go fleet: the Go controller's shipped configuration loads unchanged;
//! its rqlite database_uri is the one thing to change, and the line that says so names
//! only stores that exist.

use std::path::{Path, PathBuf};

use rpingmesh_controller::config::{CliArgs, ControllerConfig};

fn go_config(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/go-configs")
        .join(file)
}

#[test]
fn go_controller_yaml_loads_and_only_the_store_needs_a_choice() {
    let cli = CliArgs {
        config: Some(go_config("controller.yaml")),
        ..Default::default()
    };
    // As shipped: every key is known; the rqlite URI is refused naming what to use.
    let e = ControllerConfig::load(&cli, Vec::new())
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "database_uri http://localhost:4001: rqlite is not supported; \
         use sqlite:<path> (embedded, on disk) or sqlite::memory:"
    );
    assert!(!e.contains("etcd"), "names only stores that exist: {e}");
    // With the store chosen (flag or RPINGMESH_DATABASE_URI), the file's values apply.
    let env = vec![(
        "RPINGMESH_DATABASE_URI".to_string(),
        "sqlite::memory:".to_string(),
    )];
    let c = ControllerConfig::load(&cli, env).unwrap();
    assert_eq!(c.listen_addr, ":50051");
    assert_eq!((c.ecmp_paths_assumed, c.ecmp_max_flow_labels), (16, 64));
    assert_eq!(c.analyzer_window_retention, 20);
    assert_eq!(c.otel_endpoint(), "http://localhost:4317");
}

#[test]
fn without_config_flag_the_home_directory_config_is_used() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join(".rpingmesh");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("controller.yaml"),
        "database_uri: \"sqlite::memory:\"\nlisten_addr: \"127.0.0.1:50999\"\n",
    )
    .unwrap();
    let env = vec![(
        "HOME".to_string(),
        home.path().to_string_lossy().into_owned(),
    )];
    let c = ControllerConfig::load(&CliArgs::default(), env).unwrap();
    assert_eq!(c.listen_addr, "127.0.0.1:50999");
}
