//! The concurrent in-memory index of epkv items: KV-Engine's `HashTable` and
//! `StoredValue`.
//!
//! A [`HashTable`] maps a key to up to two [`StoredValue`]s side by side: a *committed*
//! version and a *prepared* one (a SyncWrite in flight, or a completed prepare kept for a
//! while). The engine keeps one table per vBucket. Each item carries key, value (shared
//! [`bytes::Bytes`], absent once evicted), [`ItemMeta`] (CAS, revision seqno, by-seqno,
//! flags, expiry, lock expiry, datatype), a [`CommittedState`] and deleted / dirty /
//! resident bits; beside it, in its slot, the table keeps its 8-bit probabilistic MFU
//! counter ([`Entry::mfu`], [`VisitedItem::mfu`]).
//!
//! This crate is *not* the bucket: it knows nothing of vBucket states, seqno or CAS
//! assignment, durability levels, persistence or the wire format. Callers decide what a
//! version means; the table keeps versions, statistics and memory accounting consistent.
//!
//! # Key types
//! - [`HashTable`]: the lookups [`HashTable::find_for_read`] (committed only, bumps MFU
//!   unless told not to; a maybe-visible prepare is returned so the caller refuses the
//!   read), [`HashTable::find_for_write`] (in-flight prepare, else committed) and
//!   [`HashTable::with_entry`] / [`HashTable::find_for_update`] (both versions, for
//!   check-and-modify); [`HashTable::insert`], [`HashTable::replace`],
//!   [`HashTable::remove`]; the pausable visitor [`HashTable::visit`] with
//!   [`Position`] / [`Visit`] / [`VisitedItem`]; [`HashTable::stats`] → [`TableStats`].
//! - [`Entry`]: one key's committed and prepared versions under the stripe lock:
//!   insert, remove, commit or abort a prepare, mark clean, evict the value, bump MFU.
//! - [`StoredValue`] / [`ItemMeta`] / [`CommittedState`]: an item version.
//! - [`MemoryTracker`]: bytes charged by items, shared by all tables of a bucket, with a
//!   limit it never lets the count exceed.
//!
//! # Locking
//! - A table is an array of stripes; a key's hash picks its stripe. Every read or change
//!   of an item, including an MFU bump, happens under its stripe's `parking_lot::Mutex`.
//!   The stripe holds two slot tables (committed, prepared) of pointers to boxed
//!   items, its MFU histogram, and its counters (atomics written only under the lock,
//!   read without it by [`HashTable::len`] and [`HashTable::stats`]).
//! - No method holds more than one stripe lock at a time, so the table imposes no lock
//!   order of its own. Callers may take their own locks *inside* a `with_entry` or
//!   visitor closure (the engine takes its per-vBucket seqno lock there), never call back
//!   into the same table from inside one (that would self-deadlock on the stripe).
//! - Resizing is per stripe and happens under that stripe's lock, inside the call that
//!   made the stripe too full (growth) or, after removals left it under a quarter full,
//!   at the end of the call (shrink). Nothing ever locks the whole table.
//! - The visitor holds one stripe lock while it walks that stripe and none between
//!   stripes or across a pause; a [`Position`] remembers the stripe's resize count so a
//!   resumed visit notices a resize.
//!
//! # Invariants
//! - A key has at most one committed and at most one prepared version.
//! - The per-stripe counters (items, deleted, prepared, non-resident, dirty, bytes) and
//!   MFU histogram always equal what a full scan of the stripe would count, and the
//!   tracker's total equals the sum of [`StoredValue::footprint`] over all items of all
//!   tables sharing it, once all calls have returned. Every change of an item goes
//!   through one of this crate's mutators, which subtract the item's properties before
//!   and add them after (KV-Engine's prologue/epilogue).
//! - A change refused by the tracker (or with a wrong key or state) changes nothing.
//!
//! # Dependencies
//! Depends on `epkv-types` (for `Cas`, `Seqno`, `Datatype`) and on `bytes`,
//! `foldhash` and `parking_lot`. It must never depend on the engine, the engine API, the
//! protocol or the front end.
//!
//! # Example
//! ```
//! use epkv_hashtable::{CommittedState, HashTable, ItemMeta, StoredValue, TrackReference,
//!                      WantsDeleted};
//! # fn main() -> Result<(), epkv_hashtable::Error> {
//! let table = HashTable::unlimited(16)?;
//! table.insert(StoredValue::new(b"k", b"v1", ItemMeta::default())?)?;
//! // A SyncWrite: the prepare sits beside the committed version, invisible to readers.
//! let prepare = StoredValue::new(b"k", b"v2", ItemMeta::default())?
//!     .with_state(CommittedState::Pending);
//! table.insert(prepare)?;
//! let read = |t: &HashTable| {
//!     t.find_for_read(b"k", TrackReference::Yes, WantsDeleted::No, |sv| sv.value().to_vec())
//! };
//! assert_eq!(read(&table), Some(b"v1".to_vec()));
//! assert_eq!(table.find_for_write(b"k", |sv| sv.value().to_vec()), Some(b"v2".to_vec()));
//! // Commit it: the prepare becomes the committed version.
//! table.with_entry(b"k", |e| e.commit_prepared(ItemMeta::default()))?;
//! assert_eq!(read(&table), Some(b"v2".to_vec()));
//! let stats = table.stats();
//! assert_eq!((stats.items, stats.prepared), (1, 0));
//! # Ok(())
//! # }
//! ```
#![deny(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

mod error;
mod hash_table;
mod memory;
pub mod mfu;
mod prefetch;
mod slot_table;
mod stats;
mod stored_value;
mod visitor;

pub use error::{Error, Result};
pub use hash_table::{Entry, HashTable, TrackReference, WantsDeleted};
pub use memory::MemoryTracker;
pub use stats::{TableStats, mfu_percentile};
pub use stored_value::{CommittedState, ItemMeta, StoredValue};
pub use visitor::{Position, Visit, VisitedItem};
