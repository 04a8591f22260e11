//! The receiving half of the udp endpoint: `recvmmsg` in batches, only on the queue that
//! epoll says is ready (received datagrams with their RX timestamps, or TX timestamps on
//! the error queue), and the bounds-checked reading of their control messages.

use super::*;

/// Datagrams (or error-queue entries) taken per recvmmsg call.
pub(super) const RECV_BATCH: usize = 64;
/// Per-datagram control space: SCM_TIMESTAMPING (3 timespecs) plus IP(V6)_RECVERR with
/// its offender address fit with room to spare.
const RECV_CTL_LEN: usize = 192;

#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct RecvCtl([u8; RECV_CTL_LEN]);

/// Reusable receive buffers for one recvmmsg call (kept per endpoint: no per-call
/// zeroing of several KiB). The headers point into the same (boxed, never moved) slots
/// from the start; a call resets only the lengths and flags of the entries the last call
/// may have written.
pub(super) struct RecvSlots {
    data: [[u8; RECV_DATA_LEN]; RECV_BATCH],
    ctl: [RecvCtl; RECV_BATCH],
    addr: [libc::sockaddr_storage; RECV_BATCH],
    iov: [libc::iovec; RECV_BATCH],
    hdr: [libc::mmsghdr; RECV_BATCH],
    /// Entries the kernel may have written since their last reset.
    dirty: usize,
}

// SAFETY: the raw pointers inside `iov`/`hdr` only ever point into the same boxed
// RecvSlots; the slots are reached through a Mutex.
unsafe impl Send for RecvSlots {}

impl RecvSlots {
    pub(super) fn new() -> Box<RecvSlots> {
        // SAFETY: every field is plain data for which all-zero bytes are valid; the
        // pointers are set below, once the box has its final address.
        let mut s: Box<RecvSlots> = Box::new(unsafe { zeroed() });
        let s_ref: &mut RecvSlots = &mut s;
        for i in 0..RECV_BATCH {
            s_ref.iov[i] = libc::iovec {
                iov_base: s_ref.data[i].as_mut_ptr() as *mut libc::c_void,
                iov_len: RECV_DATA_LEN,
            };
            let h = &mut s_ref.hdr[i].msg_hdr;
            h.msg_name = &mut s_ref.addr[i] as *mut _ as *mut libc::c_void;
            h.msg_iov = &mut s_ref.iov[i];
            h.msg_iovlen = 1;
            h.msg_control = s_ref.ctl[i].0.as_mut_ptr() as *mut libc::c_void;
        }
        s_ref.dirty = RECV_BATCH;
        s
    }

    /// Resets what recvmmsg writes back (name and control lengths, flags, length) in the
    /// entries it may have used.
    fn reset(&mut self) {
        for m in &mut self.hdr[..self.dirty] {
            m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            m.msg_hdr.msg_controllen = RECV_CTL_LEN as _;
            m.msg_hdr.msg_flags = 0;
            m.msg_len = 0;
        }
        self.dirty = 0;
    }
}

impl UdpEndpoint {
    /// Waits until at least one event is available, then appends everything ready
    /// (received datagrams and send completions) to `out`.
    pub async fn wait_events(&self, out: &mut Vec<TransportEvent>) -> std::io::Result<()> {
        loop {
            let mut guard = self.fd.ready(Interest::READABLE | Interest::ERROR).await?;
            let ready = guard.ready();
            let before = out.len();
            // Read only the queue epoll named. Readiness is cleared only for a queue seen
            // empty; tokio keeps readiness that arrived after `ready()` returned, so no
            // edge is lost.
            let mut empty = Ready::EMPTY;
            let (data, err) = if ready.is_readable() || ready.is_error() {
                (ready.is_readable(), ready.is_error())
            } else {
                (true, true) // e.g. a closed state only: look at both, clear both
            };
            if data && self.recv_batch(false, out)? {
                empty |= Ready::READABLE;
            }
            if err && self.recv_batch(true, out)? {
                empty |= Ready::ERROR;
            }
            guard.clear_ready_matching(empty);
            if out.len() > before {
                return Ok(());
            }
        }
    }

    /// Non-blocking: appends whatever is ready now on both queues.
    pub fn poll_events(&self, out: &mut Vec<TransportEvent>) -> std::io::Result<()> {
        while !self.recv_batch(false, out)? {}
        while !self.recv_batch(true, out)? {}
        Ok(())
    }

    /// Non-blocking: appends the send completions (TX timestamps) queued now. Worth one
    /// syscall right after a timed send: on loopback, veth and most drivers the software
    /// TX timestamp is queued before `sendmsg` returns.
    pub fn poll_completions(&self, out: &mut Vec<TransportEvent>) -> std::io::Result<()> {
        while !self.recv_batch(true, out)? {}
        Ok(())
    }

    /// One recvmmsg on the data queue or the error queue. Ok(true) when the call proved
    /// the queue empty (fewer entries than asked for, or EAGAIN).
    fn recv_batch(&self, errqueue: bool, out: &mut Vec<TransportEvent>) -> io::Result<bool> {
        let mut guard = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let s: &mut RecvSlots = &mut guard;
        s.reset();
        let flags =
            libc::MSG_DONTWAIT | libc::MSG_TRUNC | if errqueue { libc::MSG_ERRQUEUE } else { 0 };
        let n = loop {
            // SAFETY: every header points at buffers inside `s`, which the lock keeps
            // alive and unshared for the call.
            let r = unsafe {
                libc::recvmmsg(
                    self.fd.as_raw_fd(),
                    s.hdr.as_mut_ptr(),
                    RECV_BATCH as libc::c_uint,
                    flags as _,
                    std::ptr::null_mut(),
                )
            };
            // A failed entry is left as it was; one past the last filled is reset too,
            // for margin.
            s.dirty = (r.max(0) as usize + 1).min(RECV_BATCH);
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(true),
                _ => return Err(e),
            }
        };
        for i in 0..n.min(RECV_BATCH) {
            let h = &s.hdr[i];
            #[allow(clippy::unnecessary_cast)] // size_t on glibc, socklen_t on musl
            let ctl_len = (h.msg_hdr.msg_controllen as usize).min(RECV_CTL_LEN);
            let ctl = &s.ctl[i].0[..ctl_len];
            if errqueue {
                if let Some(ev) = completion_event(ctl) {
                    out.push(ev);
                }
                continue;
            }
            let Some(addr) = from_sockaddr(&s.addr[i], h.msg_hdr.msg_namelen) else {
                continue; // no usable source address: nothing to answer
            };
            let len = h.msg_len as usize;
            let mut data = [0u8; RECV_DATA_LEN];
            let k = len.min(RECV_DATA_LEN);
            data[..k].copy_from_slice(&s.data[i][..k]);
            let rx_ts_ns = cmsgs(ctl)
                .find(|&(l, t, _)| l == libc::SOL_SOCKET && t == SCM_TIMESTAMPING)
                .and_then(|(_, _, d)| software_ts(d));
            out.push(TransportEvent::Received {
                from: endpoint_of(&addr),
                len,
                data,
                rx_ts_ns,
                // The IPv6 flow label of a received datagram is not read (nor echoed).
                flow_label: None,
            });
        }
        Ok(n < RECV_BATCH)
    }
}

/// Bounds-checked walk over received control messages: yields (level, type, data).
pub(super) fn cmsgs(buf: &[u8]) -> impl Iterator<Item = (libc::c_int, libc::c_int, &[u8])> {
    const ALIGN: usize = size_of::<usize>();
    let hdr = size_of::<libc::cmsghdr>();
    let mut off = 0usize;
    std::iter::from_fn(move || {
        if off.checked_add(hdr)? > buf.len() {
            return None;
        }
        // SAFETY: `hdr` bytes at `off` are in bounds; unaligned read of a plain struct.
        let h: libc::cmsghdr =
            unsafe { std::ptr::read_unaligned(buf.as_ptr().add(off) as *const libc::cmsghdr) };
        let clen = h.cmsg_len as usize;
        if clen < hdr || off.checked_add(clen)? > buf.len() {
            return None;
        }
        let data = &buf[off + hdr..off + clen];
        off = off.checked_add(clen.checked_add(ALIGN - 1)? & !(ALIGN - 1))?;
        Some((h.cmsg_level, h.cmsg_type, data))
    })
}

/// ts[0] (software) of an SCM_TIMESTAMPING payload, None if absent or zero.
pub(super) fn software_ts(data: &[u8]) -> Option<u64> {
    let tl = size_of::<libc::timespec>();
    if data.len() < 3 * tl {
        return None;
    }
    // SAFETY: at least one timespec in bounds; unaligned read.
    let ts: libc::timespec =
        unsafe { std::ptr::read_unaligned(data.as_ptr() as *const libc::timespec) };
    if ts.tv_sec < 0 || ts.tv_nsec < 0 || (ts.tv_sec == 0 && ts.tv_nsec == 0) {
        return None;
    }
    Some(
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64),
    )
}

pub(super) fn extended_err(data: &[u8]) -> Option<libc::sock_extended_err> {
    if data.len() < size_of::<libc::sock_extended_err>() {
        return None;
    }
    // SAFETY: length checked; unaligned read of a plain struct.
    Some(unsafe { std::ptr::read_unaligned(data.as_ptr() as *const libc::sock_extended_err) })
}

/// The `Sent` event of one error-queue entry; None for anything that is not a software
/// TX timestamp (none expected: IP_RECVERR is off).
fn completion_event(ctl: &[u8]) -> Option<TransportEvent> {
    let mut ts = None;
    let mut ee = None;
    for (level, ty, d) in cmsgs(ctl) {
        match (level, ty) {
            (libc::SOL_SOCKET, SCM_TIMESTAMPING) => ts = software_ts(d),
            (libc::SOL_IP, libc::IP_RECVERR) | (libc::SOL_IPV6, libc::IPV6_RECVERR) => {
                ee = extended_err(d)
            }
            _ => {}
        }
    }
    let (tx_ts_ns, ee) = (ts?, ee?);
    (ee.ee_errno == libc::ENOMSG as u32
        && ee.ee_origin == SO_EE_ORIGIN_TIMESTAMPING
        && ee.ee_info == SCM_TSTAMP_SND)
        .then_some(TransportEvent::Sent {
            id: ee.ee_data,
            tx_ts_ns,
        })
}
