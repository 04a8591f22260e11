#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rpingmesh_fuzz_targets::cert_names(data));
