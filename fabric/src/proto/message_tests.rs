//! The message enum's own tests: every variant sorted, named and at its wire index.

use super::*;
use std::collections::HashSet;

fn region() -> WireRegion {
    WireRegion { addr: (3u64 << 48) | 0x1000, len: 1 << 20, page_size: 1 << 16, slot: 7, generation: 2 }
}

/// One of each variant, in declaration order.
fn all() -> Vec<Message> {
    let region = region();
    vec![
        Message::Hello { cluster: "c".into(), node: 1, protocol: 1, lanes: 4, latency_lane: true },
        Message::Ping { nonce: 9 },
        Message::Alloc { size: 4096, device: None, replicas: 0, lag_ms: None, compression: 0, priority: 1 },
        Message::Free { region },
        Message::Write { region, offset: 0, len: 1 },
        Message::Read { region, offset: 0, len: 1 },
        Message::Acquire { region, offset: 0, len: 1, device: WireLocation::Host, mode: WireMode::Read, cached: None },
        Message::Release { lease: 1 },
        Message::Migrate { region, device: WireLocation::Gpu(0) },
        Message::Invalidate { region, first_page: 0, pages: 1 },
        Message::Welcome { node: 2, protocol: 1 },
        Message::Pong { nonce: 9 },
        Message::Allocated { region },
        Message::Done,
        Message::Data { len: 1 },
        Message::Granted { lease: 1, first_page: 0, pages: 1, version: 0, unchanged: false },
        Message::Error { kind: ErrorKind::Internal, message: "x".into() },
        Message::MigrateTo { region, node: 1, device: WireLocation::Gpu(0) },
        Message::Moved { to: region },
        Message::Unforward { region, to: region },
        Message::Attach,
        Message::Attached { page_size: 1 << 16, cuda: false, arenas: vec![] },
        Message::AllocWith {
            size: 1,
            device: None,
            priority: 1,
            tenant: 0,
            keep: false,
            compression: 0,
            reservation: Some(1),
            replicas: 2,
            lag_ms: Some(100),
        },
        Message::AcquireMapped { region, offset: 0, len: 1, device: WireLocation::Host, mode: WireMode::Write },
        Message::Mapped { lease: 1, first: 0, pages: WirePages::Run { offset: 0, len: 1 << 16 } },
        Message::Prefetch { region, offset: 0, len: 1, device: WireLocation::Gpu(0) },
        Message::Stats,
        Message::Figures { json: "{}".into() },
        Message::WriteBack { region, offset: 0, len: 1, device: WireLocation::Gpu(0) },
        Message::Reserve { device: WireLocation::Gpu(0), bytes: 1 << 20, tenant: 0 },
        Message::Reserved { id: 1, bytes: 1 << 20 },
        Message::Unreserve { id: 1 },
        Message::ReservationLeft { id: 1 },
        Message::Standby { region, origin: region, replicas: 2, tenant: 3, compression: 4, priority: 2 },
        Message::Replicate { copy: region, seq: 1, offset: 0, len: 1 },
        Message::Failover { region },
        Message::OnBehalf { tenant: 3 },
        Message::Status { node: Some(2) },
        Message::Traced { id: 1 << 48 | 7 },
        Message::Abandon { request: 1 << 48 | 7 },
        Message::ChannelJoin { link: 5, id: vec![7; 128], gpu: 1 },
        Message::AcquireBy { link: 5, region, offset: 0, len: 1, mode: WireMode::Read, cached: Some(3), runs: vec![1] },
        Message::ChannelGranted {
            lease: 1,
            first_page: 0,
            pages: 1,
            version: 3,
            unchanged: false,
            pieces: vec![1],
            sums: vec![9],
        },
    ]
}

#[test]
fn requests_and_responses_are_sorted() {
    let kinds: Vec<bool> = all().iter().map(Message::is_request).collect();
    let mut expected = vec![true; 10];
    expected.extend([false; 7]);
    expected.extend([true, false, true]);
    expected.extend([true, false, true, true, false, true, true, false, true]);
    expected.extend([true, false, true, true]);
    // Standby, Replicate, Failover, OnBehalf, Status, Traced, Abandon.
    expected.extend([true; 7]);
    // ChannelJoin, AcquireBy, ChannelGranted.
    expected.extend([true, true, false]);
    assert_eq!(kinds, expected);
}

#[test]
fn names_are_distinct_and_lowercase() {
    let names: Vec<&str> = all().iter().map(Message::name).collect();
    let distinct: HashSet<&str> = names.iter().copied().collect();
    assert_eq!(distinct.len(), names.len(), "{names:?}");
    assert!(names.iter().all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_lowercase())), "{names:?}");
    assert_eq!(Message::Read { region: region(), offset: 0, len: 0 }.name(), "read");
    let hello = Message::Hello { cluster: String::new(), node: 0, protocol: 0, lanes: 0, latency_lane: false };
    assert_eq!(hello.name(), "hello");
}

#[test]
fn variant_indices_are_the_wire_format() {
    // bincode's standard config writes the variant index as a one-byte varint first: pin it, so reordering the
    // enum (a silent wire break) fails here.
    for (index, msg) in all().iter().enumerate() {
        let bytes = bincode::encode_to_vec(msg, bincode::config::standard()).unwrap();
        assert_eq!(bytes[0] as usize, index, "{}", msg.name());
    }
}
