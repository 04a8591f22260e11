//! rpingmesh-controller: RNIC registry (SQLite or etcd behind a trait, in-memory index),
//! pinglists with ECMP flow-label coverage, the Phase 1 analyzer and the operator API.
//!
//! Pure parts (`ecmp`, `liveness`, `pinglist`, `analyzer`, `service_paths`, `registry::RegistryIndex`)
//! do no I/O;
//! `service` and `server` are the thin gRPC layer over them; `leader` elects the replica
//! that analyzes when several share etcd.

pub mod actions;
pub mod analyzer;
pub mod audit;
pub mod auth;
pub mod config;
pub mod ecmp;
pub mod findings;
pub mod focus;
pub mod impact;
pub mod leader;
pub mod limits;
pub mod liveness;
pub mod localize;
pub mod pinglist;
pub mod registry;
pub mod server;
pub mod service;
pub mod service_paths;
pub mod state_gauges;
pub mod telemetry;
pub mod topology;
pub mod trace;
pub mod web;

pub use config::{CliArgs, ControllerConfig};
pub use server::{start, start_with_state, ServerHandle};
pub use service::ControllerState;
