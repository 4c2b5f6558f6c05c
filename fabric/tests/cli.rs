//! The `vfabric` command as a new user runs it.

mod common;
use common::Ended;

use std::process::Command;

#[test]
fn demo_on_the_emulated_device_verifies_every_byte() {
    // Its storage tier's file goes in the working directory: the build's scratch folder (on a disk).
    let out = Command::new(env!("CARGO_BIN_EXE_vfabric"))
        .args(["demo", "--device", "emulated"])
        .current_dir(env!("CARGO_TARGET_TMPDIR"))
        .output()
        .expect("run vfabric");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("every byte verified after every step"), "{stdout}");
    assert!(stdout.contains("migrate to gpu1"), "{stdout}");
    assert!(stdout.contains("GPU, host, storage"), "the three tiers' step ran: {stdout}");
    // Its first page followed down the tiers and back, every copy read back at every sighting.
    let line = stdout.lines().find(|l| l.starts_with("page 0 of region")).unwrap_or_default();
    assert!(line.contains(": gpu0 -> host -> storage -> gpu0"), "{stdout}");
    assert!(line.ends_with("at every step, verified"), "{stdout}");
    assert!(stdout.contains("emulated device"), "{stdout}");
}

#[test]
fn a_bad_config_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("vfabric-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[cluster]\nname = \"x\"\n[memory]\npage_size = \"3MiB\"\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_vfabric")).arg("check-config").arg(&path).output().expect("run vfabric");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("page_size"), "{stderr}");
    let out = Command::new(env!("CARGO_BIN_EXE_vfabric"))
        .args(["demo", "--config", "/nonexistent.toml"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn cluster_init_writes_a_ca_and_every_node_certificate_once() {
    let dir = std::env::temp_dir().join(format!("vfabric-init-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../cluster-configs/netns-3node.toml");
    let init = || {
        Command::new(env!("CARGO_BIN_EXE_vfabric"))
            .args(["cluster", "init", "--config", config, "--out"])
            .arg(&dir)
            .output()
            .expect("run vfabric")
    };
    let out = init();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for f in ["ca.pem", "ca-key.pem", "n0.pem", "n0-key.pem", "n1.pem", "n2-key.pem"] {
        assert!(dir.join(f).exists(), "{f} written");
    }
    let again = init();
    assert!(!again.status.success(), "a second init must not replace the CA");
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds a cluster CA"));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// A scratch folder of its own for a test.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

/// A two-node configuration on loopback (ports from `port`) with its certificates in `dir/certs`.
fn two_nodes(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
    let path = dir.join("two.toml");
    let text = format!(
        "[cluster]\nname = \"cli\"\n[device]\nbackend = \"emulated\"\n[memory]\npage_size = \"64KiB\"\n\
         gpu_budget = \"8MiB\"\nhost_arena = \"16MiB\"\n[network]\ncerts = \"{}\"\n\
         [[node]]\nname = \"a\"\naddress = \"127.0.0.1:{port}\"\n[[node]]\nname = \"b\"\naddress = \"127.0.0.1:{}\"\n",
        dir.join("certs").display(),
        port + 10
    );
    std::fs::write(&path, text).expect("write the configuration");
    path
}

fn vfabric(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vfabric")).args(args).output().expect("run vfabric")
}

/// `vfabric agent` of node `node`, ended (by its PID) when dropped.
fn agent(config: &str, node: &str) -> Ended {
    let child = Command::new(env!("CARGO_BIN_EXE_vfabric"))
        .args(["agent", "--config", config, "--node", node])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start an agent");
    Ended(child)
}

/// `vfabric args`, again every 250 ms until it succeeds or `tries` ran: an agent just started answers once it
/// is up. The last run's output.
fn until_it_answers(args: &[&str], tries: usize) -> std::process::Output {
    let mut out = vfabric(args);
    for _ in 0..tries {
        if out.status.success() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
        out = vfabric(args);
    }
    out
}

#[test]
fn a_failed_init_leaves_no_ca_behind() {
    let dir = scratch("init");
    let config = two_nodes(&dir, 47100);
    let certs = dir.join("certs");
    // A folder where b's certificate must go: moving the file there fails midway.
    std::fs::create_dir_all(certs.join("b.pem").join("in-the-way")).expect("mkdir");
    let out = vfabric(&["cluster", "init", "--config", config.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(!certs.join("ca.pem").exists() && !certs.join("ca-key.pem").exists(), "no CA left behind");
    assert!(std::fs::read_dir(&certs).unwrap().all(|e| e.unwrap().file_name() == "b.pem"), "nothing else either");
    std::fs::remove_dir_all(certs.join("b.pem")).expect("clear the way");
    let out = vfabric(&["cluster", "init", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "the retry works: {}", String::from_utf8_lossy(&out.stderr));
    assert!(certs.join("ca.pem").exists() && certs.join("b-key.pem").exists());
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn an_agent_refuses_absurd_threads_and_unknown_nodes_clearly() {
    let dir = scratch("agent-args");
    let config = two_nodes(&dir, 47200);
    let config = config.to_str().unwrap();
    let out = vfabric(&["agent", "--config", config, "--node", "a", "--threads", "100000"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("100000 worker threads: at most"), "{out:?}");
    let out = vfabric(&["agent", "--config", config, "--node", "zz"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no node `zz` (nodes: a, b)") && !stderr.contains("certificate"), "{stderr}");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn a_probe_too_large_for_its_peer_fails_cleanly_and_leaves_nothing_behind() {
    let dir = scratch("probe");
    let config = two_nodes(&dir, 47300);
    let config = config.to_str().unwrap();
    assert!(vfabric(&["cluster", "init", "--config", config]).status.success());
    let b = agent(config, "b");
    // b answers once it is up: the first probes may find it still starting.
    let small = until_it_answers(&["cluster", "probe", "--config", config, "--node", "a", "--bytes", "1MiB"], 20);
    assert!(small.status.success(), "{}", String::from_utf8_lossy(&small.stdout));
    // 1 TiB: far past b's memory, and past this process's; a typed refusal, not an abort.
    let big = vfabric(&["cluster", "probe", "--config", config, "--node", "a", "--bytes", "1TiB"]);
    let stdout = String::from_utf8_lossy(&big.stdout);
    assert_eq!(big.status.code(), Some(1), "{stdout}\n{}", String::from_utf8_lossy(&big.stderr));
    assert!(stdout.contains("OutOfMemory"), "{stdout}");
    // The region of the failed probe is gone: b holds a full probe again.
    let again = vfabric(&["cluster", "probe", "--config", config, "--node", "a", "--bytes", "16MiB"]);
    drop(b);
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stdout));
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn status_asks_a_running_agent_and_says_when_none_runs() {
    let dir = scratch("status");
    let config = two_nodes(&dir, 48650);
    // A tenant with a GPU quota: the status shows it.
    let text = std::fs::read_to_string(&config)
        .expect("read")
        .replace("name = \"cli\"", "name = \"cli-status\"")
        .replacen("[[node]]", "[[tenant]]\nid = 3\ngpu = \"4MiB\"\n[[node]]", 1);
    std::fs::write(&config, text).expect("write");
    let config = config.to_str().unwrap();
    assert!(vfabric(&["cluster", "init", "--config", config]).status.success());
    let a = agent(config, "a");
    // The agent answers once it is up.
    let out = until_it_answers(&["status", "--config", config, "--node", "a", "--json"], 40);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!((status["name"].as_str(), status["node"].as_u64()), (Some("a"), Some(0)));
    let devices = status["fabric"]["directory"]["devices"].as_array().expect("devices");
    assert!(devices.len() >= 2, "a GPU and host memory at least: {devices:?}");
    let peers = status["peers"].as_array().expect("peers");
    assert_eq!(peers.len(), 1, "b, which never started: {peers:?}");
    assert!(peers[0]["state"].as_str().is_some_and(|s| s != "alive"), "{peers:?}");
    let tenant = &status["tenants"][0];
    assert_eq!((tenant["tenant"].as_u64(), tenant["regions"].as_u64()), (Some(3), Some(0)), "{status}");
    assert_eq!(tenant["tiers"][0], serde_json::json!(["gpu", 0, 4 << 20]), "its GPU quota: {status}");
    // As a table, the way a person reads it.
    let table = vfabric(&["status", "--config", config, "--node", "a"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("gpu0") && text.contains("host") && text.contains("fragmentation"), "{text}");
    // Several nodes and no --node: which one is asked.
    let which = vfabric(&["status", "--config", config]);
    assert!(String::from_utf8_lossy(&which.stderr).contains("say which with --node"));
    // Node b's status through a's agent, which asks b's over QUIC.
    let b = agent(config, "b");
    let via = ["status", "--config", config, "--node", "b", "--via", "a", "--json"];
    let out = until_it_answers(&via, 40);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!((status["name"].as_str(), status["node"].as_u64()), (Some("b"), Some(1)), "b's own: {status}");
    let peers = status["peers"].as_array().expect("peers");
    assert_eq!((peers[0]["name"].as_str(), peers[0]["state"].as_str()), (Some("a"), Some("alive")), "{peers:?}");
    drop(b);
    let gone = vfabric(&via);
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("node b's status:"), "{gone:?}");
    assert!(String::from_utf8_lossy(&gone.stderr).contains("PeerDead"), "what b's absence is: {gone:?}");
    let nobody = vfabric(&["status", "--config", config, "--node", "nobody"]);
    assert!(!nobody.status.success() && String::from_utf8_lossy(&nobody.stderr).contains("no node `nobody`"));
    // An agent's socket named with another node's name: its answer is not taken for that node's.
    let socket = vfabric::agent::default_socket("cli-status", "a");
    let other = vfabric(&["status", "--socket", socket.to_str().unwrap(), "--node", "b"]);
    assert!(!other.status.success(), "{other:?}");
    assert!(String::from_utf8_lossy(&other.stderr).contains("asked for node b's status, node a answered"), "{other:?}");
    drop(a);
    let none = vfabric(&["status", "--config", config, "--node", "a"]);
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no agent answers at"), "{none:?}");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn logs_come_as_json_lines_when_asked() {
    let out = Command::new(env!("CARGO_BIN_EXE_vfabric"))
        .args(["info", "--device", "emulated"])
        .env("VFABRIC_LOG", "debug")
        .env("VFABRIC_LOG_FORMAT", "json")
        .output()
        .expect("vfabric info");
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<serde_json::Value> =
        stderr.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    assert!(
        lines.iter().any(|l| l["level"] == "DEBUG" && l["fields"]["message"] == "node planned"),
        "the node plan's log line, as JSON: {stderr}"
    );
}
