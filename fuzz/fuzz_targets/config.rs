//! A configuration file: any text is a configuration or a typed error naming what is wrong, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vfabric::ClusterConfig;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(cfg) = ClusterConfig::from_toml(text, "fuzz") {
            // What parses also passes the checks a configuration changed in code gets.
            cfg.check("fuzz").expect("a parsed configuration checks");
        }
    }
});
