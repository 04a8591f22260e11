//! The polling side: reads the commit word of the next expected slot.

use crate::geometry::{split_commit, Geometry, CONSUMED_OFFSET, FIRST_SEQ, MAX_PAYLOAD, SEQ_MAX};
use crate::region::Region;
use crate::ProtocolError;

/// Receiver state of one inbound ring. It owns the ring's consumed counter.
#[derive(Debug)]
pub struct Receiver {
    geom: Geometry,
    expected: u64,
}

/// A published message, not yet consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub seq: u64,
    pub len: usize,
    offset: usize,
}

impl Receiver {
    /// A fresh ring: expects sequence 1 (the region is zeroed: every slot reads as older).
    pub fn new(geom: Geometry) -> Receiver {
        Receiver {
            geom,
            expected: FIRST_SEQ,
        }
    }

    /// A ring whose first sequence is `first` (tests near 2^56). Stores `first - 1` as the
    /// consumed counter, which is what the sender's credit reads will see.
    pub fn starting_at(geom: Geometry, first: u64, region: Region<'_>) -> Receiver {
        assert!((FIRST_SEQ..=SEQ_MAX).contains(&first));
        region.store_release(CONSUMED_OFFSET, first - 1);
        Receiver {
            geom,
            expected: first,
        }
    }

    pub fn expected(&self) -> u64 {
        self.expected
    }

    /// Acquire-loads the expected slot's commit word: the exact sequence publishes the
    /// payload, an older one means empty, a newer one is a protocol failure.
    pub fn poll(&self, region: Region<'_>) -> Result<Option<Published>, ProtocolError> {
        if self.expected > SEQ_MAX {
            return Err(ProtocolError::SequenceExhausted);
        }
        let commit_at = self.geom.commit_offset(self.expected);
        let (seq, len) = split_commit(region.load_acquire(commit_at));
        if seq < self.expected {
            return Ok(None);
        }
        if seq > self.expected {
            return Err(ProtocolError::FutureSequence {
                expected: self.expected,
                found: seq,
            });
        }
        if len == 0 || len > MAX_PAYLOAD {
            return Err(ProtocolError::BadLength { seq, len });
        }
        Ok(Some(Published {
            seq,
            len,
            offset: commit_at - len,
        }))
    }

    /// Copies a published payload out (`out` at least `msg.len` long).
    pub fn read(&self, region: Region<'_>, msg: &Published, out: &mut [u8]) {
        region.copy_out(msg.offset, &mut out[..msg.len]);
    }

    /// Frees the slot: release-stores its sequence as the consumed counter.
    pub fn consume(&mut self, region: Region<'_>, msg: &Published) {
        debug_assert_eq!(msg.seq, self.expected);
        region.store_release(CONSUMED_OFFSET, msg.seq);
        self.expected += 1;
    }

    /// Poll, copy and consume in one: the usual path. Returns the payload length.
    pub fn recv(
        &mut self,
        region: Region<'_>,
        out: &mut [u8; MAX_PAYLOAD],
    ) -> Result<Option<usize>, ProtocolError> {
        let Some(msg) = self.poll(region)? else {
            return Ok(None);
        };
        self.read(region, &msg, out);
        self.consume(region, &msg);
        Ok(Some(msg.len))
    }
}
