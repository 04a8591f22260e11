//! The data path: a transport carries 40-byte probe packets between "RNICs" and reports the
//! completion timestamps the protocol needs (send completion = T2/T4, receive completion
//! = T3/T5). Backends: `udp` (kernel SO_TIMESTAMPING software timestamps) and `rdma`
//! (its own issue; selecting it fails with one clear line until then).
//!
//! CONTRACT: public signatures here are what `agent` codes against.

pub mod clock;
pub mod rdma;
pub mod udp;

use std::net::Ipv6Addr;

/// Address of a probe endpoint: GID (IPv6, or v4-mapped for IPv4) + QPN.
/// For `udp`, QPN is the UDP port the endpoint's socket is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub gid: Ipv6Addr,
    pub qpn: u32,
}

/// Per-send path parameters (flow label selects the ECMP path on IPv6 / RoCEv2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendParams {
    pub flow_label: u32,
    pub traffic_class: u8,
    pub service_level: u8,
}

/// Identifies one send for its completion timestamp.
pub type SendId = u32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportEvent {
    /// A datagram arrived; `rx_ts_ns` is its receive completion timestamp (transport clock).
    Received {
        from: Endpoint,
        len: usize,
        data: [u8; 64],
        rx_ts_ns: Option<u64>,
    },
    /// Send completion timestamp (transport clock) of send `id`.
    Sent { id: SendId, tx_ts_ns: u64 },
}

#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    #[error("transport rdma is not available in this build: rebuild with the `rdma` feature on an RDMA host, or use transport: udp")]
    RdmaNotBuilt,
    #[error("udp transport: cannot bind {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("udp transport: {what}: {source}")]
    Socket {
        what: &'static str,
        source: std::io::Error,
    },
    /// A failure of the rdma backend (its message is one line, e.g. "no RDMA devices: ...").
    #[error(transparent)]
    Rdma(#[from] rdma::RdmaError),
}

/// Which backend an agent runs on; chosen by the `transport` config key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    Udp,
    Rdma,
}
