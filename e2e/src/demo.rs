//! The demo's layout, said once: `cargo xtask demo` runs it on the host's loopback and
//! the operator-surface test runs the same layout inside a network namespace.

use std::net::Ipv4Addr;

/// N agents (one pseudo-RNIC each, 127.0.1.1, 127.0.1.2, ...) over T ToRs.
#[derive(Debug, Clone, Copy)]
pub struct DemoLayout {
    pub agents: usize,
    pub tors: usize,
    /// The agents' analysis window (a matrix cell's refresh period).
    pub window_sec: u64,
}

/// Every agent's /metrics port (each agent has its own loopback address).
pub const AGENT_METRICS_PORT: u16 = 9464;
/// The demo's UDP probe port.
pub const DEMO_PROBE_PORT: u16 = 18515;

impl DemoLayout {
    pub const DEFAULT: DemoLayout = DemoLayout {
        agents: 8,
        tors: 2,
        window_sec: 5,
    };

    pub fn agent_id(&self, i: usize) -> String {
        format!("agent-{}", i + 1)
    }

    pub fn agent_ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(127, 0, 1, i as u8 + 1)
    }

    /// ToR of agent `i` (0-based): contiguous blocks, as racks are.
    pub fn tor_of(&self, i: usize) -> String {
        format!("tor-{}", i * self.tors / self.agents + 1)
    }

    pub fn agent_metrics_addr(&self, i: usize) -> String {
        format!("{}:{AGENT_METRICS_PORT}", self.agent_ip(i))
    }

    /// The controller's flags: gRPC on `listen`, the web page on `http`, /metrics on
    /// `metrics` (Prometheus exporter).
    pub fn controller_args(
        &self,
        listen: &str,
        db: &str,
        http: &str,
        metrics: &str,
    ) -> Vec<String> {
        [
            "--listen-addr",
            listen,
            "--database-uri",
            db,
            "--http-listen-addr",
            http,
            "--metrics-enabled",
            "true",
            "--metrics-exporter",
            "prometheus",
            "--prometheus-listen-addr",
            metrics,
            // 5 s windows: localize each 2 s after it ends, not the default 10.
            "--analyzer-localize-settle-sec",
            "2",
            "--log-level",
            "info",
        ]
        .map(String::from)
        .to_vec()
    }

    /// Agent `i`'s flags (probing over udp on its loopback address).
    pub fn agent_args(&self, i: usize, controller: &str) -> Vec<String> {
        let (id, tor, ip) = (
            self.agent_id(i),
            self.tor_of(i),
            self.agent_ip(i).to_string(),
        );
        let window = self.window_sec.to_string();
        let metrics = self.agent_metrics_addr(i);
        let port = DEMO_PROBE_PORT.to_string();
        [
            "--agent-id",
            &id,
            // One pseudo-host per agent: the localizer names RNICs `<host>/<device>`.
            "--hostname",
            &id,
            "--tor-id",
            &tor,
            "--controller-addr",
            controller,
            "--udp-addresses",
            &ip,
            "--udp-port",
            &port,
            "--transport",
            "udp",
            "--analysis-window-sec",
            &window,
            "--probe-interval-ms",
            "100",
            "--tor-mesh-probe-rate-per-second",
            "10",
            "--inter-tor-probe-rate-per-second",
            "5",
            "--pinglist-update-interval-sec",
            "10",
            "--metrics-enabled",
            "true",
            "--metrics-exporter",
            "prometheus",
            "--prometheus-listen-addr",
            &metrics,
            "--self-protection-enabled",
            "true",
            "--log-level",
            "info",
        ]
        .map(String::from)
        .to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tors_are_contiguous_and_balanced() {
        let l = DemoLayout::DEFAULT;
        let tors: Vec<String> = (0..8).map(|i| l.tor_of(i)).collect();
        assert_eq!(
            tors,
            ["tor-1", "tor-1", "tor-1", "tor-1", "tor-2", "tor-2", "tor-2", "tor-2"]
        );
        let l = DemoLayout {
            agents: 5,
            tors: 3,
            window_sec: 5,
        };
        let tors: Vec<String> = (0..5).map(|i| l.tor_of(i)).collect();
        assert_eq!(tors, ["tor-1", "tor-1", "tor-2", "tor-2", "tor-3"]);
    }

    #[test]
    fn agents_get_their_own_address_and_metrics_port() {
        let l = DemoLayout::DEFAULT;
        let a = l.agent_args(2, "127.0.0.1:50051");
        let at = |f: &str| a[a.iter().position(|x| x == f).unwrap() + 1].clone();
        assert_eq!(at("--udp-addresses"), "127.0.1.3");
        assert_eq!(at("--prometheus-listen-addr"), "127.0.1.3:9464");
        assert_eq!(at("--agent-id"), "agent-3");
    }
}
