//! UD-like endpoint over UDP. T2..T5 are kernel software timestamps (SO_TIMESTAMPING,
//! CLOCK_REALTIME); TX timestamps come back on the socket error queue keyed by OPT_ID.

use std::net::SocketAddr;

use crate::{Endpoint, SendId, SendParams, TransportEvent, VerbsError};

pub struct UdpEndpoint {
    _private: (),
}

impl UdpEndpoint {
    /// Binds one endpoint (one "RNIC"). Port 0 picks a free port. IPv4 addresses are
    /// bound as IPv4 and shown as v4-mapped GIDs. Must be called inside a tokio runtime.
    pub fn bind(addr: SocketAddr, device_name: &str) -> Result<Self, VerbsError> {
        todo!()
    }
    pub fn local(&self) -> Endpoint {
        todo!()
    }
    pub fn device_name(&self) -> &str {
        todo!()
    }
    /// The IP address the endpoint is bound to, as text (for RnicInfo.ip_address).
    pub fn ip_string(&self) -> String {
        todo!()
    }
    /// Sends one datagram; returns the id its send-completion event will carry.
    /// On IPv6 the flow label (and traffic class) is set per send.
    pub fn send(&self, to: &Endpoint, params: &SendParams, payload: &[u8]) -> std::io::Result<SendId> {
        todo!()
    }
    /// Waits until at least one event is available, then appends everything ready
    /// (received datagrams and send completions) to `out`.
    pub async fn wait_events(&self, out: &mut Vec<TransportEvent>) -> std::io::Result<()> {
        todo!()
    }
    /// Non-blocking: appends whatever is ready now.
    pub fn poll_events(&self, out: &mut Vec<TransportEvent>) -> std::io::Result<()> {
        todo!()
    }
}
