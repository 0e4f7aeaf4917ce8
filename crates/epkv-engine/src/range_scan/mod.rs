//! Range scans (KV-Engine's `range_scans/`): RANGE_SCAN_CREATE fixes the keys a scan
//! returns, RANGE_SCAN_CONTINUE returns them (or their documents) a batch at a time,
//! RANGE_SCAN_CANCEL closes a scan, and a scan left idle expires.
//!
//! **The snapshot is of keys.** KV-Engine opens a snapshot of the vBucket's disk index;
//! epkv's index lives in memory, so a create copies the keys of the collection in the
//! range (or the sample) into a [`KeyList`](crate::scan_registry::KeyList): sorted, packed, four bytes of overhead per
//! key. Keys written after the create are not returned, however the scan goes on. Under
//! full eviction the keys on disk only are read on a Reader task first (the create
//! answers `Pending` until then). A keys-only scan returns exactly the snapshot. A
//! documents scan reads each document when it returns it: the version current then (not
//! the one of the create: the difference from KV-Engine, whose disk snapshot keeps old
//! versions), and a document deleted or expired since the create is skipped.
//!
//! **Evicted values are read from disk without being made resident.** A continue that
//! meets a document whose value is not in memory (or, under full eviction, a key not in
//! memory) answers WouldBlock, and a Reader task reads the next documents the scan
//! needs (at most [`LOAD_ITEMS`](crate::LOAD_ITEMS) documents or [`LOAD_BYTES`](crate::LOAD_BYTES) of values) into the scan
//! itself; the continue, run again, returns them from there. The hash table is not
//! touched, so a scan does not push the working set out of memory.
//!
//! **Limits** (the engine refuses beyond them with TooBusy, 0x85 Ebusy):
//! [`BucketConfig::range_scan_max_key_bytes`](crate::BucketConfig) per scan, and
//! `range_scan_max_per_owner` scans and `range_scan_max_owner_key_bytes` of keys per
//! owner (a connection; its scans close with it). One continue returns at most
//! [`CONTINUE_MAX_BYTES`](crate::CONTINUE_MAX_BYTES) whatever the client's limits. A scan not used for
//! `range_scan_idle_timeout` (60 s by default) is closed by the reaper task; a continue
//! then answers KeyNotFound, as for any unknown scan.
//!
//! **Locking.** The registry's map and the owners' usage are leaf mutexes. A scan's state
//! mutex is taken with neither held, and held by a continue for its whole run (a second
//! continue of the same scan meanwhile answers TooBusy), across the vBucket's state lock
//! and one stripe lock at a time, as an operation takes them. A scan's last use is a leaf
//! mutex of its own, so the reaper reads it with the registry held and no scan state.
//! Callbacks run with no lock held.
//!
//! Level: an operation on the [`crate::Bucket`] (level 7); the registry of scans is the
//! leaf [`crate::scan_registry`].

mod continue_scan;
mod create;
