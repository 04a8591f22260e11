//! Helpers for the Grafana dashboards shipped in `deploy/grafana/dashboards`: loading
//! them, listing every panel's PromQL, and substituting Grafana template variables so a
//! query can be sent as-is to Prometheus' `/api/v1/query`.
//!
//! Pure functions (no Grafana, no Prometheus needed); `tests/grafana_schema.rs` checks
//! the dashboards with them and an end-to-end test can run their queries.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// One PromQL query of one panel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PanelQuery {
    /// The dashboard's `uid` (its `title` when it has no uid).
    pub dashboard: String,
    /// The panel's `title` (may itself contain variables, e.g. `RTT — $service`).
    pub panel: String,
    /// The target's `expr`, verbatim (variables not substituted).
    pub expr: String,
}

/// The repository's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the e2e crate lives inside the workspace")
        .join("deploy")
}

/// The repository's `deploy/grafana/dashboards` directory.
pub fn dashboards_dir() -> PathBuf {
    deploy_dir().join("grafana").join("dashboards")
}

/// Every `*.json` file of `dir` as `(file name, parsed JSON)`, sorted by file name.
/// Fails on an unreadable directory, a file that is not JSON, or no dashboard at all.
pub fn load_dashboards(dir: impl AsRef<Path>) -> Result<Vec<(String, Value)>> {
    let dir = dir.as_ref();
    let mut out = Vec::new();
    for entry in
        std::fs::read_dir(dir).with_context(|| format!("reading directory {}", dir.display()))?
    {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "json") || !path.is_file() {
            continue;
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let value: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", path.display()))?;
        out.push((name, value));
    }
    if out.is_empty() {
        bail!("no *.json dashboard in {}", dir.display());
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Every panel of a dashboard except rows, including the panels nested in (collapsed)
/// rows, in document order.
pub fn panels(dash: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            if p.get("type").and_then(Value::as_str) == Some("row") {
                if let Some(nested) = p.get("panels") {
                    walk(nested, out);
                }
            } else {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    if let Some(list) = dash.get("panels") {
        walk(list, &mut out);
    }
    out
}

/// The non-empty `expr` of every target of every panel (nested rows included), skipping
/// targets marked `"hide": true`.
pub fn panel_queries(dash: &Value) -> Vec<PanelQuery> {
    let dashboard = dash
        .get("uid")
        .and_then(Value::as_str)
        .or_else(|| dash.get("title").and_then(Value::as_str))
        .unwrap_or_default()
        .to_string();
    let mut out = Vec::new();
    for p in panels(dash) {
        let panel = p
            .get("title")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        for t in p
            .get("targets")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if t.get("hide").and_then(Value::as_bool) == Some(true) {
                continue;
            }
            if let Some(expr) = t.get("expr").and_then(Value::as_str) {
                if !expr.trim().is_empty() {
                    out.push(PanelQuery {
                        dashboard: dashboard.clone(),
                        panel: panel.clone(),
                        expr: expr.to_string(),
                    });
                }
            }
        }
    }
    out
}

/// Names of the dashboard's template variables (`templating.list[].name`), in order.
pub fn template_vars(dash: &Value) -> Vec<String> {
    dash.pointer("/templating/list")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .map(str::to_string)
        .collect()
}

/// Grafana's built-in variables that can appear in a PromQL query, with the values
/// [`substitute`] uses for them unless `vars` says otherwise: a 1 m rate window, a 15 s
/// step and a 5 m dashboard range.
pub fn builtin_vars() -> BTreeMap<String, String> {
    [
        ("__rate_interval", "1m"),
        ("__rate_interval_ms", "60000"),
        ("__interval", "15s"),
        ("__interval_ms", "15000"),
        ("__range", "5m"),
        ("__range_s", "300"),
        ("__range_ms", "300000"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Whether `name` is one of [`builtin_vars`].
pub fn is_builtin(name: &str) -> bool {
    builtin_vars().contains_key(name)
}

/// A variable reference found in a query.
struct VarRef {
    /// Byte range of the whole reference (`$x`, `${x:fmt}`, `[[x]]`).
    start: usize,
    end: usize,
    name: String,
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Where the run of word characters from `from` ends.
fn word_end(b: &[u8], from: usize) -> usize {
    from + b[from..].iter().take_while(|&&c| is_word(c)).count()
}

/// A reference at `i` opened by `open` and closed by `close`, with what stands between
/// the name and the close (a format, a field) accepted by `tail_ok`.
fn enclosed(
    s: &str,
    i: usize,
    open: &str,
    close: &str,
    tail_ok: fn(&str) -> bool,
) -> Option<VarRef> {
    if !s[i..].starts_with(open) {
        return None;
    }
    let name_start = i + open.len();
    let j = word_end(s.as_bytes(), name_start);
    if j == name_start {
        return None;
    }
    let c = s[j..].find(close)?;
    tail_ok(&s[j..j + c]).then(|| VarRef {
        start: i,
        end: j + c + close.len(),
        name: s[name_start..j].to_string(),
    })
}

/// Finds the variable references of `s` the way Grafana's template service does:
/// `$name`, `${name}`, `${name:format}`, `${name.field}`, `[[name]]`, `[[name:format]]`
/// (`name` = `[A-Za-z0-9_]+`).
fn var_refs(s: &str) -> Vec<VarRef> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let found = if s[i..].starts_with("${") {
            enclosed(s, i, "${", "}", |t| {
                t.is_empty() || t.starts_with(':') || t.starts_with('.')
            })
        } else if s[i..].starts_with('$') {
            let j = word_end(s.as_bytes(), i + 1);
            (j > i + 1).then(|| VarRef {
                start: i,
                end: j,
                name: s[i + 1..j].to_string(),
            })
        } else {
            enclosed(s, i, "[[", "]]", |t| {
                t.is_empty() || (t.starts_with(':') && !t.contains('['))
            })
        };
        match found {
            Some(r) => {
                i = r.end;
                out.push(r);
            }
            // Advance by one character (not byte) to stay on UTF-8 boundaries.
            None => i += s[i..].chars().next().map_or(1, char::len_utf8),
        }
    }
    out
}

/// Names of the variables `expr` refers to (any of Grafana's three syntaxes), each once,
/// in order of first use. Built-ins such as `__rate_interval` are included.
pub fn referenced_vars(expr: &str) -> Vec<String> {
    let mut seen = BTreeSet::new();
    var_refs(expr)
        .into_iter()
        .filter(|r| seen.insert(r.name.clone()))
        .map(|r| r.name)
        .collect()
}

/// Replaces every variable reference of `expr` (`$var`, `${var}`, `${var:format}`,
/// `[[var]]`) by its value from `vars`, falling back to [`builtin_vars`] for Grafana's
/// built-ins (`$__rate_interval` -> `1m`, `$__interval` -> `15s`, `$__range` -> `5m`, ...).
/// Values are inserted verbatim (no regex escaping, formats ignored); a reference to an
/// unknown variable is left as it is, so [`referenced_vars`] on the result finds it.
pub fn substitute(expr: &str, vars: &BTreeMap<String, String>) -> String {
    let builtins = builtin_vars();
    let mut out = String::with_capacity(expr.len());
    let mut last = 0;
    for r in var_refs(expr) {
        let value = vars.get(&r.name).or_else(|| builtins.get(&r.name));
        if let Some(v) = value {
            out.push_str(&expr[last..r.start]);
            out.push_str(v);
            last = r.end;
        }
    }
    out.push_str(&expr[last..]);
    out
}

/// The PromQL equivalent of a Prometheus template-variable query, for checking that it
/// parses and selects something: `label_values(sel, label)` -> `count by (label) (sel)`,
/// `query_result(q)` -> `q`. `None` for forms without a PromQL equivalent
/// (`label_values(label)`, `label_names()`, `metrics(...)`).
pub fn variable_promql(query: &str) -> Option<String> {
    let q = query.trim();
    if let Some(inner) = q
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
    {
        let (sel, label) = inner.rsplit_once(',')?;
        let (sel, label) = (sel.trim(), label.trim());
        if sel.is_empty() || label.is_empty() || !label.bytes().all(is_word) {
            return None;
        }
        return Some(format!("count by ({label}) ({sel})"));
    }
    if let Some(inner) = q
        .strip_prefix("query_result(")
        .and_then(|r| r.strip_suffix(')'))
    {
        return Some(inner.trim().to_string());
    }
    None
}

/// `(variable name, query)` of every `query`-type template variable whose query is a
/// string.
pub fn variable_queries(dash: &Value) -> Vec<(String, String)> {
    dash.pointer("/templating/list")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("type").and_then(Value::as_str) == Some("query"))
        .filter_map(|v| {
            Some((
                v.get("name")?.as_str()?.to_string(),
                v.get("query")?.as_str()?.to_string(),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests;
