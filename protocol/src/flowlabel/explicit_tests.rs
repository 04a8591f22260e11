//! Tests of `flowlabel.rs`.

use super::*;

#[test]
fn explicit_labels_come_in_order_and_do_not_rotate() {
    let mut s = FlowLabelSet::explicit(&[7, 0x1F_FFFF, 9]);
    assert_eq!(s.len(), 3);
    let got: Vec<u32> = (0..4).map(|e| s.next_label(e)).collect();
    assert_eq!(got, [7, 0xF_FFFF, 9, 7]);
    assert_eq!(FlowLabelSet::explicit(&[]).len(), 1);
}
