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
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// `vfabric-bench remote` with two in-process agents on two lanes, on one thread: every read verified, the
/// latencies and the moves of the whole region (there and back, bytes checked) reported.
#[test]
fn remote_between_two_agents_verifies_reads_and_moves() {
    let dir = std::env::temp_dir().join(format!("vfabric-bench-remote-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_vfabric-bench"))
        .args(["remote", "--device", "emulated", "--mtus", "6500", "--sizes", "64KiB", "--streams", "2"])
        .args(["--total", "4MiB", "--latency-samples", "5", "--iperf-seconds", "0", "--lanes", "2", "--name", "r"])
        // Both agents and the requests on one thread: the agent's single-threaded mode.
        .args(["--threads", "1"])
        .arg("--out")
        .arg(&dir)
        .output()
        .expect("run vfabric-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).expect("json")).expect("valid json");
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
    let md = std::fs::read_to_string(dir.join("r.md")).expect("markdown");
    assert!(
        md.contains("2 connection(s) for bulk transfers (lanes) and the latency lane")
            && md.contains("iperf3 did not run"),
        "{md}"
    );
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
