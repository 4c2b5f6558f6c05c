//! The agent's limits on local clients: out of file descriptors it keeps serving (while it cannot accept,
//! clients wait in the socket's backlog; once descriptors are free again, the next client is served), and past
//! `network.max_local_clients` a new client is refused with a reason. The agent runs in a process of its own
//! (ended by the test, by its PID).

mod common;
use common::Ended;

use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vfabric::proto::codec::{read_frame_blocking, write_frame_blocking, PROTOCOL_VERSION};
use vfabric::proto::Message;

/// Says hello on a new connection; whether the agent welcomed it within `wait`.
fn welcomed(socket: &std::path::Path, wait: Duration) -> bool {
    let Ok(mut s) = UnixStream::connect(socket) else { return false };
    let _ = s.set_read_timeout(Some(wait));
    let hello =
        Message::Hello { cluster: "limits".into(), node: 0, protocol: PROTOCOL_VERSION, lanes: 0, latency_lane: false };
    if write_frame_blocking(&mut s, &hello, 1 << 20).is_err() {
        return false;
    }
    matches!(read_frame_blocking(&mut s, 1 << 20), Ok(Some(Message::Welcome { .. })))
}

/// A one-node agent in a process of its own (its `[network]` given `network` more lines; its descriptors limited
/// to `files` when given), serving its socket: the scratch folder, the socket, and the process.
fn start_agent(
    name: &str,
    port: u16,
    network: &str,
    files: Option<u64>,
) -> (std::path::PathBuf, std::path::PathBuf, Ended) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let config = dir.join("solo.toml");
    let text = format!(
        "[cluster]\nname = \"limits\"\n[device]\nbackend = \"emulated\"\n[memory]\npage_size = \"64KiB\"\n\
         gpu_budget = \"8MiB\"\nhost_arena = \"16MiB\"\n[network]\ncerts = \"{}\"\n{network}\
         [[node]]\nname = \"solo\"\naddress = \"127.0.0.1:{port}\"\n",
        dir.join("certs").display()
    );
    std::fs::write(&config, text).expect("write the configuration");
    let bin = env!("CARGO_BIN_EXE_vfabric");
    let init = Command::new(bin).args(["cluster", "init", "--config"]).arg(&config).output().expect("init");
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let mut cmd = Command::new(bin);
    cmd.args(["agent", "--node", "solo", "--config"])
        .arg(&config)
        .env("TMPDIR", &dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(files) = files {
        // SAFETY: between fork and exec only setrlimit runs, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, files, files)
                    .map_err(std::io::Error::from)
            });
        }
    }
    let agent = Ended(cmd.spawn().expect("start the agent"));
    let socket = dir.join("vfabric-limits-solo.sock");
    let start = Instant::now();
    while !welcomed(&socket, Duration::from_secs(2)) {
        assert!(start.elapsed() < Duration::from_secs(30), "the agent never served its socket");
        std::thread::sleep(Duration::from_millis(100));
    }
    (dir, socket, agent)
}

#[test]
fn an_agent_out_of_descriptors_serves_again_once_they_are_free() {
    let (dir, socket, agent) = start_agent("limits", 47500, "", Some(96));
    // Clients until the agent can take no more: each holds descriptors there while it stays connected.
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..400 {
        match UnixStream::connect(&socket) {
            Ok(s) => held.push(s),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::ConnectionRefused) => refused += 1,
            Err(e) => panic!("connecting: {e}"),
        }
        if refused > 0 {
            break;
        }
    }
    // With the agent's descriptors gone, a new client is not served.
    assert!(!welcomed(&socket, Duration::from_millis(500)), "the agent ran out of descriptors ({} held)", held.len());
    drop(held);
    // Descriptors free again: the agent serves the next client.
    let start = Instant::now();
    while !welcomed(&socket, Duration::from_secs(2)) {
        assert!(start.elapsed() < Duration::from_secs(30), "the agent stopped serving for good");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(agent);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// Past `network.max_local_clients` a new client is refused at once, reading why, and the agent serves the next
/// one once another has gone.
#[test]
fn clients_past_the_limit_are_refused_with_a_reason() {
    let (dir, socket, agent) = start_agent("clients", 47520, "max_local_clients = 3\n", None);
    let hello =
        Message::Hello { cluster: "limits".into(), node: 0, protocol: PROTOCOL_VERSION, lanes: 0, latency_lane: false };
    // Three clients take the three places (the probes that saw the agent up may still be leaving theirs: a
    // refused one tries again).
    let mut held = Vec::new();
    let start = Instant::now();
    while held.len() < 3 {
        assert!(start.elapsed() < Duration::from_secs(30), "three clients never got in");
        let mut s = UnixStream::connect(&socket).expect("connect");
        write_frame_blocking(&mut s, &hello, 1 << 20).expect("hello");
        match read_frame_blocking(&mut s, 1 << 20).expect("answer") {
            Some(Message::Welcome { .. }) => held.push(s),
            Some(Message::Error { .. }) => std::thread::sleep(Duration::from_millis(50)),
            other => panic!("a client's hello: {other:?}"),
        }
    }
    let mut extra = UnixStream::connect(&socket).expect("connect");
    let _ = write_frame_blocking(&mut extra, &hello, 1 << 20);
    match read_frame_blocking(&mut extra, 1 << 20) {
        Ok(Some(Message::Error { message, .. })) => assert!(message.contains("max_local_clients"), "{message}"),
        other => panic!("a fourth client: {other:?}"),
    }
    drop(held.pop());
    let start = Instant::now();
    while !welcomed(&socket, Duration::from_secs(2)) {
        assert!(start.elapsed() < Duration::from_secs(30), "the agent never took a client again");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(held);
    drop(agent);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
