//! Analyzer metrics reach a real OTLP/gRPC receiver (opentelemetry-proto's
//! MetricsService server) with the right names, attributes and service.name.

use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use rpingmesh_controller::telemetry::Telemetry;
use rpingmesh_controller::{start, ControllerConfig};
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{
    AgentRegistrationRequest, PathSummary, ProbeAnalysisReport, RnicInfo,
};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

struct Receiver(mpsc::UnboundedSender<ExportMetricsServiceRequest>);

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        let _ = self.0.send(request.into_inner());
        Ok(Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a str> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| {
        match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.as_str()),
            _ => None,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analyzer_counters_are_exported() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp_addr = listener.local_addr().unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(MetricsServiceServer::new(Receiver(tx)))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );

    let cfg = ControllerConfig {
        listen_addr: "127.0.0.1:0".into(),
        database_uri: "sqlite::memory:".into(),
        otel_collector_addr: otlp_addr.to_string(), // no scheme: http:// is added
        metrics_export_interval_ms: 200,
        ..Default::default()
    };
    let telemetry = Telemetry::init(&cfg);
    let server = start(&cfg, telemetry.metrics.clone()).await.unwrap();
    let mut ctl = ControllerServiceClient::connect(format!("http://{}", server.local_addr))
        .await
        .unwrap();
    ctl.register_agent(AgentRegistrationRequest {
        agent_version: String::new(),
        agent_id: "a".into(),
        tor_id: "tor-a".into(),
        rnics: vec![RnicInfo {
            gid: "fd00::1".into(),
            ..Default::default()
        }],
        ..Default::default()
    })
    .await
    .unwrap();
    let lossy = PathSummary {
        source_gid: "fd00::1".into(),
        source_tor_id: "tor-a".into(),
        target_gid: "fd00::2".into(),
        target_tor_id: "tor-b".into(),
        window_start_unix_ns: 1,
        probe_total: 10,
        probe_success: 5,
        probe_failed: 5,
        ..Default::default()
    };
    let healthy = PathSummary {
        target_gid: "fd00::3".into(),
        probe_failed: 0,
        probe_success: 10,
        ..lossy.clone()
    };
    let ack = ctl
        .report_probe_analysis(ProbeAnalysisReport {
            agent_id: "a".into(),
            summaries: vec![lossy, healthy],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.sla_violations, 1);

    let (mut summaries, mut violation) = (None, None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while (summaries.is_none() || violation.is_none()) && tokio::time::Instant::now() < deadline {
        let Ok(Some(req)) = tokio::time::timeout(Duration::from_secs(1), rx.recv()).await else {
            continue;
        };
        for rm in &req.resource_metrics {
            let res = rm.resource.as_ref().unwrap();
            assert_eq!(
                attr(&res.attributes, "service.name"),
                Some("rpingmesh-analyzer")
            );
            for m in rm.scope_metrics.iter().flat_map(|s| &s.metrics) {
                // The analyzer's counters (the process's own CPU time is a float sum).
                if !m.name.starts_with("rpingmesh.analyzer.") {
                    continue;
                }
                let Some(metric::Data::Sum(sum)) = &m.data else {
                    continue;
                };
                for dp in &sum.data_points {
                    let v = match dp.value {
                        Some(number_data_point::Value::AsInt(i)) => i,
                        _ => panic!("counter {} is not an integer", m.name),
                    };
                    match m.name.as_str() {
                        "rpingmesh.analyzer.path_summaries_total" => {
                            assert!(dp.attributes.is_empty());
                            summaries = Some(v);
                        }
                        "rpingmesh.analyzer.sla_violations_total" => {
                            assert_eq!(attr(&dp.attributes, "source_tor"), Some("tor-a"));
                            assert_eq!(attr(&dp.attributes, "target_tor"), Some("tor-b"));
                            assert_eq!(attr(&dp.attributes, "kind"), Some("loss"));
                            violation = Some(v);
                        }
                        other => panic!("unexpected metric {other}"),
                    }
                }
            }
        }
    }
    assert_eq!(summaries, Some(2));
    assert_eq!(violation, Some(1));
    server.shutdown().await.unwrap();
    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .unwrap();
}
