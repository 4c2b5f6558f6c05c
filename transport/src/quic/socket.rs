//! The endpoint's UDP socket: quinn's own Tokio socket, with segmentation-offload batches kept within what the
//! kernel accepts.
//!
//! quinn 0.11 builds up to `min(10, max_transmit_segments())` packets into one GSO send (`sendmsg` with
//! `UDP_SEGMENT`), and the kernel refuses a send whose payload is above 65,507 bytes (the largest UDP datagram).
//! quinn-udp drops the refused batch without a word, so at packets above 6,550 bytes stock quinn loses every
//! batch it sends (next to nothing arrives: docs/benchmarks.md). [`CappedGsoSocket`] reports at most `65,507 / mtu` segments per send,
//! so that larger packets (jumbo frames, or 16 KiB on loopback) keep segmentation offload: fewer, larger
//! packets cost less per byte (the packet size is the main throughput lever of quinn on these machines).

use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit, UdpSocketState};
use quinn::{AsyncUdpSocket, UdpPoller};
use tokio::io::Interest;

/// The largest UDP payload of one send: 65,535 (the IPv4 total length) - 20 (IPv4 header) - 8 (UDP header).
/// A GSO batch is one send, so its segments together stay within this.
pub const MAX_GSO_BATCH_BYTES: usize = 65_507;

/// How many packets of `mtu` bytes one GSO send may carry: those that fit in [`MAX_GSO_BATCH_BYTES`] (at
/// least 1), and no more than the socket supports (`supported`).
pub fn gso_segments(mtu: u16, supported: usize) -> usize {
    (MAX_GSO_BATCH_BYTES / usize::from(mtu.max(1))).clamp(1, supported.max(1))
}

/// A Tokio UDP socket driven by quinn-udp (as quinn's own), whose GSO batches of `mtu`-byte packets stay
/// within one UDP datagram's size.
pub struct CappedGsoSocket {
    io: tokio::net::UdpSocket,
    state: UdpSocketState,
    segments: usize,
}

impl CappedGsoSocket {
    /// Wraps `socket` (switched to non-blocking here) for packets of up to `mtu` bytes. Must be called inside
    /// a Tokio runtime.
    pub fn new(socket: std::net::UdpSocket, mtu: u16) -> io::Result<CappedGsoSocket> {
        let state = UdpSocketState::new((&socket).into())?;
        socket.set_nonblocking(true)?;
        let io = tokio::net::UdpSocket::from_std(socket)?;
        let segments = gso_segments(mtu, state.max_gso_segments());
        Ok(CappedGsoSocket { io, state, segments })
    }

    /// Asks for send and receive buffers of `bytes` each (the kernel caps them at `net.core.rmem_max` /
    /// `wmem_max`).
    pub fn set_buffer_sizes(&self, bytes: usize) -> io::Result<()> {
        self.state.set_recv_buffer_size((&self.io).into(), bytes)?;
        self.state.set_send_buffer_size((&self.io).into(), bytes)
    }

    /// The receive buffer the kernel granted, bytes (on Linux twice what was asked for, within the cap).
    pub fn recv_buffer_size(&self) -> io::Result<usize> {
        self.state.recv_buffer_size((&self.io).into())
    }
}

impl fmt::Debug for CappedGsoSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CappedGsoSocket").field("io", &self.io).field("segments", &self.segments).finish()
    }
}

impl AsyncUdpSocket for CappedGsoSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(Writable { socket: self, wait: None })
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.io.try_io(Interest::WRITABLE, || self.state.send((&self.io).into(), transmit))
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        loop {
            std::task::ready!(self.io.poll_recv_ready(cx))?;
            // A spurious readiness (WouldBlock) clears it inside try_io; poll again to register the waker.
            if let Ok(n) = self.io.try_io(Interest::READABLE, || self.state.recv((&self.io).into(), bufs, meta)) {
                return Poll::Ready(Ok(n));
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.local_addr()
    }

    fn may_fragment(&self) -> bool {
        self.state.may_fragment()
    }

    fn max_transmit_segments(&self) -> usize {
        self.segments
    }

    fn max_receive_segments(&self) -> usize {
        self.state.gro_segments()
    }
}

type WaitWritable = Pin<Box<dyn Future<Output = io::Result<()>> + Send + Sync>>;

/// Waits for the socket to become writable; one per task that sends (quinn makes one per connection driver).
struct Writable {
    socket: Arc<CappedGsoSocket>,
    /// The wait in progress, kept between polls so that its waker stays registered.
    wait: Option<WaitWritable>,
}

impl fmt::Debug for Writable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writable").finish_non_exhaustive()
    }
}

impl UdpPoller for Writable {
    fn poll_writable(mut self: Pin<&mut Self>, cx: &mut Context) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let wait = this.wait.get_or_insert_with(|| {
            let socket = Arc::clone(&this.socket);
            Box::pin(async move { socket.io.writable().await })
        });
        let result = wait.as_mut().poll(cx);
        if result.is_ready() {
            // A finished future must not be polled again: the next call starts a new wait.
            this.wait = None;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_stay_within_one_datagram() {
        // Stock quinn's 10 segments fit up to 6,550 bytes; above, fewer.
        assert_eq!(gso_segments(1452, 64), 45);
        assert_eq!(gso_segments(6500, 64), 10);
        assert_eq!(gso_segments(8952, 64), 7);
        assert_eq!(gso_segments(16_383, 64), 3);
        for mtu in [1200u16, 6551, 9000, 16_383] {
            assert!(gso_segments(mtu, 64) * usize::from(mtu) <= MAX_GSO_BATCH_BYTES);
        }
        // Never more than the socket supports, never zero.
        assert_eq!(gso_segments(1452, 1), 1);
        assert_eq!(gso_segments(1452, 0), 1);
        assert_eq!(gso_segments(u16::MAX, 64), 1);
    }

    /// A full batch at jumbo-frame packets reaches the receiver; stock quinn's batch of 10 such packets is
    /// refused by the kernel (EMSGSIZE), which quinn-udp swallows: nothing of it arrives.
    #[tokio::test]
    async fn a_full_batch_of_large_packets_arrives() {
        let receiver = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        receiver.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        let sender = CappedGsoSocket::new(std::net::UdpSocket::bind("127.0.0.1:0").unwrap(), 9000).unwrap();
        if sender.state.max_gso_segments() <= 1 {
            eprintln!("no segmentation offload on this system: nothing to check");
            return;
        }
        let segments = sender.max_transmit_segments();
        assert_eq!(segments, 7);
        let to = receiver.local_addr().unwrap();
        async fn send(sender: &CappedGsoSocket, to: SocketAddr, contents: &[u8], segment_size: Option<usize>) {
            let t = Transmit { destination: to, ecn: None, contents, segment_size, src_ip: None };
            sender.io.writable().await.unwrap();
            sender.try_send(&t).unwrap();
        }
        let mut buf = vec![0u8; 65_536];
        // Stock quinn's batch first, then a marker: the marker is the first thing to arrive.
        send(&sender, to, &vec![1u8; 10 * 9000], Some(9000)).await;
        send(&sender, to, b"marker", None).await;
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"marker");
        send(&sender, to, &vec![2u8; segments * 9000], Some(9000)).await;
        for _ in 0..segments {
            let n = receiver.recv(&mut buf).unwrap();
            assert!(n == 9000 && buf[..n].iter().all(|&b| b == 2), "{n} bytes");
        }
    }
}
