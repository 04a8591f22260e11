//! The driver's lookup tables keyed by small ids: an identity hasher for TargetIds and the
//! send table that maps an in-flight send back to what it was for.

use super::*;

/// TargetIds are small counters handed out by the driver itself: hashing them with
/// SipHash on every send and outcome buys nothing.
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // Spread the counter over the high bits hashbrown uses for its control bytes.
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = n as u64;
    }
}

pub(super) type IdMap<V> = HashMap<TargetId, V, BuildHasherDefault<IdHasher>>;

/// Sends awaiting their completion, indexed by send id. Both transports hand out ids
/// counting up by one and complete (nearly) in order, so a deque offset by the oldest id
/// replaces a hash map: insert is a push, remove a slot write plus popping the done front.
#[derive(Debug)]
pub struct SendTable<T> {
    pub(super) base: SendId,
    pub(super) slots: VecDeque<Option<(T, u64)>>,
    pub(super) live: usize,
}

/// Ids further than this ahead of the oldest tracked send are not tracked (only reachable
/// if a transport's ids jumped; the probe then just times out).
pub(super) const SEND_TABLE_SPAN: u32 = 1 << 20;

impl<T> Default for SendTable<T> {
    fn default() -> Self {
        SendTable {
            base: 0,
            slots: VecDeque::new(),
            live: 0,
        }
    }
}

impl<T: Copy> SendTable<T> {
    /// Tracks send `id`, sent at `at_ns`. Returns false if the id cannot be tracked.
    pub fn insert(&mut self, id: SendId, value: T, at_ns: u64) -> bool {
        if self.slots.is_empty() {
            self.base = id;
        }
        let off = id.wrapping_sub(self.base);
        if off >= SEND_TABLE_SPAN {
            return false; // behind the window (reused id) or absurdly far ahead
        }
        let off = off as usize;
        if off >= self.slots.len() {
            self.slots.resize(off + 1, None);
        }
        if self.slots[off].replace((value, at_ns)).is_none() {
            self.live += 1;
        }
        true
    }

    pub fn remove(&mut self, id: SendId) -> Option<T> {
        let off = id.wrapping_sub(self.base) as usize;
        let v = self.slots.get_mut(off)?.take()?;
        self.live -= 1;
        self.pop_done();
        Some(v.0)
    }

    /// Forgets sends older than `horizon_ns` before `now` (their completion never came).
    pub fn expire(&mut self, now: u64, horizon_ns: u64) {
        for slot in self.slots.iter_mut() {
            if matches!(slot, Some((_, at)) if now.saturating_sub(*at) > horizon_ns) {
                *slot = None;
                self.live -= 1;
            }
        }
        self.pop_done();
    }

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    pub(super) fn pop_done(&mut self) {
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.base = self.base.wrapping_add(1);
        }
    }
}
