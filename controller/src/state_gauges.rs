//! The controller's gauges that read its shared state at collection time (open and
//! suppressed findings, affected services, host findings, FOCUS, RNICs, service paths).
//! Above both `service` (the state) and `telemetry` (the pipeline and the names), so
//! neither reaches into the other.

use std::sync::Arc;

use opentelemetry::metrics::{AsyncInstrument, Meter};
use opentelemetry::KeyValue;

use crate::service::ControllerState;
use crate::telemetry::{
    METRIC_AFFECTED_SERVICES, METRIC_FINDINGS_OPEN, METRIC_FINDINGS_SUPPRESSED,
    METRIC_FOCUS_PROBES, METRIC_FOCUS_TARGETS, METRIC_HOST_FINDINGS, METRIC_RNICS,
    METRIC_SERVICE_PATHS,
};

/// A gauge `name` whose callback reads the state (and observes nothing once the state
/// is gone: the callback holds it weakly).
fn state_gauge(
    meter: &Meter,
    state: &Arc<ControllerState>,
    name: &'static str,
    description: &'static str,
    observe: impl Fn(&ControllerState, &dyn AsyncInstrument<u64>) + Send + Sync + 'static,
) {
    let st = Arc::downgrade(state);
    meter
        .u64_observable_gauge(name)
        .with_description(description)
        .with_callback(move |o| {
            if let Some(st) = st.upgrade() {
                observe(&st, o);
            }
        })
        .build();
}

/// Gauges read from the controller's state at collection time: open findings (per
/// ToR pair for the per-path kinds loss and rtt; per kind alone for the localized
/// components rnic, host, tor and link, every one present, 0 when none), RNICs by
/// liveness, service paths per service.
pub fn observe_state(meter: &Meter, state: &Arc<ControllerState>) {
    state_gauge(
        meter,
        state,
        METRIC_FINDINGS_OPEN,
        "Open analyzer findings: per path (kind loss|rtt, by ToR pair) and localized (kind rnic|host|tor|link)",
        |st, o| {
            for ((src, dst, kind), n) in st.open_findings_by_tor_pair() {
                o.observe(
                    n,
                    &[
                        KeyValue::new("source_tor", src),
                        KeyValue::new("target_tor", dst),
                        KeyValue::new("kind", kind.as_str()),
                    ],
                );
            }
            for (kind, n) in st.open_findings_by_kind() {
                o.observe(n as u64, &[KeyValue::new("kind", kind)]);
            }
        },
    );
    state_gauge(
        meter,
        state,
        METRIC_FINDINGS_SUPPRESSED,
        "Open localized findings an operator's action keeps from alerting, by kind (rnic|host|tor|link) and reason (silenced|maintenance); not in findings_open",
        |st, o| {
            for ((kind, reason), n) in st.open_by_kind_and_suppression().1 {
                o.observe(
                    n as u64,
                    &[KeyValue::new("kind", kind), KeyValue::new("reason", reason)],
                );
            }
        },
    );
    state_gauge(
        meter,
        state,
        METRIC_AFFECTED_SERVICES,
        "Workloads (service-path groups: jobs, pods, containers, units) whose live service paths cross the component of an open finding, by finding kind (rnic|host|tor|link)",
        |st, o| {
            for (kind, n) in st.affected_services_by_kind() {
                o.observe(n as u64, &[KeyValue::new("kind", kind)]);
            }
        },
    );
    state_gauge(
        meter,
        state,
        METRIC_HOST_FINDINGS,
        "Findings in each host's newest Hostping report, by hostname and kind (hosts with findings only)",
        |st, o| {
            for ((host, kind), n) in st.host_findings_by_kind() {
                o.observe(n, &[KeyValue::new("hostname", host), KeyValue::new("kind", kind)]);
            }
        },
    );
    state_gauge(
        meter,
        state,
        METRIC_FOCUS_TARGETS,
        "FOCUS targets handed out now (adaptive probing through suspect components)",
        |st, o| {
            o.observe(st.focus_stats().0, &[]);
        },
    );
    let st = Arc::downgrade(state);
    meter
        .u64_observable_counter(METRIC_FOCUS_PROBES)
        .with_description("Probes of FOCUS windows ingested: adaptive probing's extra probes")
        .with_callback(move |o| {
            if let Some(st) = st.upgrade() {
                o.observe(st.focus_stats().1, &[]);
            }
        })
        .build();
    state_gauge(
        meter,
        state,
        METRIC_RNICS,
        "Registered RNICs by liveness",
        |st, o| {
            let (active, inactive) = st.rnic_counts();
            o.observe(active, &[KeyValue::new("state", "active")]);
            o.observe(inactive, &[KeyValue::new("state", "inactive")]);
        },
    );
    state_gauge(
        meter,
        state,
        METRIC_SERVICE_PATHS,
        "Live service paths per service, monitored or not",
        |st, o| {
            for ((service, monitored), n) in st.service_path_counts() {
                o.observe(
                    n,
                    &[
                        KeyValue::new("service", service),
                        KeyValue::new("monitored", if monitored { "true" } else { "false" }),
                    ],
                );
            }
        },
    );
}
