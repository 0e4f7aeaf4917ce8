//! Task executor for epkv background work, and the [`Clock`] every component reads time from.
//!
//! At this stage the crate provides the clock abstraction ([`Clock`], [`SystemClock`],
//! [`ManualClock`]); the task executor itself arrives with the Executor issue.
//!
//! Depends on no workspace crate and must never depend on one.
//!
//! ```
//! use epkv_executor::{Clock, ManualClock};
//! use std::time::Duration;
//! let clock = ManualClock::new(Duration::from_secs(1_000_000));
//! clock.advance(Duration::from_secs(5));
//! assert_eq!(clock.unix_time(), Duration::from_secs(1_000_005));
//! ```
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

mod clock;

pub use clock::{Clock, ManualClock, OffsetClock, SystemClock};
