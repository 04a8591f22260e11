//! Address-handle cache: one AH per (remote GID, flow label, SL, traffic class), bounded,
//! least-recently-used eviction. Generic over the handle so it is tested without hardware;
//! an evicted handle is handed back so the caller destroys it (after its in-flight sends).
//!
//! The Go/Zig version creates a fresh AH for every send; here a send to a known path is a
//! hash lookup plus two index updates.

use std::collections::HashMap;
use std::net::Ipv6Addr;

/// The GRH fields an AH fixes. The flow label is masked to its 20 bits so equal wire
/// headers share one handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhKey {
    pub gid: Ipv6Addr,
    pub flow_label: u32,
    pub service_level: u8,
    pub traffic_class: u8,
}

impl AhKey {
    pub fn new(gid: Ipv6Addr, flow_label: u32, service_level: u8, traffic_class: u8) -> AhKey {
        AhKey {
            gid,
            flow_label: flow_label & 0xF_FFFF,
            // SL is 4 bits on the wire (RoCE maps it to a PCP priority 0..7).
            service_level: service_level & 0xF,
            traffic_class,
        }
    }
}

const NIL: usize = usize::MAX;

struct Node<H> {
    key: AhKey,
    handle: H,
    prev: usize,
    next: usize,
}

/// Counters of the cache (hits/misses per lookup, evictions per insert).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AhCacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

/// Bounded LRU: a hash map into a slab of nodes threaded on an intrusive doubly-linked
/// list (head = most recent). Every operation is O(1).
pub struct AhCache<H> {
    capacity: usize,
    map: HashMap<AhKey, usize>,
    nodes: Vec<Node<H>>,
    head: usize,
    tail: usize,
    stats: AhCacheStats,
}

impl<H> AhCache<H> {
    /// `capacity` is clamped to at least 1.
    pub fn new(capacity: usize) -> AhCache<H> {
        let capacity = capacity.max(1);
        AhCache {
            capacity,
            map: HashMap::with_capacity(capacity),
            nodes: Vec::with_capacity(capacity),
            head: NIL,
            tail: NIL,
            stats: AhCacheStats::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn stats(&self) -> AhCacheStats {
        self.stats
    }

    fn unlink(&mut self, i: usize) {
        let (p, n) = (self.nodes[i].prev, self.nodes[i].next);
        if p != NIL {
            self.nodes[p].next = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            self.nodes[n].prev = p;
        } else {
            self.tail = p;
        }
    }

    fn push_front(&mut self, i: usize) {
        self.nodes[i].prev = NIL;
        self.nodes[i].next = self.head;
        if self.head != NIL {
            self.nodes[self.head].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    /// Looks `key` up and marks it most recently used.
    pub fn get(&mut self, key: &AhKey) -> Option<&H> {
        self.get_mut(key).map(|h| &*h)
    }

    /// As `get`, mutable.
    pub fn get_mut(&mut self, key: &AhKey) -> Option<&mut H> {
        match self.map.get(key).copied() {
            Some(i) => {
                self.stats.hits += 1;
                if self.head != i {
                    self.unlink(i);
                    self.push_front(i);
                }
                Some(&mut self.nodes[i].handle)
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// The entry for `key`, without touching its recency or the counters.
    pub fn peek_mut(&mut self, key: &AhKey) -> Option<&mut H> {
        let i = *self.map.get(key)?;
        Some(&mut self.nodes[i].handle)
    }

    pub fn for_each_mut(&mut self, mut f: impl FnMut(&mut H)) {
        for n in &mut self.nodes {
            f(&mut n.handle);
        }
    }

    /// Changes the bound (never below the entries held, nor below 1).
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(self.map.len()).max(1);
    }

    /// Inserts (or replaces) `key`. Returns the handle that left the cache: the replaced
    /// one for an existing key, else the least recently used one when full.
    pub fn insert(&mut self, key: AhKey, handle: H) -> Option<(AhKey, H)> {
        if let Some(&i) = self.map.get(&key) {
            let old = std::mem::replace(&mut self.nodes[i].handle, handle);
            if self.head != i {
                self.unlink(i);
                self.push_front(i);
            }
            return Some((key, old));
        }
        if self.map.len() < self.capacity {
            let i = self.nodes.len();
            self.nodes.push(Node {
                key,
                handle,
                prev: NIL,
                next: NIL,
            });
            self.map.insert(key, i);
            self.push_front(i);
            return None;
        }
        // Full: reuse the tail's slot.
        let i = self.tail;
        self.unlink(i);
        let old_key = self.nodes[i].key;
        self.map.remove(&old_key);
        let old = std::mem::replace(&mut self.nodes[i].handle, handle);
        self.nodes[i].key = key;
        self.map.insert(key, i);
        self.push_front(i);
        self.stats.evictions += 1;
        Some((old_key, old))
    }

    /// The cached handle for `key`, creating it with `make` on a miss. The second value
    /// is the handle evicted to make room, for the caller to destroy.
    pub fn get_or_try_insert_with<E>(
        &mut self,
        key: AhKey,
        make: impl FnOnce(&AhKey) -> Result<H, E>,
    ) -> Result<(&H, Option<H>), E> {
        if let Some(&i) = self.map.get(&key) {
            self.stats.hits += 1;
            if self.head != i {
                self.unlink(i);
                self.push_front(i);
            }
            return Ok((&self.nodes[i].handle, None));
        }
        self.stats.misses += 1;
        let h = make(&key)?;
        let evicted = self.insert(key, h).map(|(_, h)| h);
        let i = self.head;
        Ok((&self.nodes[i].handle, evicted))
    }

    /// Keys from most to least recently used.
    pub fn keys_mru(&self) -> Vec<AhKey> {
        let mut v = Vec::with_capacity(self.len());
        let mut i = self.head;
        while i != NIL {
            v.push(self.nodes[i].key);
            i = self.nodes[i].next;
        }
        v
    }

    /// Empties the cache, handing every handle back (device teardown).
    pub fn drain(&mut self) -> Vec<H> {
        self.map.clear();
        self.head = NIL;
        self.tail = NIL;
        self.nodes.drain(..).map(|n| n.handle).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(last: u16, fl: u32) -> AhKey {
        AhKey::new(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, last), fl, 3, 104)
    }

    #[test]
    fn keying_distinguishes_every_field() {
        let g: Ipv6Addr = "::ffff:10.0.0.1".parse().unwrap();
        let base = AhKey::new(g, 7, 3, 104);
        let variants = [
            AhKey::new("::ffff:10.0.0.2".parse().unwrap(), 7, 3, 104),
            AhKey::new(g, 8, 3, 104),
            AhKey::new(g, 7, 4, 104),
            AhKey::new(g, 7, 3, 96),
        ];
        let mut c: AhCache<u32> = AhCache::new(8);
        assert!(c.insert(base, 0).is_none());
        for (n, v) in variants.iter().enumerate() {
            assert_ne!(*v, base);
            assert!(c.insert(*v, n as u32 + 1).is_none());
        }
        assert_eq!(c.len(), 5);
        assert_eq!(c.get(&base), Some(&0));
        // Bits above the 20-bit flow label do not make a new path.
        assert_eq!(AhKey::new(g, 7 | (1 << 20), 3, 104), base);
        assert_eq!(c.get(&AhKey::new(g, 0xFFF0_0007, 3, 104)), Some(&0));
    }

    #[test]
    fn lru_eviction_hands_back_the_oldest() {
        let mut c: AhCache<String> = AhCache::new(3);
        for i in 0..3 {
            assert!(c.insert(k(i, 0), format!("ah{i}")).is_none());
        }
        // Touch 0 so 1 becomes the least recently used.
        assert_eq!(c.get(&k(0, 0)).map(String::as_str), Some("ah0"));
        let ev = c.insert(k(3, 0), "ah3".into()).unwrap();
        assert_eq!(ev, (k(1, 0), "ah1".to_string()));
        assert_eq!(c.keys_mru(), vec![k(3, 0), k(0, 0), k(2, 0)]);
        assert!(c.get(&k(1, 0)).is_none());
        let ev = c.insert(k(4, 0), "ah4".into()).unwrap();
        assert_eq!(ev.0, k(2, 0));
        assert_eq!(c.len(), 3);
        assert_eq!(
            c.stats(),
            AhCacheStats {
                hits: 1,
                misses: 1,
                evictions: 2
            }
        );
    }

    #[test]
    fn replace_returns_the_old_handle_without_eviction() {
        let mut c: AhCache<u8> = AhCache::new(2);
        c.insert(k(1, 1), 1);
        c.insert(k(2, 1), 2);
        assert_eq!(c.insert(k(1, 1), 10), Some((k(1, 1), 1)));
        assert_eq!(c.stats().evictions, 0);
        assert_eq!(c.keys_mru(), vec![k(1, 1), k(2, 1)]);
    }

    #[test]
    fn get_or_insert_creates_once_and_reports_evictions() {
        let mut c: AhCache<u32> = AhCache::new(2);
        let mut made = 0;
        for round in 0..3 {
            for fl in [10u32, 11] {
                let (h, ev) = c
                    .get_or_try_insert_with::<()>(k(9, fl), |key| {
                        made += 1;
                        Ok(key.flow_label * 100)
                    })
                    .unwrap();
                assert_eq!(*h, fl * 100);
                assert!(ev.is_none(), "round {round}");
            }
        }
        assert_eq!(made, 2, "AHs are created once per path, not per send");
        let (h, ev) = c
            .get_or_try_insert_with::<()>(k(9, 12), |_| Ok(1200))
            .unwrap();
        assert_eq!((*h, ev), (1200, Some(1000)));
        // A failed creation leaves the cache untouched.
        let r = c.get_or_try_insert_with(k(9, 13), |_| Err("ibv_create_ah failed"));
        assert_eq!(r.err(), Some("ibv_create_ah failed"));
        assert_eq!(c.len(), 2);
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.evictions), (4, 4, 1));
    }

    #[test]
    fn capacity_one_and_drain() {
        let mut c: AhCache<u8> = AhCache::new(0);
        assert_eq!(c.capacity(), 1);
        c.insert(k(1, 0), 1);
        assert_eq!(c.insert(k(2, 0), 2), Some((k(1, 0), 1)));
        assert_eq!(c.keys_mru(), vec![k(2, 0)]);
        assert_eq!(c.drain(), vec![2]);
        assert!(c.is_empty());
        assert!(c.insert(k(3, 0), 3).is_none());
        assert_eq!(c.get(&k(3, 0)), Some(&3));
    }

    #[test]
    fn long_random_sequence_matches_a_reference_lru() {
        // Reference: a Vec ordered MRU-first.
        let mut c: AhCache<u32> = AhCache::new(5);
        let mut reference: Vec<(AhKey, u32)> = Vec::new();
        let mut x: u32 = 12345;
        for step in 0..5000u32 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let key = k((x >> 16) as u16 % 9, 0);
            if x & 1 == 0 {
                let got = c.get(&key).copied();
                let pos = reference.iter().position(|(kk, _)| *kk == key);
                assert_eq!(got, pos.map(|p| reference[p].1), "step {step}");
                if let Some(p) = pos {
                    let e = reference.remove(p);
                    reference.insert(0, e);
                }
            } else {
                let ev = c.insert(key, step);
                let want = if let Some(p) = reference.iter().position(|(kk, _)| *kk == key) {
                    let old = reference.remove(p);
                    Some(old)
                } else if reference.len() == 5 {
                    reference.pop()
                } else {
                    None
                };
                reference.insert(0, (key, step));
                assert_eq!(ev, want, "step {step}");
            }
            assert_eq!(
                c.keys_mru(),
                reference.iter().map(|(kk, _)| *kk).collect::<Vec<_>>()
            );
        }
    }
}
