//! Tests of `flowlabel.rs`.

use super::*;

#[test]
fn service_labels_follow_the_kernels_derivation() {
    // Worked by hand: 0x11 * 0x12 = 0x132 (no high bits to fold).
    assert_eq!(rc_flow_label(0x11, 0x12), 0x132);
    assert_eq!(rc_flow_label(0x12, 0x11), 0x132, "symmetric");
    // 0xFFFFFF^2 = 0xFFFFFE000001: v ^= v>>20 -> 0xFFFFFE0FFFFF ^ ... folded to 20 bits.
    let v: u64 = 0xFF_FFFF * 0xFF_FFFF;
    let v = v ^ (v >> 20);
    let v = v ^ (v >> 40);
    assert_eq!(rc_flow_label(0xFF_FFFF, 0xFF_FFFF), (v as u32) & 0xF_FFFF);
    // A label the service set is kept; 0 is derived; a derived 0 maps to port 0xC000.
    assert_eq!(service_path_label(0x1234, 5, 6), 0x1234);
    assert_eq!(service_path_label(0, 0x11, 0x12), 0x132);
    assert_eq!(service_path_label(0, 0, 7), 0x4001);
    assert_eq!(udp_sport(0x4001), 0xC000);
    assert_eq!(udp_sport(0), 0xC000);
    assert_eq!(udp_sport(0x132), 0xC132);
    assert_eq!(udp_sport(0xF_C000), 0xC03F);
}
use std::collections::HashSet;

#[test]
fn epochs() {
    assert_eq!(rotation_epoch(7_199, 3_600), 1);
    assert_eq!(rotation_epoch(7_200, 3_600), 2);
    assert_eq!(rotation_epoch(1_700_000_000, 0), 0);
}

#[test]
fn mixer_matches_splitmix64_reference() {
    // splitmix64 with state 0: first output is mix64(0x9E3779B97F4A7C15).
    assert_eq!(mix64(0x9E37_79B9_7F4A_7C15), 0xE220_A839_7B1D_CDAF);
}

#[test]
fn permutation_is_bijective() {
    let mut seen = vec![false; 1 << 20];
    for x in 0..(1u32 << 20) {
        let y = permute20(42, x) as usize;
        assert!(!seen[y], "collision at {x}");
        seen[y] = true;
    }
}

#[test]
fn deterministic_and_in_range() {
    let a = FlowLabelSet::new(0xDEAD_BEEF, 64, 0);
    let b = FlowLabelSet::new(0xDEAD_BEEF, 64, 0);
    let c = FlowLabelSet::new(0xDEAD_BEEE, 64, 0);
    let mut differs = 0;
    for i in 0..64 {
        assert_eq!(a.label(i, 17), b.label(i, 17));
        assert!(a.label(i, 17) <= FLOW_LABEL_MASK);
        if a.label(i, 17) != c.label(i, 17) {
            differs += 1;
        }
    }
    assert!(
        differs > 60,
        "another seed gives other labels ({differs}/64 differ)"
    );
}

#[test]
fn distinct_over_64_for_many_seeds_and_epochs() {
    for seed in 0..200u32 {
        let s = FlowLabelSet::new(seed.wrapping_mul(0x9E37_79B9), 64, 0);
        for epoch in [0u64, 1, 472_222, u64::MAX] {
            let set: HashSet<u32> = (0..64).map(|i| s.label(i, epoch)).collect();
            assert_eq!(set.len(), 64, "seed {seed} epoch {epoch}");
        }
    }
}

#[test]
fn rotation_changes_exactly_every_fifth_index() {
    let s = FlowLabelSet::new(12_345, 64, 0);
    for (e1, e2) in [(0u64, 1u64), (472_222, 472_223), (5, 900)] {
        for i in 0..64 {
            let changed = s.label(i, e1) != s.label(i, e2);
            assert_eq!(changed, i % 5 == 0, "index {i} epochs {e1}->{e2}");
        }
    }
}

#[test]
fn legacy_single_label() {
    for count in [0, 1] {
        let mut s = FlowLabelSet::new(999, count, 0xABCDE);
        assert_eq!(s.len(), 1);
        assert_eq!(s.next_label(3), 0xABCDE);
        assert_eq!(s.next_label(4), 0xABCDE);
        assert_eq!(s.label(5, 9), 0xABCDE);
    }
    // Masked to 20 bits.
    assert_eq!(FlowLabelSet::new(1, 1, 0xFFF_ABCDE).label(0, 0), 0xABCDE);
}

#[test]
fn round_robin() {
    let mut s = FlowLabelSet::new(7, 3, 0);
    let want: Vec<u32> = (0..3).map(|i| s.label(i, 2)).collect();
    let got: Vec<u32> = (0..7).map(|_| s.next_label(2)).collect();
    assert_eq!(
        got,
        [want[0], want[1], want[2], want[0], want[1], want[2], want[0]]
    );
}
