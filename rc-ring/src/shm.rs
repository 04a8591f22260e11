//! The shared-memory backend: the same sender and receiver over a file mapped by two
//! processes (Goblin's local ring). A WRITE becomes a copy of the payload and a release
//! store of the commit word; a credit READ an acquire load of the peer's counter.
//!
//! File layout: side A's inbound region, then side B's, each `Geometry::mapped_len` long.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::geometry::{Geometry, MAX_PAYLOAD};
use crate::region::Region;
use crate::sender::{SendError, Sender, Step};
use crate::{ProtocolError, Receiver};

/// Shared memory has no send queue; this only paces signaling like a real one.
const SQ_DEPTH: u32 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("shared ring {path}: {err}")]
    Io { path: String, err: std::io::Error },
    #[error("shared ring {path} is {found} bytes, {expected} expected (different ring size?)")]
    Size {
        path: String,
        found: u64,
        expected: u64,
    },
}

/// An I/O error about the shared file at `path`.
fn io_err(path: &Path) -> impl Fn(std::io::Error) -> ShmError + '_ {
    move |err| ShmError::Io {
        path: path.display().to_string(),
        err,
    }
}

/// One side of a pair of rings in a shared file.
pub struct ShmLink {
    base: *mut u8,
    len: usize,
    // Views into the mapping above, which lives exactly as long as this value; they are
    // never handed out, so 'static never outlives it.
    local: Region<'static>,
    peer: Region<'static>,
    sender: Sender,
    receiver: Receiver,
    credit_reads: u64,
}

// The mapping is owned by this value; the peer process is the only other party.
unsafe impl Send for ShmLink {}

impl ShmLink {
    /// Side A: creates the file (it must not exist yet), zeroed, and maps it.
    pub fn create(path: &Path, geom: Geometry) -> Result<ShmLink, ShmError> {
        let io = io_err(path);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            // A fresh file only: an old ring's sequences would read as a protocol error.
            .create_new(true)
            .open(path)
            .map_err(&io)?;
        f.set_len(2 * geom.mapped_len() as u64).map_err(&io)?;
        Self::map(path, &f, geom, Side::A)
    }

    /// Side B: maps a file side A created with the same geometry.
    pub fn open(path: &Path, geom: Geometry) -> Result<ShmLink, ShmError> {
        let io = io_err(path);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(&io)?;
        let found = f.metadata().map_err(&io)?.len();
        let expected = 2 * geom.mapped_len() as u64;
        if found != expected {
            return Err(ShmError::Size {
                path: path.display().to_string(),
                found,
                expected,
            });
        }
        Self::map(path, &f, geom, Side::B)
    }

    fn map(
        path: &Path,
        f: &std::fs::File,
        geom: Geometry,
        side: Side,
    ) -> Result<ShmLink, ShmError> {
        let len = 2 * geom.mapped_len();
        // SAFETY: a fresh shared mapping of a file we hold open; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(ShmError::Io {
                path: path.display().to_string(),
                err: std::io::Error::last_os_error(),
            });
        }
        let base = p as *mut u8;
        let half = geom.mapped_len();
        // SAFETY: both halves lie inside the mapping, page-aligned.
        let (a, b) = unsafe {
            (
                Region::from_raw(base, half),
                Region::from_raw(base.add(half), half),
            )
        };
        let (local, peer) = match side {
            Side::A => (a, b),
            Side::B => (b, a),
        };
        Ok(ShmLink {
            base,
            len,
            local,
            peer,
            sender: Sender::new(geom, SQ_DEPTH),
            receiver: Receiver::new(geom),
            credit_reads: 0,
        })
    }

    /// Credit reads issued so far (each one means the cached view said full).
    pub fn credit_reads(&self) -> u64 {
        self.credit_reads
    }

    /// Sends one message; `Ok(false)` when the peer's ring is full (exact credits).
    pub fn try_send(&mut self, payload: &[u8]) -> Result<bool, SendError> {
        for _ in 0..2 {
            match self.sender.send(payload)? {
                Step::Write(op) => {
                    let peer = self.peer;
                    peer.copy_in(op.remote_offset, op.payload());
                    peer.store_release(op.commit_offset(), op.commit());
                    if op.signaled {
                        self.sender.write_completed(op.wr_id)?;
                    }
                    return Ok(true);
                }
                Step::ReadCredit(read) => {
                    let consumed = self.peer.load_acquire(read.remote_offset);
                    self.local.store_release(read.local_offset, consumed);
                    self.credit_reads += 1;
                    self.sender.credit_read_completed(read.wr_id, consumed)?;
                    // Retry once with the fresh view.
                }
                Step::Backpressured | Step::QueueFull => return Ok(false),
            }
        }
        Ok(false)
    }

    /// Receives one message if the next slot is published.
    pub fn try_recv(
        &mut self,
        out: &mut [u8; MAX_PAYLOAD],
    ) -> Result<Option<usize>, ProtocolError> {
        self.receiver.recv(self.local, out)
    }
}

impl Drop for ShmLink {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

impl crate::stress::RingLink for ShmLink {
    fn try_send(&mut self, payload: &[u8]) -> Result<bool, String> {
        ShmLink::try_send(self, payload).map_err(|e| e.to_string())
    }

    fn try_recv(&mut self, out: &mut [u8; MAX_PAYLOAD]) -> Result<Option<usize>, String> {
        ShmLink::try_recv(self, out).map_err(|e| e.to_string())
    }

    fn idle(&mut self) {
        std::hint::spin_loop();
    }
}
