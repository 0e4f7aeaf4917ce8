//! The concurrent in-memory index of epkv items.
//!
//! A [`HashTable`] maps keys to [`StoredValue`]s (key, value, and [`ItemMeta`]: CAS,
//! revision seqno, by-seqno, flags, expiry, datatype, GET_LOCKED state). The engine keeps
//! one table per vBucket, as KV-Engine does. This crate is the first version of the
//! index: it is not yet the production table of the Hash table issue (no prepared/committed
//! pairs, no MFU counters, no eviction, no pausable visitors), and it knows nothing of
//! vBucket states, seqno assignment, durability or the wire format.
//!
//! # Key types
//! - [`HashTable`]: lock-striped map; [`HashTable::with_entry`] runs a closure on one
//!   key's [`Entry`] under that key's stripe lock, which is how the engine does
//!   check-and-modify atomically; [`HashTable::retain`] / [`HashTable::for_each`] visit
//!   every item one stripe at a time.
//! - [`StoredValue`] / [`ItemMeta`]: an item; key and value are immutable and share one
//!   `Bytes` buffer (one allocation per item), the metadata is plain data that can be
//!   changed in place.
//! - [`MemoryTracker`]: bytes charged by items, shared by all tables of a bucket, with a
//!   limit it never lets the count exceed.
//!
//! # Invariants and locking
//! - Every read or change of an item happens under its stripe's `parking_lot::Mutex`.
//!   No method holds more than one stripe lock at a time, so the table imposes no lock
//!   order of its own; callers may take their own locks *inside* a `with_entry` or
//!   `retain` closure (the engine takes its per-vBucket seqno lock there), never the
//!   other way round.
//! - A table's item count and charged bytes, and the tracker's total, always equal the
//!   sum over its items of 1 and [`StoredValue::footprint`] once all calls have returned:
//!   footprints change only through [`Entry::insert`] and removals, which adjust the
//!   counters under the stripe lock.
//! - A growth refused by the tracker changes nothing.
//!
//! # Dependencies
//! Depends on `epkv-types` (for `Cas`, `Seqno`, `Datatype`) and on `bytes`, `hashbrown`,
//! `foldhash` and `parking_lot`. It must never depend on the engine, the engine API, the
//! protocol or the front end.
//!
//! # Example
//! ```
//! use epkv_hashtable::{HashTable, ItemMeta, StoredValue};
//! # fn main() -> Result<(), epkv_hashtable::Error> {
//! let table = HashTable::unlimited(16)?;
//! let item = StoredValue::new(b"k", b"v", ItemMeta::default())?;
//! table.insert(item)?;
//! // Atomic check-and-modify of one key: bump the flags only if the value is "v".
//! let changed = table.with_entry(b"k", |entry| {
//!     if entry.get().is_some_and(|sv| sv.value() == b"v") {
//!         if let Some(meta) = entry.meta_mut() {
//!             meta.flags += 1;
//!             return true;
//!         }
//!     }
//!     false
//! });
//! assert!(changed);
//! assert_eq!(table.get(b"k").map(|sv| sv.meta().flags), Some(1));
//! assert_eq!(table.len(), 1);
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

mod error;
mod hash_table;
mod memory;
mod stored_value;

pub use error::{Error, Result};
pub use hash_table::{Entry, HashTable};
pub use memory::MemoryTracker;
pub use stored_value::{ItemMeta, StoredValue};
