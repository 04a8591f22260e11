//! Bounded lock-free single-producer single-consumer queue from a device's poller thread
//! to the async agent. A full queue never blocks the producer: the item is dropped and
//! counted (`rpingmesh.event_ring_dropped_total`), since a stalled poller would let the
//! CQ overflow and take the QP to the error state.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

struct Shared<T> {
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    /// Next slot to read; written only by the consumer.
    head: AtomicUsize,
    /// Next slot to write; written only by the producer.
    tail: AtomicUsize,
    dropped: AtomicU64,
    pushed: AtomicU64,
    producer_alive: AtomicBool,
}

// SAFETY: a slot is accessed by the producer only while it is outside [head, tail) and by
// the consumer only while inside; head/tail hand slots over with Release/Acquire, so no
// slot is ever accessed from two threads at once. T moves between threads, hence T: Send.
unsafe impl<T: Send> Sync for Shared<T> {}
unsafe impl<T: Send> Send for Shared<T> {}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        let cap = self.slots.len();
        let mut h = *self.head.get_mut();
        let t = *self.tail.get_mut();
        while h != t {
            // SAFETY: slots in [head, tail) are initialised and nobody else is left.
            unsafe { self.slots[h % cap].get_mut().assume_init_drop() };
            h = h.wrapping_add(1);
        }
    }
}

/// The poller's end.
pub struct Producer<T> {
    shared: Arc<Shared<T>>,
}

/// The agent's end.
pub struct Consumer<T> {
    shared: Arc<Shared<T>>,
}

/// Drop and delivery counters, readable from either end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingStats {
    pub pushed: u64,
    pub dropped: u64,
}

/// A queue holding up to `capacity` items (at least 1).
pub fn channel<T: Send>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    let capacity = capacity.max(1);
    let slots = (0..capacity)
        .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
        .collect::<Vec<_>>()
        .into_boxed_slice();
    let shared = Arc::new(Shared {
        slots,
        head: AtomicUsize::new(0),
        tail: AtomicUsize::new(0),
        dropped: AtomicU64::new(0),
        pushed: AtomicU64::new(0),
        producer_alive: AtomicBool::new(true),
    });
    (
        Producer {
            shared: shared.clone(),
        },
        Consumer { shared },
    )
}

fn stats<T>(s: &Shared<T>) -> RingStats {
    RingStats {
        pushed: s.pushed.load(Ordering::Relaxed),
        dropped: s.dropped.load(Ordering::Relaxed),
    }
}

impl<T> Producer<T> {
    /// Enqueues `item`; when full it is dropped, counted, and handed back.
    pub fn push(&mut self, item: T) -> Result<(), T> {
        let s = &*self.shared;
        let cap = s.slots.len();
        let tail = s.tail.load(Ordering::Relaxed);
        let head = s.head.load(Ordering::Acquire);
        if tail.wrapping_sub(head) >= cap {
            s.dropped.fetch_add(1, Ordering::Relaxed);
            return Err(item);
        }
        // SAFETY: the slot at `tail` is outside [head, tail): the consumer does not touch it
        // (see the Sync impl), and `&mut self` makes this the only producer.
        unsafe { (*s.slots[tail % cap].get()).write(item) };
        s.tail.store(tail.wrapping_add(1), Ordering::Release);
        s.pushed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub fn stats(&self) -> RingStats {
        stats(&self.shared)
    }
}

impl<T> Drop for Producer<T> {
    fn drop(&mut self) {
        self.shared.producer_alive.store(false, Ordering::Release);
    }
}

impl<T> Consumer<T> {
    pub fn pop(&mut self) -> Option<T> {
        let s = &*self.shared;
        let cap = s.slots.len();
        let head = s.head.load(Ordering::Relaxed);
        let tail = s.tail.load(Ordering::Acquire);
        if head == tail {
            return None;
        }
        // SAFETY: `head` is inside [head, tail), so the producer finished writing it
        // (Acquire above) and will not touch it until head moves past it.
        let item = unsafe { (*s.slots[head % cap].get()).assume_init_read() };
        s.head.store(head.wrapping_add(1), Ordering::Release);
        Some(item)
    }

    /// Moves everything queued now into `out`; returns how many.
    pub fn drain_into(&mut self, out: &mut Vec<T>) -> usize {
        let mut n = 0;
        while let Some(x) = self.pop() {
            out.push(x);
            n += 1;
        }
        n
    }

    pub fn len(&self) -> usize {
        let s = &*self.shared;
        s.tail
            .load(Ordering::Acquire)
            .wrapping_sub(s.head.load(Ordering::Relaxed))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// False once the producer (the poller thread) is gone.
    pub fn producer_alive(&self) -> bool {
        self.shared.producer_alive.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> RingStats {
        stats(&self.shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_overflow_accounting() {
        let (mut p, mut c) = channel::<u32>(4);
        for i in 0..4 {
            p.push(i).unwrap();
        }
        // Full: the producer is refused immediately and the drop is counted.
        assert_eq!(p.push(99), Err(99));
        assert_eq!(p.push(100), Err(100));
        assert_eq!(
            c.stats(),
            RingStats {
                pushed: 4,
                dropped: 2
            }
        );
        assert_eq!(c.len(), 4);
        assert_eq!(c.pop(), Some(0));
        p.push(4).unwrap();
        let mut out = Vec::new();
        assert_eq!(c.drain_into(&mut out), 4);
        assert_eq!(out, vec![1, 2, 3, 4]);
        assert!(c.is_empty());
        assert_eq!(
            p.stats(),
            RingStats {
                pushed: 5,
                dropped: 2
            }
        );
    }

    #[test]
    fn zero_capacity_is_one() {
        let (mut p, mut c) = channel::<u8>(0);
        p.push(1).unwrap();
        assert!(p.push(2).is_err());
        assert_eq!(c.pop(), Some(1));
    }

    #[test]
    fn producer_liveness() {
        let (p, c) = channel::<u8>(2);
        assert!(c.producer_alive());
        drop(p);
        assert!(!c.producer_alive());
    }

    #[test]
    fn drops_queued_items_with_the_queue() {
        let item = Arc::new(());
        let (mut p, c) = channel::<Arc<()>>(8);
        for _ in 0..5 {
            p.push(item.clone()).unwrap();
        }
        assert_eq!(Arc::strong_count(&item), 6);
        drop(p);
        drop(c);
        assert_eq!(Arc::strong_count(&item), 1);
    }

    #[test]
    fn threads_deliver_in_order_and_count_every_loss() {
        const N: u64 = 200_000;
        let (mut p, mut c) = channel::<u64>(64);
        let prod = std::thread::spawn(move || {
            let mut refused = 0u64;
            for i in 0..N {
                if p.push(i).is_err() {
                    refused += 1;
                }
            }
            refused
        });
        let mut got = Vec::new();
        loop {
            let alive = c.producer_alive();
            c.drain_into(&mut got);
            if !alive && c.is_empty() {
                break;
            }
            std::hint::spin_loop();
        }
        let refused = prod.join().unwrap();
        assert!(got.windows(2).all(|w| w[0] < w[1]), "order broken");
        assert_eq!(got.len() as u64 + refused, N);
        assert_eq!(
            c.stats(),
            RingStats {
                pushed: got.len() as u64,
                dropped: refused
            }
        );
    }
}
