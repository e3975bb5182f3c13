//! Generates the client of etcd's v3 API subset (proto/etcd.proto) that `gma bench etcd`
//! drives; the gma.v1 protocol itself is generated in the gma-proto crate.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&["proto/etcd.proto"], &["proto"])?;
    Ok(())
}
