//! Compiles Istio's DNS name table message (`proto/nds.proto` at the repository's top)
//! with protox, so no protoc binary is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    println!(
        "cargo:rerun-if-changed={}",
        proto.join("nds.proto").display()
    );
    let descriptors = protox::compile([proto.join("nds.proto")], [&proto])?;
    // Maps in name order, so that an unchanged table encodes to the same bytes (and the
    // same version) every time.
    prost_build::Config::new()
        .btree_map(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
