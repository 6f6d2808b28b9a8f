//! Compiles `proto/ca.proto` (Istio's CA service) with protox, so no protoc
//! binary is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["proto/ca.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .btree_map(".")
        .compile_fds(descriptors)?;
    Ok(())
}
