//! ECMP flow-label coverage sizing, R-Pingmesh Eq.(1).
//!
//! With m equal-probability paths and per-probe miss probability q = (m-1)/m for a
//! given path, P(all covered after n labels) ~= (1 - q^n)^m >= p solves to
//! n = ceil(ln(1 - p^(1/m)) / ln((m-1)/m)).

/// Labels needed to cover `m` paths with probability `p`, before any cap.
/// `m <= 1` needs exactly one label; `p <= 0` needs one; `p >= 1` is unbounded (u32::MAX).
pub fn flow_labels_needed(m: u32, p: f64) -> u32 {
    if m <= 1 || p <= 0.0 || p.is_nan() {
        return 1;
    }
    if p >= 1.0 {
        return u32::MAX;
    }
    let m_f = m as f64;
    let num = (1.0 - p.powf(1.0 / m_f)).ln();
    let den = ((m_f - 1.0) / m_f).ln();
    let n = (num / den).ceil();
    if !n.is_finite() || n >= u32::MAX as f64 {
        u32::MAX
    } else {
        (n as u32).max(1)
    }
}

/// Eq.(1) capped by `max_labels` (at least 1).
pub fn flow_label_count(m: u32, p: f64, max_labels: u32) -> u32 {
    flow_labels_needed(m, p).min(max_labels).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_value_m16_p09() {
        assert_eq!(flow_labels_needed(16, 0.9), 78);
        assert_eq!(flow_label_count(16, 0.9, 64), 64);
        assert_eq!(flow_label_count(16, 0.9, 100), 78);
    }

    #[test]
    fn single_path_needs_one_label() {
        assert_eq!(flow_labels_needed(1, 0.9), 1);
        assert_eq!(flow_labels_needed(0, 0.9), 1);
        assert_eq!(flow_label_count(1, 0.99, 64), 1);
    }

    #[test]
    fn result_satisfies_the_bound_and_is_minimal() {
        for m in [2u32, 4, 8, 16, 32, 64] {
            for p in [0.5, 0.9, 0.99] {
                let n = flow_labels_needed(m, p);
                let q = (m as f64 - 1.0) / m as f64;
                let cover = |n: u32| (1.0 - q.powi(n as i32)).powi(m as i32);
                assert!(cover(n) >= p - 1e-12, "m={m} p={p} n={n}");
                assert!(cover(n - 1) < p, "m={m} p={p} n={n} not minimal");
            }
        }
    }

    #[test]
    fn monotone_in_p_and_m() {
        assert!(flow_labels_needed(16, 0.99) > flow_labels_needed(16, 0.9));
        assert!(flow_labels_needed(32, 0.9) > flow_labels_needed(16, 0.9));
        assert_eq!(flow_labels_needed(16, 1.0), u32::MAX);
    }
}
