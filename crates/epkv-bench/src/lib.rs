//! Benchmarks for epkv components, each run side by side with its peers in the same
//! process and the same run, because the machines are shared and noisy: a ratio measured
//! together means more than an absolute number.
//!
//! This crate is **not** a test suite (nothing here asserts a timing) and is never a
//! dependency of a shipped crate. It holds the shared harness ([`harness`]: argument
//! parsing, timed multi-thread loops, JSON and markdown reports), a spin-then-park
//! [`baton::Baton`] for "notify the requester" round trips, and naive peers ([`naive`]) that
//! model the designs the seeds call slow. The benchmarks themselves live in `benches/`;
//! the load generators `epkv-fight` ([`fight`]) and `epkv-pipeload` ([`pipeload`],
//! pipelined GET/SET over plain TCP or TLS) are binaries driven by xtask.
//!
//! Invariants: every peer in a benchmark is driven by the same loop, the same deadline
//! generation and the same notification primitive; only the component under test differs.
//!
//! Depends on: anything in the workspace (it is a leaf); nothing depends on it.
//!
//! ```
//! use epkv_bench::harness::{Report, Row};
//! let mut report = Report::new("example");
//! report.push(Row::new("Noop", &[("threads", 1)], "epkv", 2_000_000.0));
//! report.push(Row::new("Noop", &[("threads", 1)], "peer", 1_000_000.0));
//! let md = report.markdown("epkv");
//! assert!(md.contains("2.00x"));
//! ```

pub mod baton;
pub mod fight;
pub mod floor;
pub mod harness;
pub mod naive;
pub mod pipeload;
