//! rpingmesh-agent: per RNIC one responder, one prober and one cluster monitor, plus one
//! metrics pipeline and one PathSummary reporter.
//!
//! The protocol logic lives in `rpingmesh-protocol` (sans-IO); this crate only drives it:
//! `rnic` owns a transport endpoint and runs the select loop, `cluster_monitor` keeps the
//! pinglists fresh, `report` ships per-path summaries, `telemetry` exports OTLP metrics.

pub mod agent;
pub mod cluster_monitor;
pub mod config;
pub mod controller_client;
pub mod hostping;
pub mod reopen;
pub mod report;
pub mod rnic;
pub mod service;
pub mod targets;
pub mod telemetry;
pub mod watchdog;
pub mod watchdog_sampler;

pub use config::{AgentConfig, CliArgs, ConfigError};
