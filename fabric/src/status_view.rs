//! `vfabric status`: a running agent's status (`agent::AgentStatus`, from its Unix socket), printed as a table
//! the way nvidia-smi prints a GPU's, or as JSON; with `--watch`, again every so often with the rates since the
//! last print.

use std::time::{Duration, Instant};

use serde_json::Value;
use vfabric::ByteSize;

/// The traffic counters shown, in order, with their labels.
const TRAFFIC: [(&str, &str); 7] = [
    ("fetched", "fetched"),
    ("prefetched", "prefetched"),
    ("evicted", "evicted"),
    ("written_back", "written back"),
    ("to_storage", "to storage"),
    ("from_storage", "from storage"),
    ("migrated", "migrated"),
];

/// The waits shown (`fabric::Stalls`, nanoseconds callers waited), in order, with their labels.
const STALLS: [(&str, &str); 5] = [
    ("fetch_ns", "fetching"),
    ("evict_ns", "evicting"),
    ("compact_ns", "compacting"),
    ("migrate_ns", "migrating"),
    ("in_flight_ns", "copies in flight"),
];

/// Asks the agent at `socket` for the status of node `node` (`None`: the agent's own) and prints it; with
/// `watch`, again every `watch` until stopped. The answer must come from the node named `expect`, when given: a
/// configuration here that numbers the nodes otherwise than the agent's would show another node's status.
pub fn run(
    socket: &std::path::Path,
    node: Option<u16>,
    expect: Option<&str>,
    json: bool,
    watch: Option<Duration>,
) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client = vfabric::agent::LocalClient::connect(socket)
            .await
            .map_err(|e| format!("no agent answers at {}: {e}", socket.display()))?;
        let mut last: Option<(Instant, Value)> = None;
        loop {
            let text = client.status_of(node).await.map_err(|e| {
                // What the node asked reported, not the agent in the middle that passed it on.
                let why = match &e {
                    vfabric::FabricError::Remote { kind, message, .. } => format!("{kind:?}: {message}"),
                    other => other.to_string(),
                };
                match expect {
                    Some(name) => format!("node {name}'s status: {why}"),
                    None => format!("the agent's status: {why}"),
                }
            })?;
            let now: Value = serde_json::from_str(&text).map_err(|e| format!("the agent's status: {e}"))?;
            if let Some(name) = expect.filter(|&n| now["name"].as_str() != Some(n)) {
                return Err(format!(
                    "asked for node {name}'s status, node {} answered: the configuration here and the agent's do not \
                     number the nodes alike",
                    now["name"].as_str().unwrap_or("?")
                ));
            }
            if json {
                println!("{text}");
            } else {
                print!("{}", render(&now, last.as_ref().map(|(t, v)| (t.elapsed(), v))));
                last = Some((Instant::now(), now));
            }
            match watch {
                Some(every) => tokio::time::sleep(every).await,
                None => return Ok(()),
            }
        }
    })
}

/// The status `now` as text; with `before` (how long ago, and that status), traffic as rates since then.
fn render(now: &Value, before: Option<(Duration, &Value)>) -> String {
    let mut out = String::new();
    let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let page = num(now, "page_size");
    let uptime = now.get("uptime_s").and_then(Value::as_f64).unwrap_or(0.0) as u64;
    out += &format!(
        "node {} ({}) of cluster {}, peers at {}, up {}h{:02}m{:02}s\n\n",
        now["name"].as_str().unwrap_or("?"),
        num(now, "node"),
        now["cluster"].as_str().unwrap_or("?"),
        now["address"].as_str().unwrap_or("?"),
        uptime / 3600,
        uptime / 60 % 60,
        uptime % 60
    );
    if let Some(why) = now["fabric"]["stalled"].as_str() {
        out += &format!("STALLED: {why}\n\n");
    }
    let dir = &now["fabric"]["directory"];
    out += &format!(
        "{:<10} {:>10} {:>10} {:>10} {:>10} {:>17} {:>14}\n",
        "device", "total", "used", "leased", "free", "largest free run", "fragmentation"
    );
    for d in dir["devices"].as_array().into_iter().flatten() {
        let frames = num(d, "frames");
        let (used, leased, run) = (num(d, "used"), num(d, "leased"), num(d, "largest_free_run"));
        let free = frames.saturating_sub(used);
        // The share of free memory that lies outside the largest free run.
        let fragmented = if free == 0 { 0.0 } else { 100.0 * (free - run.min(free)) as f64 / free as f64 };
        let name = location(&d["location"]);
        // The packed tier's frames are slots shorter than a page.
        let frame = name.parse::<vfabric_allocator::Location>().map_or(page, |l| l.frame_bytes(page));
        let bytes = |f: u64| ByteSize(f * frame).to_string();
        out += &format!(
            "{:<10} {:>10} {:>10} {:>10} {:>10} {:>17} {:>13.0}%\n",
            name,
            bytes(frames),
            bytes(used),
            bytes(leased),
            bytes(free),
            bytes(run),
            fragmented
        );
    }
    // The compressed tier holds pages in runs of blocks: how many, and how much smaller than as pages.
    for d in dir["devices"].as_array().into_iter().flatten().filter(|d| location(&d["location"]) == "compressed") {
        let (pages, held) = (num(d, "copies"), num(d, "used") * vfabric_allocator::COMPRESSED_BLOCK);
        let ratio = if held == 0 { 0.0 } else { (pages * page) as f64 / held as f64 };
        out += &format!("compressed: {pages} pages ({}) in {} ({ratio:.2}x)\n", ByteSize(pages * page), ByteSize(held));
    }
    out += &format!(
        "\nregions {}, pages {}, leases {}, directory metadata {}\n",
        num(dir, "regions"),
        num(dir, "pages"),
        num(dir, "leases"),
        ByteSize(num(dir, "metadata_bytes"))
    );
    let traffic = &now["fabric"]["traffic"];
    out += &match before {
        Some((ago, then)) => {
            let secs = ago.as_secs_f64().max(1e-3);
            let rate = |k: &str| {
                let moved = num(traffic, k).saturating_sub(num(&then["fabric"]["traffic"], k));
                format!("{}/s", ByteSize((moved as f64 / secs) as u64))
            };
            format!("traffic, the last {:.1} s: {}\n", secs, list(&TRAFFIC.map(|(k, l)| format!("{l} {}", rate(k)))))
        }
        None => format!(
            "traffic since start: {}\n",
            list(&TRAFFIC.map(|(k, l)| format!("{l} {}", ByteSize(num(traffic, k)))))
        ),
    };
    let stalls = &now["fabric"]["stalls"];
    out += &match before {
        // Milliseconds waited a second: how much of the callers' time went to each.
        Some((ago, then)) => {
            let secs = ago.as_secs_f64().max(1e-3);
            let rate = |k: &str| {
                let ns = num(stalls, k).saturating_sub(num(&then["fabric"]["stalls"], k));
                format!("{:.1} ms/s", ns as f64 / 1e6 / secs)
            };
            format!(
                "callers waited, the last {secs:.1} s: {}\n",
                list(&STALLS.map(|(k, l)| format!("{l} {}", rate(k))))
            )
        }
        None => format!(
            "callers waited since start: {}\n",
            list(&STALLS.map(|(k, l)| format!("{l} {:.1} ms", num(stalls, k) as f64 / 1e6)))
        ),
    };
    out += &tenants(now);
    out += &peers(now, before);
    out += &reservations(now);
    let r = &now["replication"];
    out += &format!(
        "\nreplicas: {} region(s) of this node kept on others too, {} standby copies kept here, standbys {:.0} ms behind\n",
        num(r, "homed"),
        num(r, "kept"),
        r["lag_ms"].as_f64().unwrap_or(0.0)
    );
    out
}

/// The regions by tenant, with what each uses of its quota per tier (`used/quota`, or just `used`).
fn tenants(now: &Value) -> String {
    if now["tenants"].as_array().is_none_or(|t| t.is_empty()) {
        return String::new();
    }
    let mut out = format!(
        "\n{:<8} {:>8} {:>10} {:>18} {:>22} {:>22} {:>22}\n",
        "tenant", "regions", "bytes", "leases", "gpu", "host", "storage"
    );
    for t in now["tenants"].as_array().into_iter().flatten() {
        let tier = |i: usize| {
            let e = &t["tiers"][i];
            let used = ByteSize(e[1].as_u64().unwrap_or(0));
            match e[2].as_u64() {
                Some(limit) => format!("{used} / {}", ByteSize(limit)),
                None => used.to_string(),
            }
        };
        let who = match t["tenant"].as_u64() {
            Some(0) => "operator".to_string(),
            Some(n) => n.to_string(),
            None => "?".to_string(),
        };
        let leases =
            format!("{} ({})", t["leases"].as_u64().unwrap_or(0), ByteSize(t["leased_bytes"].as_u64().unwrap_or(0)));
        out += &format!(
            "{:<8} {:>8} {:>10} {:>18} {:>22} {:>22} {:>22}\n",
            who,
            t["regions"].as_u64().unwrap_or(0),
            ByteSize(t["bytes"].as_u64().unwrap_or(0)).to_string(),
            leases,
            tier(0),
            tier(1),
            tier(2)
        );
    }
    out
}

/// The peers as this node sees them, with their links: bytes sent and received since the link was made (or per
/// second since `before`), packets lost.
fn peers(now: &Value, before: Option<(Duration, &Value)>) -> String {
    let peers = now["peers"].as_array().cloned().unwrap_or_default();
    if peers.is_empty() {
        return String::new();
    }
    let (sent, received) = if before.is_some() { ("sent/s", "received/s") } else { ("sent", "received") };
    let mut out = format!(
        "\n{:<6} {:<16} {:<22} {:<40} {:>10} {:>10} {:>12} {:>12} {:>6}\n",
        "node", "peer", "address", "state", "last seen", "rtt", sent, received, "lost"
    );
    for p in &peers {
        let seen = p["last_seen_ms"].as_u64().map_or("never".to_string(), |ms| format!("{ms} ms"));
        let rtt = p["rtt_us"].as_u64().map_or("-".to_string(), |us| format!("{us} us"));
        let link = &p["link"];
        // The same peer's link in the status before, for rates.
        let then = before.and_then(|(ago, b)| {
            let old = b["peers"].as_array()?.iter().find(|q| q["node"] == p["node"])?;
            Some((ago.as_secs_f64().max(1e-3), old["link"].clone()))
        });
        let bytes = |k: &str| match (link.get(k).and_then(Value::as_u64), &then) {
            (None, _) => "-".to_string(),
            (Some(n), Some((secs, old))) => {
                let moved = n.saturating_sub(old.get(k).and_then(Value::as_u64).unwrap_or(n));
                ByteSize((moved as f64 / secs) as u64).to_string()
            }
            (Some(n), None) => ByteSize(n).to_string(),
        };
        let lost = link.get("lost_packets").and_then(Value::as_u64).map_or("-".to_string(), |n| n.to_string());
        out += &format!(
            "{:<6} {:<16} {:<22} {:<40} {:>10} {:>10} {:>12} {:>12} {:>6}\n",
            p["node"].as_u64().unwrap_or(0),
            p["name"].as_str().unwrap_or("?"),
            p["address"].as_str().unwrap_or("-"),
            p["state"].as_str().unwrap_or("?"),
            seen,
            rtt,
            bytes("sent_bytes"),
            bytes("received_bytes"),
            lost
        );
    }
    // How pages moved to and from each peer, and why by that route.
    for p in &peers {
        for r in p["routes"].as_array().into_iter().flatten() {
            out += &format!(
                "  node {} by {}: {} moves, {} ({})\n",
                p["node"].as_u64().unwrap_or(0),
                r["route"].as_str().unwrap_or("?"),
                r["moves"].as_u64().unwrap_or(0),
                ByteSize(r["bytes"].as_u64().unwrap_or(0)),
                r["why"].as_str().unwrap_or("-")
            );
        }
    }
    out
}

/// The reservations held on the node.
fn reservations(now: &Value) -> String {
    let held = now["reservations"].as_array().cloned().unwrap_or_default();
    if held.is_empty() {
        return String::new();
    }
    let mut out = format!("\n{:<12} {:<10} {:<8} {:>12}\n", "reservation", "device", "tenant", "holds");
    for r in &held {
        out += &format!(
            "{:<12} {:<10} {:<8} {:>12}\n",
            r["id"].as_u64().unwrap_or(0),
            location(&r["location"]),
            r["tenant"].as_u64().unwrap_or(0),
            ByteSize(r["bytes"].as_u64().unwrap_or(0)).to_string()
        );
    }
    out
}

/// A location as the fabric names devices (`gpu0`, `host`, `storage`, `packed`, `packed-f32`).
fn location(v: &Value) -> String {
    if let Ok(l) = serde_json::from_value::<vfabric_allocator::Location>(v.clone()) {
        return l.to_string();
    }
    match v {
        Value::String(s) => s.to_lowercase(),
        Value::Object(m) => m.iter().map(|(k, n)| format!("{}{n}", k.to_lowercase())).collect(),
        other => other.to_string(),
    }
}

fn list(items: &[String]) -> String {
    items.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status(sent: u64, reservations: Value) -> Value {
        json!({
            "name": "a", "node": 0, "cluster": "c", "address": "127.0.0.1:1", "uptime_s": 5.0, "page_size": 65536,
            "fabric": {"directory": {"devices": []}, "traffic": {}, "stalls": {"fetch_ns": sent * 1000}},
            "peers": [{"node": 1, "name": "b", "address": "127.0.0.1:2", "state": "alive", "last_seen_ms": 5,
                       "rtt_us": 90, "link": {"sent_bytes": sent, "received_bytes": 4096, "lost_packets": 3},
                       "routes": [{"route": "quic", "why": "NCCL is not available on this node", "moves": 4,
                                   "bytes": 8 << 20}]}],
            "replication": {}, "tenants": [], "reservations": reservations,
        })
    }

    #[test]
    fn peers_show_their_links_as_totals_then_as_rates() {
        let before = status(1 << 20, json!([]));
        let first = render(&before, None);
        let row = first.lines().find(|l| l.starts_with("1 ")).expect("the peer's row");
        assert!(row.contains("1MiB") && row.contains("4KiB") && row.trim_end().ends_with('3'), "{first}");
        let route = first.lines().find(|l| l.contains("node 1 by quic")).expect("the peer's route");
        assert!(route.contains("4 moves, 8MiB (NCCL is not available on this node)"), "{first}");
        // 4 MiB more in 2 s: 2 MiB a second; nothing more received.
        let now = status(5 << 20, json!([{"id": 7, "location": "Host", "tenant": 3, "bytes": 2 << 20}]));
        let text = render(&now, Some((Duration::from_secs(2), &before)));
        assert!(text.contains("sent/s"), "{text}");
        let row = text.lines().find(|l| l.starts_with("1 ")).expect("the peer's row");
        assert!(row.contains("2MiB") && row.contains(" 0B "), "{text}");
        let held = text.lines().find(|l| l.starts_with("7 ")).expect("the reservation's row");
        assert!(held.contains("host") && held.contains('3') && held.contains("2MiB"), "{text}");
        // Waits: 1.05 s fetching since start; 4.19 s more in 2 s, 2,097 ms a second.
        assert!(first.contains("callers waited since start: fetching 1048.6 ms"), "{first}");
        assert!(text.contains("callers waited, the last 2.0 s: fetching 2097.2 ms/s"), "{text}");
        assert!(!text.contains("STALLED"), "{text}");
    }

    #[test]
    fn a_stalled_fabric_says_so_first() {
        let mut now = status(0, json!([]));
        now["fabric"]["stalled"] =
            json!("stalled: a fetch stage (4 page(s) host -> gpu0) has not finished after 130.2 s");
        let text = render(&now, None);
        let second = text.lines().nth(2).expect("a line after the node's");
        assert!(second.starts_with("STALLED: stalled: a fetch stage (4 page(s) host -> gpu0)"), "{text}");
    }

    #[test]
    fn packed_tiers_show_by_name_in_slots() {
        let mut now = status(0, json!([{"id": 9, "location": {"Packed": "F32"}, "tenant": 0, "bytes": 1 << 20}]));
        now["fabric"]["directory"]["devices"] = json!([
            {"location": {"Packed": "Bf16"}, "frames": 10, "used": 4, "leased": 0, "largest_free_run": 6},
            {"location": {"Packed": "F32"}, "frames": 10, "used": 0, "leased": 0, "largest_free_run": 10},
            {"location": {"Gpu": 0}, "frames": 10, "used": 0, "leased": 0, "largest_free_run": 10},
        ]);
        let text = render(&now, None);
        // 64 KiB pages: bf16 slots of 36 KiB, fp32 slots of 20 KiB.
        let row = |name: &str| text.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_owned();
        assert!(row("packed ").contains("360KiB") && row("packed ").contains("144KiB"), "{text}");
        assert!(row("packed-f32 ").contains("200KiB"), "{text}");
        assert!(row("gpu0 ").contains("640KiB"), "{text}");
        assert!(row("9 ").contains("packed-f32"), "{text}");
    }

    #[test]
    fn the_compressed_tier_shows_in_blocks_with_its_pages() {
        let mut now = status(0, json!([]));
        now["fabric"]["directory"]["devices"] = json!([
            {"location": "Compressed", "frames": 64, "used": 16, "leased": 0, "largest_free_run": 48, "copies": 2},
        ]);
        let text = render(&now, None);
        let row = |name: &str| text.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_owned();
        // 4 KiB blocks: 256 KiB in all, 64 KiB used; two 64 KiB pages in 64 KiB.
        assert!(row("compressed ").contains("256KiB") && row("compressed ").contains("64KiB"), "{text}");
        assert!(text.contains("compressed: 2 pages (128KiB) in 64KiB (2.00x)"), "{text}");
    }
}
