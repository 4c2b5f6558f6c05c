//! The control messages and the plain types they carry across the wire.
//!
//! bincode encodes an enum variant by its index, so the order of variants here *is* the wire format: add new
//! variants at the end of an enum and bump [`PROTOCOL_VERSION`](super::PROTOCOL_VERSION) for anything else.

use bincode::{Decode, Encode};

/// Where pages live, as it crosses the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Encode, Decode)]
pub enum WireLocation {
    /// The GPU with this ordinal on the node that receives the message.
    Gpu(u16),
    /// Host memory on the node that receives the message.
    Host,
    /// The storage tier of the node that receives the message (added last: variant order is the wire format).
    Storage,
    /// The packed tier of bf16 slots of the node that receives the message (added last, as `Storage` was).
    Packed,
    /// The packed tier of fp32 slots of the node that receives the message (added last).
    PackedF32,
    /// The compressed tier of the node that receives the message (added last).
    Compressed,
}

/// The access a lease asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Encode, Decode)]
pub enum WireMode {
    /// Shared, read-only access.
    Read,
    /// Exclusive access that may modify the pages.
    Write,
}

/// A region as it crosses the wire: its first global address (raw u64: home node in the high 16 bits), length,
/// page size, and the home's slot and generation that name it there.
///
/// The slot and generation let the home tell a live region from a freed one whose slot was reused, so a stale
/// handle is refused (`UseAfterFree`) rather than touching someone else's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Encode, Decode)]
pub struct WireRegion {
    /// The region's first global address: the home node in the high 16 bits, the offset on it below.
    pub addr: u64,
    /// The region's length in bytes.
    pub len: u64,
    /// The region's page size in bytes.
    pub page_size: u64,
    /// The home's directory slot that holds the region.
    pub slot: u32,
    /// The generation of that slot when the region was allocated.
    pub generation: u64,
}

/// How an arena's memory is shared, on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Encode, Decode)]
pub enum WireShareKind {
    /// CUDA VMM chunks, one descriptor each.
    GpuChunks,
    /// One shared memory file.
    HostFile,
}

/// An arena as a local client maps it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Encode, Decode)]
pub struct WireArena {
    /// Where its memory lives.
    pub location: WireLocation,
    /// Its size in bytes.
    pub len: u64,
    /// How it is shared.
    pub kind: WireShareKind,
    /// The size of each piece, one descriptor each, in order.
    pub pieces: Vec<u64>,
}

/// Where a mapped lease's pages are in its device's arena: byte offsets from the arena's first byte.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Encode, Decode)]
pub enum WirePages {
    /// One run of frames.
    Run {
        /// Offset of the first page.
        offset: u64,
        /// Bytes (whole pages).
        len: u64,
    },
    /// One offset per page, in page order.
    Pages(Vec<u64>),
}

/// Why a request failed: the fabric's error kinds, flattened so the wire needs no nested payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Encode, Decode)]
pub enum ErrorKind {
    /// No memory left on the asked-for device (or anywhere, if none was asked for).
    OutOfMemory,
    /// The allocation would exceed the requester's quota.
    QuotaExceeded,
    /// The address names no region.
    InvalidAddress,
    /// The range runs past the end of the region.
    OutOfBounds,
    /// The region was already freed.
    DoubleFree,
    /// The region was freed (its slot may since hold another one).
    UseAfterFree,
    /// Another holder has a conflicting lease on the range.
    LeasedElsewhere,
    /// The asked-for device is absent or failed.
    DeviceUnavailable,
    /// The lease id names no live lease.
    UnknownLease,
    /// A node the request depends on stopped answering.
    PeerDead,
    /// The request broke the protocol (wrong message, wrong order, bad payload length).
    Protocol,
    /// A payload failed its checksum.
    Checksum,
    /// A bug or an unexpected failure on the answering side.
    Internal,
    /// The caller's tenant may not do this (added at the end: the variant order is the wire format).
    PermissionDenied,
    /// What the call needs cannot be reached now: a region's standby copy, or nodes enough for its replicas.
    Unavailable,
    /// The node's copies stopped making progress (a device or drive not answering); calls that move pages fail
    /// until they finish.
    Stalled,
}

/// One control message. Every request goes on its own bidirectional stream: the requester writes one request
/// frame (then, for `Write`, the page payloads, which never go through this codec), the agent answers with one
/// response frame (then, for `Read`, the payloads). `Hello`/`Welcome` open every connection.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum Message {
    // Requests: sent by the side that opened the stream.
    /// Opens a connection: the sender's cluster name, node id, protocol version and lane layout.
    Hello {
        /// The cluster the sender belongs to; a mismatch is refused.
        cluster: String,
        /// The sender's node id.
        node: u16,
        /// The protocol version the sender speaks.
        protocol: u16,
        /// The sender's `network.lanes`; an agent refuses a peer whose lanes differ from its own (they would
        /// dial each other's ports wrongly). Local clients send 0.
        lanes: u16,
        /// The sender's `network.latency_lane`, checked like `lanes`.
        latency_lane: bool,
    },
    /// Asks for a [`Message::Pong`] with the same nonce (liveness and round-trip time).
    Ping {
        /// An opaque value echoed back.
        nonce: u64,
    },
    /// Allocates a region of `size` bytes, on `device` if given, else where the home chooses.
    Alloc {
        /// The size in bytes.
        size: u64,
        /// The device to place the region on, if the requester cares.
        device: Option<WireLocation>,
        /// Nodes that keep its released writes, its home included (`0`: the cluster's `network.replicas`).
        replicas: u8,
        /// How far behind its home its standbys may be, in milliseconds (`None`: the cluster's
        /// `network.replica_lag_ms`; `0`: each write reaches them before it returns).
        lag_ms: Option<u32>,
        /// How its pages are stored (`Compression::number`; 0: as they are).
        compression: u8,
        /// How soon its pages are evicted: 0 low, 1 normal, 2 high.
        priority: u8,
    },
    /// Frees a region.
    Free {
        /// The region to free.
        region: WireRegion,
    },
    /// Writes `len` bytes at `offset` in the region; the payload follows the frame raw on the stream.
    Write {
        /// The region written to.
        region: WireRegion,
        /// The byte offset in the region.
        offset: u64,
        /// The number of payload bytes that follow.
        len: u64,
    },
    /// Reads `len` bytes at `offset` in the region; the payload follows the [`Message::Data`] answer.
    Read {
        /// The region read from.
        region: WireRegion,
        /// The byte offset in the region.
        offset: u64,
        /// The number of bytes wanted.
        len: u64,
    },
    /// Asks for a lease on a byte range of the region, with its pages on `device`.
    Acquire {
        /// The region the lease covers.
        region: WireRegion,
        /// The first byte of the range.
        offset: u64,
        /// The length of the range in bytes.
        len: u64,
        /// Where the pages must be while the lease is held.
        device: WireLocation,
        /// The access asked for.
        mode: WireMode,
        /// The version of the range the requester holds a copy of (from an earlier `Granted`), if any: when it
        /// is still current, the pages are not sent again.
        cached: Option<u64>,
    },
    /// Gives a lease back.
    Release {
        /// The lease id from [`Message::Granted`].
        lease: u64,
    },
    /// Moves a region's pages to `device`.
    Migrate {
        /// The region to move.
        region: WireRegion,
        /// Where its pages should go.
        device: WireLocation,
    },
    /// Tells a holder that its copies of these pages are stale and must be dropped.
    Invalidate {
        /// The region the pages belong to.
        region: WireRegion,
        /// The first page, counted from the start of the region.
        first_page: u64,
        /// The number of pages.
        pages: u64,
    },

    // Responses: sent by the side that accepted the stream.
    /// Accepts a [`Message::Hello`]: the answering node's id and protocol version.
    Welcome {
        /// The answering node's id.
        node: u16,
        /// The protocol version the answering node speaks.
        protocol: u16,
    },
    /// Answers a [`Message::Ping`].
    Pong {
        /// The nonce from the ping.
        nonce: u64,
    },
    /// Answers an [`Message::Alloc`] with the new region.
    Allocated {
        /// The region allocated.
        region: WireRegion,
    },
    /// The request succeeded and there is nothing more to say.
    Done,
    /// Answers a [`Message::Read`]: `len` payload bytes follow the frame raw on the stream.
    Data {
        /// The number of payload bytes that follow.
        len: u64,
    },
    /// Answers an [`Message::Acquire`]: the lease id and the pages it covers.
    Granted {
        /// The lease id, to pass to [`Message::Release`].
        lease: u64,
        /// The first page covered, counted from the start of the region.
        first_page: u64,
        /// The number of pages covered.
        pages: u64,
        /// The range's version (it changes whenever a write to one of its pages is released).
        version: u64,
        /// Whether the requester's copy (`cached`) is current, so no pages follow.
        unchanged: bool,
    },
    /// The request failed.
    Error {
        /// Why, as a kind the requester can act on.
        kind: ErrorKind,
        /// Details for humans (logs); nothing should parse it.
        message: String,
    },

    // Added in protocol 1 after the first release of the enum: requests and responses mixed, at the end.
    /// Asks a region's home to move the region's pages to `device` of node `node` (any node of the cluster,
    /// the home included). The home copies them there and keeps answering for the region. Answered with
    /// [`Message::Moved`] naming where the pages are now.
    MigrateTo {
        /// The region to move.
        region: WireRegion,
        /// The node its pages should go to.
        node: u16,
        /// The device of that node.
        device: WireLocation,
    },
    /// Answers a request naming a region whose pages the home moved: they are now in region `to` (on the node
    /// its address names). The requester asks there, and keeps `to` as a hint for the next time. Also the
    /// answer to a [`Message::MigrateTo`] that succeeded.
    Moved {
        /// Where the region's pages are now.
        to: WireRegion,
    },

    // Added after `MigrateTo` and `Moved`.
    /// From a region's home to the node of a copy that held the region's pages and moved them on to `to`: the
    /// home sends no caller there any more, so the copy's forwarding entry (to `to`, and nothing else) may go.
    /// A caller that still names the copy (an old hint) then finds it freed and asks the home. Answered with
    /// [`Message::Done`].
    Unforward {
        /// The copy whose pages moved on.
        region: WireRegion,
        /// Where they went (the entry is dropped only when it names this region).
        to: WireRegion,
    },

    // Local clients that map the node's memory (added with them; only on the agent's Unix socket).
    /// From a local client: map the node's arenas. Answered with [`Message::Attached`], after which the
    /// arenas' descriptors follow on the socket as `SCM_RIGHTS` messages (see [`super::mapped`]).
    Attach,
    /// Answers [`Message::Attach`]: the node's page size and its arenas, in the order their descriptors follow.
    Attached {
        /// The fabric's page size in bytes.
        page_size: u64,
        /// Whether the node's devices are real GPUs (`true`) or the emulated device.
        cuda: bool,
        /// The arenas.
        arenas: Vec<WireArena>,
    },
    /// Allocates a region at this node with a local client's options. Answered with [`Message::Allocated`].
    AllocWith {
        /// The size in bytes.
        size: u64,
        /// The device to place the region on, if the client cares.
        device: Option<WireLocation>,
        /// Eviction priority: 0 low, 1 normal, 2 high.
        priority: u8,
        /// The tenant whose quotas the region counts against.
        tenant: u32,
        /// Whether the region outlives the client's connection (else it is freed when the client goes).
        keep: bool,
        /// How its pages are packed when they leave the GPU (`Compression::number`): 0 as they are, 1 LZ4 and 2
        /// zstd on the storage tier, 3 fp8 of bf16, 4 fp8 of fp32, 5 int8 of bf16, 6 int8 of fp32.
        compression: u8,
        /// One of the client's reservations ([`Message::Reserve`]) its pages draw on.
        reservation: Option<u64>,
        /// Nodes that keep its released writes, its home included (`0`: the cluster's `network.replicas`).
        replicas: u8,
        /// How far behind its home its standbys may be, in milliseconds (`None`: `network.replica_lag_ms`).
        lag_ms: Option<u32>,
    },
    /// A lease whose pages stay in the node's arenas, which the client has mapped: answered with
    /// [`Message::Mapped`], no payload.
    AcquireMapped {
        /// The region the lease covers.
        region: WireRegion,
        /// The first byte of the range.
        offset: u64,
        /// The length of the range in bytes.
        len: u64,
        /// Where the pages must be while the lease is held.
        device: WireLocation,
        /// The access asked for.
        mode: WireMode,
    },
    /// Answers [`Message::AcquireMapped`]: the lease and where its pages are in the device's arena.
    Mapped {
        /// The lease id, to pass to [`Message::Release`].
        lease: u64,
        /// The region offset of the first leased byte (leases cover whole pages).
        first: u64,
        /// Where the pages are.
        pages: WirePages,
    },
    /// A hint: bring a range's pages to `device` soon. Answered with [`Message::Done`] at once.
    Prefetch {
        /// The region.
        region: WireRegion,
        /// The first byte of the range.
        offset: u64,
        /// The length of the range in bytes.
        len: u64,
        /// Where the pages should go.
        device: WireLocation,
    },
    /// Asks for the node's figures: answered with [`Message::Figures`].
    Stats,
    /// Answers [`Message::Stats`]: the fabric's `Stats` as JSON.
    Figures {
        /// The figures.
        json: String,
    },
    /// A hint: copy the pages of a range that only `device` holds to host memory now, so that evicting them
    /// later costs no copy. Answered with [`Message::Done`] once the copies have started.
    WriteBack {
        /// The region.
        region: WireRegion,
        /// The first byte of the range.
        offset: u64,
        /// The length of the range in bytes.
        len: u64,
        /// The device whose copies go to host memory.
        device: WireLocation,
    },
    /// Sets `bytes` of `device` aside for `tenant` now (a local client's reservation, given back when the client
    /// goes): answered with [`Message::Reserved`], or refused at once with what can be had.
    Reserve {
        /// The device.
        device: WireLocation,
        /// Bytes (rounded up to whole pages).
        bytes: u64,
        /// The tenant whose quota it counts against.
        tenant: u32,
    },
    /// Answers [`Message::Reserve`] and [`Message::ReservationLeft`]: the reservation and the bytes it holds.
    Reserved {
        /// What [`Message::AllocWith`] names to draw on it (per client).
        id: u64,
        /// Bytes it still holds.
        bytes: u64,
    },
    /// Gives one of the client's reservations back. Answered with [`Message::Done`].
    Unreserve {
        /// The reservation.
        id: u64,
    },
    /// Asks what one of the client's reservations still holds: answered with [`Message::Reserved`].
    ReservationLeft {
        /// The reservation.
        id: u64,
    },
    /// A home asks a peer to keep a standby copy of `region`, one of the home's replicated regions (in host
    /// memory). Answered with [`Message::Allocated`] naming the copy.
    Standby {
        /// The home's region.
        region: WireRegion,
        /// The region as its users name it: `region` itself, or, for a copy that took over from a dead home,
        /// the region it took over (a caller that knows only that one finds this standby by it).
        origin: WireRegion,
        /// How many nodes keep the region, its home included: a copy that takes over from a home keeps the
        /// region on as many (it places standbys of its own), and 1 says the home is leaving and hands the
        /// region over (`Agent::drain`): the copy that takes over keeps it alone.
        replicas: u8,
        /// The region's tenant (0: the operator's): the copy is that tenant's, and so is the region it becomes.
        tenant: u32,
        /// How the region's pages are stored (`Compression::number`): the copy is stored the same way, and so
        /// is the region it becomes.
        compression: u8,
        /// The region's eviction priority (0 low, 1 normal, 2 high), the copy's too.
        priority: u8,
    },
    /// A home's released write, copied to a standby: the payload follows as for [`Message::Write`]. A copy
    /// that took over from its home answers [`Message::Moved`] naming itself; a `len` of 0 only asks that.
    Replicate {
        /// The standby copy.
        copy: WireRegion,
        /// The home's exchange number for this region, rising: a standby takes none older than one it took
        /// (one delivered late would overwrite newer bytes).
        seq: u64,
        /// The byte offset in the region.
        offset: u64,
        /// The number of payload bytes that follow.
        len: u64,
    },
    /// A caller found `region`'s home dead and asks a node that may keep its standby copy to take over:
    /// answered [`Message::Moved`] naming the copy that now serves the region, or an error.
    Failover {
        /// The region whose home is dead.
        region: WireRegion,
    },
    /// Opens a request stream ahead of the request: the request acts for `tenant` (its regions only, none of
    /// the operator's calls). Not answered itself.
    OnBehalf {
        /// The tenant.
        tenant: u32,
    },
    /// Asks what a node's agent says about itself (`vfabric status`): answered with [`Message::Figures`], an
    /// `agent::AgentStatus` as JSON. The operator's call, from a local client or a peer.
    Status {
        /// The node whose status: `None` (or the agent's own) for the agent asked; another node's, which a local
        /// client's agent asks for over QUIC (peers answer only for themselves).
        node: Option<u16>,
    },
    /// Opens a request stream ahead of the request (before or after `OnBehalf`): the caller's id for the
    /// request, which the serving agent's logs carry too (span `served`, as the caller's span `call`). Not
    /// answered itself.
    Traced {
        /// The request's id: the calling node's id in the top 16 bits, a count of its calls below.
        id: u64,
    },
    /// The caller gave up request `request` (its `Traced` id) before it took the answer (a timeout around the
    /// call, a cancelled task): whatever the request was granted, or will be, is let go. Answered with `Done`.
    Abandon {
        /// The abandoned request's id.
        request: u64,
    },
    /// Joins a channel between GPUs (NCCL) that the sender made: the sender is rank 0 on its GPU `gpu`, this
    /// node rank 1 on a GPU of its own. Answered with [`Message::Done`] once both ends have joined, or an error
    /// (no NCCL here, or the join failed or timed out). `link` names the channel in [`Message::AcquireBy`].
    ChannelJoin {
        /// The sender's name for the channel (a new join from the same sender with the same GPU replaces it).
        link: u64,
        /// The channel's identity (128 bytes).
        id: Vec<u8>,
        /// The sender's GPU.
        gpu: u16,
    },
    /// An [`Message::Acquire`] whose pages come over channel `link` (joined by [`Message::ChannelJoin`]),
    /// GPU to GPU: the home leases the range on its end's GPU and answers [`Message::ChannelGranted`], then sends
    /// the pages over the channel.
    AcquireBy {
        /// The channel.
        link: u64,
        /// The region the lease covers.
        region: WireRegion,
        /// The first byte of the range.
        offset: u64,
        /// The length of the range in bytes.
        len: u64,
        /// The access asked for.
        mode: WireMode,
        /// The version of the range the requester's copy holds, if any (as for `Acquire`).
        cached: Option<u64>,
        /// The requester's copy as runs of pages contiguous in its device memory, in page order: the pages go in
        /// pieces that lie within one run at each end.
        runs: Vec<u32>,
    },
    /// Answers [`Message::AcquireBy`]: the lease, and how its pages come over the channel.
    ChannelGranted {
        /// The lease id, to pass to [`Message::Release`].
        lease: u64,
        /// The first page covered, counted from the start of the region.
        first_page: u64,
        /// The number of pages covered.
        pages: u64,
        /// The range's version.
        version: u64,
        /// Whether the requester's copy is current, so no pages follow.
        unchanged: bool,
        /// The pieces the pages come in (page counts, in order): each within one run at both ends.
        pieces: Vec<u32>,
        /// Each page's sum ([`vfabric_transport::page_sum`]) as the home computed it on its GPU (empty when
        /// `unchanged`).
        sums: Vec<u64>,
    },
}

impl Message {
    /// Whether this is a request (sent by the side that opened the stream).
    pub fn is_request(&self) -> bool {
        // Spelled out rather than `!matches!(responses)` so that a new variant must be sorted here by hand.
        match self {
            Message::Hello { .. }
            | Message::Ping { .. }
            | Message::Alloc { .. }
            | Message::Free { .. }
            | Message::Write { .. }
            | Message::Read { .. }
            | Message::Acquire { .. }
            | Message::Release { .. }
            | Message::Migrate { .. }
            | Message::Invalidate { .. }
            | Message::MigrateTo { .. }
            | Message::Unforward { .. }
            | Message::Attach
            | Message::AllocWith { .. }
            | Message::AcquireMapped { .. }
            | Message::Prefetch { .. }
            | Message::WriteBack { .. }
            | Message::Reserve { .. }
            | Message::Unreserve { .. }
            | Message::ReservationLeft { .. }
            | Message::Standby { .. }
            | Message::Replicate { .. }
            | Message::Failover { .. }
            | Message::OnBehalf { .. }
            | Message::Status { .. }
            | Message::Traced { .. }
            | Message::Abandon { .. }
            | Message::ChannelJoin { .. }
            | Message::AcquireBy { .. }
            | Message::Stats => true,
            Message::Welcome { .. }
            | Message::Pong { .. }
            | Message::Allocated { .. }
            | Message::Done
            | Message::Data { .. }
            | Message::Granted { .. }
            | Message::Error { .. }
            | Message::Moved { .. }
            | Message::Attached { .. }
            | Message::Mapped { .. }
            | Message::Figures { .. }
            | Message::Reserved { .. }
            | Message::ChannelGranted { .. } => false,
        }
    }

    /// A short name for logs ("hello", "read", ...).
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Ping { .. } => "ping",
            Message::Alloc { .. } => "alloc",
            Message::Free { .. } => "free",
            Message::Write { .. } => "write",
            Message::Read { .. } => "read",
            Message::Acquire { .. } => "acquire",
            Message::Release { .. } => "release",
            Message::Migrate { .. } => "migrate",
            Message::Invalidate { .. } => "invalidate",
            Message::Welcome { .. } => "welcome",
            Message::Pong { .. } => "pong",
            Message::Allocated { .. } => "allocated",
            Message::Done => "done",
            Message::Data { .. } => "data",
            Message::Granted { .. } => "granted",
            Message::Error { .. } => "error",
            Message::MigrateTo { .. } => "migrateto",
            Message::Moved { .. } => "moved",
            Message::Unforward { .. } => "unforward",
            Message::Attach => "attach",
            Message::Attached { .. } => "attached",
            Message::AllocWith { .. } => "allocwith",
            Message::AcquireMapped { .. } => "acquiremapped",
            Message::Mapped { .. } => "mapped",
            Message::Prefetch { .. } => "prefetch",
            Message::Stats => "stats",
            Message::Figures { .. } => "figures",
            Message::WriteBack { .. } => "writeback",
            Message::Reserve { .. } => "reserve",
            Message::Reserved { .. } => "reserved",
            Message::Unreserve { .. } => "unreserve",
            Message::ReservationLeft { .. } => "reservationleft",
            Message::Standby { .. } => "standby",
            Message::Replicate { .. } => "replicate",
            Message::Failover { .. } => "failover",
            Message::OnBehalf { .. } => "onbehalf",
            Message::Status { .. } => "status",
            Message::Traced { .. } => "traced",
            Message::Abandon { .. } => "abandon",
            Message::ChannelJoin { .. } => "channeljoin",
            Message::AcquireBy { .. } => "acquireby",
            Message::ChannelGranted { .. } => "channelgranted",
        }
    }
}

#[cfg(test)]
#[path = "message_tests.rs"]
mod tests;
