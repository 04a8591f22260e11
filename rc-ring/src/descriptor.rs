//! The 40-byte connection descriptor each side passes in RDMA-CM private data.
//!
//! | off | size | field                                           |
//! |-----|------|-------------------------------------------------|
//! | 0   | 2    | wire version (1)                                |
//! | 2   | 2    | slot bytes (256)          \                     |
//! | 4   | 2    | commit offset (248)        } fixed geometry     |
//! | 6   | 2    | header bytes (128)        /                     |
//! | 8   | 8    | virtual address of the region                   |
//! | 16  | 4    | rkey                                            |
//! | 20  | 4    | slot count                                      |
//! | 24  | 8    | mapped byte length                              |
//! | 32  | 8    | connection nonce (diagnostics)                  |
//!
//! All little-endian. A provider may hand back more private data than was sent (56 bytes
//! on InfiniBand); only the 40-byte prefix is decoded.

use crate::geometry::{COMMIT_OFFSET, HEADER_BYTES, MAX_SLOTS, MIN_SLOTS, SLOT_BYTES};

pub const DESCRIPTOR_LEN: usize = 40;
pub const DESCRIPTOR_VERSION: u16 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    pub addr: u64,
    pub rkey: u32,
    pub slots: u32,
    pub mapped_len: u64,
    pub nonce: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorError {
    #[error("ring descriptor of {0} bytes: 40 are needed")]
    Short(usize),
    #[error("ring descriptor version {0}: this build speaks version 1")]
    Version(u16),
    #[error("ring descriptor geometry slot={slot} commit={commit} header={header}: expected 256/248/128")]
    Geometry { slot: u16, commit: u16, header: u16 },
    #[error("ring descriptor claims {0} slots: 2 to 16777216 are accepted")]
    Slots(u32),
    #[error("ring descriptor maps {mapped_len} bytes, fewer than its {slots} slots need")]
    Length { mapped_len: u64, slots: u32 },
    #[error("ring descriptor has a null address")]
    NullAddress,
}

impl Descriptor {
    pub fn encode(&self) -> [u8; DESCRIPTOR_LEN] {
        let mut b = [0u8; DESCRIPTOR_LEN];
        b[0..2].copy_from_slice(&DESCRIPTOR_VERSION.to_le_bytes());
        b[2..4].copy_from_slice(&(SLOT_BYTES as u16).to_le_bytes());
        b[4..6].copy_from_slice(&(COMMIT_OFFSET as u16).to_le_bytes());
        b[6..8].copy_from_slice(&(HEADER_BYTES as u16).to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        b[20..24].copy_from_slice(&self.slots.to_le_bytes());
        b[24..32].copy_from_slice(&self.mapped_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.nonce.to_le_bytes());
        b
    }

    /// Decodes the fixed prefix; a longer buffer's tail is the provider's, ignored.
    pub fn decode(b: &[u8]) -> Result<Descriptor, DescriptorError> {
        if b.len() < DESCRIPTOR_LEN {
            return Err(DescriptorError::Short(b.len()));
        }
        let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let version = u16_at(0);
        if version != DESCRIPTOR_VERSION {
            return Err(DescriptorError::Version(version));
        }
        let (slot, commit, header) = (u16_at(2), u16_at(4), u16_at(6));
        if (slot as usize, commit as usize, header as usize)
            != (SLOT_BYTES, COMMIT_OFFSET, HEADER_BYTES)
        {
            return Err(DescriptorError::Geometry {
                slot,
                commit,
                header,
            });
        }
        let d = Descriptor {
            addr: u64_at(8),
            rkey: u32_at(16),
            slots: u32_at(20),
            mapped_len: u64_at(24),
            nonce: u64_at(32),
        };
        if !(MIN_SLOTS..=MAX_SLOTS).contains(&d.slots) {
            return Err(DescriptorError::Slots(d.slots));
        }
        if d.mapped_len < (HEADER_BYTES + d.slots as usize * SLOT_BYTES) as u64 {
            return Err(DescriptorError::Length {
                mapped_len: d.mapped_len,
                slots: d.slots,
            });
        }
        if d.addr == 0 {
            return Err(DescriptorError::NullAddress);
        }
        Ok(d)
    }
}
