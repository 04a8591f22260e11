//! Telemetry: analyzer and controller metrics (service.name=rpingmesh-analyzer), pushed
//! over OTLP and/or scraped from /metrics, and structured JSON logs on stderr. Exporter
//! failures are logged, never fatal.

use std::time::Duration;

use opentelemetry::metrics::{Counter, Meter, MeterProvider};
use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;
use rpingmesh_metrics_export::{Exporter, MetricsPipeline, PipelineOptions};

use crate::analyzer::ViolationKind;
use crate::config::ControllerConfig;

pub const SERVICE_NAME: &str = "rpingmesh-analyzer";
pub const METRIC_PATH_SUMMARIES: &str = "rpingmesh.analyzer.path_summaries_total";
pub const METRIC_SLA_VIOLATIONS: &str = "rpingmesh.analyzer.sla_violations_total";
pub const METRIC_FINDINGS_OPEN: &str = "rpingmesh.analyzer.findings_open";
pub const METRIC_AFFECTED_SERVICES: &str = "rpingmesh.analyzer.affected_services";
pub const METRIC_FINDINGS_SUPPRESSED: &str = "rpingmesh.analyzer.findings_suppressed";
pub const METRIC_RNICS: &str = "rpingmesh.controller.rnics";
pub const METRIC_SERVICE_PATHS: &str = "rpingmesh.controller.service_paths";
pub const METRIC_HOST_FINDINGS: &str = "rpingmesh.hostping.host_findings";
pub const METRIC_FOCUS_TARGETS: &str = "rpingmesh.analyzer.focus_targets";
pub const METRIC_FOCUS_PROBES: &str = "rpingmesh.analyzer.focus_probes_total";
pub const METRIC_AUTH_DENIED: &str = "rpingmesh.controller.auth_denied_total";
pub const METRIC_LIMITED: &str = "rpingmesh.controller.limited_total";

/// Analyzer counters. Attributes are ToR-level only (bounded cardinality); per-GID
/// detail goes to logs and the operator API.
#[derive(Clone, Debug)]
pub struct AnalyzerMetrics {
    summaries: Counter<u64>,
    violations: Counter<u64>,
    auth_denied: Counter<u64>,
    limited: Counter<u64>,
}

impl AnalyzerMetrics {
    pub fn new(meter: &Meter) -> Self {
        Self {
            summaries: meter
                .u64_counter(METRIC_PATH_SUMMARIES)
                .with_description("Per-path window summaries ingested")
                .build(),
            violations: meter
                .u64_counter(METRIC_SLA_VIOLATIONS)
                .with_description("SLA violations detected")
                .build(),
            auth_denied: meter
                .u64_counter(METRIC_AUTH_DENIED)
                .with_description("Calls refused because the caller may not say that")
                .build(),
            limited: meter
                .u64_counter(METRIC_LIMITED)
                .with_description("Calls refused because they went over a per-caller limit")
                .build(),
        }
    }

    /// Counters that record nothing (metrics disabled, tests, benches).
    pub fn noop() -> Self {
        let p = opentelemetry::metrics::noop::NoopMeterProvider::new();
        Self::new(&p.meter(SERVICE_NAME))
    }

    pub fn summaries_ingested(&self, n: u64) {
        if n > 0 {
            self.summaries.add(n, &[]);
        }
    }

    /// A refused call. `rpc` and `reason` are fixed strings of the code (bounded).
    pub fn auth_denied(&self, rpc: &'static str, reason: &'static str) {
        self.auth_denied.add(
            1,
            &[KeyValue::new("rpc", rpc), KeyValue::new("reason", reason)],
        );
    }

    /// A call over a limit. `rpc` and `limit` are fixed strings of the code (bounded).
    pub fn limited(&self, rpc: &'static str, limit: &'static str) {
        self.limited.add(
            1,
            &[KeyValue::new("rpc", rpc), KeyValue::new("limit", limit)],
        );
    }

    /// `service` is set for SERVICE paths only, and must already be bounded (a name the
    /// service-path table hands out, or "other").
    pub fn violation(
        &self,
        source_tor: &str,
        target_tor: &str,
        kind: ViolationKind,
        service: Option<&str>,
    ) {
        let mut attrs = vec![
            KeyValue::new("source_tor", source_tor.to_string()),
            KeyValue::new("target_tor", target_tor.to_string()),
            KeyValue::new("kind", kind.as_str()),
        ];
        if let Some(s) = service {
            attrs.push(KeyValue::new("service", s.to_string()));
        }
        self.violations.add(1, &attrs);
    }
}

/// The metrics pipeline; keep it alive for the process lifetime and call
/// [`Telemetry::shutdown`] to flush at exit.
pub struct Telemetry {
    pipeline: Option<MetricsPipeline>,
    pub metrics: AnalyzerMetrics,
}

impl Telemetry {
    /// Builds the pipeline `metrics_enabled` and `metrics_exporter` ask for. Must run
    /// inside a Tokio runtime (the OTLP channel spawns onto it). Never fails: a bad
    /// endpoint is logged and metrics go nowhere.
    pub fn init(cfg: &ControllerConfig) -> Self {
        if !cfg.metrics_enabled {
            return Self {
                pipeline: None,
                metrics: AnalyzerMetrics::noop(),
            };
        }
        let pipeline = MetricsPipeline::build(PipelineOptions {
            enabled: true,
            exporter: cfg.exporter().unwrap_or(Exporter::Otlp),
            otlp_endpoint: cfg.otel_endpoint(),
            export_interval: Duration::from_millis(cfg.metrics_export_interval_ms.max(1)),
            resource: Resource::builder()
                .with_service_name(SERVICE_NAME)
                .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                .with_attribute(KeyValue::new(
                    "service.instance.id",
                    rpingmesh_proto::host::local_hostname(),
                ))
                .build(),
        });
        let meter = pipeline.provider().meter("rpingmesh-controller");
        rpingmesh_metrics_export::process::register(&meter, "rpingmesh.controller");
        Self {
            metrics: AnalyzerMetrics::new(&meter),
            pipeline: Some(pipeline),
        }
    }

    /// The registry `/metrics` serves, when Prometheus export is on.
    pub fn prometheus_registry(&self) -> Option<rpingmesh_metrics_export::Registry> {
        self.pipeline.as_ref()?.prometheus_registry()
    }

    /// The meter the controller's own instruments hang on (none with metrics off).
    pub fn meter(&self) -> Option<Meter> {
        Some(
            self.pipeline
                .as_ref()?
                .provider()
                .meter("rpingmesh-controller"),
        )
    }

    /// Flushes and stops the exporter; errors are logged.
    pub fn shutdown(self) {
        if let Some(p) = self.pipeline {
            p.shutdown();
        }
    }
}

/// JSON logs to stderr at `level` (validated by the config). Safe to call twice.
pub fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level.to_ascii_lowercase())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .with_current_span(false)
        .try_init();
}
