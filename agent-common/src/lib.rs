//! Types shared by the agent and (later) its eBPF programs. `#![no_std]`.
#![no_std]

pub mod event;
pub mod wire;
