//! When an address handle may be used, created, refreshed or given up on: the pure policy
//! over [`AhCache`] that keeps `ibv_create_ah` off the send path.
//!
//! `ibv_create_ah` on RoCE resolves the next hop's MAC in the kernel and blocks up to about
//! a second when the neighbour does not answer (a dead peer: ETIMEDOUT). So the endpoint
//! never creates an AH where it sends: a miss parks the send and asks a resolver thread,
//! which reports back through [`AhTable::resolved`]. The table also decides
//! - how long a GID whose resolution failed is left alone (per GID, not per flow label:
//!   the neighbour is the same for every label), doubling up to [`FAILURE_RETRY_MAX_NS`];
//! - when a working handle is re-created: past [`AhTable::max_age_ns`], or after a loss on
//!   its path (mlx5 copies the next hop's MAC into the AH, so a neighbour change would
//!   otherwise leave probes on a stale MAC forever). The old handle keeps serving until
//!   the new one exists, and a failed refresh keeps it;
//! - how big the LRU is: at least the paths of the current pinglist (`reserve`), or every
//!   round of flow labels would evict what the next round needs.
//!
//! No I/O, no clock: every time is an argument (ns).

use std::collections::{HashMap, HashSet};
use std::net::Ipv6Addr;

use super::ah_cache::{AhCache, AhCacheStats, AhKey};

/// First wait after a GID's resolution failed; doubles per consecutive failure.
pub const FAILURE_RETRY_NS: u64 = 2_000_000_000;
/// Longest wait between resolution attempts of an unreachable GID.
pub const FAILURE_RETRY_MAX_NS: u64 = 30_000_000_000;
/// Default age after which a handle is re-created in the background.
pub const DEFAULT_MAX_AGE_NS: u64 = 300_000_000_000;
/// A path that loses probes asks for a new handle at most this often.
pub const LOSS_REFRESH_MIN_NS: u64 = 1_000_000_000;
/// Upper bound of `reserve` (a pinglist cannot ask for more handles than this).
pub const MAX_CAPACITY: usize = 1 << 20;

struct Slot<H> {
    handle: H,
    created_ns: u64,
    /// A loss was reported on this path since the handle was made.
    lost: bool,
    /// A re-creation is queued; no second one until it reports back.
    refreshing: bool,
    /// When the last refresh was asked for (rate limit of loss refreshes).
    refresh_asked_ns: u64,
}

struct GidFailure {
    until_ns: u64,
    failures: u32,
    reason: String,
}

/// What a send does with its path.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a, H> {
    /// Use `handle`. `refresh`: also queue a background re-creation (aged or lossy).
    Hit { handle: &'a H, refresh: bool },
    /// No handle and none asked for: queue a resolution and park the send.
    Miss,
    /// A resolution is under way: park the send.
    Pending,
    /// The GID failed to resolve recently: fail the send at once.
    Unreachable { reason: &'a str, retry_in_ns: u64 },
}

/// What a finished resolution did to the table.
#[derive(Debug, PartialEq, Eq)]
pub enum Resolved<H> {
    /// The new handle is in. `retire`: the handle it replaced or evicted (destroy it once
    /// the sends posted with it completed).
    Ready { retire: Option<H> },
    /// A refresh failed: the old handle stays; nothing to retire.
    KeptOld,
    /// No handle: the parked sends fail. `first`: the GID was reachable before (log it).
    Failed { first: bool },
}

/// Counters beyond the LRU's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AhTableStats {
    pub cache: AhCacheStats,
    pub resolutions: u64,
    pub resolution_failures: u64,
    pub refreshes: u64,
    pub unreachable_sends: u64,
}

pub struct AhTable<H> {
    cache: AhCache<Slot<H>>,
    pending: HashSet<AhKey>,
    failed: HashMap<Ipv6Addr, GidFailure>,
    /// GIDs whose last resolution worked: their neighbour is known, so another handle
    /// for them (a new flow label) is made at once, never waiting behind a dead peer.
    known: HashSet<Ipv6Addr>,
    max_age_ns: u64,
    configured_capacity: usize,
    stats: AhTableStats,
}

impl<H> AhTable<H> {
    pub fn new(capacity: usize, max_age_ns: u64) -> AhTable<H> {
        AhTable {
            cache: AhCache::new(capacity),
            pending: HashSet::new(),
            failed: HashMap::new(),
            known: HashSet::new(),
            max_age_ns: max_age_ns.max(1),
            configured_capacity: capacity.max(1),
            stats: AhTableStats::default(),
        }
    }

    pub fn max_age_ns(&self) -> u64 {
        self.max_age_ns
    }

    pub fn capacity(&self) -> usize {
        self.cache.capacity()
    }

    pub fn len(&self) -> usize {
        self.cache.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    pub fn stats(&self) -> AhTableStats {
        AhTableStats {
            cache: self.cache.stats(),
            ..self.stats
        }
    }

    /// Makes room for `paths` handles (the pinglist's targets x flow labels, and the
    /// peers' ACK paths): the capacity becomes the larger of the configured one and
    /// `paths`, up to [`MAX_CAPACITY`]. Never shrinks below what is cached.
    pub fn reserve(&mut self, paths: usize) {
        let want = paths
            .min(MAX_CAPACITY)
            .max(self.configured_capacity)
            .max(self.cache.len());
        self.cache.set_capacity(want);
    }

    pub fn lookup(&mut self, key: &AhKey, now_ns: u64) -> Lookup<'_, H> {
        if let Some(slot) = self.cache.get_mut(key) {
            let aged = now_ns.saturating_sub(slot.created_ns) >= self.max_age_ns;
            let lossy =
                slot.lost && now_ns.saturating_sub(slot.refresh_asked_ns) >= LOSS_REFRESH_MIN_NS;
            let refresh = !slot.refreshing && (aged || lossy);
            if refresh {
                slot.refreshing = true;
                slot.refresh_asked_ns = now_ns;
                self.stats.refreshes += 1;
            }
            return Lookup::Hit {
                handle: &slot.handle,
                refresh,
            };
        }
        if self.pending.contains(key) {
            return Lookup::Pending;
        }
        if let Some(f) = self.failed.get(&key.gid) {
            if now_ns < f.until_ns {
                self.stats.unreachable_sends += 1;
                return Lookup::Unreachable {
                    reason: &f.reason,
                    retry_in_ns: f.until_ns - now_ns,
                };
            }
        }
        self.pending.insert(*key);
        Lookup::Miss
    }

    /// True when the last resolution for `gid` worked (see `known`).
    pub fn gid_known(&self, gid: &Ipv6Addr) -> bool {
        self.known.contains(gid)
    }

    /// The handle for `key`, without counting a lookup.
    pub fn peek(&mut self, key: &AhKey) -> Option<&H> {
        self.cache.peek_mut(key).map(|s| &s.handle)
    }

    /// A loss on the path `key` (a probe timed out): its handle is re-created at the next
    /// send, at most once per [`LOSS_REFRESH_MIN_NS`].
    pub fn note_loss(&mut self, key: &AhKey) {
        if let Some(slot) = self.cache.peek_mut(key) {
            slot.lost = true;
        }
    }

    /// Every handle is re-created at its next use (the port came back, neighbours may
    /// have moved).
    pub fn refresh_all(&mut self) {
        self.cache.for_each_mut(|s| {
            s.lost = true;
            s.refresh_asked_ns = 0;
        });
        self.failed.clear();
    }

    /// The resolver's answer for `key`.
    pub fn resolved(&mut self, key: AhKey, r: Result<H, String>, now_ns: u64) -> Resolved<H> {
        self.pending.remove(&key);
        match r {
            Ok(handle) => {
                self.stats.resolutions += 1;
                self.failed.remove(&key.gid);
                self.known.insert(key.gid);
                let slot = Slot {
                    handle,
                    created_ns: now_ns,
                    lost: false,
                    refreshing: false,
                    refresh_asked_ns: now_ns,
                };
                Resolved::Ready {
                    retire: self.cache.insert(key, slot).map(|(_, s)| s.handle),
                }
            }
            Err(reason) => {
                self.stats.resolution_failures += 1;
                if let Some(slot) = self.cache.peek_mut(&key) {
                    // A refresh failed: the handle that worked keeps serving; a new try
                    // comes after the next age limit or loss interval.
                    slot.refreshing = false;
                    slot.created_ns = now_ns;
                    slot.lost = false;
                    return Resolved::KeptOld;
                }
                self.known.remove(&key.gid);
                let f = self.failed.entry(key.gid).or_insert(GidFailure {
                    until_ns: 0,
                    failures: 0,
                    reason: String::new(),
                });
                let first = f.failures == 0;
                let wait = FAILURE_RETRY_NS
                    .saturating_mul(1u64 << f.failures.min(16))
                    .min(FAILURE_RETRY_MAX_NS);
                f.failures = f.failures.saturating_add(1);
                f.until_ns = now_ns.saturating_add(wait);
                f.reason = reason;
                Resolved::Failed { first }
            }
        }
    }

    /// Every handle, for teardown.
    pub fn drain(&mut self) -> Vec<H> {
        self.pending.clear();
        self.cache.drain().into_iter().map(|s| s.handle).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn key(last: u16, fl: u32) -> AhKey {
        AhKey::new(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last), fl, 0, 0)
    }

    #[test]
    fn a_miss_is_resolved_once_and_then_hits() {
        let mut t: AhTable<u32> = AhTable::new(16, DEFAULT_MAX_AGE_NS);
        assert_eq!(t.lookup(&key(1, 5), 0), Lookup::Miss);
        // Sends during the resolution park instead of asking again.
        assert_eq!(t.lookup(&key(1, 5), 1), Lookup::Pending);
        assert_eq!(
            t.resolved(key(1, 5), Ok(7), 2),
            Resolved::Ready { retire: None }
        );
        assert_eq!(
            t.lookup(&key(1, 5), 3),
            Lookup::Hit {
                handle: &7,
                refresh: false
            }
        );
        assert_eq!(t.stats().resolutions, 1);
    }

    #[test]
    fn a_dead_gid_fails_fast_for_every_label_with_doubling_retries() {
        let mut t: AhTable<u32> = AhTable::new(16, DEFAULT_MAX_AGE_NS);
        assert_eq!(t.lookup(&key(9, 1), 0), Lookup::Miss);
        assert_eq!(
            t.resolved(key(9, 1), Err("ETIMEDOUT".into()), S),
            Resolved::Failed { first: true }
        );
        // Another label of the same GID: no second one-second resolution.
        match t.lookup(&key(9, 2), S + 1) {
            Lookup::Unreachable {
                reason,
                retry_in_ns,
            } => {
                assert_eq!(reason, "ETIMEDOUT");
                assert_eq!(retry_in_ns, FAILURE_RETRY_NS - 1);
            }
            other => panic!("{other:?}"),
        }
        // Other GIDs are untouched.
        assert_eq!(t.lookup(&key(1, 1), S + 1), Lookup::Miss);
        assert!(!t.gid_known(&key(9, 1).gid));
        // After the wait one try; its failure doubles the wait.
        let t1 = S + FAILURE_RETRY_NS;
        assert_eq!(t.lookup(&key(9, 2), t1), Lookup::Miss);
        assert_eq!(
            t.resolved(key(9, 2), Err("ETIMEDOUT".into()), t1),
            Resolved::Failed { first: false }
        );
        assert!(matches!(
            t.lookup(&key(9, 2), t1 + 2 * FAILURE_RETRY_NS - 1),
            Lookup::Unreachable { .. }
        ));
        assert_eq!(
            t.lookup(&key(9, 2), t1 + 2 * FAILURE_RETRY_NS),
            Lookup::Miss
        );
        // Many failures: the wait stops growing at the maximum.
        let mut now = t1 + 2 * FAILURE_RETRY_NS;
        for _ in 0..20 {
            t.resolved(key(9, 2), Err("x".into()), now);
            now += FAILURE_RETRY_MAX_NS;
            assert_eq!(t.lookup(&key(9, 2), now), Lookup::Miss);
        }
        // A success clears the GID's record.
        t.resolved(key(9, 2), Ok(1), now);
        assert!(t.gid_known(&key(9, 2).gid));
        assert_eq!(t.lookup(&key(9, 3), now), Lookup::Miss);
        assert_eq!(t.stats().unreachable_sends, 2);
    }

    #[test]
    fn old_handles_are_refreshed_in_the_background_and_kept_on_failure() {
        let age = 10 * S;
        let mut t: AhTable<u32> = AhTable::new(16, age);
        t.lookup(&key(1, 0), 0);
        t.resolved(key(1, 0), Ok(1), 0);
        assert_eq!(
            t.lookup(&key(1, 0), age - 1),
            Lookup::Hit {
                handle: &1,
                refresh: false
            }
        );
        assert_eq!(
            t.lookup(&key(1, 0), age),
            Lookup::Hit {
                handle: &1,
                refresh: true
            }
        );
        // Asked once: the old handle serves meanwhile.
        assert_eq!(
            t.lookup(&key(1, 0), age + 1),
            Lookup::Hit {
                handle: &1,
                refresh: false
            }
        );
        assert_eq!(
            t.resolved(key(1, 0), Ok(2), age + 2),
            Resolved::Ready { retire: Some(1) }
        );
        assert_eq!(
            t.lookup(&key(1, 0), age + 3),
            Lookup::Hit {
                handle: &2,
                refresh: false
            }
        );
        // A failed refresh keeps the working handle, and tries again one age later.
        let t2 = age + 2 + age;
        assert!(matches!(
            t.lookup(&key(1, 0), t2),
            Lookup::Hit { refresh: true, .. }
        ));
        assert_eq!(
            t.resolved(key(1, 0), Err("EAGAIN".into()), t2),
            Resolved::KeptOld
        );
        assert_eq!(
            t.lookup(&key(1, 0), t2 + 1),
            Lookup::Hit {
                handle: &2,
                refresh: false
            }
        );
        assert!(matches!(
            t.lookup(&key(1, 0), t2 + age),
            Lookup::Hit { refresh: true, .. }
        ));
        assert_eq!(t.stats().refreshes, 3);
    }

    #[test]
    fn a_loss_refreshes_the_path_at_most_once_a_second() {
        let mut t: AhTable<u32> = AhTable::new(16, DEFAULT_MAX_AGE_NS);
        t.lookup(&key(1, 0), 0);
        t.resolved(key(1, 0), Ok(1), 0);
        t.note_loss(&key(1, 0));
        // Within a second of the handle's creation: not yet.
        assert!(matches!(
            t.lookup(&key(1, 0), S / 2),
            Lookup::Hit { refresh: false, .. }
        ));
        assert!(matches!(
            t.lookup(&key(1, 0), S),
            Lookup::Hit { refresh: true, .. }
        ));
        assert_eq!(
            t.resolved(key(1, 0), Ok(2), S + 1),
            Resolved::Ready { retire: Some(1) }
        );
        // The fresh handle starts clean; a loss on an unknown path changes nothing.
        assert!(matches!(
            t.lookup(&key(1, 0), 3 * S),
            Lookup::Hit { refresh: false, .. }
        ));
        t.note_loss(&key(2, 0));
        assert_eq!(t.lookup(&key(2, 0), 3 * S), Lookup::Miss);
        // Port back up: everything is refreshed at its next use.
        t.refresh_all();
        assert!(matches!(
            t.lookup(&key(1, 0), 3 * S),
            Lookup::Hit { refresh: true, .. }
        ));
    }

    #[test]
    fn reserve_sizes_the_cache_to_the_pinglist() {
        // 256 targets x 64 labels over a 4096-entry cache: round after round, the LRU
        // would evict exactly what the next round needs (a 0% hit rate).
        let (targets, labels) = (256u16, 64u32);
        let rounds = 3;
        let run = |reserve: bool| {
            let mut t: AhTable<u32> = AhTable::new(4096, DEFAULT_MAX_AGE_NS);
            if reserve {
                t.reserve(targets as usize * labels as usize);
            }
            for _ in 0..rounds {
                for fl in 0..labels {
                    for g in 0..targets {
                        if t.lookup(&key(g, fl), 0) == Lookup::Miss {
                            t.resolved(key(g, fl), Ok(0), 0);
                        }
                    }
                }
            }
            let s = t.stats().cache;
            s.hits as f64 / (s.hits + s.misses) as f64
        };
        assert_eq!(run(false), 0.0);
        let sized = run(true);
        assert!((sized - 2.0 / 3.0).abs() < 1e-9, "{sized}");
        let mut t: AhTable<u32> = AhTable::new(100, 1);
        t.reserve(10);
        assert_eq!(t.capacity(), 100, "never below the configured capacity");
        t.reserve(usize::MAX);
        assert_eq!(t.capacity(), MAX_CAPACITY);
    }
}
