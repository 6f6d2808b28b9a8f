//! Compiles `proto/ca.proto` (Istio's CA service) with protox, so no protoc
//! binary is needed, and copies the descriptor set envoy-types ships (every Envoy
//! message) for the debug views' JSON, which must read like Envoy's own admin
//! `/config_dump`.

use std::path::PathBuf;
use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=Cargo.lock");
    let descriptors = protox::compile(["proto/ca.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .btree_map(".")
        .compile_fds(descriptors)?;

    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::copy(
        envoy_types_descriptors()?,
        out.join("envoy_descriptors.bin"),
    )?;
    Ok(())
}

/// `src/generated/types.bin` of the envoy-types package this build resolved.
fn envoy_types_descriptors() -> Result<PathBuf, Box<dyn std::error::Error>> {
    // `cargo metadata` reads the manifest of every package in the lock file, dev-dependencies
    // included, but `cargo build` and `cargo run` fetch only what they build: on a fresh
    // machine the offline call fails for want of a benchmark's dependency. Then the same
    // call may fetch (only what Cargo.lock pins).
    let output = match cargo_metadata(true)? {
        output if output.status.success() => output,
        _ => cargo_metadata(false)?,
    };
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let manifest = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "envoy-types")
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("envoy-types is not among the resolved packages")?;
    let path = PathBuf::from(manifest)
        .parent()
        .ok_or("envoy-types manifest has no directory")?
        .join("src/generated/types.bin");
    if !path.is_file() {
        return Err(format!("{} is missing", path.display()).into());
    }
    Ok(path)
}

/// `cargo metadata` for this target, offline or allowed to fetch what Cargo.lock pins.
fn cargo_metadata(offline: bool) -> Result<std::process::Output, Box<dyn std::error::Error>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command.args(["metadata", "--format-version", "1", "--locked"]);
    if offline {
        command.arg("--offline");
    }
    let output = command
        .args(["--filter-platform", &std::env::var("TARGET")?])
        .current_dir(std::env::var("CARGO_MANIFEST_DIR")?)
        .output()?;
    Ok(output)
}
