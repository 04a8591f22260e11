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

mod lenient;
use lenient::{lenient_string, string_list, string_map};
mod validate;

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
        let file = rpingmesh_proto::host::chosen_config(cli.config.as_deref(), "agent.yaml", env);
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

pub use rpingmesh_proto::host::local_hostname;

#[cfg(test)]
mod tests;
