//! The simulator's random numbers: SplitMix64 (one u64 of state, a few ns per draw,
//! passes BigCrush), so a run depends only on its seed and not on any crate's version.

#[derive(Debug, Clone)]
pub struct Rng(u64);

/// SplitMix64's finalizer: a bijective mixer, used to derive independent seeds.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed for stream `stream` of `seed` (streams are independent).
pub fn derive(seed: u64, stream: u64) -> u64 {
    mix(seed ^ mix(stream.wrapping_add(0x5349_4D55_4C41_5445))) // "SIMULATE"
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in [0, 1).
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, n) (n > 0; the bias is below 2^-40 for the n used here).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Exponential with mean `mean`.
    #[inline]
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// True with probability `p` given as a threshold from [`threshold`].
    #[inline]
    pub fn hit(&mut self, threshold: u64) -> bool {
        self.next_u64() < threshold
    }
}

/// The u64 threshold of probability `p` for [`Rng::hit`].
pub fn threshold(p: f64) -> u64 {
    if p <= 0.0 {
        0
    } else if p >= 1.0 {
        u64::MAX
    } else {
        (p * 18_446_744_073_709_551_616.0) as u64
    }
}

/// Uniform in [lo, hi): the suites' draws of fault times and magnitudes.
pub fn uniform(rng: &mut Rng, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * rng.unit()
}

/// In [0, n) by remainder (n = 0 counts as 1): the suites' draws of places, kept as they
/// were so that a suite seed still names the same scenarios.
pub fn below(rng: &mut Rng, n: u32) -> u32 {
    (rng.next_u64() % n.max(1) as u64) as u32
}

/// The ToR and start of the `j`th of a suite scenario's simultaneous faults: ToRs
/// `tors / apart` apart counted from `first_tor` (distinct, so the faults' ground truths
/// never nest); the first starts at `start`, each other one within `jitter` s of it,
/// rounded (the only draw, so the first fault draws nothing).
pub fn spread_fault(
    rng: &mut Rng,
    tors: u32,
    first_tor: u32,
    j: usize,
    apart: u32,
    start: f64,
    jitter: f64,
) -> (u32, f64) {
    let tor = 1 + (first_tor - 1 + j as u32 * (tors / apart)) % tors;
    let s = if j == 0 {
        start
    } else {
        (start + uniform(rng, -jitter, jitter)).round()
    };
    (tor, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_roughly_uniform() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut r = Rng::new(1);
        let n = 100_000;
        let mean = (0..n).map(|_| r.unit()).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01);
        let e = (0..n).map(|_| r.exp(3.0)).sum::<f64>() / n as f64;
        assert!((e - 3.0).abs() < 0.1, "{e}");
        let hits = (0..n).filter(|_| r.hit(threshold(0.25))).count();
        assert!((hits as f64 / n as f64 - 0.25).abs() < 0.01);
        assert!((0..1000).all(|_| r.below(7) < 7));
        assert_ne!(derive(1, 0), derive(1, 1));
        assert_ne!(derive(1, 0), derive(2, 0));
    }
}
