#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rpingmesh_fuzz_targets::ebpf_event(data));
