//! meshd: an Istio-compatible service-mesh control plane.
//!
//! The `meshd` binary's wiring: sources (files, Kubernetes, JWKS), the CA, the admin and
//! debug views, the webhook and the CLI, around the crates that carry the flow: `model` →
//! `translate` (pure) → `xds` → Envoy.

pub mod agent;
pub mod ca;
pub mod cli;
pub mod debug;
pub mod dump;
pub mod filesource;
#[cfg(test)]
mod golden;
pub mod heap;
pub mod inject;
pub mod jwks;
pub mod k8s;
pub mod metrics;
pub mod operator;
pub mod resolve;
pub mod secure;
pub mod serve;
pub mod webhook;
