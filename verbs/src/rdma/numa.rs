//! NUMA placement for registered memory: the node mask mbind(2) takes. Pure (no
//! syscall here): `ffi::HostMem` binds with it, the loopback test builds it.

/// A one-node mask for mbind(2): `words` is the bitmap (bit `node` set), `maxnode` the
/// value to pass (the kernel reads `maxnode - 1` bits, so one more than the bitmap holds,
/// as libnuma does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMask {
    pub node: u32,
    pub words: Vec<libc::c_ulong>,
    pub maxnode: libc::c_ulong,
}

impl NodeMask {
    pub fn single(node: u32) -> NodeMask {
        let bits = libc::c_ulong::BITS;
        let mut words = vec![0; (node / bits) as usize + 1];
        words[(node / bits) as usize] = 1 << (node % bits);
        let maxnode = (words.len() as u32 * bits + 1) as libc::c_ulong;
        NodeMask {
            node,
            words,
            maxnode,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_masks() {
        let m = NodeMask::single(0);
        assert_eq!((m.node, m.words.clone(), m.maxnode), (0, vec![1], 65));
        let m = NodeMask::single(3);
        assert_eq!((m.words.clone(), m.maxnode), (vec![8], 65));
        let m = NodeMask::single(63);
        assert_eq!((m.words.clone(), m.maxnode), (vec![1 << 63], 65));
        // Node 64 is bit 0 of the second word; the kernel must be told to read 128 bits.
        let m = NodeMask::single(64);
        assert_eq!((m.words.clone(), m.maxnode), (vec![0, 1], 129));
        let m = NodeMask::single(1023);
        assert_eq!(m.words.len(), 16);
        assert_eq!(m.words[15], 1 << 63);
        assert!(m.words[..15].iter().all(|&w| w == 0));
        assert_eq!(m.maxnode, 1025);
    }
}
