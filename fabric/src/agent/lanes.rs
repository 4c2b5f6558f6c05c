//! Lane threads: on a multi-threaded runtime, the latency lane (lane 0, `network.latency_lane`) runs on a
//! thread of its own with a current-thread Tokio runtime: its QUIC endpoint, the drivers of its connections,
//! the serving of the calls that arrive on it and the calls this node makes over it.
//!
//! Why: a call is a chain of wake-ups (a packet arrives, the endpoint's driver hands it to the connection's,
//! which wakes the stream's reader, which answers, ...). On a multi-threaded runtime each of them may land on
//! another worker, and on a many-core host each hop costs a thread wake-up: on the H200 host a remote 64 KiB
//! acquire between agents on the default runtime took much longer than between one-thread agents, each side's
//! runtime adding about half of the difference (docs/benchmarks.md has the figures).
//! On its lane's thread a call runs as it does on a one-thread agent. This pays only with calls one after
//! another kept on that lane (the least busy lane, the lowest of those: `LaneUse` in the parent module).
//!
//! Why that lane only, and no bulk transfers on it: a lane's thread is one core for everything its lane does,
//! and a lane's packets are read, decrypted and answered there. With every lane on a thread of its own, 2 MiB
//! writes in flight over 4 lanes lost a third of their throughput on the H200 host against the lanes on the
//! runtime's workers, where a lane's endpoint and connection drivers run on different cores. So bulk transfers
//! (`BULK` bytes or more) take the other lanes (`lanes_for`), on the workers, and the `network.lanes` are all
//! theirs: the latency lane is one more.
//!
//! What runs on the lane's thread blocks it while it runs: fabric calls there run in place, and bulk requests
//! or migrations served there (from a peer that sent them on lane 0) go to the runtime that started the agent
//! (`Agent::off_lanes`). A long call on the node's fabric from elsewhere still holds up the lane when its next
//! call waits for the fabric's lock, as it holds up a one-thread agent.
//!
//! On a current-thread runtime (the agent's choice on two cores or fewer) there are no lane threads: the
//! lanes run on that runtime's one thread, where extra threads would only compete for the cores. The latency
//! lane is still there (both ends of a connection must agree on the lanes), and still keeps small calls out
//! of the bulk transfers' queues.

use std::future::Future;
use std::thread::ThreadId;

use tokio::sync::oneshot;
use vfabric_transport::quic::PinnedRuntime;

use crate::error::{FabricError, NetworkError};

/// The lane threads of an agent, by lane (the first lanes, as many as were started: the agent starts one).
pub(crate) struct Lanes {
    threads: Vec<LaneThread>,
}

struct LaneThread {
    runtime: PinnedRuntime,
    id: ThreadId,
}

/// Stops the lane threads when dropped (each ends its runtime, dropping the tasks still on it).
pub(crate) struct LaneStop {
    _stops: Vec<oneshot::Sender<()>>,
}

impl Lanes {
    /// Starts the threads of the first `n` lanes of node `node`, each running a current-thread runtime until
    /// the [`LaneStop`] is dropped. Lane `i`'s thread is named `vf-lane{i}-{node}` (`top -H` shows it; the
    /// kernel keeps 15 bytes of it).
    pub(crate) fn start(n: usize, node: &str) -> std::io::Result<(Lanes, LaneStop)> {
        let mut threads = Vec::with_capacity(n);
        let mut stops = Vec::with_capacity(n);
        for lane in 0..n {
            let (stop, stopped) = oneshot::channel::<()>();
            let (handle_tx, handle_rx) = std::sync::mpsc::channel();
            // The runtime is made (and dropped) on its own thread: dropping one inside the caller's runtime, were
            // the thread not to start, would panic.
            let thread = std::thread::Builder::new().name(format!("vf-lane{lane}-{node}")).spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e));
                        return;
                    }
                };
                if handle_tx.send(Ok(runtime.handle().clone())).is_ok() {
                    // Ends when the stop is sent or dropped; dropping the runtime then drops its tasks.
                    let _ = runtime.block_on(stopped);
                }
            })?;
            let handle = handle_rx.recv().map_err(|_| {
                std::io::Error::other(format!("lane {lane}'s thread ended before its runtime started"))
            })??;
            threads.push(LaneThread { runtime: PinnedRuntime::new(handle), id: thread.thread().id() });
            stops.push(stop);
        }
        Ok((Lanes { threads }, LaneStop { _stops: stops }))
    }

    /// The quinn runtime of `lane`'s thread.
    pub(crate) fn runtime(&self, lane: usize) -> Option<&PinnedRuntime> {
        self.threads.get(lane).map(|t| &t.runtime)
    }

    /// Whether this is one of the lane threads.
    pub(crate) fn is_lane_thread(&self) -> bool {
        let me = std::thread::current().id();
        self.threads.iter().any(|t| t.id == me)
    }

    /// How many lane threads there are.
    pub(crate) fn len(&self) -> usize {
        self.threads.len()
    }

    /// Runs `work` on `lane`'s thread (in place when called there) and returns what it returns. Dropping the
    /// returned future cancels the work at its next await, as dropping any call does (a step already running
    /// on the lane's thread finishes first).
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        lane: usize,
        work: impl Future<Output = Result<T, FabricError>> + Send + 'static,
    ) -> Result<T, FabricError> {
        let Some(thread) = self.threads.get(lane) else {
            return Err(NetworkError::NoLaneThread { lane, threads: self.threads.len() }.into());
        };
        if thread.id == std::thread::current().id() {
            return work.await;
        }
        let mut task = AbortOnDrop(thread.runtime.handle().spawn(work));
        match (&mut task.0).await {
            Ok(r) => r,
            // Cancelled (the agent shut down, its lane threads with it), or the work panicked.
            Err(source) => Err(NetworkError::Cancelled { what: "a call on a lane's thread", source }.into()),
        }
    }
}

/// A task that is aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_on_the_lane_thread_and_stops_with_it() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
        rt.block_on(async {
            let (lanes, stop) = Lanes::start(2, "n0").expect("lanes");
            assert_eq!(lanes.len(), 2);
            let here = std::thread::current().id();
            let names = [0, 1].map(|lane| {
                lanes.run(lane, async {
                    Ok((std::thread::current().id(), std::thread::current().name().map(String::from)))
                })
            });
            let [a, b] = names;
            let (a, b) = (a.await.expect("lane 0"), b.await.expect("lane 1"));
            assert_ne!(a.0, here);
            assert_ne!(a.0, b.0);
            assert_eq!(a.1.as_deref(), Some("vf-lane0-n0"));
            assert_eq!(b.1.as_deref(), Some("vf-lane1-n0"));
            assert!(matches!(lanes.run(2, async { Ok(()) }).await, Err(FabricError::Network(_))));
            // Errors come back as they are.
            let failed = lanes.run(0, async { Err::<(), _>(FabricError::UnknownLease(7)) }).await;
            assert!(matches!(failed, Err(FabricError::UnknownLease(7))));
            // Once stopped, work on a lane fails instead of hanging.
            drop(stop);
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let after = lanes.run(0, async { Ok(()) }).await;
            assert!(matches!(after, Err(FabricError::Network(_))), "{after:?}");
        });
    }
}
