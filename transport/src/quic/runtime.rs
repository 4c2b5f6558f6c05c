//! A quinn runtime that keeps an endpoint on one Tokio runtime, whichever runtime its users call from.
//!
//! quinn's own [`quinn::TokioRuntime`] spawns its drivers on the runtime of whoever creates the endpoint or
//! dials, and a timer or socket registers with the caller's runtime too. [`PinnedRuntime`] sends all of them to
//! one runtime, named by its handle: an endpoint's packets, timers and connection drivers then stay on one
//! thread when that runtime is a current-thread runtime of its own (the fabric's lanes), with no hand-offs
//! between the workers of a multi-threaded runtime on each packet.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use quinn::{AsyncTimer, AsyncUdpSocket, Runtime};

/// A quinn [`Runtime`] that spawns on, and registers timers and sockets with, the Tokio runtime of `handle`.
#[derive(Debug, Clone)]
pub struct PinnedRuntime {
    handle: tokio::runtime::Handle,
}

impl PinnedRuntime {
    /// Pins to the runtime of `handle`.
    pub fn new(handle: tokio::runtime::Handle) -> PinnedRuntime {
        PinnedRuntime { handle }
    }

    /// The runtime's handle.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl Runtime for PinnedRuntime {
    fn new_timer(&self, t: Instant) -> Pin<Box<dyn AsyncTimer>> {
        // A sleep registers with the current runtime's timer when it is made.
        let _in = self.handle.enter();
        Box::pin(tokio::time::sleep_until(t.into()))
    }

    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        self.handle.spawn(future);
    }

    fn wrap_udp_socket(&self, socket: std::net::UdpSocket) -> io::Result<Arc<dyn AsyncUdpSocket>> {
        // A socket registers with the current runtime's reactor when it is wrapped.
        let _in = self.handle.enter();
        quinn::TokioRuntime.wrap_udp_socket(socket)
    }

    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The endpoint's drivers and the connection's run on the pinned runtime's thread, not the caller's.
    #[test]
    fn drivers_run_on_the_pinned_runtime() {
        let pinned = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let handle = pinned.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let _ = pinned.block_on(stopped);
        });
        let caller = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        caller.block_on(async {
            let runtime = Arc::new(PinnedRuntime::new(handle.clone()));
            // Spawned work lands on the pinned thread.
            let (tx, rx) = tokio::sync::oneshot::channel();
            runtime.spawn(Box::pin(async move {
                let _ = tx.send(std::thread::current().id());
            }));
            let there = rx.await.expect("the spawned task ran");
            assert_ne!(there, std::thread::current().id());
            // A timer made here fires although this runtime never polls the pinned one's timers.
            let mut timer = runtime.new_timer(Instant::now() + std::time::Duration::from_millis(5));
            std::future::poll_fn(|cx| timer.as_mut().poll(cx)).await;
            // A socket wrapped here is driven by the pinned runtime's reactor.
            let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
            socket.set_nonblocking(true).expect("nonblocking");
            let addr = socket.local_addr().expect("addr");
            let wrapped = runtime.wrap_udp_socket(socket).expect("wrapped");
            assert_eq!(wrapped.local_addr().expect("addr"), addr);
        });
        let _ = stop.send(());
        thread.join().expect("the pinned runtime's thread");
    }
}
