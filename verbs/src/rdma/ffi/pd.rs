//! Protection domains and the address handles (UD destinations) created in them.

use super::*;

pub struct Pd {
    pub(super) pd: NonNull<ibv_pd>,
    pub(super) ctx: Arc<Context>,
}

// SAFETY: Send + Sync: see the module doc. Drop: children (QP, MR, AH) hold an Arc of this
// PD, so none is left.
owns_verbs_object!(Pd, pd, ibv_dealloc_pd);

impl Pd {
    pub fn alloc(ctx: &Arc<Context>) -> Result<Arc<Pd>, RdmaError> {
        // SAFETY: valid context.
        let pd = unsafe { ibv_alloc_pd(ctx.ctx.as_ptr()) };
        let pd = NonNull::new(pd)
            .ok_or_else(|| verbs_err(&ctx.name, "ibv_alloc_pd", io::Error::last_os_error()))?;
        Ok(Arc::new(Pd {
            pd,
            ctx: ctx.clone(),
        }))
    }
}

pub struct Ah {
    pub(super) ah: NonNull<ibv_ah>,
    pub(super) _pd: Arc<Pd>,
}

// SAFETY: Send + Sync: see the module doc. Drop: callers destroy an AH only after its sends
// completed (see endpoint).
owns_verbs_object!(Ah, ah, ibv_destroy_ah);

/// Path attributes of an address handle.
#[derive(Debug, Clone, Copy)]
pub struct AhSpec {
    pub dgid: Ipv6Addr,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub service_level: u8,
    pub port: u8,
}

impl Ah {
    pub fn create(pd: &Arc<Pd>, s: &AhSpec) -> Result<Ah, RdmaError> {
        // SAFETY: zeroed plain struct, filled below; the call copies it.
        let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
        attr.is_global = 1;
        attr.grh.dgid = ibv_gid {
            raw: s.dgid.octets(),
        };
        attr.grh.flow_label = s.flow_label & 0xF_FFFF;
        attr.grh.sgid_index = s.sgid_index;
        attr.grh.hop_limit = s.hop_limit;
        attr.grh.traffic_class = s.traffic_class;
        attr.sl = s.service_level;
        attr.port_num = s.port;
        let ah = unsafe { ibv_create_ah(pd.pd.as_ptr(), &mut attr) };
        NonNull::new(ah)
            .map(|ah| Ah {
                ah,
                _pd: pd.clone(),
            })
            .ok_or_else(|| verbs_err(&pd.ctx.name, "ibv_create_ah", io::Error::last_os_error()))
    }
}
