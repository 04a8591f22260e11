//! The tests the gray-failure detector makes (pure arithmetic): log-likelihood ratios, in
//! nats, of "this component adds at least a minimum effect" against "the fleet's baseline
//! explains it", each at the alternative's maximum-likelihood value (a generalized
//! likelihood ratio with a floor on the effect, so that noise on a small exposure can
//! never look like a fault smaller than the floor).

/// Counted events against a Poisson baseline: `k` events where the baseline expects
/// `mu0`, and a fault of size `x` (a drop probability per packet crossing) would add
/// `x * exposure`. Returns (LLR at the best `x >= min_effect`, that `x`). The LLR is
/// negative when the counts favour the baseline.
pub fn poisson_glr(k: f64, mu0: f64, exposure: f64, min_effect: f64) -> (f64, f64) {
    if exposure <= 0.0 {
        return (0.0, 0.0);
    }
    let mu0 = mu0.max(1e-12);
    let x = ((k - mu0) / exposure).max(min_effect);
    (poisson_llr(k, mu0, x * exposure), x)
}

/// LLR of `k` events under mean `mu0 + add` against mean `mu0`.
pub fn poisson_llr(k: f64, mu0: f64, add: f64) -> f64 {
    let mu0 = mu0.max(1e-12);
    if add <= 0.0 {
        return 0.0;
    }
    k * (1.0 + add / mu0).ln() - add
}

/// `k` of `n` trials hit where the baseline hits with probability `q0`; a fault raises
/// the share to at least `q0 + min_effect`. Returns (LLR at the best share, that share).
pub fn binomial_glr(k: f64, n: f64, q0: f64, min_effect: f64) -> (f64, f64) {
    if n <= 0.0 {
        return (0.0, 0.0);
    }
    let q0 = q0.clamp(1e-9, 1.0 - 1e-9);
    let q = (k / n).max(q0 + min_effect).min(1.0 - 1e-9);
    (binomial_llr(k, n, q0, q), q)
}

/// LLR of `k` hits of `n` under share `q1` against `q0`.
pub fn binomial_llr(k: f64, n: f64, q0: f64, q1: f64) -> f64 {
    let q0 = q0.clamp(1e-9, 1.0 - 1e-9);
    let q1 = q1.clamp(1e-9, 1.0 - 1e-9);
    let miss = (n - k).max(0.0);
    k * (q1 / q0).ln() + miss * ((1.0 - q1) / (1.0 - q0)).ln()
}

/// Standard error of a Poisson rate estimate: sqrt(k) / exposure.
pub fn poisson_stderr(k: f64, exposure: f64) -> f64 {
    if exposure <= 0.0 {
        0.0
    } else {
        k.max(1.0).sqrt() / exposure
    }
}

/// The probability that a finding is real given its evidence `score` (nats) against the
/// threshold it had to pass: a logistic of the margin, 0.5 at `threshold / 2`, so a
/// finding that just opened reads about 0.999 and one over twice its threshold 1.
pub fn confidence(score: f64, threshold: f64) -> f64 {
    let margin = score - threshold / 2.0;
    (1.0 / (1.0 + (-margin).exp())).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_glr_favours_the_baseline_on_baseline_counts() {
        // 2 events where 2 are expected: no evidence of a fault.
        let (llr, x) = poisson_glr(2.0, 2.0, 10_000.0, 0.002);
        assert!(llr < 0.0, "{llr}");
        assert_eq!(x, 0.002);
        // 30 events where 0.1 are expected over 3000 packets: a 1% fault, strongly.
        let (llr, x) = poisson_glr(30.0, 0.1, 3000.0, 0.002);
        assert!(llr > 100.0, "{llr}");
        assert!((x - 0.00997).abs() < 1e-4, "{x}");
        // No exposure: nothing to say.
        assert_eq!(poisson_glr(5.0, 0.1, 0.0, 0.002), (0.0, 0.0));
    }

    #[test]
    fn the_effect_floor_bounds_what_a_few_events_can_prove() {
        // 3 events on a big exposure: the MLE (0.01%) is below the floor; at the floor
        // the extra events expected (20) outweigh the three seen.
        let (llr, _) = poisson_glr(3.0, 0.05, 10_000.0, 0.002);
        assert!(llr < 0.0, "{llr}");
        // The same 3 events on a tiny exposure are a large (if uncertain) fault.
        let (llr, x) = poisson_glr(3.0, 0.05, 100.0, 0.002);
        assert!(llr > 5.0 && x > 0.02, "{llr} {x}");
    }

    #[test]
    fn binomial_glr_and_its_floor() {
        let (llr, q) = binomial_glr(100.0, 100.0, 0.003, 0.2);
        assert!(llr > 500.0 && q > 0.99, "{llr} {q}");
        let (llr, _) = binomial_glr(1.0, 300.0, 0.003, 0.2);
        assert!(llr < 0.0, "{llr}");
        assert!(binomial_llr(0.0, 10.0, 0.01, 0.5) < 0.0);
    }

    #[test]
    fn confidence_is_monotone_and_bounded() {
        let c: Vec<f64> = [0.0, 7.0, 14.0, 28.0, 1e6]
            .iter()
            .map(|&s| confidence(s, 14.0))
            .collect();
        assert!(c.windows(2).all(|w| w[0] <= w[1]), "{c:?}");
        assert!((c[1] - 0.5).abs() < 1e-9 && c[2] > 0.99 && c[4] <= 1.0);
    }
}
