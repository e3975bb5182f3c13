/// The public .proto files (every one compiles with the others in any language).
const PUBLIC: [&str; 5] = [
    "proto/gma.proto",
    "proto/services.proto",
    "proto/broker.proto",
    "proto/netprobe.proto",
    "proto/federation.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // Build scripts are single threaded; set PROTOC for prost-build.
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=proto");
    // Every service decodes with crate::codec: an undecodable message is INVALID_ARGUMENT.
    let codec = "crate::codec::ProstCodec";
    tonic_prost_build::configure()
        .codec_path(codec)
        // Probe payloads are slices of one shared buffer, never copied per chunk.
        .bytes(".gma.v1.BulkChunk.data")
        .bytes(".gma.v1.EchoRequest.payload")
        .bytes(".gma.v1.EchoResponse.payload")
        .compile_protos(&PUBLIC, &["proto"])?;
    // Every public service and the raft service in one FileDescriptorSet
    // (`gma_proto::FILE_DESCRIPTOR_SET`): what the door census enumerates, and what gRPC
    // reflection can serve. The code of this run is not used (out_dir is a scratch folder).
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let scratch = out_dir.join("descriptor-scratch");
    std::fs::create_dir_all(&scratch)?;
    tonic_prost_build::configure()
        .codec_path(codec)
        .build_client(false)
        .build_server(false)
        .out_dir(&scratch)
        .file_descriptor_set_path(out_dir.join("gma_descriptor.bin"))
        .compile_protos(&[&PUBLIC[..], &["proto/raft.proto"]].concat(), &["proto"])?;
    // The directory's internal RPCs and its raft log on disk, which embeds gma.v1 records.
    tonic_prost_build::configure()
        .codec_path(codec)
        .extern_path(".gma.v1", "crate::v1")
        .compile_protos(&["proto/raft.proto"], &["proto"])?;
    // The producer's side of the two streaming services whose batches travel pre-encoded:
    // the server of `Producer` and the client of `Consumer`, generated from the one declaration
    // in services.proto, with the two stream messages that carry an `EventBatch` taken from
    // `crate::wire` (Rust twins with the batch as bytes; same field numbers, same bytes on the
    // wire) and every other message from `crate::v1`. Nothing in proto/ declares a service
    // twice, so every .proto of the folder compiles together in any language.
    let out = out_dir.join("wire");
    std::fs::create_dir_all(&out)?;
    tonic_prost_build::configure()
        .codec_path(codec)
        .out_dir(&out)
        .extern_path(".gma.v1", "crate::v1")
        .extern_path(".gma.v1.SubscribeResponse", "crate::wire::SubscribeResponse")
        .extern_path(".gma.v1.DeliverRequest", "crate::wire::DeliverRequest")
        .compile_protos(&["proto/services.proto"], &["proto"])?;
    Ok(())
}
