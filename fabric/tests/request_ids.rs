//! A call to another node carries its request id (`Message::Traced`), and both agents' logs carry it: the
//! caller's span `call` and the serving agent's span `served`, so one remote call can be followed through the
//! logs of both. Two agents in this process, their logs captured as JSON lines.

use std::io::Write;
use std::sync::{Arc, Mutex};

mod common;
use common::{agents_in_process, small_cluster};

/// Log lines written here.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_remote_calls_id_is_in_both_agents_logs() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt().json().with_env_filter("vfabric::agent=debug").with_writer(move || writer.clone()).init();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let agents = agents_in_process(&small_cluster("traced", 2)).await;
        let r = agents[0].alloc(1, 1 << 20, None).await.expect("a region on n1");
        agents[0].write(&r, 0, &[5u8; 4096]).await.expect("a write on n1");
        for a in &agents {
            a.shutdown().await;
        }
    });
    let text = String::from_utf8(logs.0.lock().expect("logs").clone()).expect("UTF-8");
    let lines: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    // The id of each span of a given name that carried a write.
    let ids = |span: &str| -> Vec<String> {
        lines
            .iter()
            .filter_map(|l| l["spans"].as_array())
            .flatten()
            .filter(|s| s["name"] == span && s["request"] == "write")
            .filter_map(|s| s["id"].as_str().map(String::from))
            .collect()
    };
    let (called, served) = (ids("call"), ids("served"));
    assert!(!called.is_empty(), "no log line of the write's call at n0:\n{text}");
    assert!(called.iter().all(|id| id.starts_with("0000")), "n0's ids carry its node id, 0: {called:?}");
    assert!(served.iter().any(|id| called.contains(id)), "n1's log of the write has n0's id {called:?}:\n{text}");
}
