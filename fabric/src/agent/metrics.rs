//! The agent's metrics in Prometheus text exposition (`[metrics]`): what `vfabric status` shows, as gauges and
//! counters read from the agent at each scrape, beside the latencies of the calls it serves and makes
//! ([`super::call_metrics`], histograms kept as they happen).
//!
//! Names follow Prometheus's conventions: a `vfabric_` prefix, base units in the name (`_bytes`, `_seconds`),
//! `_total` on counters, and labels for what varies (a device, a kind of move, a peer, a tenant).

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{
    CounterVec, Encoder, Gauge, GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, TextEncoder,
};

use super::shared::Agent;
use super::status::AgentStatus;

/// The content type of Prometheus text exposition, version 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

impl Agent {
    /// The agent's metrics now, in Prometheus text exposition (what `[metrics]` serves at `/metrics`).
    pub async fn metrics_text(&self) -> String {
        // No pings: a scrape must not wait on peers (their liveness and last contact say enough).
        let mut status = self.status_of(false).await;
        for p in &mut status.peers {
            if let Some(l) = &mut p.link {
                let raw = [l.sent_bytes, l.received_bytes, l.lost_packets, l.congestion_events];
                [l.sent_bytes, l.received_bytes, l.lost_packets, l.congestion_events] =
                    self.shared.metrics.link_totals(p.node, raw);
            }
        }
        let mut families = status_families(&status);
        families.extend(self.shared.metrics.gather());
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = Vec::new();
        // Writing to a Vec fails only on metrics the encoder rejects, which these are not.
        if let Err(e) = TextEncoder::new().encode(&families, &mut out) {
            tracing::warn!(error = %e, "encoding the metrics failed");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Gauges and counters from a status, on a registry of their own (made per scrape: the figures are read whole
/// from the agent each time).
fn status_families(s: &AgentStatus) -> Vec<MetricFamily> {
    let mut fams = Vec::new();
    for section in [identity, devices, directory, traffic, peers, reservations, tenants] {
        // A labelled family with no series yet (no peer link, no reservation) is left out, as a registry's
        // `gather` leaves it out: the text encoder stops at the first family without samples.
        section(s, &mut |c: &dyn Collector| {
            fams.extend(c.collect().into_iter().filter(|f| !f.get_metric().is_empty()))
        });
    }
    fams
}

/// The agent's identity and uptime.
fn identity(s: &AgentStatus, add: &mut dyn FnMut(&dyn Collector)) {
    let info = IntGaugeVec::new(
        Opts::new("vfabric_info", "The agent: its cluster, node and version."),
        &["cluster", "node", "name", "version"],
    )
    .expect("valid");
    info.with_label_values(&[&s.cluster, &s.node.to_string(), &s.name, env!("CARGO_PKG_VERSION")]).set(1);
    add(&info);
    let uptime = Gauge::new("vfabric_uptime_seconds", "Seconds since the agent started.").expect("valid");
    uptime.set(s.uptime_s);
    add(&uptime);
}

/// Each device's arena: its size, what holds pages and leases, its free runs.
fn devices(s: &AgentStatus, add: &mut dyn FnMut(&dyn Collector)) {
    let ps = s.page_size;
    let device = |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &["device"]).expect("valid");
    let capacity = device("vfabric_device_capacity_bytes", "Bytes of the device's arena (its budget).");
    let used = device("vfabric_device_used_bytes", "Bytes of the device's arena holding pages.");
    let leased = device("vfabric_device_leased_bytes", "Bytes of the device's arena under leases.");
    let run = device("vfabric_device_largest_free_run_bytes", "The longest run of free frames, in bytes.");
    let ranges = device("vfabric_device_free_ranges", "Runs of free frames (fragmentation: more is worse).");
    for d in &s.fabric.directory.devices {
        let l = [d.location.to_string()];
        let l = [l[0].as_str()];
        // The packed tier's frames are slots shorter than a page.
        let ps = d.location.frame_bytes(ps);
        capacity.with_label_values(&l).set((u64::from(d.frames) * ps) as i64);
        used.with_label_values(&l).set((u64::from(d.used) * ps) as i64);
        leased.with_label_values(&l).set((u64::from(d.leased) * ps) as i64);
        run.with_label_values(&l).set((u64::from(d.largest_free_run) * ps) as i64);
        ranges.with_label_values(&l).set(d.free_ranges as i64);
    }
    for g in [&capacity, &used, &leased, &run, &ranges] {
        add(g);
    }
}

/// The node's regions, leases and replicas, and the storage tier's use.
fn directory(s: &AgentStatus, add: &mut dyn FnMut(&dyn Collector)) {
    let dir = &s.fabric.directory;
    for (name, help, v) in [
        ("vfabric_regions", "Live regions at this node.", dir.regions as i64),
        ("vfabric_region_pages", "Pages of the live regions.", dir.pages as i64),
        ("vfabric_leases", "Leases held.", dir.leases as i64),
        ("vfabric_directory_bytes", "Host memory the directory's tables take (estimate).", dir.metadata_bytes as i64),
        ("vfabric_replicated_regions", "Regions of this node kept on other nodes too.", s.replication.homed as i64),
        ("vfabric_standby_copies", "Standby copies kept here for other nodes' regions.", s.replication.kept as i64),
    ] {
        let g = IntGauge::new(name, help).expect("valid");
        g.set(v);
        add(&g);
    }
    let lag =
        Gauge::new("vfabric_replication_lag_seconds", "How far behind the asynchronous standbys are.").expect("valid");
    lag.set(s.replication.lag_ms / 1e3);
    add(&lag);
}

/// Bytes moved by kind, stages run, and the time callers waited by what for.
fn traffic(s: &AgentStatus, add: &mut dyn FnMut(&dyn Collector)) {
    let t = &s.fabric.traffic;
    let moved = IntCounterVec::new(
        Opts::new("vfabric_moved_bytes_total", "Bytes the fabric moved since the agent started, by kind of move."),
        &["kind"],
    )
    .expect("valid");
    for (kind, v) in [
        ("fetched", t.fetched),
        ("prefetched", t.prefetched),
        ("evicted", t.evicted),
        ("written_back", t.written_back),
        ("to_storage", t.to_storage),
        ("from_storage", t.from_storage),
        ("compacted", t.compacted),
        ("migrated", t.migrated),
        ("host_io", t.host_io),
    ] {
        moved.with_label_values(&[kind]).inc_by(v);
    }
    add(&moved);
    if let Some(st) = &s.fabric.storage {
        for (name, help, v) in [
            ("vfabric_storage_pages", "Pages held by the storage tier.", st.pages),
            ("vfabric_storage_file_bytes", "Bytes those pages take in the storage tier's file.", st.file_bytes),
        ] {
            let g = IntGauge::new(name, help).expect("valid");
            g.set(v as i64);
            add(&g);
        }
    }
    let stages = IntCounter::new("vfabric_stages_total", "Stages of copies the fabric ran.").expect("valid");
    stages.inc_by(t.stages);
    add(&stages);

    let w = &s.fabric.stalls;
    let stalls = CounterVec::new(
        Opts::new("vfabric_wait_seconds_total", "Seconds callers waited in the fabric, by what for."),
        &["for"],
    )
    .expect("valid");
    for (what, ns) in [
        ("evict", w.evict_ns),
        ("compact", w.compact_ns),
        ("fetch", w.fetch_ns),
        ("migrate", w.migrate_ns),
        ("launch", w.launch_ns),
        ("in_flight", w.in_flight_ns),
    ] {
        stalls.with_label_values(&[what]).inc_by(ns as f64 / 1e9);
    }
    add(&stalls);
}

/// Each peer's liveness and link.
fn peers(s: &AgentStatus, add: &mut dyn FnMut(&dyn Collector)) {
    let peer = |name: &str, help: &str| GaugeVec::new(Opts::new(name, help), &["peer"]).expect("valid");
    let up = peer("vfabric_peer_up", "1 while the peer is taken for alive, 0 once taken for dead.");
    let seen = peer("vfabric_peer_last_seen_seconds", "Seconds since the peer last answered or called.");
    for p in &s.peers {
        // "alive", or "never heard from" (not taken for dead yet); anything else says why it is taken for dead.
        let alive = p.state == "alive" || p.state == "never heard from";
        up.with_label_values(&[&p.name]).set(if alive { 1.0 } else { 0.0 });
        if let Some(ms) = p.last_seen_ms {
            seen.with_label_values(&[&p.name]).set(ms as f64 / 1e3);
        }
    }
    add(&up);
    add(&seen);
    let link_counter = |name: &str, help: &str| IntCounterVec::new(Opts::new(name, help), &["peer"]).expect("valid");
    let sent = link_counter("vfabric_link_sent_bytes_total", "UDP payload bytes sent to the peer (its open lanes).");
    let received =
        link_counter("vfabric_link_received_bytes_total", "UDP payload bytes received from the peer (its open lanes).");
    let lost = link_counter("vfabric_link_lost_packets_total", "Packets to the peer declared lost and resent.");
    let cuts = link_counter("vfabric_link_congestion_events_total", "Times the link to the peer cut its window.");
    let lanes =
        IntGaugeVec::new(Opts::new("vfabric_link_lanes_open", "Lanes open to the peer."), &["peer"]).expect("valid");
    let rtt = peer("vfabric_link_rtt_seconds", "The largest smoothed round trip among the lanes to the peer.");
    for p in &s.peers {
        let Some(l) = &p.link else { continue };
        let peer = [p.name.as_str()];
        sent.with_label_values(&peer).inc_by(l.sent_bytes);
        received.with_label_values(&peer).inc_by(l.received_bytes);
        lost.with_label_values(&peer).inc_by(l.lost_packets);
        cuts.with_label_values(&peer).inc_by(l.congestion_events);
        lanes.with_label_values(&peer).set(l.lanes_open as i64);
        rtt.with_label_values(&peer).set(l.rtt_us as f64 / 1e6);
    }
    for c in [&sent, &received, &lost, &cuts] {
        add(c);
    }
    add(&lanes);
    add(&rtt);
    let by_route =
        |name: &str, help: &str| IntCounterVec::new(Opts::new(name, help), &["peer", "route"]).expect("valid");
    let moves = by_route("vfabric_route_moves_total", "Moves of pages to and from the peer, by the route they took.");
    let bytes = by_route("vfabric_route_bytes_total", "Bytes of pages moved to and from the peer, by route.");
    for p in &s.peers {
        for r in &p.routes {
            let labels = [p.name.as_str(), r.route.as_str()];
            moves.with_label_values(&labels).inc_by(r.moves);
            bytes.with_label_values(&labels).inc_by(r.bytes);
        }
    }
    add(&moves);
    add(&bytes);
}

/// Reservations held, by device and tenant.
fn reservations(s: &AgentStatus, add: &mut dyn FnMut(&dyn Collector)) {
    let reserved = IntGaugeVec::new(
        Opts::new("vfabric_reserved_bytes", "Bytes reservations hold on a device for a tenant (not yet used)."),
        &["device", "tenant"],
    )
    .expect("valid");
    let count = IntGaugeVec::new(Opts::new("vfabric_reservations", "Reservations held, by tenant."), &["tenant"])
        .expect("valid");
    for r in &s.reservations {
        let (device, tenant) = (r.location.to_string(), r.tenant.0.to_string());
        reserved.with_label_values(&[&device, &tenant]).add(r.bytes as i64);
        count.with_label_values(&[&tenant]).inc();
    }
    add(&reserved);
    add(&count);
}

/// Each tenant's regions, leases, use of each tier and quota.
fn tenants(s: &AgentStatus, add: &mut dyn FnMut(&dyn Collector)) {
    let tenant =
        |name: &str, help: &str, labels: &[&str]| IntGaugeVec::new(Opts::new(name, help), labels).expect("valid");
    let regions = tenant("vfabric_tenant_regions", "Regions of the tenant at this node.", &["tenant"]);
    let tleases = tenant("vfabric_tenant_leases", "Leases held on the tenant's regions here.", &["tenant"]);
    let tleased = tenant("vfabric_tenant_leased_bytes", "Bytes those leases cover.", &["tenant"]);
    let tused = tenant("vfabric_tenant_used_bytes", "Bytes the tenant uses of a tier here.", &["tenant", "tier"]);
    let quota = tenant("vfabric_tenant_quota_bytes", "The tenant's quota of a tier here.", &["tenant", "tier"]);
    for ts in &s.tenants {
        let id = ts.tenant.to_string();
        regions.with_label_values(&[&id]).set(ts.regions as i64);
        tleases.with_label_values(&[&id]).set(ts.leases as i64);
        tleased.with_label_values(&[&id]).set(ts.leased_bytes as i64);
        for (tier, bytes, q) in &ts.tiers {
            tused.with_label_values(&[&id, tier]).set(*bytes as i64);
            if let Some(q) = q {
                quota.with_label_values(&[&id, tier]).set(*q as i64);
            }
        }
    }
    for g in [&regions, &tleases, &tleased, &tused, &quota] {
        add(g);
    }
}
