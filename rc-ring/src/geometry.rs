//! The ring's fixed layout (seed 001): 256-byte slots behind a 128-byte control header.
//!
//! ```text
//! region + 0    header (128 B): +0 consumed sequence (LE u64, owned by the receiver,
//!                                  read by the peer's credit READ)
//!                               +64 credit landing word (where our own credit READ of
//!                                  the peer's consumed sequence lands)
//! region + 128  slot 0 .. slot n-1, 256 B each:
//!               | reserved / prior bytes | payload (1..=192 B) | commit word (LE u64) |
//!               0                       248-len              248                    256
//! then padding to a page.
//! ```
//! The commit word is `(sequence << 8) | length`; sequences start at 1 and use 56 bits, so
//! the sequence a slot holds from an earlier lap is always older than the expected one.

pub const SLOT_BYTES: usize = 256;
/// Where a slot's commit word sits.
pub const COMMIT_OFFSET: usize = 248;
pub const MAX_PAYLOAD: usize = 192;
/// Payload plus commit: the largest RDMA WRITE the ring posts (fits one 256-byte MTU).
pub const MAX_WRITE: usize = MAX_PAYLOAD + 8;
pub const HEADER_BYTES: usize = 128;
/// Header word holding the receiver's last consumed sequence.
pub const CONSUMED_OFFSET: usize = 0;
/// Header word where the sender's credit READ lands (its own cache line).
pub const CREDIT_LANDING_OFFSET: usize = 64;
pub const MIN_SLOTS: u32 = 2;
/// Far beyond any sane ring (4 GiB of slots); bounds what a peer's descriptor may claim.
pub const MAX_SLOTS: u32 = 1 << 24;
pub const SEQ_BITS: u32 = 56;
/// The largest sequence a commit word can hold.
pub const SEQ_MAX: u64 = (1 << SEQ_BITS) - 1;
pub const FIRST_SEQ: u64 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum GeometryError {
    #[error("a ring of {budget} bytes holds {slots} slot(s) of 256 bytes; at least 2 are needed")]
    TooSmall { budget: usize, slots: usize },
    #[error("a ring of {slots} slots is beyond the supported {MAX_SLOTS}")]
    TooLarge { slots: usize },
    #[error("page size {0} is not a power of two")]
    BadPage(usize),
}

/// Slot count and mapped length of one inbound ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    slots: u32,
    mapped_len: usize,
}

impl Geometry {
    /// `budget` bytes of inbound ring (the seed's SIZE): floor(budget / 256) slots plus the
    /// header, rounded up to a page.
    pub fn for_budget(budget: usize, page: usize) -> Result<Geometry, GeometryError> {
        if !page.is_power_of_two() {
            return Err(GeometryError::BadPage(page));
        }
        let slots = budget / SLOT_BYTES;
        if slots < MIN_SLOTS as usize {
            return Err(GeometryError::TooSmall { budget, slots });
        }
        if slots > MAX_SLOTS as usize {
            return Err(GeometryError::TooLarge { slots });
        }
        let raw = HEADER_BYTES + slots * SLOT_BYTES;
        Ok(Geometry {
            slots: slots as u32,
            mapped_len: raw.div_ceil(page) * page,
        })
    }

    /// The geometry a peer's (already validated) descriptor announces.
    pub fn from_descriptor(d: &crate::Descriptor) -> Geometry {
        Geometry {
            slots: d.slots,
            mapped_len: d.mapped_len as usize,
        }
    }

    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Bytes the region occupies (and is registered with).
    pub fn mapped_len(&self) -> usize {
        self.mapped_len
    }

    /// The slot a sequence lands in: sequence 1 in slot 0.
    pub fn slot_of(&self, seq: u64) -> usize {
        ((seq - 1) % self.slots as u64) as usize
    }

    /// Offset of the commit word for `seq` within the region.
    pub fn commit_offset(&self, seq: u64) -> usize {
        HEADER_BYTES + self.slot_of(seq) * SLOT_BYTES + COMMIT_OFFSET
    }
}

pub fn commit_word(seq: u64, len: usize) -> u64 {
    debug_assert!(seq <= SEQ_MAX && (1..=MAX_PAYLOAD).contains(&len));
    (seq << 8) | len as u64
}

/// (sequence, length) of a commit word.
pub fn split_commit(word: u64) -> (u64, usize) {
    (word >> 8, (word & 0xff) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_map_to_the_seeds_geometry() {
        let g = Geometry::for_budget(64 * 1024, 4096).unwrap();
        assert_eq!(g.slots(), 256);
        assert_eq!(
            g.mapped_len(),
            69632,
            "header pushes 64 KiB of slots into a 17th page"
        );
        let g = Geometry::for_budget(4096, 4096).unwrap();
        assert_eq!(g.slots(), 16, "the seed's 4 KiB ring has 16 slots");
        assert_eq!(g.mapped_len(), 8192);
        assert_eq!(Geometry::for_budget(600, 4096).unwrap().slots(), 2);
        assert_eq!(
            Geometry::for_budget(511, 4096),
            Err(GeometryError::TooSmall {
                budget: 511,
                slots: 1
            })
        );
        assert!(Geometry::for_budget(4096, 3000).is_err());
    }

    #[test]
    fn commit_words_and_offsets() {
        let g = Geometry::for_budget(4096, 4096).unwrap();
        assert_eq!(g.commit_offset(1), 128 + 248);
        assert_eq!(g.commit_offset(16), 128 + 15 * 256 + 248);
        assert_eq!(g.commit_offset(17), g.commit_offset(1));
        let w = commit_word(SEQ_MAX, 192);
        assert_eq!(split_commit(w), (SEQ_MAX, 192));
        assert_eq!(split_commit(commit_word(1, 2)), (1, 2));
    }
}
