//! Scenario files: the fabric's shape, the seed, the duration and the faults on their
//! schedule. Parsed with serde-saphyr (unknown keys are refused everywhere) and then
//! checked field by field, so a bad file gets one line naming the field, and for a
//! fault its index and kind:
//!
//! ```text
//! faults[3] (link_loss): loss must be in (0, 1], got 1.5
//! ```
//!
//! A [`Scenario`] can also be built in code (randomized suites); [`Scenario::validate`]
//! applies the same checks.

use std::fmt;

use serde::Deserialize;
use serde_json::Value;

use crate::fabric::{parse_location, Fabric, FabricSpec, Location};

pub mod background;

use background::Background;

/// Bounds beyond the obvious ones (the GID and name schemes, and sanity).
pub const MAX_TORS: u32 = 4096;
pub const MAX_SPINES: u32 = 256;
pub const MAX_HOSTS_PER_TOR: u32 = 1024;
pub const MAX_RNICS_PER_HOST: u32 = 8;

/// A scenario: what to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub seed: u64,
    pub duration_sec: u64,
    pub fabric: FabricSpec,
    pub faults: Vec<Fault>,
    /// What the fault-free fabric does to packets (loss, queueing).
    pub background: Background,
}

impl Scenario {
    /// The fabric this scenario runs on (its ECMP hash seeded from the scenario's seed).
    pub fn build_fabric(&self) -> Fabric {
        Fabric::new(&self.fabric, (self.seed ^ (self.seed >> 32)) as u32)
    }
}

/// Which way across a ToR-spine link a link fault acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// ToR to spine.
    Up,
    /// Spine to ToR.
    Down,
    Both,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Up => "up",
            Direction::Down => "down",
            Direction::Both => "both",
        }
    }
    pub fn covers_up(self) -> bool {
        matches!(self, Direction::Up | Direction::Both)
    }
    pub fn covers_down(self) -> bool {
        matches!(self, Direction::Down | Direction::Both)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FaultKind {
    /// Every packet to or from the RNIC is dropped.
    RnicDown,
    /// Down for the first `down_fraction` of every `period_sec` (seeded phase).
    RnicFlap { period_sec: f64, down_fraction: f64 },
    /// Every packet to or from the RNIC is dropped with `loss` (a degraded RNIC: a dirty
    /// cable or optic, a port error burst).
    RnicLoss { loss: f64 },
    /// The host's packet processing stalls: extra delay ~ Exp(mean `delay_us`) per
    /// packet it handles, and 2% of them late beyond the probe timeout.
    HostStall { delay_us: f64 },
    /// Every packet through the ToR is dropped.
    TorDown,
    /// Packets crossing the ToR-spine link in `direction` are dropped with `loss`.
    LinkLoss { loss: f64, direction: Direction },
    /// Every packet crossing the link (both directions) is dropped.
    LinkDown,
    /// Packets crossing the link in `direction` take `add_us` longer.
    LinkLatency { add_us: f64, direction: Direction },
}

/// The kinds, as scenario files name them.
pub const FAULT_KINDS: [&str; 8] = [
    "rnic_down",
    "rnic_flap",
    "rnic_loss",
    "host_stall",
    "tor_down",
    "link_loss",
    "link_down",
    "link_latency",
];

impl FaultKind {
    pub fn name(&self) -> &'static str {
        match self {
            FaultKind::RnicDown => "rnic_down",
            FaultKind::RnicFlap { .. } => "rnic_flap",
            FaultKind::RnicLoss { .. } => "rnic_loss",
            FaultKind::HostStall { .. } => "host_stall",
            FaultKind::TorDown => "tor_down",
            FaultKind::LinkLoss { .. } => "link_loss",
            FaultKind::LinkDown => "link_down",
            FaultKind::LinkLatency { .. } => "link_latency",
        }
    }

    /// The finding kind the controller should report for this fault.
    pub fn finding_kind(&self) -> &'static str {
        match self {
            FaultKind::RnicDown | FaultKind::RnicFlap { .. } | FaultKind::RnicLoss { .. } => "rnic",
            FaultKind::HostStall { .. } => "host",
            FaultKind::TorDown => "tor",
            FaultKind::LinkLoss { .. } | FaultKind::LinkDown | FaultKind::LinkLatency { .. } => {
                "link"
            }
        }
    }

    /// The form `location` must have.
    fn location_form(&self) -> (&'static str, &'static str) {
        match self.finding_kind() {
            "rnic" => ("an RNIC", "h<t>-<i>/r<j>, e.g. h1-1/r0"),
            "host" => ("a host", "h<t>-<i>, e.g. h1-1"),
            "tor" => ("a ToR", "tor<t>, e.g. tor1"),
            _ => ("a ToR-spine link", "tor<t>-spine<s>, e.g. tor1-spine1"),
        }
    }

    /// Per-kind fields (besides kind, location, start_sec, end_sec).
    fn fields(name: &str) -> &'static [&'static str] {
        match name {
            "rnic_flap" => &["period_sec", "down_fraction"],
            "host_stall" => &["delay_us"],
            "link_loss" => &["loss", "direction"],
            "rnic_loss" => &["loss"],
            "link_latency" => &["add_us", "direction"],
            _ => &[],
        }
    }
}

/// One fault on its schedule [start_sec, end_sec).
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub kind: FaultKind,
    pub location: String,
    pub start_sec: f64,
    pub end_sec: f64,
}

impl Fault {
    /// `kind` at `location` from `start_sec` on, for `len_sec`.
    pub fn lasting(kind: FaultKind, location: String, start_sec: f64, len_sec: f64) -> Self {
        Fault {
            kind,
            location,
            start_sec,
            end_sec: start_sec + len_sec,
        }
    }
}

/// What the controller is expected to report for a fault.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroundTruth {
    /// "rnic" | "host" | "tor" | "link"
    pub kind: &'static str,
    /// rnic `h<t>-<i>/r<j>`, host `h<t>-<i>`, tor `tor<t>`, link `tor<t>-spine<s>`.
    pub location: String,
}

/// The finding a fault should produce: rnic_down/rnic_flap -> "rnic" at the RNIC,
/// host_stall -> "host" at the host, tor_down -> "tor" at the ToR, link_* -> "link" at
/// `tor<t>-spine<s>`.
pub fn ground_truth(f: &Fault) -> GroundTruth {
    GroundTruth {
        kind: f.kind.finding_kind(),
        location: f.location.clone(),
    }
}

/// A scenario that cannot run: one line naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError(String);

impl ScenarioError {
    pub fn new(msg: impl Into<String>) -> Self {
        ScenarioError(msg.into())
    }
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScenarioError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ScenarioError> {
    Err(ScenarioError::new(msg))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    seed: Option<Value>,
    duration_sec: Option<Value>,
    fabric: Option<Value>,
    faults: Option<Value>,
    background: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFabric {
    tors: Option<Value>,
    spines: Option<Value>,
    hosts_per_tor: Option<Value>,
    rnics_per_host: Option<Value>,
    rail_optimized: Option<Value>,
    link_latency_us: Option<Value>,
    link_jitter_us: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    /// Read from the map before this struct (to name the kind in every message).
    #[serde(rename = "kind")]
    _kind: Option<Value>,
    location: Option<Value>,
    start_sec: Option<Value>,
    end_sec: Option<Value>,
    period_sec: Option<Value>,
    down_fraction: Option<Value>,
    delay_us: Option<Value>,
    loss: Option<Value>,
    add_us: Option<Value>,
    direction: Option<Value>,
}

/// First line of a parser error, without its "error: " prefix.
fn one_line(e: impl fmt::Display) -> String {
    let s = e.to_string();
    let line = s.lines().next().unwrap_or("").trim();
    line.strip_prefix("error: ").unwrap_or(line).to_string()
}

fn shown(v: &Value) -> String {
    match v {
        Value::Null => "null (or NaN/infinity)".to_string(),
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn required<'a>(v: &'a Option<Value>, what: &str) -> Result<&'a Value, ScenarioError> {
    v.as_ref()
        .ok_or_else(|| ScenarioError::new(format!("{what} is missing")))
}

fn whole(v: &Value, what: &str) -> Result<u64, ScenarioError> {
    v.as_u64().ok_or_else(|| {
        ScenarioError::new(format!(
            "{what} must be a whole number >= 0, got {}",
            shown(v)
        ))
    })
}

fn whole_u32(v: &Value, what: &str) -> Result<u32, ScenarioError> {
    let n = whole(v, what)?;
    u32::try_from(n).or_else(|_| err(format!("{what} is too large: {n}")))
}

fn number(v: &Value, what: &str) -> Result<f64, ScenarioError> {
    match v.as_f64() {
        Some(x) if x.is_finite() => Ok(x),
        _ => err(format!("{what} must be a number, got {}", shown(v))),
    }
}

fn text<'a>(v: &'a Value, what: &str) -> Result<&'a str, ScenarioError> {
    v.as_str()
        .ok_or_else(|| ScenarioError::new(format!("{what} must be a string, got {}", shown(v))))
}

impl Scenario {
    /// Parses and checks a scenario file.
    pub fn from_yaml(text_in: &str) -> Result<Scenario, ScenarioError> {
        if text_in.lines().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with('#')
        }) {
            return err("scenario: the file is empty");
        }
        // `.nan` / `.inf` come through as text, so the field check names them.
        let opts = serde_saphyr::options! {
            non_finite_float_policy: serde_saphyr::NonFiniteFloatPolicy::AsString,
        };
        let raw: RawScenario = serde_saphyr::from_str_with_options(text_in, opts)
            .map_err(|e| ScenarioError::new(format!("scenario: {}", one_line(e))))?;
        let seed = whole(required(&raw.seed, "seed")?, "seed")?;
        let duration_sec = whole(required(&raw.duration_sec, "duration_sec")?, "duration_sec")?;
        let fabric = parse_fabric(required(&raw.fabric, "fabric")?)?;
        let faults = match raw.faults {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| parse_fault(i, v))
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return err(format!(
                    "faults must be a list of faults, got {}",
                    shown(&other)
                ))
            }
        };
        let background = match &raw.background {
            None | Some(Value::Null) => Background::default(),
            Some(v) => background::parse(v)?,
        };
        let s = Scenario {
            seed,
            duration_sec,
            fabric,
            faults,
            background,
        };
        s.validate()?;
        Ok(s)
    }

    /// The checks `from_yaml` applies after parsing, for scenarios built in code.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        if self.duration_sec == 0 {
            return err("duration_sec must be > 0");
        }
        self.fabric.validate()?;
        self.background.validate()?;
        for (i, f) in self.faults.iter().enumerate() {
            self.validate_fault(i, f)?;
        }
        Ok(())
    }

    fn validate_fault(&self, i: usize, f: &Fault) -> Result<(), ScenarioError> {
        let at = format!("faults[{i}] ({})", f.kind.name());
        let dur = self.duration_sec as f64;
        if !f.start_sec.is_finite() || f.start_sec < 0.0 {
            return err(format!(
                "{at}: start_sec must be a number >= 0, got {}",
                f.start_sec
            ));
        }
        if !f.end_sec.is_finite() {
            return err(format!("{at}: end_sec must be a number, got {}", f.end_sec));
        }
        if f.end_sec <= f.start_sec {
            return err(format!(
                "{at}: end_sec ({}) must be after start_sec ({})",
                f.end_sec, f.start_sec
            ));
        }
        if f.start_sec >= dur {
            return err(format!(
                "{at}: start_sec ({}) is beyond duration_sec ({})",
                f.start_sec, self.duration_sec
            ));
        }
        if f.end_sec > dur {
            return err(format!(
                "{at}: end_sec ({}) is beyond duration_sec ({})",
                f.end_sec, self.duration_sec
            ));
        }
        let open = |lo: f64, x: f64, hi: f64| x > lo && x < hi;
        match f.kind {
            FaultKind::RnicFlap {
                period_sec,
                down_fraction,
            } => {
                if !(period_sec.is_finite() && period_sec > 0.0) {
                    return err(format!("{at}: period_sec must be > 0, got {period_sec}"));
                }
                if !open(0.0, down_fraction, 1.0) {
                    return err(format!(
                        "{at}: down_fraction must be in (0, 1), got {down_fraction}"
                    ));
                }
            }
            FaultKind::HostStall { delay_us } => {
                if !(delay_us.is_finite() && delay_us > 0.0) {
                    return err(format!("{at}: delay_us must be > 0, got {delay_us}"));
                }
            }
            FaultKind::LinkLoss { loss, .. } | FaultKind::RnicLoss { loss } => {
                if !(loss > 0.0 && loss <= 1.0) {
                    return err(format!("{at}: loss must be in (0, 1], got {loss}"));
                }
            }
            FaultKind::LinkLatency { add_us, .. } => {
                if !(add_us.is_finite() && add_us > 0.0) {
                    return err(format!("{at}: add_us must be > 0, got {add_us}"));
                }
            }
            FaultKind::RnicDown | FaultKind::TorDown | FaultKind::LinkDown => {}
        }
        self.check_location(&at, f)
    }

    fn check_location(&self, at: &str, f: &Fault) -> Result<(), ScenarioError> {
        let (what, form) = f.kind.location_form();
        let loc = &f.location;
        let Some(parsed) = parse_location(loc) else {
            return err(format!(
                "{at}: location `{loc}` is not {what}: expected {form}"
            ));
        };
        let fab = &self.fabric;
        let kind_ok = matches!(
            (f.kind.finding_kind(), &parsed),
            ("rnic", Location::Rnic { .. })
                | ("host", Location::Host { .. })
                | ("tor", Location::Tor { .. })
                | ("link", Location::Link { .. })
        );
        if !kind_ok {
            return err(format!(
                "{at}: location `{loc}` is {}, not {what}: expected {form}",
                parsed.describe()
            ));
        }
        if let Err(why) = fab.locate(&parsed) {
            return err(format!(
                "{at}: location `{loc}` is not in the fabric: {why}"
            ));
        }
        Ok(())
    }
}

/// A fabric's checks against the scenario format's bounds (the struct is `crate::fabric`'s).
impl FabricSpec {
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let range = |name: &str, v: u32, max: u32| -> Result<(), ScenarioError> {
            if v == 0 {
                return err(format!("fabric.{name} must be > 0"));
            }
            if v > max {
                return err(format!("fabric.{name} must be at most {max}, got {v}"));
            }
            Ok(())
        };
        range("tors", self.tors, MAX_TORS)?;
        range("spines", self.spines, MAX_SPINES)?;
        range("hosts_per_tor", self.hosts_per_tor, MAX_HOSTS_PER_TOR)?;
        if !(1..=MAX_RNICS_PER_HOST).contains(&self.rnics_per_host) {
            return err(format!(
                "fabric.rnics_per_host must be in 1..={MAX_RNICS_PER_HOST}, got {}",
                self.rnics_per_host
            ));
        }
        for (name, v) in [
            ("link_latency_us", self.link_latency_us),
            ("link_jitter_us", self.link_jitter_us),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return err(format!(
                    "fabric.{name} must be a finite number >= 0, got {v}"
                ));
            }
        }
        if self.rail_optimized && !self.tors.is_multiple_of(self.rnics_per_host) {
            return err(format!(
                "fabric.rail_optimized: tors ({}) must be a multiple of rnics_per_host ({})",
                self.tors, self.rnics_per_host
            ));
        }
        Ok(())
    }

    /// Ok when the parsed location exists in this fabric; else why not.
    pub(crate) fn locate(&self, l: &Location) -> Result<(), String> {
        let groups = self.host_groups();
        let host = |g: u32, i: u32| -> Result<(), String> {
            if g == 0 || g > groups || i == 0 || i > self.hosts_per_tor {
                return Err(format!("hosts are h1-1..h{groups}-{}", self.hosts_per_tor));
            }
            Ok(())
        };
        match *l {
            Location::Tor { t } => {
                if t == 0 || t > self.tors {
                    return Err(format!("ToRs are tor1..tor{}", self.tors));
                }
            }
            Location::Link { t, s } => {
                if t == 0 || t > self.tors {
                    return Err(format!("ToRs are tor1..tor{}", self.tors));
                }
                if s == 0 || s > self.spines {
                    return Err(format!("spines are spine1..spine{}", self.spines));
                }
            }
            Location::Host { g, i } => host(g, i)?,
            Location::Rnic { g, i, j } => {
                host(g, i)?;
                if j >= self.rnics_per_host {
                    return Err(format!("devices are r0..r{}", self.rnics_per_host - 1));
                }
            }
        }
        Ok(())
    }
}

fn parse_fabric(v: &Value) -> Result<FabricSpec, ScenarioError> {
    if !v.is_object() {
        return err(format!("fabric must be a mapping, got {}", shown(v)));
    }
    let raw: RawFabric = serde_json::from_value(v.clone())
        .map_err(|e| ScenarioError::new(format!("fabric: {}", one_line(e))))?;
    let u = |v: &Option<Value>, name: &str| -> Result<u32, ScenarioError> {
        let what = format!("fabric.{name}");
        whole_u32(required(v, &what)?, &what)
    };
    let f = |v: &Option<Value>, name: &str| -> Result<f64, ScenarioError> {
        let what = format!("fabric.{name}");
        let x = required(v, &what)?;
        match x.as_f64() {
            Some(n) if n.is_finite() && n >= 0.0 => Ok(n),
            _ => err(format!(
                "{what} must be a finite number >= 0, got {}",
                shown(x)
            )),
        }
    };
    let rail_optimized = match &raw.rail_optimized {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return err(format!(
                "fabric.rail_optimized must be true or false, got {}",
                shown(other)
            ))
        }
    };
    Ok(FabricSpec {
        tors: u(&raw.tors, "tors")?,
        spines: u(&raw.spines, "spines")?,
        hosts_per_tor: u(&raw.hosts_per_tor, "hosts_per_tor")?,
        rnics_per_host: u(&raw.rnics_per_host, "rnics_per_host")?,
        rail_optimized,
        link_latency_us: f(&raw.link_latency_us, "link_latency_us")?,
        link_jitter_us: f(&raw.link_jitter_us, "link_jitter_us")?,
    })
}

fn parse_fault(i: usize, v: Value) -> Result<Fault, ScenarioError> {
    let Value::Object(map) = &v else {
        return err(format!("faults[{i}] must be a mapping, got {}", shown(&v)));
    };
    // The kind first, so every later message can name it.
    let kind = match map.get("kind") {
        None => return err(format!("faults[{i}]: kind is missing")),
        Some(Value::String(k)) if FAULT_KINDS.contains(&k.as_str()) => k.clone(),
        Some(Value::String(k)) => {
            return err(format!(
                "faults[{i}]: unknown kind `{k}` (known: {})",
                FAULT_KINDS.join(", ")
            ))
        }
        Some(other) => {
            return err(format!(
                "faults[{i}]: kind must be a string, got {}",
                shown(other)
            ))
        }
    };
    let at = format!("faults[{i}] ({kind})");
    let raw: RawFault = serde_json::from_value(v.clone())
        .map_err(|e| ScenarioError::new(format!("{at}: {}", one_line(e))))?;
    // Fields of other kinds.
    let own = FaultKind::fields(&kind);
    for key in map.keys() {
        let common = matches!(key.as_str(), "kind" | "location" | "start_sec" | "end_sec");
        if !common && !own.contains(&key.as_str()) {
            let allowed: Vec<&str> = ["location", "start_sec", "end_sec"]
                .into_iter()
                .chain(own.iter().copied())
                .collect();
            return err(format!(
                "{at}: field `{key}` does not belong to {kind} (its fields: {})",
                allowed.join(", ")
            ));
        }
    }
    let field = |name: &str| format!("{at}: {name}");
    let location = text(
        required(&raw.location, &field("location"))?,
        &field("location"),
    )?;
    let start_sec = number(
        required(&raw.start_sec, &field("start_sec"))?,
        &field("start_sec"),
    )?;
    let end_sec = number(
        required(&raw.end_sec, &field("end_sec"))?,
        &field("end_sec"),
    )?;
    let num = |v: &Option<Value>, name: &str| -> Result<f64, ScenarioError> {
        number(required(v, &field(name))?, &field(name))
    };
    let direction = || -> Result<Direction, ScenarioError> {
        match &raw.direction {
            None => Ok(Direction::Both),
            Some(Value::String(s)) if s == "up" => Ok(Direction::Up),
            Some(Value::String(s)) if s == "down" => Ok(Direction::Down),
            Some(Value::String(s)) if s == "both" => Ok(Direction::Both),
            Some(other) => err(format!(
                "{at}: direction must be up, down or both, got {}",
                shown(other)
            )),
        }
    };
    let fk = match kind.as_str() {
        "rnic_down" => FaultKind::RnicDown,
        "rnic_flap" => FaultKind::RnicFlap {
            period_sec: num(&raw.period_sec, "period_sec")?,
            down_fraction: num(&raw.down_fraction, "down_fraction")?,
        },
        "rnic_loss" => FaultKind::RnicLoss {
            loss: num(&raw.loss, "loss")?,
        },
        "host_stall" => FaultKind::HostStall {
            delay_us: num(&raw.delay_us, "delay_us")?,
        },
        "tor_down" => FaultKind::TorDown,
        "link_loss" => FaultKind::LinkLoss {
            loss: num(&raw.loss, "loss")?,
            direction: direction()?,
        },
        "link_down" => FaultKind::LinkDown,
        "link_latency" => FaultKind::LinkLatency {
            add_us: num(&raw.add_us, "add_us")?,
            direction: direction()?,
        },
        _ => unreachable!("kind checked above"),
    };
    Ok(Fault {
        kind: fk,
        location: location.to_string(),
        start_sec,
        end_sec,
    })
}

#[cfg(test)]
mod tests;
