//! ECMP flow-label expansion: label i = hash(seed, i, epoch) masked to 20 bits; the
//! stable ~80% of indexes use epoch 0, every 5th index folds in the rotation epoch.
//!
//! The "hash" is a keyed 20-bit permutation (a 4-round Feistel network whose round
//! function is a splitmix64-style finalizer) applied to a per-index input that is
//! distinct for every index of one epoch. Labels of one set are therefore pairwise
//! distinct, so n labels really are n candidate paths (a plain hash would collide with
//! probability ~n^2/2^21).

pub const FLOW_LABEL_MASK: u32 = 0xF_FFFF;

/// Every `ROTATE_EVERY`-th index (0, 5, 10, ...) rotates with the epoch.
pub const ROTATE_EVERY: u32 = 5;

/// floor(unix_sec / period); a period of 0 disables rotation (epoch 0).
pub fn rotation_epoch(unix_sec: u64, period_sec: u64) -> u64 {
    unix_sec.checked_div(period_sec).unwrap_or(0)
}

/// splitmix64 finalizer: a bijective 64-bit mixer with full avalanche.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const HALF_BITS: u32 = 10;
const HALF_MASK: u32 = (1 << HALF_BITS) - 1;

/// Keyed permutation of the 20-bit space.
fn permute20(key: u64, x: u32) -> u32 {
    let mut l = (x >> HALF_BITS) & HALF_MASK;
    let mut r = x & HALF_MASK;
    for round in 0..4u64 {
        let f = mix64(key ^ mix64((round << 32) | r as u64)) as u32 & HALF_MASK;
        let nl = r;
        r = l ^ f;
        l = nl;
    }
    (l << HALF_BITS) | r
}

/// One target's flow-label set, sent round-robin.
#[derive(Debug, Clone)]
pub struct FlowLabelSet {
    seed: u32,
    count: u32,
    legacy: u32,
    next: u32,
    /// Labels given one by one (FOCUS targets): used in order, no rotation.
    explicit: Vec<u32>,
}

impl FlowLabelSet {
    /// `count <= 1` means the legacy single `flow_label`, used verbatim.
    pub fn new(seed: u32, count: u32, legacy_flow_label: u32) -> Self {
        FlowLabelSet {
            seed,
            count,
            legacy: legacy_flow_label & FLOW_LABEL_MASK,
            next: 0,
            explicit: Vec::new(),
        }
    }

    /// Exactly these labels, round-robin (an empty list is label 0 alone).
    pub fn explicit(labels: &[u32]) -> Self {
        let mut s = FlowLabelSet::new(0, 1, 0);
        s.explicit = labels.iter().map(|l| l & FLOW_LABEL_MASK).collect();
        s
    }

    /// Label of index `i` under `epoch`.
    ///
    /// Input to the permutation: stable index i -> i (top bit clear); rotating index
    /// i -> top bit set | (i/5 + offset(epoch)) mod 2^19. Both are injective per epoch
    /// for sets below 2^19 labels, so the labels of a set are distinct.
    pub fn label(&self, index: u32, epoch: u64) -> u32 {
        if !self.explicit.is_empty() {
            return self.explicit[index as usize % self.explicit.len()];
        }
        if self.count <= 1 {
            return self.legacy;
        }
        const HALF_SPACE: u32 = 1 << 19;
        let key = mix64(self.seed as u64 ^ 0x5250_494E_474D_4553); // "RPINGMES"
        let x = if index.is_multiple_of(ROTATE_EVERY) {
            let offset = mix64(key ^ mix64(epoch)) as u32;
            HALF_SPACE | ((index / ROTATE_EVERY).wrapping_add(offset) & (HALF_SPACE - 1))
        } else {
            index & (HALF_SPACE - 1)
        };
        permute20(key, x) & FLOW_LABEL_MASK
    }

    /// Next label in round-robin order.
    pub fn next_label(&mut self, epoch: u64) -> u32 {
        let l = self.label(self.next, epoch);
        self.next = (self.next + 1) % self.len();
        l
    }

    /// Number of labels (1 for the legacy single label).
    pub fn len(&self) -> u32 {
        if self.explicit.is_empty() {
            self.count.max(1)
        } else {
            self.explicit.len() as u32
        }
    }

    /// Never empty: there is always at least the legacy label.
    pub fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod explicit_tests;

/// The flow label a RoCE v2 NIC derives for a connected QP pair whose address vector
/// left it 0: Linux's `rdma_calc_flow_label(lqpn, rqpn)` (include/rdma/ib_verbs.h),
/// which mlx5 (`mlx5_set_path_udp_sport`), hns, irdma and rxe (`rxe_modify_qp`) turn into
/// the RC QP's UDP source port. Symmetric in the two QPNs, so both ends agree.
pub fn rc_flow_label(lqpn: u32, rqpn: u32) -> u32 {
    let mut v = u64::from(lqpn) * u64::from(rqpn);
    v ^= v >> 20;
    v ^= v >> 40;
    (v as u32) & FLOW_LABEL_MASK
}

/// RoCE v2's UDP source port for a flow label: `rdma_flow_label_to_udp_sport`.
pub fn udp_sport(flow_label: u32) -> u16 {
    let fl = flow_label & FLOW_LABEL_MASK;
    let low = (fl & 0x3FFF) ^ ((fl & 0xF_C000) >> 14);
    (low | 0xC000) as u16
}

/// The label a SERVICE probe must carry to take the service's ECMP path. A label the
/// service set is its path. Label 0 is no path: the NIC derives one from the QPNs
/// ([`rc_flow_label`]), and a UD address handle with that label gets the same UDP source
/// port (mlx5 and hns compute a UD AH's port from its label; with label 0 they pick a
/// random one). A derived 0 becomes 0x4001, which maps to the same port (0xC000) without
/// being 0. (rxe ignores the AH's label for UD: its port hashes the UD QPN.)
pub fn service_path_label(flow_label: u32, lqpn: u32, rqpn: u32) -> u32 {
    let fl = flow_label & FLOW_LABEL_MASK;
    if fl != 0 {
        return fl;
    }
    match rc_flow_label(lqpn, rqpn) {
        0 => 0x4001,
        x => x,
    }
}

#[cfg(test)]
mod tests;
