//! Raw QUIC throughput with vfabric's settings: two endpoints in one process on loopback, mutual TLS, one
//! unidirectional stream per `--streams`, 1 MiB checksummed chunks (one buffer handed to quinn each time, as
//! quinn's perf tool does), no fabric behind either end. The floor
//! under `vfabric-bench remote`: what the transport alone reaches on this machine.
//!
//! `cargo run --release -p vfabric-transport --example quic_pipe -- [MTU] [MiB] [STREAMS]`
//! (`PIPE_WINDOW_MIB` sets the stream window, default 16; the connection window is four times it).

use std::time::Instant;

use vfabric_transport::quic::{self, ClusterCa, QuicSettings};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Each end on a runtime (and thread) of its own, as two processes would be: one end's packet processing
    // never waits behind the other's on a shared worker.
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(run())
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let mtu: u16 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(6500);
    let mib: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let streams: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
    let ca = ClusterCa::generate("pipe")?;
    let window: u64 = std::env::var("PIPE_WINDOW_MIB").ok().and_then(|s| s.parse().ok()).unwrap_or(16);
    let settings = QuicSettings {
        mtu,
        stream_window: window << 20,
        connection_window: (4 * window) << 20,
        ..QuicSettings::default()
    };
    let settings_b = settings.clone();
    let a = quic::endpoint("127.0.0.1:0".parse()?, &ca.issue("a")?, &settings)?;
    let b_id = ca.issue("b")?;
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async move {
            let b = quic::endpoint("127.0.0.1:0".parse()?, &b_id, &settings_b)?;
            addr_tx.send(b.local_addr()?)?;
            let conn = b.accept().await.ok_or("no connection")?.await?;
            let mut tasks = Vec::new();
            for _ in 0..streams {
                let mut rs = conn.accept_uni().await?;
                tasks.push(tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut got = 0u64;
                    while quic::read_chunk(&mut rs, 1 << 20, &mut buf).await?.is_some() {
                        got += buf.len() as u64;
                    }
                    Ok::<u64, quic::QuicError>(got)
                }));
            }
            let mut total = 0;
            for t in tasks {
                total += t.await??;
            }
            Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(total)
        })
    });
    let b_addr = addr_rx.recv()?;
    let conn = quic::connect(&a, b_addr, "b").await?;
    let payload = bytes::Bytes::from(vec![0x5Au8; 1 << 20]);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let (c, p) = (conn.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            let mut s = c.open_uni().await.map_err(|e| e.to_string())?;
            for i in 0..mib / streams {
                quic::write_chunk(&mut s, i << 20, p.clone()).await.map_err(|e| e.to_string())?;
            }
            s.finish().map_err(|e| e.to_string())?;
            s.stopped().await.map_err(|e| e.to_string())?;
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let got = server.join().map_err(|_| "server thread panicked")?.map_err(|e| e.to_string())?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "mtu {mtu}, {streams} stream(s): {} MiB in {secs:.2} s = {:.2} Gbit/s",
        got >> 20,
        got as f64 * 8.0 / secs / 1e9
    );
    Ok(())
}
