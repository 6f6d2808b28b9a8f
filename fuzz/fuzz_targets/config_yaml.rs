//! Any bytes as one file of the config directory: parsed into the model's objects with
//! its problems reported, as `meshd serve --config-dir` parses each file. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = model::config::parse::parse_file("fuzz.yaml", &text);
});
