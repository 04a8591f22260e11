//! Queue pairs: UD (brought to RTS at creation) and RC (connected to an `RcPeer`), with
//! their posts of sends, receives and one-sided writes.

use super::*;

/// A UD queue pair, brought to RTS.
pub struct Qp {
    pub(super) qp: NonNull<ibv_qp>,
    pub(super) qpn: u32,
    pub(super) name: String,
    pub(super) _cq: Arc<Cq>,
    pub(super) _pd: Arc<Pd>,
}

// SAFETY: Send + Sync: see the module doc. Drop: nothing uses the QP once its owner drops
// it (the poller is joined).
owns_verbs_object!(Qp, qp, ibv_destroy_qp);

impl Qp {
    /// A QP of `qp_type` in RESET on one CQ, with one SGE per work request. A UD QP
    /// signals every send (each completion frees its buffer); an RC QP signals the ones
    /// its caller asks for.
    fn create(
        pd: &Arc<Pd>,
        cq: &Arc<Cq>,
        qp_type: ibv_qp_type::Type,
        send_wr: u32,
        recv_wr: u32,
    ) -> Result<Qp, RdmaError> {
        let name = pd.ctx.name.clone();
        // SAFETY: zeroed plain struct, filled below; the call copies it.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.as_cq();
        init.recv_cq = cq.as_cq();
        init.qp_type = qp_type;
        init.sq_sig_all = (qp_type == ibv_qp_type::IBV_QPT_UD) as i32;
        init.cap.max_send_wr = send_wr;
        init.cap.max_recv_wr = recv_wr;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        // SAFETY: valid PD and CQ (kept alive by the Arcs the QP holds).
        let p = unsafe { ibv_create_qp(pd.pd.as_ptr(), &mut init) };
        let qp = NonNull::new(p)
            .ok_or_else(|| verbs_err(&name, "ibv_create_qp", io::Error::last_os_error()))?;
        // SAFETY: valid QP.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        Ok(Qp {
            qp,
            qpn,
            name,
            _cq: cq.clone(),
            _pd: pd.clone(),
        })
    }

    pub fn create_ud(
        pd: &Arc<Pd>,
        cq: &Arc<Cq>,
        port: u8,
        qkey: u32,
        send_wr: u32,
        recv_wr: u32,
    ) -> Result<Qp, RdmaError> {
        let me = Self::create(pd, cq, ibv_qp_type::IBV_QPT_UD, send_wr, recv_wr)?;
        me.bring_up_ud(port, qkey)?;
        Ok(me)
    }

    /// UD RESET -> INIT -> RTR -> RTS on `port` with `qkey`.
    fn bring_up_ud(&self, port: u8, qkey: u32) -> Result<(), RdmaError> {
        // SAFETY (each attr below): zeroed plain structs, filled before the call copies them.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qkey = qkey;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_QKEY;
        self.modify(&mut a, mask, "ibv_modify_qp(INIT)")?;
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        self.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE, "ibv_modify_qp(RTR)")?;
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = 0;
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE | ibv_qp_attr_mask::IBV_QP_SQ_PSN,
            "ibv_modify_qp(RTS)",
        )
    }

    /// A UD QP in the error state back to RTS in place (ERR -> RESET -> ... -> RTS): its
    /// QPN stays, so peers' pinglists keep pointing at it. RESET empties both queues
    /// (posted receives included: the caller posts them again).
    pub fn reset_to_rts_ud(&self, port: u8, qkey: u32) -> Result<(), RdmaError> {
        // SAFETY: zeroed plain struct, filled below.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RESET;
        self.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE,
            "ibv_modify_qp(RESET)",
        )?;
        self.bring_up_ud(port, qkey)
    }

    /// An RC QP, left in RESET, with `send_wr` send slots of one SGE each (and one
    /// receive slot: an RDMA WRITE without immediate consumes no receive). Bring it up
    /// with `modify_to_init_rc`, `modify_to_rtr_rc` and `modify_to_rts_rc`.
    pub fn create_rc(pd: &Arc<Pd>, cq: &Arc<Cq>, send_wr: u32) -> Result<Qp, RdmaError> {
        Self::create(pd, cq, ibv_qp_type::IBV_QPT_RC, send_wr.max(1), 1)
    }

    /// RC RESET -> INIT on `port`, accepting remote writes (and local writes).
    pub fn modify_to_init_rc(&self, port: u8) -> Result<(), RdmaError> {
        // SAFETY: zeroed plain struct, filled below.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
            .0 as _;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        self.modify(&mut a, mask, "ibv_modify_qp(INIT)")
    }

    /// RC INIT -> RTR, connected to `peer` (RoCE: a global route to the peer's GID).
    pub fn modify_to_rtr_rc(&self, peer: &RcPeer) -> Result<(), RdmaError> {
        // SAFETY: zeroed plain struct (the AH attribute included), filled below.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = mtu_enum(peer.path_mtu_bytes) as _;
        a.dest_qp_num = peer.qpn;
        a.rq_psn = 0;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = ibv_gid {
            raw: peer.gid.octets(),
        };
        a.ah_attr.grh.sgid_index = peer.sgid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.sl = 0;
        a.ah_attr.port_num = peer.port;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut a, mask, "ibv_modify_qp(RTR)")
    }

    /// RC RTR -> RTS (retry counts and timeout as perftest's defaults).
    pub fn modify_to_rts_rc(&self) -> Result<(), RdmaError> {
        // SAFETY: zeroed plain struct, filled below.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = 0;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 1;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut a, mask, "ibv_modify_qp(RTS)")
    }

    pub(super) fn modify(
        &self,
        a: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        call: &'static str,
    ) -> Result<(), RdmaError> {
        // SAFETY: valid QP and attr.
        let r = unsafe { ibv_modify_qp(self.qp.as_ptr(), a, mask.0 as i32) };
        rc(&self.name, call, r)
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// True when the QP reports the error state.
    pub fn in_error(&self) -> Result<bool, RdmaError> {
        // SAFETY: zeroed plain structs written by the call.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        let mut i: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        let r = unsafe {
            ibv_query_qp(
                self.qp.as_ptr(),
                &mut a,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut i,
            )
        };
        rc(&self.name, "ibv_query_qp", r)?;
        Ok(a.qp_state == ibv_qp_state::IBV_QPS_ERR)
    }

    /// Posts receive slot `slot` (bytes [off, off+len) of `mr`) with `wr_id`.
    pub fn post_recv(&self, mr: &Mr, off: usize, len: usize, wr_id: u64) -> Result<(), RdmaError> {
        assert!(off + len <= mr.len, "receive slot outside its MR");
        let mut sge = ibv_sge {
            addr: mr.addr(off),
            length: len as u32,
            lkey: mr.lkey(),
        };
        let mut wr = ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the WR and SGE live across the call (the provider copies them); the
        // buffer belongs to `mr`, which outlives the QP's use of it (endpoint drop order).
        let r = unsafe { ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        rc(&self.name, "ibv_post_recv", r)
    }

    #[allow(clippy::too_many_arguments)]
    /// Posts one signalled UD send of `mr[off..off+len]` through `ah`.
    pub fn post_send_ud(
        &self,
        ah: &Ah,
        remote_qpn: u32,
        qkey: u32,
        mr: &Mr,
        off: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<(), RdmaError> {
        assert!(off + len <= mr.len, "send slot outside its MR");
        self.post_signalled(mr, off, len, wr_id, ibv_wr_opcode::IBV_WR_SEND, |wr| {
            wr.wr.ud = ud_t {
                ah: ah.ah.as_ptr(),
                remote_qpn,
                remote_qkey: qkey,
            }
        })
    }

    /// Posts one signalled work request with one SGE over `mr[off..off+len]`; `remote`
    /// fills the opcode's part of the WR (the UD address, the RDMA target).
    fn post_signalled(
        &self,
        mr: &Mr,
        off: usize,
        len: usize,
        wr_id: u64,
        opcode: ibv_wr_opcode::Type,
        remote: impl FnOnce(&mut ibv_send_wr),
    ) -> Result<(), RdmaError> {
        let mut sge = ibv_sge {
            addr: mr.addr(off),
            length: u32::try_from(len).expect("work request length fits in u32"),
            lkey: mr.lkey(),
        };
        // SAFETY: zeroed plain struct (unions included), filled below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = opcode;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        remote(&mut wr);
        let mut bad = ptr::null_mut();
        // SAFETY: the WR and SGE live across the call (the provider copies them); the
        // source buffer belongs to `mr`, which the caller keeps until the completion (a
        // UD send's AH too).
        let r = unsafe { ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        rc(&self.name, "ibv_post_send", r)
    }
}

impl Qp {
    #[allow(clippy::too_many_arguments)]
    /// Posts one signalled RDMA WRITE of `mr[off..off+len]` to `remote_addr` (`rkey`) on
    /// the connected peer (an RC QP).
    pub fn post_send_rdma_write(
        &self,
        mr: &Mr,
        off: usize,
        len: usize,
        remote_addr: u64,
        rkey: u32,
        wr_id: u64,
    ) -> Result<(), RdmaError> {
        assert!(off + len <= mr.len, "write source outside its MR");
        self.post_signalled(
            mr,
            off,
            len,
            wr_id,
            ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            |wr| wr.wr.rdma = rdma_t { remote_addr, rkey },
        )
    }
}

/// The remote end of an RC connection (for a loopback: the QP itself).
#[derive(Debug, Clone, Copy)]
pub struct RcPeer {
    pub qpn: u32,
    pub gid: Ipv6Addr,
    /// Our GID index, the source of the route.
    pub sgid_index: u8,
    pub port: u8,
    pub path_mtu_bytes: usize,
}

/// `enum ibv_mtu` for a path MTU in bytes (256 -> 1 ... 4096 -> 5; others round down,
/// clamped to that range).
pub(super) fn mtu_enum(bytes: usize) -> u32 {
    let mut code = 1;
    while code < 5 && (128usize << (code + 1)) <= bytes {
        code += 1;
    }
    code
}
