//! Agent configuration: every key of the Go agent plus rpingmesh's own, layered
//! YAML file (--config) < `RPINGMESH_<KEY>` environment < CLI flags.
//!
//! Unknown YAML keys are errors; `validate` reports the first bad key in one line.

use std::path::{Path, PathBuf};

use figment::providers::{Format, Serialized};
use figment::value::{Dict, Map, Value};
use figment::Figment;
use figment::{Metadata, Profile, Provider};
use rpingmesh_metrics_export::Exporter;
use serde::{Deserialize, Deserializer, Serialize};

/// Every key the agent understands (YAML key = env suffix = CLI flag in kebab case).
pub const KEYS: &[&str] = &[
    "agent_id",
    "hostname",
    "tor_id",
    "controller_addr",
    "probe_interval_ms",
    "target_probe_rate_per_second",
    "tor_mesh_probe_rate_per_second",
    "inter_tor_probe_rate_per_second",
    "pinglist_update_interval_sec",
    "flow_label_rotation_period_sec",
    "gid_index",
    "service_level",
    "traffic_class",
    "allowed_device_names",
    "device_tor_ids",
    "metrics_enabled",
    "otel_collector_addr",
    "analysis_report_enabled",
    "analysis_window_sec",
    "self_protection_enabled",
    "watchdog_interval_sec",
    "max_memory_mb",
    "max_procs",
    "throttle_memory_ratio",
    "throttle_cpu_percent",
    "log_level",
    "tls_mode",
    "tls_cert_file",
    "tls_key_file",
    "tls_ca_file",
    "tls_server_name",
    "transport",
    "udp_addresses",
    "udp_port",
    "probe_timeout_ms",
    "metrics_export_interval_ms",
    "responder_only",
    "report_batch_max",
    "service_tracing_mode",
    "service_probe_rate_per_second",
    "service_tracing_uprobe_targets",
    "service_names",
    "max_service_names",
    "service_flow_report_interval_ms",
    "metrics_exporter",
    "prometheus_listen_addr",
    "hostping_enabled",
    "hostping_r2r_interval_ms",
    "hostping_r2r_timeout_ms",
    "hostping_r2r_window_sec",
    "hostping_timeout_th",
    "hostping_monitor_interval_ms",
    "hostping_check_interval_sec",
    "hostping_thp_low",
    "hostping_pfc_high",
    "hostping_abnormal_th",
    "hostping_util_high",
    "hostping_loopback_enabled",
    "hostping_loopback_samples",
];

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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    #[serde(deserialize_with = "lenient_string")]
    pub agent_id: String,
    #[serde(deserialize_with = "lenient_string")]
    pub hostname: String,
    #[serde(deserialize_with = "lenient_string")]
    pub tor_id: String,
    #[serde(deserialize_with = "lenient_string")]
    pub controller_addr: String,
    pub probe_interval_ms: u64,
    pub target_probe_rate_per_second: f64,
    /// 0 = inherit target_probe_rate_per_second.
    pub tor_mesh_probe_rate_per_second: f64,
    /// 0 = inherit target_probe_rate_per_second.
    pub inter_tor_probe_rate_per_second: f64,
    pub pinglist_update_interval_sec: u64,
    pub flow_label_rotation_period_sec: u64,
    /// Signed so that a negative value is reported as out of range, not as a type error.
    pub gid_index: i64,
    pub service_level: i64,
    pub traffic_class: i64,
    #[serde(deserialize_with = "string_list")]
    pub allowed_device_names: Vec<String>,
    /// RDMA device -> ToR of that rail (rail-optimized fabrics); others use `tor_id`.
    #[serde(deserialize_with = "string_map")]
    pub device_tor_ids: std::collections::BTreeMap<String, String>,
    pub metrics_enabled: bool,
    #[serde(deserialize_with = "lenient_string")]
    pub otel_collector_addr: String,
    pub analysis_report_enabled: bool,
    pub analysis_window_sec: u64,
    pub self_protection_enabled: bool,
    pub watchdog_interval_sec: u64,
    pub max_memory_mb: u64,
    pub max_procs: u64,
    pub throttle_memory_ratio: f64,
    pub throttle_cpu_percent: f64,
    #[serde(deserialize_with = "lenient_string")]
    pub log_level: String,
    pub tls_mode: TlsMode,
    #[serde(deserialize_with = "lenient_string")]
    pub tls_cert_file: String,
    #[serde(deserialize_with = "lenient_string")]
    pub tls_key_file: String,
    #[serde(deserialize_with = "lenient_string")]
    pub tls_ca_file: String,
    #[serde(deserialize_with = "lenient_string")]
    pub tls_server_name: String,
    pub transport: Transport,
    /// One pseudo-RNIC per address (device names udp0, udp1, ...).
    #[serde(deserialize_with = "string_list")]
    pub udp_addresses: Vec<String>,
    /// 0 = an ephemeral port per address.
    pub udp_port: u16,
    pub probe_timeout_ms: u64,
    pub metrics_export_interval_ms: u64,
    /// Where metrics go when metrics_enabled: otlp (push), prometheus (/metrics) or both.
    pub metrics_exporter: String,
    /// Address of the Prometheus `/metrics` endpoint (exporter prometheus or both).
    pub prometheus_listen_addr: String,
    /// Register and answer probes, send none.
    pub responder_only: bool,
    pub report_batch_max: usize,
    pub service_tracing_mode: ServiceTracingMode,
    /// 0 = inherit target_probe_rate_per_second.
    pub service_probe_rate_per_second: f64,
    /// Extra binaries or libraries (absolute paths) to attach the libibverbs uprobes to.
    #[serde(deserialize_with = "string_list")]
    pub service_tracing_uprobe_targets: Vec<String>,
    /// Process name (comm) -> configured service name.
    #[serde(deserialize_with = "string_map")]
    pub service_names: std::collections::BTreeMap<String, String>,
    /// Distinct `service` metric attribute values; beyond it the value is "other".
    pub max_service_names: usize,
    pub service_flow_report_interval_ms: u64,
    /// Hostping inside the running agent: R2R probing between this host's RNICs, the RNIC counter monitor, and the host check (PCIe links, port states, loopback tests).
    pub hostping_enabled: bool,
    /// Each RNIC probes one other RNIC of the host this often (the paper: 100 ms).
    pub hostping_r2r_interval_ms: u64,
    /// An R2R probe without ACKs after this is a timeout (the paper: 500 ms).
    pub hostping_r2r_timeout_ms: u64,
    /// R2R outcomes are judged per window (the paper: 20 s).
    pub hostping_r2r_window_sec: u64,
    /// An RNIC whose R2R timeout rate is over this has a network problem (Timeout_th).
    pub hostping_timeout_th: f64,
    /// RNIC counters (throughput, Tx pause, drops) are sampled this often.
    pub hostping_monitor_interval_ms: u64,
    /// The host check (tree, PCIe links, ports, loopback tests) runs this often, and at once when the host turns idle or abnormal.
    pub hostping_check_interval_sec: u64,
    /// The host is idle below this share of line rate (Thp_low): loopback tests cover every RNIC x memory endpoint.
    pub hostping_thp_low: f64,
    /// The host is abnormal over this Tx pause ratio (PFC_high): loopback tests cover the affinitive endpoints only.
    pub hostping_pfc_high: f64,
    /// A loopback path this far below its affinitive peers is abnormal (Abnormal_th).
    pub hostping_abnormal_th: f64,
    /// A link this busy is congested, not failed (Util_high).
    pub hostping_util_high: f64,
    /// Run the loopback tests (rdma transport only: an RC QP connected to itself per RNIC x endpoint).
    pub hostping_loopback_enabled: bool,
    /// Loopback writes per message size and path.
    pub hostping_loopback_samples: u32,
}

impl Default for AgentConfig {
    fn default() -> Self {
        let host = local_hostname();
        AgentConfig {
            agent_id: host.clone(),
            hostname: host,
            tor_id: String::new(),
            controller_addr: "localhost:50051".into(),
            probe_interval_ms: 500,
            target_probe_rate_per_second: 10.0,
            tor_mesh_probe_rate_per_second: 0.0,
            inter_tor_probe_rate_per_second: 0.0,
            pinglist_update_interval_sec: 300,
            flow_label_rotation_period_sec: 3600,
            gid_index: 0,
            service_level: 0,
            traffic_class: 0,
            allowed_device_names: Vec::new(),
            device_tor_ids: std::collections::BTreeMap::new(),
            metrics_enabled: true,
            otel_collector_addr: "localhost:4317".into(),
            analysis_report_enabled: true,
            analysis_window_sec: 30,
            self_protection_enabled: false,
            watchdog_interval_sec: 5,
            max_memory_mb: 0,
            max_procs: 0,
            throttle_memory_ratio: 0.9,
            throttle_cpu_percent: 90.0,
            log_level: "info".into(),
            tls_mode: TlsMode::Disabled,
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            tls_ca_file: String::new(),
            tls_server_name: String::new(),
            transport: Transport::Udp,
            udp_addresses: vec!["127.0.0.1".into()],
            udp_port: 18515,
            probe_timeout_ms: 1000,
            metrics_export_interval_ms: 10_000,
            metrics_exporter: "otlp".into(),
            prometheus_listen_addr: ":9464".into(),
            responder_only: false,
            report_batch_max: 256,
            service_tracing_mode: ServiceTracingMode::Auto,
            service_probe_rate_per_second: 0.0,
            service_tracing_uprobe_targets: Vec::new(),
            service_names: std::collections::BTreeMap::new(),
            max_service_names: 32,
            service_flow_report_interval_ms: 1000,
            hostping_enabled: true,
            hostping_r2r_interval_ms: 100,
            hostping_r2r_timeout_ms: 500,
            hostping_r2r_window_sec: 20,
            hostping_timeout_th: 0.1,
            hostping_monitor_interval_ms: 1000,
            hostping_check_interval_sec: 300,
            hostping_thp_low: 0.05,
            hostping_pfc_high: 0.03,
            hostping_abnormal_th: 0.2,
            hostping_util_high: 0.9,
            hostping_loopback_enabled: true,
            hostping_loopback_samples: 20,
        }
    }
}

/// A configuration error: one line, naming the key (or file) at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn err(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
}

/// Command-line flags: one optional kebab-case flag per key; unset flags do not override.
#[derive(Debug, Default, Clone, clap::Parser, Serialize)]
#[command(
    name = "rpingmesh-agent",
    version,
    about = "rpingmesh agent: probes RNICs with the 6-timestamp protocol and reports to the controller"
)]
pub struct CliArgs {
    /// YAML config file (keys as in configs/agent.yaml).
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tor_id: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller_addr: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_interval_ms: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_probe_rate_per_second: Option<f64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tor_mesh_probe_rate_per_second: Option<f64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inter_tor_probe_rate_per_second: Option<f64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinglist_update_interval_sec: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow_label_rotation_period_sec: Option<u64>,
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gid_index: Option<i64>,
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_level: Option<i64>,
    #[arg(long, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_class: Option<i64>,
    #[arg(long, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_device_names: Option<Vec<String>>,
    /// `device=tor,device2=tor2`
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_tor_ids: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_enabled: Option<bool>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otel_collector_addr: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub analysis_report_enabled: Option<bool>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub analysis_window_sec: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub self_protection_enabled: Option<bool>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watchdog_interval_sec: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_memory_mb: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_procs: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttle_memory_ratio: Option<f64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttle_cpu_percent: Option<f64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
    #[arg(long, value_parser = ["disabled", "tls", "mtls"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_mode: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca_file: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
    #[arg(long, value_parser = ["udp", "rdma"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    #[arg(long, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub udp_addresses: Option<Vec<String>>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub udp_port: Option<u16>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_timeout_ms: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_export_interval_ms: Option<u64>,
    /// otlp | prometheus | both.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_exporter: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prometheus_listen_addr: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub responder_only: Option<bool>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report_batch_max: Option<usize>,
    #[arg(long, value_parser = ["auto", "kprobe", "uprobe", "off"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_tracing_mode: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_probe_rate_per_second: Option<f64>,
    #[arg(long, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_tracing_uprobe_targets: Option<Vec<String>>,
    /// `comm=name,comm2=name2`
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_names: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_service_names: Option<usize>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_flow_report_interval_ms: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostping_enabled: Option<bool>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostping_r2r_interval_ms: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostping_r2r_timeout_ms: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostping_r2r_window_sec: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostping_timeout_th: Option<f64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostping_monitor_interval_ms: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostping_check_interval_sec: Option<u64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostping_thp_low: Option<f64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostping_pfc_high: Option<f64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostping_abnormal_th: Option<f64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostping_util_high: Option<f64>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostping_loopback_enabled: Option<bool>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostping_loopback_samples: Option<u32>,
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
        fig = fig.merge(EnvProvider::new(env));
        fig = fig.merge(Serialized::defaults(cli));
        let mut cfg: AgentConfig = fig
            .extract()
            .map_err(|e| figment_error(e, file.as_deref()))?;
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
        self.validate_hostping()
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

/// `RPINGMESH_<KEY>` variables. Only known keys are taken, so unrelated `RPINGMESH_*`
/// variables (the controller's, for instance) do not break the agent. Values are typed as
/// figment types them (`[a, b]` is a list, `10` a number); string keys accept numbers.
struct EnvProvider(Dict);

impl EnvProvider {
    fn new(env: &[(String, String)]) -> Self {
        let mut dict = Dict::new();
        for (k, v) in env {
            let Some(suffix) = k.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let key = suffix.to_ascii_lowercase();
            if KEYS.contains(&key.as_str()) {
                let value: Value = v.parse().unwrap_or_else(|_| Value::from(v.clone()));
                dict.insert(key, value);
            }
        }
        EnvProvider(dict)
    }
}

impl Provider for EnvProvider {
    fn metadata(&self) -> Metadata {
        Metadata::named("environment (RPINGMESH_*)")
    }
    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.0.clone()))
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
