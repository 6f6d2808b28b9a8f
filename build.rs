//! Compiles `proto/` (Istio's CA service) with protox, so no protoc binary is needed, and
//! copies the descriptor set envoy-types ships (every Envoy message) for the debug views'
//! JSON, which must read like Envoy's own admin `/config_dump`.

use std::path::PathBuf;
use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=Cargo.lock");
    let descriptors = protox::compile(["proto/ca.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;

    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::copy(
        envoy_types_descriptors()?,
        out.join("envoy_descriptors.bin"),
    )?;
    Ok(())
}

/// `src/generated/types.bin` of the envoy-types package this build resolved.
fn envoy_types_descriptors() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Offline and for this target only: the build has already fetched exactly that.
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--locked"])
        .args(["--filter-platform", &std::env::var("TARGET")?])
        .current_dir(std::env::var("CARGO_MANIFEST_DIR")?)
        .output()?;
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
