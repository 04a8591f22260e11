//! Tests of `sysfs.rs`.

use super::*;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sysfs")
}

#[test]
fn port_state_parsing() {
    assert_eq!(parse_port_state("4: ACTIVE\n"), Ok(PortState::Active));
    assert_eq!(parse_port_state("1: DOWN"), Ok(PortState::Down));
    assert_eq!(
        parse_port_state("5: ACTIVE_DEFER"),
        Ok(PortState::ActiveDefer)
    );
    assert_eq!(parse_port_state("9: WHATEVER"), Ok(PortState::Other(9)));
    assert!(PortState::ActiveDefer.is_active());
    assert!(!PortState::Init.is_active());
    let e = parse_port_state("ACTIVE").unwrap_err();
    assert!(e.contains("\"ACTIVE\""), "{e}");
}

#[test]
fn gid_parsing() {
    assert_eq!(
        parse_gid("fe80:0000:0000:0000:0202:c9ff:fe00:0001\n"),
        Ok(Some("fe80::202:c9ff:fe00:1".parse().unwrap()))
    );
    assert_eq!(
        parse_gid("0000:0000:0000:0000:0000:ffff:0a00:0001"),
        Ok(Some("::ffff:10.0.0.1".parse().unwrap()))
    );
    assert_eq!(
        parse_gid("0000:0000:0000:0000:0000:0000:0000:0000"),
        Ok(None)
    );
    assert!(parse_gid("fe80::1").is_err());
    assert!(parse_gid("fe80:0000:0000:0000:0000:0000:0000:zzzz").is_err());
    assert!(parse_gid("").is_err());
}

#[test]
fn gid_type_parsing() {
    assert_eq!(parse_gid_type("IB/RoCE v1\n"), Ok(GidType::IbRoceV1));
    assert_eq!(parse_gid_type("RoCE v2\n"), Ok(GidType::RoceV2));
    assert_eq!(parse_gid_type("iWARP"), Ok(GidType::Other("iWARP".into())));
    assert!(parse_gid_type("\n").is_err());
}

#[test]
fn mlx5_fixture_with_v1_and_v2_entries() {
    let root = fixtures().join("mlx5");
    assert_eq!(list_devices(&root).unwrap(), vec!["mlx5_0", "mlx5_1"]);
    assert_eq!(list_ports(&root, "mlx5_0").unwrap(), vec![1]);
    let p = read_port(&root, "mlx5_0", 1).unwrap();
    assert_eq!(p.state, PortState::Active);
    assert_eq!(p.table_size, 6);
    // Slots 4 and 5 are zero GIDs: empty.
    let idx: Vec<u32> = p.gids.iter().map(|e| e.index).collect();
    assert_eq!(idx, vec![0, 1, 2, 3]);
    assert_eq!(p.gids[0].gid_type, Some(GidType::IbRoceV1));
    assert_eq!(p.gids[1].gid_type, Some(GidType::RoceV2));
    assert_eq!(p.gids[3].gid_type, Some(GidType::RoceV2));
    assert_eq!(p.gids[3].ipv4(), Some("192.168.10.11".parse().unwrap()));
    assert_eq!(p.gids[3].ndev.as_deref(), Some("ens1f0np0"));
    assert!(p.bad_files.is_empty(), "{:?}", p.bad_files);

    let chosen = select_gid(&p, 3).unwrap();
    assert_eq!(
        chosen.gid,
        "::ffff:192.168.10.11".parse::<Ipv6Addr>().unwrap()
    );
    assert!(roce_v1_warning(&p, chosen).is_none());
    let v1 = select_gid(&p, 0).unwrap();
    let w = roce_v1_warning(&p, v1).unwrap();
    assert_eq!(
            w,
            "gid_index=0 on device mlx5_0 port 1 is an IB/RoCE v1 GID (fe80::ba59:9fff:fe12:3456): RoCE v1 is not IP-routable; RoCE v2 entries are at gid_index 1, 3"
        );
    check_port_active(&p).unwrap();
    let table = format_gid_table(&p);
    assert!(
        table.starts_with("mlx5_0 port 1: ACTIVE (GID table size 6)\n"),
        "{table}"
    );
    assert!(table.contains("::ffff:192.168.10.11"), "{table}");
}

#[test]
fn gid_index_errors_are_the_spec_text() {
    let root = fixtures().join("small");
    let p = read_port(&root, "mlx5_0", 1).unwrap();
    assert_eq!(p.table_size, 3);
    let e = select_gid(&p, 100).unwrap_err();
    assert_eq!(
        e.to_string(),
        "gid_index=100 is invalid or not present on device mlx5_0 port 1 (GID table size 3)"
    );
    // Index inside the table but the slot is empty (zero GID): same error.
    let e = select_gid(&p, 2).unwrap_err();
    assert_eq!(
        e.to_string(),
        "gid_index=2 is invalid or not present on device mlx5_0 port 1 (GID table size 3)"
    );
}

#[test]
fn down_port_and_missing_port() {
    let root = fixtures().join("mlx5");
    let p = read_port(&root, "mlx5_1", 1).unwrap();
    assert_eq!(p.state, PortState::Down);
    assert_eq!(
        check_port_active(&p).unwrap_err().to_string(),
        "device mlx5_1 port 1 is DOWN, not ACTIVE (check the link and `rdma link show`)"
    );
    let e = read_port(&root, "mlx5_0", 2).unwrap_err();
    assert_eq!(
        e.to_string(),
        "device mlx5_0 has no port 2 (ports present: [1])"
    );
    let e = read_port(&root, "nosuch", 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "device nosuch has no port 1 (ports present: [])"
    );
}

#[test]
fn single_gid_entries_are_read_alone() {
    let root = fixtures().join("bad");
    // gids/2 is a good entry, gids/1 garbage, gids/9 absent.
    let full = read_port(&root, "rxe0", 1).unwrap();
    let two = full.gids.iter().find(|e| e.index == 2).unwrap().gid;
    assert_eq!(read_gid(&root, "rxe0", 1, 2).unwrap(), Some(two));
    assert!(read_gid(&root, "rxe0", 1, 1).is_err());
    assert_eq!(read_gid(&root, "rxe0", 1, 9).unwrap(), None);
    assert_eq!(read_gid(&root, "nosuch", 1, 0).unwrap(), None);
}

#[test]
fn bad_files_are_reported_not_fatal() {
    let root = fixtures().join("bad");
    let p = read_port(&root, "rxe0", 1).unwrap();
    // gids/1 is garbage, gids/2 is fine but its type file is empty.
    assert_eq!(
        p.gids.iter().map(|e| e.index).collect::<Vec<_>>(),
        vec![0, 2]
    );
    assert_eq!(p.gids[1].gid_type, None);
    assert_eq!(p.bad_files.len(), 2, "{:?}", p.bad_files);
    assert!(p.bad_files[0].path.ends_with("gids/1"));
    assert!(p.bad_files[0].reason.starts_with("malformed GID"));
    assert!(p.bad_files[1].path.ends_with("gid_attrs/types/2"));
    // A bad state file is fatal and names the file.
    let e = read_port(&root, "rxe1", 1).unwrap_err().to_string();
    assert!(
        e.starts_with("sysfs ") && e.contains("rxe1/ports/1/state: unrecognised port state"),
        "{e}"
    );
    // No type files at all (old kernel): entries without a type, no warning.
    let p = read_port(&root, "ib0", 1).unwrap();
    assert_eq!(p.gids.len(), 1);
    assert_eq!(p.gids[0].gid_type, None);
    assert!(roce_v1_warning(&p, &p.gids[0]).is_none());
}

#[test]
fn missing_class_dir_is_no_devices() {
    assert!(list_devices(&fixtures().join("does-not-exist"))
        .unwrap()
        .is_empty());
}
