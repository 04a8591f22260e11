//! Completion channels (the fd a poller sleeps on) and completion queues.

use super::*;

/// A completion channel: the fd the poller thread sleeps on until the CQ has work, so an
/// idle endpoint costs no CPU and a completion is seen the moment the kernel signals it.
pub struct CompChannel {
    pub(super) ch: NonNull<ibv_comp_channel>,
    pub(super) ctx: Arc<Context>,
}

// SAFETY: Send + Sync: see the module doc; only the poller thread reads events from it.
// Drop: the CQ bound to it holds an Arc of it, so the CQ is destroyed already.
owns_verbs_object!(CompChannel, ch, ibv_destroy_comp_channel);

impl CompChannel {
    /// Creates a channel whose fd is non-blocking (the poller waits with poll(2)).
    pub fn create(ctx: &Arc<Context>) -> Result<Arc<CompChannel>, RdmaError> {
        // SAFETY: valid context.
        let ch = unsafe { ibv_create_comp_channel(ctx.ctx.as_ptr()) };
        let ch = NonNull::new(ch).ok_or_else(|| {
            verbs_err(
                &ctx.name,
                "ibv_create_comp_channel",
                io::Error::last_os_error(),
            )
        })?;
        let me = CompChannel {
            ch,
            ctx: ctx.clone(),
        };
        set_nonblocking(me.fd())
            .map_err(|e| verbs_err(&ctx.name, "fcntl(comp channel, O_NONBLOCK)", e))?;
        Ok(Arc::new(me))
    }

    pub fn fd(&self) -> i32 {
        // SAFETY: valid channel.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    /// Reads every pending CQ event and acknowledges it. Returns how many there were
    /// (0 when the fd had nothing: the read would block).
    pub fn drain_events(&self) -> Result<u32, RdmaError> {
        let mut n = 0;
        loop {
            let mut cq = ptr::null_mut();
            let mut cq_ctx = ptr::null_mut();
            // SAFETY: valid channel; out-pointers are locals.
            let r = unsafe { ibv_get_cq_event(self.ch.as_ptr(), &mut cq, &mut cq_ctx) };
            if r != 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::EINTR) {
                    return Ok(n);
                }
                return Err(verbs_err(&self.ctx.name, "ibv_get_cq_event", e));
            }
            // SAFETY: `cq` is the CQ the event was for; acknowledged once per event, as
            // ibv_destroy_cq requires.
            unsafe { ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
    }
}

pub(super) fn set_nonblocking(fd: i32) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

pub(super) enum CqPtr {
    Ex(NonNull<ibv_cq_ex>),
    Plain(NonNull<ibv_cq>),
}

/// A completion queue: extended (NIC timestamps) or plain (software timestamps).
pub struct Cq {
    pub(super) cq: CqPtr,
    pub(super) ctx: Arc<Context>,
    pub(super) _channel: Option<Arc<CompChannel>>,
}

// SAFETY: see the module doc; polling happens from the one poller thread.
unsafe impl Send for Cq {}
unsafe impl Sync for Cq {}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: the QP using this CQ holds an Arc of it, so it is gone.
        unsafe {
            match self.cq {
                CqPtr::Ex(p) => ibv_destroy_cq(ibv_cq_ex_to_cq(p.as_ptr())),
                CqPtr::Plain(p) => ibv_destroy_cq(p.as_ptr()),
            }
        };
    }
}

impl Cq {
    /// An extended CQ reporting completion timestamps, signalling `channel` when armed.
    pub fn create_ex(
        ctx: &Arc<Context>,
        cqe: u32,
        channel: Option<&Arc<CompChannel>>,
    ) -> Result<Arc<Cq>, io::Error> {
        // SAFETY: zeroed plain struct, filled below; the call copies it.
        let mut attr: ibv_cq_init_attr_ex = unsafe { std::mem::zeroed() };
        attr.cqe = cqe;
        attr.channel = channel.map_or(ptr::null_mut(), |c| c.ch.as_ptr());
        attr.wc_flags = (ibv_create_cq_wc_flags::IBV_WC_EX_WITH_BYTE_LEN
            | ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SRC_QP
            | ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)
            .0 as u64;
        let p = unsafe { ibv_create_cq_ex(ctx.ctx.as_ptr(), &mut attr) };
        match NonNull::new(p) {
            Some(p) => Ok(Arc::new(Cq {
                cq: CqPtr::Ex(p),
                ctx: ctx.clone(),
                _channel: channel.cloned(),
            })),
            None => {
                let e = io::Error::last_os_error();
                // The wrapper sets errno to EOPNOTSUPP when the provider lacks the op.
                Err(if e.raw_os_error() == Some(0) {
                    io::Error::from_raw_os_error(libc::EOPNOTSUPP)
                } else {
                    e
                })
            }
        }
    }

    pub fn create_plain(
        ctx: &Arc<Context>,
        cqe: u32,
        channel: Option<&Arc<CompChannel>>,
    ) -> Result<Arc<Cq>, RdmaError> {
        // SAFETY: valid context and channel (kept alive by the Arc the CQ holds).
        let p = unsafe {
            ibv_create_cq(
                ctx.ctx.as_ptr(),
                cqe as i32,
                ptr::null_mut(),
                channel.map_or(ptr::null_mut(), |c| c.ch.as_ptr()),
                0,
            )
        };
        let p = NonNull::new(p)
            .ok_or_else(|| verbs_err(&ctx.name, "ibv_create_cq", io::Error::last_os_error()))?;
        Ok(Arc::new(Cq {
            cq: CqPtr::Plain(p),
            ctx: ctx.clone(),
            _channel: channel.cloned(),
        }))
    }

    /// Arms the CQ: the next completion signals its channel once.
    pub fn arm(&self) -> Result<(), RdmaError> {
        // SAFETY: valid CQ (an extended CQ is armed through its ibv_cq view).
        let r = unsafe { ibv_req_notify_cq(self.as_cq(), 0) };
        rc(&self.ctx.name, "ibv_req_notify_cq", r)
    }

    pub(super) fn as_cq(&self) -> *mut ibv_cq {
        match self.cq {
            // SAFETY: the documented cast of libibverbs.
            CqPtr::Ex(p) => unsafe { ibv_cq_ex_to_cq(p.as_ptr()) },
            CqPtr::Plain(p) => p.as_ptr(),
        }
    }

    /// Polls up to `max` completions into `out` as (record, raw timestamp). The raw
    /// timestamp is NIC ticks for an extended CQ, None for a plain one.
    /// Err = the CQ itself failed (device lost).
    pub fn poll(
        &self,
        max: usize,
        out: &mut Vec<(WcRecord, Option<u64>)>,
    ) -> Result<usize, RdmaError> {
        match self.cq {
            CqPtr::Ex(p) => {
                let cq = p.as_ptr();
                // SAFETY: zeroed attr (comp_mask 0); reads happen only between a successful
                // start_poll and end_poll, as the extended-CQ API requires.
                unsafe {
                    let mut attr: ibv_poll_cq_attr = std::mem::zeroed();
                    let r = ibv_start_poll(cq, &mut attr);
                    if r == libc::ENOENT {
                        return Ok(0);
                    }
                    if r != 0 {
                        return Err(RdmaError::DeviceLost {
                            device: self.ctx.name.clone(),
                            reason: format!(
                                "ibv_start_poll failed: {}",
                                io::Error::from_raw_os_error(r.abs())
                            ),
                        });
                    }
                    let mut n = 0;
                    loop {
                        let status = (*cq).status as u32;
                        let ok = status == 0;
                        let rec = WcRecord {
                            wr_id: (*cq).wr_id,
                            status,
                            // Only wr_id and status are valid for error completions.
                            opcode: if ok { ibv_wc_read_opcode(cq) as u32 } else { 0 },
                            byte_len: if ok { ibv_wc_read_byte_len(cq) } else { 0 },
                            src_qp: if ok { ibv_wc_read_src_qp(cq) } else { 0 },
                            wc_flags: if ok { ibv_wc_read_wc_flags(cq) } else { 0 },
                            ts_ns: 0,
                        };
                        let ts = if ok {
                            Some(ibv_wc_read_completion_ts(cq))
                        } else {
                            None
                        };
                        out.push((rec, ts));
                        n += 1;
                        if n >= max {
                            break;
                        }
                        let r = ibv_next_poll(cq);
                        if r == libc::ENOENT {
                            break;
                        }
                        if r != 0 {
                            ibv_end_poll(cq);
                            return Err(RdmaError::DeviceLost {
                                device: self.ctx.name.clone(),
                                reason: format!(
                                    "ibv_next_poll failed: {}",
                                    io::Error::from_raw_os_error(r.abs())
                                ),
                            });
                        }
                    }
                    ibv_end_poll(cq);
                    Ok(n)
                }
            }
            CqPtr::Plain(p) => {
                // SAFETY: ibv_wc is plain data; the call writes up to `max` entries.
                let mut wcs: [ibv_wc; 32] = unsafe { std::mem::zeroed() };
                let want = max.min(wcs.len()) as i32;
                let r = unsafe { ibv_poll_cq(p.as_ptr(), want, wcs.as_mut_ptr()) };
                if r < 0 {
                    return Err(RdmaError::DeviceLost {
                        device: self.ctx.name.clone(),
                        reason: format!("ibv_poll_cq returned {r}"),
                    });
                }
                for wc in &wcs[..r as usize] {
                    out.push((
                        WcRecord {
                            wr_id: wc.wr_id,
                            status: wc.status as u32,
                            opcode: wc.opcode as u32,
                            byte_len: wc.byte_len,
                            src_qp: wc.src_qp,
                            wc_flags: wc.wc_flags,
                            ts_ns: 0,
                        },
                        None,
                    ));
                }
                Ok(r as usize)
            }
        }
    }
}
