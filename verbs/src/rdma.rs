//! The `rdma` transport. The real backend (rdma-sys, UD QPs, NIC completion timestamps)
//! is a later issue; until then selecting it fails with one clear error.

use crate::VerbsError;

/// An opened RDMA device endpoint (no backend in this build).
#[derive(Debug)]
pub struct RdmaEndpoint {
    _private: (),
}

/// Opens RDMA device `device_name`. Always `VerbsError::RdmaNotBuilt` in this build.
pub fn open_rdma(device_name: &str) -> Result<RdmaEndpoint, VerbsError> {
    let _ = device_name;
    Err(VerbsError::RdmaNotBuilt)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reports_not_built() {
        let e = super::open_rdma("mlx5_0").unwrap_err();
        assert!(matches!(e, crate::VerbsError::RdmaNotBuilt));
        assert!(e.to_string().contains("use transport: udp"));
    }
}
