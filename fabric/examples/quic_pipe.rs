//! Raw QUIC throughput with vfabric's settings: two endpoints in one process on loopback, mutual TLS,
//! `CONNS` connections between them with `STREAMS` unidirectional streams each, 1 MiB checksummed chunks (one
//! buffer handed to quinn each time, as quinn's perf tool does), no fabric behind either end. The floor under
//! `vfabric-bench remote`: what the transport alone reaches on this machine.
//!
//! `cargo run --release -p vfabric --example quic_pipe -- [MTU] [MiB] [STREAMS] [CONNS]`
//! (`PIPE_WINDOW_MIB` sets the stream window, default 16; the connection window is four times it;
//! `PIPE_ENDPOINTS=1` gives each connection an endpoint (socket) of its own; `PIPE_PARTS=1` has the receiver take
//! each chunk as quinn's buffers, `QuicChunks`, instead of copying it out with `StreamChunks`).
//!
//! Each end runs on a runtime of its own, as two processes would: one thread when `CONNS` is 1, else `CONNS`
//! worker threads, so that each connection's packets can be built, encrypted and read on a core of its own.

use std::time::Instant;

use vfabric::proto::chunk::{ChunkError, ChunkRead, StreamChunks};
use vfabric::proto::quic::{send_chunk, QuicChunks};
use vfabric_transport::quic::{self, ClusterCa, QuicSettings};

fn runtime(conns: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if conns <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(conns).enable_all().build()
    }
}

fn arg<T: std::str::FromStr>(i: usize, default: T) -> T {
    std::env::args().nth(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let conns: usize = arg(4, 1);
    runtime(conns)?.block_on(run(conns.max(1)))
}

async fn run(conns: usize) -> Result<(), Box<dyn std::error::Error>> {
    let mtu: u16 = arg(1, 6500);
    let mib: u64 = arg(2, 1024);
    let streams: u64 = arg(3, 1);
    let ca = ClusterCa::generate("pipe")?;
    let window: u64 = std::env::var("PIPE_WINDOW_MIB").ok().and_then(|s| s.parse().ok()).unwrap_or(16);
    let settings = QuicSettings {
        mtu,
        stream_window: window << 20,
        connection_window: (4 * window) << 20,
        ..QuicSettings::default()
    };
    let settings_b = settings.clone();
    let separate = std::env::var_os("PIPE_ENDPOINTS").is_some();
    let in_parts = std::env::var_os("PIPE_PARTS").is_some();
    let a = quic::endpoint("127.0.0.1:0".parse()?, &ca.issue("a")?, &settings)?;
    let b_id = ca.issue("b")?;
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        runtime(conns)?.block_on(async move {
            // One endpoint (UDP socket) for all connections, or one each with PIPE_ENDPOINTS set.
            let n_ep = if separate { conns } else { 1 };
            let mut eps = Vec::new();
            for _ in 0..n_ep {
                let b = quic::endpoint("127.0.0.1:0".parse()?, &b_id, &settings_b)?;
                addr_tx.send(b.local_addr()?)?;
                eps.push(b);
            }
            let mut accepted = Vec::new();
            for i in 0..conns {
                accepted.push(eps[i % n_ep].accept().await.ok_or("no connection")?.await?);
            }
            let mut tasks = Vec::new();
            for conn in accepted {
                for _ in 0..streams {
                    let mut rs = conn.accept_uni().await?;
                    tasks.push(tokio::spawn(async move {
                        let mut got = 0u64;
                        if in_parts {
                            // The payloads as quinn's buffers, checksummed where they lie, never copied.
                            let mut chunks = QuicChunks::new(&mut rs);
                            while let Some(header) = chunks.next_header().await? {
                                chunks.next_payload(&header).await?;
                                got += u64::from(header.len);
                            }
                        } else {
                            let mut chunks = StreamChunks::new(&mut rs, 1 << 20);
                            while let Some(header) = chunks.next_header().await? {
                                got += chunks.next_payload(&header).await?.iter().map(|p| p.len() as u64).sum::<u64>();
                            }
                        }
                        Ok::<u64, ChunkError>(got)
                    }));
                }
            }
            let mut total = 0;
            for t in tasks {
                total += t.await??;
            }
            Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(total)
        })
    });
    let mut links = Vec::new();
    let a_id = ca.issue("a")?;
    let mut b_addrs = Vec::new();
    for _ in 0..(if separate { conns } else { 1 }) {
        b_addrs.push(addr_rx.recv()?);
    }
    let mut eps = vec![a];
    for i in 0..conns {
        if separate && i > 0 {
            eps.push(quic::endpoint("127.0.0.1:0".parse()?, &a_id, &settings)?);
        }
        let ep = &eps[if separate { i } else { 0 }];
        links.push(quic::connect(ep, b_addrs[i % b_addrs.len()], "b").await?);
    }
    let payload = bytes::Bytes::from(vec![0x5Au8; 1 << 20]);
    let per_stream = mib / (streams * conns as u64);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for conn in &links {
        for _ in 0..streams {
            let (c, p) = (conn.clone(), payload.clone());
            tasks.push(tokio::spawn(async move {
                let mut s = c.open_uni().await.map_err(|e| e.to_string())?;
                for i in 0..per_stream {
                    send_chunk(&mut s, i << 20, p.clone(), vfabric::Compression::None)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                s.finish().map_err(|e| e.to_string())?;
                s.stopped().await.map_err(|e| e.to_string())?;
                Ok::<(), String>(())
            }));
        }
    }
    for t in tasks {
        t.await??;
    }
    let got = server.join().map_err(|_| "server thread panicked")?.map_err(|e| e.to_string())?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "mtu {mtu}, {conns} connection(s) x {streams} stream(s): {} MiB in {secs:.2} s = {:.2} Gbit/s",
        got >> 20,
        got as f64 * 8.0 / secs / 1e9
    );
    Ok(())
}
