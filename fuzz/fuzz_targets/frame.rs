//! A control frame as a peer or a local client may send it: any bytes decode to a message or a typed error,
//! never a panic or an allocation past the frame limit; what decodes re-encodes to a frame that decodes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vfabric::proto::codec::{encode, read_frame_blocking};

/// The largest frame the fuzzer's decoder takes (the agent's limit is configured; this keeps runs fast).
const MAX: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let mut input = data;
    while let Ok(Some(msg)) = read_frame_blocking(&mut input, MAX) {
        let mut out = Vec::new();
        encode(&msg, MAX, &mut out).expect("a decoded message encodes");
        let again = read_frame_blocking(&mut &out[..], MAX).expect("its frame decodes").expect("a frame");
        assert_eq!(again, msg, "a frame round-trips");
    }
});
