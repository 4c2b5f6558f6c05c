//! The agent's side of the local socket: who may connect, and one client's requests, one after the other.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use vfabric_allocator::Location;

use super::session::Session;
use crate::agent::shared::Agent;
use crate::directory::RegionHandle as Region;
use crate::error::{FabricError, NetworkError, ProtocolError};
use crate::proto::codec::{read_frame, write_frame, PROTOCOL_VERSION};
use crate::proto::convert::refusal;
use crate::proto::message::{Message, WireRegion};

impl Agent {
    /// Serves local clients on a Unix socket at `path` (a stale socket file there is replaced) until the
    /// agent shuts down. The socket is its owner's alone (mode 0600), and a client running as another user is
    /// refused even if it reaches the socket (its credentials are checked).
    pub async fn serve_local(&self, path: &Path) -> Result<PathBuf, FabricError> {
        let failed = |source| NetworkError::Socket { path: path.to_path_buf(), source };
        if path.exists() {
            if UnixStream::connect(path).await.is_ok() {
                return Err(NetworkError::SocketInUse { path: path.to_path_buf() }.into());
            }
            std::fs::remove_file(path).map_err(failed)?;
        }
        let listener = UnixListener::bind(path).map_err(failed)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(failed)?;
        let agent = self.clone();
        let task = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let a = agent.clone();
                        tokio::spawn(async move { a.serve_client(stream).await });
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

    /// One client: its credentials, its hello, its requests; then what it held is let go.
    async fn serve_client(&self, mut s: UnixStream) {
        let me = nix::unistd::geteuid().as_raw();
        match s.peer_cred() {
            Ok(cred) if cred.uid() == me => {}
            Ok(cred) => {
                tracing::warn!(uid = cred.uid(), pid = ?cred.pid(), agent_uid = me, "refused a local client of another user");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "refused a local client whose credentials could not be read");
                return;
            }
        }
        let mut session = Session::default();
        if let Err(e) = self.client_requests(&mut s, &mut session).await {
            tracing::warn!(error = %e, "closing a local client's connection");
        }
        self.end_session(session).await;
    }

    /// A client's requests, one after the other. `Err` says why the connection is closed.
    async fn client_requests(&self, s: &mut UnixStream, session: &mut Session) -> Result<(), FabricError> {
        let max = self.max_frame();
        match read_frame(s, max).await? {
            Some(Message::Hello { protocol, .. }) if protocol == PROTOCOL_VERSION => {
                write_frame(s, &Message::Welcome { node: self.node(), protocol }, max).await?;
            }
            Some(m) => return Err(ProtocolError::NotHello(m.name()).into()),
            None => return Ok(()),
        }
        while let Some(msg) = read_frame(s, max).await? {
            let reply = match msg {
                Message::Ping { nonce } => Ok(Message::Pong { nonce }),
                Message::Attach => {
                    self.attach_client(s).await?;
                    continue;
                }
                Message::Alloc { size, device } => self
                    .alloc(self.node(), size, device.map(Location::from))
                    .await
                    .map(|r| Message::Allocated { region: WireRegion::from(&r) }),
                Message::AllocWith { size, device, priority, tenant, keep } => {
                    self.alloc_for(session, size, device.map(Location::from), priority, tenant, keep)
                }
                Message::Free { region } => self.free_for(session, &Region::from(&region)).await,
                Message::AcquireMapped { region, offset, len, device, mode } => {
                    let range = offset..offset.saturating_add(len);
                    self.acquire_mapped(session, &Region::from(&region), range, device.into(), mode.into()).await
                }
                Message::Release { lease } => self.release_for(session, lease).await,
                Message::Prefetch { region, offset, len, device } => {
                    self.prefetch_for(Region::from(&region), offset..offset.saturating_add(len), device.into());
                    Ok(Message::Done)
                }
                Message::Migrate { region, device } => {
                    self.migrate(&Region::from(&region), device.into()).await.map(|()| Message::Done)
                }
                Message::Stats => serde_json::to_string(&self.fabric().stats())
                    .map(|json| Message::Figures { json })
                    .map_err(|_| FabricError::Internal("the fabric's figures could not be written as JSON")),
                Message::Write { region, offset, len } => {
                    self.take_write(s, &Region::from(&region), offset, len).await?
                }
                Message::Read { region, offset, len } => {
                    self.answer_read(s, &Region::from(&region), offset, len).await?;
                    continue;
                }
                other => return Err(ProtocolError::NotServed(other.name()).into()),
            };
            let answer = match reply {
                Ok(m) => m,
                Err(e) => refusal(&e),
            };
            write_frame(s, &answer, max).await?;
        }
        Ok(())
    }
}
