//! Tests of `telemetry.rs`: names, units, buckets and attributes as exported.

use super::*;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, Metric, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader};

/// Telemetry whose metrics land in memory, read back by flushing its provider.
fn in_memory() -> (Telemetry, InMemoryMetricExporter) {
    let exporter = InMemoryMetricExporter::default();
    let reader = PeriodicReader::builder(exporter.clone()).build();
    let provider = SdkMeterProvider::builder().with_reader(reader).build();
    (Telemetry::from_provider(provider), exporter)
}

/// Flushes `t` and returns what it exported.
fn flushed(t: &Telemetry, exporter: &InMemoryMetricExporter) -> Vec<ResourceMetrics> {
    t.provider().force_flush().unwrap();
    exporter.get_finished_metrics().unwrap()
}

/// Every metric of `got`.
fn metrics_of(got: &[ResourceMetrics]) -> Vec<&Metric> {
    got.iter()
        .flat_map(|rm| rm.scope_metrics())
        .flat_map(|sm| sm.metrics())
        .collect()
}

/// The metric named `n`.
fn named<'a>(metrics: &[&'a Metric], n: &str) -> &'a Metric {
    metrics
        .iter()
        .find(|m| m.name() == n)
        .unwrap_or_else(|| panic!("{n} missing"))
}

/// A u64 sum's points: ("key=value" attributes sorted, value), sorted.
fn sum_points(m: &Metric) -> Vec<(Vec<String>, u64)> {
    let AggregatedMetrics::U64(MetricData::Sum(s)) = m.data() else {
        panic!("{} not a u64 sum", m.name())
    };
    let mut v: Vec<_> = s
        .data_points()
        .map(|p| {
            let mut a: Vec<String> = p
                .attributes()
                .map(|kv| format!("{}={}", kv.key, kv.value))
                .collect();
            a.sort();
            (a, p.value())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn collector_uri_adds_scheme() {
    assert_eq!(collector_uri("localhost:4317"), "http://localhost:4317");
    assert_eq!(
        collector_uri("grpc://localhost:4317"),
        "http://localhost:4317"
    );
    assert_eq!(collector_uri("https://c:4317"), "https://c:4317");
}

#[test]
fn resource_names_the_instance_and_version() {
    let r = resource(SERVICE_NAME, "host-7");
    let get = |k: &str| {
        r.get(&opentelemetry::Key::from_static_str(match k {
            "n" => "service.name",
            "i" => "service.instance.id",
            _ => "service.version",
        }))
    };
    assert_eq!(get("n").map(|v| v.to_string()), Some(SERVICE_NAME.into()));
    assert_eq!(get("i").map(|v| v.to_string()), Some("host-7".into()));
    assert_eq!(
        get("v").map(|v| v.to_string()),
        Some(env!("CARGO_PKG_VERSION").into())
    );
}

#[test]
fn names_units_buckets_and_attributes() {
    let (t, exporter) = in_memory();
    let attrs = PathAttrs::new("tor-a", "tor-b");
    let s = RttSample {
        network_rtt_ns: 700,
        prober_delay_ns: 20_000,
        responder_delay_ns: 3_000,
    };
    t.metrics.record_success(&attrs, &s);
    t.metrics.record_failure(&attrs, FailReason::Timeout);
    t.metrics.record_failure(&attrs, FailReason::NegativeRtt);
    t.metrics.record_dropped(DropReason::BadLength);
    let got = flushed(&t, &exporter);
    let metrics = metrics_of(&got);
    let find = |n: &str| named(&metrics, n);
    for n in [
        "rpingmesh.network_rtt_ns",
        "rpingmesh.prober_delay_ns",
        "rpingmesh.responder_delay_ns",
    ] {
        let m = find(n);
        assert_eq!(m.unit(), "ns");
        let AggregatedMetrics::U64(MetricData::Histogram(h)) = m.data() else {
            panic!("{n} not a u64 histogram")
        };
        let p = h.data_points().next().unwrap();
        assert_eq!(p.bounds().collect::<Vec<_>>(), RTT_BUCKETS_NS.to_vec());
        let mut keys: Vec<_> = p
            .attributes()
            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
            .collect();
        keys.sort();
        assert_eq!(
            keys,
            vec![
                ("source_tor".into(), "tor-a".into()),
                ("target_tor".into(), "tor-b".into())
            ]
        );
    }
    let sum = |n: &str| sum_points(find(n));
    assert_eq!(sum("rpingmesh.probe_total")[0].1, 3);
    assert_eq!(sum("rpingmesh.probe_success_total")[0].1, 1);
    let mut failed = sum("rpingmesh.probe_failed_total");
    failed.sort();
    assert_eq!(failed.len(), 2);
    assert!(failed
        .iter()
        .any(|(a, v)| *v == 1 && a.contains(&"reason=timeout".to_string())));
    // Go's reason values; which invalid one in reason_detail.
    assert!(failed.iter().any(|(a, v)| *v == 1
        && a.contains(&"reason=invalid_rtt".to_string())
        && a.contains(&"reason_detail=negative_rtt".to_string())));
    assert!(failed
        .iter()
        .all(|(a, _)| !a.iter().any(|x| x == "reason_detail=timeout")));
    assert!(failed[0].0.contains(&"source_tor=tor-a".to_string()));
    // Every drop reason is there from the start (0), the one recorded at 1.
    let mut dropped = sum("rpingmesh.agent.dropped_packets_total");
    dropped.sort();
    assert_eq!(dropped.len(), DropReason::ALL.len());
    assert!(dropped.contains(&(vec!["reason=bad_length".to_string()], 1)));
    assert_eq!(dropped.iter().map(|d| d.1).sum::<u64>(), 1);
    // Health counters are there from the start, at 0.
    for n in [
        "rpingmesh.agent.transport_failures_total",
        "rpingmesh.rc_ring_discarded_credit_reads_total",
    ] {
        assert_eq!(sum(n), vec![(vec![], 0)], "{n}");
    }
}

#[test]
fn self_throttle_gauge_only_when_asked_and_attribute_free() {
    let names = |t: &Telemetry, exporter: &InMemoryMetricExporter| -> Vec<String> {
        let got = flushed(t, exporter);
        metrics_of(&got)
            .iter()
            .map(|m| m.name().to_string())
            .collect()
    };
    let (t, exporter) = in_memory();
    t.metrics.record_dropped(DropReason::BadLength);
    assert!(!names(&t, &exporter).contains(&"rpingmesh.agent.self_throttle".to_string()));

    let (t, exporter) = in_memory();
    t.self_throttle_gauge().record(0.25, &[]);
    let got = flushed(&t, &exporter);
    let m = named(&metrics_of(&got), "rpingmesh.agent.self_throttle");
    let AggregatedMetrics::F64(MetricData::Gauge(g)) = m.data() else {
        panic!("self_throttle not an f64 gauge")
    };
    let p = g.data_points().next().unwrap();
    assert_eq!(p.value(), 0.25);
    assert_eq!(p.attributes().count(), 0);
}

#[test]
fn service_targets_carry_a_service_attribute() {
    let (t, exporter) = in_memory();
    let plain = PathAttrs::new("tor-a", "tor-b");
    let svc = PathAttrs::with_service("tor-a", "tor-b", "training");
    t.metrics.record_failure(&plain, FailReason::Timeout);
    t.metrics.record_failure(&svc, FailReason::Timeout);
    t.metrics.record_tracer_ringbuf_dropped(3);
    t.metrics.record_tracer_ringbuf_dropped(0);
    t.metrics.record_rc_ring_discarded_credit_reads(2);
    t.metrics.record_rc_ring_discarded_credit_reads(0);
    t.metrics.record_rc_ring_discarded_credit_reads(5);
    let got = flushed(&t, &exporter);
    let metrics = metrics_of(&got);
    let attrs = |n: &str| sum_points(named(&metrics, n));
    assert_eq!(
        attrs("rpingmesh.probe_total"),
        vec![
            (
                vec![
                    "service=training".into(),
                    "source_tor=tor-a".into(),
                    "target_tor=tor-b".into()
                ],
                1
            ),
            (
                vec!["source_tor=tor-a".into(), "target_tor=tor-b".into()],
                1
            ),
        ]
    );
    let failed = attrs("rpingmesh.probe_failed_total");
    assert_eq!(failed.len(), 2);
    assert!(failed
        .iter()
        .any(|(a, _)| a.len() == 4 && a.contains(&"service=training".to_string())));
    assert!(failed
        .iter()
        .any(|(a, _)| a.len() == 3 && !a.iter().any(|x| x.starts_with("service="))));
    assert_eq!(
        attrs("rpingmesh.agent.tracer_ringbuf_dropped_total"),
        vec![(vec![], 3)]
    );
    assert_eq!(
        attrs("rpingmesh.rc_ring_discarded_credit_reads_total"),
        vec![(vec![], 7)]
    );
}
