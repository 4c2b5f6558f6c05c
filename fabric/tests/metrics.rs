//! The agent's Prometheus endpoint (`[metrics]`): what it serves describes the agent (its regions, bytes per
//! device, moves, peers, call latencies), `promtool check metrics` passes it, a real Prometheus server scrapes it
//! and answers a query for one of its series, and the Grafana dashboard (`deploy/grafana/vfabric.json`) draws
//! only series it serves, with queries Prometheus runs. Two agents in this process; Prometheus in a process of
//! its own, ended by this test by its PID.

mod common;
use common::{agents_in_process, require_tool, small_cluster, Ended};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vfabric::agent::{Agent, LocalClient};
use vfabric::config::TenantSection;
use vfabric::{ByteSize, Location, TenantId};

/// A plain HTTP/1.0 GET: the status code and the body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, body.to_string())
}

/// The value of the sample whose line starts with `series` (name and labels as exposed).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Two agents (n0 serving metrics on a free port, a local client's socket) after some work: a region at each
/// node written from n0, and one allocated and written through the socket.
struct Nodes {
    rt: tokio::runtime::Runtime,
    agents: Vec<Agent>,
    metrics: vfabric::agent::MetricsServer,
    socket: std::path::PathBuf,
    _held: (vfabric::Reservation, vfabric::Lease),
}

impl Drop for Nodes {
    fn drop(&mut self) {
        self.rt.block_on(async {
            for a in &self.agents {
                a.shutdown().await;
            }
        });
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn nodes(name: &str) -> Nodes {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let socket = std::env::temp_dir().join(format!("vfabric-{name}-{}.sock", std::process::id()));
    let (agents, metrics, held) = rt.block_on(async {
        let mut cfg = small_cluster(name, 2);
        // A tenant with a quota, so that the tenants' series have one.
        cfg.tenants =
            vec![TenantSection { id: 3, gpu: Some(ByteSize(4 << 20)), host: None, storage: None, uids: Vec::new() }];
        let agents = agents_in_process(&cfg).await;
        let metrics = agents[0].serve_metrics("127.0.0.1:0".parse().expect("addr")).expect("serve metrics");
        for node in [0, 1] {
            let r = agents[0].alloc(node, 1 << 20, None).await.expect("a region");
            agents[0].write(&r, 0, &[5u8; 65536]).await.expect("a write");
            if node == 1 {
                // A lease on n1's pages: a move by a route.
                let l = agents[0].acquire(&r, 0..65536, Location::Gpu(0), vfabric::Mode::Read).await.expect("lease");
                agents[0].release(l).await.expect("release");
            }
        }
        agents[0].serve_local(&socket).await.expect("serve the socket");
        let c = LocalClient::connect(&socket).await.expect("connect");
        let r = c.alloc(1 << 20, None).await.expect("alloc through the socket");
        c.write(&r, 0, &[7u8; 4096]).await.expect("write through the socket");
        // Held while the test scrapes: a reservation for tenant 3 and a lease on one of n0's regions (a page each).
        let f = agents[0].fabric();
        let reservation = f.reserve(Location::Host, 2 << 20, TenantId(3)).expect("a reservation");
        let region = f.alloc(2 << 20, vfabric::Placement::on(Location::Host)).expect("a region");
        let lease = f.acquire(&region, 0..(2 << 20), Location::Host, vfabric::Mode::Write).expect("a lease");
        (agents, metrics, (reservation, lease))
    });
    Nodes { rt, agents, metrics, socket, _held: held }
}

#[test]
fn metrics_describe_the_agent_and_pass_promtool() {
    let n = nodes("metrics");
    let addr = n.metrics.local_addr();
    let (code, text) = get(addr, "/metrics");
    assert_eq!(code, 200, "{text}");
    // n0 holds its own region, the client's, the leased one and the copy of n1's pages its lease left (kept for
    // the next); n1's is n1's.
    assert_eq!(value(&text, "vfabric_regions"), Some(4.0), "{text}");
    assert!(text.lines().any(|l| l.starts_with("vfabric_info{") && l.contains("name=\"n0\"")), "{text}");
    let host = value(&text, "vfabric_device_capacity_bytes{device=\"host\"}");
    assert_eq!(host, Some((16u64 << 20) as f64), "{text}");
    assert!(value(&text, "vfabric_device_used_bytes{device=\"gpu0\"}").is_some_and(|v| v > 0.0), "{text}");
    assert_eq!(value(&text, "vfabric_peer_up{peer=\"n1\"}"), Some(1.0), "{text}");
    // Calls timed as they happened: n0's write to n1, and the client's alloc and write through the socket.
    assert!(value(&text, "vfabric_peer_call_seconds_count{call=\"write\"}").is_some_and(|v| v >= 1.0), "{text}");
    assert!(value(&text, "vfabric_local_call_seconds_count{call=\"alloc\"}").is_some_and(|v| v >= 1.0), "{text}");
    assert!(text.contains("vfabric_moved_bytes_total{kind=\"fetched\"}"), "{text}");
    // The link to n1, which n0 wrote to; the reservation and the lease held.
    assert!(value(&text, "vfabric_link_sent_bytes_total{peer=\"n1\"}").is_some_and(|v| v >= 65536.0), "{text}");
    assert!(value(&text, "vfabric_link_lanes_open{peer=\"n1\"}").is_some_and(|v| v >= 1.0), "{text}");
    // The lease on n1's page (2 MiB) came over QUIC (no NCCL on the emulated device).
    assert_eq!(value(&text, "vfabric_route_moves_total{peer=\"n1\",route=\"quic\"}"), Some(1.0), "{text}");
    let moved = value(&text, "vfabric_route_bytes_total{peer=\"n1\",route=\"quic\"}");
    assert_eq!(moved, Some((2u64 << 20) as f64), "{text}");
    assert_eq!(value(&text, "vfabric_reserved_bytes{device=\"host\",tenant=\"3\"}"), Some((2u64 << 20) as f64));
    assert_eq!(value(&text, "vfabric_tenant_leases{tenant=\"0\"}"), Some(1.0), "{text}");
    assert_eq!(value(&text, "vfabric_tenant_leased_bytes{tenant=\"0\"}"), Some((2u64 << 20) as f64), "{text}");
    let quota = value(&text, "vfabric_tenant_quota_bytes{tenant=\"3\",tier=\"gpu\"}");
    assert_eq!(quota, Some((4u64 << 20) as f64), "{text}");

    // Prometheus's own linter takes it as it is.
    promtool_passes(&text);

    let (code, _) = get(addr, "/other");
    assert_eq!(code, 404);

    // Every series the Grafana dashboard draws is one the agent exposes.
    for name in dashboard_series() {
        let family = name.strip_suffix("_bucket").unwrap_or(&name);
        assert!(text.contains(&format!("# TYPE {family} ")), "the dashboard draws {name}, which is not exposed");
    }
}

/// The dashboard's PromQL queries, with its variables given values.
fn dashboard_queries() -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/vfabric.json");
    let text = std::fs::read_to_string(&path).expect("deploy/grafana/vfabric.json");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    let exprs: Vec<String> = panels
        .iter()
        .filter_map(|p| p["targets"].as_array())
        .flatten()
        .filter_map(|t| t["expr"].as_str().map(|e| e.replace("$instance", ".*")))
        .collect();
    assert!(exprs.len() >= 8, "the dashboard has its panels: {exprs:?}");
    exprs
}

/// The `vfabric_*` series the dashboard's queries name.
fn dashboard_series() -> Vec<String> {
    let mut names: Vec<String> = dashboard_queries()
        .iter()
        .flat_map(|e| {
            e.match_indices("vfabric_")
                .map(|(at, _)| e[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect())
                .collect::<Vec<String>>()
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// `text` percent-encoded for a URL's query.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An agent alone (no peer ever reached, no reservation, no tenant, no call timed yet) serves every family it has
/// values for, down to the last one by name, and promtool takes it.
#[test]
fn a_bare_agent_serves_all_it_has() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (agent, metrics) = rt.block_on(async {
        let agent = agents_in_process(&small_cluster("bare", 1)).await.remove(0);
        let metrics = agent.serve_metrics("127.0.0.1:0".parse().expect("addr")).expect("serve metrics");
        (agent, metrics)
    });
    let (code, text) = get(metrics.local_addr(), "/metrics");
    assert_eq!(code, 200, "{text}");
    for family in
        ["vfabric_device_used_bytes", "vfabric_regions", "vfabric_moved_bytes_total", "vfabric_uptime_seconds"]
    {
        assert!(text.contains(&format!("# TYPE {family} ")), "{family} missing:\n{text}");
    }
    promtool_passes(&text);
    drop(metrics);
    rt.block_on(agent.shutdown());
}

/// `promtool check metrics` takes `text`.
fn promtool_passes(text: &str) {
    let promtool = require_tool("promtool", "prometheus", "Prometheus's promtool to check the exposition");
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    check.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("feed promtool");
    let out = check.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_prometheus_server_scrapes_the_agent() {
    let n = nodes("scraped");
    let target = n.metrics.local_addr();
    let prometheus = require_tool("prometheus", "prometheus", "a Prometheus server to scrape the agent");
    let dir = std::env::temp_dir().join(format!("vfabric-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: vfabric\n    static_configs:\n      - \
             targets: [\"{target}\"]\n"
        ),
    )
    .expect("prometheus.yml");
    // A free port for its web API: taken from the kernel, let go, and handed to Prometheus.
    let web = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port");
    let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
    let _server = Ended(
        Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );
    let t = Instant::now();
    let answer = loop {
        if TcpStream::connect(web).is_ok() {
            let (code, body) = get(web, "/api/v1/query?query=vfabric_regions%7Bjob%3D%22vfabric%22%7D");
            if code == 200 {
                let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
                if let Some(sample) = v["data"]["result"].as_array().and_then(|r| r.first()) {
                    break sample.clone();
                }
            }
        }
        let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
        assert!(t.elapsed() < Duration::from_secs(60), "Prometheus never had vfabric_regions; its log:\n{log}");
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(answer["value"][1], "4", "{answer}");
    assert_eq!(answer["metric"]["instance"], target.to_string(), "{answer}");
    // The dashboard's queries are PromQL that Prometheus runs.
    for q in dashboard_queries() {
        let (code, body) = get(web, &format!("/api/v1/query?query={}", encode(&q)));
        assert_eq!(code, 200, "{q}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(v["status"], "success", "{q}: {body}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
