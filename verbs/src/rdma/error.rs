//! Every failure of the rdma backend, each rendered as one line that names the culprit.
//! Wrapped by `VerbsError::Rdma` so the agent prints it as is.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    /// `ibv_get_device_list` returned NULL (e.g. ENOSYS: no RDMA in the kernel) or an
    /// empty list, or /sys/class/infiniband is empty.
    #[error("no RDMA devices: {reason}; use transport: udp")]
    NoDevices { reason: String },
    /// rdma-core's library cannot be opened: not installed, or too old to have a symbol
    /// we call.
    #[error("cannot load {soname}: {reason}; install {package} or use transport: udp")]
    Library {
        soname: &'static str,
        package: &'static str,
        reason: String,
    },
    /// Devices exist but none passes `allowed_device_names`.
    #[error("no RDMA devices: none of [{}] matches allowed_device_names [{}]; use transport: udp", found.join(", "), allowed.join(", "))]
    NoAllowedDevice {
        allowed: Vec<String>,
        found: Vec<String>,
    },
    /// The spec's exact wording: device, port and GID table size.
    #[error("gid_index={gid_index} is invalid or not present on device {device} port {port} (GID table size {table_size})")]
    InvalidGidIndex {
        gid_index: u32,
        device: String,
        port: u32,
        table_size: u32,
    },
    #[error("device {device} has no port {port} (ports present: [{}])", present.iter().map(u32::to_string).collect::<Vec<_>>().join(", "))]
    NoSuchPort {
        device: String,
        port: u32,
        present: Vec<u32>,
    },
    #[error(
        "device {device} port {port} is {state}, not ACTIVE (check the link and `rdma link show`)"
    )]
    PortNotActive {
        device: String,
        port: u32,
        state: String,
    },
    /// A sysfs file that exists but cannot be read or parsed.
    #[error("sysfs {}: {reason}", path.display())]
    Sysfs { path: PathBuf, reason: String },
    /// A verbs call failed.
    #[error("rdma device {device}: {call} failed: {source}")]
    Verbs {
        device: String,
        call: &'static str,
        source: std::io::Error,
    },
    /// A work completion with an error status: the QP is (or is being put) in the error
    /// state and must be re-created.
    #[error("rdma device {device}: QP {qpn} is in the error state ({reason})")]
    QpError {
        device: String,
        qpn: u32,
        reason: String,
    },
    /// The device went away (fatal async event, or polling its CQ fails).
    #[error("rdma device {device}: device lost ({reason})")]
    DeviceLost { device: String, reason: String },
    /// The loopback test (an RC QP writing to itself) failed: no completion in time, data
    /// that did not arrive, memory that could not be placed.
    #[error("rdma device {device}: loopback: {reason}")]
    Loopback { device: String, reason: String },
    /// Configuration values the backend cannot use.
    #[error("rdma config: {0}")]
    Config(String),
    /// GPU memory for a loopback test: no driver, no such GPU, no memory.
    #[error("{0}")]
    Gpu(#[from] super::gpu::GpuError),
}

impl RdmaError {
    /// True when the endpoint must be dropped and re-opened (with back-off).
    pub fn needs_reopen(&self) -> bool {
        matches!(
            self,
            RdmaError::QpError { .. }
                | RdmaError::DeviceLost { .. }
                | RdmaError::PortNotActive { .. }
        )
    }
}

impl From<RdmaError> for std::io::Error {
    fn from(e: RdmaError) -> Self {
        match e {
            RdmaError::Verbs {
                source,
                device,
                call,
            } => std::io::Error::new(
                source.kind(),
                format!("rdma device {device}: {call} failed: {source}"),
            ),
            other => std::io::Error::other(other.to_string()),
        }
    }
}

/// The reason text for a NULL `ibv_get_device_list`, from its errno.
pub fn device_list_null_reason(errno: i32) -> String {
    match errno {
        libc::ENOSYS => {
            "ibv_get_device_list: the kernel has no RDMA support (ENOSYS: Function not implemented)"
                .to_string()
        }
        libc::EPERM | libc::EACCES => format!(
            "ibv_get_device_list: permission denied ({}); check access to /dev/infiniband",
            std::io::Error::from_raw_os_error(errno)
        ),
        0 => "ibv_get_device_list returned NULL".to_string(),
        e => format!(
            "ibv_get_device_list: {}",
            std::io::Error::from_raw_os_error(e)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_clear_line() {
        let cases: Vec<(RdmaError, &str)> = vec![
            (
                RdmaError::NoDevices { reason: device_list_null_reason(libc::ENOSYS) },
                "no RDMA devices: ibv_get_device_list: the kernel has no RDMA support (ENOSYS: Function not implemented); use transport: udp",
            ),
            (
                RdmaError::NoDevices { reason: "ibv_get_device_list returned an empty list".into() },
                "no RDMA devices: ibv_get_device_list returned an empty list; use transport: udp",
            ),
            (
                RdmaError::NoAllowedDevice { allowed: vec!["mlx5_9".into()], found: vec!["mlx5_0".into(), "mlx5_1".into()] },
                "no RDMA devices: none of [mlx5_0, mlx5_1] matches allowed_device_names [mlx5_9]; use transport: udp",
            ),
            (
                RdmaError::InvalidGidIndex { gid_index: 100, device: "mlx5_0".into(), port: 1, table_size: 3 },
                "gid_index=100 is invalid or not present on device mlx5_0 port 1 (GID table size 3)",
            ),
            (
                RdmaError::NoSuchPort { device: "mlx5_0".into(), port: 2, present: vec![1] },
                "device mlx5_0 has no port 2 (ports present: [1])",
            ),
            (
                RdmaError::PortNotActive { device: "rxe0".into(), port: 1, state: "DOWN".into() },
                "device rxe0 port 1 is DOWN, not ACTIVE (check the link and `rdma link show`)",
            ),
            (
                RdmaError::Sysfs { path: "/sys/class/infiniband/mlx5_0/ports/1/state".into(), reason: "unrecognised port state \"x\"".into() },
                "sysfs /sys/class/infiniband/mlx5_0/ports/1/state: unrecognised port state \"x\"",
            ),
            (
                RdmaError::Verbs { device: "mlx5_0".into(), call: "ibv_create_qp", source: std::io::Error::from_raw_os_error(libc::ENOMEM) },
                "rdma device mlx5_0: ibv_create_qp failed: Cannot allocate memory (os error 12)",
            ),
            (
                RdmaError::QpError { device: "mlx5_0".into(), qpn: 0x1a2, reason: "send completion status 12 (IBV_WC_RETRY_EXC_ERR)".into() },
                "rdma device mlx5_0: QP 418 is in the error state (send completion status 12 (IBV_WC_RETRY_EXC_ERR))",
            ),
            (
                RdmaError::DeviceLost { device: "mlx5_0".into(), reason: "IBV_EVENT_DEVICE_FATAL".into() },
                "rdma device mlx5_0: device lost (IBV_EVENT_DEVICE_FATAL)",
            ),
            (
                RdmaError::Loopback { device: "rxe0".into(), reason: "RDMA WRITE of 1 B (sample 0) not completed within 2s".into() },
                "rdma device rxe0: loopback: RDMA WRITE of 1 B (sample 0) not completed within 2s",
            ),
            (RdmaError::Config("recv_buffers=0 must be at least 1".into()), "rdma config: recv_buffers=0 must be at least 1"),
        ];
        for (e, want) in cases {
            let got = e.to_string();
            assert_eq!(got, want);
            assert!(!got.contains('\n'));
        }
    }

    #[test]
    fn null_reasons() {
        assert!(device_list_null_reason(libc::EACCES).contains("/dev/infiniband"));
        assert_eq!(
            device_list_null_reason(0),
            "ibv_get_device_list returned NULL"
        );
        assert!(device_list_null_reason(libc::EIO).starts_with("ibv_get_device_list: "));
    }

    #[test]
    fn reopen_classification() {
        assert!(RdmaError::DeviceLost {
            device: "d".into(),
            reason: "r".into()
        }
        .needs_reopen());
        assert!(RdmaError::QpError {
            device: "d".into(),
            qpn: 1,
            reason: "r".into()
        }
        .needs_reopen());
        assert!(!RdmaError::NoDevices { reason: "r".into() }.needs_reopen());
        assert!(!RdmaError::InvalidGidIndex {
            gid_index: 1,
            device: "d".into(),
            port: 1,
            table_size: 1
        }
        .needs_reopen());
    }

    #[test]
    fn into_io_error_keeps_kind_and_text() {
        let e: std::io::Error = RdmaError::Verbs {
            device: "d".into(),
            call: "ibv_post_send",
            source: std::io::Error::from(std::io::ErrorKind::WouldBlock),
        }
        .into();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        assert!(e
            .to_string()
            .starts_with("rdma device d: ibv_post_send failed"));
    }
}
