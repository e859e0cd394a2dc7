//! Compiles the agent protocol with protox, so that no system `protoc` is
//! needed to build llmgw.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/llmgw/v1/agent.proto", "proto/llmgw/v1/join.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // The rpc is named Connect, which would clash with the client's
        // generated `connect` constructor: clients are built from a Channel.
        .build_transport(false)
        // Small per-stream buffers: a server holds one stream per node
        // (`src/codec.rs`).
        .codec_path("crate::codec::SmallBuffers")
        .compile_fds(descriptors)?;
    Ok(())
}
