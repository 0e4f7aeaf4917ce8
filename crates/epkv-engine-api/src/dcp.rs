//! DCP (Database Change Protocol) streams, as the engine gives them to the front end.
//!
//! A DCP producer connection asks the engine for one [`DcpStream`] per vBucket
//! ([`crate::Engine::dcp_stream`]) and polls it for [`DcpEvent`]s, which the front end
//! encodes as DCP messages. The engine decides where the events come from (its in-memory
//! log of recent changes, or a backfill from disk) and groups them in snapshots: every
//! event follows a [`DcpEvent::SnapshotMarker`] whose range holds its seqno.

use bytes::Bytes;
use std::task::{Context, Poll};

/// Snapshot marker flag: the snapshot comes from memory.
pub const SNAPSHOT_MEMORY: u32 = 0x01;
/// Snapshot marker flag: the snapshot comes from disk (a backfill).
pub const SNAPSHOT_DISK: u32 = 0x02;
/// Snapshot marker flag: the snapshot ends at a checkpoint boundary.
pub const SNAPSHOT_CHECKPOINT: u32 = 0x04;

/// Why a stream ended ([`DcpEvent::End`]); the values are DCP_STREAM_END's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DcpEndReason {
    /// The stream reached its end seqno.
    Ok,
    /// The client closed it (CLOSE_STREAM).
    Closed,
    /// The vBucket changed state (no longer active, or deleted).
    StateChanged,
    /// The stream fell behind what the server can still serve (a memory-only bucket
    /// whose recent-change log moved past it).
    Slow,
    /// Reading the vBucket from disk failed.
    BackfillFailed,
    /// Every collection (or the scope) the stream's filter named was dropped.
    FilterEmpty,
}

impl DcpEndReason {
    /// The DCP_STREAM_END flags value.
    #[must_use]
    pub fn as_u32(self) -> u32 {
        match self {
            Self::Ok => 0,
            Self::Closed => 1,
            Self::StateChanged => 2,
            Self::Slow => 4,
            Self::BackfillFailed => 5,
            Self::FilterEmpty => 7,
        }
    }
}

/// One document carried by a stream (a mutation, deletion, expiration or prepare).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcpDocument {
    /// The key with its collection, as the engine stores it (`epkv_types::doc_key`).
    pub key: Vec<u8>,
    /// The value (empty for most deletions; a deletion may keep system attributes).
    pub value: Bytes,
    /// The seqno of this change.
    pub seqno: u64,
    /// The revision seqno.
    pub rev_seqno: u64,
    /// The CAS.
    pub cas: u64,
    /// Client flags.
    pub flags: u32,
    /// Absolute expiry in seconds (0 = never); for a deletion, when it was deleted, as
    /// far as the engine knows (0 if not).
    pub expiry: u32,
    /// The datatype bits (JSON, Snappy, XATTR).
    pub datatype: u8,
}

/// One step of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DcpEvent {
    /// The events that follow, up to the next marker, have seqnos in `start..=end`.
    SnapshotMarker {
        /// First seqno of the snapshot.
        start: u64,
        /// Last seqno of the snapshot.
        end: u64,
        /// [`SNAPSHOT_MEMORY`] or [`SNAPSHOT_DISK`], with [`SNAPSHOT_CHECKPOINT`].
        flags: u32,
        /// The last seqno in the snapshot readers can see (leaving out prepares and
        /// aborts).
        max_visible: u64,
        /// For a disk snapshot, the high completed seqno of the data it comes from.
        high_completed: Option<u64>,
    },
    /// A document written.
    Mutation(DcpDocument),
    /// A document deleted.
    Deletion(DcpDocument),
    /// A document deleted because it expired (a front end whose client did not enable
    /// the expiry opcode sends it as a deletion).
    Expiration(DcpDocument),
    /// A scope or collection created or dropped, at `seqno` (only to clients that
    /// negotiated collections).
    System {
        /// The seqno the vBucket gave the change.
        seqno: u64,
        /// What changed.
        event: CollectionEvent,
    },
    /// A SyncWrite's prepare (only on streams that asked for sync replication).
    Prepare {
        /// The prepared document (deleted when the SyncWrite deletes).
        doc: DcpDocument,
        /// The write deletes the document.
        deleted: bool,
        /// The durability level (1 Majority, 2 MajorityAndPersistOnMaster,
        /// 3 PersistToMajority).
        level: u8,
    },
    /// A prepare committed (only on streams that asked for sync replication; the others
    /// get a [`DcpEvent::Mutation`] or [`DcpEvent::Deletion`] instead).
    Commit {
        /// The key with its collection.
        key: Vec<u8>,
        /// The prepare's seqno.
        prepared_seqno: u64,
        /// The commit's seqno.
        commit_seqno: u64,
    },
    /// A prepare aborted (only on streams that asked for sync replication).
    Abort {
        /// The key with its collection.
        key: Vec<u8>,
        /// The prepare's seqno.
        prepared_seqno: u64,
        /// The abort's seqno.
        abort_seqno: u64,
    },
    /// The stream is over; nothing follows.
    End(DcpEndReason),
}

impl DcpEvent {
    /// The seqno the event carries, if it carries one.
    #[must_use]
    pub fn seqno(&self) -> Option<u64> {
        match self {
            Self::Mutation(d)
            | Self::Deletion(d)
            | Self::Expiration(d)
            | Self::Prepare { doc: d, .. } => Some(d.seqno),
            Self::System { seqno, .. } => Some(*seqno),
            Self::Commit { commit_seqno, .. } => Some(*commit_seqno),
            Self::Abort { abort_seqno, .. } => Some(*abort_seqno),
            Self::SnapshotMarker { .. } | Self::End(_) => None,
        }
    }

    /// Roughly the bytes the event takes on the wire (for budgets).
    #[must_use]
    pub fn wire_size(&self) -> usize {
        const HEADER: usize = 24;
        match self {
            Self::Mutation(d) => HEADER + 31 + d.key.len() + d.value.len(),
            Self::Deletion(d) | Self::Expiration(d) => HEADER + 21 + d.key.len() + d.value.len(),
            Self::System { event, .. } => HEADER + 13 + event.name.len() + 20,
            Self::Prepare { doc, .. } => HEADER + 31 + doc.key.len() + doc.value.len(),
            Self::Commit { key, .. } | Self::Abort { key, .. } => HEADER + 16 + key.len(),
            Self::SnapshotMarker { .. } => HEADER + 20,
            Self::End(_) => HEADER + 4,
        }
    }
}

/// What a [`CollectionEvent`] records; the values are DCP_SYSTEM_EVENT's event ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectionEventKind {
    /// A collection was created.
    CreateCollection,
    /// A collection was dropped.
    DropCollection,
    /// A scope was created.
    CreateScope,
    /// A scope was dropped.
    DropScope,
}

impl CollectionEventKind {
    /// The DCP_SYSTEM_EVENT event id.
    #[must_use]
    pub fn id(self) -> u32 {
        match self {
            Self::CreateCollection => 0,
            Self::DropCollection => 1,
            Self::CreateScope => 3,
            Self::DropScope => 4,
        }
    }

    /// The kind of event id `id`, if it is one of these.
    #[must_use]
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::CreateCollection,
            1 => Self::DropCollection,
            3 => Self::CreateScope,
            4 => Self::DropScope,
            _ => return None,
        })
    }
}

/// A scope or collection change, as a vBucket records it and DCP_SYSTEM_EVENT carries it
/// (kv_engine's `docs/dcp/documentation/commands/system_event.md`, versions 0 and 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectionEvent {
    /// What changed.
    pub kind: CollectionEventKind,
    /// The manifest uid the vBucket has completely applied with this event (the new
    /// manifest's on the last event of a change, the previous one's on those before).
    pub manifest_uid: u64,
    /// The scope (of the collection, for collection events).
    pub scope_id: u32,
    /// The collection (0 for scope events).
    pub collection_id: u32,
    /// The name created (empty for drops).
    pub name: String,
    /// A created collection's maxTTL in seconds, if it has one.
    pub max_ttl: Option<u32>,
}

impl CollectionEvent {
    /// The version of the value [`Self::encode_value`] writes: 1 for a collection
    /// created with a maxTTL, else 0.
    #[must_use]
    pub fn version(&self) -> u8 {
        u8::from(self.kind == CollectionEventKind::CreateCollection && self.max_ttl.is_some())
    }

    /// Appends the event's DCP value (network byte order): manifest uid, scope id, then
    /// for collection events the collection id and, in version 1, the maxTTL.
    pub fn encode_value(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.manifest_uid.to_be_bytes());
        out.extend_from_slice(&self.scope_id.to_be_bytes());
        if matches!(
            self.kind,
            CollectionEventKind::CreateCollection | CollectionEventKind::DropCollection
        ) {
            out.extend_from_slice(&self.collection_id.to_be_bytes());
        }
        if self.version() == 1 {
            out.extend_from_slice(&self.max_ttl.unwrap_or(0).to_be_bytes());
        }
    }

    /// Reads a DCP_SYSTEM_EVENT's event id, version, key and value back.
    ///
    /// # Errors
    /// A description when the event id is not a scope or collection event, or the value
    /// does not have the length its version gives.
    pub fn decode(id: u32, version: u8, key: &[u8], value: &[u8]) -> Result<Self, String> {
        let kind = CollectionEventKind::from_id(id).ok_or(format!("unknown system event {id}"))?;
        let collection = matches!(
            kind,
            CollectionEventKind::CreateCollection | CollectionEventKind::DropCollection
        );
        let want = match (collection, version) {
            (false, 0) => 12,
            (true, 0) => 16,
            (true, 1) if kind == CollectionEventKind::CreateCollection => 20,
            _ => return Err(format!("system event {id}: unknown version {version}")),
        };
        if value.len() != want {
            return Err(format!(
                "system event {id} version {version}: {} value bytes, not {want}",
                value.len()
            ));
        }
        let u32_at = |i: usize| {
            let mut b = [0; 4];
            b.copy_from_slice(&value[i..i + 4]);
            u32::from_be_bytes(b)
        };
        let mut uid = [0; 8];
        uid.copy_from_slice(&value[..8]);
        let name = std::str::from_utf8(key)
            .map_err(|_| format!("system event {id}: the name is not UTF-8"))?
            .to_owned();
        Ok(Self {
            kind,
            manifest_uid: u64::from_be_bytes(uid),
            scope_id: u32_at(8),
            collection_id: if collection { u32_at(12) } else { 0 },
            name,
            max_ttl: (version == 1).then(|| u32_at(16)).filter(|t| *t > 0),
        })
    }
}

/// What a STREAM_REQ asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DcpStreamRequest {
    /// The last seqno the client has (0: from the beginning).
    pub start_seqno: u64,
    /// The last seqno to send (`u64::MAX`: never end).
    pub end_seqno: u64,
    /// The failover branch the client's data comes from (0 with `start_seqno` 0).
    pub vbucket_uuid: u64,
    /// The snapshot the client was in when it stopped.
    pub snap_start_seqno: u64,
    /// The end of that snapshot.
    pub snap_end_seqno: u64,
    /// Send prepares, commits and aborts (DCP_CONTROL `enable_sync_replication`);
    /// otherwise committed changes only.
    pub sync_replication: bool,
    /// Only these collections (`None`: all of them, or the scope's).
    pub collections: Option<Vec<u32>>,
    /// Only the collections of this scope, including those created later.
    pub scope: Option<u32>,
}

/// Why a stream cannot start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DcpStreamError {
    /// The client's history diverged from this vBucket's: it must roll back to this seqno
    /// and ask again.
    Rollback(u64),
    /// Anything else (`NotMyVbucket`, `OutOfRange`, `NotSupported`, ...).
    Status(crate::EngineStatus),
}

impl From<crate::EngineStatus> for DcpStreamError {
    fn from(s: crate::EngineStatus) -> Self {
        Self::Status(s)
    }
}

/// One vBucket's stream. Dropping it closes it.
pub trait DcpStream: Send {
    /// Appends the events ready now to `out`, about `budget_bytes` of them (at least one
    /// when any is ready), and returns `Ready`; returns `Pending` with nothing appended
    /// when none is ready, after arranging for `cx`'s waker to be woken when one is.
    /// Once it has appended [`DcpEvent::End`] it appends nothing more.
    ///
    /// It may read from disk (a backfill) for a bounded time.
    fn poll_events(
        &mut self,
        cx: &mut Context<'_>,
        budget_bytes: usize,
        out: &mut Vec<DcpEvent>,
    ) -> Poll<()>;

    /// The vBucket's failover branch the stream follows (the newest uuid when it
    /// started).
    fn vbucket_uuid(&self) -> u64;

    /// The last seqno handed out so far (the start seqno before any).
    fn last_seqno(&self) -> u64;

    /// True while it reads from disk.
    fn backfilling(&self) -> bool;
}
