//! The JSON-lines benches (controller-bench, agent-bench, ...): running them, the
//! median of several runs, and their tables.

use super::*;

pub(super) type Line = Map<String, Value>;

/// Every libFuzzer target for a minute (5 s with --quick), through `cargo xtask fuzz`.
pub(super) fn fuzz_lines(quick: bool) -> Result<Vec<Line>> {
    crate::fuzz::run(crate::fuzz::FuzzArgs {
        seconds: if quick { 5 } else { 60 },
        target: None,
    })?;
    recorded_lines(&crate::fuzz::results_path())
}

/// Runs a bench binary `runs` times; returns per-line medians over the runs.
/// The JSON object lines of a recorded bench run (other lines skipped).
pub(super) fn recorded_lines(path: &Path) -> Result<Vec<Line>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let lines: Vec<Line> = text
        .lines()
        .filter_map(|l| match serde_json::from_str::<Value>(l) {
            Ok(Value::Object(m)) => Some(m),
            _ => None,
        })
        .collect();
    if lines.is_empty() {
        bail!("{}: no JSON lines", path.display());
    }
    Ok(lines)
}

pub(super) fn json_bench(bin: &str, args: &[&str], runs: usize) -> Result<Vec<Line>> {
    let exe = procs::release_bin(bin)?;
    let mut all_runs = Vec::new();
    for i in 0..runs {
        eprintln!("xtask bench: {bin} run {}/{runs}", i + 1);
        let mut cmd = Command::new(&exe);
        cmd.args(args);
        cmd.current_dir(crate::root())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let mut lines = Vec::new();
        for l in BufReader::new(child.stdout.take().expect("piped")).lines() {
            let l = l?;
            match serde_json::from_str::<Value>(&l) {
                Ok(Value::Object(m)) => {
                    eprintln!("  {l}");
                    lines.push(m)
                }
                _ => eprintln!("  {bin}: {l}"),
            }
        }
        let st = child.wait()?;
        if !st.success() {
            bail!("{bin} exited with {st}");
        }
        if lines.is_empty() {
            bail!("{bin} printed no JSON lines");
        }
        all_runs.push(lines);
    }
    Ok(median_lines(&all_runs))
}

/// Identity of a line across runs: its string fields, plus its rank among lines with the
/// same string fields.
pub(super) fn line_keys(lines: &[Line]) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    lines
        .iter()
        .map(|l| {
            let base: Vec<String> = l
                .iter()
                .filter(|(_, v)| v.is_string())
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let base = base.join(",");
            let n = seen.entry(base.clone()).or_default();
            *n += 1;
            format!("{base}#{n}")
        })
        .collect()
}

/// Median of every numeric field over the runs, keeping the first run's line order.
pub fn median_lines(runs: &[Vec<Line>]) -> Vec<Line> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    let keyed: Vec<BTreeMap<String, &Line>> = runs
        .iter()
        .map(|r| line_keys(r).into_iter().zip(r.iter()).collect())
        .collect();
    let mut out = Vec::new();
    for (key, line) in line_keys(first).into_iter().zip(first.iter()) {
        let mut m = Line::new();
        for (k, v) in line {
            if v.is_number() {
                let mut xs: Vec<f64> = keyed
                    .iter()
                    .filter_map(|r| r.get(&key)?.get(k)?.as_f64())
                    .collect();
                xs.sort_by(|a, b| a.total_cmp(b));
                let med = xs[xs.len() / 2];
                let keep_int = v.is_u64() || v.is_i64();
                m.insert(
                    k.clone(),
                    if keep_int {
                        Value::from(med.round() as i64)
                    } else {
                        Value::from(med)
                    },
                );
            } else {
                m.insert(k.clone(), v.clone());
            }
        }
        out.push(m);
    }
    out
}

pub(super) fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => {
                if f.abs() >= 100.0 {
                    format!("{f:.0}")
                } else if f.abs() >= 1.0 {
                    format!("{f:.2}")
                } else {
                    format!("{f:.4}")
                }
            }
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// A markdown table whose columns are the union of the lines' keys in first-seen order.
pub fn json_table(lines: &[Line]) -> String {
    let mut cols: Vec<&str> = Vec::new();
    for l in lines {
        for k in l.keys() {
            if !cols.contains(&k.as_str()) {
                cols.push(k);
            }
        }
    }
    let mut s = format!("| {} |\n|{}\n", cols.join(" | "), "---|".repeat(cols.len()));
    for l in lines {
        let row: Vec<String> = cols
            .iter()
            .map(|c| l.get(*c).map(cell).unwrap_or_default().replace('|', "\\|"))
            .collect();
        let _ = writeln!(s, "| {} |", row.join(" | "));
    }
    s
}
