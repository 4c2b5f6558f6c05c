//! A process attached to its node's agent: [`AttachedClient`]. The node's arenas are mapped into this process
//! once, at attach (GPU chunks imported through their file descriptors, the host tier's shared memory mapped and
//! registered), so a lease is a few numbers on the socket and pointers in this process: no page bytes cross the
//! socket on that path. Blocking calls, one at a time per client (a call holds the socket until its answer).

use std::io::Write;
use std::ops::Range;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use vfabric_allocator::{Location, TenantId};
use vfabric_transport::{Arena, ArenaShare, Backend, DeviceKind, DeviceLayer, Mover, MoverConfig, OpenOptions};

use super::connection::{answer, exchange, send, Connection};
use super::host_process::HostAgentHandle;
use super::mapped_lease::LocalLease;
use super::{CHUNK, MAX_CHUNK};
use crate::directory::{Mode, Priority, RegionHandle as Region};
use crate::error::{FabricError, NetworkError, ProtocolError};
use crate::fabric::LeasePtr;
use crate::proto::chunk::{ChunkHeader, Payload, CHUNK_HEADER_LEN};
use crate::proto::mapped::{recv_fds, FDS_PER_MESSAGE};
use crate::proto::message::{Message, WireMode, WirePages, WireRegion};
use vfabric_allocator::Compression;

/// How a local client's region is allocated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocOptions {
    /// The device its pages go to; `None` lets the agent choose.
    pub device: Option<Location>,
    /// Eviction priority.
    pub priority: Priority,
    /// The tenant whose quotas it counts against.
    pub tenant: TenantId,
    /// Whether it outlives this client's connection; by default it is freed when the client goes.
    pub keep: bool,
    /// How its pages are stored on the storage tier (as they are by default).
    pub compression: Compression,
    /// One of this client's reservations ([`AttachedClient::reserve`]) its pages draw on.
    pub reservation: Option<u64>,
    /// How it is kept across nodes (by default as the cluster's `network.replicas` and `replica_lag_ms` say).
    pub replication: crate::agent::Replication,
}

/// A process's attachment to its node's agent, with the node's memory mapped here.
#[derive(Clone)]
pub struct AttachedClient {
    pub(super) inner: Arc<ClientInner>,
    /// The device a rank uses when it names none (its local rank's GPU, from [`AttachedClient::join`]).
    pub(super) default_device: Option<Location>,
    /// The agent this process started for its host's ranks ([`AttachedClient::join`]), if it did: it runs as
    /// long as a clone of this client does. Declared after `inner`, so the client's socket closes first.
    pub(super) host: Option<Arc<HostAgentHandle>>,
}

pub(super) struct ClientInner {
    conn: Arc<Connection>,
    node: u16,
    page_size: u64,
    kind: DeviceKind,
    layer: Arc<dyn DeviceLayer>,
    /// This process's mover, for copies out of leased pages ([`LocalLease::copy_to`]).
    mover: Arc<dyn Mover>,
    /// The node's arenas as mapped in this process, by location.
    arenas: Vec<Arc<dyn Arena>>,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> FabricError + '_ {
    move |source| NetworkError::Socket { path: path.to_path_buf(), source }.into()
}

impl AttachedClient {
    /// Connects to the agent serving `socket` and maps its arenas.
    pub fn attach(socket: &Path) -> Result<AttachedClient, FabricError> {
        let mut s = UnixStream::connect(socket).map_err(io(socket))?;
        let hello = super::client_hello();
        let node = match exchange(&mut s, u16::MAX, &hello)? {
            Message::Welcome { node, .. } => node,
            other => return Err(ProtocolError::Unexpected { node: u16::MAX, answer: other.name() }.into()),
        };
        let (page_size, cuda, wire) = match exchange(&mut s, node, &Message::Attach)? {
            Message::Attached { page_size, cuda, arenas } => (page_size, cuda, arenas),
            other => return Err(ProtocolError::Unexpected { node, answer: other.name() }.into()),
        };
        let shares: Vec<ArenaShare> = wire.iter().map(ArenaShare::from).collect();
        let want: usize = shares.iter().map(|a| a.pieces.len()).sum();
        let mut fds = Vec::with_capacity(want);
        while fds.len() < want {
            let batch = recv_fds(s.as_fd(), FDS_PER_MESSAGE.min(want - fds.len())).map_err(io(socket))?;
            fds.extend(batch);
        }
        if fds.len() != want {
            return Err(ProtocolError::BadField { field: "descriptors", value: fds.len() as u64 }.into());
        }
        let gpus = shares.iter().filter_map(|a| match a.location {
            Location::Gpu(g) => Some(g + 1),
            Location::Host | Location::Storage | Location::Packed(_) | Location::Compressed => None,
        });
        let backend = if cuda { Backend::Cuda } else { Backend::Emulated };
        // The emulated GPUs of a client hold only its own scratch arenas (the imported ones are charged to the agent).
        let options = OpenOptions {
            backend,
            emulated_gpus: gpus.max().unwrap_or(0),
            emulated_gpu_memory: 1 << 40,
            emulated_host_link: 0,
        };
        let layer = vfabric_transport::open(&options)?.layer;
        let mut arenas = Vec::with_capacity(shares.len());
        let mut rest = fds.into_iter();
        for share in &shares {
            let mine: Vec<_> = rest.by_ref().take(share.pieces.len()).collect();
            arenas.push(layer.import_arena(share, mine)?);
        }
        tracing::debug!(node, arenas = arenas.len(), "attached to the node's agent");
        let kind = layer.kind();
        let conn = Arc::new(Connection::new(s, node));
        let mover = layer.mover(MoverConfig::default())?;
        let inner = Arc::new(ClientInner { conn, node, page_size, kind, layer, mover, arenas });
        Ok(AttachedClient { inner, default_device: None, host: None })
    }

    /// The agent's node.
    pub fn node(&self) -> u16 {
        self.inner.node
    }

    /// Whether the node's devices are GPUs or the emulated device.
    pub fn device_kind(&self) -> DeviceKind {
        self.inner.kind
    }

    /// The devices whose memory is mapped here: the node's GPUs, then the host.
    pub fn devices(&self) -> Vec<Location> {
        self.inner.arenas.iter().map(|a| a.location()).collect()
    }

    /// The device this process uses when it names none: its local rank's GPU when it joined as a rank of a job
    /// ([`AttachedClient::join`]), else none.
    pub fn default_device(&self) -> Option<Location> {
        self.default_device
    }

    /// Whether this process runs its host's agent (it started it as local rank 0 of a job): the other ranks lose
    /// it when this process ends.
    pub fn hosts_agent(&self) -> bool {
        self.host.is_some()
    }

    /// The node's page size.
    pub fn page_size(&self) -> u64 {
        self.inner.page_size
    }

    /// Allocates a region at this node.
    pub fn alloc(&self, size: u64, options: &AllocOptions) -> Result<Region, FabricError> {
        let priority = match options.priority {
            Priority::Low => 0,
            Priority::Normal => 1,
            Priority::High => 2,
        };
        let msg = Message::AllocWith {
            size,
            device: options.device.map(Into::into),
            priority,
            tenant: options.tenant.0,
            keep: options.keep,
            compression: options.compression.number(),
            reservation: options.reservation,
            replicas: options.replication.replicas,
            lag_ms: options.replication.lag_ms(),
        };
        match self.inner.conn.call(&msg)? {
            Message::Allocated { region } => Ok(Region::from(&region)),
            other => Err(self.inner.conn.unexpected(&other)),
        }
    }

    /// Sets `bytes` (whole pages) of `device` aside for `tenant` now, evicting other pages as an acquire would:
    /// regions this client allocates naming the returned id ([`AllocOptions::reservation`]) take that memory
    /// as their pages arrive there. Refused at once, with what can be had, when it cannot be met. Returns the
    /// id and the bytes held; given back by [`AttachedClient::unreserve`] or when the connection ends.
    pub fn reserve(&self, device: Location, bytes: u64, tenant: TenantId) -> Result<(u64, u64), FabricError> {
        let msg = Message::Reserve { device: device.into(), bytes, tenant: tenant.0 };
        match self.inner.conn.call(&msg)? {
            Message::Reserved { id, bytes } => Ok((id, bytes)),
            other => Err(self.inner.conn.unexpected(&other)),
        }
    }

    /// Bytes one of this client's reservations still holds.
    pub fn reserved(&self, id: u64) -> Result<u64, FabricError> {
        match self.inner.conn.call(&Message::ReservationLeft { id })? {
            Message::Reserved { bytes, .. } => Ok(bytes),
            other => Err(self.inner.conn.unexpected(&other)),
        }
    }

    /// Gives one of this client's reservations back.
    pub fn unreserve(&self, id: u64) -> Result<(), FabricError> {
        self.inner.conn.done(&Message::Unreserve { id })
    }

    /// Frees a region (any region of the cluster).
    pub fn free(&self, region: &Region) -> Result<(), FabricError> {
        self.inner.conn.done(&Message::Free { region: WireRegion::from(region) })
    }

    /// Acquires `range` of a region on `device` of this node: when it returns, the pages are there, at the
    /// lease's pointers (valid in this process), until the lease is released.
    pub fn acquire(
        &self,
        region: &Region,
        range: Range<u64>,
        device: Location,
        mode: Mode,
    ) -> Result<LocalLease, FabricError> {
        let len = crate::fabric::range_len(region, &range)?;
        let msg = Message::AcquireMapped {
            region: WireRegion::from(region),
            offset: range.start,
            len,
            device: device.into(),
            mode: WireMode::from(mode),
        };
        let (id, first, pages) = match self.inner.conn.call(&msg)? {
            Message::Mapped { lease, first, pages } => (lease, first, pages),
            other => return Err(self.inner.conn.unexpected(&other)),
        };
        // From here the agent holds the lease for us: a pointer that makes no sense gives it back.
        let lease = LocalLease::new(Arc::clone(&self.inner.conn), id, *region, device, mode, first);
        let arena = self.inner.arena(device)?;
        // The lease's pointers are for this process's kernels: host pages must be reachable by its GPUs.
        arena.prepare_for_devices()?;
        let (base, arena_len) = (arena.device_ptr(), arena.len());
        let inside = |off: u64, len: u64| off.checked_add(len).is_some_and(|end| end <= arena_len);
        let ptr = match pages {
            WirePages::Run { offset, len } if inside(offset, len) => LeasePtr::Contiguous { ptr: base + offset, len },
            WirePages::Pages(offs) if offs.iter().all(|&o| inside(o, self.inner.page_size)) => {
                LeasePtr::Pages(offs.iter().map(|&o| base + o).collect())
            }
            _ => return Err(ProtocolError::BadField { field: "mapped pages", value: id }.into()),
        };
        Ok(lease.with_pages(arena, Arc::clone(&self.inner.mover), ptr, self.inner.page_size))
    }

    /// Releases a lease; a `Write` lease's changes become the region's.
    pub fn release(&self, lease: LocalLease) -> Result<(), FabricError> {
        lease.release()
    }

    /// A hint that `range` of a region will be wanted on `device` soon: its pages start moving there.
    pub fn prefetch(&self, region: &Region, range: Range<u64>, device: Location) -> Result<(), FabricError> {
        let len = range.end.saturating_sub(range.start);
        let msg =
            Message::Prefetch { region: WireRegion::from(region), offset: range.start, len, device: device.into() };
        self.inner.conn.done(&msg)
    }

    /// Starts copying the pages of a range that only `device` holds to host memory (see
    /// [`Fabric::write_back`](crate::Fabric::write_back)); returns once the agent has started the copies.
    pub fn write_back(&self, region: &Region, range: Range<u64>, device: Location) -> Result<(), FabricError> {
        let len = range.end.saturating_sub(range.start);
        let msg =
            Message::WriteBack { region: WireRegion::from(region), offset: range.start, len, device: device.into() };
        self.inner.conn.done(&msg)
    }

    /// Moves a region to `device` of its home node.
    pub fn migrate(&self, region: &Region, device: Location) -> Result<(), FabricError> {
        self.inner.conn.done(&Message::Migrate { region: WireRegion::from(region), device: device.into() })
    }

    /// One round trip to the agent and back with nothing done there: the floor under every call's latency.
    pub fn ping(&self) -> Result<std::time::Duration, FabricError> {
        let t = std::time::Instant::now();
        match self.inner.conn.call(&Message::Ping { nonce: 7 })? {
            Message::Pong { nonce: 7 } => Ok(t.elapsed()),
            other => Err(self.inner.conn.unexpected(&other)),
        }
    }

    /// The node's figures (the fabric's `Stats`) as JSON.
    pub fn stats_json(&self) -> Result<String, FabricError> {
        match self.inner.conn.call(&Message::Stats)? {
            Message::Figures { json } => Ok(json),
            other => Err(self.inner.conn.unexpected(&other)),
        }
    }

    /// An arena of this process's own on `location` (not the fabric's: for buffers a lease's pages are copied
    /// into, [`LocalLease::copy_to`]).
    pub fn scratch_arena(&self, location: Location, bytes: u64) -> Result<Arc<dyn Arena>, FabricError> {
        Ok(self.inner.layer.create_arena(&vfabric_transport::ArenaSpec::new(location, bytes))?)
    }

    /// This process's mover (copies between arenas of this process, [`AttachedClient::scratch_arena`]s among
    /// them).
    pub fn mover(&self) -> Arc<dyn Mover> {
        Arc::clone(&self.inner.mover)
    }

    /// Waits until the work this process queued on `device` is done (call it before releasing a lease that
    /// kernels of this process were using).
    pub fn synchronize(&self, device: Location) -> Result<(), FabricError> {
        Ok(self.inner.layer.synchronize(device)?)
    }

    /// Writes `data` into a region at `offset` (the bytes go through the socket, checksummed).
    pub fn write(&self, region: &Region, offset: u64, data: &[u8]) -> Result<(), FabricError> {
        let msg = Message::Write { region: WireRegion::from(region), offset, len: data.len() as u64 };
        let mut s = self.inner.conn.lock();
        send(&mut s, &msg)?;
        for (i, piece) in data.chunks(CHUNK).enumerate() {
            let header = ChunkHeader::for_payload((i * CHUNK) as u64, piece).encode();
            s.write_all(&header).and_then(|()| s.write_all(piece)).map_err(NetworkError::Io)?;
        }
        match answer(&mut s, self.inner.node)? {
            Message::Done => Ok(()),
            other => Err(self.inner.conn.unexpected(&other)),
        }
    }

    /// Reads a region at `offset` into `buf` (the bytes come through the socket, checksummed and verified).
    pub fn read(&self, region: &Region, offset: u64, buf: &mut [u8]) -> Result<(), FabricError> {
        let msg = Message::Read { region: WireRegion::from(region), offset, len: buf.len() as u64 };
        let mut s = self.inner.conn.lock();
        send(&mut s, &msg)?;
        match answer(&mut s, self.inner.node)? {
            Message::Data { len } if len == buf.len() as u64 => receive_blocking(&mut s, buf),
            other => Err(self.inner.conn.unexpected(&other)),
        }
    }
}

impl ClientInner {
    fn arena(&self, device: Location) -> Result<Arc<dyn Arena>, FabricError> {
        self.arenas.iter().find(|a| a.location() == device).cloned().ok_or(FabricError::DeviceUnavailable(device))
    }
}

/// A read's payload: checksummed chunks, each verified and put in its place in `buf`.
fn receive_blocking(s: &mut UnixStream, buf: &mut [u8]) -> Result<(), FabricError> {
    use std::io::Read;
    let mut payload = Payload::new(buf.len() as u64, MAX_CHUNK);
    while !payload.is_complete() {
        let mut head = [0u8; CHUNK_HEADER_LEN];
        s.read_exact(&mut head).map_err(NetworkError::Io)?;
        let header = ChunkHeader::decode(&head);
        let at = payload.place(&header).map_err(ProtocolError::Chunk)? as usize;
        let piece = &mut buf[at..at + header.len as usize];
        s.read_exact(piece).map_err(NetworkError::Io)?;
        header.verify(xxhash_rust::xxh3::xxh3_64(piece)).map_err(|e| FabricError::Checksum(e.to_string()))?;
    }
    payload.finish().map_err(ProtocolError::Chunk)?;
    Ok(())
}
