//! gRPC client of the controller's `ControllerService`: lazy connection, timeouts, TLS.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{
    AgentRegistrationRequest, HostHealthAck, HostHealthReport, PathSummary, PingTarget,
    PinglistRequest, PinglistType, ProbeAnalysisAck, ProbeAnalysisReport, RnicInfo, ServiceFlowAck,
    ServiceFlowReport,
};
use rpingmesh_protocol::PinglistKind;
use tonic::transport::{Channel, Endpoint};

use crate::config::{AgentConfig, TlsMode};

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
pub const RPC_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("controller RPC failed: {}: {}", .0.code(), .0.message())]
    Rpc(tonic::Status),
    #[error("controller rejected the registration: {0}")]
    Rejected(String),
}

impl ControllerError {
    /// The controller does not know this agent (it restarted and lost its registry).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ControllerError::Rpc(s) if s.code() == tonic::Code::NotFound)
    }

    /// The controller does not have this rpingmesh addition (a Go controller answers
    /// UNIMPLEMENTED for an unknown RPC and INVALID_ARGUMENT for an unknown pinglist type).
    pub fn is_unsupported(&self) -> bool {
        matches!(self, ControllerError::Rpc(s)
            if matches!(s.code(), tonic::Code::Unimplemented | tonic::Code::InvalidArgument))
    }
}

/// `host:port` gets `http://` (or `https://` with TLS); an explicit scheme is kept.
pub fn controller_uri(addr: &str, tls: bool) -> String {
    rpingmesh_proto::endpoint::grpc_uri(addr, tls)
}

/// One RNIC as registered: what `RnicInfo` carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalRnic {
    pub gid: std::net::Ipv6Addr,
    pub qpn: u32,
    pub ip_address: String,
    pub device_name: String,
}

/// The registration of this agent with all of its RNICs (GIDs in full form).
pub fn registration_request(cfg: &AgentConfig, rnics: &[LocalRnic]) -> AgentRegistrationRequest {
    AgentRegistrationRequest {
        agent_id: cfg.agent_id.clone(),
        agent_ip: rnics
            .first()
            .map(|r| r.ip_address.clone())
            .unwrap_or_default(),
        hostname: cfg.hostname.clone(),
        tor_id: cfg.tor_id.clone(),
        rnics: rnics
            .iter()
            .map(|r| RnicInfo {
                gid: rpingmesh_proto::gid::format_gid(&r.gid),
                qpn: r.qpn,
                ip_address: r.ip_address.clone(),
                host_name: cfg.hostname.clone(),
                tor_id: cfg.tor_of(&r.device_name).to_string(),
                device_name: r.device_name.clone(),
            })
            .collect(),
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
    }
}

/// The controller's list type of `kind`; None for Host, which the agent makes itself.
pub fn pinglist_type(kind: PinglistKind) -> Option<PinglistType> {
    match kind {
        PinglistKind::TorMesh => Some(PinglistType::TorMesh),
        PinglistKind::InterTor => Some(PinglistType::InterTor),
        PinglistKind::Service => Some(PinglistType::Service),
        PinglistKind::Focus => Some(PinglistType::Focus),
        PinglistKind::Host => None,
    }
}

/// The controller's client. `controller_addr` may name several replicas (comma
/// separated): calls go to the one that last answered, and move on to the next when it
/// cannot be reached (UNAVAILABLE, a deadline, a cancelled call), so an agent whose
/// controller dies carries on with another within its next call.
#[derive(Clone)]
pub struct ControllerClient {
    replicas: Arc<[(String, ControllerServiceClient<Channel>)]>,
    current: Arc<AtomicUsize>,
    addr: String,
}

/// The replicas named by `controller_addr`, in order (empty parts ignored).
pub fn controller_addrs(addr: &str) -> Vec<String> {
    addr.split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(String::from)
        .collect()
}

/// Whether a failed call should be tried on the next replica: the controller could not
/// be reached or did not answer, as opposed to answering with an error.
pub fn fails_over(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
    )
}

impl ControllerClient {
    /// Builds the channels without connecting: the first RPC connects (and reconnects
    /// after failures), so an unreachable controller never blocks agent start.
    pub fn connect_lazy(cfg: &AgentConfig) -> anyhow::Result<Self> {
        let tls = cfg.tls_mode != TlsMode::Disabled;
        let addrs = controller_addrs(&cfg.controller_addr);
        if addrs.is_empty() {
            anyhow::bail!("controller_addr is empty");
        }
        let mut replicas = Vec::with_capacity(addrs.len());
        for a in addrs {
            let uri = controller_uri(&a, tls);
            let mut ep = Endpoint::from_shared(uri.clone())
                .map_err(|e| anyhow::anyhow!("controller_addr {a:?} is not a valid address: {e}"))?
                .connect_timeout(CONNECT_TIMEOUT)
                .timeout(RPC_TIMEOUT)
                .tcp_nodelay(true);
            if tls {
                let tls_cfg = rpingmesh_proto::endpoint::client_tls_config(
                    cfg.tls_mode == TlsMode::Mtls,
                    &cfg.tls_ca_file,
                    &cfg.tls_cert_file,
                    &cfg.tls_key_file,
                    &cfg.tls_server_name,
                )
                .map_err(|e| anyhow::anyhow!(e))?;
                ep = ep.tls_config(tls_cfg).map_err(|e| {
                    anyhow::anyhow!("tls_mode {:?}: bad TLS setup: {e}", cfg.tls_mode)
                })?;
            }
            replicas.push((a, ControllerServiceClient::new(ep.connect_lazy())));
        }
        Ok(ControllerClient {
            replicas: replicas.into(),
            current: Arc::new(AtomicUsize::new(0)),
            addr: cfg.controller_addr.clone(),
        })
    }

    /// Runs `f` with a copy of `req` on the current replica, then on each next one while
    /// they cannot be reached; the one that answers becomes current.
    async fn call<R: Clone, T, F, Fut>(&self, req: R, f: F) -> Result<T, ControllerError>
    where
        F: Fn(ControllerServiceClient<Channel>, R) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let n = self.replicas.len();
        let start = self.current.load(Ordering::Relaxed) % n;
        let mut last = None;
        for k in 0..n {
            let i = (start + k) % n;
            match f(self.replicas[i].1.clone(), req.clone()).await {
                Ok(r) => {
                    if i != start
                        && self
                            .current
                            .compare_exchange(start, i, Ordering::Relaxed, Ordering::Relaxed)
                            .is_ok()
                    {
                        tracing::warn!(
                            from = %self.replicas[start].0,
                            to = %self.replicas[i].0,
                            "controller unreachable; failed over to another replica"
                        );
                    }
                    return Ok(r.into_inner());
                }
                Err(s) if fails_over(&s) && k + 1 < n => last = Some(s),
                Err(s) => return Err(ControllerError::Rpc(s)),
            }
        }
        Err(ControllerError::Rpc(last.expect("at least one replica")))
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Registers; returns the heartbeat interval the controller asks for (0 = none given,
    /// as from a Go controller).
    pub async fn register(&self, req: AgentRegistrationRequest) -> Result<u32, ControllerError> {
        let resp = self
            .call(req, |mut c, r| async move { c.register_agent(r).await })
            .await?;
        if resp.success {
            Ok(resp.heartbeat_interval_sec)
        } else {
            Err(ControllerError::Rejected(resp.message))
        }
    }

    pub async fn get_pinglist(
        &self,
        agent_id: &str,
        tor_id: &str,
        requester_gid: &str,
        kind: PinglistKind,
    ) -> Result<Vec<PingTarget>, ControllerError> {
        let ty = pinglist_type(kind).ok_or_else(|| {
            ControllerError::Rpc(tonic::Status::invalid_argument(
                "Host pinglists are made by the agent, not fetched",
            ))
        })?;
        let req = PinglistRequest {
            agent_id: agent_id.to_string(),
            tor_id: tor_id.to_string(),
            requester_gid: requester_gid.to_string(),
            r#type: ty as i32,
        };
        let resp = self
            .call(req, |mut c, r| async move { c.get_pinglist(r).await })
            .await?;
        Ok(resp.targets)
    }

    pub async fn report_service_flows(
        &self,
        report: ServiceFlowReport,
    ) -> Result<ServiceFlowAck, ControllerError> {
        self.call(
            report,
            |mut c, r| async move { c.report_service_flows(r).await },
        )
        .await
    }

    /// Sends a Hostping report of this host.
    pub async fn report_host_health(
        &self,
        report: HostHealthReport,
    ) -> Result<HostHealthAck, ControllerError> {
        self.call(
            report,
            |mut c, r| async move { c.report_host_health(r).await },
        )
        .await
    }

    /// An empty report the controller answers once it has localized the window starting
    /// at `window_start_unix_ns` (adaptive probing: the ack's FOCUS generation follows it).
    pub async fn await_window(
        &self,
        agent_id: &str,
        window_start_unix_ns: u64,
    ) -> Result<ProbeAnalysisAck, ControllerError> {
        let req = ProbeAnalysisReport {
            agent_id: agent_id.to_string(),
            summaries: Vec::new(),
            await_window_unix_ns: window_start_unix_ns,
        };
        self.call(
            req,
            |mut c, r| async move { c.report_probe_analysis(r).await },
        )
        .await
    }

    pub async fn report(
        &self,
        agent_id: &str,
        summaries: Vec<PathSummary>,
    ) -> Result<ProbeAnalysisAck, ControllerError> {
        let req = ProbeAnalysisReport {
            agent_id: agent_id.to_string(),
            summaries,
            ..Default::default()
        };
        self.call(
            req,
            |mut c, r| async move { c.report_probe_analysis(r).await },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_gets_a_scheme_only_when_missing() {
        assert_eq!(
            controller_uri("localhost:50051", false),
            "http://localhost:50051"
        );
        assert_eq!(
            controller_uri("10.0.0.1:50051", true),
            "https://10.0.0.1:50051"
        );
        assert_eq!(controller_uri("http://c:1", true), "http://c:1");
    }

    #[test]
    fn registration_carries_every_rnic_in_full_gid_form() {
        let cfg = AgentConfig {
            agent_id: "a1".into(),
            hostname: "h1".into(),
            tor_id: "tor-1".into(),
            ..AgentConfig::default()
        };
        let rnics = vec![
            LocalRnic {
                gid: "127.0.0.1"
                    .parse::<std::net::Ipv4Addr>()
                    .unwrap()
                    .to_ipv6_mapped(),
                qpn: 18515,
                ip_address: "127.0.0.1".into(),
                device_name: "udp0".into(),
            },
            LocalRnic {
                gid: "fe80::2".parse().unwrap(),
                qpn: 18516,
                ip_address: "fe80::2".into(),
                device_name: "udp1".into(),
            },
        ];
        let r = registration_request(&cfg, &rnics);
        assert_eq!(r.agent_id, "a1");
        assert_eq!(r.agent_ip, "127.0.0.1");
        assert_eq!(r.hostname, "h1");
        assert_eq!(r.tor_id, "tor-1");
        assert_eq!(r.rnics.len(), 2);
        assert_eq!(r.rnics[0].gid, "0000:0000:0000:0000:0000:ffff:7f00:0001");
        assert_eq!(r.rnics[0].qpn, 18515);
        assert_eq!(r.rnics[1].gid, "fe80:0000:0000:0000:0000:0000:0000:0002");
        assert_eq!(r.rnics[1].device_name, "udp1");
        assert_eq!(r.rnics[1].host_name, "h1");
        assert_eq!(r.rnics[1].tor_id, "tor-1");
    }

    #[tokio::test]
    async fn bad_address_is_a_clear_error() {
        let cfg = AgentConfig {
            tor_id: "t".into(),
            controller_addr: "bad addr with spaces".into(),
            ..AgentConfig::default()
        };
        let e = ControllerClient::connect_lazy(&cfg)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("controller_addr"), "{e}");
    }
}
