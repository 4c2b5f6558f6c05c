//! Chunk headers as they arrive for one payload: any 20 bytes decode (the checksum is what catches a wrong one),
//! and the payload's bookkeeping places a chunk only inside the payload, right after the one before (so a
//! payload it calls complete had every byte exactly once), or refuses it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vfabric::proto::chunk::{ChunkHeader, Payload, CHUNK_HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let len = u64::from_le_bytes(data[..8].try_into().unwrap()) % (1 << 40);
    let max_chunk = 1 + u64::from_le_bytes(data[8..16].try_into().unwrap()) % (64 << 20);
    let mut payload = Payload::new(len, max_chunk);
    let mut placed = 0u64;
    for raw in data[16..].chunks_exact(CHUNK_HEADER_LEN) {
        let header = ChunkHeader::decode(raw.try_into().unwrap());
        assert_eq!(ChunkHeader::decode(&header.encode()), header, "a header round-trips");
        if let Ok(at) = payload.place(&header) {
            assert_eq!(at, placed, "a chunk placed anywhere but right after the last");
            let end = at.checked_add(u64::from(header.len)).expect("a placed chunk ends inside u64");
            assert!(end <= len, "a chunk placed past its payload: {at} + {} > {len}", header.len);
            assert!(u64::from(header.len) <= max_chunk, "a chunk larger than allowed was placed");
            placed = end;
        }
    }
    assert_eq!(payload.is_complete(), placed == len);
    assert_eq!(payload.finish().is_ok(), placed == len);
});
