//! The agent's limits on local clients: out of file descriptors it keeps serving (while it cannot accept,
//! clients wait in the socket's backlog; once descriptors are free again, the next client is served), past
//! `network.max_local_clients` a new client is refused with a reason, and a tenant's client is held to its own
//! tenant. The agent runs in a process of its own (ended by the test, by its PID).

mod common;
use common::Ended;

use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vfabric::proto::codec::{read_frame_blocking, write_frame_blocking, PROTOCOL_VERSION};
use vfabric::proto::{ErrorKind as Refused, Message, WireRegion};

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
    // Under the system's temporary folder, which other users can reach (the tenants' clients run as them).
    let dir = std::env::temp_dir().join(format!("vfabric-test-{name}-{}", std::process::id()));
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

/// Runs `/usr/bin/python3` as `uid`: connects to `socket` and sends each item of `items` (bytes; `true` when an
/// answer frame follows, read before the next item). Returns the answers in order, `None` where none came (the
/// agent closed the connection).
fn as_user(uid: u32, socket: &std::path::Path, items: &[(Vec<u8>, bool)]) -> Vec<Option<Message>> {
    let script = "import socket,sys\n\
                  s=socket.socket(socket.AF_UNIX)\ns.settimeout(10)\ns.connect(sys.argv[1])\n\
                  def take(n):\n  b=b''\n  while len(b)<n:\n    c=s.recv(n-len(b))\n    if not c: return None\n    b+=c\n  return b\n\
                  try:\n  for item in sys.argv[2:]:\n    kind,data=item.split(':')\n    s.sendall(bytes.fromhex(data))\n\
                  \x20   if kind=='f':\n      h=take(12)\n      b=take(int.from_bytes(h[8:12],'big')) if h else None\n\
                  \x20     print((h+b).hex() if b is not None else '-')\n\
                  except (ConnectionResetError, BrokenPipeError):\n  print('-')\n";
    let args: Vec<String> = items
        .iter()
        .map(|(bytes, answer)| {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            format!("{}:{hex}", if *answer { "f" } else { "r" })
        })
        .collect();
    let out = Command::new("/usr/bin/python3").args(["-c", script]).arg(socket).args(&args).uid(uid).output();
    let out = out.expect("/usr/bin/python3 (apt-get install python3)");
    assert!(out.status.success(), "the client as uid {uid} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let bytes: Vec<u8> =
                (0..l.len() / 2).filter_map(|i| u8::from_str_radix(&l[2 * i..2 * i + 2], 16).ok()).collect();
            read_frame_blocking(&mut std::io::Cursor::new(bytes), 1 << 20).ok().flatten()
        })
        .collect()
}

fn frame(m: &Message) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    vfabric::proto::codec::encode(m, 1 << 20, &mut out).expect("encode");
    (out, true)
}

/// A `Write` of one 4 KiB chunk to `region`: the frame, then its payload (no answer between them).
fn write_of(region: WireRegion) -> [(Vec<u8>, bool); 2] {
    let bytes = vec![0x5au8; 4096];
    let mut payload = vfabric::proto::ChunkHeader::for_payload(0, &bytes).encode().to_vec();
    payload.extend_from_slice(&bytes);
    let (head, _) = frame(&Message::Write { region, offset: 0, len: 4096 });
    [(head, false), (payload, true)]
}

fn denied(answer: &Option<Message>) -> String {
    match answer {
        Some(Message::Error { kind: Refused::PermissionDenied, message }) => message.clone(),
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
}

/// Users a `[[tenant]]` lists act as that tenant: they allocate under its name only, touch only its regions (a
/// handle of another tenant's region gets the answer a handle naming none gets), and cannot make the
/// operator's calls; a user no tenant lists gets no answer at all; the agent's own user is served as before.
#[test]
fn a_tenants_client_sees_only_its_own_regions() {
    common::require_root("its clients run as other users (uids 65532-65534)", "agent_limits");
    let tenants = "[[tenant]]\nid = 7\nuids = [65534]\n[[tenant]]\nid = 8\nuids = [65533]\n";
    let (dir, socket, agent) = start_agent("tenants", 47540, tenants, None);
    let hello = frame(&Message::Hello {
        cluster: "limits".into(),
        node: 0,
        protocol: PROTOCOL_VERSION,
        lanes: 0,
        latency_lane: false,
    });
    let alloc = |tenant: u32| {
        frame(&Message::AllocWith {
            size: 1 << 20,
            device: None,
            priority: 1,
            tenant,
            keep: true,
            compression: 0,
            reservation: None,
            replicas: 0,
            lag_ms: None,
        })
    };
    // Tenant 7 allocates without naming itself, and with a plain `Alloc`: both regions are its.
    let plain =
        frame(&Message::Alloc { size: 1 << 20, device: None, replicas: 0, lag_ms: None, compression: 0, priority: 0 });
    let got = as_user(65534, &socket, &[hello.clone(), alloc(0), plain]);
    assert!(matches!(got[0], Some(Message::Welcome { .. })), "{got:?}");
    let Some(Message::Allocated { region }) = got[1] else { panic!("tenant 7's allocation: {got:?}") };
    let Some(Message::Allocated { region: other }) = got[2] else { panic!("tenant 7's plain allocation: {got:?}") };
    let mut none = region;
    none.addr += 64 << 20;
    // Tenant 8: refused tenant 7's region as it is a handle naming none, the operator's calls, and 7's name.
    let mut items = vec![
        hello.clone(),
        frame(&Message::Read { region, offset: 0, len: 4096 }),
        frame(&Message::Read { region: none, offset: 0, len: 4096 }),
        frame(&Message::Free { region }),
        frame(&Message::Free { region: other }),
    ];
    items.extend(write_of(region));
    items.extend([frame(&Message::Stats), frame(&Message::Attach), alloc(7)]);
    let got = as_user(65533, &socket, &items);
    assert_eq!(got.len(), 9, "{got:?}");
    let (theirs, nobodys) = (denied(&got[1]), denied(&got[2]));
    let shape = |m: &str| m.split(" at ").next().unwrap_or_default().to_owned();
    assert_eq!(shape(&theirs), shape(&nobodys), "another tenant's region and no region look alike");
    for answer in &got[3..] {
        denied(answer);
    }
    // Tenant 7 writes its region and frees both, on a connection that saw no refusal.
    let mut items = vec![hello.clone()];
    items.extend(write_of(region));
    items.extend([frame(&Message::Free { region }), frame(&Message::Free { region: other })]);
    let got = as_user(65534, &socket, &items);
    let done = Some(Message::Done);
    assert!(
        matches!(got[0], Some(Message::Welcome { .. })) && got[1..] == [done.clone(), done.clone(), done],
        "{got:?}"
    );
    // A user no tenant lists gets no answer; the agent's own user is welcomed.
    assert_eq!(as_user(65532, &socket, &[hello]), vec![None]);
    assert!(welcomed(&socket, Duration::from_secs(5)), "the operator is served");
    drop(agent);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}
