//! The agent configuration's checks beyond its types: every key's bounds and the rules
//! between keys (rc ring, Hostping, service tracing, TLS), the first problem named by its
//! key in one line.

use super::*;
use rpingmesh_proto::endpoint::check_client_tls_files;

/// `key` must not be 0.
fn nonzero<T: PartialEq + Default>(key: &str, v: T) -> Result<(), ConfigError> {
    if v == T::default() {
        return Err(err(format!("{key} must be > 0")));
    }
    Ok(())
}

/// `key` must lie in `range` (both ends in the message).
fn in_range<T: PartialOrd + std::fmt::Display>(
    key: &str,
    v: T,
    range: std::ops::RangeInclusive<T>,
) -> Result<(), ConfigError> {
    if !range.contains(&v) {
        let (lo, hi) = range.into_inner();
        return Err(err(format!("{key} must be in {lo}..={hi}, got {v}")));
    }
    Ok(())
}

impl AgentConfig {
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
        nonzero("probe_interval_ms", self.probe_interval_ms)?;
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
        nonzero(
            "pinglist_update_interval_sec",
            self.pinglist_update_interval_sec,
        )?;
        in_range("gid_index", self.gid_index, 0..=255)?;
        in_range("service_level", self.service_level, 0..=7)?;
        in_range("traffic_class", self.traffic_class, 0..=255)?;
        let exporter = self.exporter()?;
        if self.metrics_enabled && exporter.prometheus() {
            self.prometheus_socket_addr()?;
        }
        if self.metrics_enabled && exporter.otlp() && self.otel_collector_addr.trim().is_empty() {
            return Err(err(
                "otel_collector_addr must not be empty when metrics_enabled is true",
            ));
        }
        nonzero("analysis_window_sec", self.analysis_window_sec)?;
        nonzero("watchdog_interval_sec", self.watchdog_interval_sec)?;
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
        nonzero("probe_timeout_ms", self.probe_timeout_ms)?;
        nonzero(
            "metrics_export_interval_ms",
            self.metrics_export_interval_ms,
        )?;
        nonzero("report_batch_max", self.report_batch_max)?;
        self.validate_service()?;
        self.validate_hostping()?;
        self.validate_rc_ring()
    }
}

impl AgentConfig {
    pub(super) fn validate_rc_ring(&self) -> Result<(), ConfigError> {
        for k in &self.rc_ring_pinglists {
            if !matches!(k.as_str(), "service" | "tor_mesh" | "inter_tor") {
                return Err(err(format!(
                    "rc_ring_pinglists: {k:?} is not a pinglist (service, tor_mesh, inter_tor)"
                )));
            }
        }
        nonzero("rc_ring_port", self.rc_ring_port)?;
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
        in_range("rc_ring_max_rings", self.rc_ring_max_rings, 1..=4096)?;
        in_range(
            "rc_ring_probe_interval_ms",
            self.rc_ring_probe_interval_ms,
            10..=3_600_000,
        )?;
        if self.rc_ring_probe_timeout_ms == 0
            || self.rc_ring_probe_timeout_ms > self.rc_ring_probe_interval_ms
        {
            return Err(err(format!(
                "rc_ring_probe_timeout_ms must be in 1..=rc_ring_probe_interval_ms ({}), got {}",
                self.rc_ring_probe_interval_ms, self.rc_ring_probe_timeout_ms
            )));
        }
        in_range(
            "rc_ring_hot_wait_us",
            self.rc_ring_hot_wait_us,
            1..=1_000_000,
        )?;
        in_range(
            "rc_ring_poll_lead_us",
            self.rc_ring_poll_lead_us,
            1..=1_000_000,
        )
    }

    pub(super) fn validate_hostping(&self) -> Result<(), ConfigError> {
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
}

impl AgentConfig {
    pub(super) fn validate_service(&self) -> Result<(), ConfigError> {
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
        nonzero("max_service_names", self.max_service_names)?;
        if !(1..=60_000).contains(&self.service_flow_report_interval_ms) {
            return Err(err(format!(
                "service_flow_report_interval_ms must be in 1..=60000 (the controller expires flows of agents silent for 120 s), got {}",
                self.service_flow_report_interval_ms
            )));
        }
        Ok(())
    }

    pub(super) fn validate_tls(&self) -> Result<(), ConfigError> {
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
        let files = [&self.tls_ca_file, &self.tls_cert_file, &self.tls_key_file];
        check_client_tls_files(self.tls_mode_str(), files.map(String::as_str), need)
    }

    pub(super) fn tls_mode_str(&self) -> &'static str {
        match self.tls_mode {
            TlsMode::Disabled => "disabled",
            TlsMode::Tls => "tls",
            TlsMode::Mtls => "mtls",
        }
    }
}
