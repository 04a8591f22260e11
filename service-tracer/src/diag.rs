//! The eBPF programs' own diagnostics (aya-log records, such as "cannot read
//! ib_qp_attr.qp_state at 0x10"), turned into agent log lines. A broken offset would make
//! every event say the same: each distinct message is logged the first time and then at
//! powers of two, with its count, and the distinct messages are kept (bounded) for the
//! operator and the tests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Distinct messages kept; later new ones are counted, not stored.
pub const MAX_DISTINCT: usize = 64;

#[derive(Clone, Default)]
pub struct Diagnostics {
    seen: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl Diagnostics {
    /// Every distinct message so far with how often it came.
    pub fn messages(&self) -> Vec<(String, u64)> {
        let g = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        g.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// Counts `msg`; Some(count) when this occurrence should be logged.
    pub fn note(&self, msg: &str) -> Option<u64> {
        let mut g = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let full = g.len() >= MAX_DISTINCT;
        let n = match g.get_mut(msg) {
            Some(n) => {
                *n += 1;
                *n
            }
            None if !full => {
                g.insert(msg.to_string(), 1);
                1
            }
            None => return None,
        };
        n.is_power_of_two().then_some(n)
    }
}

impl log::Log for Diagnostics {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let msg = name_fields(&record.args().to_string());
        if let Some(n) = self.note(&msg) {
            match record.level() {
                log::Level::Error | log::Level::Warn => {
                    tracing::warn!(occurrences = n, "eBPF: {msg}")
                }
                _ => tracing::info!(occurrences = n, "eBPF: {msg}"),
            }
        }
    }

    fn flush(&self) {}
}

/// The programs say "cannot read field 6" (an id is cheap to log from eBPF); the agent
/// says "cannot read ibv_qp_attr.qp_state".
pub fn name_fields(msg: &str) -> String {
    const AT: &str = "cannot read field ";
    match msg.find(AT) {
        Some(i) => {
            let rest = &msg[i + AT.len()..];
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            match rest[..digits].parse::<u8>() {
                Ok(id) => format!(
                    "{}cannot read {}{}",
                    &msg[..i],
                    rpingmesh_agent_common::event::field::name(id),
                    &rest[digits..]
                ),
                Err(_) => msg.to_string(),
            }
        }
        None => msg.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_ids_become_names() {
        use rpingmesh_agent_common::event::field;
        assert_eq!(
            name_fields(&format!(
                "rpingmesh: cannot read field {}",
                field::IBV_QP_ATTR__QP_STATE
            )),
            "rpingmesh: cannot read ibv_qp_attr.qp_state"
        );
        assert_eq!(
            name_fields("rpingmesh: cannot read field 250"),
            "rpingmesh: cannot read ?"
        );
        assert_eq!(name_fields("something else"), "something else");
        assert_eq!(
            field::name(field::SIGNAL_STRUCT__LIVE),
            "signal_struct.live"
        );
        assert_eq!(field::name(0), "?");
    }

    #[test]
    fn repeats_are_counted_and_logged_at_powers_of_two() {
        let d = Diagnostics::default();
        let logged: Vec<u64> = (0..9).filter_map(|_| d.note("cannot read x")).collect();
        assert_eq!(logged, vec![1, 2, 4, 8]);
        assert_eq!(d.messages(), vec![("cannot read x".to_string(), 9)]);
        for i in 0..(2 * MAX_DISTINCT) {
            d.note(&format!("m{i}"));
        }
        assert_eq!(d.messages().len(), MAX_DISTINCT, "bounded");
    }
}
