//! The metrics pipeline both binaries share. Instruments are OpenTelemetry's; where
//! they go is configuration: OTLP push to a collector, a Prometheus `/metrics` endpoint
//! (OpenMetrics text, Prometheus naming), or both. Names follow the Go R-Pingmesh
//! contract on either path: `.` becomes `_`, and no unit or `_total` suffix is added
//! (the instrument names already carry them).
//!
//! Building never fails: a broken exporter is logged and metrics go nowhere, because a
//! monitor must keep probing when its metrics backend is misconfigured.

pub mod openmetrics;
pub mod process;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The registry a `/metrics` endpoint reads.
pub use prometheus::Registry;

/// Where metrics go (`metrics_exporter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exporter {
    Otlp,
    Prometheus,
    Both,
}

impl Exporter {
    pub const CHOICES: &'static str = "otlp, prometheus or both";

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "otlp" => Some(Exporter::Otlp),
            "prometheus" => Some(Exporter::Prometheus),
            "both" => Some(Exporter::Both),
            _ => None,
        }
    }
    pub fn otlp(self) -> bool {
        matches!(self, Exporter::Otlp | Exporter::Both)
    }
    pub fn prometheus(self) -> bool {
        matches!(self, Exporter::Prometheus | Exporter::Both)
    }
}

/// What a binary asks of the pipeline.
#[derive(Debug, Clone)]
pub struct PipelineOptions {
    /// `metrics_enabled`: false builds a provider without readers (instruments are no-ops).
    pub enabled: bool,
    pub exporter: Exporter,
    /// OTLP/gRPC endpoint with a scheme (used when `exporter.otlp()`).
    pub otlp_endpoint: String,
    pub export_interval: Duration,
    pub resource: Resource,
}

/// A meter provider with its readers, and the Prometheus registry when scraping is on.
pub struct MetricsPipeline {
    provider: SdkMeterProvider,
    registry: Option<prometheus::Registry>,
}

impl MetricsPipeline {
    /// Must run inside a tokio runtime when OTLP is selected (the tonic exporter needs one).
    pub fn build(o: PipelineOptions) -> Self {
        let mut builder = SdkMeterProvider::builder().with_resource(o.resource);
        let mut registry = None;
        if o.enabled && o.exporter.otlp() {
            use opentelemetry_otlp::WithExportConfig;
            match opentelemetry_otlp::MetricExporter::builder()
                .with_tonic()
                .with_endpoint(o.otlp_endpoint.clone())
                .with_timeout(Duration::from_secs(5))
                .build()
            {
                Ok(exporter) => {
                    let reader = PeriodicReader::builder(exporter)
                        .with_interval(o.export_interval)
                        .build();
                    builder = builder.with_reader(reader);
                    tracing::info!(endpoint = %o.otlp_endpoint, interval_ms = o.export_interval.as_millis() as u64, "OTLP metrics enabled");
                }
                Err(e) => tracing::error!(
                    endpoint = %o.otlp_endpoint,
                    error = %e,
                    "OTLP metric exporter could not be built; metrics are not pushed"
                ),
            }
        }
        if o.enabled && o.exporter.prometheus() {
            let reg = prometheus::Registry::new();
            match opentelemetry_prometheus::exporter()
                .with_registry(reg.clone())
                .without_units()
                .without_counter_suffixes()
                .build()
            {
                Ok(reader) => {
                    builder = builder.with_reader(reader);
                    registry = Some(reg);
                }
                Err(e) => tracing::error!(
                    error = %e,
                    "Prometheus metric reader could not be built; /metrics is not served"
                ),
            }
        }
        MetricsPipeline {
            provider: builder.build(),
            registry,
        }
    }

    pub fn provider(&self) -> &SdkMeterProvider {
        &self.provider
    }

    /// The registry `/metrics` reads, when Prometheus export is on and built.
    pub fn prometheus_registry(&self) -> Option<prometheus::Registry> {
        self.registry.clone()
    }

    /// Final export, best-effort. Blocks while an OTLP push flushes.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "metrics shutdown");
        }
    }
}

/// One scrape: OpenMetrics when the client accepts it (Prometheus does), otherwise the
/// classic text format (curl, older scrapers).
pub fn scrape(registry: &prometheus::Registry, accept: &str) -> (&'static str, String) {
    let families = registry.gather();
    if accept.contains("application/openmetrics-text") {
        (openmetrics::CONTENT_TYPE, openmetrics::encode(&families))
    } else {
        let mut body = String::new();
        if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&families, &mut body) {
            tracing::warn!(error = %e, "encoding /metrics");
        }
        (prometheus::TEXT_FORMAT, body)
    }
}

/// `GET /metrics` over `registry`.
pub fn router(registry: prometheus::Registry) -> Router {
    let registry = Arc::new(registry);
    Router::new().route(
        "/metrics",
        get(move |headers: HeaderMap| {
            let registry = registry.clone();
            async move {
                let accept = headers
                    .get(header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                // Collection runs the observable callbacks (/proc reads): off the workers.
                match tokio::task::spawn_blocking(move || scrape(&registry, &accept)).await {
                    Ok((ct, body)) => ([(header::CONTENT_TYPE, ct)], body).into_response(),
                    Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                }
            }
        }),
    )
}

/// Binds `addr` and serves `router` until the task is aborted. A bind failure is returned
/// (the caller decides whether it is fatal).
pub async fn serve(
    addr: SocketAddr,
    router: Router,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let join = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, addr = %local, "HTTP server stopped");
        }
    });
    Ok((local, join))
}

/// `host:port` or `:port` (all interfaces) as a socket address.
pub fn parse_listen_addr(raw: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let raw = raw.trim();
    let text = if raw.starts_with(':') {
        format!("0.0.0.0{raw}")
    } else {
        raw.to_string()
    };
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(a);
    }
    match text.to_socket_addrs() {
        Ok(mut it) => it
            .next()
            .ok_or_else(|| format!("{raw:?} resolves to no address")),
        Err(e) => Err(format!("{raw:?} is not host:port or :port ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry::KeyValue;

    #[test]
    fn exporter_choices() {
        assert_eq!(Exporter::parse("Both"), Some(Exporter::Both));
        assert!(Exporter::parse("prometheus").unwrap().prometheus());
        assert!(!Exporter::parse("prometheus").unwrap().otlp());
        assert_eq!(Exporter::parse("statsd"), None);
    }

    #[test]
    fn listen_addr_forms() {
        assert_eq!(parse_listen_addr(":9464").unwrap().port(), 9464);
        assert_eq!(parse_listen_addr("127.0.0.1:0").unwrap().port(), 0);
        assert!(parse_listen_addr("nope").is_err());
    }

    /// The names a scrape shows are the OTel names with `.` -> `_` and nothing appended.
    #[tokio::test]
    async fn names_follow_the_go_contract() {
        let p = MetricsPipeline::build(PipelineOptions {
            enabled: true,
            exporter: Exporter::Prometheus,
            otlp_endpoint: String::new(),
            export_interval: Duration::from_secs(10),
            resource: Resource::builder().with_service_name("t").build(),
        });
        let m = p.provider().meter("t");
        let c = m.u64_counter("rpingmesh.probe_total").build();
        c.add(2, &[KeyValue::new("source_tor", "a")]);
        let h = m
            .u64_histogram("rpingmesh.network_rtt_ns")
            .with_unit("ns")
            .with_boundaries(vec![100.0, 1000.0])
            .build();
        h.record(500, &[]);
        process::register(&m, "rpingmesh.agent");
        let reg = p.prometheus_registry().unwrap();
        let (ct, om) = scrape(&reg, "application/openmetrics-text;version=1.0.0");
        assert_eq!(ct, openmetrics::CONTENT_TYPE);
        assert!(om.contains("# TYPE rpingmesh_probe counter\n"), "{om}");
        assert!(om.contains("rpingmesh_probe_total{"), "{om}");
        assert!(om.contains("rpingmesh_network_rtt_ns_bucket{"), "{om}");
        assert!(om.contains("le=\"1000\"} 1"), "{om}");
        assert!(om.contains("rpingmesh_agent_cpu_seconds_total"), "{om}");
        assert!(om.contains("rpingmesh_agent_rss_bytes"), "{om}");
        assert!(
            !om.contains("_total_total") && !om.contains("nanoseconds"),
            "{om}"
        );
        assert!(om.ends_with("# EOF\n"));
        let (ct, text) = scrape(&reg, "text/plain");
        assert_eq!(ct, prometheus::TEXT_FORMAT);
        assert!(text.contains("rpingmesh_probe_total{"), "{text}");
    }
}
