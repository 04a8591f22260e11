//! A real OTLP/gRPC receiver (opentelemetry-proto's MetricsServiceServer) collects what a
//! controller and two agents export; the test checks names, units, bucket bounds,
//! attributes and resources against the metric contract of the Go version.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point, Metric};
use rpingmesh_e2e::*;
use rpingmesh_proto::controller_agent::{AgentRegistrationRequest, RnicInfo};
use tonic::codec::CompressionEncoding;

const BUCKETS: [f64; 11] = [
    100.0, 500.0, 1000.0, 5000.0, 10000.0, 50000.0, 100000.0, 500000.0, 1000000.0, 5000000.0,
    10000000.0,
];
const HISTOGRAMS: [&str; 3] = [
    "rpingmesh.network_rtt_ns",
    "rpingmesh.prober_delay_ns",
    "rpingmesh.responder_delay_ns",
];
/// Every metric the Go agent exports (its README's list).
const GO_AGENT_METRICS: [&str; 7] = [
    "rpingmesh.network_rtt_ns",
    "rpingmesh.prober_delay_ns",
    "rpingmesh.responder_delay_ns",
    "rpingmesh.probe_success_total",
    "rpingmesh.probe_failed_total",
    "rpingmesh.probe_total",
    "rpingmesh.agent.self_throttle",
];

/// `GET /metrics` of `addr` (plain text).
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

const COUNTERS: [&str; 3] = [
    "rpingmesh.probe_success_total",
    "rpingmesh.probe_failed_total",
    "rpingmesh.probe_total",
];

#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
}

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.got.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

/// One exported metric with the identity of the resource it came from.
struct Seen {
    service: String,
    /// service.instance.id (the hostname, as the Go version sets it).
    instance: String,
    version: String,
    metric: Metric,
}

fn str_attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            _ => None,
        }
    })
}

fn flatten(reqs: &[ExportMetricsServiceRequest]) -> Vec<Seen> {
    let mut out = Vec::new();
    for r in reqs {
        for rm in &r.resource_metrics {
            let res = |k: &str| {
                rm.resource
                    .as_ref()
                    .and_then(|res| str_attr(&res.attributes, k))
                    .unwrap_or_default()
            };
            let (service, instance, version) = (
                res("service.name"),
                res("service.instance.id"),
                res("service.version"),
            );
            for sm in &rm.scope_metrics {
                for m in &sm.metrics {
                    out.push(Seen {
                        service: service.clone(),
                        instance: instance.clone(),
                        version: version.clone(),
                        metric: m.clone(),
                    });
                }
            }
        }
    }
    out
}

/// Attribute sets of every data point of a metric.
fn point_attrs(m: &Metric) -> Vec<Vec<KeyValue>> {
    match &m.data {
        Some(metric::Data::Histogram(h)) => {
            h.data_points.iter().map(|p| p.attributes.clone()).collect()
        }
        Some(metric::Data::Sum(s)) => s.data_points.iter().map(|p| p.attributes.clone()).collect(),
        Some(metric::Data::Gauge(g)) => {
            g.data_points.iter().map(|p| p.attributes.clone()).collect()
        }
        _ => Vec::new(),
    }
}

fn sum_total(m: &Metric) -> f64 {
    use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value;
    match &m.data {
        Some(metric::Data::Sum(s)) => s
            .data_points
            .iter()
            .map(|p| match p.value {
                Some(Value::AsInt(i)) => i as f64,
                Some(Value::AsDouble(d)) => d,
                None => 0.0,
            })
            .sum(),
        _ => 0.0,
    }
}

/// What is still missing from the received metrics; empty when everything is there.
fn missing(seen: &[Seen]) -> Vec<String> {
    let mut miss = Vec::new();
    let agent = |name: &str| {
        seen.iter()
            .filter(|s| s.service == "rpingmesh-agent" && s.metric.name == name)
            .collect::<Vec<_>>()
    };
    for h in HISTOGRAMS {
        let ms = agent(h);
        let has_pair = ms.iter().any(|s| {
            matches!(&s.metric.data, Some(metric::Data::Histogram(hd)) if hd.data_points.iter().any(|p| {
                p.count > 0
                    && str_attr(&p.attributes, "source_tor").as_deref() == Some("tor-a")
                    && str_attr(&p.attributes, "target_tor").as_deref() == Some("tor-b")
            }))
        });
        if !has_pair {
            miss.push(format!("{h} with a tor-a -> tor-b data point (count > 0)"));
        }
    }
    for c in ["rpingmesh.probe_success_total", "rpingmesh.probe_total"] {
        if !agent(c).iter().any(|s| sum_total(&s.metric) > 0.0) {
            miss.push(format!("{c} > 0"));
        }
    }
    // The Go version's reason values: the dead target's probes time out.
    let failed_with_reason = agent("rpingmesh.probe_failed_total").iter().any(|s| {
        sum_total(&s.metric) > 0.0
            && point_attrs(&s.metric)
                .iter()
                .any(|a| str_attr(a, "reason").as_deref() == Some("timeout"))
    });
    if !failed_with_reason {
        miss.push("rpingmesh.probe_failed_total > 0 with reason=timeout".into());
    }
    // The Go agent's self-protection gauge exists from start: 1.0, attribute-free.
    let throttle = agent("rpingmesh.agent.self_throttle").iter().any(|s| {
        matches!(&s.metric.data, Some(metric::Data::Gauge(g)) if g.data_points.iter().any(|p| {
            p.attributes.is_empty()
                && matches!(p.value, Some(number_data_point::Value::AsDouble(v)) if v == 1.0)
        }))
    });
    if !throttle {
        miss.push("rpingmesh.agent.self_throttle = 1.0 (a gauge without attributes)".into());
    }
    // Each agent's series carry its own service.instance.id, so two agents never collide.
    for host in ["host-a1", "host-a2"] {
        if !seen
            .iter()
            .any(|s| s.service == "rpingmesh-agent" && s.instance == host && !s.version.is_empty())
        {
            miss.push(format!(
                "agent metrics with service.instance.id={host} and a service.version"
            ));
        }
    }
    if !seen.iter().any(|s| {
        s.service == "rpingmesh-analyzer" && !s.instance.is_empty() && !s.version.is_empty()
    }) {
        miss.push("analyzer metrics with service.instance.id and service.version".into());
    }
    let analyzer = |name: &str| {
        seen.iter()
            .filter(|s| s.service == "rpingmesh-analyzer" && s.metric.name == name)
            .any(|s| sum_total(&s.metric) > 0.0)
    };
    for c in [
        "rpingmesh.analyzer.path_summaries_total",
        "rpingmesh.analyzer.sla_violations_total",
    ] {
        if !analyzer(c) {
            miss.push(format!("{c} > 0 from service rpingmesh-analyzer"));
        }
    }
    miss
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_metrics_contract() {
    // The receiver.
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp_addr = listener.local_addr().unwrap();
    let svc = MetricsServiceServer::new(receiver.clone())
        .accept_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(64 << 20);
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );

    let dir = tempfile::tempdir().unwrap();
    let otel = otlp_addr.to_string();
    let controller = spawn_controller(
        dir.path(),
        "controller",
        None,
        "127.0.0.1:0",
        &[
            "--metrics-enabled",
            "true",
            "--otel-collector-addr",
            &otel,
            "--metrics-export-interval-ms",
            "1000",
            "--inter-tor-sample-size",
            "1",
            "--analyzer-sla-loss-ratio",
            "0.05",
        ],
    )
    .expect("controller");
    let caddr = controller.addr.to_string();

    // A registered RNIC in tor-a that nobody answers for: a1 probes it (ToR mesh), every
    // probe times out, which exercises probe_failed_total{reason} and a loss violation.
    let dead = Ipv4Addr::new(127, 0, 4, 3);
    let mut cc = controller_client(&controller.endpoint()).await.unwrap();
    cc.register_agent(AgentRegistrationRequest {
        agent_version: String::new(),
        agent_id: "ghost".into(),
        agent_ip: dead.to_string(),
        hostname: "ghost".into(),
        tor_id: "tor-a".into(),
        rnics: vec![RnicInfo {
            gid: gid_of(dead),
            qpn: 1,
            ip_address: dead.to_string(),
            host_name: "ghost".into(),
            tor_id: "tor-a".into(),
            device_name: "udp0".into(),
        }],
    })
    .await
    .expect("register the ghost RNIC");

    let mut procs = Vec::new();
    for (id, tor, ip) in [
        ("a1", "tor-a", Ipv4Addr::new(127, 0, 4, 1)),
        ("a2", "tor-b", Ipv4Addr::new(127, 0, 4, 2)),
    ] {
        let args = AgentArgs::new(id, tor, &caddr, ip)
            .flag("--hostname", format!("host-{id}"))
            .flag("--probe-interval-ms", 50)
            .flag("--target-probe-rate-per-second", 20)
            .flag("--pinglist-update-interval-sec", 2)
            .flag("--analysis-window-sec", 2)
            .flag("--metrics-enabled", "true")
            .flag("--otel-collector-addr", &otel)
            .flag("--metrics-export-interval-ms", 1000)
            // Both exporters: the same names in the OTLP push and on /metrics.
            .flag("--metrics-exporter", "both")
            .flag("--prometheus-listen-addr", format!("{ip}:9466"));
        procs.push(spawn_agent(dir.path(), None, &args).expect("agent"));
    }

    let got = receiver.got.clone();
    let done = wait_for(Duration::from_secs(45), Duration::from_secs(1), || {
        let got = got.clone();
        async move {
            let seen = flatten(&got.lock().unwrap());
            missing(&seen).is_empty().then_some(())
        }
    })
    .await;
    let seen = flatten(&receiver.got.lock().unwrap());
    if done.is_none() {
        let names: BTreeSet<(String, String)> = seen
            .iter()
            .map(|s| (s.service.clone(), s.metric.name.clone()))
            .collect();
        panic!(
            "within 45 s the receiver did not get: {:?}\nreceived (service, metric): {names:?}",
            missing(&seen)
        );
    }

    let mut summary: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for s in &seen {
        *summary
            .entry((
                s.service.clone(),
                s.metric.name.clone(),
                s.metric.unit.clone(),
            ))
            .or_default() += point_attrs(&s.metric).len();
    }
    eprintln!("received (service, metric, unit) -> data points: {summary:?}");

    // Shape of every agent metric we know, in every export.
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for s in seen.iter().filter(|s| s.service == "rpingmesh-agent") {
        let name = s.metric.name.as_str();
        if let Some(h) = HISTOGRAMS.iter().find(|h| **h == name) {
            *kinds.entry(h).or_default() += 1;
            assert_eq!(s.metric.unit, "ns", "unit of {name}");
            let Some(metric::Data::Histogram(hd)) = &s.metric.data else {
                panic!("{name} is not a histogram: {:?}", s.metric.data);
            };
            for p in &hd.data_points {
                assert_eq!(p.explicit_bounds, BUCKETS, "bucket bounds of {name}");
                assert_eq!(
                    p.bucket_counts.len(),
                    BUCKETS.len() + 1,
                    "bucket counts of {name}"
                );
                for key in ["source_tor", "target_tor"] {
                    assert!(
                        str_attr(&p.attributes, key).is_some(),
                        "{name} data point lacks attribute {key}: {:?}",
                        p.attributes
                    );
                }
            }
        }
        if let Some(c) = COUNTERS.iter().find(|c| **c == name) {
            *kinds.entry(c).or_default() += 1;
            let Some(metric::Data::Sum(sd)) = &s.metric.data else {
                panic!("{name} is not a sum: {:?}", s.metric.data);
            };
            assert!(sd.is_monotonic, "{name} must be a monotonic counter");
            for p in &sd.data_points {
                for key in ["source_tor", "target_tor"] {
                    assert!(
                        str_attr(&p.attributes, key).is_some(),
                        "{name} data point lacks attribute {key}: {:?}",
                        p.attributes
                    );
                }
                if name == "rpingmesh.probe_failed_total" {
                    assert!(
                        str_attr(&p.attributes, "reason").is_some(),
                        "probe_failed_total data point lacks attribute reason"
                    );
                }
            }
        }
    }
    for n in HISTOGRAMS.iter().chain(COUNTERS.iter()) {
        assert!(kinds.contains_key(n), "agent metric {n} never exported");
    }
    // Probe metrics are ToR-level: no GID-level attribute may leak into them.
    for s in seen.iter().filter(|s| s.service == "rpingmesh-agent") {
        for attrs in point_attrs(&s.metric) {
            for kv in attrs {
                assert!(
                    !kv.key.contains("gid"),
                    "{} carries a GID-level attribute {}",
                    s.metric.name,
                    kv.key
                );
            }
        }
    }
    // Analyzer counters carry ToR-level attributes; violations name their kind.
    for s in seen.iter().filter(|s| s.service == "rpingmesh-analyzer") {
        if s.metric.name == "rpingmesh.analyzer.sla_violations_total" {
            for a in point_attrs(&s.metric) {
                for key in ["source_tor", "target_tor", "kind"] {
                    assert!(
                        str_attr(&a, key).is_some(),
                        "sla_violations_total lacks attribute {key}: {a:?}"
                    );
                }
            }
        }
    }

    // Every metric the Go agent exports, on a scrape of each agent's /metrics too. The
    // counters and the gauge are there from the agent's first pinglist on; a histogram
    // series only from its first successful probe (as in Go's client), which a loaded
    // machine may not have reached yet: those are scraped again, for a bounded time.
    let has = |text: &str, name: &str| {
        let prom = name.replace('.', "_");
        text.lines().any(|l| {
            !l.starts_with('#')
                && (l.starts_with(&format!("{prom}{{"))
                    || l.starts_with(&format!("{prom} "))
                    || l.starts_with(&format!("{prom}_bucket{{")))
        })
    };
    for ip in ["127.0.4.1", "127.0.4.2"] {
        let addr = format!("{ip}:9466");
        let text = scrape(&addr);
        for name in GO_AGENT_METRICS.iter().filter(|n| !n.ends_with("_ns")) {
            assert!(has(&text, name), "{ip}/metrics lacks {name}:\n{text}");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut text = text;
        loop {
            let missing: Vec<&str> = GO_AGENT_METRICS
                .iter()
                .copied()
                .filter(|n| !has(&text, n))
                .collect();
            if missing.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{ip}/metrics lacks {missing:?} 30 s on:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
            text = scrape(&addr);
        }
    }

    for p in procs.iter_mut() {
        assert!(
            p.alive(),
            "agent {} exited:\n{}",
            p.name,
            tail_lines(&p.stderr(), 20)
        );
    }
    drop(procs);
    drop(controller);
    server.abort();
}
