//! rpingmesh-agent: per RNIC one responder, one prober and one cluster monitor, plus one
//! metrics pipeline and one PathSummary reporter.
//!
//! The protocol logic lives in `rpingmesh-protocol` (sans-IO); this crate only drives it:
//! `rnic` owns a transport endpoint and runs the select loop, `cluster_monitor` keeps the
//! pinglists fresh, `report` ships per-path summaries, `telemetry` exports OTLP metrics.
//! `hostping` is the intra-host check (`hostping --once`) and `host_monitor` runs it
//! inside the agent; `open` opens the RNICs for both.

pub mod agent;
pub mod cluster_monitor;
pub mod config;
pub mod controller_client;
pub mod host_monitor;
pub mod hostping;
pub mod open;
pub mod rc_probe;
pub mod reopen;
pub mod report;
pub mod resident;
pub mod rnic;
pub mod service;
pub mod targets;
pub mod telemetry;
pub mod watchdog;
pub mod watchdog_sampler;
pub mod workload;

pub use config::{AgentConfig, CliArgs, ConfigError};
