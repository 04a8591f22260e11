//! OpenMetrics 1.0 text from gathered Prometheus metric families (pure).
//!
//! The OTel-to-Prometheus translation (names, labels, buckets) is done by
//! opentelemetry-prometheus; this only writes the exposition format Prometheus asks for
//! with `Accept: application/openmetrics-text`. Counter families are named without
//! their `_total` (OpenMetrics puts it on the sample), so our instruments, which carry
//! `_total` in their names (the Go metric contract), keep the same sample names.

use std::fmt::Write;

use prometheus::proto::{MetricFamily, MetricType};

pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Writes `families` as OpenMetrics text, ending with `# EOF`.
pub fn encode(families: &[MetricFamily]) -> String {
    let mut out = String::with_capacity(4096);
    for f in families {
        let name = f.name();
        let (family, kind) = match f.get_field_type() {
            MetricType::COUNTER => (name.strip_suffix("_total").unwrap_or(name), "counter"),
            MetricType::GAUGE => (name, "gauge"),
            MetricType::HISTOGRAM => (name, "histogram"),
            MetricType::SUMMARY => (name, "summary"),
            // The OTel translation never produces untyped families.
            MetricType::UNTYPED => continue,
        };
        let _ = writeln!(out, "# TYPE {family} {kind}");
        if !f.help().is_empty() {
            let _ = writeln!(out, "# HELP {family} {}", escape_help(f.help()));
        }
        for m in f.get_metric() {
            let labels = m.get_label();
            match f.get_field_type() {
                MetricType::COUNTER => sample(
                    &mut out,
                    &format!("{family}_total"),
                    labels,
                    None,
                    m.get_counter().get_value(),
                ),
                MetricType::GAUGE => {
                    sample(&mut out, family, labels, None, m.get_gauge().get_value())
                }
                MetricType::UNTYPED => {}
                MetricType::HISTOGRAM => {
                    let h = m.get_histogram();
                    let bucket = format!("{family}_bucket");
                    let mut saw_inf = false;
                    for b in h.get_bucket() {
                        saw_inf |= b.upper_bound().is_infinite();
                        let le = float(b.upper_bound());
                        sample(
                            &mut out,
                            &bucket,
                            labels,
                            Some(&le),
                            b.cumulative_count() as f64,
                        );
                    }
                    if !saw_inf {
                        // OpenMetrics requires the +Inf bucket; it equals the count.
                        sample(
                            &mut out,
                            &bucket,
                            labels,
                            Some("+Inf"),
                            h.get_sample_count() as f64,
                        );
                    }
                    sample(
                        &mut out,
                        &format!("{family}_sum"),
                        labels,
                        None,
                        h.get_sample_sum(),
                    );
                    sample(
                        &mut out,
                        &format!("{family}_count"),
                        labels,
                        None,
                        h.get_sample_count() as f64,
                    );
                }
                MetricType::SUMMARY => {
                    let s = m.get_summary();
                    for q in s.get_quantile() {
                        let mut ls: Vec<(&str, String)> = labels
                            .iter()
                            .map(|l| (l.name(), l.value().to_string()))
                            .collect();
                        ls.push(("quantile", float(q.quantile())));
                        write_sample(&mut out, family, &ls, q.value());
                    }
                    sample(
                        &mut out,
                        &format!("{family}_sum"),
                        labels,
                        None,
                        s.sample_sum(),
                    );
                    sample(
                        &mut out,
                        &format!("{family}_count"),
                        labels,
                        None,
                        s.sample_count() as f64,
                    );
                }
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

fn sample(
    out: &mut String,
    name: &str,
    labels: &[prometheus::proto::LabelPair],
    le: Option<&str>,
    value: f64,
) {
    let mut ls: Vec<(&str, String)> = labels
        .iter()
        .map(|l| (l.name(), l.value().to_string()))
        .collect();
    if let Some(le) = le {
        ls.push(("le", le.to_string()));
    }
    write_sample(out, name, &ls, value);
}

fn write_sample(out: &mut String, name: &str, labels: &[(&str, String)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{k}=\"{}\"", escape_label(v));
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(&float(value));
    out.push('\n');
}

/// Numbers as OpenMetrics writes them: integers without a fraction, +Inf/-Inf/NaN.
fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn escape_help(v: &str) -> String {
    escape_label(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::proto::{Bucket, Counter, Gauge, Histogram, LabelPair, Metric};

    fn label(k: &str, v: &str) -> LabelPair {
        let mut l = LabelPair::default();
        l.set_name(k.into());
        l.set_value(v.into());
        l
    }

    fn family(name: &str, ty: MetricType, metrics: Vec<Metric>) -> MetricFamily {
        let mut f = MetricFamily::default();
        f.set_name(name.into());
        f.set_help("what \"it\" is".into());
        f.set_field_type(ty);
        f.set_metric(metrics);
        f
    }

    #[test]
    fn counters_gauges_and_histograms() {
        let mut c = Metric::from_label(vec![label("source_tor", "t\"1\\\n")]);
        let mut cv = Counter::default();
        cv.set_value(3.0);
        c.set_counter(cv);
        let mut g = Metric::default();
        let mut gv = Gauge::default();
        gv.set_value(0.25);
        g.set_gauge(gv);
        let mut h = Metric::from_label(vec![label("target_tor", "b")]);
        let mut hv = Histogram::default();
        let mut b = Bucket::default();
        b.set_upper_bound(100.0);
        b.set_cumulative_count(1);
        hv.set_bucket(vec![b]);
        hv.set_sample_count(2);
        hv.set_sample_sum(350.5);
        h.set_histogram(hv);
        let text = encode(&[
            family("rpingmesh_probe_total", MetricType::COUNTER, vec![c]),
            family("rpingmesh_agent_self_throttle", MetricType::GAUGE, vec![g]),
            family("rpingmesh_network_rtt_ns", MetricType::HISTOGRAM, vec![h]),
        ]);
        let want = "\
# TYPE rpingmesh_probe counter
# HELP rpingmesh_probe what \\\"it\\\" is
rpingmesh_probe_total{source_tor=\"t\\\"1\\\\\\n\"} 3
# TYPE rpingmesh_agent_self_throttle gauge
# HELP rpingmesh_agent_self_throttle what \\\"it\\\" is
rpingmesh_agent_self_throttle 0.25
# TYPE rpingmesh_network_rtt_ns histogram
# HELP rpingmesh_network_rtt_ns what \\\"it\\\" is
rpingmesh_network_rtt_ns_bucket{target_tor=\"b\",le=\"100\"} 1
rpingmesh_network_rtt_ns_bucket{target_tor=\"b\",le=\"+Inf\"} 2
rpingmesh_network_rtt_ns_sum{target_tor=\"b\"} 350.5
rpingmesh_network_rtt_ns_count{target_tor=\"b\"} 2
# EOF
";
        assert_eq!(text, want);
    }

    #[test]
    fn empty_is_just_eof() {
        assert_eq!(encode(&[]), "# EOF\n");
    }
}
