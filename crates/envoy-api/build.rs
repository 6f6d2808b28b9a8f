//! Generates the Rust messages (and, with the `grpc` feature, tonic services) from the
//! `FileDescriptorSet` the `envoy-types` package ships as `src/generated/types.bin`, so
//! that no protoc and no copy of Envoy's protos are needed, and keeps the set for
//! reflection.

use std::path::PathBuf;
use std::process::Command;

use prost::Message;

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../../Cargo.lock");
    let source = envoy_types_descriptors()?;
    let bytes = std::fs::read(&source)?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("descriptors.bin"), &bytes)?;
    let descriptors = prost_types::FileDescriptorSet::decode(&bytes[..])?;

    let mut config = prost_build::Config::new();
    config
        .compile_well_known_types()
        .enable_type_names()
        // `Name::type_url()` is what an `Any` carries: `type.googleapis.com/<full name>`.
        .type_name_domain(["."], "type.googleapis.com")
        // Envoy's comments are its documentation; leaving them out halves the code to compile.
        .disable_comments(["."])
        .include_file("mod.rs");
    #[cfg(feature = "grpc")]
    tonic_prost_build::configure()
        .compile_well_known_types(true)
        .compile_fds_with_config(descriptors, config)?;
    #[cfg(not(feature = "grpc"))]
    config.compile_fds(descriptors)?;
    Ok(())
}

/// `src/generated/types.bin` of the envoy-types package Cargo.lock pins.
fn envoy_types_descriptors() -> Result<PathBuf, Error> {
    // `cargo build` downloads only what it builds, and envoy-types is never built (see
    // Cargo.toml): when the offline call does not find it, the same call may fetch what
    // Cargo.lock pins.
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
    println!("cargo:rerun-if-changed={}", path.display());
    Ok(path)
}

/// `cargo metadata` of the workspace, offline or allowed to fetch what Cargo.lock pins.
fn cargo_metadata(offline: bool) -> Result<std::process::Output, Error> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command.args(["metadata", "--format-version", "1", "--locked"]);
    if offline {
        command.arg("--offline");
    }
    Ok(command
        .current_dir(std::env::var("CARGO_MANIFEST_DIR")?)
        .output()?)
}
