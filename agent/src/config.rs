//! Agent configuration: every key of the Go agent plus rpingmesh's own, layered
//! YAML file (--config) < `RPINGMESH_<KEY>` environment < CLI flags.
//!
//! Unknown YAML keys are errors; `validate` reports the first bad key in one line.

use std::path::Path;

use figment::providers::{Format, Serialized};
use figment::Figment;
use rpingmesh_config_table::{config_table, env_dict, NamedDict};
use rpingmesh_metrics_export::Exporter;
use serde::{Deserialize, Deserializer, Serialize};

pub const ENV_PREFIX: &str = "RPINGMESH_";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    Disabled,
    Tls,
    Mtls,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Udp,
    Rdma,
}

/// How service QPs are traced (`service_tracing_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceTracingMode {
    /// kprobes when the kernel has the ib_uverbs symbols, else libibverbs uprobes.
    Auto,
    Kprobe,
    Uprobe,
    Off,
}

impl ServiceTracingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceTracingMode::Auto => "auto",
            ServiceTracingMode::Kprobe => "kprobe",
            ServiceTracingMode::Uprobe => "uprobe",
            ServiceTracingMode::Off => "off",
        }
    }
}

config_table! {
    #[serde(default, deny_unknown_fields)]
    pub struct AgentConfig;
    #[command(
        name = "rpingmesh-agent",
        version,
        about = "rpingmesh agent: probes RNICs with the 6-timestamp protocol and reports to the controller"
    )]
    pub struct CliArgs;
    keys {
        /// Unique agent id (default: the hostname).
        #[serde(deserialize_with = "lenient_string")]
        agent_id: String = local_hostname(), flag String;
        /// Reported at registration (default: this host's name).
        #[serde(deserialize_with = "lenient_string")]
        hostname: String = local_hostname(), flag String;
        /// ToR switch of this host (required).
        #[serde(deserialize_with = "lenient_string")]
        tor_id: String = String::new(), flag String;
        /// Controller gRPC address; several replicas comma-separated (calls fail over in order).
        #[serde(deserialize_with = "lenient_string")]
        controller_addr: String = "localhost:50051".into(), flag String;
        /// One probe per target per round of this length.
        probe_interval_ms: u64 = 500, flag u64;
        /// Per-target cap, inherited by a per-type cap left at 0.
        target_probe_rate_per_second: f64 = 10.0, flag f64;
        /// 0 = inherit target_probe_rate_per_second.
        tor_mesh_probe_rate_per_second: f64 = 0.0, flag f64;
        /// 0 = inherit target_probe_rate_per_second.
        inter_tor_probe_rate_per_second: f64 = 0.0, flag f64;
        /// Pinglist refresh period.
        pinglist_update_interval_sec: u64 = 300, flag u64;
        /// Period of the rotating 20% of each target's flow labels.
        flow_label_rotation_period_sec: u64 = 3600, flag u64;
        /// Signed so that a negative value is reported as out of range, not as a type error.
        #[arg(allow_negative_numbers = true)]
        gid_index: i64 = 0, flag i64;
        /// SL and GRH traffic class of every probe.
        #[arg(allow_negative_numbers = true)]
        service_level: i64 = 0, flag i64;
        /// SL and GRH traffic class of every probe.
        #[arg(allow_negative_numbers = true)]
        traffic_class: i64 = 0, flag i64;
        /// RDMA device filter (empty = all).
        #[serde(deserialize_with = "string_list")]
        #[arg(value_delimiter = ',')]
        allowed_device_names: Vec<String> = Vec::new(), flag Vec<String>;
        /// RDMA device -> ToR of that rail (rail-optimized fabrics); others use `tor_id`.
        /// `device=tor,device2=tor2`
        #[serde(deserialize_with = "string_map")]
        device_tor_ids: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new(), flag String;
        /// OTLP metrics export.
        metrics_enabled: bool = true, flag bool;
        /// OTLP/gRPC endpoint.
        #[serde(deserialize_with = "lenient_string")]
        otel_collector_addr: String = "localhost:4317".into(), flag String;
        /// Report per-path window summaries to the controller.
        analysis_report_enabled: bool = true, flag bool;
        /// Aggregation window.
        analysis_window_sec: u64 = 30, flag u64;
        /// Opt-in watchdog: under CPU or memory pressure it steps every prober's rate down 1.0 -> 0.5 -> 0.25 -> 0.1 (one step per interval, never to 0: fail-slow, not fail-closed) and back up once usage falls below 75% of the threshold.
        self_protection_enabled: bool = false, flag bool;
        /// Watchdog sampling period (CPU from /proc/self/stat, RSS from /proc/self/statm).
        watchdog_interval_sec: u64 = 5, flag u64;
        /// Memory budget and the fraction of it where throttling engages (0 = no memory throttling; unlike Go's GOMEMLIMIT, no runtime limit is installed).
        max_memory_mb: u64 = 0, flag u64;
        /// Caps the agent's runtime worker threads (0 = default, 2).
        max_procs: u64 = 0, flag u64;
        /// Memory budget and the fraction of it where throttling engages (0 = no memory throttling; unlike Go's GOMEMLIMIT, no runtime limit is installed).
        throttle_memory_ratio: f64 = 0.9, flag f64;
        /// CPU threshold, % of the cores the agent may use (`max_procs`, else all).
        throttle_cpu_percent: f64 = 90.0, flag f64;
        /// Debug, info, warn, error.
        #[serde(deserialize_with = "lenient_string")]
        log_level: String = "info".into(), flag String;
        /// Disabled, tls, mtls.
        #[arg(value_parser = ["disabled", "tls", "mtls"])]
        tls_mode: TlsMode = TlsMode::Disabled, flag String;
        /// Client certificate (PEM), for mtls.
        #[serde(deserialize_with = "lenient_string")]
        tls_cert_file: String = String::new(), flag String;
        /// Client private key (PEM), for mtls.
        #[serde(deserialize_with = "lenient_string")]
        tls_key_file: String = String::new(), flag String;
        /// CA certificate (PEM) the controller's certificate must chain to (tls, mtls).
        #[serde(deserialize_with = "lenient_string")]
        tls_ca_file: String = String::new(), flag String;
        /// Name to check the controller's certificate against (default: the address's host).
        #[serde(deserialize_with = "lenient_string")]
        tls_server_name: String = String::new(), flag String;
        /// `udp` (kernel-timestamped UDP) or `rdma` (UD QPs on RoCE NICs; needs a build with `--features rdma`; on a host without RDMA the agent exits with one line: `no RDMA devices: ...; use transport: udp`).
        #[arg(value_parser = ["udp", "rdma"])]
        transport: Transport = Transport::Udp, flag String;
        /// One pseudo-RNIC per address (device names udp0, udp1, ...).
        #[serde(deserialize_with = "string_list")]
        #[arg(value_delimiter = ',')]
        udp_addresses: Vec<String> = vec!["127.0.0.1".into()], flag Vec<String>;
        /// 0 = an ephemeral port per address.
        udp_port: u16 = 18515, flag u16;
        /// A probe without ACKs after this is lost.
        probe_timeout_ms: u64 = 1000, flag u64;
        /// OTLP export period.
        metrics_export_interval_ms: u64 = 10_000, flag u64;
        /// Where metrics go when metrics_enabled: otlp (push), prometheus (/metrics) or both.
        /// otlp | prometheus | both.
        metrics_exporter: String = "otlp".into(), flag String;
        /// Address of the Prometheus `/metrics` endpoint (exporter prometheus or both).
        prometheus_listen_addr: String = ":9464".into(), flag String;
        /// Register and answer probes, send none.
        responder_only: bool = false, flag bool;
        /// PathSummaries per ReportProbeAnalysis call.
        report_batch_max: usize = 256, flag usize;
        /// `auto` (kprobes on ib_uverbs when the kernel has them, else uprobes on libibverbs), `kprobe`, `uprobe`, `off`.
        #[arg(value_parser = ["auto", "kprobe", "uprobe", "off"])]
        service_tracing_mode: ServiceTracingMode = ServiceTracingMode::Auto, flag String;
        /// 0 = inherit target_probe_rate_per_second.
        service_probe_rate_per_second: f64 = 0.0, flag f64;
        /// Per-target probes/s of FOCUS targets: the extra probes the controller asks for through a component it suspects (adaptive probing; each due every 1/rate s). 0 = none.
        focus_probe_rate_per_second: f64 = 20.0, flag f64;
        /// Extra binaries or libraries (absolute paths) to attach the libibverbs uprobes to.
        #[serde(deserialize_with = "string_list")]
        #[arg(value_delimiter = ',')]
        service_tracing_uprobe_targets: Vec<String> = Vec::new(), flag Vec<String>;
        /// The kubelet's root directory: a traced QP in a Kubernetes pod is named after the pod's namespace and name from `pods/<UID>/` there (else after the pod's UID).
        workload_kubelet_dir: String = "/var/lib/kubelet".to_string(), flag String;
        /// Slurm's `scontrol`, asked once per job for its name ("" = never).
        workload_scontrol: String = "scontrol".to_string(), flag String;
        /// Process name (comm) -> configured service name, for QPs outside any job, pod, container or unit.
        /// `comm=name,comm2=name2`
        #[serde(deserialize_with = "string_map")]
        service_names: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new(), flag String;
        /// Distinct `service` metric attribute values; beyond it the value is "other".
        max_service_names: usize = 32, flag usize;
        /// How often pending service-flow changes are reported (an empty heartbeat goes out every 30 s).
        service_flow_report_interval_ms: u64 = 1000, flag u64;
        /// Hostping inside the running agent: R2R probing between this host's RNICs, the RNIC counter monitor, and the host check (PCIe links, port states, loopback tests).
        hostping_enabled: bool = true, flag bool;
        /// Each RNIC probes one other RNIC of the host this often (the paper: 100 ms).
        hostping_r2r_interval_ms: u64 = 100, flag u64;
        /// An R2R probe without ACKs after this is a timeout (the paper: 500 ms).
        hostping_r2r_timeout_ms: u64 = 500, flag u64;
        /// R2R outcomes are judged per window (the paper: 20 s).
        hostping_r2r_window_sec: u64 = 20, flag u64;
        /// An RNIC whose R2R timeout rate is over this has a network problem (Timeout_th).
        hostping_timeout_th: f64 = 0.1, flag f64;
        /// RNIC counters (throughput, Tx pause, drops) are sampled this often.
        hostping_monitor_interval_ms: u64 = 1000, flag u64;
        /// The host check (tree, PCIe links, ports, loopback tests) runs this often, and at once when the host turns idle or abnormal.
        hostping_check_interval_sec: u64 = 300, flag u64;
        /// The host is idle below this share of line rate (Thp_low): loopback tests cover every RNIC x memory endpoint.
        hostping_thp_low: f64 = 0.05, flag f64;
        /// The host is abnormal over this Tx pause ratio (PFC_high): loopback tests cover the affinitive endpoints only.
        hostping_pfc_high: f64 = 0.03, flag f64;
        /// A loopback path this far below its affinitive peers is abnormal (Abnormal_th).
        hostping_abnormal_th: f64 = 0.2, flag f64;
        /// A link this busy is congested, not failed (Util_high).
        hostping_util_high: f64 = 0.9, flag f64;
        /// Run the loopback tests (rdma transport only: an RC QP connected to itself per RNIC x endpoint).
        hostping_loopback_enabled: bool = true, flag bool;
        /// Loopback writes per message size and path.
        hostping_loopback_samples: u32 = 20, flag u32;
        /// Pinglists whose targets are also probed over polled RC write rings (rdma transport): any of `service`, `tor_mesh`, `inter_tor`; empty = off.
        #[serde(deserialize_with = "string_list")]
        #[arg(value_delimiter = ',')]
        rc_ring_pinglists: Vec<String> = vec!["service".into()], flag Vec<String>;
        /// RDMA-CM port of every RNIC's ring listener (peers connect their rings here).
        rc_ring_port: u16 = 18517, flag u16;
        /// Inbound ring size per peer in bytes: floor(size / 256) slots (depth-one probes need 2).
        rc_ring_budget_bytes: usize = 4096, flag usize;
        /// Rings this agent opens to targets, and accepts from peers, at most (each way).
        rc_ring_max_rings: usize = 64, flag usize;
        /// Each ring's target is probed this often.
        rc_ring_probe_interval_ms: u64 = 1000, flag u64;
        /// A ring probe without an echo after this is lost.
        rc_ring_probe_timeout_ms: u64 = 500, flag u64;
        /// The prober polls its ring continuously this long after a probe, then every 100 ms (the CPU budget per probe).
        rc_ring_hot_wait_us: u64 = 1000, flag u64;
        /// The responder polls continuously from this long before a probe its peer announced (and as long after, at least 1 ms).
        rc_ring_poll_lead_us: u64 = 200, flag u64;
        /// Rings' RC ACK timeout exponent: 4.096 us x 2^N per try, and a silent peer's ring closes after 7 tries (0: the RDMA-CM's default, from the path's packet lifetime; 14 is 67 ms a try).
        rc_ring_ack_timeout_exp: u8 = 0, flag u8;
    }
}

/// A configuration error: one line, naming the key (or file) at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn err(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
}

impl AgentConfig {
    /// Layers defaults < YAML file < `RPINGMESH_*` variables of `env` < CLI flags, then
    /// validates. `env` is passed in (not read from the process) so tests stay hermetic.
    /// The ToR of the RNIC on `device`: its `device_tor_ids` entry, else `tor_id`.
    pub fn tor_of(&self, device: &str) -> &str {
        self.device_tor_ids
            .get(device)
            .map_or(self.tor_id.as_str(), String::as_str)
    }

    pub fn load_from(cli: &CliArgs, env: &[(String, String)]) -> Result<Self, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(AgentConfig::default()));
        // Without --config, agent.yaml in ., $HOME/.rpingmesh, /etc/rpingmesh (as Go).
        let home = env
            .iter()
            .find(|(k, _)| k == "HOME")
            .map(|(_, v)| v.as_str());
        let file = cli.config.clone().or_else(|| {
            rpingmesh_proto::host::find_config(
                "agent.yaml",
                &rpingmesh_proto::host::config_search_path(home),
            )
        });
        if let Some(path) = &file {
            if !path.is_file() {
                return Err(err(format!(
                    "config file {} does not exist or is not a file",
                    path.display()
                )));
            }
            fig = fig.merge(serde_saphyr::figment::Yaml::file_exact(path));
        }
        // Only known keys: the controller's RPINGMESH_* variables may share the environment.
        fig = fig.merge(NamedDict {
            name: "environment (RPINGMESH_*)",
            dict: env_dict(ENV_PREFIX, KEYS, env),
        });
        fig = fig.merge(Serialized::defaults(cli));
        Self::finish(fig, file.as_deref())
    }

    /// `load_from`'s layering and checks over YAML text instead of a file, without
    /// environment or flags (fuzzing and tests).
    pub fn from_yaml_str(text: &str) -> Result<Self, ConfigError> {
        let fig = Figment::from(Serialized::defaults(AgentConfig::default()))
            .merge(serde_saphyr::figment::Yaml::string(text));
        Self::finish(fig, None)
    }

    /// Extracts the layered config, fills the hostname defaults, validates.
    fn finish(fig: Figment, file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut cfg: AgentConfig = fig.extract().map_err(|e| figment_error(e, file))?;
        // As in Go: an empty hostname is detected, an empty agent_id is the hostname.
        if cfg.hostname.trim().is_empty() {
            cfg.hostname = local_hostname();
        }
        if cfg.agent_id.trim().is_empty() {
            cfg.agent_id = cfg.hostname.clone();
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// `load_from` with the process environment.
    pub fn load(cli: &CliArgs) -> Result<Self, ConfigError> {
        let env: Vec<(String, String)> = std::env::vars().collect();
        Self::load_from(cli, &env)
    }

    /// Checks every key; the first problem found is returned, naming its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.tor_id.trim().is_empty() {
            return Err(err(
                "tor_id is required (set tor_id in the config file, RPINGMESH_TOR_ID, or --tor-id)",
            ));
        }
        if self.agent_id.trim().is_empty() {
            return Err(err("agent_id must not be empty (default: the hostname)"));
        }
        if self.controller_addr.trim().is_empty() {
            return Err(err(
                "controller_addr must not be empty (e.g. localhost:50051)",
            ));
        }
        if self.probe_interval_ms == 0 {
            return Err(err("probe_interval_ms must be > 0"));
        }
        for (key, v, zero_ok) in [
            (
                "target_probe_rate_per_second",
                self.target_probe_rate_per_second,
                false,
            ),
            (
                "tor_mesh_probe_rate_per_second",
                self.tor_mesh_probe_rate_per_second,
                true,
            ),
            (
                "inter_tor_probe_rate_per_second",
                self.inter_tor_probe_rate_per_second,
                true,
            ),
            (
                "service_probe_rate_per_second",
                self.service_probe_rate_per_second,
                true,
            ),
        ] {
            if !v.is_finite() || v < 0.0 || (!zero_ok && v == 0.0) {
                let want = if zero_ok {
                    ">= 0 (0 = inherit target_probe_rate_per_second)"
                } else {
                    "> 0"
                };
                return Err(err(format!("{key} must be {want}, got {v}")));
            }
        }
        let f = self.focus_probe_rate_per_second;
        if !f.is_finite() || !(0.0..=1000.0).contains(&f) {
            return Err(err(format!(
                "focus_probe_rate_per_second must be in [0, 1000] (0 = no FOCUS probes), got {f}"
            )));
        }
        if self.pinglist_update_interval_sec == 0 {
            return Err(err("pinglist_update_interval_sec must be > 0"));
        }
        if !(0..=255).contains(&self.gid_index) {
            return Err(err(format!(
                "gid_index must be in 0..=255, got {}",
                self.gid_index
            )));
        }
        if !(0..=7).contains(&self.service_level) {
            return Err(err(format!(
                "service_level must be in 0..=7, got {}",
                self.service_level
            )));
        }
        if !(0..=255).contains(&self.traffic_class) {
            return Err(err(format!(
                "traffic_class must be in 0..=255, got {}",
                self.traffic_class
            )));
        }
        let exporter = self.exporter()?;
        if self.metrics_enabled && exporter.prometheus() {
            self.prometheus_socket_addr()?;
        }
        if self.metrics_enabled && exporter.otlp() && self.otel_collector_addr.trim().is_empty() {
            return Err(err(
                "otel_collector_addr must not be empty when metrics_enabled is true",
            ));
        }
        if self.analysis_window_sec == 0 {
            return Err(err("analysis_window_sec must be > 0"));
        }
        if self.watchdog_interval_sec == 0 {
            return Err(err("watchdog_interval_sec must be > 0"));
        }
        if !(self.throttle_memory_ratio > 0.0 && self.throttle_memory_ratio <= 1.0) {
            return Err(err(format!(
                "throttle_memory_ratio must be in (0, 1], got {}",
                self.throttle_memory_ratio
            )));
        }
        if !(self.throttle_cpu_percent > 0.0 && self.throttle_cpu_percent <= 100.0) {
            return Err(err(format!(
                "throttle_cpu_percent must be in (0, 100], got {}",
                self.throttle_cpu_percent
            )));
        }
        if !matches!(self.log_level.as_str(), "debug" | "info" | "warn" | "error") {
            return Err(err(format!(
                "log_level must be one of debug, info, warn, error, got {:?}",
                self.log_level
            )));
        }
        self.validate_tls()?;
        if self.transport == Transport::Udp {
            if self.udp_addresses.is_empty() {
                return Err(err("udp_addresses must list at least one local IP address"));
            }
            for a in &self.udp_addresses {
                if a.parse::<std::net::IpAddr>().is_err() {
                    return Err(err(format!("udp_addresses: {a:?} is not an IP address")));
                }
            }
        }
        if self.probe_timeout_ms == 0 {
            return Err(err("probe_timeout_ms must be > 0"));
        }
        if self.metrics_export_interval_ms == 0 {
            return Err(err("metrics_export_interval_ms must be > 0"));
        }
        if self.report_batch_max == 0 {
            return Err(err("report_batch_max must be > 0"));
        }
        self.validate_service()?;
        self.validate_hostping()?;
        self.validate_rc_ring()
    }

    /// The pinglist kinds `rc_ring_pinglists` names (validated).
    pub fn rc_ring_kinds(&self) -> Vec<rpingmesh_protocol::PinglistKind> {
        use rpingmesh_protocol::PinglistKind;
        self.rc_ring_pinglists
            .iter()
            .filter_map(|k| match k.as_str() {
                "service" => Some(PinglistKind::Service),
                "tor_mesh" => Some(PinglistKind::TorMesh),
                "inter_tor" => Some(PinglistKind::InterTor),
                _ => None,
            })
            .collect()
    }

    fn validate_rc_ring(&self) -> Result<(), ConfigError> {
        for k in &self.rc_ring_pinglists {
            if !matches!(k.as_str(), "service" | "tor_mesh" | "inter_tor") {
                return Err(err(format!(
                    "rc_ring_pinglists: {k:?} is not a pinglist (service, tor_mesh, inter_tor)"
                )));
            }
        }
        if self.rc_ring_port == 0 {
            return Err(err("rc_ring_port must be > 0"));
        }
        if self.rc_ring_ack_timeout_exp > 31 {
            return Err(err(format!(
                "rc_ring_ack_timeout_exp must be in 0..=31 (0: the RDMA-CM's default), got {}",
                self.rc_ring_ack_timeout_exp
            )));
        }
        if !(512..=16 << 20).contains(&self.rc_ring_budget_bytes) {
            return Err(err(format!(
                "rc_ring_budget_bytes must be in 512..=16777216 (at least 2 slots of 256 bytes), got {}",
                self.rc_ring_budget_bytes
            )));
        }
        if !(1..=4096).contains(&self.rc_ring_max_rings) {
            return Err(err(format!(
                "rc_ring_max_rings must be in 1..=4096, got {}",
                self.rc_ring_max_rings
            )));
        }
        if !(10..=3_600_000).contains(&self.rc_ring_probe_interval_ms) {
            return Err(err(format!(
                "rc_ring_probe_interval_ms must be in 10..=3600000, got {}",
                self.rc_ring_probe_interval_ms
            )));
        }
        if self.rc_ring_probe_timeout_ms == 0
            || self.rc_ring_probe_timeout_ms > self.rc_ring_probe_interval_ms
        {
            return Err(err(format!(
                "rc_ring_probe_timeout_ms must be in 1..=rc_ring_probe_interval_ms ({}), got {}",
                self.rc_ring_probe_interval_ms, self.rc_ring_probe_timeout_ms
            )));
        }
        for (key, v) in [
            ("rc_ring_hot_wait_us", self.rc_ring_hot_wait_us),
            ("rc_ring_poll_lead_us", self.rc_ring_poll_lead_us),
        ] {
            if !(1..=1_000_000).contains(&v) {
                return Err(err(format!("{key} must be in 1..=1000000, got {v}")));
            }
        }
        Ok(())
    }

    fn validate_hostping(&self) -> Result<(), ConfigError> {
        for (key, v, max) in [
            (
                "hostping_r2r_interval_ms",
                self.hostping_r2r_interval_ms,
                60_000,
            ),
            (
                "hostping_r2r_timeout_ms",
                self.hostping_r2r_timeout_ms,
                60_000,
            ),
            (
                "hostping_r2r_window_sec",
                self.hostping_r2r_window_sec,
                3600,
            ),
            (
                "hostping_monitor_interval_ms",
                self.hostping_monitor_interval_ms,
                60_000,
            ),
            (
                "hostping_check_interval_sec",
                self.hostping_check_interval_sec,
                86_400,
            ),
            (
                "hostping_loopback_samples",
                u64::from(self.hostping_loopback_samples),
                10_000,
            ),
        ] {
            if !(1..=max).contains(&v) {
                return Err(err(format!("{key} must be in 1..={max}, got {v}")));
            }
        }
        for (key, v) in [
            ("hostping_timeout_th", self.hostping_timeout_th),
            ("hostping_thp_low", self.hostping_thp_low),
            ("hostping_pfc_high", self.hostping_pfc_high),
            ("hostping_abnormal_th", self.hostping_abnormal_th),
            ("hostping_util_high", self.hostping_util_high),
        ] {
            if !(v > 0.0 && v < 1.0) {
                return Err(err(format!("{key} must be in (0, 1), got {v}")));
            }
        }
        Ok(())
    }

    pub fn exporter(&self) -> Result<Exporter, ConfigError> {
        Exporter::parse(&self.metrics_exporter).ok_or_else(|| {
            err(format!(
                "metrics_exporter must be {}, got {:?}",
                Exporter::CHOICES,
                self.metrics_exporter
            ))
        })
    }

    pub fn prometheus_socket_addr(&self) -> Result<std::net::SocketAddr, ConfigError> {
        rpingmesh_metrics_export::parse_listen_addr(&self.prometheus_listen_addr)
            .map_err(|m| err(format!("prometheus_listen_addr: {m}")))
    }

    fn validate_service(&self) -> Result<(), ConfigError> {
        for t in &self.service_tracing_uprobe_targets {
            if !Path::new(t).is_absolute() {
                return Err(err(format!(
                    "service_tracing_uprobe_targets: {t:?} is not an absolute path"
                )));
            }
        }
        for (dev, tor) in &self.device_tor_ids {
            if dev.trim().is_empty() || tor.trim().is_empty() {
                return Err(err(format!(
                    "device_tor_ids: entry {dev:?} -> {tor:?} needs a non-empty device name and ToR id"
                )));
            }
        }
        for (comm, name) in &self.service_names {
            if comm.trim().is_empty() || name.trim().is_empty() {
                return Err(err(format!(
                    "service_names: entry {comm:?} -> {name:?} needs a non-empty process name and service name"
                )));
            }
        }
        if self.max_service_names == 0 {
            return Err(err("max_service_names must be > 0"));
        }
        if !(1..=60_000).contains(&self.service_flow_report_interval_ms) {
            return Err(err(format!(
                "service_flow_report_interval_ms must be in 1..=60000 (the controller expires flows of agents silent for 120 s), got {}",
                self.service_flow_report_interval_ms
            )));
        }
        Ok(())
    }

    fn validate_tls(&self) -> Result<(), ConfigError> {
        let need = |key: &str, v: &str| -> Result<(), ConfigError> {
            if v.is_empty() {
                return Err(err(format!(
                    "{key} is required when tls_mode is {}",
                    self.tls_mode_str()
                )));
            }
            if !Path::new(v).is_file() {
                return Err(err(format!("{key}: file {v} does not exist")));
            }
            Ok(())
        };
        match self.tls_mode {
            TlsMode::Disabled => Ok(()),
            TlsMode::Tls => need("tls_ca_file", &self.tls_ca_file),
            TlsMode::Mtls => {
                need("tls_ca_file", &self.tls_ca_file)?;
                need("tls_cert_file", &self.tls_cert_file)?;
                need("tls_key_file", &self.tls_key_file)
            }
        }
    }

    fn tls_mode_str(&self) -> &'static str {
        match self.tls_mode {
            TlsMode::Disabled => "disabled",
            TlsMode::Tls => "tls",
            TlsMode::Mtls => "mtls",
        }
    }

    /// Effective per-target rate of ToR-mesh targets (0 inherits the uniform rate).
    pub fn tor_mesh_rate(&self) -> f64 {
        inherit(
            self.tor_mesh_probe_rate_per_second,
            self.target_probe_rate_per_second,
        )
    }

    /// Effective per-target rate of inter-ToR targets (0 inherits the uniform rate).
    pub fn inter_tor_rate(&self) -> f64 {
        inherit(
            self.inter_tor_probe_rate_per_second,
            self.target_probe_rate_per_second,
        )
    }
}

impl AgentConfig {
    /// Effective per-target rate of SERVICE targets (0 inherits the uniform rate).
    pub fn service_rate(&self) -> f64 {
        inherit(
            self.service_probe_rate_per_second,
            self.target_probe_rate_per_second,
        )
    }
}

fn inherit(v: f64, fallback: f64) -> f64 {
    if v > 0.0 {
        v
    } else {
        fallback
    }
}

fn figment_error(e: figment::Error, file: Option<&Path>) -> ConfigError {
    use figment::error::Kind;
    let source = match (&e.metadata, file) {
        (Some(md), _) => match &md.source {
            Some(src) => format!("{} {src}", md.name),
            None => md.name.to_string(),
        },
        (None, Some(f)) => format!("YAML file {}", f.display()),
        (None, None) => "configuration".to_string(),
    };
    let key = e.path.join(".");
    match &e.kind {
        Kind::UnknownField(field, _) => {
            ConfigError(format!("unknown config key `{field}` in {source}"))
        }
        Kind::Message(m) if key.is_empty() => ConfigError(format!("{source}: {}", one_line(m))),
        _ if key.is_empty() => ConfigError(format!("{source}: {}", one_line(&e.kind.to_string()))),
        kind => ConfigError(format!(
            "config key `{key}` in {source}: {}",
            one_line(&kind.to_string())
        )),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Strings that YAML or the environment may have typed as numbers or booleans
/// (`tor_id: 1`) are taken as their text.
fn lenient_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    d.deserialize_any(LenientString)
}

struct LenientString;

impl<'de> serde::de::Visitor<'de> for LenientString {
    type Value = String;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<String, E> {
        Ok(String::new())
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<String, E> {
        Ok(String::new())
    }
}

/// A list given as a sequence, or as one comma-separated string (env: `a,b`).
fn string_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    d.deserialize_any(StringList)
}

struct StringList;

impl<'de> serde::de::Visitor<'de> for StringList {
    type Value = Vec<String>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of strings or a comma-separated string")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Vec<String>, E> {
        Ok(v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Vec<String>, E> {
        Ok(Vec::new())
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Vec<String>, E> {
        Ok(Vec::new())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
        struct Item(String);
        impl<'de> Deserialize<'de> for Item {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                lenient_string(d).map(Item)
            }
        }
        let mut out = Vec::new();
        while let Some(Item(s)) = seq.next_element()? {
            let s = s.trim().to_string();
            if !s.is_empty() {
                out.push(s);
            }
        }
        Ok(out)
    }
}

/// A map given as a mapping, or as one `key=value,key=value` string (env, CLI).
fn string_map<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<std::collections::BTreeMap<String, String>, D::Error> {
    d.deserialize_any(StringMap)
}

struct StringMap;

impl<'de> serde::de::Visitor<'de> for StringMap {
    type Value = std::collections::BTreeMap<String, String>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a mapping of strings or a `key=value,key=value` string")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        let mut out = std::collections::BTreeMap::new();
        for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, val) = item
                .split_once('=')
                .ok_or_else(|| E::custom(format!("{item:?} is not key=value")))?;
            out.insert(k.trim().to_string(), val.trim().to_string());
        }
        Ok(out)
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Default::default())
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(Default::default())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
        struct Item(String);
        impl<'de> Deserialize<'de> for Item {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                lenient_string(d).map(Item)
            }
        }
        let mut out = std::collections::BTreeMap::new();
        while let Some((Item(k), Item(v))) = m.next_entry()? {
            out.insert(k.trim().to_string(), v.trim().to_string());
        }
        Ok(out)
    }
}

pub use rpingmesh_proto::host::local_hostname;

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn cli(args: &[&str]) -> CliArgs {
        let mut v = vec!["rpingmesh-agent"];
        v.extend_from_slice(args);
        CliArgs::try_parse_from(v).unwrap()
    }

    fn yaml(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_match_the_go_readme() {
        let c = AgentConfig::default();
        assert_eq!(c.controller_addr, "localhost:50051");
        assert_eq!(c.probe_interval_ms, 500);
        assert_eq!(c.target_probe_rate_per_second, 10.0);
        assert_eq!(c.tor_mesh_probe_rate_per_second, 0.0);
        assert_eq!(c.pinglist_update_interval_sec, 300);
        assert_eq!(c.flow_label_rotation_period_sec, 3600);
        assert_eq!(c.otel_collector_addr, "localhost:4317");
        assert_eq!(c.analysis_window_sec, 30);
        assert_eq!(c.throttle_memory_ratio, 0.9);
        assert_eq!(c.throttle_cpu_percent, 90.0);
        assert_eq!(c.tls_mode, TlsMode::Disabled);
        assert_eq!(c.transport, Transport::Udp);
        assert_eq!(c.udp_addresses, vec!["127.0.0.1".to_string()]);
        assert_eq!(c.udp_port, 18515);
        assert_eq!(c.report_batch_max, 256);
        assert_eq!(c.agent_id, local_hostname());
        assert!(c.metrics_enabled && c.analysis_report_enabled && !c.responder_only);
        // The per-type rates inherit the uniform one.
        assert_eq!(c.tor_mesh_rate(), 10.0);
        assert_eq!(c.inter_tor_rate(), 10.0);
    }

    #[test]
    fn tor_id_is_required() {
        let e = AgentConfig::load_from(&cli(&[]), &[]).unwrap_err();
        assert!(e.0.starts_with("tor_id is required"), "{e}");
    }

    #[test]
    fn file_then_env_then_cli() {
        let f = yaml(
            "tor_id: tor-file\nprobe_interval_ms: 100\ncontroller_addr: file:1\n\
             tor_mesh_probe_rate_per_second: 10\ninter_tor_probe_rate_per_second: 1\n\
             udp_addresses: [127.0.0.2, 127.0.0.3]\n",
        );
        let path = f.path().to_str().unwrap();
        // File only.
        let c = AgentConfig::load_from(&cli(&["--config", path]), &[]).unwrap();
        assert_eq!(c.tor_id, "tor-file");
        assert_eq!(c.probe_interval_ms, 100);
        assert_eq!(c.udp_addresses, vec!["127.0.0.2", "127.0.0.3"]);
        assert_eq!(c.inter_tor_rate(), 1.0);
        assert_eq!(c.tor_mesh_rate(), 10.0);
        // Env beats the file.
        let e = env(&[
            ("RPINGMESH_TOR_ID", "tor-env"),
            ("RPINGMESH_PROBE_INTERVAL_MS", "200"),
            ("RPINGMESH_UDP_ADDRESSES", "127.0.0.4,127.0.0.5"),
            ("RPINGMESH_LISTEN_ADDR", ":1"), // a controller key: ignored, not an error
            ("OTHER_TOR_ID", "x"),
        ]);
        let c = AgentConfig::load_from(&cli(&["--config", path]), &e).unwrap();
        assert_eq!(c.tor_id, "tor-env");
        assert_eq!(c.probe_interval_ms, 200);
        assert_eq!(c.udp_addresses, vec!["127.0.0.4", "127.0.0.5"]);
        assert_eq!(c.controller_addr, "file:1");
        // CLI beats both.
        let c = AgentConfig::load_from(
            &cli(&[
                "--config",
                path,
                "--tor-id",
                "tor-cli",
                "--udp-addresses",
                "::1,127.0.0.9",
                "--metrics-enabled",
                "false",
            ]),
            &e,
        )
        .unwrap();
        assert_eq!(c.tor_id, "tor-cli");
        assert_eq!(c.probe_interval_ms, 200);
        assert_eq!(c.udp_addresses, vec!["::1", "127.0.0.9"]);
        assert!(!c.metrics_enabled);
    }

    #[test]
    fn numeric_tor_id_is_text() {
        let f = yaml("tor_id: 7\n");
        let c =
            AgentConfig::load_from(&cli(&["--config", f.path().to_str().unwrap()]), &[]).unwrap();
        assert_eq!(c.tor_id, "7");
        let c = AgentConfig::load_from(&cli(&[]), &env(&[("RPINGMESH_TOR_ID", "12")])).unwrap();
        assert_eq!(c.tor_id, "12");
    }

    #[test]
    fn unknown_yaml_key_is_named() {
        let f = yaml("tor_id: t\nprobe_intervall_ms: 5\n");
        let e = AgentConfig::load_from(&cli(&["--config", f.path().to_str().unwrap()]), &[])
            .unwrap_err();
        assert!(e.0.contains("probe_intervall_ms"), "{e}");
        assert!(e.0.contains("unknown config key"), "{e}");
        assert!(!e.0.contains('\n'));
    }

    #[test]
    fn wrong_type_names_the_key() {
        let f = yaml("tor_id: t\nprobe_interval_ms: fast\n");
        let e = AgentConfig::load_from(&cli(&["--config", f.path().to_str().unwrap()]), &[])
            .unwrap_err();
        assert!(e.0.contains("probe_interval_ms"), "{e}");
        assert!(!e.0.contains('\n'));
        let e = AgentConfig::load_from(
            &cli(&[]),
            &env(&[("RPINGMESH_TOR_ID", "t"), ("RPINGMESH_UDP_PORT", "99999")]),
        )
        .unwrap_err();
        assert!(e.0.contains("udp_port"), "{e}");
        let e = AgentConfig::load_from(
            &cli(&["--tor-id", "t"]),
            &env(&[("RPINGMESH_TLS_MODE", "ssl")]),
        )
        .unwrap_err();
        assert!(e.0.contains("tls_mode"), "{e}");
    }

    #[test]
    fn missing_config_file_is_named() {
        let e = AgentConfig::load_from(&cli(&["--config", "/nonexistent/agent.yaml"]), &[])
            .unwrap_err();
        assert!(e.0.contains("/nonexistent/agent.yaml"), "{e}");
    }

    #[test]
    fn bad_yaml_is_one_line() {
        let f = yaml("tor_id: [unterminated\n");
        let e = AgentConfig::load_from(&cli(&["--config", f.path().to_str().unwrap()]), &[])
            .unwrap_err();
        assert!(!e.0.contains('\n'), "{e}");
        assert!(e.0.contains("YAML"), "{e}");
    }

    fn invalid(mutate: impl FnOnce(&mut AgentConfig)) -> String {
        let mut c = AgentConfig {
            tor_id: "t".into(),
            ..AgentConfig::default()
        };
        c.validate().unwrap();
        mutate(&mut c);
        c.validate().unwrap_err().0
    }

    #[test]
    fn each_range_error_names_its_key() {
        assert!(invalid(|c| c.gid_index = 256).starts_with("gid_index"));
        assert!(invalid(|c| c.gid_index = -1).starts_with("gid_index"));
        assert!(invalid(|c| c.service_level = 8).starts_with("service_level"));
        assert!(invalid(|c| c.traffic_class = 300).starts_with("traffic_class"));
        assert!(invalid(|c| c.probe_interval_ms = 0).starts_with("probe_interval_ms"));
        assert!(invalid(|c| c.target_probe_rate_per_second = 0.0)
            .starts_with("target_probe_rate_per_second"));
        assert!(invalid(|c| c.tor_mesh_probe_rate_per_second = -1.0)
            .starts_with("tor_mesh_probe_rate_per_second"));
        assert!(invalid(|c| c.inter_tor_probe_rate_per_second = f64::NAN)
            .starts_with("inter_tor_probe_rate_per_second"));
        assert!(invalid(|c| c.pinglist_update_interval_sec = 0)
            .starts_with("pinglist_update_interval_sec"));
        assert!(invalid(|c| c.analysis_window_sec = 0).starts_with("analysis_window_sec"));
        assert!(invalid(|c| c.watchdog_interval_sec = 0).starts_with("watchdog_interval_sec"));
        assert!(invalid(|c| c.throttle_memory_ratio = 1.5).starts_with("throttle_memory_ratio"));
        assert!(invalid(|c| c.throttle_cpu_percent = 0.0).starts_with("throttle_cpu_percent"));
        assert!(invalid(|c| c.log_level = "verbose".into()).starts_with("log_level"));
        assert!(invalid(|c| c.udp_addresses = vec![]).starts_with("udp_addresses"));
        assert!(invalid(|c| c.udp_addresses = vec!["host".into()]).starts_with("udp_addresses"));
        assert!(invalid(|c| c.probe_timeout_ms = 0).starts_with("probe_timeout_ms"));
        assert!(invalid(|c| c.report_batch_max = 0).starts_with("report_batch_max"));
        assert!(
            invalid(|c| c.metrics_export_interval_ms = 0).starts_with("metrics_export_interval_ms")
        );
        assert!(invalid(|c| c.controller_addr = " ".into()).starts_with("controller_addr"));
        assert!(invalid(|c| c.metrics_exporter = "statsd".into()).starts_with("metrics_exporter"));
        assert!(invalid(|c| {
            c.metrics_exporter = "both".into();
            c.prometheus_listen_addr = "nowhere".into();
        })
        .starts_with("prometheus_listen_addr"));
    }

    #[test]
    fn tls_files_must_exist_for_the_mode() {
        let e = invalid(|c| c.tls_mode = TlsMode::Tls);
        assert!(
            e.starts_with("tls_ca_file is required when tls_mode is tls"),
            "{e}"
        );
        let e = invalid(|c| {
            c.tls_mode = TlsMode::Tls;
            c.tls_ca_file = "/nonexistent/ca.pem".into();
        });
        assert!(
            e.starts_with("tls_ca_file: file /nonexistent/ca.pem does not exist"),
            "{e}"
        );
        let ca = yaml("ca");
        let ca_path = ca.path().to_str().unwrap().to_string();
        let e = invalid(|c| {
            c.tls_mode = TlsMode::Mtls;
            c.tls_ca_file = ca_path.clone();
        });
        assert!(
            e.starts_with("tls_cert_file is required when tls_mode is mtls"),
            "{e}"
        );
        let mut c = AgentConfig {
            tor_id: "t".into(),
            tls_mode: TlsMode::Mtls,
            ..AgentConfig::default()
        };
        c.tls_ca_file = ca_path.clone();
        c.tls_cert_file = ca_path.clone();
        c.tls_key_file = ca_path;
        c.validate().unwrap();
    }

    #[test]
    fn shipped_config_loads() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/agent.yaml");
        // tor_id is per host: the shipped file leaves it to env or CLI.
        let e = AgentConfig::load_from(&cli(&["--config", path]), &[]).unwrap_err();
        assert!(e.0.starts_with("tor_id is required"), "{e}");
        let c =
            AgentConfig::load_from(&cli(&["--config", path, "--tor-id", "tor-a"]), &[]).unwrap();
        assert_eq!(c.tor_mesh_rate(), 10.0);
        assert_eq!(c.inter_tor_rate(), 1.0);
    }

    #[test]
    fn from_yaml_str_layers_and_validates_as_a_file_does() {
        let text = "tor_id: tor-a\nagent_id: a1\nprobe_interval_ms: 250\n";
        let f = yaml(text);
        let from_file =
            AgentConfig::load_from(&cli(&["--config", f.path().to_str().unwrap()]), &[]).unwrap();
        assert_eq!(AgentConfig::from_yaml_str(text).unwrap(), from_file);
        let e = AgentConfig::from_yaml_str("agent_id: a1\n").unwrap_err();
        assert!(e.0.starts_with("tor_id is required"), "{e}");
        let e = AgentConfig::from_yaml_str("tor_id: t\nno_such_key: 1\n").unwrap_err();
        assert!(e.0.contains("unknown config key `no_such_key`"), "{e}");
    }

    #[test]
    fn every_key_is_a_field_and_a_flag() {
        let json = serde_json::to_value(AgentConfig::default()).unwrap();
        let fields: Vec<&String> = json.as_object().unwrap().keys().collect();
        assert_eq!(fields.len(), KEYS.len());
        for k in KEYS {
            assert!(json.get(*k).is_some(), "{k} is not a field");
            let flag = format!("--{}", k.replace('_', "-"));
            let cmd = <CliArgs as clap::CommandFactory>::command();
            assert!(
                cmd.get_arguments()
                    .any(|a| a.get_long() == Some(&flag[2..])),
                "{flag} is not a CLI flag"
            );
        }
    }

    /// The declarations carry the docs: each key has one (its `--help` text too), and the
    /// README's key tables name every key.
    #[test]
    fn every_key_is_documented_here_and_in_the_readme() {
        let readme = include_str!("../../README.md");
        let section =
            &readme[readme.find("### Agent").unwrap()..readme.find("### Controller").unwrap()];
        for k in KEY_DOCS {
            assert!(!k.doc.trim().is_empty(), "{} has no doc", k.key);
            assert!(
                section.contains(&format!("| {}", k.key))
                    || section.contains(&format!(" {},", k.key))
                    || section.contains(&format!(" {})", k.key))
                    || section.contains(&format!("/ {} ", k.key)),
                "{} is not in the README's agent key tables",
                k.key
            );
        }
        let help = <CliArgs as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        assert!(
            help.contains("Each RNIC probes one other RNIC of the host this often"),
            "{help}"
        );
    }

    #[test]
    fn service_keys_default_and_layer() {
        let c = AgentConfig::load_from(&cli(&["--tor-id", "t"]), &[]).unwrap();
        assert_eq!(c.service_tracing_mode, ServiceTracingMode::Auto);
        assert_eq!(c.service_probe_rate_per_second, 0.0);
        assert_eq!(
            c.service_rate(),
            10.0,
            "0 inherits target_probe_rate_per_second"
        );
        assert!(c.service_tracing_uprobe_targets.is_empty());
        assert!(c.service_names.is_empty());
        assert_eq!(c.max_service_names, 32);
        assert_eq!(c.service_flow_report_interval_ms, 1000);

        let f = yaml(
            "tor_id: t\nservice_tracing_mode: uprobe\nservice_probe_rate_per_second: 2\n\
             service_tracing_uprobe_targets: [/opt/app/lib/libibverbs.so.1]\n\
             service_names: {python3: training, nccl-test: 42}\nmax_service_names: 4\n\
             service_flow_report_interval_ms: 500\n",
        );
        let path = f.path().to_str().unwrap();
        let c = AgentConfig::load_from(&cli(&["--config", path]), &[]).unwrap();
        assert_eq!(c.service_tracing_mode, ServiceTracingMode::Uprobe);
        assert_eq!(c.service_rate(), 2.0);
        assert_eq!(
            c.service_tracing_uprobe_targets,
            vec!["/opt/app/lib/libibverbs.so.1"]
        );
        assert_eq!(
            c.service_names.get("python3").map(String::as_str),
            Some("training")
        );
        assert_eq!(
            c.service_names.get("nccl-test").map(String::as_str),
            Some("42")
        );
        assert_eq!(
            (c.max_service_names, c.service_flow_report_interval_ms),
            (4, 500)
        );

        // env over file, flags over env.
        let c = AgentConfig::load_from(
            &cli(&[
                "--config",
                path,
                "--service-tracing-mode",
                "off",
                "--service-names",
                "a=b",
            ]),
            &env(&[
                ("RPINGMESH_SERVICE_TRACING_MODE", "kprobe"),
                ("RPINGMESH_SERVICE_NAMES", "x=y, z=w"),
                ("RPINGMESH_SERVICE_TRACING_UPROBE_TARGETS", "/a/b,/c/d"),
                ("RPINGMESH_MAX_SERVICE_NAMES", "7"),
            ]),
        )
        .unwrap();
        assert_eq!(c.service_tracing_mode, ServiceTracingMode::Off);
        assert_eq!(c.service_names.len(), 1);
        assert_eq!(c.service_names["a"], "b");
        assert_eq!(c.service_tracing_uprobe_targets, vec!["/a/b", "/c/d"]);
        assert_eq!(c.max_service_names, 7);
        let c = AgentConfig::load_from(
            &cli(&["--config", path]),
            &env(&[("RPINGMESH_SERVICE_NAMES", "x=y, z=w")]),
        )
        .unwrap();
        assert_eq!(c.service_names.len(), 2);
        assert_eq!(c.service_names["z"], "w");
    }

    #[test]
    fn rc_ring_keys_default_to_service_targets_and_name_bad_values() {
        let c = AgentConfig::load_from(&cli(&["--tor-id", "t"]), &[]).unwrap();
        assert_eq!(
            c.rc_ring_kinds(),
            vec![rpingmesh_protocol::PinglistKind::Service]
        );
        let c = AgentConfig::load_from(
            &cli(&["--tor-id", "t", "--rc-ring-pinglists", "tor_mesh,inter_tor"]),
            &[],
        )
        .unwrap();
        assert_eq!(c.rc_ring_kinds().len(), 2);
        let off = AgentConfig::load_from(
            &cli(&["--tor-id", "t"]),
            &env(&[("RPINGMESH_RC_RING_PINGLISTS", "")]),
        )
        .unwrap();
        assert!(off.rc_ring_kinds().is_empty(), "empty = off");
        assert!(invalid(|c| c.rc_ring_pinglists = vec!["host".into()])
            .starts_with("rc_ring_pinglists: \"host\""));
        assert!(invalid(|c| c.rc_ring_port = 0).starts_with("rc_ring_port"));
        assert!(invalid(|c| c.rc_ring_budget_bytes = 511).starts_with("rc_ring_budget_bytes"));
        assert!(invalid(|c| c.rc_ring_ack_timeout_exp = 32).starts_with("rc_ring_ack_timeout_exp"));
        assert!(invalid(|c| c.rc_ring_max_rings = 0).starts_with("rc_ring_max_rings"));
        assert!(
            invalid(|c| c.rc_ring_probe_interval_ms = 5).starts_with("rc_ring_probe_interval_ms")
        );
        assert!(
            invalid(|c| c.rc_ring_probe_timeout_ms = 2000).starts_with("rc_ring_probe_timeout_ms")
        );
        assert!(invalid(|c| c.rc_ring_hot_wait_us = 0).starts_with("rc_ring_hot_wait_us"));
        assert!(invalid(|c| c.rc_ring_poll_lead_us = 2_000_000).starts_with("rc_ring_poll_lead_us"));
    }

    #[test]
    fn bad_service_keys_name_the_key() {
        let e = AgentConfig::load_from(
            &cli(&["--tor-id", "t"]),
            &env(&[("RPINGMESH_SERVICE_TRACING_MODE", "sometimes")]),
        )
        .unwrap_err();
        assert!(e.0.contains("service_tracing_mode"), "{e}");
        let e = AgentConfig::load_from(
            &cli(&["--tor-id", "t"]),
            &env(&[("RPINGMESH_SERVICE_NAMES", "novalue")]),
        )
        .unwrap_err();
        assert!(
            e.0.contains("service_names") && e.0.contains("novalue"),
            "{e}"
        );
        assert!(invalid(|c| c.service_probe_rate_per_second = -1.0)
            .starts_with("service_probe_rate_per_second"));
        assert!(invalid(|c| c.max_service_names = 0).starts_with("max_service_names"));
        assert!(invalid(|c| c.service_flow_report_interval_ms = 0)
            .starts_with("service_flow_report_interval_ms"));
        assert!(invalid(|c| c.service_flow_report_interval_ms = 200_000)
            .starts_with("service_flow_report_interval_ms"));
        assert!(
            invalid(|c| c.service_tracing_uprobe_targets = vec!["lib.so".into()])
                .starts_with("service_tracing_uprobe_targets")
        );
        assert!(invalid(|c| {
            c.service_names.insert("comm".into(), " ".into());
        })
        .starts_with("service_names"));
    }
}
