//! What the integration tests that shell out need from the machine. A test that cannot run fails (it never
//! passes without running) and says what is missing and how to get it.

use std::path::PathBuf;

/// How to get everything these tests need on Debian/Ubuntu in one go.
const CI_RUN: &str = "or run `bash .ci/run` from the repository root, which installs what the tests need and runs them";

#[allow(dead_code)] // each test file is its own crate; not every one shells out to a tool
/// The path of `tool` on PATH; panics naming the tool, the Debian/Ubuntu package that has it, and `.ci/run`.
pub fn require_tool(tool: &str, package: &str, what: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(tool);
        if is_executable(&candidate) {
            return candidate;
        }
    }
    panic!(
        "`{tool}` not found on PATH: this test needs {what}. Install it (`sudo apt-get install -y {package}` on \
         Debian/Ubuntu), {CI_RUN}"
    );
}

/// Panics unless the test runs as root, saying why root is needed and how to run it.
#[allow(dead_code)] // each test file is its own crate; not every one needs root
pub fn require_root(why: &str, test: &str) {
    // The effective uid (the third field of /proc/self/status's Uid line), without a libc dependency.
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(2).and_then(|u| u.parse::<u32>().ok()));
    if uid != Some(0) {
        panic!(
            "this test must run as root: {why}. Run it as root (`sudo -E env \"PATH=$PATH\" cargo test -p vfabric \
             --test {test}`), {CI_RUN} (run as a user, it runs this test under sudo)"
        );
    }
}

#[allow(dead_code)]
fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// A child process ended by its PID when the test lets go of it, also when the test fails (a stopped one is
/// continued first, so that it can be killed and reaped).
#[allow(dead_code)] // each test file is its own crate; not every one starts processes
pub struct Ended(pub std::process::Child);

impl Drop for Ended {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A cluster `name` of `nodes` nodes (`n0`, `n1`, ...) on the emulated device with small arenas (GPU 8 MiB, host
/// 16 MiB), for a test to adjust before [`agents_in_process`].
#[allow(dead_code)] // each test file is its own crate; not every one starts agents in its process
pub fn small_cluster(name: &str, nodes: usize) -> vfabric::ClusterConfig {
    let mut cfg = vfabric::ClusterConfig::embedded_local();
    cfg.cluster.name = name.into();
    cfg.device.backend = vfabric::Backend::Emulated;
    cfg.memory.gpu_budget = Some(vfabric::ByteSize(8 << 20));
    cfg.memory.host_arena = vfabric::ByteSize(16 << 20);
    cfg.nodes = (0..nodes)
        .map(|i| vfabric::config::NodeSection { name: format!("n{i}"), gpus: None, address: None, tenant: None })
        .collect();
    cfg
}

/// The agents of every node of `cfg`, started in this process on loopback ports the kernel picks (certificates
/// from a CA made for the purpose), each told where the others listen.
#[allow(dead_code)]
pub async fn agents_in_process(cfg: &vfabric::ClusterConfig) -> Vec<vfabric::agent::Agent> {
    let ca = vfabric_transport::quic::ClusterCa::generate(&cfg.cluster.name).expect("ca");
    let mut agents = Vec::new();
    for n in &cfg.nodes {
        let id = ca.issue(&n.name).expect("certificate");
        let at = Some("127.0.0.1:0".parse().expect("addr"));
        agents.push(vfabric::agent::Agent::start(cfg, &n.name, &id, at).await.expect("agent"));
    }
    for (i, a) in agents.iter().enumerate() {
        for (j, b) in agents.iter().enumerate() {
            if i != j {
                a.set_peer_addr(j as u16, b.local_addr()).await.expect("peer");
            }
        }
    }
    agents
}
