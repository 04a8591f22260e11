//! gRPC contracts of rpingmesh.
//!
//! `controller_agent` is wire-compatible with the Go/Zig R-Pingmesh: same package, service,
//! method names, field numbers and types. Additions take new numbers only.

pub mod endpoint;
pub mod gid;
pub mod host;
pub mod json;

pub mod controller_agent {
    tonic::include_proto!("controller_agent");
}

// Nested as the package path so generated `super::` references resolve.
pub mod rpingmesh {
    pub mod operator {
        pub mod v1 {
            tonic::include_proto!("rpingmesh.operator.v1");
        }
    }
}

/// The operator API (`rpingmesh.operator.v1`).
pub use rpingmesh::operator::v1 as operator;

pub use gid::{normalize_gid, GidError};
