//! Tests of `endpoint.rs`.

use super::*;

/// No RDMA device here: opening fails with the clear line (on an RDMA host without
/// a device of this name, with the allowed-names line).
#[test]
fn open_fails_with_the_clear_line() {
    let e = crate::rdma::open_rdma("mlx5_0").unwrap_err().to_string();
    assert!(
        e.starts_with("no RDMA devices: ") && e.ends_with("; use transport: udp"),
        "{e}"
    );
    assert!(!e.contains('\n'));
    let e = list_devices(&["nosuch".into()]).unwrap_err().to_string();
    assert!(e.starts_with("no RDMA devices: "), "{e}");
}

#[test]
fn send_depth_rounds_down_to_a_power_of_two() {
    assert_eq!(pow2_floor(1), 1);
    assert_eq!(pow2_floor(256), 256);
    assert_eq!(pow2_floor(300), 256);
    assert_eq!(pow2_floor(u32::MAX), 1 << 31);
    assert_eq!(pow2_floor(0), 1);
}

#[test]
fn invalid_options_fail_before_touching_the_device() {
    let mut o = RdmaOptions::new("mlx5_0");
    o.gid_index = 300;
    let e = crate::rdma::open_rdma_with(&o).unwrap_err().to_string();
    assert_eq!(e, "rdma config: gid_index=300 is out of range 0-255");
}
