//! Tests of `grafana.rs`.

use super::*;
use serde_json::json;

fn vars(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn substitute_all_syntaxes_and_builtins() {
    let v = vars(&[("source_tor", "tor-a"), ("target_tor", "tor-b")]);
    let e = r#"sum(rate(x{source_tor="$source_tor", target_tor="${target_tor}"}[$__rate_interval])) / [[source_tor]] ${target_tor:regex} $__interval $__range"#;
    assert_eq!(
        substitute(e, &v),
        r#"sum(rate(x{source_tor="tor-a", target_tor="tor-b"}[1m])) / tor-a tor-b 15s 5m"#
    );
}

#[test]
fn substitute_prefers_vars_over_builtins() {
    let v = vars(&[("__rate_interval", "20s")]);
    assert_eq!(substitute("rate(x[$__rate_interval])", &v), "rate(x[20s])");
}

#[test]
fn substitute_takes_whole_names() {
    // `$service` must not eat the prefix of `$services`, nor `$__range` of `$__range_s`.
    let v = vars(&[("service", "a"), ("services", "b")]);
    assert_eq!(substitute("$service $services", &v), "a b");
    assert_eq!(substitute("$__range $__range_s", &v), "5m 300");
}

#[test]
fn substitute_leaves_unknown_and_non_variables() {
    let v = vars(&[]);
    let e = r#"x{a="$nope"} $ 5 ${} [[ ]] [[a b]] {{instance}} ${__data.fields.x}"#;
    let s = substitute(e, &v);
    assert_eq!(s, e);
    assert_eq!(referenced_vars(&s), vec!["nope", "__data"]);
}

#[test]
fn substitute_keeps_utf8() {
    let v = vars(&[("s", "é")]);
    assert_eq!(substitute("RTT — $s → ok", &v), "RTT — é → ok");
}

#[test]
fn referenced_vars_dedups_in_order() {
    assert_eq!(
        referenced_vars("$b ${a} [[b:csv]] $__rate_interval ${a.x}"),
        vec!["b", "a", "__rate_interval"]
    );
}

#[test]
fn builtins_cover_grafana_intervals() {
    for n in ["__rate_interval", "__interval", "__range"] {
        assert!(is_builtin(n), "{n}");
    }
    assert!(!is_builtin("datasource"));
}

fn sample() -> Value {
    json!({
        "uid": "rpingmesh-x",
        "title": "X",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus"},
            {"name": "tor", "type": "query", "query": "label_values(up{job=\"a\"}, tor)"},
            {"name": "obj", "type": "query", "query": {"query": "x"}}
        ]},
        "panels": [
            {"id": 1, "type": "stat", "title": "top",
             "targets": [{"refId": "A", "expr": "up"}, {"refId": "B", "expr": "  "}]},
            {"id": 2, "type": "row", "title": "r", "collapsed": true, "panels": [
                {"id": 3, "type": "timeseries", "title": "nested",
                 "targets": [{"refId": "A", "expr": "rate(x[$__rate_interval])"},
                             {"refId": "B", "expr": "hidden", "hide": true}]}
            ]},
            {"id": 4, "type": "text", "title": "no targets"}
        ]
    })
}

#[test]
fn panel_queries_include_nested_rows() {
    let q = panel_queries(&sample());
    assert_eq!(
        q,
        vec![
            PanelQuery {
                dashboard: "rpingmesh-x".into(),
                panel: "top".into(),
                expr: "up".into()
            },
            PanelQuery {
                dashboard: "rpingmesh-x".into(),
                panel: "nested".into(),
                expr: "rate(x[$__rate_interval])".into()
            },
        ]
    );
    let dash = sample();
    let titles: Vec<&str> = panels(&dash)
        .iter()
        .filter_map(|p| p["title"].as_str())
        .collect();
    assert_eq!(titles, vec!["top", "nested", "no targets"]);
}

#[test]
fn template_vars_and_variable_queries() {
    let d = sample();
    assert_eq!(template_vars(&d), vec!["datasource", "tor", "obj"]);
    assert_eq!(
        variable_queries(&d),
        vec![(
            "tor".to_string(),
            "label_values(up{job=\"a\"}, tor)".to_string()
        )]
    );
    assert!(template_vars(&json!({})).is_empty());
}

#[test]
fn variable_promql_forms() {
    assert_eq!(
        variable_promql(r#"label_values(rpingmesh_probe_total{service!=""}, service)"#).as_deref(),
        Some(r#"count by (service) (rpingmesh_probe_total{service!=""})"#)
    );
    assert_eq!(
        variable_promql("query_result(up == 1)").as_deref(),
        Some("up == 1")
    );
    assert_eq!(variable_promql("label_values(instance)"), None);
    assert_eq!(variable_promql("label_names()"), None);
}

#[test]
fn load_dashboards_reads_json_sorted_and_rejects_bad_json() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.json"), r#"{"title":"b"}"#).unwrap();
    std::fs::write(dir.path().join("a.json"), r#"{"title":"a"}"#).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a dashboard").unwrap();
    let d = load_dashboards(dir.path()).unwrap();
    let names: Vec<&str> = d.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, vec!["a.json", "b.json"]);
    assert_eq!(d[1].1["title"], "b");

    std::fs::write(dir.path().join("c.json"), "{ broken").unwrap();
    let e = load_dashboards(dir.path()).unwrap_err();
    assert!(format!("{e:#}").contains("c.json"), "{e:#}");

    let empty = tempfile::tempdir().unwrap();
    assert!(load_dashboards(empty.path()).is_err());
}

#[test]
fn shipped_dashboards_load_and_have_queries() {
    let d = load_dashboards(dashboards_dir()).unwrap();
    assert!(d.len() >= 5, "{} dashboards", d.len());
    for (file, dash) in &d {
        assert!(!panel_queries(dash).is_empty(), "{file} has no query");
    }
}
