//! UD-like endpoint over UDP. T2..T5 are kernel software timestamps (SO_TIMESTAMPING,
//! CLOCK_REALTIME); TX timestamps come back on the socket error queue keyed by OPT_ID.
//!
//! Send ids: on kernels >= 6.13 every send carries its id explicitly (`SCM_TS_OPT_ID`
//! cmsg), so a failed send can never shift the ids of later sends. On older kernels the
//! first send is refused with EINVAL; the endpoint then falls back to the socket's
//! implicit OPT_ID counter (0, 1, 2, ... per datagram handed to the IP layer), which it
//! mirrors: the counter advances on success and on EPERM (a netfilter drop at ip output
//! happens after the kernel assigned the id).
//!
//! Untimed sends (`send_untimed`, e.g. the responder's second ACK) switch the TX timestamp
//! off for that one datagram with a per-send `SO_TIMESTAMPING` cmsg of 0 (Linux >= 4.13).
//! The kernel assigns OPT_ID keys only to datagrams that request a timestamp, so an
//! untimed send takes no id in either mode and leaves no error-queue entry to read.
//!
//! Sending a batch (a probing round): one `sendmmsg` for up to `SEND_BATCH` datagrams,
//! each with its explicit id; a datagram the kernel refuses costs only its own result.
//!
//! Receiving (`recv.rs`): `recvmmsg` in batches, only on the queue that epoll says is
//! ready. A batch that comes back short proves the queue empty, so no trailing EAGAIN
//! call is needed.

use std::io;
use std::mem::{size_of, zeroed, MaybeUninit};
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use std::sync::Mutex;

use tokio::io::unix::AsyncFd;
use tokio::io::{Interest, Ready};

use crate::sockaddr::{from_sockaddr, to_sockaddr};
use crate::{Endpoint, SendId, SendParams, TransportEvent, VerbsError};

/// Receive buffer length reported in `TransportEvent::Received::data`.
pub const RECV_DATA_LEN: usize = 64;

// Values from the kernel uapi that the libc crate does not carry (or carries per arch).
/// SO_TIMESTAMPING_OLD: on 64-bit targets the old and new layouts are identical.
const SO_TIMESTAMPING: libc::c_int = 37;
const SCM_TIMESTAMPING: libc::c_int = SO_TIMESTAMPING;
/// asm-generic/socket.h, Linux 6.13+.
const SCM_TS_OPT_ID: libc::c_int = 81;
const SO_EE_ORIGIN_TIMESTAMPING: u8 = 4;
const SCM_TSTAMP_SND: u32 = 0;

const RCVBUF_BYTES: libc::c_int = 4 << 20;

const TIMESTAMPING_FLAGS: libc::c_uint = libc::SOF_TIMESTAMPING_TX_SOFTWARE
    | libc::SOF_TIMESTAMPING_RX_SOFTWARE
    | libc::SOF_TIMESTAMPING_SOFTWARE
    | libc::SOF_TIMESTAMPING_OPT_ID
    | libc::SOF_TIMESTAMPING_OPT_TSONLY;

/// Control buffer of one send, aligned for cmsghdr: room for the traffic class and the
/// TX timestamp request (two 4-byte cmsgs of 24 bytes each on 64-bit) with some to spare.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct CmsgBuf([u8; CMSG_BUF_LEN]);
const CMSG_BUF_LEN: usize = 96;

/// Datagrams handed to one sendmmsg call.
const SEND_BATCH: usize = 64;

pub struct UdpEndpoint {
    fd: AsyncFd<OwnedFd>,
    local_addr: SocketAddr,
    local: Endpoint,
    device_name: String,
    is_v6: bool,
    next_id: AtomicU32,
    /// True while sends carry SCM_TS_OPT_ID (see module doc).
    explicit_ids: AtomicBool,
    /// No send succeeded yet: the explicit-id probe is still open.
    probing_ids: AtomicBool,
    /// False once the kernel refused a per-send SO_TIMESTAMPING cmsg (Linux < 4.13):
    /// untimed sends then go out timed and their completion is simply not awaited.
    untimed_ok: AtomicBool,
    slots: Mutex<Box<RecvSlots>>,
}

fn sock_err(what: &'static str) -> impl FnOnce(io::Error) -> VerbsError {
    move |source| VerbsError::Socket { what, source }
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    val: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its exact size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &val as *const libc::c_int as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// The endpoint a socket address stands for: an IPv4 address as its v4-mapped GID, the
/// port as the QPN.
pub fn endpoint_of(addr: &SocketAddr) -> Endpoint {
    let gid = match addr.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    Endpoint {
        gid,
        qpn: addr.port() as u32,
    }
}

/// Appends one control message to `buf` at `*off`.
fn push_cmsg(buf: &mut CmsgBuf, off: &mut usize, level: libc::c_int, ty: libc::c_int, data: &[u8]) {
    // SAFETY: CMSG_* are pure arithmetic.
    let (space, len, hdr) = unsafe {
        (
            libc::CMSG_SPACE(data.len() as u32) as usize,
            libc::CMSG_LEN(data.len() as u32) as usize,
            libc::CMSG_LEN(0) as usize,
        )
    };
    assert!(*off + space <= buf.0.len(), "send control buffer too small");
    // SAFETY: all-zero is a valid cmsghdr.
    let mut h: libc::cmsghdr = unsafe { zeroed() };
    h.cmsg_len = len as _;
    h.cmsg_level = level;
    h.cmsg_type = ty;
    // SAFETY: bounds checked above; unaligned write of a plain struct.
    unsafe { std::ptr::write_unaligned(buf.0.as_mut_ptr().add(*off) as *mut libc::cmsghdr, h) };
    buf.0[*off + hdr..*off + hdr + data.len()].copy_from_slice(data);
    *off += space;
}

impl UdpEndpoint {
    /// Binds one endpoint (one "RNIC"). Port 0 picks a free port. IPv4 addresses are
    /// bound as IPv4 and shown as v4-mapped GIDs. Must be called inside a tokio runtime.
    pub fn bind(addr: SocketAddr, device_name: &str) -> Result<Self, VerbsError> {
        let is_v6 = addr.is_ipv6();
        let family = if is_v6 { libc::AF_INET6 } else { libc::AF_INET };
        // SAFETY: plain socket(2) call.
        let raw = cvt(unsafe {
            libc::socket(
                family,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        })
        .map_err(sock_err("socket"))?;
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let flags = TIMESTAMPING_FLAGS as libc::c_int;
        setsockopt_int(raw, libc::SOL_SOCKET, SO_TIMESTAMPING, flags)
            .map_err(sock_err("SO_TIMESTAMPING"))?;
        if is_v6 {
            setsockopt_int(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)
                .map_err(sock_err("IPV6_V6ONLY"))?;
            // Lets sendmsg take the flow label from sin6_flowinfo.
            setsockopt_int(raw, libc::IPPROTO_IPV6, libc::IPV6_FLOWINFO_SEND, 1)
                .map_err(sock_err("IPV6_FLOWINFO_SEND"))?;
        }
        // Best effort (clamped to net.core.rmem_max): RX datagrams and TX timestamps share
        // this budget, and a full buffer silently drops timestamps.
        let _ = setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, RCVBUF_BYTES);
        let (ss, len) = to_sockaddr(&addr, 0);
        // SAFETY: `ss` holds a valid sockaddr of length `len`.
        cvt(unsafe { libc::bind(raw, &ss as *const _ as *const libc::sockaddr, len) })
            .map_err(|source| VerbsError::Bind { addr, source })?;
        // SAFETY: all-zero is a valid sockaddr_storage; getsockname writes at most `len`.
        let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        cvt(unsafe { libc::getsockname(raw, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) })
            .map_err(sock_err("getsockname"))?;
        let local_addr = match from_sockaddr(&ss, len) {
            Some(SocketAddr::V6(a)) => {
                SocketAddr::V6(SocketAddrV6::new(*a.ip(), a.port(), 0, a.scope_id()))
            }
            Some(a) => a,
            None => {
                return Err(VerbsError::Socket {
                    what: "getsockname",
                    source: io::Error::new(io::ErrorKind::InvalidData, "unexpected address family"),
                })
            }
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(VerbsError::Socket {
                what: "register with tokio",
                source: io::Error::other("UdpEndpoint::bind must be called inside a tokio runtime"),
            });
        }
        // SAFETY: the AsyncFd owns the OwnedFd, so the descriptor stays open and the same
        // for the AsyncFd's whole lifetime.
        let fd =
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE | Interest::ERROR) }
                .map_err(|e| VerbsError::Socket {
                    what: "register with tokio",
                    source: e.into(),
                })?;
        Ok(UdpEndpoint {
            fd,
            local_addr,
            local: endpoint_of(&local_addr),
            device_name: device_name.to_string(),
            is_v6,
            next_id: AtomicU32::new(0),
            explicit_ids: AtomicBool::new(true),
            probing_ids: AtomicBool::new(true),
            untimed_ok: AtomicBool::new(true),
            slots: Mutex::new(RecvSlots::new()),
        })
    }

    pub fn local(&self) -> Endpoint {
        self.local
    }

    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The IP address the endpoint is bound to, as text (for RnicInfo.ip_address).
    pub fn ip_string(&self) -> String {
        self.local_addr.ip().to_string()
    }

    /// The bound socket address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Whether send ids are carried per send (SCM_TS_OPT_ID) rather than mirrored from
    /// the kernel's implicit counter.
    pub fn explicit_send_ids(&self) -> bool {
        self.explicit_ids.load(Ordering::Relaxed)
    }

    /// Destination socket address of `to` for this endpoint's address family.
    fn dest(&self, to: &Endpoint) -> io::Result<SocketAddr> {
        let port = u16::try_from(to.qpn).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("QPN {} is not a UDP port", to.qpn),
            )
        })?;
        if self.is_v6 {
            Ok(SocketAddr::V6(SocketAddrV6::new(to.gid, port, 0, 0)))
        } else {
            let v4 = to.gid.to_ipv4_mapped().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "GID {} is not IPv4-mapped; endpoint {} is IPv4",
                        to.gid, self.local_addr
                    ),
                )
            })?;
            Ok(SocketAddr::V4(SocketAddrV4::new(v4, port)))
        }
    }

    /// Sends one datagram with a TX timestamp; returns the id its send-completion event
    /// will carry. On IPv6 the flow label (and traffic class) is set per send.
    pub fn send(
        &self,
        to: &Endpoint,
        params: &SendParams,
        payload: &[u8],
    ) -> std::io::Result<SendId> {
        let (ss, slen) = self.dest_sockaddr(to, params)?;
        self.send_timed(&ss, slen, params, payload)
    }

    /// Sends one datagram whose send completion nobody needs (no TX timestamp, no send
    /// id, nothing to read back from the error queue).
    pub fn send_untimed(
        &self,
        to: &Endpoint,
        params: &SendParams,
        payload: &[u8],
    ) -> std::io::Result<()> {
        let (ss, slen) = self.dest_sockaddr(to, params)?;
        if self.untimed_ok.load(Ordering::Relaxed) {
            match self.sendmsg(&ss, slen, params, payload, Stamp::Off) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    // Only a kernel without per-send SO_TIMESTAMPING refuses this cmsg;
                    // the datagram itself is validated identically on the timed path.
                    tracing::debug!("udp transport: kernel lacks per-send SO_TIMESTAMPING; untimed sends are timed");
                    self.untimed_ok.store(false, Ordering::Relaxed);
                }
                r => return r,
            }
        }
        // A timed send keeps the implicit id counter in step; its completion is ignored.
        self.send_timed(&ss, slen, params, payload).map(drop)
    }

    /// Sends every datagram of `batch` with a TX timestamp, as `send` would, appending
    /// one result per datagram to `out` (in order). With explicit send ids the batch goes
    /// out in sendmmsg calls of up to `SEND_BATCH`: one syscall for a whole probing round.
    pub fn send_batch<P: AsRef<[u8]>>(
        &self,
        batch: &[(Endpoint, SendParams, P)],
        out: &mut Vec<io::Result<SendId>>,
    ) {
        let mut rest = batch;
        // Until a send settles the id mode, and on kernels without explicit ids (the
        // implicit counter must be mirrored one send at a time): one by one.
        while let Some(((to, params, payload), tail)) = rest.split_first() {
            if self.explicit_ids.load(Ordering::Relaxed)
                && !self.probing_ids.load(Ordering::Relaxed)
            {
                break;
            }
            out.push(self.send(to, params, payload.as_ref()));
            rest = tail;
        }
        if let [(to, params, payload)] = rest {
            // One datagram: sendmsg, with no batch to set up.
            out.push(self.send(to, params, payload.as_ref()));
            return;
        }
        for chunk in rest.chunks(SEND_BATCH) {
            self.send_chunk(chunk, out);
        }
    }

    /// One sendmmsg call (more after a datagram the kernel refused) for up to
    /// `SEND_BATCH` datagrams, each with its explicit send id.
    fn send_chunk<P: AsRef<[u8]>>(
        &self,
        chunk: &[(Endpoint, SendParams, P)],
        out: &mut Vec<io::Result<SendId>>,
    ) {
        debug_assert!(chunk.len() <= SEND_BATCH);
        // Only the entries a datagram uses are written: zeroing all 64 (20 KiB) cost more
        // than the send itself for the one or two datagrams a pipelined wake-up sends.
        let mut addr = [const { MaybeUninit::<libc::sockaddr_storage>::uninit() }; SEND_BATCH];
        let mut ctl = [const { MaybeUninit::<CmsgBuf>::uninit() }; SEND_BATCH];
        let mut iov = [const { MaybeUninit::<libc::iovec>::uninit() }; SEND_BATCH];
        let mut hdr = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; SEND_BATCH];
        // Which result each header stands for (a datagram without a usable address gets
        // its error at once and no header).
        let mut slot_of = [0usize; SEND_BATCH];
        let mut n = 0;
        for (to, params, payload) in chunk {
            let (ss, slen) = match self.dest_sockaddr(to, params) {
                Ok(a) => a,
                Err(e) => {
                    out.push(Err(e));
                    continue;
                }
            };
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let name = addr[n].write(ss);
            let control = ctl[n].write(CmsgBuf([0; CMSG_BUF_LEN]));
            let clen = self.send_ctl(params, Stamp::Id(id), control);
            let payload = payload.as_ref();
            let v = iov[n].write(libc::iovec {
                iov_base: payload.as_ptr() as *mut libc::c_void,
                iov_len: payload.len(),
            });
            // SAFETY: all-zero is a valid mmsghdr; its pointers are set next.
            let mut m: libc::mmsghdr = unsafe { zeroed() };
            m.msg_hdr.msg_name = name as *mut _ as *mut libc::c_void;
            m.msg_hdr.msg_namelen = slen;
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
            m.msg_hdr.msg_control = control.0.as_mut_ptr() as *mut libc::c_void;
            m.msg_hdr.msg_controllen = clen as _;
            hdr[n].write(m);
            slot_of[n] = out.len();
            out.push(Ok(id)); // replaced below if the kernel refuses it
            n += 1;
        }
        let mut start = 0;
        while start < n {
            // SAFETY: headers start..n are written and point at buffers on this frame, alive
            // for the call.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    hdr[start..n].as_mut_ptr().cast::<libc::mmsghdr>(),
                    (n - start) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                start += r as usize;
                continue;
            }
            let e = if r == 0 {
                io::Error::other("sendmmsg sent nothing")
            } else {
                io::Error::last_os_error()
            };
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // The error is the first unsent datagram's; the rest are tried again.
            out[slot_of[start]] = Err(e);
            start += 1;
        }
    }

    fn dest_sockaddr(
        &self,
        to: &Endpoint,
        params: &SendParams,
    ) -> io::Result<(libc::sockaddr_storage, libc::socklen_t)> {
        let dest = self.dest(to)?;
        let flowinfo_be = if self.is_v6 {
            (params.flow_label & 0xF_FFFF).to_be()
        } else {
            0
        };
        Ok(to_sockaddr(&dest, flowinfo_be))
    }

    fn send_timed(
        &self,
        ss: &libc::sockaddr_storage,
        slen: libc::socklen_t,
        params: &SendParams,
        payload: &[u8],
    ) -> io::Result<SendId> {
        if self.explicit_ids.load(Ordering::Relaxed) {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            match self.sendmsg(ss, slen, params, payload, Stamp::Id(id)) {
                Ok(()) => {
                    self.probing_ids.store(false, Ordering::Relaxed);
                    return Ok(id);
                }
                Err(e)
                    if e.raw_os_error() == Some(libc::EINVAL)
                        && self.probing_ids.load(Ordering::Relaxed) =>
                {
                    // Maybe a kernel without SCM_TS_OPT_ID: retry on the implicit counter.
                    self.sendmsg(ss, slen, params, payload, Stamp::Implicit)?;
                    tracing::debug!("udp transport: kernel lacks SCM_TS_OPT_ID, using the implicit OPT_ID counter");
                    self.explicit_ids.store(false, Ordering::Relaxed);
                    self.probing_ids.store(false, Ordering::Relaxed);
                    // No timed send succeeded before (untimed ones take no key), so the
                    // kernel counter was 0 and is now 1.
                    self.next_id.store(1, Ordering::Relaxed);
                    return Ok(0);
                }
                Err(e) => return Err(e),
            }
        }
        match self.sendmsg(ss, slen, params, payload, Stamp::Implicit) {
            Ok(()) => Ok(self.next_id.fetch_add(1, Ordering::Relaxed)),
            Err(e) => {
                if e.raw_os_error() == Some(libc::EPERM) {
                    self.next_id.fetch_add(1, Ordering::Relaxed);
                }
                Err(e)
            }
        }
    }

    /// Writes a send's control messages (traffic class, TX timestamp request) into
    /// `ctl`; returns their length.
    fn send_ctl(&self, params: &SendParams, stamp: Stamp, ctl: &mut CmsgBuf) -> usize {
        let mut off = 0;
        let tc = params.traffic_class as libc::c_int;
        // 0 is the socket's own TOS / traffic class: no cmsg needed for it.
        if tc != 0 {
            let (level, ty) = if self.is_v6 {
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
            } else {
                (libc::IPPROTO_IP, libc::IP_TOS)
            };
            push_cmsg(ctl, &mut off, level, ty, &tc.to_ne_bytes());
        }
        match stamp {
            Stamp::Id(id) => push_cmsg(
                ctl,
                &mut off,
                libc::SOL_SOCKET,
                SCM_TS_OPT_ID,
                &id.to_ne_bytes(),
            ),
            // Clears the TX record flags for this datagram only.
            Stamp::Off => push_cmsg(
                ctl,
                &mut off,
                libc::SOL_SOCKET,
                SO_TIMESTAMPING,
                &0u32.to_ne_bytes(),
            ),
            Stamp::Implicit => {}
        }
        off
    }

    fn sendmsg(
        &self,
        dest: &libc::sockaddr_storage,
        dest_len: libc::socklen_t,
        params: &SendParams,
        payload: &[u8],
        stamp: Stamp,
    ) -> io::Result<()> {
        let mut ctl = CmsgBuf([0; CMSG_BUF_LEN]);
        let off = self.send_ctl(params, stamp, &mut ctl);
        let mut iov = libc::iovec {
            iov_base: payload.as_ptr() as *mut libc::c_void,
            iov_len: payload.len(),
        };
        // SAFETY: all-zero is a valid msghdr; every pointer set below outlives the call.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_name = dest as *const _ as *mut libc::c_void;
        msg.msg_namelen = dest_len;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if off > 0 {
            msg.msg_control = ctl.0.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = off as _;
        }
        loop {
            // SAFETY: `msg` describes valid buffers (see above).
            let r = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, libc::MSG_DONTWAIT) };
            if r >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// How a send asks for its TX timestamp.
#[derive(Clone, Copy)]
enum Stamp {
    /// Timestamped, keyed by this explicit id (SCM_TS_OPT_ID).
    Id(u32),
    /// Timestamped, keyed by the kernel's implicit OPT_ID counter.
    Implicit,
    /// Not timestamped.
    Off,
}

mod recv;
#[cfg(test)]
mod tests;

use recv::RecvSlots;
#[cfg(test)]
use recv::{cmsgs, extended_err, software_ts, RECV_BATCH};
