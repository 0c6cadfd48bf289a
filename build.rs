//! Compiles the project's own `.proto` files with protox (pure Rust, no system `protoc`)
//! and generates prost messages plus tonic clients and servers. `bytes` fields become
//! `bytes::Bytes` so object payloads are never copied on their way through.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/google/rpc/status.proto",
        "proto/google/longrunning/operations.proto",
        "proto/google/storage/v2/storage.proto",
        "proto/google/storage/control/v2/storage_control.proto",
    ];
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .bytes(".")
        .compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
