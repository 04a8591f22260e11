//! Controller configuration: the Go version's keys and defaults plus our own
//! (`metrics_enabled`, `metrics_export_interval_ms`, `pinglist_seed`).
//!
//! Layering, lowest to highest: built-in defaults < YAML file (`--config`) <
//! `RPINGMESH_*` environment < command-line flags. Every error is one line naming the key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::Format;
use figment::value::{Dict, Value};
use figment::Figment;
use rpingmesh_config_table::{config_table, env_dict, NamedDict};
use rpingmesh_metrics_export::{parse_listen_addr, Exporter};

use crate::analyzer::AnalyzerParams;
use crate::auth::cert::IdentitySource;
use crate::auth::identity::AgentAuth;
use crate::auth::roles::CertRoles;
use crate::focus::FocusParams;
use crate::localize::LocalizerParams;
pub use crate::registry::DatabaseUri;
use crate::topology::Topology;

/// Upper bound of `analyzer_localize_settle_sec` (an hour: reports later than that are
/// long gone from the agents' outboxes).
pub const MAX_LOCALIZE_SETTLE_SEC: u64 = 3600;

/// Environment variable prefix shared with the Go version.
pub const ENV_PREFIX: &str = "RPINGMESH_";

config_table! {
    #[serde(deny_unknown_fields, default)]
    pub struct ControllerConfig;
    #[command(
        name = "rpingmesh-controller",
        version,
        about = "R-Pingmesh controller"
    )]
    pub struct CliArgs;
    keys {
        /// gRPC listen address of ControllerService and OperatorService (":port" means all
        /// interfaces).
        listen_addr: String = ":50051".into(), flag String;
        /// Registry store: `sqlite:<path>`, `sqlite::memory:`, or `etcd://host:port[,host:port...]`
        /// shared by controller replicas.
        database_uri: String = "sqlite:rpingmesh-controller.db".into(), flag String;
        /// With etcd: the address other replicas reach this one at (forwarded reports); empty =
        /// the bound listen address.
        advertise_addr: String = String::new(), flag String;
        /// With etcd: TTL of the lease behind this replica's analysis leadership; a dead
        /// leader is replaced within it.
        leader_lease_ttl_sec: u64 = 10, flag u64;
        /// RNICs not heard from for this long are left out of pinglists.
        active_threshold_sec: u64 = 300, flag u64;
        /// RNICs not heard from for this long are removed (>= active_threshold_sec).
        stale_threshold_sec: u64 = 900, flag u64;
        /// Other ToRs per inter-ToR pinglist.
        inter_tor_sample_size: u32 = 5, flag u32;
        /// ECMP paths assumed between two ToRs (flow-label coverage, Eq. 1).
        ecmp_paths_assumed: u32 = 16, flag u32;
        /// Probability that the flow labels cover every ECMP path (Eq. 1).
        ecmp_coverage_probability: f64 = 0.9, flag f64;
        /// Upper bound on flow labels per inter-ToR target.
        ecmp_max_flow_labels: u32 = 64, flag u32;
        /// Run the analyzer (phase 1 SLA flags, phase 2 localization).
        analyzer_enabled: bool = true, flag bool;
        /// A path over this loss ratio breaks its SLA.
        analyzer_sla_loss_ratio: f64 = 0.02, flag f64;
        /// A path whose p99 network RTT is over this breaks its SLA.
        analyzer_sla_network_rtt_p99_ns: u64 = 500_000, flag u64;
        /// Windows kept per path.
        analyzer_window_retention: u32 = 20, flag u32;
        /// Fabric topology (YAML: spines, each ToR's spines, optional ECMP hash) for naming
        /// ToR-spine links; empty = none (link findings name a ToR's uplink or downlink side).
        analyzer_topology_file: String = String::new(), flag String;
        /// How long after a window ends its reports are awaited before it is localized.
        analyzer_localize_settle_sec: u64 = 10, flag u64;
        /// K: consecutive windows blaming a component before its finding opens.
        analyzer_open_after_windows: u32 = 1, flag u32;
        /// M: windows not blaming a component before its open finding resolves.
        analyzer_resolve_after_windows: u32 = 2, flag u32;
        /// Adaptive probing: components the gray detector suspects that get FOCUS probes at once (the strongest); 0 = off.
        analyzer_focus_max_components: u32 = 8, flag u32;
        /// Adaptive probing: FOCUS targets per suspect component (one source RNIC each).
        analyzer_focus_sources: u32 = 4, flag u32;
        /// OTLP/gRPC endpoint of the metrics.
        otel_collector_addr: String = "localhost:4317".into(), flag String;
        /// debug, info, warn, error.
        log_level: String = "info".into(), flag String;
        /// disabled, tls, mtls.
        tls_mode: String = "disabled".into(), flag String;
        /// Server certificate (tls, mtls).
        tls_cert_file: String = String::new(), flag String;
        /// Server key (tls, mtls).
        tls_key_file: String = String::new(), flag String;
        /// CA the agents' certificates are checked against (mtls).
        tls_ca_file: String = String::new(), flag String;
        /// With etcd and TLS: the name the analysis leader's certificate is checked
        /// against when this replica forwards to it; empty = the leader's address.
        tls_server_name: String = String::new(), flag String;
        /// mtls: where an agent's identity is read from its client certificate: auto (the
        /// first SAN DNS name, else SAN URI, else subject CN), san_dns, san_uri or cn. An agent
        /// may register and report only as that agent_id.
        tls_identity_from: String = "auto".into(), flag String;
        /// mtls with etcd: the identities (read as tls_identity_from says) of the replicas'
        /// certificates, comma-separated. Replicas forward path reports to the analysis
        /// leader over mTLS with tls_cert_file, which must allow client use too
        /// (extendedKeyUsage serverAuth,clientAuth); only these may forward.
        tls_replica_identities: String = String::new(), flag String;
        /// Operator roles on the operator gRPC API, the web page's JSON API and /metrics:
        /// auto (on when operator_tokens_file or tls_operator_roles is set), on, off.
        operator_auth: String = "auto".into(), flag String;
        /// Bearer tokens of operators and viewers: lines `ROLE SHA256-HEX NAME` (the sha256sum
        /// of the token, never the token); read again on SIGHUP.
        operator_tokens_file: String = String::new(), flag String;
        /// mtls: client certificates' roles, `NAME=ROLE,...` (NAME an OU or the certificate's
        /// identity; ROLE viewer or operator).
        tls_operator_roles: String = String::new(), flag String;
        /// Audit log: a file that gets one JSON line per registration, operator action and
        /// refusal; empty = the controller's log (target `audit`).
        audit_log_file: String = String::new(), flag String;
        /// Export the controller's metrics.
        metrics_enabled: bool = true, flag bool;
        /// OTLP export period.
        metrics_export_interval_ms: u64 = 10_000, flag u64;
        /// Fixed seed for pinglist randomness (tests); `None` = fresh randomness per request.
        pinglist_seed: Option<u64> = None, flag u64;
        /// Service flows of an agent that has not reported for this long are dropped.
        service_flow_ttl_sec: u64 = 120, flag u64;
        /// Service flows held per agent; new flows beyond it are rejected and counted.
        max_service_flows_per_agent: u32 = 4096, flag u32;
        /// Distinct service names in use at once; further names become "other".
        max_services: u32 = 64, flag u32;
        /// Registrations (heartbeats included) per caller per minute, with a burst of as
        /// many; the caller is the certificate's agent under mtls, else the agent_id it claims.
        /// 0 = no limit.
        max_registrations_per_minute: u32 = 120, flag u32;
        /// RNICs in one agent's registration, at most.
        max_rnics_per_agent: u32 = 64, flag u32;
        /// Path summaries in one report, at most.
        max_summaries_per_report: u32 = 50_000, flag u32;
        /// Where metrics go when metrics_enabled: otlp (push), prometheus (/metrics) or both.
        /// otlp | prometheus | both.
        metrics_exporter: String = "otlp".into(), flag String;
        /// Address of the Prometheus `/metrics` endpoint (exporter prometheus or both).
        prometheus_listen_addr: String = ":9465".into(), flag String;
        /// Address of the operator web page and its JSON API (e.g. 127.0.0.1:8080); empty =
        /// off.
        http_listen_addr: String = String::new(), flag String;
        /// The web page over HTTPS with tls_cert_file/tls_key_file: auto (when tls_mode is tls
        /// or mtls), on, off.
        http_tls: String = "auto".into(), flag String;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    Disabled,
    Tls,
    Mtls,
}

/// One-line configuration error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid config key `{key}`: {msg}")]
    Invalid { key: &'static str, msg: String },
    #[error("{0}")]
    Load(String),
}

fn invalid(key: &'static str, msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        msg: msg.into(),
    }
}

fn describe(err: &figment::Error) -> String {
    let source = match &err.metadata {
        Some(md) => match &md.source {
            Some(src) => format!("{} {}", src, md.name),
            None => md.name.to_string(),
        },
        None => "configuration".to_string(),
    };
    match &err.kind {
        figment::error::Kind::UnknownField(name, _) => {
            format!("unknown config key `{name}` (in {source})")
        }
        kind => {
            let path = err.path.join(".");
            if path.is_empty() {
                format!("config error in {source}: {kind}")
            } else {
                format!("invalid config key `{path}` (in {source}): {kind}")
            }
        }
    }
}

impl ControllerConfig {
    /// Loads defaults < file < env < flags and validates. `env` is normally
    /// `std::env::vars()`; tests pass their own pairs.
    pub fn load(
        cli: &CliArgs,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut fig = Figment::from(figment::providers::Serialized::defaults(Self::default()));
        let env: Vec<(String, String)> = env.into_iter().collect();
        // Without --config, controller.yaml in ., $HOME/.rpingmesh, /etc/rpingmesh (as Go).
        let file =
            rpingmesh_proto::host::chosen_config(cli.config.as_deref(), "controller.yaml", &env);
        if let Some(path) = &file {
            fig = fig.merge(yaml_file(path)?);
        }
        fig = fig.merge(NamedDict {
            name: "environment (RPINGMESH_*)",
            dict: env_dict(ENV_PREFIX, KEYS, &env),
        });
        let flags = match Value::serialize(cli) {
            Ok(Value::Dict(_, d)) => d,
            Ok(_) => Dict::new(),
            Err(e) => return Err(ConfigError::Load(format!("command-line flags: {e}"))),
        };
        fig = fig.merge(NamedDict {
            name: "command-line flags",
            dict: flags,
        });
        Self::finish(fig)
    }

    /// `load`'s layering and checks over YAML text instead of a file, without
    /// environment or flags (fuzzing and tests).
    pub fn from_yaml_str(text: &str) -> Result<Self, ConfigError> {
        let fig = Figment::from(figment::providers::Serialized::defaults(Self::default()))
            .merge(serde_saphyr::figment::Yaml::string(text));
        Self::finish(fig)
    }

    fn finish(fig: Figment) -> Result<Self, ConfigError> {
        let cfg: Self = fig.extract().map_err(|e| ConfigError::Load(describe(&e)))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks ranges and cross-key constraints; the first problem is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.listen_socket_addr()?;
        self.database()?;
        if !(2..=3600).contains(&self.leader_lease_ttl_sec) {
            return Err(invalid(
                "leader_lease_ttl_sec",
                format!("must be 2..=3600, got {}", self.leader_lease_ttl_sec),
            ));
        }
        if self.active_threshold_sec == 0 {
            return Err(invalid("active_threshold_sec", "must be > 0"));
        }
        if self.stale_threshold_sec == 0 {
            return Err(invalid("stale_threshold_sec", "must be > 0"));
        }
        if self.stale_threshold_sec < self.active_threshold_sec {
            return Err(invalid(
                "stale_threshold_sec",
                format!(
                    "must be >= active_threshold_sec ({}), got {}",
                    self.active_threshold_sec, self.stale_threshold_sec
                ),
            ));
        }
        if self.inter_tor_sample_size == 0 {
            return Err(invalid("inter_tor_sample_size", "must be >= 1"));
        }
        if self.ecmp_paths_assumed < 2 {
            return Err(invalid(
                "ecmp_paths_assumed",
                format!("must be >= 2, got {}", self.ecmp_paths_assumed),
            ));
        }
        let p = self.ecmp_coverage_probability;
        if !(p > 0.0 && p < 1.0) {
            return Err(invalid(
                "ecmp_coverage_probability",
                format!("must be in (0,1), got {p}"),
            ));
        }
        if self.ecmp_max_flow_labels == 0 {
            return Err(invalid("ecmp_max_flow_labels", "must be >= 1"));
        }
        let l = self.analyzer_sla_loss_ratio;
        if !(0.0..=1.0).contains(&l) {
            return Err(invalid(
                "analyzer_sla_loss_ratio",
                format!("must be in [0,1], got {l}"),
            ));
        }
        if self.analyzer_window_retention == 0 {
            return Err(invalid("analyzer_window_retention", "must be >= 1"));
        }
        if self.analyzer_localize_settle_sec > MAX_LOCALIZE_SETTLE_SEC {
            return Err(invalid(
                "analyzer_localize_settle_sec",
                format!(
                    "must be <= {MAX_LOCALIZE_SETTLE_SEC}, got {}",
                    self.analyzer_localize_settle_sec
                ),
            ));
        }
        if self.analyzer_open_after_windows == 0 {
            return Err(invalid("analyzer_open_after_windows", "must be >= 1"));
        }
        if self.analyzer_resolve_after_windows == 0 {
            return Err(invalid("analyzer_resolve_after_windows", "must be >= 1"));
        }
        if self.analyzer_enabled {
            self.topology()?;
        }
        if self.service_flow_ttl_sec == 0 {
            return Err(invalid("service_flow_ttl_sec", "must be > 0"));
        }
        if self.max_service_flows_per_agent == 0 {
            return Err(invalid("max_service_flows_per_agent", "must be >= 1"));
        }
        if self.max_services == 0 {
            return Err(invalid("max_services", "must be >= 1"));
        }
        let exporter = self.exporter()?;
        if self.metrics_enabled && exporter.prometheus() {
            self.prometheus_socket_addr()?;
        }
        self.http_socket_addr()?;
        if self.metrics_enabled && exporter.otlp() {
            if self.otel_collector_addr.trim().is_empty() {
                return Err(invalid(
                    "otel_collector_addr",
                    "must not be empty when metrics_enabled",
                ));
            }
            if self.metrics_export_interval_ms == 0 {
                return Err(invalid("metrics_export_interval_ms", "must be > 0"));
            }
        }
        match self.log_level.to_ascii_lowercase().as_str() {
            "trace" | "debug" | "info" | "warn" | "error" => {}
            other => {
                return Err(invalid(
                    "log_level",
                    format!("must be one of trace, debug, info, warn, error; got {other:?}"),
                ))
            }
        }
        let mode = self.tls()?;
        if mode != TlsMode::Disabled {
            require_readable("tls_cert_file", &self.tls_cert_file, &self.tls_mode)?;
            require_readable("tls_key_file", &self.tls_key_file, &self.tls_mode)?;
        }
        if mode == TlsMode::Mtls {
            require_readable("tls_ca_file", &self.tls_ca_file, &self.tls_mode)?;
        }
        self.agent_auth()?;
        self.operator_auth_enabled()?;
        self.http_tls()?;
        Ok(())
    }

    /// The analyzer's parameters from the `analyzer_*` keys.
    pub fn analyzer_params(&self) -> AnalyzerParams {
        AnalyzerParams {
            sla_loss_ratio: self.analyzer_sla_loss_ratio,
            sla_network_rtt_p99_ns: self.analyzer_sla_network_rtt_p99_ns,
            window_retention: self.analyzer_window_retention as usize,
            localize_settle_ns: self
                .analyzer_localize_settle_sec
                .saturating_mul(1_000_000_000),
            localizer: LocalizerParams {
                open_after_windows: self.analyzer_open_after_windows,
                resolve_after_windows: self.analyzer_resolve_after_windows,
                ..LocalizerParams::default()
            },
            ..AnalyzerParams::default()
        }
    }

    /// Adaptive probing's bounds from the `analyzer_focus_*` keys.
    pub fn focus_params(&self) -> FocusParams {
        FocusParams {
            max_components: self.analyzer_focus_max_components as usize,
            sources: self.analyzer_focus_sources as usize,
            active_threshold_sec: self.active_threshold_sec,
            ..FocusParams::default()
        }
    }

    /// Reads and checks `analyzer_topology_file`; `None` when it is empty. The error is
    /// one line naming the key, the path and what is wrong.
    pub fn topology(&self) -> Result<Option<Topology>, ConfigError> {
        let path = self.analyzer_topology_file.trim();
        if path.is_empty() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(path).map_err(|e| {
            invalid(
                "analyzer_topology_file",
                format!("cannot read {path:?}: {e}"),
            )
        })?;
        Topology::from_yaml(&text).map(Some).map_err(|e| {
            invalid(
                "analyzer_topology_file",
                format!("{path:?}: {}", e.to_string().replace('\n', " ")),
            )
        })
    }

    /// `listen_addr` as a socket address; ":port" means all IPv4 interfaces.
    pub fn listen_socket_addr(&self) -> Result<SocketAddr, ConfigError> {
        parse_listen_addr(&self.listen_addr).map_err(|m| invalid("listen_addr", m))
    }

    pub fn database(&self) -> Result<DatabaseUri, ConfigError> {
        let uri = self.database_uri.trim();
        if uri.starts_with("http://") || uri.starts_with("https://") {
            return Err(ConfigError::Load(format!(
                "database_uri {uri}: rqlite is not supported; use sqlite:<path> (embedded, on disk) or sqlite::memory:"
            )));
        }
        if uri == "sqlite::memory:" {
            return Ok(DatabaseUri::SqliteMemory);
        }
        if let Some(path) = uri.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(invalid(
                    "database_uri",
                    format!("{uri}: missing path after sqlite:"),
                ));
            }
            return Ok(DatabaseUri::SqliteFile(PathBuf::from(path)));
        }
        if let Some(ep) = uri.strip_prefix("etcd://") {
            if ep.is_empty() {
                return Err(invalid("database_uri", format!("{uri}: missing host:port")));
            }
            return Ok(DatabaseUri::Etcd(ep.to_string()));
        }
        Err(invalid(
            "database_uri",
            format!("{uri:?}: expected sqlite:<path> or sqlite::memory:"),
        ))
    }

    pub fn exporter(&self) -> Result<Exporter, ConfigError> {
        Exporter::parse(&self.metrics_exporter).ok_or_else(|| {
            invalid(
                "metrics_exporter",
                format!(
                    "must be {}; got {:?}",
                    Exporter::CHOICES,
                    self.metrics_exporter
                ),
            )
        })
    }

    pub fn prometheus_socket_addr(&self) -> Result<SocketAddr, ConfigError> {
        parse_listen_addr(&self.prometheus_listen_addr)
            .map_err(|m| invalid("prometheus_listen_addr", m))
    }

    /// `None` when the web page is off.
    pub fn http_socket_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        if self.http_listen_addr.trim().is_empty() {
            return Ok(None);
        }
        parse_listen_addr(&self.http_listen_addr)
            .map(Some)
            .map_err(|m| invalid("http_listen_addr", m))
    }

    pub fn tls(&self) -> Result<TlsMode, ConfigError> {
        match self.tls_mode.to_ascii_lowercase().as_str() {
            "" | "disabled" => Ok(TlsMode::Disabled),
            "tls" => Ok(TlsMode::Tls),
            "mtls" => Ok(TlsMode::Mtls),
            other => Err(invalid(
                "tls_mode",
                format!("must be disabled, tls or mtls; got {other:?}"),
            )),
        }
    }

    /// How agent identities are read and whether they are enforced (mtls only).
    pub fn agent_auth(&self) -> Result<AgentAuth, ConfigError> {
        let from = IdentitySource::parse(&self.tls_identity_from).ok_or_else(|| {
            invalid(
                "tls_identity_from",
                format!(
                    "must be {}; got {:?}",
                    IdentitySource::NAMES,
                    self.tls_identity_from
                ),
            )
        })?;
        Ok(AgentAuth {
            enforce: self.tls()? == TlsMode::Mtls,
            from,
            replicas: self
                .tls_replica_identities
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
        })
    }

    /// Whether the web page is served over TLS (`http_tls`).
    pub fn http_tls(&self) -> Result<bool, ConfigError> {
        let tls = self.tls()? != TlsMode::Disabled;
        match self.http_tls.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(tls),
            "on" if !tls => Err(invalid(
                "http_tls",
                "on needs tls_mode tls or mtls (its tls_cert_file and tls_key_file)".to_string(),
            )),
            "on" => Ok(true),
            "off" => Ok(false),
            other => Err(invalid(
                "http_tls",
                format!("must be auto, on or off; got {other:?}"),
            )),
        }
    }

    /// Whether the operator surfaces ask for a role (`operator_auth`), and the
    /// certificates' roles.
    pub fn operator_auth_enabled(&self) -> Result<(bool, CertRoles), ConfigError> {
        let roles = CertRoles::parse(&self.tls_operator_roles)
            .map_err(|m| invalid("tls_operator_roles", m))?;
        let configured = !self.operator_tokens_file.trim().is_empty() || !roles.is_empty();
        let on = match self.operator_auth.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => configured,
            "on" if !configured => {
                return Err(invalid(
                    "operator_auth",
                    "on needs operator_tokens_file or tls_operator_roles".to_string(),
                ))
            }
            "on" => true,
            "off" => false,
            other => {
                return Err(invalid(
                    "operator_auth",
                    format!("must be auto, on or off; got {other:?}"),
                ))
            }
        };
        Ok((on, roles))
    }

    /// OTLP endpoint with a scheme (the Go config takes bare host:port).
    pub fn otel_endpoint(&self) -> String {
        rpingmesh_proto::endpoint::grpc_uri(&self.otel_collector_addr, false)
    }
}

fn require_readable(key: &'static str, path: &str, mode: &str) -> Result<(), ConfigError> {
    if path.trim().is_empty() {
        return Err(invalid(key, format!("required when tls_mode={mode}")));
    }
    std::fs::File::open(path)
        .map(|_| ())
        .map_err(|e| invalid(key, format!("cannot read {path:?}: {e}")))
}

fn yaml_file(
    path: &Path,
) -> Result<figment::providers::Data<serde_saphyr::figment::Yaml>, ConfigError> {
    // figment silently ignores a missing file; an explicit --config must exist.
    std::fs::metadata(path)
        .map_err(|e| ConfigError::Load(format!("config file {}: {e}", path.display())))?;
    Ok(serde_saphyr::figment::Yaml::file_exact(path))
}

/// Defaults as `key: value` YAML lines, for documentation and tests.
pub fn default_keys() -> BTreeMap<&'static str, String> {
    let d = ControllerConfig::default();
    let v = serde_json::to_value(&d).expect("config serializes");
    KEYS.iter()
        .map(|k| (*k, v.get(*k).map(|x| x.to_string()).unwrap_or_default()))
        .collect()
}

#[cfg(test)]
mod tests;
