//! The agent's metrics with the Go agent's names, units and attributes (pushed over
//! OTLP and/or scraped from /metrics), and JSON logs.

use std::time::Duration;

use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::Resource;
use rpingmesh_metrics_export::{Exporter, MetricsPipeline, PipelineOptions};
use rpingmesh_protocol::rtt::{InvalidReason, RttSample};

pub const SERVICE_NAME: &str = "rpingmesh-agent";

/// Histogram bucket boundaries in ns (100 ns .. 10 ms), as in the Go agent.
pub const RTT_BUCKETS_NS: [f64; 11] = [
    100.0, 500.0, 1000.0, 5000.0, 10000.0, 50000.0, 100000.0, 500000.0, 1000000.0, 5000000.0,
    10000000.0,
];

/// A metric attribute's enum: its variants, `ALL` of them (one attribute set each, built
/// once, indexed by `variant as usize`) and the attribute value of each.
macro_rules! attribute_enum {
    ($(#[$m:meta])* $name:ident { $($variant:ident = $value:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($variant),+
        }

        impl $name {
            pub const ALL: [$name; [$($value),+].len()] = [$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $value),+
                }
            }
        }
    };
}

attribute_enum! {
    /// Why a probe failed (`reason` attribute of rpingmesh.probe_failed_total; the finer
    /// `reason_detail` for the invalid ones, and logs).
    FailReason {
        Timeout = "timeout",
        MissingTimestamp = "missing_timestamp",
        NegativeRtt = "negative_rtt",
        AbsurdRtt = "absurd_rtt",
        SendError = "send_error",
    }
}

impl FailReason {
    /// The `reason` attribute as the Go version spells it (timeout, send_error,
    /// invalid_rtt, unknown), so dashboards of a mixed fleet group alike.
    pub fn go_reason(self) -> &'static str {
        match self {
            FailReason::Timeout => "timeout",
            FailReason::SendError => "send_error",
            FailReason::MissingTimestamp | FailReason::NegativeRtt | FailReason::AbsurdRtt => {
                "invalid_rtt"
            }
        }
    }
    pub fn from_invalid(r: InvalidReason) -> Self {
        match r {
            InvalidReason::MissingTimestamp => FailReason::MissingTimestamp,
            InvalidReason::Negative => FailReason::NegativeRtt,
            InvalidReason::Absurd => FailReason::AbsurdRtt,
        }
    }
}

attribute_enum! {
    /// Why an incoming datagram was dropped (`reason` of rpingmesh.agent.dropped_packets_total).
    DropReason {
        BadLength = "bad_length",
        BadVersion = "bad_version",
        UnknownMsgType = "unknown_msg_type",
        UnknownAckType = "unknown_ack_type",
        Inconsistent = "inconsistent",
    }
}

/// Attribute arrays of one (source ToR, target ToR) pair, plus the bounded `service` of
/// a SERVICE target, built once per target so that recording a probe allocates nothing.
#[derive(Debug, Clone)]
pub struct PathAttrs {
    base: Box<[KeyValue]>,
    failed: [Box<[KeyValue]>; 5],
}

impl PathAttrs {
    /// ToR-mesh and inter-ToR targets: exactly source_tor and target_tor.
    pub fn new(source_tor: &str, target_tor: &str) -> Self {
        Self::build(source_tor, target_tor, None)
    }

    /// SERVICE targets: `service` must already be capped (see `service::ServiceNameCap`).
    pub fn with_service(source_tor: &str, target_tor: &str, service: &str) -> Self {
        Self::build(source_tor, target_tor, Some(service))
    }

    fn build(source_tor: &str, target_tor: &str, service: Option<&str>) -> Self {
        let mut base = vec![
            KeyValue::new("source_tor", source_tor.to_string()),
            KeyValue::new("target_tor", target_tor.to_string()),
        ];
        if let Some(svc) = service {
            base.push(KeyValue::new("service", svc.to_string()));
        }
        let failed = FailReason::ALL.map(|r| {
            let mut v = base.clone();
            v.push(KeyValue::new("reason", r.go_reason()));
            if r.go_reason() != r.as_str() {
                // Which invalid_rtt: a bounded second attribute, ours only.
                v.push(KeyValue::new("reason_detail", r.as_str()));
            }
            v.into_boxed_slice()
        });
        PathAttrs {
            base: base.into_boxed_slice(),
            failed,
        }
    }
}

/// The agent's instruments. Cheap to clone (handles to shared instruments).
#[derive(Clone)]
pub struct Metrics {
    network_rtt: Histogram<u64>,
    prober_delay: Histogram<u64>,
    responder_delay: Histogram<u64>,
    success: Counter<u64>,
    failed: Counter<u64>,
    total: Counter<u64>,
    dropped: Counter<u64>,
    drop_attrs: [[KeyValue; 1]; 5],
    transport_failures: Counter<u64>,
    event_ring_dropped: Counter<u64>,
    qp_resets: Counter<u64>,
    tracer_ringbuf_dropped: Counter<u64>,
    rc_ring_rtt: Histogram<u64>,
    rc_ring_total: Counter<u64>,
    rc_ring_failed: Counter<u64>,
    rc_ring_discarded_credit_reads: Counter<u64>,
    /// For instruments built elsewhere (the Hostping monitor's gauges).
    meter: Meter,
}

impl Metrics {
    pub fn new(meter: &Meter) -> Self {
        let m = Self::instruments(meter);
        // Health counters start at 0 so that a scrape shows them (and a dashboard a
        // flat line) before anything went wrong.
        for a in &m.drop_attrs {
            m.dropped.add(0, a);
        }
        m.transport_failures.add(0, &[]);
        m.event_ring_dropped.add(0, &[]);
        m.qp_resets.add(0, &[]);
        m.tracer_ringbuf_dropped.add(0, &[]);
        m.rc_ring_discarded_credit_reads.add(0, &[]);
        m
    }

    fn instruments(meter: &Meter) -> Self {
        let hist = |name: &'static str, desc: &'static str| {
            meter
                .u64_histogram(name)
                .with_unit("ns")
                .with_description(desc)
                .with_boundaries(RTT_BUCKETS_NS.to_vec())
                .build()
        };
        Metrics {
            network_rtt: hist("rpingmesh.network_rtt_ns", "Pure network round-trip time"),
            prober_delay: hist(
                "rpingmesh.prober_delay_ns",
                "Prober-side processing overhead",
            ),
            responder_delay: hist("rpingmesh.responder_delay_ns", "Responder processing time"),
            success: meter
                .u64_counter("rpingmesh.probe_success_total")
                .with_description("Successful probe count")
                .build(),
            failed: meter
                .u64_counter("rpingmesh.probe_failed_total")
                .with_description("Failed probe count")
                .build(),
            total: meter
                .u64_counter("rpingmesh.probe_total")
                .with_description("Total probe attempts")
                .build(),
            dropped: meter
                .u64_counter("rpingmesh.agent.dropped_packets_total")
                .with_description("Malformed datagrams dropped on the probe port")
                .build(),
            drop_attrs: DropReason::ALL.map(|r| [KeyValue::new("reason", r.as_str())]),
            transport_failures: meter
                .u64_counter("rpingmesh.agent.transport_failures_total")
                .with_description(
                    "RNIC endpoints that failed (QP error, device lost) and were re-opened",
                )
                .build(),
            event_ring_dropped: meter
                .u64_counter("rpingmesh.event_ring_dropped_total")
                .with_description(
                    "Completion events dropped because the poller-to-agent queue was full (rdma)",
                )
                .build(),
            qp_resets: meter
                .u64_counter("rpingmesh.agent.qp_resets_total")
                .with_description(
                    "UD QPs found in the error state and reset in place, QPN unchanged (rdma)",
                )
                .build(),
            tracer_ringbuf_dropped: meter
                .u64_counter("rpingmesh.agent.tracer_ringbuf_dropped_total")
                .with_description(
                    "QP lifecycle events the eBPF tracer dropped because its ring buffer was full",
                )
                .build(),
            rc_ring_rtt: hist(
                "rpingmesh.rc_ring_rtt_ns",
                "Network round-trip time of RC ring echo probes (round trip minus the responder's turnaround)",
            ),
            rc_ring_total: meter
                .u64_counter("rpingmesh.rc_ring_probe_total")
                .with_description("RC ring echo probes sent")
                .build(),
            rc_ring_failed: meter
                .u64_counter("rpingmesh.rc_ring_probe_failed_total")
                .with_description("RC ring echo probes without an echo in time (reason=lost) or without an exact RTT (reason=late)")
                .build(),
            rc_ring_discarded_credit_reads: meter
                .u64_counter("rpingmesh.rc_ring_discarded_credit_reads_total")
                .with_description("RDMA reads of a peer ring's credit that returned an impossible count (a read torn by the peer's concurrent update) and were read again")
                .build(),
            meter: meter.clone(),
        }
    }

    /// One RC ring probe outcome, by service (empty for ToR lists).
    pub fn record_rc_ring(&self, service: &str, o: &rpingmesh_rc_ring::echo::Outcome) {
        use rpingmesh_rc_ring::echo::Outcome;
        let attrs = [KeyValue::new("service", service.to_string())];
        self.rc_ring_total.add(1, &attrs);
        match *o {
            Outcome::Rtt { network_ns, .. } => self.rc_ring_rtt.record(network_ns, &attrs),
            Outcome::Late { .. } => self
                .rc_ring_failed
                .add(1, &[attrs[0].clone(), KeyValue::new("reason", "late")]),
            Outcome::Lost { .. } => self
                .rc_ring_failed
                .add(1, &[attrs[0].clone(), KeyValue::new("reason", "lost")]),
        }
    }

    /// Torn credit reads an RC ring discarded since the last call (a delta).
    pub fn record_rc_ring_discarded_credit_reads(&self, n: u64) {
        if n > 0 {
            self.rc_ring_discarded_credit_reads.add(n, &[]);
        }
    }

    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Instruments that record nowhere (metrics_enabled: false).
    pub fn disabled() -> Self {
        Metrics::new(&SdkMeterProvider::builder().build().meter(SERVICE_NAME))
    }

    pub fn record_success(&self, attrs: &PathAttrs, s: &RttSample) {
        self.total.add(1, &attrs.base);
        self.success.add(1, &attrs.base);
        self.network_rtt.record(s.network_rtt_ns, &attrs.base);
        self.prober_delay.record(s.prober_delay_ns, &attrs.base);
        self.responder_delay
            .record(s.responder_delay_ns, &attrs.base);
    }

    /// Gives a new target's ToR pair (and service) its series at 0, failures by every
    /// reason included, so that a loss ratio reads 0 rather than "no data" until a
    /// probe fails.
    pub fn init_path(&self, attrs: &PathAttrs) {
        self.total.add(0, &attrs.base);
        self.success.add(0, &attrs.base);
        for f in &attrs.failed {
            self.failed.add(0, f);
        }
    }

    pub fn record_failure(&self, attrs: &PathAttrs, reason: FailReason) {
        self.total.add(1, &attrs.base);
        self.failed.add(1, &attrs.failed[reason as usize]);
    }

    pub fn record_transport_failure(&self) {
        self.transport_failures.add(1, &[]);
    }

    pub fn record_event_ring_dropped(&self, n: u64) {
        if n > 0 {
            self.event_ring_dropped.add(n, &[]);
        }
    }

    pub fn record_qp_resets(&self, n: u64) {
        if n > 0 {
            self.qp_resets.add(n, &[]);
        }
    }

    pub fn record_tracer_ringbuf_dropped(&self, n: u64) {
        if n > 0 {
            self.tracer_ringbuf_dropped.add(n, &[]);
        }
    }

    pub fn record_dropped(&self, reason: DropReason) {
        self.dropped.add(1, &self.drop_attrs[reason as usize]);
    }
}

/// The metrics pipeline: a meter provider (with an OTLP exporter when enabled).
pub struct Telemetry {
    provider: SdkMeterProvider,
    pub metrics: Metrics,
    registry: Option<rpingmesh_metrics_export::Registry>,
}

/// The OTLP resource: service.name, service.version (this build) and service.instance.id.
pub fn resource(service: &'static str, instance: &str) -> Resource {
    Resource::builder()
        .with_service_name(service)
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .with_attribute(KeyValue::new("service.instance.id", instance.to_string()))
        .build()
}

/// OTLP endpoint URI from a collector address (Go's `grpc://host:port`, or `host:port`).
pub fn collector_uri(addr: &str) -> String {
    rpingmesh_proto::endpoint::grpc_uri(addr, false)
}

impl Telemetry {
    /// Builds the pipeline `metrics_enabled` and `metrics_exporter` ask for; a bad
    /// exporter setup is logged and metrics go nowhere (never fatal). Must run inside a
    /// tokio runtime (the tonic exporter needs one). `instance` is the OTLP
    /// `service.instance.id` (the agent's hostname, as Go sets it): without it the series
    /// of two agents collide in a backend.
    pub fn init(
        enabled: bool,
        exporter: Exporter,
        collector_addr: &str,
        export_interval: Duration,
        instance: &str,
    ) -> Self {
        let pipeline = MetricsPipeline::build(PipelineOptions {
            enabled,
            exporter,
            otlp_endpoint: collector_uri(collector_addr),
            export_interval,
            resource: resource(SERVICE_NAME, instance),
        });
        let registry = pipeline.prometheus_registry();
        let mut t = Self::from_provider(pipeline.provider().clone());
        if enabled {
            rpingmesh_metrics_export::process::register(
                &t.provider.meter(SERVICE_NAME),
                "rpingmesh.agent",
            );
        }
        t.registry = registry;
        t
    }

    /// The registry `/metrics` serves, when Prometheus export is on.
    pub fn prometheus_registry(&self) -> Option<rpingmesh_metrics_export::Registry> {
        self.registry.clone()
    }

    /// Wraps an existing provider (tests attach their own reader).
    pub fn from_provider(provider: SdkMeterProvider) -> Self {
        let metrics = Metrics::new(&provider.meter(SERVICE_NAME));
        Telemetry {
            provider,
            metrics,
            registry: None,
        }
    }

    /// Final export, best-effort. Blocks: call from a blocking context.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "metrics shutdown");
        }
    }

    pub fn provider(&self) -> &SdkMeterProvider {
        &self.provider
    }

    /// rpingmesh.agent.self_throttle (attribute-free). The agent builds it at start and
    /// records 1.0 (unthrottled) until the watchdog, when enabled, moves it.
    pub fn self_throttle_gauge(&self) -> Gauge<f64> {
        self.provider
            .meter(SERVICE_NAME)
            .f64_gauge("rpingmesh.agent.self_throttle")
            .with_description("Self-protection rate multiplier (1.0 = unthrottled, down to 0.1)")
            .build()
    }
}

/// JSON logs on stderr at `level` (RUST_LOG, when set and valid, wins). RUST_LOG takes
/// `level` and `target=level` items, comma-separated. Not EnvFilter: its directive parser
/// compiles a regex at start, which stayed resident (code and heap) for the agent's life.
pub fn init_logging(level: &str) {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    let parse = |s: &str| s.parse::<Targets>().ok();
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| parse(&v))
        .or_else(|| parse(level))
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::INFO));
    let fmt = tracing_subscriber::fmt::layer()
        .json()
        .with_writer(std::io::stderr)
        .with_current_span(false);
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .try_init();
}

#[cfg(test)]
mod tests;
