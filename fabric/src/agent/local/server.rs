//! The agent's side of the local socket: who may connect, and one client's requests, one after the other.
//!
//! Each client gets a thread of its own that blocks on its socket, calls the fabric directly and the agent's
//! async API through the runtime's handle: a local acquire is then a read, a fabric call and a write, with no
//! task wake-up or hand-off between them (a client's calls are one at a time anyway, and a node has a few
//! clients: its ranks).

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::UnixListener;
use tokio::runtime::Handle;
use vfabric_allocator::{Location, TenantId};

use super::attached::AllocOptions;
use super::runner::Runner;
use super::session::{alloc_options, Session};
use super::spin;
use super::tenancy::{admits_others, caller_of, Caller};
use crate::agent::shared::Agent;
use crate::agent::{Kept, Replication};
use crate::directory::RegionHandle as Region;
use crate::error::{FabricError, NetworkError, ProtocolError};
use crate::proto::codec::{read_frame_blocking, write_frame_blocking as send, PROTOCOL_VERSION};
use crate::proto::convert::refusal;
use crate::proto::message::{Message, WireRegion};

/// The sockets of the clients being served, shut down when the accept loop goes (the agent stops), which ends
/// their threads.
#[derive(Default, Clone)]
struct Clients(Arc<Mutex<HashMap<u64, UnixStream>>>);

impl Clients {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, UnixStream>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Held by the accept loop: when the loop is dropped (aborted at shutdown), every client's socket is shut down.
struct ShutDownOnDrop(Clients);

impl Drop for ShutDownOnDrop {
    fn drop(&mut self) {
        for s in self.0.lock().values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Agent {
    /// Serves local clients on a Unix socket at `path` (a stale socket file there is replaced) until the
    /// agent shuts down. The socket is its owner's alone (mode 0600), and a client running as another user is
    /// refused even if it reaches the socket (its credentials are checked).
    pub async fn serve_local(&self, path: &Path) -> Result<PathBuf, FabricError> {
        let failed = |source| NetworkError::Socket { path: path.to_path_buf(), source };
        if path.exists() {
            if tokio::net::UnixStream::connect(path).await.is_ok() {
                return Err(NetworkError::SocketInUse { path: path.to_path_buf() }.into());
            }
            std::fs::remove_file(path).map_err(failed)?;
        }
        let listener = UnixListener::bind(path).map_err(failed)?;
        // Only the agent's user may connect, unless a tenant admits others: their credentials decide then.
        let mode = if admits_others(&self.shared.tenants) { 0o666 } else { 0o600 };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(failed)?;
        let agent = self.clone();
        let task = tokio::spawn(async move {
            let clients = Clients::default();
            let _guard = ShutDownOnDrop(clients.clone());
            let mut next = 0u64;
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        next += 1;
                        if let Err(e) = agent.start_client(stream, next, &clients) {
                            tracing::warn!(error = %e, "could not serve a local client");
                        }
                    }
                    // Out of descriptors, or the like: say so and keep serving once it passes, instead of leaving
                    // every later client without an agent.
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a local client failed; retrying");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
        self.tasks().push(task);
        Ok(path.to_path_buf())
    }

    /// Checks a new client's credentials and starts its thread.
    fn start_client(&self, stream: tokio::net::UnixStream, id: u64, clients: &Clients) -> std::io::Result<()> {
        let me = nix::unistd::geteuid().as_raw();
        let cred = stream.peer_cred()?;
        let tenant = match caller_of(cred.uid(), me, &self.shared.tenants) {
            Some(Caller::Operator) => None,
            Some(Caller::Tenant(t)) => Some(t),
            None => {
                tracing::warn!(uid = cred.uid(), pid = ?cred.pid(), agent_uid = me, "refused a local client of another user");
                return Ok(());
            }
        };
        let mut s = stream.into_std()?;
        s.set_nonblocking(false)?;
        let most = self.shared.net.max_local_clients as usize;
        if clients.lock().len() >= most {
            // Served at once, with no thread: the client reads why, and the agent stays the size it is.
            tracing::warn!(most, "refused a local client: as many as network.max_local_clients are connected");
            let why = FabricError::Network(NetworkError::TooManyClients { most });
            let _ = send(&mut s, &refusal(&why), self.max_frame());
            return Ok(());
        }
        clients.lock().insert(id, s.try_clone()?);
        let (agent, rt, registry) = (self.clone(), Handle::current(), clients.clone());
        let spawned = std::thread::Builder::new().name(format!("vfabric-local-{id}")).spawn(move || {
            agent.serve_client(s, &rt, tenant);
            registry.lock().remove(&id);
        });
        if let Err(e) = spawned {
            clients.lock().remove(&id);
            return Err(e);
        }
        Ok(())
    }

    /// One client: its hello, its requests; then what it held is let go.
    fn serve_client(&self, mut s: UnixStream, rt: &Handle, tenant: Option<TenantId>) {
        let rt = &Runner::new(rt.clone(), tenant);
        let mut session = Session::default();
        session.tenant = tenant;
        if let Err(e) = self.client_requests(&mut s, &mut session, rt) {
            tracing::warn!(error = %e, "closing a local client's connection");
        }
        rt.block_on(self.end_session(session));
    }

    /// A client's requests, one after the other. `Err` says why the connection is closed.
    fn client_requests(&self, s: &mut UnixStream, session: &mut Session, rt: &Runner) -> Result<(), FabricError> {
        let max = self.max_frame();
        match read_frame_blocking(s, max)? {
            Some(Message::Hello { protocol, .. }) if protocol == PROTOCOL_VERSION => {
                send(s, &Message::Welcome { node: self.node(), protocol }, max)?;
            }
            Some(m) => return Err(ProtocolError::NotHello(m.name()).into()),
            None => return Ok(()),
        }
        let max_spin = spin::budget();
        let mut window = spin::MIN_WINDOW.min(max_spin);
        // The next call often follows soon (a release after its acquire): poll for it before sleeping.
        loop {
            let answered = Instant::now();
            let Some(mut msg) = spin::read_frame(s, max, window)? else { break };
            window = spin::window(answered.elapsed(), max_spin);
            let refused = match session.tenant {
                Some(t) => self.authorise(t, &mut msg).err(),
                None => None,
            };
            if let Some(e) = refused {
                if let Message::Write { len, .. } = msg {
                    // Its payload is taken all the same, to keep the stream in step; nothing is written.
                    let answer = self.take_write(s, rt, None, 0, len)?.err().unwrap_or(e);
                    send(s, &refusal(&answer), max)?;
                } else {
                    send(s, &refusal(&e), max)?;
                }
                continue;
            }
            let (call, started) = (msg.name(), self.shared.metrics.start());
            let reply = match msg {
                Message::Ping { nonce } => Ok(Message::Pong { nonce }),
                Message::Attach => {
                    self.attach_client(s)?;
                    continue;
                }
                // A tenant's plain allocation is its tenant's, here, and outlives the connection as any does.
                Message::Alloc { size, device, replicas, lag_ms, compression, priority } => {
                    let lag = lag_ms.map(|ms| Duration::from_millis(u64::from(ms)));
                    let replication = Replication { replicas, lag };
                    match Kept::from_wire(device.map(Location::from), compression, priority) {
                        Ok(kept) if session.tenant.is_some() => {
                            let Kept { device, compression, priority } = kept;
                            let tenant = session.tenant.unwrap_or_default();
                            let options = AllocOptions {
                                device,
                                priority,
                                tenant,
                                keep: true,
                                compression,
                                replication,
                                ..AllocOptions::default()
                            };
                            self.alloc_for(rt, session, size, options)
                        }
                        Ok(kept) => rt
                            .block_on(self.alloc_with(self.node(), size, kept, replication))
                            .map(|r| Message::Allocated { region: WireRegion::from(&r) }),
                        Err(e) => Err(e),
                    }
                }
                Message::AllocWith {
                    size,
                    device,
                    priority,
                    tenant,
                    keep,
                    compression,
                    reservation,
                    replicas,
                    lag_ms,
                } => alloc_options(device.map(Location::from), priority, tenant, keep, compression, reservation)
                    .map(|options| AllocOptions {
                        replication: Replication {
                            replicas,
                            lag: lag_ms.map(|ms| Duration::from_millis(u64::from(ms))),
                        },
                        ..options
                    })
                    .and_then(|options| self.alloc_for(rt, session, size, options)),
                Message::Reserve { device, bytes, tenant } => self.reserve_for(session, device.into(), bytes, tenant),
                Message::Unreserve { id } => self.unreserve_for(session, id),
                Message::ReservationLeft { id } => self.reservation_left(session, id),
                Message::Free { region } => rt.block_on(self.free_for(session, &Region::from(&region))),
                Message::AcquireMapped { region, offset, len, device, mode } => {
                    let range = offset..offset.saturating_add(len);
                    let r = Region::from(&region);
                    rt.block_on(self.acquire_mapped(session, &r, range, device.into(), mode.into()))
                }
                Message::Release { lease } => rt.block_on(self.release_for(session, lease)),
                Message::Prefetch { region, offset, len, device } => {
                    self.prefetch_for(
                        session,
                        rt,
                        Region::from(&region),
                        offset..offset.saturating_add(len),
                        device.into(),
                    );
                    Ok(Message::Done)
                }
                Message::WriteBack { region, offset, len, device } => {
                    self.write_back_for(&Region::from(&region), offset..offset.saturating_add(len), device.into())
                }
                Message::Migrate { region, device } => {
                    rt.block_on(self.migrate(&Region::from(&region), device.into())).map(|()| Message::Done)
                }
                Message::Stats => serde_json::to_string(&self.fabric().stats())
                    .map(|json| Message::Figures { json })
                    .map_err(|_| FabricError::Internal("the fabric's figures could not be written as JSON")),
                Message::Status { node } => rt.block_on(self.status_json(node)).map(|json| Message::Figures { json }),
                Message::Write { region, offset, len } => {
                    self.take_write(s, rt, Some(&Region::from(&region)), offset, len)?
                }
                Message::Read { region, offset, len } => {
                    self.answer_read(s, rt, &Region::from(&region), offset, len)?;
                    continue;
                }
                other => return Err(ProtocolError::NotServed(other.name()).into()),
            };
            let answer = match reply {
                Ok(m) => m,
                Err(e) => refusal(&e),
            };
            send(s, &answer, max)?;
            self.shared.metrics.local_call(call, started);
        }
        Ok(())
    }
}
