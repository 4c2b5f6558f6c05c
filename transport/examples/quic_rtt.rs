//! The round trip of one small request and its answer, the floor under every remote call of the fabric: plain
//! UDP between two threads (the kernel's and the scheduler's share), then QUIC with vfabric's settings, one
//! bidirectional stream per request as the agents use them (quinn's share on top), each end on a
//! current-thread runtime of its own thread, as two one-thread agents run.
//!
//! With ANSWER_BYTES (default 16) the answers are that long (UDP: in datagrams of up to 60,000 bytes): a remote
//! read's round trip, the wire's share of it.
//!
//! `cargo run --release -p vfabric-transport --example quic_rtt -- [ROUND_TRIPS] [MTU] [ANSWER_BYTES]`

use std::net::UdpSocket;
use std::time::Instant;

use vfabric_transport::quic::{self, ClusterCa, QuicSettings};

fn arg<T: std::str::FromStr>(i: usize, default: T) -> T {
    std::env::args().nth(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// p50 and p99 of `samples` (microseconds), sorted here.
fn percentiles(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.99))
}

fn current_thread() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = arg(1, 2000);
    let mtu: u16 = arg(2, 16_383);
    let answer_len: usize = arg(3, 16);
    const DATAGRAM: usize = 60_000;

    // Plain UDP, blocking sockets: 16 bytes there, the answer back.
    let server = UdpSocket::bind("127.0.0.1:0")?;
    let client = UdpSocket::bind("127.0.0.1:0")?;
    client.connect(server.local_addr()?)?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = [0u8; 64];
        let answer = vec![7u8; answer_len];
        for _ in 0..n {
            let (_, from) = server.recv_from(&mut buf)?;
            for piece in answer.chunks(DATAGRAM) {
                server.send_to(piece, from)?;
            }
        }
        Ok(())
    });
    let mut udp = Vec::with_capacity(n);
    let mut buf = vec![0u8; DATAGRAM];
    for _ in 0..n {
        let t = Instant::now();
        client.send(&[7u8; 16])?;
        let mut got = 0;
        while got < answer_len {
            got += client.recv(&mut buf)?;
        }
        udp.push(t.elapsed().as_secs_f64() * 1e6);
    }
    echo.join().map_err(|_| "echo thread panicked")??;
    let (p50, p99) = percentiles(udp);
    println!("udp, blocking sockets, {answer_len}-byte answers: p50 {p50:.0} us, p99 {p99:.0} us ({n} round trips)");

    // QUIC: one stream per request, as the agents' calls.
    let ca = ClusterCa::generate("rtt")?;
    let settings = QuicSettings { mtu, ..QuicSettings::default() };
    let b_id = ca.issue("b")?;
    let settings_b = settings.clone();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || -> Result<(), String> {
        current_thread().map_err(|e| e.to_string())?.block_on(async move {
            let b = quic::endpoint("127.0.0.1:0".parse().map_err(|e| format!("{e}"))?, &b_id, &settings_b)
                .map_err(|e| e.to_string())?;
            addr_tx.send(b.local_addr().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
            let conn = b.accept().await.ok_or("no connection")?.await.map_err(|e| e.to_string())?;
            for _ in 0..n {
                let (mut send, mut recv) = conn.accept_bi().await.map_err(|e| e.to_string())?;
                recv.read_to_end(64).await.map_err(|e| e.to_string())?;
                send.write_chunk(bytes::Bytes::from(vec![7u8; answer_len])).await.map_err(|e| e.to_string())?;
                send.finish().map_err(|e| e.to_string())?;
            }
            conn.closed().await;
            Ok(())
        })
    });
    let b_addr = addr_rx.recv()?;
    let quic_samples = current_thread()?.block_on(async move {
        let a = quic::endpoint("127.0.0.1:0".parse()?, &ca.issue("a")?, &settings)?;
        let conn = quic::connect(&a, b_addr, "b").await?;
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            let (mut send, mut recv) = conn.open_bi().await?;
            send.write_all(&[7u8; 16]).await?;
            send.finish()?;
            let answer = recv.read_to_end(answer_len).await?;
            samples.push(t.elapsed().as_secs_f64() * 1e6);
            if answer.len() != answer_len {
                return Err("short answer".into());
            }
        }
        let st = conn.stats();
        println!(
            "per round trip, this end: {:.2} datagrams sent in {:.2} sends, {:.2} received in {:.2} receives; acks sent {:.2}",
            st.udp_tx.datagrams as f64 / n as f64,
            st.udp_tx.ios as f64 / n as f64,
            st.udp_rx.datagrams as f64 / n as f64,
            st.udp_rx.ios as f64 / n as f64,
            st.frame_tx.acks as f64 / n as f64
        );
        conn.close(0u32.into(), b"done");
        a.wait_idle().await;
        Ok::<_, Box<dyn std::error::Error>>(samples)
    })?;
    server.join().map_err(|_| "server thread panicked")??;
    let (p50, p99) = percentiles(quic_samples);
    println!("quic, one stream per request, mtu {mtu}, {answer_len}-byte answers: p50 {p50:.0} us, p99 {p99:.0} us ({n} round trips)");
    Ok(())
}
