//! Telemetry: OTLP/gRPC analyzer metrics (service.name=rpingmesh-analyzer) and
//! structured JSON logs on stderr. Exporter failures are logged, never fatal.

use std::time::Duration;

use opentelemetry::metrics::{Counter, Meter, MeterProvider};
use opentelemetry::KeyValue;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;

use crate::analyzer::ViolationKind;
use crate::config::ControllerConfig;

pub const SERVICE_NAME: &str = "rpingmesh-analyzer";
pub const METRIC_PATH_SUMMARIES: &str = "rpingmesh.analyzer.path_summaries_total";
pub const METRIC_SLA_VIOLATIONS: &str = "rpingmesh.analyzer.sla_violations_total";

/// Analyzer counters. Attributes are ToR-level only (bounded cardinality); per-GID
/// detail goes to logs and the operator API.
#[derive(Clone, Debug)]
pub struct AnalyzerMetrics {
    summaries: Counter<u64>,
    violations: Counter<u64>,
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
    provider: Option<SdkMeterProvider>,
    pub metrics: AnalyzerMetrics,
}

impl Telemetry {
    /// Builds the OTLP pipeline when `metrics_enabled`. Must run inside a Tokio
    /// runtime (the tonic channel spawns onto it). Never fails: a bad endpoint is
    /// logged and metrics are disabled.
    pub fn init(cfg: &ControllerConfig) -> Self {
        if !cfg.metrics_enabled {
            return Self {
                provider: None,
                metrics: AnalyzerMetrics::noop(),
            };
        }
        let endpoint = cfg.otel_endpoint();
        let exporter = match opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .with_timeout(Duration::from_secs(5))
            .build()
        {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(endpoint = %endpoint, error = %e, "OTLP metric exporter disabled");
                return Self {
                    provider: None,
                    metrics: AnalyzerMetrics::noop(),
                };
            }
        };
        let reader = PeriodicReader::builder(exporter)
            .with_interval(Duration::from_millis(cfg.metrics_export_interval_ms.max(1)))
            .build();
        let provider = SdkMeterProvider::builder()
            .with_resource(
                Resource::builder()
                    .with_service_name(SERVICE_NAME)
                    .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                    .with_attribute(KeyValue::new(
                        "service.instance.id",
                        rpingmesh_proto::host::local_hostname(),
                    ))
                    .build(),
            )
            .with_reader(reader)
            .build();
        let metrics = AnalyzerMetrics::new(&provider.meter("rpingmesh-controller"));
        tracing::info!(endpoint = %endpoint, interval_ms = cfg.metrics_export_interval_ms, "OTLP metrics enabled");
        Self {
            provider: Some(provider),
            metrics,
        }
    }

    /// Flushes and stops the exporter; errors are logged.
    pub fn shutdown(self) {
        if let Some(p) = self.provider {
            if let Err(e) = p.shutdown() {
                tracing::warn!(error = %e, "metrics shutdown");
            }
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
