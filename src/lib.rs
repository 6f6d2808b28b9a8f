//! meshd: an Istio-compatible service-mesh control plane.
//!
//! Flow: `filesource` (and later `k8s`) → `model` → `translate` (pure) → `xds` → Envoy.

pub mod agent;
pub mod ca;
pub mod cli;
pub mod debug;
pub mod filesource;
pub mod grpc;
pub mod heap;
pub mod identity;
pub mod jwks;
pub mod k8s;
pub mod metrics;
pub mod resolve;
pub mod secure;
pub mod serve;
pub mod tls;
pub mod webhook;
pub mod xds;
