//! NIC completion timestamps (free-running HCA clock ticks) to nanoseconds.
//!
//! The HCA clock runs at `hca_core_clock` kHz and its counter is `completion_timestamp_mask`
//! wide. A conversion is `anchor_ns + (ticks - anchor_ticks) * 1e6 / khz`, with the tick
//! difference taken modulo the counter width and read as signed (a completion may be
//! converted just after a newer anchor was taken), so a counter wrap is invisible.
//!
//! Re-anchoring keeps the result continuous: the new anchor's ns is the old conversion of
//! the new anchor's ticks, so T2..T5 (all from one device) stay in one clock domain, "NIC
//! time in ns", whose origin is CLOCK_MONOTONIC at open. Only differences of these are
//! used (T5 - T2, T4 - T3), so the NIC's drift against the host clock does not matter;
//! re-anchoring only keeps the tick difference small so a narrow counter never wraps
//! twice between anchors and the multiplication cannot overflow.

/// Conversion state for one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NicClock {
    khz: u64,
    mask: u64,
    anchor_ticks: u64,
    anchor_ns: u64,
}

impl NicClock {
    /// `khz`: `hca_core_clock`; `mask`: `completion_timestamp_mask` (0 = full 64 bits);
    /// the anchor pairs a tick reading with the CLOCK_MONOTONIC ns taken at the same time.
    /// None when the device reports no clock frequency.
    pub fn new(khz: u64, mask: u64, anchor_ticks: u64, anchor_ns: u64) -> Option<NicClock> {
        if khz == 0 {
            return None;
        }
        let mask = if mask == 0 { u64::MAX } else { mask };
        Some(NicClock {
            khz,
            mask,
            anchor_ticks: anchor_ticks & mask,
            anchor_ns,
        })
    }

    pub fn khz(&self) -> u64 {
        self.khz
    }

    pub fn anchor(&self) -> (u64, u64) {
        (self.anchor_ticks, self.anchor_ns)
    }

    /// Signed tick distance from the anchor, modulo the counter width.
    fn delta(&self, ticks: u64) -> i128 {
        let d = (ticks & self.mask).wrapping_sub(self.anchor_ticks) & self.mask;
        // Upper half of the counter range = before the anchor.
        if d > self.mask / 2 {
            d as i128 - self.mask as i128 - 1
        } else {
            d as i128
        }
    }

    /// Nanoseconds of a raw completion timestamp (saturating at 0 / u64::MAX).
    pub fn to_ns(&self, ticks: u64) -> u64 {
        let dns = self.delta(ticks) * 1_000_000 / self.khz as i128;
        (self.anchor_ns as i128 + dns).clamp(0, u64::MAX as i128) as u64
    }

    /// Moves the anchor to `ticks` (a fresh clock reading) without a step in the output.
    pub fn reanchor(&mut self, ticks: u64) {
        let ns = self.to_ns(ticks);
        self.anchor_ticks = ticks & self.mask;
        self.anchor_ns = ns;
    }

    /// Converts a completion timestamp and, when it lies more than a re-anchor interval
    /// past the anchor, moves the anchor to it (continuously). Used per completion, so a
    /// busy device never lets the tick distance grow towards the wrap.
    pub fn convert_tracking(&mut self, ticks: u64) -> u64 {
        let ns = self.to_ns(ticks);
        if self.delta(ticks) > self.reanchor_interval_ticks() as i128 {
            self.anchor_ticks = ticks & self.mask;
            self.anchor_ns = ns;
        }
        ns
    }

    /// Ticks after which a re-anchor is due: a quarter of the counter range, so the
    /// signed reading above never becomes ambiguous.
    pub fn reanchor_interval_ticks(&self) -> u64 {
        (self.mask / 4).max(1)
    }

    /// The same, in nanoseconds (capped at one hour: cheap, and bounds rounding drift).
    pub fn reanchor_interval_ns(&self) -> u64 {
        let ns = (self.reanchor_interval_ticks() as u128 * 1_000_000 / self.khz as u128)
            .min(3_600_000_000_000);
        (ns as u64).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_at_the_clock_rate() {
        // ConnectX-5: 156.25 MHz = 156250 kHz, 6.4 ns per tick.
        let c = NicClock::new(156_250, 0, 1_000, 5_000_000_000).unwrap();
        assert_eq!(c.to_ns(1_000), 5_000_000_000);
        assert_eq!(c.to_ns(1_000 + 156_250), 5_001_000_000);
        assert_eq!(c.to_ns(1_000 + 5), 5_000_000_032); // 32 ns (6.4 * 5)
                                                       // Before the anchor.
        assert_eq!(c.to_ns(0), 5_000_000_000 - 6_400);
        // 1 GHz: one tick per ns.
        let g = NicClock::new(1_000_000, 0, 0, 0).unwrap();
        assert_eq!(g.to_ns(123_456_789), 123_456_789);
    }

    #[test]
    fn no_frequency_means_no_hw_clock() {
        assert!(NicClock::new(0, 0, 0, 0).is_none());
    }

    #[test]
    fn wraps_a_narrow_counter() {
        // 32-bit counter at 1 GHz, anchored just before the wrap.
        let mask = u32::MAX as u64;
        let c = NicClock::new(1_000_000, mask, mask - 99, 1_000_000).unwrap();
        assert_eq!(c.to_ns(mask), 1_000_099);
        assert_eq!(c.to_ns(0), 1_000_100);
        assert_eq!(c.to_ns(400), 1_000_500);
        // Bits above the mask are ignored.
        assert_eq!(c.to_ns((1 << 32) | 400), 1_000_500);
        // Slightly before the anchor.
        assert_eq!(c.to_ns(mask - 199), 999_900);
    }

    #[test]
    fn wraps_a_full_64_bit_counter() {
        let c = NicClock::new(1_000_000, 0, u64::MAX - 9, 50).unwrap();
        assert_eq!(c.to_ns(5), 65);
        assert_eq!(c.to_ns(u64::MAX - 19), 40);
    }

    #[test]
    fn reanchor_is_continuous_and_keeps_differences() {
        let mask = (1u64 << 40) - 1;
        let mut c = NicClock::new(156_250, mask, 7, 1_000_000_000).unwrap();
        let t2 = mask - 1_000; // prober send before the wrap
        let t5 = 5_000u64; // receive after the wrap
        let before = c.to_ns(t5) as i128 - c.to_ns(t2) as i128;
        c.reanchor(mask - 500);
        let after = c.to_ns(t5) as i128 - c.to_ns(t2) as i128;
        assert_eq!(before, after);
        assert_eq!(after, 6_001 * 6_400 / 1_000);
        // Walking the anchor forward over many intervals never steps the output.
        let mut prev = c.to_ns(0);
        let step = c.reanchor_interval_ticks();
        let mut t = 0u64;
        for _ in 0..20 {
            t = t.wrapping_add(step) & mask;
            let ns_old = c.to_ns(t);
            c.reanchor(t);
            assert_eq!(c.to_ns(t), ns_old);
            assert!(ns_old > prev);
            prev = ns_old;
        }
    }

    #[test]
    fn tracking_follows_a_wrapping_counter_forever() {
        // 16-bit counter at 1 MHz (1 tick = 1000 ns): wraps every 65.5 ms.
        let mask = 0xFFFF;
        let mut c = NicClock::new(1_000, mask, 0, 0).unwrap();
        let mut true_ticks: u64 = 0;
        for _ in 0..10_000 {
            true_ticks += 7_919; // < a quarter of the range per step
            let ns = c.convert_tracking(true_ticks & mask);
            assert_eq!(ns, true_ticks * 1_000);
        }
        // Without tracking the same sequence would alias after half a wrap.
        let fixed = NicClock::new(1_000, mask, 0, 0).unwrap();
        assert_ne!(fixed.to_ns(true_ticks & mask), true_ticks * 1_000);
    }

    #[test]
    fn reanchor_interval_bounds() {
        let c = NicClock::new(1_000_000, (1 << 32) - 1, 0, 0).unwrap();
        assert_eq!(c.reanchor_interval_ticks(), ((1u64 << 32) - 1) / 4);
        assert_eq!(c.reanchor_interval_ns(), ((1u64 << 32) - 1) / 4);
        let wide = NicClock::new(1_000_000, 0, 0, 0).unwrap();
        assert_eq!(wide.reanchor_interval_ns(), 3_600_000_000_000);
    }

    #[test]
    fn saturates_instead_of_wrapping_below_zero() {
        let c = NicClock::new(1_000, 0, 1_000_000, 10).unwrap();
        assert_eq!(c.to_ns(0), 0);
    }
}
