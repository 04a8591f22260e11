//! Tests of `loopback.rs`.

use super::*;

#[test]
fn defaults_are_the_papers() {
    let o = LoopbackOptions::new("rxe0");
    o.validate().unwrap();
    assert_eq!(o.sizes, vec![1, 262_144]);
    assert_eq!((o.port, o.gid_index, o.samples), (1, 1, 20));
    assert_eq!(o.region_len(), 262_144);
}

#[test]
fn option_validation_names_the_key() {
    let ok = LoopbackOptions::new("mlx5_0");
    type Mutate = Box<dyn Fn(&mut LoopbackOptions)>;
    let cases: Vec<(Mutate, &str)> = vec![
        (
            Box::new(|o| o.device.clear()),
            "rdma config: loopback: device name is empty",
        ),
        (
            Box::new(|o| o.port = 0),
            "rdma config: loopback: port=0 is invalid (ports are numbered from 1)",
        ),
        (
            Box::new(|o| o.gpu = Some("3b:00.0".into())),
            "rdma config: loopback: GPU \"3b:00.0\" is not a PCI address like 0000:3b:00.0",
        ),
        (
            Box::new(|o| o.gid_index = 300),
            "rdma config: loopback: gid_index=300 is out of range 0-255",
        ),
        (
            Box::new(|o| o.sizes.clear()),
            "rdma config: loopback: no message sizes",
        ),
        (
            Box::new(|o| o.sizes = vec![1, 0]),
            "rdma config: loopback: size 0 is out of range 1-1073741824",
        ),
        (
            Box::new(|o| o.sizes = vec![(1 << 30) + 1]),
            "rdma config: loopback: size 1073741825 is out of range 1-1073741824",
        ),
        (
            Box::new(|o| o.samples = 0),
            "rdma config: loopback: samples=0 must be at least 1",
        ),
        (
            Box::new(|o| o.numa_node = Some(1024)),
            "rdma config: loopback: numa_node=1024 is out of range 0-1023",
        ),
        (
            Box::new(|o| o.timeout = Duration::ZERO),
            "rdma config: loopback: timeout=0 must be positive",
        ),
    ];
    for (mutate, want) in cases {
        let mut o = ok.clone();
        mutate(&mut o);
        assert_eq!(o.validate().unwrap_err().to_string(), want);
    }
    let mut o = ok.clone();
    o.numa_node = Some(1023);
    o.sizes = vec![4096, 1, 1 << 30];
    o.validate().unwrap();
    assert_eq!(o.region_len(), 1 << 30);
}

#[test]
fn summaries_and_median() {
    assert_eq!(SizeSummary::of(1, &[]), None);
    let s = SizeSummary::of(1, &[30, 10, 20]).unwrap();
    assert_eq!(
        (s.samples, s.min_ns, s.median_ns, s.max_ns),
        (3, 10, 20.0, 30)
    );
    let s = SizeSummary::of(8, &[40, 10, 20, 30]).unwrap();
    assert_eq!((s.size, s.median_ns), (8, 25.0));
    let s = SizeSummary::of(8, &[7]).unwrap();
    assert_eq!((s.min_ns, s.median_ns, s.max_ns), (7, 7.0, 7));
}

#[test]
fn eq3_bandwidth() {
    let small = SizeSummary::of(1, &[2_000]).unwrap();
    let large = SizeSummary::of(262_144, &[2_000 + 20_971]).unwrap();
    // 8 * 262143 bits in 20971 ns = 100 Gb/s.
    let bw = bandwidth_gbps(&small, &large).unwrap();
    assert!((bw - 100.0).abs() < 0.01, "{bw}");
    // The large write was not slower, or the sizes are not increasing: no bandwidth.
    assert_eq!(bandwidth_gbps(&small, &small), None);
    assert_eq!(bandwidth_gbps(&large, &small), None);
    let fast = SizeSummary::of(262_144, &[1_000]).unwrap();
    assert_eq!(bandwidth_gbps(&small, &fast), None);

    let r = LoopbackResult {
        device: "rxe0".into(),
        numa_node: None,
        gpu: None,
        gid: Ipv6Addr::UNSPECIFIED,
        qpn: 17,
        // Listed large first: the smallest and largest sizes are found by size.
        per_size: vec![
            (262_144, vec![22_971, 40_000, 22_971]),
            (1, vec![2_000, 1_000, 3_000]),
            (7, vec![]),
        ],
        verbs: vec![],
    };
    let s = r.summaries();
    assert_eq!(s.len(), 2);
    assert_eq!((s[0].size, s[0].median_ns), (262_144, 22_971.0));
    assert!((r.bandwidth_gbps().unwrap() - 100.0).abs() < 0.01);
}

#[test]
fn patterns_never_zero_and_differ_by_seed() {
    let a = pattern(0, 4096);
    let b = pattern(1, 4096);
    assert_eq!(a.len(), 4096);
    assert!(a.iter().chain(&b).all(|&x| x != 0));
    assert!(a.iter().zip(&b).all(|(x, y)| x != y));
    assert_eq!(pattern(3, 1), vec![22]);
    assert_eq!(first_mismatch(&a, &a), None);
    let mut c = a.clone();
    c[4000] ^= 0xff;
    assert_eq!(first_mismatch(&a, &c), Some(4000));
    assert_eq!(first_mismatch(&a, &a[..10]), Some(10));
    assert_eq!(first_mismatch(&a, &vec![0; 4096]), Some(0));
}
