//! The fabric's background: what a fault-free fabric does to packets. A scenario's
//! optional `background:` mapping; without it, the quiet defaults the shipped scenarios
//! were written against (1e-6 loss per link traversal, no queueing).
//!
//! ```yaml
//! background:
//!   loss_per_link: 1e-5     # per link traversal (host-ToR, ToR-spine, ...)
//!   loss_spread: 3          # each directed ToR-spine link: rate x a factor, log-uniform in [1/3, 3]
//!   queue_probability: 2e-3 # per link traversal: a queueing delay ...
//!   queue_mean_us: 3        # ... exponential with this mean
//! ```

use serde::Deserialize;
use serde_json::Value;

use crate::scenario::ScenarioError;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Background {
    /// Loss probability of one packet on one link traversal.
    pub loss_per_link: f64,
    /// At least 1: each directed ToR-spine link's loss is `loss_per_link` times a factor drawn
    /// log-uniformly in [1/spread, spread] (seeded): some links are dirtier than others.
    pub loss_spread: f64,
    /// Per link traversal: probability of a queueing delay.
    pub queue_probability: f64,
    /// Mean of that delay (exponential), in microseconds.
    pub queue_mean_us: f64,
}

impl Default for Background {
    fn default() -> Self {
        Background {
            loss_per_link: 1e-6,
            loss_spread: 1.0,
            queue_probability: 0.0,
            queue_mean_us: 0.0,
        }
    }
}

impl Background {
    /// The background the gray-failure suites and the fault-free day run on: a small
    /// random loss everywhere (1e-5 per traversal, links differing up to 3x either way)
    /// and queueing jitter (0.2% of traversals wait an exponential 3 us more).
    pub fn realistic() -> Self {
        Background {
            loss_per_link: 1e-5,
            loss_spread: 3.0,
            queue_probability: 2e-3,
            queue_mean_us: 3.0,
        }
    }

    pub fn validate(&self) -> Result<(), ScenarioError> {
        let bad = |name: &str, why: &str, v: f64| {
            Err(ScenarioError::new(format!(
                "background.{name} must be {why}, got {v}"
            )))
        };
        if !(self.loss_per_link.is_finite() && (0.0..1.0).contains(&self.loss_per_link)) {
            return bad("loss_per_link", "in [0, 1)", self.loss_per_link);
        }
        if !(self.loss_spread.is_finite() && self.loss_spread >= 1.0) {
            return bad("loss_spread", "a number >= 1", self.loss_spread);
        }
        if !(self.queue_probability.is_finite() && (0.0..1.0).contains(&self.queue_probability)) {
            return bad("queue_probability", "in [0, 1)", self.queue_probability);
        }
        if !(self.queue_mean_us.is_finite() && self.queue_mean_us >= 0.0) {
            return bad("queue_mean_us", "a number >= 0", self.queue_mean_us);
        }
        if self.queue_probability > 0.0 && self.queue_mean_us == 0.0 {
            return bad(
                "queue_mean_us",
                "> 0 when queue_probability is set",
                self.queue_mean_us,
            );
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackground {
    loss_per_link: Option<f64>,
    loss_spread: Option<f64>,
    queue_probability: Option<f64>,
    queue_mean_us: Option<f64>,
}

/// The `background:` mapping (every key optional, the defaults fill in).
pub fn parse(v: &Value) -> Result<Background, ScenarioError> {
    if !v.is_object() {
        return Err(ScenarioError::new(format!(
            "background must be a mapping, got {v}"
        )));
    }
    let raw: RawBackground = serde_json::from_value(v.clone()).map_err(|e| {
        let s = e.to_string();
        ScenarioError::new(format!("background: {}", s.lines().next().unwrap_or("")))
    })?;
    let d = Background::default();
    let b = Background {
        loss_per_link: raw.loss_per_link.unwrap_or(d.loss_per_link),
        loss_spread: raw.loss_spread.unwrap_or(d.loss_spread),
        queue_probability: raw.queue_probability.unwrap_or(d.queue_probability),
        queue_mean_us: raw.queue_mean_us.unwrap_or(d.queue_mean_us),
    };
    b.validate()?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_fill_in_and_bad_values_are_named() {
        let b = parse(&json!({"loss_per_link": 1e-5})).unwrap();
        assert_eq!(b.loss_per_link, 1e-5);
        assert_eq!(b.loss_spread, 1.0);
        assert!(Background::realistic().validate().is_ok());
        let e = parse(&json!({"loss_spread": 0.5})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "background.loss_spread must be a number >= 1, got 0.5"
        );
        let e = parse(&json!({"queue_probability": 0.01})).unwrap_err();
        assert!(e.to_string().contains("queue_mean_us"), "{e}");
        let e = parse(&json!({"jitter": 1})).unwrap_err();
        assert!(
            e.to_string().starts_with("background: unknown field"),
            "{e}"
        );
        assert!(parse(&json!(3)).is_err());
    }
}
