//! Receiver-polled one-sided RC WRITE rings (seed 001, Goblin's layout), sans-IO.
//!
//! A [`Sender`] turns payloads into inline RDMA WRITEs of payload + commit word into the
//! peer's ring and keeps exact credits; a [`Receiver`] polls the commit word of the next
//! slot. Neither touches verbs: a backend performs the operations they emit. [`shm`] is
//! the shared-memory backend (two processes, Goblin's local ring); the verbs backend with
//! RDMA-CM is `rpingmesh_verbs::rdma::rc_ring`. [`echo`] is the depth-one echo probe the
//! agent runs over a ring.

pub mod descriptor;
pub mod echo;
pub mod frag;
pub mod geometry;
pub mod receiver;
pub mod region;
pub mod sender;
pub mod shm;
pub mod stress;

pub use descriptor::{Descriptor, DescriptorError, DESCRIPTOR_LEN};
pub use geometry::{Geometry, GeometryError, MAX_PAYLOAD};
pub use receiver::{Published, Receiver};
pub use region::{HeapRegion, Region};
pub use sender::{CreditRead, SendError, Sender, Step, WriteOp, TORN_READS_TOLERATED};

/// A broken ring: the connection must be torn down (a sequence or credit the protocol
/// cannot produce means the peer or the memory is not what we think).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("slot holds sequence {found}, ahead of the expected {expected}")]
    FutureSequence { expected: u64, found: u64 },
    #[error("sequence {seq} committed with length {len} (1..=192 allowed)")]
    BadLength { seq: u64, len: usize },
    #[error("credit read says {consumed} consumed; cached {cached}, written {written}")]
    BadCredit {
        consumed: u64,
        cached: u64,
        written: u64,
    },
    #[error("completion for work request {wr_id}, which is not outstanding")]
    UnexpectedCompletion { wr_id: u64 },
    #[error("the 56-bit sequence space is used up: reconnect")]
    SequenceExhausted,
}
