//! The storage tier's file on this machine's disk: pages round-trip through io_uring with O_DIRECT, many in
//! flight; a page changed on disk, or cut short, is an error naming its slot; a tier's file from an earlier run
//! is reset, one a live tier holds is refused and left as it is, anybody else's file is left alone; bad requests are typed errors that harm nothing; pages written
//! compressed take fewer blocks, incompressible ones are stored as they are, and a packed slot changed on disk
//! is an error too.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use vfabric_transport::storage::{AlignedBuffer, Compression, StorageError, StorageFile, StorageSpec};

const PAGE: u64 = 64 << 10;

fn path(name: &str) -> PathBuf {
    // Cargo's scratch folder for integration tests: on the build's disk, where O_DIRECT works (tmpfs has none).
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("storage-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

fn tier(name: &str, pages: u64) -> StorageFile {
    StorageFile::create(&StorageSpec { path: path(name), bytes: pages * PAGE, page_size: PAGE, depth: 8 })
        .expect("create the tier")
}

fn page(seed: u64) -> AlignedBuffer {
    let mut b = AlignedBuffer::new(PAGE as usize).unwrap();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in b.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    b
}

fn read_back(t: &StorageFile, slots: &[u64]) -> Result<Vec<AlignedBuffer>, StorageError> {
    let mut bufs: Vec<AlignedBuffer> = slots.iter().map(|_| AlignedBuffer::new(PAGE as usize).unwrap()).collect();
    let mut reqs: Vec<(u64, &mut [u8])> = slots.iter().copied().zip(bufs.iter_mut().map(|b| &mut b[..])).collect();
    t.read(&mut reqs)?;
    Ok(bufs)
}

#[test]
fn pages_round_trip_many_in_flight() {
    let t = tier("round-trip", 64);
    let pages: Vec<AlignedBuffer> = (0..64).map(page).collect();
    // 64 pages through a ring of 8, in an order that is not the file's.
    let order: Vec<u64> = (0..64).map(|i| (i * 37) % 64).collect();
    let reqs: Vec<(u64, &[u8])> = order.iter().map(|&s| (s, &pages[s as usize][..])).collect();
    t.write(&reqs, Compression::None).expect("write");
    let got = read_back(&t, &(0..64).collect::<Vec<_>>()).expect("read");
    for (s, (g, w)) in got.iter().zip(&pages).enumerate() {
        assert!(g[..] == w[..], "slot {s}");
    }
    // Rewriting a slot replaces its page.
    let new = page(1000);
    t.write(&[(5, &new[..])], Compression::None).expect("rewrite");
    assert!(read_back(&t, &[5]).unwrap()[0][..] == new[..]);
    let file = t.path().to_owned();
    drop(t);
    assert!(!file.exists(), "the fabric removes the tier's file");
}

#[test]
fn a_page_changed_or_cut_short_on_disk_is_an_error_naming_its_slot() {
    let t = tier("corrupt", 8);
    let pages: Vec<AlignedBuffer> = (0..8).map(|i| page(i + 50)).collect();
    let reqs: Vec<(u64, &[u8])> = pages.iter().enumerate().map(|(i, p)| (i as u64, &p[..])).collect();
    t.write(&reqs, Compression::None).expect("write");
    // One byte of slot 3 changes behind the tier's back.
    let other = std::fs::OpenOptions::new().write(true).open(t.path()).unwrap();
    other.write_at(&[pages[3][100] ^ 0xFF], t.slot_offset(3) + 100).unwrap();
    other.sync_all().unwrap();
    match read_back(&t, &[2, 3, 4]) {
        Err(StorageError::Corrupt { slot: 3, .. }) => {}
        other => panic!("expected slot 3 to be corrupt, got {:?}", other.map(|_| ())),
    }
    assert!(read_back(&t, &[2, 4]).is_ok(), "the other slots are intact");
    // The file loses its last pages.
    other.set_len(t.slot_offset(6)).unwrap();
    match read_back(&t, &[7]) {
        Err(StorageError::Short { slot: 7, op: "read", got: 0, .. }) => {}
        other => panic!("expected a short read of slot 7, got {:?}", other.map(|_| ())),
    }
    assert!(read_back(&t, &[5]).is_ok());
}

#[test]
fn an_earlier_runs_tier_is_reset_and_anybody_elses_file_left_alone() {
    let t = tier("earlier", 4);
    let p = page(7);
    t.write(&[(0, &p[..])], Compression::None).unwrap();
    // A crashed run's file: a copy of a live tier's.
    let stale = path("stale");
    std::fs::copy(t.path(), &stale).unwrap();
    let again = StorageFile::create(&StorageSpec { path: stale.clone(), bytes: 4 * PAGE, page_size: PAGE, depth: 4 })
        .expect("an earlier run's tier is reset");
    assert!(matches!(read_back(&again, &[0]), Err(StorageError::NeverWritten { slot: 0 })), "nothing trusted");
    drop(again);
    let foreign = path("foreign");
    std::fs::write(&foreign, b"somebody's data").unwrap();
    let refused =
        StorageFile::create(&StorageSpec { path: foreign.clone(), bytes: 4 * PAGE, page_size: PAGE, depth: 4 });
    assert!(matches!(refused, Err(StorageError::Foreign { .. })), "{:?}", refused.err());
    assert_eq!(std::fs::read(&foreign).unwrap(), b"somebody's data");
}

#[test]
fn a_live_tiers_file_is_refused_until_its_tier_is_dropped() {
    let t = tier("live", 4);
    let p = page(11);
    t.write(&[(0, &p[..]), (3, &p[..])], Compression::None).unwrap();
    let spec = StorageSpec { path: t.path().to_owned(), bytes: 4 * PAGE, page_size: PAGE, depth: 4 };
    let len = std::fs::metadata(t.path()).unwrap().len();
    match StorageFile::create(&spec) {
        Err(e @ StorageError::InUse { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&t.path().display().to_string()) && text.contains("in use"), "{text}");
        }
        other => panic!("a second tier on a live tier's file: {:?}", other.map(|_| ())),
    }
    // The live tier's file is as it was, and its pages read back.
    assert_eq!(std::fs::metadata(t.path()).unwrap().len(), len, "the live tier's file is not reset");
    let got = read_back(&t, &[0, 3]).expect("the live tier reads its pages back");
    assert!(got[0][..] == p[..] && got[1][..] == p[..]);
    drop(t);
    assert!(!spec.path.exists(), "the first tier removed its file");
    // Its lock went with it: the path is free, and a tier there starts empty.
    let next = StorageFile::create(&spec).expect("a tier after the first was dropped");
    assert_eq!(next.stored(), (0, 0));
    assert!(matches!(read_back(&next, &[0]), Err(StorageError::NeverWritten { slot: 0 })));
    // A tier's file with pages whose tier is gone (a copy: nobody holds its lock) is reset, as a crashed run's.
    next.write(&[(1, &p[..])], Compression::None).unwrap();
    let stale = path("live-stale");
    std::fs::copy(next.path(), &stale).unwrap();
    let reset = StorageFile::create(&StorageSpec { path: stale, ..spec.clone() }).expect("an unheld tier file");
    assert!(matches!(read_back(&reset, &[1]), Err(StorageError::NeverWritten { slot: 1 })), "nothing trusted");
    assert!(read_back(&next, &[1]).unwrap()[0][..] == p[..], "the live tier is untouched by the other path's");
}

#[test]
fn bad_requests_are_typed_errors_and_harm_nothing() {
    let t = tier("bad", 4);
    let good = page(9);
    t.write(&[(1, &good[..])], Compression::None).unwrap();
    let big = AlignedBuffer::new(2 * PAGE as usize).unwrap();
    let unaligned = &big[512..512 + PAGE as usize];
    assert!(matches!(t.write(&[(0, unaligned)], Compression::None), Err(StorageError::BadBuffer { slot: 0, .. })));
    assert!(
        matches!(t.write(&[(0, &big[..])], Compression::None), Err(StorageError::BadBuffer { .. })),
        "two pages for one slot"
    );
    assert!(matches!(
        t.write(&[(4, &good[..])], Compression::None),
        Err(StorageError::NoSuchSlot { slot: 4, slots: 4 })
    ));
    assert!(matches!(
        t.write(&[(2, &good[..]), (2, &good[..])], Compression::None),
        Err(StorageError::DuplicateSlot { slot: 2 })
    ));
    assert!(matches!(read_back(&t, &[3]), Err(StorageError::NeverWritten { slot: 3 })));
    t.forget(1).unwrap();
    assert!(matches!(read_back(&t, &[1]), Err(StorageError::NeverWritten { slot: 1 })));
    for (bytes, page_size, depth) in [(PAGE + 1, PAGE, 4), (4 * 1000, 1000, 4), (0, PAGE, 4), (PAGE, PAGE, 3)] {
        let spec = StorageSpec { path: path("invalid"), bytes, page_size, depth };
        assert!(matches!(StorageFile::create(&spec), Err(StorageError::InvalidSpec(_))), "{spec:?}");
    }
    // The tier still works.
    t.write(&[(2, &good[..])], Compression::None).unwrap();
    assert!(read_back(&t, &[2]).unwrap()[0][..] == good[..]);
}

/// A page that compresses: runs of a few values (zeros, a small integer pattern), `seed` placed here and there.
fn sparse_page(seed: u64) -> AlignedBuffer {
    let mut b = AlignedBuffer::new(PAGE as usize).unwrap();
    for (i, chunk) in b.chunks_mut(4096).enumerate() {
        chunk[..8].copy_from_slice(&(seed * 1000 + i as u64).to_le_bytes());
    }
    b
}

#[test]
fn compressed_pages_take_fewer_blocks_and_round_trip() {
    for codec in [Compression::Lz4, Compression::Zstd] {
        compressed_round_trip(codec);
    }
}

fn compressed_round_trip(codec: Compression) {
    let t = tier(&format!("compressed-{codec}"), 32);
    // Slots 0..16 compressible, 16..32 incompressible: all in one request, with compression on.
    let pages: Vec<AlignedBuffer> = (0..32).map(|i| if i < 16 { sparse_page(i) } else { page(i) }).collect();
    let reqs: Vec<(u64, &[u8])> = pages.iter().enumerate().map(|(i, p)| (i as u64, &p[..])).collect();
    t.write(&reqs, codec).expect("write");
    let (bytes, held) = t.stored();
    assert_eq!(held, 32);
    assert!(bytes < 16 * PAGE + 16 * 8192, "16 pages packed into a block or two each: {bytes} bytes");
    assert!(bytes >= 16 * PAGE, "incompressible pages are stored whole");
    let got = read_back(&t, &(0..32).rev().collect::<Vec<_>>()).expect("read");
    for (k, g) in got.iter().enumerate() {
        assert!(g[..] == pages[31 - k][..], "slot {}", 31 - k);
    }
    // Rewritten without compression, a slot holds its page whole.
    t.write(&[(0, &pages[20][..])], Compression::None).unwrap();
    assert!(read_back(&t, &[0]).unwrap()[0][..] == pages[20][..]);
    assert!(t.stored().0 >= 17 * PAGE);
}

#[test]
fn a_packed_page_changed_on_disk_is_an_error_naming_its_slot() {
    let t = tier("packed-corrupt", 4);
    let pages: Vec<AlignedBuffer> = (0..4).map(sparse_page).collect();
    let reqs: Vec<(u64, &[u8])> = pages.iter().enumerate().map(|(i, p)| (i as u64, &p[..])).collect();
    // Slots 0 and 1 packed with LZ4, 2 and 3 with zstd.
    t.write(&reqs[..2], Compression::Lz4).unwrap();
    t.write(&reqs[2..], Compression::Zstd).unwrap();
    let other = std::fs::OpenOptions::new().read(true).write(true).open(t.path()).unwrap();
    // Slot 1's packed bytes (LZ4): scramble a run of them; slot 2's (zstd): flip one byte.
    other.write_at(&[0xAB; 64], t.slot_offset(1) + 16).unwrap();
    let mut b = [0u8; 1];
    other.read_at(&mut b, t.slot_offset(2) + 3).unwrap();
    other.write_at(&[b[0] ^ 0x01], t.slot_offset(2) + 3).unwrap();
    other.sync_all().unwrap();
    for slot in [1u64, 2] {
        match read_back(&t, &[slot]) {
            Err(e @ (StorageError::Corrupt { .. } | StorageError::Undecodable { .. })) => {
                assert!(e.is_corrupt());
                assert!(e.to_string().contains(&format!("slot {slot}")), "{e}");
            }
            other => panic!("expected slot {slot} to be corrupt, got {:?}", other.map(|_| ())),
        }
    }
    let ok = read_back(&t, &[0, 3]).expect("the other slots are intact");
    assert!(ok[0][..] == pages[0][..] && ok[1][..] == pages[3][..]);
}

#[test]
fn pages_packed_elsewhere_are_stored_as_they_are_and_checked_when_read() {
    use vfabric_transport::storage::Packer;
    let t = tier("write-packed", 4);
    let pages: Vec<AlignedBuffer> = (0..3).map(sparse_page).collect();
    let mut packer = Packer::default();
    let packed: Vec<Vec<u8>> =
        pages.iter().map(|p| packer.pack(Compression::Lz4, p).expect("shrinks").to_vec()).collect();
    let sum = |b: &[u8]| xxhash_rust::xxh3::xxh3_64(b);
    // Slot 2's checksum is not its bytes': the bytes changed after they were packed.
    let reqs: Vec<(u64, &[u8], u64)> =
        vec![(0, &packed[0], sum(&packed[0])), (1, &packed[1], sum(&packed[1])), (2, &packed[2], sum(&packed[2]) ^ 1)];
    t.write_packed(&reqs, Compression::Lz4).expect("write packed");
    let (bytes, held) = t.stored();
    assert_eq!(held, 3);
    assert!(bytes <= 3 * 4096, "packed pages take their blocks only: {bytes} bytes");
    let got = read_back(&t, &[1, 0]).expect("read");
    assert!(got[0][..] == pages[1][..] && got[1][..] == pages[0][..]);
    match read_back(&t, &[2]) {
        Err(e @ StorageError::Corrupt { slot: 2, .. }) => assert!(e.to_string().contains("slot 2"), "{e}"),
        other => panic!("a page whose bytes do not match its checksum: {:?}", other.map(|_| ())),
    }
    // Refused, and nothing changes: a codec that is not lossless, bytes that save no block.
    let whole = page(9);
    for (codec, bytes) in [(Compression::None, &packed[0][..]), (Compression::Lz4, &whole[..PAGE as usize - 100])] {
        match t.write_packed(&[(0, bytes, sum(bytes))], codec) {
            Err(StorageError::InvalidSpec(_)) => {}
            other => panic!("{codec}: {other:?}"),
        }
    }
    assert!(read_back(&t, &[0]).expect("slot 0 intact")[0][..] == pages[0][..]);
}

/// A batch of pages of every kind, `k % 3`: compressible, incompressible, one byte repeated.
fn mixed_page(k: u64) -> AlignedBuffer {
    match k % 3 {
        0 => sparse_page(k),
        1 => page(k),
        _ => {
            let mut b = AlignedBuffer::new(PAGE as usize).unwrap();
            b.fill(k as u8);
            b
        }
    }
}

#[test]
fn a_large_batch_of_mixed_pages_is_packed_and_expanded_alike_on_several_threads() {
    use std::collections::HashSet;
    use vfabric_transport::storage::Packer;
    const PAGES: u64 = 48;
    for codec in [Compression::Lz4, Compression::Zstd] {
        let t = tier(&format!("mixed-{codec}"), PAGES);
        let pages: Vec<AlignedBuffer> = (0..PAGES).map(mixed_page).collect();
        // In an order that is not the file's, all in one call.
        let reqs: Vec<(u64, &[u8])> =
            (0..PAGES).map(|i| (i * 7) % PAGES).map(|s| (s, &pages[s as usize][..])).collect();
        t.write(&reqs, codec).expect("write");
        // The file's bytes: each compressible page as the codec packs it (zero to its block), each uniform one
        // as its byte, each incompressible one whole.
        let file = std::fs::File::open(t.path()).unwrap();
        let mut packer = Packer::default();
        for (s, p) in pages.iter().enumerate() {
            let (bytes, held) = t.stored_in([s as u64]);
            let want: Vec<u8> = match s % 3 {
                1 => p.to_vec(),
                _ => packer.pack(codec, p).expect("shrinks").to_vec(),
            };
            let stored = want.len().div_ceil(4096) * 4096;
            assert_eq!((bytes, held), (stored as u64, 1), "{codec} slot {s}");
            let mut on_disk = vec![0xEEu8; stored];
            file.read_exact_at(&mut on_disk, t.slot_offset(s as u64)).unwrap();
            assert!(on_disk[..want.len()] == want[..], "{codec} slot {s}: the file holds its packed bytes");
            assert!(on_disk[want.len()..].iter().all(|&b| b == 0), "{codec} slot {s}: zero to its block");
            if s % 3 == 2 {
                assert_eq!(want, [s as u8], "{codec} slot {s}: a uniform page packs to its byte");
            }
        }
        // Read back in another order, every page announced once, byte for byte.
        let order: Vec<u64> = (0..PAGES).map(|i| (i * 11 + 5) % PAGES).collect();
        let mut bufs: Vec<AlignedBuffer> = order.iter().map(|_| AlignedBuffer::new(PAGE as usize).unwrap()).collect();
        let mut reqs: Vec<(u64, &mut [u8])> = order.iter().copied().zip(bufs.iter_mut().map(|b| &mut b[..])).collect();
        let mut announced = HashSet::new();
        t.read_each(&mut reqs, |k| assert!(announced.insert(k), "{codec}: page {k} announced twice")).expect("read");
        assert_eq!(announced.len(), PAGES as usize, "{codec}");
        for (&s, b) in order.iter().zip(&bufs) {
            assert!(b[..] == pages[s as usize][..], "{codec} slot {s}");
        }
        // One packed slot changed on disk: the batch's read names it, and its other pages still arrive.
        let disk = std::fs::OpenOptions::new().write(true).open(t.path()).unwrap();
        disk.write_at(&[0xAB; 64], t.slot_offset(9) + 8).unwrap();
        disk.sync_all().unwrap();
        let mut bufs: Vec<AlignedBuffer> = order.iter().map(|_| AlignedBuffer::new(PAGE as usize).unwrap()).collect();
        let mut reqs: Vec<(u64, &mut [u8])> = order.iter().copied().zip(bufs.iter_mut().map(|b| &mut b[..])).collect();
        let mut arrived = 0;
        match t.read_each(&mut reqs, |_| arrived += 1) {
            Err(e) if e.is_corrupt() => assert!(e.to_string().contains("slot 9"), "{codec}: {e}"),
            other => panic!("{codec}: expected slot 9 to be corrupt, got {other:?}"),
        }
        assert_eq!(arrived, PAGES - 1, "{codec}: every other page arrives");
    }
}
