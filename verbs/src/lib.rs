//! The data path: a transport carries 40-byte probe packets between "RNICs" and reports the
//! completion timestamps the protocol needs (send completion = T2/T4, receive completion
//! = T3/T5). Backends: `udp` (kernel SO_TIMESTAMPING software timestamps) and `rdma`
//! (UD QPs with NIC completion timestamps, behind the `rdma` cargo feature; without it,
//! opening fails with one clear line).

pub mod clock;
pub mod rdma;
mod sockaddr;
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
        /// The flow label the datagram arrived with, where the transport sees it (rdma
        /// over IPv6 GRHs); the responder's ACKs echo it so they take the probe's path.
        flow_label: Option<u32>,
    },
    /// Send completion timestamp (transport clock) of send `id`.
    Sent { id: SendId, tx_ts_ns: u64 },
    /// Send `id` was accepted but never went out (rdma: no address handle could be made
    /// for its destination, or its completion carried an error status).
    SendFailed { id: SendId },
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

/// One RNIC's endpoint on either backend, dispatched statically (a match per call, no
/// trait object on the hot path). The agent's per-RNIC driver owns one.
pub enum Transport {
    Udp(udp::UdpEndpoint),
    Rdma(rdma::RdmaEndpoint),
}

impl From<udp::UdpEndpoint> for Transport {
    fn from(ep: udp::UdpEndpoint) -> Self {
        Transport::Udp(ep)
    }
}

impl From<rdma::RdmaEndpoint> for Transport {
    fn from(ep: rdma::RdmaEndpoint) -> Self {
        Transport::Rdma(ep)
    }
}

impl Transport {
    pub fn kind(&self) -> TransportKind {
        match self {
            Transport::Udp(_) => TransportKind::Udp,
            Transport::Rdma(_) => TransportKind::Rdma,
        }
    }

    pub fn local(&self) -> Endpoint {
        match self {
            Transport::Udp(e) => e.local(),
            Transport::Rdma(e) => e.local(),
        }
    }

    pub fn device_name(&self) -> &str {
        match self {
            Transport::Udp(e) => e.device_name(),
            Transport::Rdma(e) => e.device_name(),
        }
    }

    /// The address for RnicInfo.ip_address.
    pub fn ip_string(&self) -> String {
        match self {
            Transport::Udp(e) => e.ip_string(),
            Transport::Rdma(e) => e.ip_string(),
        }
    }

    /// A send whose completion timestamp is wanted (T2, T4): returns its id.
    #[inline]
    pub fn send(
        &self,
        to: &Endpoint,
        params: &SendParams,
        payload: &[u8],
    ) -> std::io::Result<SendId> {
        match self {
            Transport::Udp(e) => e.send(to, params, payload),
            Transport::Rdma(e) => e.send(to, params, payload),
        }
    }

    /// Sends a batch of timed datagrams (`send` for each, in order), one result each
    /// appended to `out`. udp hands a round to the kernel in one sendmmsg; rdma posts
    /// them one by one.
    pub fn send_batch<P: AsRef<[u8]>>(
        &self,
        batch: &[(Endpoint, SendParams, P)],
        out: &mut Vec<std::io::Result<SendId>>,
    ) {
        match self {
            Transport::Udp(e) => e.send_batch(batch, out),
            Transport::Rdma(e) => {
                for (to, params, payload) in batch {
                    out.push(e.send(to, params, payload.as_ref()));
                }
            }
        }
    }

    /// A send whose completion nobody awaits. On rdma every send completes anyway (its
    /// slot is reused only after completion); the `Sent` event is then just unmatched.
    #[inline]
    pub fn send_untimed(
        &self,
        to: &Endpoint,
        params: &SendParams,
        payload: &[u8],
    ) -> std::io::Result<()> {
        match self {
            Transport::Udp(e) => e.send_untimed(to, params, payload),
            Transport::Rdma(e) => e.send(to, params, payload).map(drop),
        }
    }

    pub async fn wait_events(&self, out: &mut Vec<TransportEvent>) -> std::io::Result<()> {
        match self {
            Transport::Udp(e) => e.wait_events(out).await,
            Transport::Rdma(e) => e.wait_events(out).await,
        }
    }

    pub fn poll_events(&self, out: &mut Vec<TransportEvent>) -> std::io::Result<()> {
        match self {
            Transport::Udp(e) => e.poll_events(out),
            Transport::Rdma(e) => e.poll_events(out),
        }
    }

    /// Send completions queued now (udp: the error queue only; rdma: everything queued,
    /// which costs no syscall).
    pub fn poll_completions(&self, out: &mut Vec<TransportEvent>) -> std::io::Result<()> {
        match self {
            Transport::Udp(e) => e.poll_completions(out),
            Transport::Rdma(e) => e.poll_events(out),
        }
    }

    /// Room for `paths` distinct paths (rdma: address handles; udp needs none).
    pub fn reserve_paths(&self, paths: usize) {
        if let Transport::Rdma(e) = self {
            e.reserve_paths(paths);
        }
    }

    /// A probe on this path was lost (rdma: its address handle is made again).
    pub fn note_loss(&self, to: &Endpoint, params: &SendParams) {
        if let Transport::Rdma(e) = self {
            e.note_loss(to, params);
        }
    }

    /// Counters of the rdma backend (None for udp).
    pub fn rdma_stats(&self) -> Option<rdma::RdmaStats> {
        match self {
            Transport::Udp(_) => None,
            Transport::Rdma(e) => Some(e.stats()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn transport_dispatches_to_udp() {
        let a: Transport = udp::UdpEndpoint::bind("127.0.0.1:0".parse().unwrap(), "u0")
            .unwrap()
            .into();
        let b: Transport = udp::UdpEndpoint::bind("127.0.0.1:0".parse().unwrap(), "u1")
            .unwrap()
            .into();
        assert_eq!(a.kind(), TransportKind::Udp);
        assert_eq!(a.device_name(), "u0");
        assert_eq!(a.ip_string(), "127.0.0.1");
        assert!(a.rdma_stats().is_none());
        let p = SendParams::default();
        let id = a.send(&b.local(), &p, b"timed").unwrap();
        a.send_untimed(&b.local(), &p, b"untimed").unwrap();
        let mut got = Vec::new();
        while got.len() < 2 {
            tokio::time::timeout(std::time::Duration::from_secs(5), b.wait_events(&mut got))
                .await
                .expect("timeout")
                .unwrap();
        }
        let mut done = Vec::new();
        a.poll_completions(&mut done).unwrap();
        assert!(
            matches!(done.as_slice(), [TransportEvent::Sent { id: i, .. }] if *i == id),
            "exactly the timed send completes: {done:?}"
        );
    }
}
