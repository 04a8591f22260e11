//! The 40-byte big-endian probe packet, identical to the Go/Zig R-Pingmesh wire format.
//!
//! | off | size | field                                   |
//! |-----|------|-----------------------------------------|
//! | 0   | 1    | version (1)                             |
//! | 1   | 1    | msg_type (0 probe, 1 ACK)               |
//! | 2   | 1    | ack_type (0 n/a, 1 first, 2 second)     |
//! | 3   | 1    | flags (reserved)                        |
//! | 4   | 8    | sequence_num                            |
//! | 12  | 8    | t1 (ns)                                 |
//! | 20  | 8    | t3 (ns)                                 |
//! | 28  | 8    | t4 (ns)                                 |
//! | 36  | 4    | reserved, zero                          |

pub const PACKET_LEN: usize = 40;
pub const WIRE_VERSION: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgType {
    Probe = 0,
    Ack = 1,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckType {
    None = 0,
    First = 1,
    Second = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbePacket {
    pub msg_type: MsgType,
    pub ack_type: AckType,
    pub flags: u8,
    pub sequence: u64,
    pub t1: u64,
    pub t3: u64,
    pub t4: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// Fewer than 40 bytes.
    Short {
        len: usize,
    },
    BadVersion {
        version: u8,
    },
    UnknownMsgType {
        msg_type: u8,
    },
    UnknownAckType {
        ack_type: u8,
    },
    /// A probe with ack_type != 0, or an ACK with ack_type == 0.
    Inconsistent {
        msg_type: u8,
        ack_type: u8,
    },
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            WireError::Short { len } => {
                write!(f, "probe packet too short: {len} bytes, need {PACKET_LEN}")
            }
            WireError::BadVersion { version } => {
                write!(
                    f,
                    "probe packet version {version} unsupported (expected {WIRE_VERSION})"
                )
            }
            WireError::UnknownMsgType { msg_type } => {
                write!(
                    f,
                    "probe packet msg_type {msg_type} unknown (0 probe, 1 ack)"
                )
            }
            WireError::UnknownAckType { ack_type } => {
                write!(
                    f,
                    "probe packet ack_type {ack_type} unknown (0 n/a, 1 first, 2 second)"
                )
            }
            WireError::Inconsistent { msg_type, ack_type } => write!(
                f,
                "probe packet msg_type {msg_type} with ack_type {ack_type} is inconsistent \
                 (a probe has ack_type 0, an ack has 1 or 2)"
            ),
        }
    }
}

// `core::error::Error` is stable in core, so the std-facing impl needs no std.
#[cfg(feature = "user")]
impl core::error::Error for WireError {}

impl MsgType {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(MsgType::Probe),
            1 => Some(MsgType::Ack),
            _ => None,
        }
    }
}

impl AckType {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(AckType::None),
            1 => Some(AckType::First),
            2 => Some(AckType::Second),
            _ => None,
        }
    }
}

fn be_u64(buf: &[u8], off: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[off..off + 8]);
    u64::from_be_bytes(b)
}

impl ProbePacket {
    pub fn probe(sequence: u64, t1: u64) -> Self {
        ProbePacket {
            msg_type: MsgType::Probe,
            ack_type: AckType::None,
            flags: 0,
            sequence,
            t1,
            t3: 0,
            t4: 0,
        }
    }
    /// The first ACK answering `probe`: echoes its sequence and T1, carries T3.
    pub fn first_ack(probe: &ProbePacket, t3: u64) -> Self {
        ProbePacket {
            msg_type: MsgType::Ack,
            ack_type: AckType::First,
            flags: 0,
            sequence: probe.sequence,
            t1: probe.t1,
            t3,
            t4: 0,
        }
    }
    /// The second ACK answering `probe`: carries T3 and the first ACK's send time T4.
    pub fn second_ack(probe: &ProbePacket, t3: u64, t4: u64) -> Self {
        ProbePacket {
            msg_type: MsgType::Ack,
            ack_type: AckType::Second,
            flags: 0,
            sequence: probe.sequence,
            t1: probe.t1,
            t3,
            t4,
        }
    }
    pub fn encode(&self) -> [u8; PACKET_LEN] {
        let mut b = [0u8; PACKET_LEN];
        b[0] = WIRE_VERSION;
        b[1] = self.msg_type as u8;
        b[2] = self.ack_type as u8;
        b[3] = self.flags;
        b[4..12].copy_from_slice(&self.sequence.to_be_bytes());
        b[12..20].copy_from_slice(&self.t1.to_be_bytes());
        b[20..28].copy_from_slice(&self.t3.to_be_bytes());
        b[28..36].copy_from_slice(&self.t4.to_be_bytes());
        // 36..40 reserved, zero.
        b
    }
    /// Decodes the first 40 bytes; extra trailing bytes are ignored (a GRH-stripped
    /// receive buffer may be larger than the packet).
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        if buf.len() < PACKET_LEN {
            return Err(WireError::Short { len: buf.len() });
        }
        if buf[0] != WIRE_VERSION {
            return Err(WireError::BadVersion { version: buf[0] });
        }
        let msg_type =
            MsgType::from_u8(buf[1]).ok_or(WireError::UnknownMsgType { msg_type: buf[1] })?;
        let ack_type =
            AckType::from_u8(buf[2]).ok_or(WireError::UnknownAckType { ack_type: buf[2] })?;
        let consistent = match msg_type {
            MsgType::Probe => ack_type == AckType::None,
            MsgType::Ack => ack_type != AckType::None,
        };
        if !consistent {
            return Err(WireError::Inconsistent {
                msg_type: buf[1],
                ack_type: buf[2],
            });
        }
        // Reserved bytes are not checked: a future sender may use them.
        Ok(ProbePacket {
            msg_type,
            ack_type,
            flags: buf[3],
            sequence: be_u64(buf, 4),
            t1: be_u64(buf, 12),
            t3: be_u64(buf, 20),
            t4: be_u64(buf, 28),
        })
    }
}

#[cfg(test)]
mod tests;
