//! Messages longer than one slot, as a sequence of ring messages. Each fragment starts with
//! one flag byte (bit 0: more fragments follow), so a fragment carries up to 191 bytes.

use crate::geometry::MAX_PAYLOAD;

pub const FRAGMENT_DATA: usize = MAX_PAYLOAD - 1;
const MORE: u8 = 1;

/// Splits `msg` into ring payloads (an empty message is one empty final fragment).
pub fn fragments(msg: &[u8]) -> impl Iterator<Item = ([u8; MAX_PAYLOAD], usize)> + '_ {
    let n = msg.len().div_ceil(FRAGMENT_DATA).max(1);
    (0..n).map(move |i| {
        let chunk = &msg[i * FRAGMENT_DATA..((i + 1) * FRAGMENT_DATA).min(msg.len())];
        let mut out = [0u8; MAX_PAYLOAD];
        out[0] = if i + 1 < n { MORE } else { 0 };
        out[1..1 + chunk.len()].copy_from_slice(chunk);
        (out, 1 + chunk.len())
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReassemblyError {
    #[error("fragmented message longer than the {limit}-byte limit")]
    TooLong { limit: usize },
    #[error("fragment with unknown flags {0:#04x}")]
    BadFlags(u8),
    #[error("empty fragment (no flag byte)")]
    Empty,
}

/// Joins fragments back into messages, bounded by `limit` bytes.
#[derive(Debug)]
pub struct Reassembler {
    buf: Vec<u8>,
    limit: usize,
}

impl Reassembler {
    pub fn new(limit: usize) -> Reassembler {
        Reassembler {
            buf: Vec::new(),
            limit,
        }
    }

    /// Feeds one ring payload; returns a whole message when its last fragment arrives.
    /// After an error the partial message is dropped and the next fragment starts afresh.
    pub fn push(&mut self, payload: &[u8]) -> Result<Option<Vec<u8>>, ReassemblyError> {
        let (&flags, data) = payload.split_first().ok_or(ReassemblyError::Empty)?;
        if flags & !MORE != 0 {
            self.buf.clear();
            return Err(ReassemblyError::BadFlags(flags));
        }
        if self.buf.len() + data.len() > self.limit {
            self.buf.clear();
            return Err(ReassemblyError::TooLong { limit: self.limit });
        }
        self.buf.extend_from_slice(data);
        if flags & MORE != 0 {
            return Ok(None);
        }
        Ok(Some(std::mem::take(&mut self.buf)))
    }
}
