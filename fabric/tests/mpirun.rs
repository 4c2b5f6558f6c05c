//! A job of 4 ranks under Open MPI's mpirun (`examples/mpi_ranks.rs`): every rank runs its own agent from the
//! launcher's environment, rank 0 allocates a region, every rank writes its slice and reads every other rank's
//! back. No MPI library is linked; `.ci/run` installs Debian's openmpi-bin for `mpirun`.

mod common;

use std::path::PathBuf;
use std::process::Command;

fn example(name: &str) -> PathBuf {
    // target/<profile>/deps/<this test> -> target/<profile>/examples/<name>
    let exe = std::env::current_exe().expect("test path");
    exe.parent().and_then(|d| d.parent()).map(|p| p.join("examples").join(name)).expect("target folder")
}

#[test]
fn four_ranks_under_mpirun_share_one_region() {
    let mpirun = common::require_tool("mpirun", "openmpi-bin", "Open MPI's launcher to start 4 ranks");
    let dir = std::env::temp_dir().join(format!("vfabric-mpirun-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("share")).expect("tmp");
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../cluster-configs/mpirun.toml");
    let init = Command::new(env!("CARGO_BIN_EXE_vfabric"))
        .args(["cluster", "init", "--config", config, "--ranks", "4", "--out"])
        .arg(dir.join("certs"))
        .output()
        .expect("vfabric cluster init");
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let bin = example("mpi_ranks");
    assert!(bin.exists(), "{} is built with the tests", bin.display());
    let port = 20_000 + std::process::id() % 20_000;
    let out = Command::new(&mpirun)
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
        .args(["-x", &format!("VFABRIC_RENDEZVOUS=127.0.0.1:{port}")])
        .args(["-x", &format!("VFABRIC_CERTS={}", dir.join("certs").display())])
        .args(["-x", &format!("VFABRIC_SHARE={}", dir.join("share").display())])
        .args(["-x", "VFABRIC_LOG=warn"])
        .arg(&bin)
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", mpirun.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    for r in 0..4 {
        assert!(stdout.contains(&format!("rank {r} of 4: all 4 slices verified")), "{stdout}");
    }
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
