//! The statistics family: STAT and its groups. `timings` is the front end's own (per-opcode
//! latency histograms); the default group adds the front end's counters to the bucket's;
//! `dcp` is the front end's DCP connections on the bucket; any other group is the
//! bucket's. Every group needs SimpleStats (the opcode table's check); `timings`, which
//! covers the whole node, also needs Stats.

use crate::dispatch::table::Needs;
use crate::dispatch::{Call, Flow, unexpected};
use crate::frontend::Shared;
use crate::response::{ReplyTo, put_error_text, put_status, put_success};
use crate::session::Session;
use crate::timings;
use bytes::BytesMut;
use epkv_auth::Privilege;
use epkv_engine_api::EngineStatus;
use epkv_protocol::{Command, Status};
use epkv_types::{Cas, Datatype};

/// The groups that describe the node rather than the selected bucket, which need the
/// Stats privilege besides the row's SimpleStats (KV-Engine's privileged groups): `timings`
/// merges every bucket's request latencies. The other groups are the bucket's own
/// (SimpleStats, which `data_monitoring[b]` grants).
const NODE_GROUPS: &[&str] = &["timings"];

/// STAT: the group the key names (the default group for an empty key).
pub(crate) fn stat(s: &mut Session, c: Call<'_>, cmd: Command<'_>) -> Flow {
    match cmd {
        Command::Stat { group } => s.stats(c.shared, c.out, c.to, group),
        _ => unexpected(c.out, c.to),
    }
    Flow::Continue
}

impl Session {
    /// STAT: one reply per stat, then an empty-key terminator; on error, only the error.
    /// `timings` is the front end's own; the other groups need a bucket.
    fn stats(&self, shared: &Shared, out: &mut BytesMut, to: ReplyTo, group: &[u8]) {
        let Ok(group) = std::str::from_utf8(group) else {
            put_error_text(out, to, Status::Einval);
            return;
        };
        if NODE_GROUPS.contains(&group)
            && let Err(missing) = self.access.check(Needs::One(Privilege::Stats))
        {
            return self.deny(out, to, missing);
        }
        let engine = self.bucket.as_ref().map(|b| &*b.engine);
        if group != "timings" && engine.is_none() {
            self.fail_wire(out, to, Status::NoBucket, &[]);
            return;
        }
        let mark = out.len();
        let mut sink = |k: &str, v: &str| {
            put_success(
                out,
                to,
                Cas::ANY,
                Datatype::RAW,
                &[],
                k.as_bytes(),
                v.as_bytes(),
            );
        };
        let result = match (group, engine) {
            ("timings", _) => {
                timings::emit(&shared.timings, &mut sink);
                Ok(())
            }
            ("", Some(engine)) => {
                default_stats(shared, &mut sink);
                engine.stats("", &mut sink)
            }
            ("dcp", Some(_)) => {
                if let Some(b) = &self.bucket {
                    shared.dcp.emit(&b.name, &mut sink);
                }
                Ok(())
            }
            (other, Some(engine)) => engine.stats(other, &mut sink),
            (_, None) => Err(EngineStatus::Internal),
        };
        match result {
            Ok(()) => put_status(out, to, Status::Success, &[]),
            Err(e) => {
                out.truncate(mark);
                self.fail(shared, out, to, e, &[]);
            }
        }
    }
}

/// The front end's part of the default STAT group.
fn default_stats(shared: &Shared, sink: &mut dyn FnMut(&str, &str)) {
    let clock = &shared.config.clock;
    let uptime = clock
        .now()
        .saturating_duration_since(shared.started)
        .as_secs();
    sink("pid", &std::process::id().to_string());
    sink("uptime", &uptime.to_string());
    sink("time", &clock.unix_time().as_secs().to_string());
    sink("version", &shared.config.version);
    sink("curr_connections", &shared.conns.current().to_string());
    sink(
        "total_connections",
        &shared
            .conns
            .total
            .load(std::sync::atomic::Ordering::Relaxed)
            .to_string(),
    );
    sink(
        "rejected_conns",
        &shared
            .conns
            .rejected
            .load(std::sync::atomic::Ordering::Relaxed)
            .to_string(),
    );
    sink(
        "max_connections",
        &shared.config.max_connections.to_string(),
    );
    let conn_n =
        |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed).to_string();
    sink("total_tls_connections", &conn_n(&shared.conns.tls_total));
    sink(
        "tls_handshake_failures",
        &conn_n(&shared.conns.tls_failures),
    );
    if let Some(tls) = &shared.tls {
        sink("tls_cert_loads", &tls.generation().to_string());
        sink("tls_cert_load_failures", &tls.failures().to_string());
    }
    let auth = &shared.auth.stats;
    let n =
        |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed).to_string();
    sink("auth_cmds", &n(&auth.attempts));
    sink("auth_errors", &n(&auth.failures));
    sink("auth_throttled", &n(&auth.throttled));
    sink("auth_throttle_closes", &n(&auth.closes));
    sink("auth_busy", &n(&auth.busy));
    sink("threads", &shared.config.threads.to_string());
}
