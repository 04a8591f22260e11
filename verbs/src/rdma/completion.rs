//! Work completions to transport events, without hardware: the poller copies the fields of
//! an `ibv_wc` (or the extended-CQ reads) into a [`WcRecord`] and calls [`translate`] with
//! the receive buffer. Receive buffers of a UD QP start with the 40-byte GRH; for RoCE v2
//! over IPv4 its last 20 bytes hold the IPv4 header instead of an IPv6 one.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::{Endpoint, SendId, TransportEvent};

/// Bytes the HCA writes in front of every UD receive.
pub const GRH_LEN: usize = 40;
/// Payload bytes copied into `TransportEvent::Received::data`.
pub const PAYLOAD_LEN: usize = 64;

// Values of libibverbs' enums (verbs.h); checked against rdma-sys in the feature tests.
pub const WC_SUCCESS: u32 = 0;
pub const WC_WR_FLUSH_ERR: u32 = 5;
pub const WC_OPCODE_SEND: u32 = 0;
pub const WC_OPCODE_RDMA_WRITE: u32 = 1;
pub const WC_OPCODE_RECV: u32 = 128;
pub const WC_FLAG_GRH: u32 = 1;

/// Name of an `ibv_wc_status` value (as `ibv_wc_status_str` would give, but stable).
pub fn wc_status_name(status: u32) -> &'static str {
    const NAMES: [&str; 24] = [
        "IBV_WC_SUCCESS",
        "IBV_WC_LOC_LEN_ERR",
        "IBV_WC_LOC_QP_OP_ERR",
        "IBV_WC_LOC_EEC_OP_ERR",
        "IBV_WC_LOC_PROT_ERR",
        "IBV_WC_WR_FLUSH_ERR",
        "IBV_WC_MW_BIND_ERR",
        "IBV_WC_BAD_RESP_ERR",
        "IBV_WC_LOC_ACCESS_ERR",
        "IBV_WC_REM_INV_REQ_ERR",
        "IBV_WC_REM_ACCESS_ERR",
        "IBV_WC_REM_OP_ERR",
        "IBV_WC_RETRY_EXC_ERR",
        "IBV_WC_RNR_RETRY_EXC_ERR",
        "IBV_WC_LOC_RDD_VIOL_ERR",
        "IBV_WC_REM_INV_RD_REQ_ERR",
        "IBV_WC_REM_ABORT_ERR",
        "IBV_WC_INV_EECN_ERR",
        "IBV_WC_INV_EEC_STATE_ERR",
        "IBV_WC_FATAL_ERR",
        "IBV_WC_RESP_TIMEOUT_ERR",
        "IBV_WC_GENERAL_ERR",
        "IBV_WC_TM_ERR",
        "IBV_WC_TM_RNDV_INCOMPLETE",
    ];
    NAMES
        .get(status as usize)
        .copied()
        .unwrap_or("IBV_WC_UNKNOWN")
}

/// What a work request was, packed into its 64-bit `wr_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrKind {
    /// A send: the id reported in `TransportEvent::Sent` and the send-buffer slot it used
    /// (ids are handed out when a send is accepted, slots when it is posted: a send
    /// waiting for its address handle is posted later than sends accepted after it).
    Send { id: SendId, slot: u32 },
    /// A posted receive buffer, by slot.
    Recv(u32),
}

const SEND_TAG: u64 = 1 << 63;
const SLOT_MASK: u64 = (1 << 31) - 1;

impl WrKind {
    pub fn to_wr_id(self) -> u64 {
        match self {
            WrKind::Send { id, slot } => SEND_TAG | ((slot as u64 & SLOT_MASK) << 32) | id as u64,
            WrKind::Recv(slot) => slot as u64,
        }
    }

    pub fn from_wr_id(wr_id: u64) -> WrKind {
        if wr_id & SEND_TAG != 0 {
            WrKind::Send {
                id: wr_id as u32,
                slot: ((wr_id >> 32) & SLOT_MASK) as u32,
            }
        } else {
            WrKind::Recv(wr_id as u32)
        }
    }
}

/// The fields of one work completion the backend uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WcRecord {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub byte_len: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    /// Completion time already in ns of the endpoint's clock domain (NIC ticks converted,
    /// or the CLOCK_MONOTONIC software stamp taken when the completion was polled).
    pub ts_ns: u64,
}

/// What the poller does with one completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WcOutcome {
    /// Deliver the event; `repost` is the receive slot to post again.
    Event {
        event: TransportEvent,
        repost: Option<u32>,
    },
    /// A good completion whose content is unusable (counted, buffer re-posted).
    Malformed { reason: String, repost: Option<u32> },
    /// An error status. The endpoint reports a failed send or re-posts the receive
    /// buffer, and fails only if the QP is really in the error state (flush errors, or
    /// whatever error moved it there).
    Failed {
        kind: WrKind,
        status: u32,
        reason: String,
    },
}

/// The source address in a receive's GRH area, told apart the way rdma-core's
/// `ibv_init_ah_from_wc` does. RoCE v2 over IPv4 puts the IPv4 header in bytes 20..40
/// and leaves the first 20 undefined (zero on rxe and mlx5); an IPv6 / IB GRH starts
/// with version 6 and holds the source GID in bytes 8..24.
/// - First nibble not 6: IPv4 when byte 20 says version 4. The checksum is not required:
///   soft-RoCE loops packets between its own GIDs without ever computing it.
/// - First nibble 6: could still be IPv4 whose undefined bytes happen to start with 6;
///   then only a valid IPv4 header (0x45, correct checksum) makes it IPv4.
pub fn grh_source(grh: &[u8]) -> Result<Ipv6Addr, String> {
    grh_source_and_label(grh).map(|(gid, _)| gid)
}

/// As [`grh_source`], with the IPv6 flow label (None over IPv4, whose header has none:
/// there the label only chose the UDP source port, which the GRH area does not keep).
pub fn grh_source_and_label(grh: &[u8]) -> Result<(Ipv6Addr, Option<u32>), String> {
    if grh.len() < GRH_LEN {
        return Err(format!("GRH area is {} bytes, need {GRH_LEN}", grh.len()));
    }
    let ip4 = &grh[20..40];
    let v6_version = grh[0] >> 4 == 6;
    let is_v4 = if v6_version {
        ip4[0] == 0x45 && ipv4_header_checksum_ok(ip4)
    } else {
        ip4[0] >> 4 == 4
    };
    if is_v4 {
        let src = Ipv4Addr::new(ip4[12], ip4[13], ip4[14], ip4[15]);
        return Ok((src.to_ipv6_mapped(), None));
    }
    if v6_version {
        let mut g = [0u8; 16];
        g.copy_from_slice(&grh[8..24]);
        let vtf = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
        return Ok((Ipv6Addr::from(g), Some(vtf & 0xF_FFFF)));
    }
    Err(format!(
        "GRH holds neither an IPv6 header (first byte {:#04x}) nor an IPv4 header (byte 20 {:#04x})",
        grh[0], grh[20]
    ))
}

fn ipv4_header_checksum_ok(h: &[u8]) -> bool {
    let mut sum: u32 = 0;
    for pair in h[..20].chunks(2) {
        sum += u16::from_be_bytes([pair[0], pair[1]]) as u32;
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum == 0xFFFF
}

/// Translates one completion. `recv_buf` is the start of the receive slot (GRH + as much
/// payload as was copied, at most `PAYLOAD_LEN`) for receive completions, `slot_len` the
/// slot's size; both are ignored for sends. Slots are a whole MTU long, so that no
/// datagram can overflow one (rxe puts a UD QP in the error state when one does); what
/// is longer than a probe is delivered with its true length and dropped by the agent.
pub fn translate(rec: &WcRecord, recv_buf: &[u8], slot_len: usize) -> WcOutcome {
    let kind = WrKind::from_wr_id(rec.wr_id);
    if rec.status != WC_SUCCESS {
        let what = match kind {
            WrKind::Send { id, .. } => format!("send {id}"),
            WrKind::Recv(slot) => format!("receive slot {slot}"),
        };
        return WcOutcome::Failed {
            kind,
            status: rec.status,
            reason: format!(
                "{what} completed with status {} ({})",
                rec.status,
                wc_status_name(rec.status)
            ),
        };
    }
    match kind {
        WrKind::Send { id, .. } => {
            if rec.opcode != WC_OPCODE_SEND {
                return WcOutcome::Malformed {
                    reason: format!("send {id} completed with opcode {}", rec.opcode),
                    repost: None,
                };
            }
            WcOutcome::Event {
                event: TransportEvent::Sent {
                    id,
                    tx_ts_ns: rec.ts_ns,
                },
                repost: None,
            }
        }
        WrKind::Recv(slot) => {
            let repost = Some(slot);
            if rec.opcode != WC_OPCODE_RECV {
                return WcOutcome::Malformed {
                    reason: format!("receive slot {slot} completed with opcode {}", rec.opcode),
                    repost,
                };
            }
            if rec.wc_flags & WC_FLAG_GRH == 0 {
                return WcOutcome::Malformed {
                    reason: format!("receive slot {slot} has no GRH (not RoCE?)"),
                    repost,
                };
            }
            let byte_len = rec.byte_len as usize;
            if byte_len < GRH_LEN || byte_len > slot_len || recv_buf.len() < GRH_LEN {
                return WcOutcome::Malformed {
                    reason: format!(
                        "receive slot {slot}: byte_len {byte_len} outside {GRH_LEN}..={slot_len}"
                    ),
                    repost,
                };
            }
            let (gid, flow_label) = match grh_source_and_label(&recv_buf[..GRH_LEN]) {
                Ok(g) => g,
                Err(reason) => {
                    return WcOutcome::Malformed {
                        reason: format!("receive slot {slot}: {reason}"),
                        repost,
                    }
                }
            };
            let payload = &recv_buf[GRH_LEN..byte_len.min(recv_buf.len())];
            let mut data = [0u8; PAYLOAD_LEN];
            let n = payload.len().min(PAYLOAD_LEN);
            data[..n].copy_from_slice(&payload[..n]);
            WcOutcome::Event {
                event: TransportEvent::Received {
                    from: Endpoint {
                        gid,
                        qpn: rec.src_qp & 0xFF_FFFF,
                    },
                    len: byte_len - GRH_LEN,
                    data,
                    rx_ts_ns: Some(rec.ts_ns),
                    flow_label,
                },
                repost,
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
