//! `vfabric-bench migrate` end to end on the emulated device: it writes its JSON and Markdown, verifies every
//! case, and reports a baseline and a ratio for each.

use std::process::Command;

#[test]
fn migrate_on_the_emulated_device_writes_verified_results() {
    let dir = std::env::temp_dir().join(format!("vfabric-bench-cli-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_vfabric-bench"))
        .args([
            "migrate",
            "--device",
            "emulated",
            "--size",
            "8MiB",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--sweep",
            "--sm-sweep",
            "--name",
            "t",
        ])
        .arg("--out")
        .arg(&dir)
        .output()
        .expect("run vfabric-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("emulated device"), "says it is the emulated device: {stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("t.json")).expect("json")).expect("valid json");
    let rows = json["rows"].as_array().expect("rows");
    for suite in ["main", "sm-sweep", "size-sweep"] {
        assert!(rows.iter().any(|r| r["suite"] == suite), "suite {suite} present");
    }
    for r in rows {
        assert_eq!(r["bad_pages"], 0, "{r}");
        assert!(r["gb_s"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert!(r["baseline_gb_s"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
    }
    let both = rows.iter().find(|r| r["direction"] == "gpu0<->gpu1").expect("both directions at once");
    assert_eq!(both["bytes"], 8 << 20);
    let md = std::fs::read_to_string(dir.join("t.md")).expect("markdown");
    assert!(md.contains("| direction |") && md.contains("fewest blocks within 90%"), "{md}");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn bad_arguments_are_clear_errors() {
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_vfabric-bench")).args(args).output().expect("run");
    let o = run(&["migrate", "--device", "emulated", "--size", "8MiB", "--pages", "3MiB"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("page size"));
    let o = run(&["migrate", "--device", "emulated", "--directions", "gpu0>gpu7"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("GPU"));
}

#[test]
fn pager_on_the_emulated_device_verifies_every_page() {
    let dir = std::env::temp_dir().join(format!("vfabric-bench-pager-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_vfabric-bench"))
        .args(["pager", "--device", "emulated", "--budget", "16MiB", "--chunks", "1,4", "--latency-samples", "500"])
        .args(["--compact-arena", "16MiB", "--name", "p", "--out"])
        .arg(&dir)
        .output()
        .expect("run vfabric-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("p.json")).expect("json")).expect("valid json");
    let walks = json["walks"].as_array().expect("walks");
    assert_eq!(walks.len(), 8, "2 setups x 2 orders x 2 chunk sizes");
    for w in walks {
        assert_eq!(w["bad_pages"], 0, "{w}");
        assert!(w["pages_per_s"].as_f64().unwrap_or(0.0) > 0.0, "{w}");
    }
    let md = std::fs::read_to_string(dir.join("p.md")).expect("markdown");
    let header = md.lines().find(|l| l.starts_with("| setup")).expect("walk table");
    let row = md.lines().find(|l| l.starts_with("| oversubscribed")).expect("walk row");
    assert_eq!(header.matches('|').count(), row.matches('|').count(), "table columns line up:\n{header}\n{row}");
    let over = walks.iter().find(|w| w["setup"] == "oversubscribed").expect("oversubscribed walk");
    assert!(over["fetched"].as_u64().unwrap_or(0) > 0, "the oversubscribed walk fetched pages: {over}");
    let resident = walks.iter().find(|w| w["setup"] == "resident" && w["chunk"] == 1).expect("resident walk");
    assert_eq!(resident["fetched"], 0, "the resident walk fetched nothing: {resident}");
    assert!(json["acquire_resident_us"]["p50"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(json["directory_bytes_per_page"].as_f64().unwrap_or(0.0) > 0.0);
    assert_eq!(json["compaction"]["bad_pages"], 0);
    assert!(json["compaction"]["largest_free_run_after"].as_u64().unwrap_or(0) >= 4);
    // Every result says what it is and where it is from: its layout's version, the commit, the machine.
    assert_eq!(json["schema_version"], 1, "{}", json["schema_version"]);
    assert!(json["git_rev"].as_str().is_some_and(|r| !r.is_empty()), "{}", json["git_rev"]);
    assert!(json["machine"]["cores"].as_u64().is_some_and(|c| c >= 1), "{}", json["machine"]);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// Runs `vfabric-bench` with `args` (in groups), its results named `name` in `dir`, and returns its JSON; a
/// failed run fails the test with what it printed.
fn bench_json(args: &[&[&str]], dir: &std::path::Path, name: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_vfabric-bench"))
        .args(args.concat())
        .args(["--name", name, "--out"])
        .arg(dir)
        .output()
        .expect("run vfabric-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let text = std::fs::read_to_string(dir.join(format!("{name}.json"))).expect("json");
    serde_json::from_str(&text).expect("valid json")
}

/// `vfabric-bench remote` with two in-process agents on two lanes, on one thread: every read verified, the
/// latencies, the moves of the whole region (there and back, bytes checked) and the cost of serving metrics
/// reported.
#[test]
fn remote_between_two_agents_verifies_reads_and_moves() {
    let dir = std::env::temp_dir().join(format!("vfabric-bench-remote-{}", std::process::id()));
    let json = bench_json(
        &[
            &["remote", "--device", "emulated", "--mtus", "6500", "--sizes", "64KiB", "--streams", "2"],
            &["--total", "4MiB", "--latency-samples", "5", "--iperf-seconds", "0", "--lanes", "2"],
            // Both agents and the requests on one thread: the agent's single-threaded mode.
            &["--threads", "1"],
        ],
        &dir,
        "r",
    );
    let rows = json["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "a write and a read: {rows:?}");
    for r in rows {
        assert_eq!(r["bad"], 0, "{r}");
        assert!(r["gbit_s"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
    }
    let moves = json["moves"].as_array().expect("moves");
    assert_eq!(moves.len(), 1);
    assert!(
        moves[0]["there_gbit_s"].as_f64().unwrap_or(0.0) > 0.0 && moves[0]["back_gbit_s"].as_f64().unwrap_or(0.0) > 0.0
    );
    // Serving metrics, beside not: the same writes and reads, every one checked.
    let cost = &json["metrics_cost"];
    for k in ["write_gbit_s", "read_gbit_s"] {
        let pair = cost[k].as_array().expect("without, with");
        assert!(pair.iter().all(|g| g.as_f64().is_some_and(|g| g > 0.0)), "{cost}");
    }
    let md = std::fs::read_to_string(dir.join("r.md")).expect("markdown");
    assert!(md.contains("metrics served"), "{md}");
    assert!(
        md.contains("2 connection(s) for bulk transfers (lanes) and the latency lane")
            && md.contains("iperf3 did not run"),
        "{md}"
    );
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// `vfabric-bench remote --region-codecs`: on sparse pages, the LZ4 region's pages cross packed and the
/// uncompressed region's as they are, in the same run (with `network.compression` off), every read checked.
#[test]
fn remote_region_codecs_pack_only_the_compressed_region() {
    let dir = std::env::temp_dir().join(format!("vfabric-bench-codecs-{}", std::process::id()));
    let json = bench_json(
        &[
            &["remote", "--device", "emulated", "--mtus", "6500", "--sizes", "64KiB", "--streams", "2"],
            &["--total", "4MiB", "--latency-samples", "1", "--iperf-seconds", "0", "--no-metrics-cost"],
            &["--sparse", "--region-codecs", "none,lz4", "--codec-rounds", "2"],
        ],
        &dir,
        "c",
    );
    let codecs = json["region_codecs"].as_array().expect("region_codecs");
    assert_eq!(codecs.len(), 2, "{codecs:?}");
    let wire = |k: usize| codecs[k]["wire_per_payload"].as_f64().unwrap_or(0.0);
    assert_eq!((&codecs[0]["codec"], &codecs[1]["codec"]), (&"none".into(), &"lz4".into()), "{codecs:?}");
    assert!(wire(0) > 0.95, "the uncompressed region's pages cross whole: {codecs:?}");
    assert!(wire(1) < 0.2, "the LZ4 region's sparse pages cross packed: {codecs:?}");
    for c in codecs {
        assert_eq!(c["bad"], 0, "{c}");
        assert_eq!(c["rounds"], 2, "{c}");
        assert!(c["write_x_none"].as_f64().is_some_and(|x| x > 0.0), "{c}");
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_vfabric-bench"))
        .args(["remote", "--device", "emulated", "--mtus", "6500", "--sizes", "64KiB", "--total", "1MiB"])
        .args(["--iperf-seconds", "0", "--no-metrics-cost", "--region-codecs", "fp8-bf16", "--out"])
        .arg(&dir)
        .output()
        .expect("run vfabric-bench");
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && stderr.contains("--region-codecs takes none, lz4 and zstd"), "{stderr}");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// A trace in the format `bench/scripts/capture_trace.py` writes: a training-like pattern (weights that stay,
/// activations and small tensors that come and go each step), with the caching allocator's segments.
fn synthetic_trace() -> serde_json::Value {
    let mut events = Vec::new();
    let mut next = 0x7f00_0000_0000u64;
    let mut alloc = |events: &mut Vec<serde_json::Value>, size: u64| {
        let a = next;
        next += size.div_ceil(512) * 512 + 512;
        events.push(serde_json::json!(["alloc", a, size]));
        (a, size)
    };
    events.push(serde_json::json!(["segment_alloc", 0x7e00_0000_0000u64, 256u64 << 20]));
    let weights: Vec<_> = (0..8).map(|i| alloc(&mut events, (4 << 20) + i * 4096)).collect();
    for step in 0..5u64 {
        let acts: Vec<_> = (0..12).map(|i| alloc(&mut events, (1 << 20) * (1 + (i + step) % 5) + 96)).collect();
        let small: Vec<_> = (0..50).map(|i| alloc(&mut events, 4 + i * 37)).collect();
        for (a, s) in acts.into_iter().rev().chain(small) {
            events.push(serde_json::json!(["free_requested", a, s]));
            events.push(serde_json::json!(["free_completed", a, s]));
        }
    }
    // A free of a block from before the recording began: skipped, and said so.
    events.push(serde_json::json!(["free_completed", 0x1234u64, 512u64]));
    for (a, s) in weights {
        events.push(serde_json::json!(["free_completed", a, s]));
    }
    serde_json::json!({ "events": events, "torch": { "note": "synthetic" } })
}

#[test]
fn a_trace_replays_through_the_pool_beside_its_own_figures() {
    let dir = std::env::temp_dir().join(format!("vfabric-bench-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("trace.json");
    std::fs::write(&file, synthetic_trace().to_string()).expect("trace");
    let out = Command::new(env!("CARGO_BIN_EXE_vfabric-bench"))
        .args(["trace", "--device", "emulated", "--slab", "8MiB", "--name", "t", "--out"])
        .arg(&dir)
        .arg(&file)
        .output()
        .expect("run vfabric-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("t.json")).expect("json")).expect("valid json");
    assert_eq!(json["allocations"], 8 + 5 * 62);
    assert_eq!((json["frees"].as_u64(), json["skipped_frees"].as_u64()), (Some(8 + 5 * 62), Some(1)));
    let (pool, torch) = (&json["pool"], &json["torch"]);
    assert_eq!(pool["peak_allocated"], torch["peak_allocated"], "the replay holds what the trace held");
    assert_eq!(torch["peak_reserved"], 256 << 20);
    let r = pool["ratio"].as_f64().unwrap_or(0.0);
    assert!((1.0..2.0).contains(&r), "the pool reserves at least what it hands out, and not twice: {r}");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"events": [["alloc", 1]]}"#).expect("bad trace");
    let o = Command::new(env!("CARGO_BIN_EXE_vfabric-bench"))
        .args(["trace", "--device", "emulated"])
        .arg(&bad)
        .output()
        .expect("run");
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("event 0"), "a clear error");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// `vfabric-bench status`: an agent with regions answers status calls and scrapes, beside pings, and the results
/// say how many regions it counted.
#[test]
fn status_times_the_agents_answers_beside_a_ping() {
    let dir = std::env::temp_dir().join(format!("vfabric-bench-status-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_vfabric-bench"))
        .args(["status", "--device", "emulated", "--regions", "40", "--samples", "5", "--name", "s", "--out"])
        .arg(&dir)
        .output()
        .expect("run vfabric-bench");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("s.json")).expect("json")).expect("valid json");
    assert_eq!(json["regions"], 40);
    for call in ["status", "scrape", "ping"] {
        assert_eq!(json[call]["n"], 5, "{json}");
        assert!(json[call]["p50_us"].as_f64().is_some_and(|us| us > 0.0), "{json}");
        // The distribution's curve, fastest to slowest, for the plot.
        let curve: Vec<f64> = json[call]["cdf_us"].as_array().expect("cdf").iter().filter_map(|v| v.as_f64()).collect();
        assert!(curve.len() == 101 && curve.windows(2).all(|w| w[0] <= w[1]), "{json}");
    }
    assert!(json["status_bytes"].as_u64().is_some_and(|b| b > 100), "{json}");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// `vfabric-bench sweep`: every point of a small grid between GPU 0 and host memory (the mover) and between host
/// memory and a peer's (QUIC), each beside its baseline, every block checked; a pair that cannot run is refused.
#[test]
fn sweep_runs_every_point_of_its_grid_beside_a_baseline() {
    let dir = std::env::temp_dir().join(format!("vfabric-bench-sweep-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_vfabric-bench"))
        .args(["sweep", "--device", "emulated", "--pairs", "gpu0/host,host/peer:gpu0", "--blocks", "64KiB,1MiB"])
        .args(["--batch", "1,4", "--in-flight", "2", "--total", "4MiB", "--iperf-seconds", "0", "--name", "w"])
        .args(["--mtu", "6500", "--lanes", "2"])
        .arg("--out")
        .arg(&dir)
        .output()
        .expect("run vfabric-bench");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("w.json")).expect("json")).expect("valid json");
    let rows = json["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2 * 2 * 2 * 2, "pairs x blocks x batches x ops: {json}");
    for r in rows {
        assert_eq!(r["bad"], 0, "{r}");
        assert!(r["gb_s"].as_f64().is_some_and(|g| g > 0.0) && r["bytes"].as_u64() >= Some(4 << 20), "{r}");
        let local = r["pair"] == "gpu0/host";
        // The mover's baseline is a plain copy in the same run; the peer's, iperf3, was skipped (and said so).
        assert_eq!(r["ratio"].is_number(), local, "{r}");
    }
    let notes = json["notes"].to_string();
    assert!(notes.contains("iperf3 did not run") && notes.contains("6500-byte packets, 2 bulk lane(s)"), "{json}");
    let bad = Command::new(env!("CARGO_BIN_EXE_vfabric-bench"))
        .args(["sweep", "--device", "emulated", "--pairs", "gpu0/peer:host"])
        .output()
        .expect("run");
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("host/peer:"), "{bad:?}");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// `vfabric-bench sweep --cluster` under mpirun: three ranks, each with its own agent from the launcher's
/// environment, each reading from and writing to the next rank's memory at once; rank 0 writes the aggregate
/// (every rank's figures in it, every block checked) beside iperf3 from each rank to the next.
#[test]
fn sweep_across_the_ranks_of_an_mpirun_job_aggregates_every_rank() {
    let mpirun = which("mpirun", "openmpi-bin");
    which("iperf3", "iperf3");
    let dir = std::env::temp_dir().join(format!("vfabric-bench-sweep-mpi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let certs = dir.join("certs");
    let ca = vfabric_transport::quic::ClusterCa::generate("mpirun").expect("CA");
    ca.save(&certs).expect("CA saved");
    for r in 0..3 {
        ca.issue(&format!("rank{r}")).expect("certificate").save(&certs).expect("saved");
    }
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../cluster-configs/mpirun.toml");
    let port = 20_000 + std::process::id() % 20_000;
    let out = Command::new(&mpirun)
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "3"])
        .args(["-x", &format!("VFABRIC_RENDEZVOUS=127.0.0.1:{port}")])
        .args(["-x", &format!("VFABRIC_CERTS={}", certs.display())])
        .args(["-x", &format!("VFABRIC_IPERF_PORT={}", port + 1)])
        .args(["-x", "VFABRIC_LOG=warn"])
        .arg(env!("CARGO_BIN_EXE_vfabric-bench"))
        .args(["sweep", "--cluster", config, "--blocks", "64KiB", "--batch", "1,4", "--in-flight", "2"])
        .args(["--total", "2MiB", "--iperf-seconds", "1", "--name", "c", "--out"])
        .arg(dir.join("out"))
        .output()
        .expect("run mpirun");
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("out/c.json")).expect("json")).expect("valid json");
    assert_eq!(json["cluster"]["ranks"], 3, "{json}");
    let per_rank = json["cluster"]["per_rank"].as_array().expect("per rank");
    assert_eq!(per_rank.len(), 3, "{json}");
    for r in per_rank {
        let cases = r["gb_s"].as_array().expect("each case");
        assert!(cases.len() == 4 && cases.iter().all(|g| g.as_f64().is_some_and(|g| g > 0.0)), "{r}");
        assert!(r["iperf_gb_s"].as_f64().is_some_and(|g| g > 0.0), "{r}");
    }
    let rows = json["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 4, "{json}");
    for row in rows {
        assert_eq!(row["bad"], 0, "{row}");
        // Three ranks' bytes, at least the case's bytes each.
        assert!(row["bytes"].as_u64().is_some_and(|b| b >= 3 * (2 << 20)), "{row}");
        assert!(row["ratio"].as_f64().is_some_and(|x| x > 0.0), "{row}");
    }
    assert!(!dir.join("out/c.sync").exists(), "the barrier folder is gone");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// The path of `tool`, or a failure that says which package has it.
fn which(tool: &str, package: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join(tool)).find(|f| f.is_file()))
        .unwrap_or_else(|| panic!("`{tool}` not found: install the Debian package {package} (`bash .ci/run` does)"))
}
