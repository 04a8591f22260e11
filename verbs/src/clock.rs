//! Clocks read by the agent (T1, T6) and the transports.

/// CLOCK_MONOTONIC in ns.
pub fn monotonic_ns() -> u64 {
    todo!()
}

/// CLOCK_REALTIME in ns (the clock of kernel software timestamps; also window alignment).
pub fn realtime_ns() -> u64 {
    todo!()
}
