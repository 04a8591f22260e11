//! The writing side: turns payloads into one inline RDMA WRITE each, keeps exact credits
//! from a cached view of the peer's consumed counter, and decides which work requests are
//! signaled. It emits operations; a backend (verbs, or shared memory) performs them.

use crate::geometry::{
    commit_word, Geometry, CONSUMED_OFFSET, CREDIT_LANDING_OFFSET, FIRST_SEQ, MAX_PAYLOAD,
    MAX_WRITE, SEQ_MAX,
};
use crate::ProtocolError;

/// Writes are signaled every 32 work requests (fewer when the send queue is small).
pub const SIGNAL_EVERY: u32 = 32;

/// One inline RDMA WRITE: payload then commit word, ending at the slot's byte 256.
#[derive(Debug, Clone, Copy)]
pub struct WriteOp {
    pub seq: u64,
    /// Offset in the peer's region where the write starts.
    pub remote_offset: usize,
    pub wr_id: u64,
    pub signaled: bool,
    len: usize,
    buf: [u8; MAX_WRITE],
}

impl WriteOp {
    /// Payload followed by the little-endian commit word (the whole write).
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    pub fn payload(&self) -> &[u8] {
        &self.buf[..self.len - 8]
    }

    pub fn commit(&self) -> u64 {
        u64::from_le_bytes(self.buf[self.len - 8..self.len].try_into().unwrap())
    }

    /// Where the commit word goes in the peer's region.
    pub fn commit_offset(&self) -> usize {
        self.remote_offset + self.len - 8
    }
}

/// The signaled 8-byte RDMA READ of the peer's consumed counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreditRead {
    pub wr_id: u64,
    pub remote_offset: usize,
    /// Where the value lands in our own region.
    pub local_offset: usize,
}

/// What the caller must do for one `send`.
#[derive(Debug, Clone, Copy)]
// The write is the hot path: boxing it would allocate per message.
#[allow(clippy::large_enum_variant)]
pub enum Step {
    /// Post this write: the message is sent.
    Write(WriteOp),
    /// The cached view says full: post this read, then retry after its completion.
    ReadCredit(CreditRead),
    /// Full, and a credit read is already in flight: wait for its completion.
    Backpressured,
    /// The send queue holds as many work requests as it can: wait for a completion.
    QueueFull,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("payload of {0} bytes: a ring message is 1 to 192 bytes")]
    BadPayload(usize),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
}

/// Impossible credit counts in a row taken as torn reads before the ring is broken.
pub const TORN_READS_TOLERATED: u32 = 3;

#[derive(Debug)]
pub struct Sender {
    geom: Geometry,
    next_seq: u64,
    /// The peer's consumed sequence as last read (exact credits: never ahead of the truth).
    cached_consumed: u64,
    credit_read: Option<u64>,
    /// Credit reads in a row whose value was impossible (see `credit_read_completed`).
    impossible_in_a_row: u32,
    /// Credit reads discarded as torn, from the start.
    discarded_credit_reads: u64,
    sq_depth: u32,
    signal_every: u32,
    /// Work requests posted and known complete; RC completes them in order.
    posted: u64,
    retired: u64,
}

impl Sender {
    /// A sender into a peer ring of `geom`, over a send queue of `sq_depth` entries.
    pub fn new(geom: Geometry, sq_depth: u32) -> Sender {
        Sender::starting_at(geom, sq_depth, FIRST_SEQ)
    }

    pub fn starting_at(geom: Geometry, sq_depth: u32, first: u64) -> Sender {
        assert!(sq_depth >= 1 && (FIRST_SEQ..=SEQ_MAX).contains(&first));
        Sender {
            geom,
            next_seq: first,
            cached_consumed: first - 1,
            credit_read: None,
            impossible_in_a_row: 0,
            discarded_credit_reads: 0,
            sq_depth,
            // Leave room to keep posting while a signaled WR completes.
            signal_every: SIGNAL_EVERY.min((sq_depth / 2).max(1)),
            posted: 0,
            retired: 0,
        }
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    pub fn signal_every(&self) -> u32 {
        self.signal_every
    }

    /// Messages written and not yet known consumed (by the cached view).
    pub fn in_flight(&self) -> u64 {
        self.next_seq - 1 - self.cached_consumed
    }

    pub fn outstanding_wrs(&self) -> u64 {
        self.posted - self.retired
    }

    /// The work request id of the credit read in flight, if any.
    pub fn credit_read_in_flight(&self) -> Option<u64> {
        self.credit_read
    }

    pub fn send(&mut self, payload: &[u8]) -> Result<Step, SendError> {
        if payload.is_empty() || payload.len() > MAX_PAYLOAD {
            return Err(SendError::BadPayload(payload.len()));
        }
        if self.next_seq > SEQ_MAX {
            return Err(ProtocolError::SequenceExhausted.into());
        }
        if self.outstanding_wrs() >= self.sq_depth as u64 {
            return Ok(Step::QueueFull);
        }
        if self.in_flight() >= self.geom.slots() as u64 {
            if self.credit_read.is_some() {
                return Ok(Step::Backpressured);
            }
            let wr_id = self.post();
            self.credit_read = Some(wr_id);
            return Ok(Step::ReadCredit(CreditRead {
                wr_id,
                remote_offset: CONSUMED_OFFSET,
                local_offset: CREDIT_LANDING_OFFSET,
            }));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let len = payload.len() + 8;
        let mut buf = [0u8; MAX_WRITE];
        buf[..payload.len()].copy_from_slice(payload);
        buf[payload.len()..len].copy_from_slice(&commit_word(seq, payload.len()).to_le_bytes());
        let signaled = (self.posted + 1).is_multiple_of(self.signal_every as u64);
        let wr_id = self.post();
        Ok(Step::Write(WriteOp {
            seq,
            remote_offset: self.geom.commit_offset(seq) - payload.len(),
            wr_id,
            signaled,
            len,
            buf,
        }))
    }

    fn post(&mut self) -> u64 {
        let id = self.posted;
        self.posted += 1;
        id
    }

    /// A signaled write's completion: it and every WR posted before it are done.
    pub fn write_completed(&mut self, wr_id: u64) -> Result<(), ProtocolError> {
        self.retire(wr_id)
    }

    /// The credit read's completion with the value that landed.
    pub fn credit_read_completed(
        &mut self,
        wr_id: u64,
        consumed: u64,
    ) -> Result<(), ProtocolError> {
        if self.credit_read != Some(wr_id) {
            return Err(ProtocolError::UnexpectedCompletion { wr_id });
        }
        self.credit_read = None;
        self.retire(wr_id)?;
        // The peer cannot have consumed what we never wrote, nor un-consume. An RDMA READ
        // is not atomic against the peer's store: a provider that copies byte by byte
        // (rxe under emulation does) can land the low bytes of the old count under the
        // high bytes of the new one. Such a read is dropped and the credit read again;
        // only a count that stays impossible is a broken peer.
        if consumed < self.cached_consumed || consumed > self.next_seq - 1 {
            self.impossible_in_a_row += 1;
            if self.impossible_in_a_row > TORN_READS_TOLERATED {
                return Err(ProtocolError::BadCredit {
                    consumed,
                    cached: self.cached_consumed,
                    written: self.next_seq - 1,
                });
            }
            self.discarded_credit_reads += 1;
            return Ok(());
        }
        self.impossible_in_a_row = 0;
        self.cached_consumed = consumed;
        Ok(())
    }

    /// Credit reads dropped as torn (an impossible count, read again), from the start.
    pub fn discarded_credit_reads(&self) -> u64 {
        self.discarded_credit_reads
    }

    fn retire(&mut self, wr_id: u64) -> Result<(), ProtocolError> {
        if wr_id >= self.posted || wr_id < self.retired {
            return Err(ProtocolError::UnexpectedCompletion { wr_id });
        }
        self.retired = wr_id + 1;
        Ok(())
    }
}
