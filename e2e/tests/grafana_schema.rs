//! Checks the Grafana dashboards in deploy/grafana/dashboards, without Grafana:
//! - against Grafana's own dashboard JSON Schema (vendored in deploy/grafana/schema, see
//!   its README for provenance), validated with the `jsonschema` crate;
//! - against what the schema cannot say: unique uids and panel ids, non-overlapping
//!   gridPos, every variable used is defined, every datasource reference resolves to the
//!   provisioned Prometheus datasource (or the `datasource` variable), every panel has a
//!   PromQL `expr`, metric names and labels exist in the agents'/controller's contract,
//!   scrape job names exist in deploy/prometheus/prometheus.yml, data links point at
//!   shipped dashboards;
//! - and that these checks can fail, on deliberately broken copies.
//!
//! It also checks the provisioning files and the Prometheus config (with `promtool` when
//! it is installed), and runs every query against a throwaway Prometheus (when installed).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use rpingmesh_e2e::grafana::{
    dashboards_dir, deploy_dir, is_builtin, load_dashboards, panel_queries, panels,
    referenced_vars, template_vars, variable_queries,
};
use serde_json::{json, Value};

/// The five dashboards the project ships.
const EXPECTED_FILES: &[&str] = &[
    "agent-health.json",
    "findings.json",
    "mesh-overview.json",
    "service-paths.json",
    "tor-pair.json",
];

/// Metric names of the agents' and controller's /metrics (the Go R-Pingmesh contract).
const HISTOGRAMS: &[&str] = &[
    "rpingmesh_network_rtt_ns",
    "rpingmesh_prober_delay_ns",
    "rpingmesh_responder_delay_ns",
];
const OTHER_METRICS: &[&str] = &[
    "rpingmesh_probe_total",
    "rpingmesh_probe_success_total",
    "rpingmesh_probe_failed_total",
    "rpingmesh_agent_dropped_packets_total",
    "rpingmesh_agent_transport_failures_total",
    "rpingmesh_event_ring_dropped_total",
    "rpingmesh_agent_qp_resets_total",
    "rpingmesh_agent_tracer_ringbuf_dropped_total",
    "rpingmesh_agent_cpu_seconds_total",
    "rpingmesh_agent_self_throttle",
    "rpingmesh_agent_rss_bytes",
    "rpingmesh_analyzer_path_summaries_total",
    "rpingmesh_analyzer_sla_violations_total",
    "rpingmesh_analyzer_findings_open",
    "rpingmesh_analyzer_affected_services",
    "rpingmesh_controller_rnics",
    "rpingmesh_controller_service_paths",
];
/// Labels the metrics carry (plus Prometheus' own).
const LABELS: &[&str] = &[
    "le",
    "source_tor",
    "target_tor",
    "service",
    "reason",
    "reason_detail",
    "kind",
    "state",
    "monitored",
    "job",
    "instance",
    "otel_scope_name",
];

fn schema_path() -> PathBuf {
    deploy_dir()
        .join("grafana")
        .join("schema")
        .join("dashboard.schema.json")
}

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn schema() -> Value {
    serde_json::from_str(&read(schema_path())).expect("the schema is JSON")
}

fn validator() -> jsonschema::Validator {
    jsonschema::draft7::new(&schema()).expect("the vendored schema compiles as draft-07")
}

fn schema_errors(v: &jsonschema::Validator, dash: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for e in v.iter_errors(dash) {
        describe(&e, "", &mut out);
    }
    out
}

/// One line per error, `schema: at "<instance path>": <message>`; for anyOf/oneOf the
/// reasons of each branch follow, indented (a panel is `anyOf: [Panel, RowPanel]`).
fn describe(e: &jsonschema::ValidationError<'_>, indent: &str, out: &mut Vec<String>) {
    use jsonschema::error::ValidationErrorKind as K;
    let at = e.instance_path().as_str();
    match e.kind() {
        K::AnyOf { context } | K::OneOfNotValid { context } => {
            out.push(format!("{indent}schema: at {at:?}: {}", e.masked()));
            for (i, branch) in context.iter().enumerate() {
                let sub = format!("{indent}  [branch {i}] ");
                for b in branch {
                    describe(b, &sub, out);
                }
            }
        }
        _ => {
            let mut msg = e.to_string();
            if msg.len() > 300 {
                let cut = (0..=300)
                    .rev()
                    .find(|&i| msg.is_char_boundary(i))
                    .unwrap_or(0);
                msg.truncate(cut);
                msg.push_str("...");
            }
            out.push(format!("{indent}schema: at {at:?}: {msg}"));
        }
    }
}

/// What a dashboard is checked against besides itself.
struct Ctx {
    /// uids of the datasources in deploy/grafana/provisioning/datasources/*.yaml
    provisioned_ds: BTreeSet<String>,
    /// Every shipped dashboard's uid -> its template variables (for data links).
    dashboards: BTreeMap<String, Vec<String>>,
    /// job_name values of deploy/prometheus/prometheus.yml
    jobs: BTreeSet<String>,
}

/// Values of `key: value` lines of a YAML file (enough for our flat provisioning files).
fn yaml_values(text: &str, key: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.trim_start().trim_start_matches("- ").trim())
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().trim_matches('"').trim_matches('\'').to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

fn ctx(all: &[(String, Value)]) -> Ctx {
    let ds_dir = deploy_dir().join("grafana/provisioning/datasources");
    let mut provisioned_ds = BTreeSet::new();
    for e in std::fs::read_dir(&ds_dir).expect("datasource provisioning dir") {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            provisioned_ds.extend(yaml_values(&read(p), "uid"));
        }
    }
    let jobs = yaml_values(
        &read(deploy_dir().join("prometheus/prometheus.yml")),
        "job_name",
    )
    .into_iter()
    .collect();
    let dashboards = all
        .iter()
        .map(|(_, d)| {
            (
                d["uid"].as_str().unwrap_or_default().to_string(),
                template_vars(d),
            )
        })
        .collect();
    Ctx {
        provisioned_ds,
        dashboards,
        jobs,
    }
}

#[derive(Clone, Copy)]
struct Rect {
    x: i64,
    y: i64,
    w: i64,
    h: i64,
}

impl Rect {
    fn overlaps(&self, o: &Rect) -> bool {
        self.x < o.x + o.w && o.x < self.x + self.w && self.y < o.y + o.h && o.y < self.y + self.h
    }
}

fn grid_pos(p: &Value, what: &str, errs: &mut Vec<String>) -> Option<Rect> {
    let g = p.get("gridPos");
    let f = |k: &str| g.and_then(|g| g.get(k)).and_then(Value::as_i64);
    match (f("x"), f("y"), f("w"), f("h")) {
        (Some(x), Some(y), Some(w), Some(h)) => {
            if x < 0 || y < 0 || w < 1 || h < 1 || x + w > 24 {
                errs.push(format!(
                    "{what}: gridPos {x},{y} {w}x{h} is outside the 24-column grid"
                ));
            }
            Some(Rect { x, y, w, h })
        }
        _ => {
            errs.push(format!("{what}: gridPos needs integer x, y, w, h"));
            None
        }
    }
}

fn title_of(p: &Value) -> String {
    format!(
        "panel {} {:?}",
        p.get("id").map(|v| v.to_string()).unwrap_or_default(),
        p.get("title").and_then(Value::as_str).unwrap_or_default()
    )
}

fn check_overlaps(items: &[(String, Rect)], errs: &mut Vec<String>) {
    for (i, (a_name, a)) in items.iter().enumerate() {
        for (b_name, b) in &items[i + 1..] {
            if a.overlaps(b) {
                errs.push(format!("{a_name} and {b_name}: gridPos overlap"));
            }
        }
    }
}

/// Identifiers `rpingmesh_...` of a query.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(off) = expr[i..].find("rpingmesh_") {
        let start = i + off;
        let boundary =
            start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_');
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        if boundary {
            out.push(expr[start..end].to_string());
        }
        i = end;
    }
    out
}

fn known_metric(name: &str) -> bool {
    OTHER_METRICS.contains(&name)
        || HISTOGRAMS.iter().any(|h| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| name == format!("{h}{s}"))
        })
}

/// Label lists of `by (...)` / `without (...)` clauses.
fn grouping_labels(expr: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for kw in ["by (", "by(", "without (", "without("] {
        let mut rest = expr;
        while let Some(i) = rest.find(kw) {
            let after = &rest[i + kw.len()..];
            let Some(close) = after.find(')') else { break };
            out.push(
                after[..close]
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect(),
            );
            rest = &after[close..];
        }
    }
    out
}

/// `job="x"` matchers of a query.
fn job_matchers(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("job=\"") {
        let after = &rest[i + 5..];
        let Some(close) = after.find('"') else { break };
        out.push(after[..close].to_string());
        rest = &after[close..];
    }
    out
}

/// Everything the JSON Schema cannot check. Returns one message per problem.
fn semantic_errors(dash: &Value, ctx: &Ctx) -> Vec<String> {
    let mut errs = Vec::new();

    // Identity.
    match dash.get("title").and_then(Value::as_str) {
        Some(t) if !t.trim().is_empty() => {}
        _ => errs.push("dashboard: missing or empty title".into()),
    }
    match dash.get("uid").and_then(Value::as_str) {
        Some(u)
            if u.starts_with("rpingmesh-")
                && u.len() <= 40
                && u.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_') => {}
        other => errs.push(format!(
            "dashboard: uid {other:?} must be rpingmesh-<name>, at most 40 of [A-Za-z0-9_-]"
        )),
    }
    if dash.get("schemaVersion").and_then(Value::as_i64) != Some(39) {
        errs.push("dashboard: schemaVersion must be 39".into());
    }

    // Template variables.
    let vars = template_vars(dash);
    let defined: BTreeSet<&str> = vars.iter().map(String::as_str).collect();
    if defined.len() != vars.len() {
        errs.push(format!("templating: duplicate variable names in {vars:?}"));
    }
    let var_defs: Vec<&Value> = dash
        .pointer("/templating/list")
        .and_then(Value::as_array)
        .map(|l| l.iter().collect())
        .unwrap_or_default();
    let ds_var_ok = var_defs.iter().any(|v| {
        v["type"] == "datasource" && v["name"] == "datasource" && v["query"] == "prometheus"
    });
    for v in &var_defs {
        if v["type"] == "datasource" {
            if v["query"] != "prometheus" {
                errs.push(format!(
                    "variable {}: datasource type must be prometheus",
                    v["name"]
                ));
            }
            if let Some(cur) = v.pointer("/current/value").and_then(Value::as_str) {
                if !ctx.provisioned_ds.contains(cur) {
                    errs.push(format!(
                        "variable {}: default {cur:?} is not a provisioned datasource",
                        v["name"]
                    ));
                }
            }
        }
    }
    let check_ds = |what: &str, ds: Option<&Value>, errs: &mut Vec<String>| {
        let Some(ds) = ds else {
            errs.push(format!("{what}: no datasource"));
            return;
        };
        let uid = ds.get("uid").and_then(Value::as_str).unwrap_or_default();
        let by_var = (uid == "${datasource}" || uid == "$datasource") && ds_var_ok;
        if ds.get("type").and_then(Value::as_str) != Some("prometheus")
            || !(by_var || ctx.provisioned_ds.contains(uid))
        {
            errs.push(format!(
                "{what}: datasource {ds} is neither the provisioned Prometheus {:?} nor the \
                 datasource variable",
                ctx.provisioned_ds
            ));
        }
    };
    let check_vars = |what: &str, text: &str, errs: &mut Vec<String>| {
        for name in referenced_vars(text) {
            if !defined.contains(name.as_str()) && !is_builtin(&name) {
                errs.push(format!(
                    "{what}: variable ${name} is not defined in templating"
                ));
            }
        }
    };
    for v in &var_defs {
        if v["type"] == "query" {
            check_ds(
                &format!("variable {}", v["name"]),
                v.get("datasource"),
                &mut errs,
            );
        }
    }
    for (name, q) in variable_queries(dash) {
        check_vars(&format!("variable {name}"), &q, &mut errs);
    }
    let check_repeat = |what: &str, p: &Value, errs: &mut Vec<String>| {
        if let Some(r) = p.get("repeat").and_then(Value::as_str) {
            match var_defs.iter().find(|v| v["name"] == r) {
                Some(v) if v["multi"] == true || v["includeAll"] == true => {}
                Some(_) => errs.push(format!(
                    "{what}: repeats over ${r}, which is neither multi nor includeAll"
                )),
                None => errs.push(format!("{what}: repeats over undefined variable ${r}")),
            }
        }
    };

    // Panel ids, layout, rows.
    let top: Vec<&Value> = dash
        .get("panels")
        .and_then(Value::as_array)
        .map(|l| l.iter().collect())
        .unwrap_or_default();
    if top.is_empty() {
        errs.push("dashboard: no panels".into());
    }
    let mut ids = BTreeSet::new();
    let mut top_rects = Vec::new();
    for p in &top {
        let what = title_of(p);
        if let Some(r) = grid_pos(p, &what, &mut errs) {
            top_rects.push((what.clone(), r));
        }
        check_repeat(&what, p, &mut errs);
        if p["type"] == "row" {
            let nested: Vec<&Value> = p
                .get("panels")
                .and_then(Value::as_array)
                .map(|l| l.iter().collect())
                .unwrap_or_default();
            if !nested.is_empty() && p["collapsed"] != true {
                errs.push(format!("{what}: an expanded row must not hold panels"));
            }
            let row_y = p.pointer("/gridPos/y").and_then(Value::as_i64).unwrap_or(0);
            let mut rects = Vec::new();
            for n in nested {
                let nw = title_of(n);
                if n["type"] == "row" {
                    errs.push(format!("{nw}: rows cannot nest"));
                }
                check_repeat(&nw, n, &mut errs);
                if let Some(r) = grid_pos(n, &nw, &mut errs) {
                    if r.y <= row_y {
                        errs.push(format!("{nw}: must be placed below its row"));
                    }
                    rects.push((nw, r));
                }
            }
            check_overlaps(&rects, &mut errs);
        }
    }
    check_overlaps(&top_rects, &mut errs);
    let mut all_ids: Vec<&Value> = top.clone();
    all_ids.extend(
        panels(dash)
            .into_iter()
            .filter(|p| !top.iter().any(|t| std::ptr::eq(*t, *p))),
    );
    for p in all_ids {
        match p.get("id").and_then(Value::as_i64) {
            Some(id) => {
                if !ids.insert(id) {
                    errs.push(format!("{}: duplicate panel id {id}", title_of(p)));
                }
            }
            None => errs.push(format!("{}: no integer id", title_of(p))),
        }
    }

    // Panels: titles, datasources, targets, queries, links.
    for p in panels(dash) {
        let what = title_of(p);
        match p.get("title").and_then(Value::as_str) {
            Some(t) if !t.trim().is_empty() => check_vars(&what, t, &mut errs),
            _ => errs.push(format!("{what}: no title")),
        }
        check_ds(&what, p.get("datasource"), &mut errs);
        let targets = p.get("targets").and_then(Value::as_array);
        let mut refs = BTreeSet::new();
        let mut exprs = 0;
        for (i, t) in targets.into_iter().flatten().enumerate() {
            let tw = format!("{what} target {i}");
            match t.get("refId").and_then(Value::as_str) {
                Some(r) if !r.is_empty() => {
                    if !refs.insert(r) {
                        errs.push(format!("{tw}: duplicate refId {r}"));
                    }
                }
                _ => errs.push(format!("{tw}: no refId")),
            }
            check_ds(&tw, t.get("datasource"), &mut errs);
            let Some(expr) = t.get("expr").and_then(Value::as_str) else {
                errs.push(format!("{tw}: no expr"));
                continue;
            };
            if expr.trim().is_empty() {
                errs.push(format!("{tw}: empty expr"));
                continue;
            }
            exprs += 1;
            check_vars(&tw, expr, &mut errs);
            for m in metric_names(expr) {
                if !known_metric(&m) {
                    errs.push(format!("{tw}: unknown metric {m}"));
                }
            }
            for group in grouping_labels(expr) {
                for l in &group {
                    if !LABELS.contains(&l.as_str()) {
                        errs.push(format!("{tw}: unknown label {l} in by/without"));
                    }
                }
                if expr.contains("histogram_quantile") && !group.iter().any(|l| l == "le") {
                    errs.push(format!(
                        "{tw}: histogram_quantile needs `le` in every by (...)"
                    ));
                }
            }
            for job in job_matchers(expr) {
                if !ctx.jobs.contains(&job) {
                    errs.push(format!(
                        "{tw}: job {job:?} is not scraped by prometheus.yml"
                    ));
                }
            }
        }
        if exprs == 0 {
            errs.push(format!("{what}: no target with a PromQL expr"));
        }
        let links = p
            .pointer("/fieldConfig/defaults/links")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .chain(
                p.get("links")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten(),
            );
        for l in links {
            let url = l.get("url").and_then(Value::as_str).unwrap_or_default();
            if let Some(rest) = url.strip_prefix("/d/") {
                let uid = rest.split(['/', '?']).next().unwrap_or_default();
                match ctx.dashboards.get(uid) {
                    None => errs.push(format!("{what}: link to unknown dashboard {uid:?}")),
                    Some(target_vars) => {
                        for param in url.split(['?', '&']).filter_map(|s| s.strip_prefix("var-")) {
                            let name = param.split('=').next().unwrap_or_default();
                            if !target_vars.iter().any(|v| v == name) {
                                errs.push(format!(
                                    "{what}: link sets var-{name}, which {uid} does not define"
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    errs
}

fn all_dashboards() -> Vec<(String, Value)> {
    load_dashboards(dashboards_dir()).expect("loading deploy/grafana/dashboards")
}

#[test]
fn the_five_dashboards_are_shipped() {
    let files: Vec<String> = all_dashboards().into_iter().map(|(f, _)| f).collect();
    assert_eq!(files, EXPECTED_FILES);
}

#[test]
fn schema_is_the_vendored_grafana_schema() {
    let s = schema();
    assert_eq!(s["$schema"], "http://json-schema.org/draft-07/schema#");
    let comment = s["$comment"]
        .as_str()
        .expect("$comment says where the schema comes from");
    assert!(comment.contains("grafana-foundation-sdk"), "{comment}");
    assert!(s.pointer("/definitions/Dashboard").is_some());
    assert!(deploy_dir()
        .join("grafana/schema/LICENSE-grafana-foundation-sdk")
        .is_file());
}

#[test]
fn every_dashboard_matches_grafana_schema() {
    let v = validator();
    let mut report = Vec::new();
    for (file, dash) in all_dashboards() {
        for e in schema_errors(&v, &dash) {
            report.push(format!("{file}: {e}"));
        }
    }
    assert!(
        report.is_empty(),
        "schema violations:\n{}",
        report.join("\n")
    );
}

#[test]
fn every_dashboard_passes_semantic_checks() {
    let all = all_dashboards();
    let c = ctx(&all);
    assert!(
        c.provisioned_ds.contains("rpingmesh-prometheus"),
        "{:?}",
        c.provisioned_ds
    );
    let mut report = Vec::new();
    let mut uids = BTreeSet::new();
    let mut titles = BTreeSet::new();
    for (file, dash) in &all {
        if !uids.insert(dash["uid"].to_string()) {
            report.push(format!("{file}: duplicate dashboard uid {}", dash["uid"]));
        }
        if !titles.insert(dash["title"].to_string()) {
            report.push(format!(
                "{file}: duplicate dashboard title {}",
                dash["title"]
            ));
        }
        for e in semantic_errors(dash, &c) {
            report.push(format!("{file}: {e}"));
        }
        assert!(!panel_queries(dash).is_empty(), "{file}");
    }
    assert!(report.is_empty(), "problems:\n{}", report.join("\n"));
}

/// Applies `f` to a copy of mesh-overview.json.
fn broken(f: impl FnOnce(&mut Value)) -> Value {
    let mut d = all_dashboards()
        .into_iter()
        .find(|(f, _)| f == "mesh-overview.json")
        .expect("mesh-overview.json")
        .1;
    f(&mut d);
    d
}

fn set(d: &mut Value, ptr: &str, v: Value) {
    *d.pointer_mut(ptr)
        .unwrap_or_else(|| panic!("{ptr} not in the dashboard")) = v;
}

#[test]
fn broken_copies_are_rejected() {
    let all = all_dashboards();
    let c = ctx(&all);
    let v = validator();
    let errors = |d: &Value| {
        let mut e = schema_errors(&v, d);
        e.extend(semantic_errors(d, &c));
        e
    };
    // The intact copy is clean, so each error below comes from its one change.
    assert_eq!(errors(&broken(|_| {})), Vec::<String>::new());

    let first_target = "/panels/0/targets/0";
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "gridPos.w as a string",
            broken(|d| set(d, "/panels/0/gridPos/w", json!("4"))),
            "at \"/panels/0/gridPos/w\": \"4\" is not of type \"integer\"",
        ),
        (
            "gridPos.w wider than the grid",
            broken(|d| set(d, "/panels/0/gridPos/w", json!(30))),
            "at \"/panels/0/gridPos/w\": 30 is greater than the maximum of 24",
        ),
        (
            "schemaVersion missing",
            broken(|d| {
                d.as_object_mut().unwrap().remove("schemaVersion");
            }),
            "\"schemaVersion\" is a required property",
        ),
        (
            "unknown dashboard property",
            broken(|d| {
                d.as_object_mut()
                    .unwrap()
                    .insert("style".into(), json!("dark"));
            }),
            "Additional properties are not allowed ('style' was unexpected)",
        ),
        (
            "title missing",
            broken(|d| {
                d.as_object_mut().unwrap().remove("title");
            }),
            "missing or empty title",
        ),
        (
            "overlapping panels",
            broken(|d| {
                let g = d["panels"][0]["gridPos"].clone();
                set(d, "/panels/1/gridPos", g);
            }),
            "gridPos overlap",
        ),
        (
            "duplicate panel id",
            broken(|d| {
                let id = d["panels"][0]["id"].clone();
                set(d, "/panels/1/id", id);
            }),
            "duplicate panel id",
        ),
        (
            "undefined variable",
            broken(|d| {
                set(
                    d,
                    &format!("{first_target}/expr"),
                    json!("up{instance=\"$nosuch\"}"),
                )
            }),
            "$nosuch is not defined",
        ),
        (
            "foreign datasource",
            broken(|d| set(d, &format!("{first_target}/datasource/uid"), json!("other"))),
            "neither the provisioned Prometheus",
        ),
        (
            "panel without expr",
            broken(|d| set(d, "/panels/0/targets", json!([]))),
            "no target with a PromQL expr",
        ),
        (
            "misspelt metric",
            broken(|d| {
                set(
                    d,
                    &format!("{first_target}/expr"),
                    json!("sum(rpingmesh_probe_totl)"),
                )
            }),
            "unknown metric rpingmesh_probe_totl",
        ),
        (
            "unscraped job",
            broken(|d| {
                set(
                    d,
                    &format!("{first_target}/expr"),
                    json!("sum(up{job=\"rpingmesh-agents\"})"),
                )
            }),
            "is not scraped",
        ),
        (
            "histogram_quantile without le",
            broken(|d| {
                set(
                    d,
                    &format!("{first_target}/expr"),
                    json!("histogram_quantile(0.99, sum by (source_tor) (rate(rpingmesh_network_rtt_ns_bucket[5m])))"),
                )
            }),
            "needs `le`",
        ),
    ];
    let mut failures = Vec::new();
    for (name, dash, expected) in cases {
        let e = errors(&dash);
        if !e.iter().any(|m| m.contains(expected)) {
            failures.push(format!(
                "{name}: expected an error containing {expected:?}, got {e:#?}"
            ));
        }
    }
    // A data link to a dashboard that does not exist.
    let d = broken(|d| {
        let p = d["panels"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|p| p.pointer("/fieldConfig/defaults/links/0/url").is_some())
            .expect("mesh-overview has a panel with a data link");
        p["fieldConfig"]["defaults"]["links"][0]["url"] = json!("/d/rpingmesh-nope/x");
    });
    if !errors(&d).iter().any(|m| m.contains("unknown dashboard")) {
        failures.push("a link to a missing dashboard went unnoticed".into());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn provisioning_files_match_the_dashboards() {
    let ds = read(deploy_dir().join("grafana/provisioning/datasources/rpingmesh.yaml"));
    assert_eq!(yaml_values(&ds, "uid"), vec!["rpingmesh-prometheus"]);
    assert_eq!(yaml_values(&ds, "type"), vec!["prometheus"]);
    let prov = read(deploy_dir().join("grafana/provisioning/dashboards/rpingmesh.yaml"));
    assert_eq!(yaml_values(&prov, "type"), vec!["file"]);
    assert_eq!(yaml_values(&prov, "path").len(), 1, "{prov}");
}

#[test]
fn prometheus_config_discovers_both_jobs_from_files() {
    let dir = deploy_dir().join("prometheus");
    let cfg = read(dir.join("prometheus.yml"));
    assert_eq!(
        yaml_values(&cfg, "job_name"),
        vec!["rpingmesh-agent", "rpingmesh-controller"]
    );
    assert!(cfg.contains("targets/agents*.json"), "{cfg}");
    assert!(cfg.contains("targets/controller*.json"), "{cfg}");
    // The examples are valid file_sd JSON but do not match the globs.
    let mut examples = 0;
    for e in std::fs::read_dir(dir.join("targets")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".json.example") {
            examples += 1;
            let v: Value = serde_json::from_str(&read(p)).expect("example is JSON");
            assert!(v[0]["targets"].is_array(), "{name}");
        }
    }
    assert_eq!(examples, 2);

    // promtool, when installed, checks a copy with target files written next to it.
    let Some(promtool) = ["/usr/bin/promtool", "/usr/local/bin/promtool"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
    else {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED promtool check: promtool not installed (apt-get install prometheus)"
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(
        dir.join("prometheus.yml"),
        tmp.path().join("prometheus.yml"),
    )
    .unwrap();
    std::fs::create_dir(tmp.path().join("targets")).unwrap();
    std::fs::write(
        tmp.path().join("targets/agents.json"),
        r#"[{"targets":["127.0.0.1:9464"],"labels":{}}]"#,
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("targets/controller.json"),
        r#"[{"targets":["127.0.0.1:9465"]}]"#,
    )
    .unwrap();
    let out = std::process::Command::new(promtool)
        .args(["check", "config"])
        .arg(tmp.path().join("prometheus.yml"))
        .output()
        .expect("running promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool check config failed:\n{text}"
    );
    assert!(!text.contains("WARNING"), "{text}");
}

// ---------------------------------------------------------------------------------------
// Every query parses and evaluates in a real Prometheus (when one is installed).

/// Percent-encodes a query-string value.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A minimal HTTP/1.0 GET on loopback: (status code, body).
fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let code = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

#[test]
fn every_query_is_accepted_by_prometheus() {
    use rpingmesh_e2e::grafana::{substitute, variable_promql};
    use std::time::{Duration, Instant};
    let Some(prometheus) = ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
    else {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED every_query_is_accepted_by_prometheus: prometheus not installed \
             (apt-get install prometheus)"
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("prometheus.yml");
    std::fs::copy(deploy_dir().join("prometheus/prometheus.yml"), &cfg).unwrap();
    std::fs::create_dir(tmp.path().join("targets")).unwrap();
    // Closed loopback ports: the targets exist (and are down), nothing is scraped.
    let dead = || {
        format!(
            "127.0.0.1:{}",
            rpingmesh_e2e::free_tcp_port(std::net::Ipv4Addr::LOCALHOST)
        )
    };
    std::fs::write(
        tmp.path().join("targets/agents.json"),
        format!(r#"[{{"targets":["{}"]}}]"#, dead()),
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("targets/controller.json"),
        format!(r#"[{{"targets":["{}"]}}]"#, dead()),
    )
    .unwrap();
    let port = rpingmesh_e2e::free_tcp_port(std::net::Ipv4Addr::LOCALHOST);
    let args: Vec<String> = vec![
        format!("--config.file={}", cfg.display()),
        format!("--storage.tsdb.path={}", tmp.path().join("data").display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
        "--log.level=warn".into(),
    ];
    let mut proc =
        rpingmesh_e2e::Proc::spawn(tmp.path(), "prometheus", None, &prometheus, &args).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok((200, _)) = http_get(port, "/-/ready") {
            break;
        }
        assert!(proc.alive(), "prometheus exited:\n{}", proc.stderr());
        assert!(
            Instant::now() < deadline,
            "prometheus not ready in 60 s:\n{}",
            proc.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // file_sd found both jobs.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, body) = http_get(port, "/api/v1/targets").unwrap();
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        let jobs: BTreeSet<String> = v
            .pointer("/data/activeTargets")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|t| t.pointer("/labels/job").and_then(Value::as_str))
            .map(str::to_string)
            .collect();
        if jobs.contains("rpingmesh-agent") && jobs.contains("rpingmesh-controller") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "file_sd targets not found: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let vars: BTreeMap<String, String> = [
        ("datasource", "rpingmesh-prometheus"),
        ("source_tor", "tor-a"),
        ("target_tor", "tor-b"),
        ("service", "svc"),
        ("instance", "127.0.0.1:9464"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut queries = Vec::new();
    for (file, dash) in all_dashboards() {
        for q in panel_queries(&dash) {
            queries.push((format!("{file} / {}", q.panel), substitute(&q.expr, &vars)));
        }
        for (name, q) in variable_queries(&dash) {
            let promql = variable_promql(&q)
                .unwrap_or_else(|| panic!("{file}: variable {name}: no PromQL form of {q}"));
            queries.push((
                format!("{file} / variable {name}"),
                substitute(&promql, &vars),
            ));
        }
    }
    assert!(queries.len() > 50, "{} queries", queries.len());
    let mut failures = Vec::new();
    for (what, q) in &queries {
        assert!(referenced_vars(q).is_empty(), "{what}: unsubstituted {q}");
        match http_get(port, &format!("/api/v1/query?query={}", urlencode(q))) {
            Ok((200, body)) if body.contains(r#""status":"success""#) => {}
            Ok((code, body)) => failures.push(format!("{what}: HTTP {code}: {body}\n  {q}")),
            Err(e) => failures.push(format!("{what}: {e}\n  {q}")),
        }
    }
    proc.stop();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
