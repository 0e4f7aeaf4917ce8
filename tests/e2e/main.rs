//! End-to-end tests: a real `epkv-server` process (epkv-frontend + epkv-engine, wired as
//! the binary wires them) driven over TCP with `epkv-client`.
//!
//! Run with `cargo build -p epkv-server && cargo test -p epkv-e2e`. Set `EPKV_E2E_ADDR`
//! to run against a server that is already running; see `harness.rs`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a test failure"
)]

mod harness;

mod auth_storm;
mod bucket_capabilities;
mod cluster;
mod collections;
mod commands;
mod couchbase;
mod dcp;
mod durability;
mod etcd_cluster;
mod eviction;
mod expiry;
mod http_flood;
mod malformed;
mod meta;
mod metrics;
mod mgmt;
mod notifications;
mod persistence;
mod pipelining;
mod process;
mod range_scan;
mod rebalance;
mod restart;
mod scram;
mod snappy;
mod subdoc;
mod tls;
mod vbuckets;
