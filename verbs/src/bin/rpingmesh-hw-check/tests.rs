//! Tests of `rpingmesh-hw-check`.

use super::*;

fn argv(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

#[test]
fn arguments() {
    let a = parse_args(argv(
        "--port 2 --gid-index 3 --count 5 --interval-ms 100 mlx5_0 mlx5_1",
    ))
    .unwrap();
    assert_eq!(
        (a.port, a.gid_index, a.count, a.interval_ms),
        (2, Some(3), 5, 100)
    );
    assert!(!a.loopback);
    assert_eq!(a.peer_gid_index, None);
    assert_eq!(a.devices, vec!["mlx5_0", "mlx5_1"]);
    let b = parse_args(argv("--gid-index 1,2 rxe0")).unwrap();
    assert_eq!((b.gid_index, b.peer_gid_index), (Some(1), Some(2)));
    assert_eq!(
        parse_args(argv("--gid-index 1,x")).err().unwrap(),
        "--gid-index: \"1,x\" is not N or N,M"
    );
    assert_eq!(
        parse_args(argv("--port")).err().unwrap(),
        "--port needs a value"
    );
    assert_eq!(
        parse_args(argv("--port x")).err().unwrap(),
        "--port: \"x\" is not a number"
    );
    assert_eq!(
        parse_args(argv("--port 300")).err().unwrap(),
        "--port: out of range"
    );
    assert_eq!(
        parse_args(argv("--bogus")).err().unwrap(),
        "unknown option --bogus"
    );
    assert_eq!(parse_args(argv("--count 0")).unwrap().count, 1);
}

#[test]
fn loopback_arguments() {
    let a = parse_args(argv("--loopback rxe0")).unwrap();
    assert!(a.loopback);
    let o = loopback_options(&a, "rxe0");
    assert_eq!(
        (o.gid_index, o.port, o.samples, o.numa_node),
        (1, 1, 20, None)
    );
    assert_eq!(o.sizes, vec![1, 262_144]);
    let a = parse_args(argv(
        "--loopback --gid-index 3 --port 2 --count 50 --numa-node 1 --sizes 1,4096,65536 mlx5_0",
    ))
    .unwrap();
    let o = loopback_options(&a, "mlx5_0");
    assert_eq!(
        (o.gid_index, o.port, o.samples, o.numa_node),
        (3, 2, 50, Some(1))
    );
    assert_eq!(o.sizes, vec![1, 4096, 65_536]);
    o.validate().unwrap();
    assert_eq!(
        parse_args(argv("--sizes 1,x")).err().unwrap(),
        "--sizes: \"1,x\" is not a list of byte counts"
    );
    assert_eq!(
        parse_args(argv("--numa-node -1")).err().unwrap(),
        "--numa-node: \"-1\" is not a number"
    );
}

#[test]
fn loopback_table() {
    use rpingmesh_verbs::rdma::loopback::VerbTiming;
    let r = LoopbackResult {
        device: "rxe0".into(),
        numa_node: Some(0),
        gpu: None,
        gid: "::ffff:198.18.9.1".parse().unwrap(),
        qpn: 17,
        per_size: vec![
            (1, vec![3_000, 2_000, 4_000]),
            (262_144, vec![22_971, 22_971, 50_000]),
        ],
        verbs: vec![
            VerbTiming {
                verb: "ibv_create_qp",
                micros: 12.34,
            },
            VerbTiming {
                verb: "ibv_modify_qp(RTS)",
                micros: 5.0,
            },
        ],
    };
    let want = "\
== rxe0 loopback: RC QP 17 -> itself, GID ::ffff:198.18.9.1, memory bound to NUMA node 0
       size_B samples       min_ns    median_ns       max_ns
            1       3         2000         3000         4000
       262144       3        22971        22971        50000
   Eq.2 T_proc + Lat_host (1 B median): 3.00 us
   Eq.3 BW_host: 105.009 Gb/s = 8*(262144-1) bits / (22971-3000) ns
   verbs: ibv_create_qp 12.3 us, ibv_modify_qp(RTS) 5.0 us
";
    assert_eq!(format_loopback(&r), want);
    let mut slow = r.clone();
    slow.per_size[1].1 = vec![1_000];
    slow.numa_node = None;
    let s = format_loopback(&slow);
    assert!(s.contains("memory on the default NUMA policy"), "{s}");
    assert!(
        s.contains("Eq.3 BW_host: none (262144 B median 1000 ns is not above 1 B median 3000 ns)"),
        "{s}"
    );
    slow.per_size.truncate(1);
    assert!(format_loopback(&slow).contains("Eq.3 BW_host: needs two sizes"));
    slow.numa_node = Some(1);
    slow.gpu = Some("0000:3b:00.0".into());
    assert!(format_loopback(&slow).contains(
        "read region in host memory bound to NUMA node 1, write region on GPU 0000:3b:00.0"
    ));
}

/// The binary's first step on this machine: the device list fails with the one line.
#[test]
fn no_devices_line() {
    if let Err(e) = rdma::list_devices(&[]) {
        let s = e.to_string();
        assert!(
            s.starts_with("no RDMA devices: ") && s.ends_with("; use transport: udp"),
            "{s}"
        );
    }
}
