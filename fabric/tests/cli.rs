//! The `vfabric` command as a new user runs it.

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
