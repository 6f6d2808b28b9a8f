//! Test support shared by meshd's tests, benchmarks and the fleet simulator. The product
//! never depends on it.

pub mod mesh;
pub mod ports;
