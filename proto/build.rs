fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Vendored protoc: no system protobuf-compiler needed for our own protos.
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    std::env::set_var("PROTOC", protoc);
    tonic_prost_build::configure()
        // The controller stores registered RNICs as this message's JSON (etcd).
        .type_attribute(
            ".controller_agent.RnicInfo",
            "#[derive(serde::Serialize, serde::Deserialize)]",
        )
        .compile_protos(
            &["proto/controller_agent.proto", "proto/operator.proto"],
            &["proto"],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
