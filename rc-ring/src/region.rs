//! A view of the bytes a ring lives in. The peer (a NIC's DMA, or another process through
//! shared memory) writes them concurrently, so words are read with atomics and every
//! access is bounds-checked here, once.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

/// Borrowed view of a ring region (8-byte aligned). Copy: it is only a pointer and a length.
#[derive(Clone, Copy)]
pub struct Region<'a> {
    base: *mut u8,
    len: usize,
    _owner: PhantomData<&'a [AtomicU64]>,
}

// The region is shared memory by design; all cross-party ordering goes through the
// acquire/release words below.
unsafe impl Send for Region<'_> {}
unsafe impl Sync for Region<'_> {}

impl<'a> Region<'a> {
    /// # Safety
    /// `base..base+len` must stay mapped and writable for `'a`, and `base` be 8-aligned.
    pub unsafe fn from_raw(base: *mut u8, len: usize) -> Region<'a> {
        assert_eq!(base as usize % 8, 0, "ring regions are 8-byte aligned");
        Region {
            base,
            len,
            _owner: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= self.len,
            "word at {off} outside the region"
        );
        // SAFETY: in bounds and aligned (checked); the memory lives for 'a.
        unsafe { AtomicU64::from_ptr(self.base.add(off) as *mut u64) }
    }

    /// Little-endian word, acquire: bytes published before it are visible after.
    pub fn load_acquire(&self, off: usize) -> u64 {
        u64::from_le(self.word(off).load(Ordering::Acquire))
    }

    pub fn store_release(&self, off: usize, v: u64) {
        self.word(off).store(v.to_le(), Ordering::Release)
    }

    /// Plain copy out; callers read only bytes an acquire load has published.
    pub fn copy_out(&self, off: usize, out: &mut [u8]) {
        assert!(off + out.len() <= self.len, "read outside the region");
        // SAFETY: bounds checked; the writer does not touch published, unconsumed bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(off), out.as_mut_ptr(), out.len()) }
    }

    /// Plain copy in; the bytes are published by a later release store.
    pub fn copy_in(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len, "write outside the region");
        // SAFETY: bounds checked; the reader does not read unpublished bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(off), data.len()) }
    }
}

/// A zeroed, heap-backed region: the ring's logic in tests and in one process.
pub struct HeapRegion {
    words: Box<[AtomicU64]>,
}

impl HeapRegion {
    pub fn zeroed(len: usize) -> HeapRegion {
        HeapRegion {
            words: (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub fn region(&self) -> Region<'_> {
        // SAFETY: the words live as long as the borrow; AtomicU64 gives interior
        // mutability, so writes through the shared borrow are sound.
        unsafe { Region::from_raw(self.words.as_ptr() as *mut u8, self.words.len() * 8) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_little_endian_and_bounds_checked() {
        let h = HeapRegion::zeroed(16);
        let r = h.region();
        r.store_release(8, 0x0102);
        let mut b = [0u8; 2];
        r.copy_out(8, &mut b);
        assert_eq!(b, [2, 1]);
        assert_eq!(r.load_acquire(8), 0x0102);
        assert!(std::panic::catch_unwind(|| r.load_acquire(12)).is_err());
        assert!(std::panic::catch_unwind(|| r.copy_in(10, &[0; 8])).is_err());
    }
}
