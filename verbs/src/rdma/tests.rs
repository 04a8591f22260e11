//! Tests of `rdma`.

use super::*;

#[cfg(not(feature = "rdma"))]
#[test]
fn reports_not_built() {
    let e = open_rdma("mlx5_0").unwrap_err();
    assert!(matches!(e, VerbsError::RdmaNotBuilt));
    assert!(e.to_string().contains("use transport: udp"));
    assert!(matches!(list_devices(&[]), Err(VerbsError::RdmaNotBuilt)));
}

#[test]
fn device_selection() {
    let found = vec![
        "mlx5_0".to_string(),
        "mlx5_1".to_string(),
        "rxe0".to_string(),
    ];
    assert_eq!(select_devices(&found, &[]).unwrap(), found);
    assert_eq!(
        select_devices(&found, &["rxe0".into(), "mlx5_0".into(), "gone".into()]).unwrap(),
        vec!["mlx5_0".to_string(), "rxe0".to_string()]
    );
    assert_eq!(
            select_devices(&found, &["mlx5_7".into()]).unwrap_err().to_string(),
            "no RDMA devices: none of [mlx5_0, mlx5_1, rxe0] matches allowed_device_names [mlx5_7]; use transport: udp"
        );
    assert_eq!(
        select_devices(&[], &[]).unwrap_err().to_string(),
        "no RDMA devices: ibv_get_device_list returned an empty list; use transport: udp"
    );
}

#[test]
fn option_validation_names_the_key() {
    let ok = RdmaOptions::new("mlx5_0");
    ok.validate().unwrap();
    type Mutate = Box<dyn Fn(&mut RdmaOptions)>;
    let cases: Vec<(Mutate, &str)> = vec![
        (
            Box::new(|o| o.device_name.clear()),
            "rdma config: device name is empty",
        ),
        (
            Box::new(|o| o.port = 0),
            "rdma config: port=0 is invalid (ports are numbered from 1)",
        ),
        (
            Box::new(|o| o.gid_index = 256),
            "rdma config: gid_index=256 is out of range 0-255",
        ),
        (
            Box::new(|o| o.service_level = 16),
            "rdma config: service_level=16 is out of range 0-15",
        ),
        (
            Box::new(|o| o.recv_buffers = 0),
            "rdma config: recv_buffers=0 must be 1-65536",
        ),
        (
            Box::new(|o| o.send_queue_depth = 100_000),
            "rdma config: send_queue_depth=100000 must be 1-65536",
        ),
        (
            Box::new(|o| o.event_ring_capacity = 0),
            "rdma config: event_ring_capacity=0 must be at least 1",
        ),
    ];
    for (mutate, want) in cases {
        let mut o = ok.clone();
        mutate(&mut o);
        assert_eq!(o.validate().unwrap_err().to_string(), want);
    }
}

#[test]
fn backoff_doubles_caps_and_resets() {
    let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(700));
    let ds: Vec<u128> = (0..6).map(|_| b.next_delay().as_millis()).collect();
    assert_eq!(ds, vec![100, 200, 400, 700, 700, 700]);
    assert_eq!(b.attempts(), 6);
    b.reset();
    assert_eq!(b.next_delay(), Duration::from_millis(100));
}

#[test]
fn verbs_error_wraps_rdma_errors_verbatim() {
    let e: VerbsError = RdmaError::NoDevices { reason: "x".into() }.into();
    assert_eq!(e.to_string(), "no RDMA devices: x; use transport: udp");
}
