//! [`Session`]: a connection's protocol state, and the execution of one request.
//!
//! Everything here is synchronous: a request is decoded, validated, executed against the
//! engine and its reply appended to the output buffer before the next one is looked at,
//! so pipelined requests are answered in order.

use crate::frontend::Shared;
use crate::response::{ReplyTo, put_error_text, put_status, put_success};
use crate::status_map::engine_status_to_wire;
use crate::timings;
use bytes::BytesMut;
use epkv_engine_api::{
    ArithmeticRequest, DurabilityRequirements, EngineStatus, Expiry, Item, MutationInfo,
    RemoveRequest, StoreRequest,
};
use epkv_protocol::{Command, DurabilityRequirement, Feature, Request, Status};
use epkv_types::{Cas, Datatype, NUM_VBUCKETS, vbucket_for_key};

/// What the connection does after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Go on with the next request.
    Continue,
    /// Send the replies queued so far, then close (QUIT, QUITQ).
    Close,
}

/// Per-connection protocol state negotiated by HELLO.
#[derive(Debug, Default)]
pub(crate) struct Session {
    /// The client sent HELLO: it is a Couchbase-style client that routes by vBucket
    /// itself, so the header's vbid is used as is. Classic memcached clients never send
    /// HELLO and always send vbid 0; their key requests are routed to the key's vBucket.
    pub(crate) vbucket_aware: bool,
    /// Mutation replies carry 16 bytes of extras: vBucket UUID and seqno.
    pub(crate) mutation_seqno: bool,
    /// The JSON datatype bit is returned; without it, the bit is cleared in replies.
    pub(crate) json: bool,
    /// The agent name the client gave in HELLO, for logs.
    pub(crate) agent: Option<String>,
    /// A TCP_NODELAY change HELLO asked for, applied by the connection after the batch.
    pub(crate) nodelay_change: Option<bool>,
}

fn durability(d: Option<DurabilityRequirement>) -> Option<DurabilityRequirements> {
    d.map(|d| DurabilityRequirements {
        level: d.level,
        timeout: d.timeout,
    })
}

impl Session {
    /// Executes one validated-framing request and appends its reply (if any) to `out`.
    pub(crate) fn execute(
        &mut self,
        shared: &Shared,
        req: &Request<'_>,
        out: &mut BytesMut,
    ) -> Flow {
        let to = ReplyTo {
            opcode: req.header.opcode,
            opaque: req.header.opaque,
        };
        let cmd = match Command::decode(req) {
            Ok(cmd) => cmd,
            Err(status) => {
                put_error_text(out, to, status);
                return Flow::Continue;
            }
        };
        let vbid = match cmd.document_key() {
            Some(key) if !self.vbucket_aware => vbucket_for_key(key, NUM_VBUCKETS),
            _ => req.header.vbucket,
        };
        let engine = &*shared.engine;
        match cmd {
            Command::Get {
                key,
                with_key,
                quiet,
            } => match engine.get(vbid, key) {
                Ok(item) => self.put_item(out, to, &item, with_key),
                Err(EngineStatus::KeyNotFound) if quiet => {}
                Err(e) => put_status(
                    out,
                    to,
                    engine_status_to_wire(e),
                    if with_key { key } else { &[] },
                ),
            },
            Command::Store {
                op,
                key,
                value,
                flags,
                expiry,
                datatype,
                cas,
                durability: d,
                preserve_ttl,
                quiet,
            } => {
                // Borrowed from the read buffer: the engine copies key and value once,
                // into the item it stores.
                let result = engine.store(StoreRequest {
                    op,
                    vbid,
                    key,
                    value,
                    flags,
                    expiry: Expiry::from_wire(expiry),
                    preserve_ttl,
                    datatype,
                    cas,
                    durability: durability(d),
                });
                self.put_mutation(out, to, result, quiet);
            }
            Command::Delete {
                key,
                cas,
                durability: d,
                quiet,
            } => {
                let result = engine.remove(RemoveRequest {
                    vbid,
                    key,
                    cas,
                    durability: durability(d),
                });
                // Classic memcached clients get CAS 0 on a DELETE, as memcached answers
                // (memcapable checks it); Couchbase clients get the tombstone's CAS, as
                // kv_engine answers.
                let result = match result {
                    Ok(info) if !self.vbucket_aware => Ok(MutationInfo {
                        cas: Cas::ANY,
                        ..info
                    }),
                    other => other,
                };
                self.put_mutation(out, to, result, quiet);
            }
            Command::Arithmetic {
                op,
                key,
                delta,
                initial,
                expiry,
                durability: d,
                quiet,
                ..
            } => {
                let result = engine.arithmetic(ArithmeticRequest {
                    op,
                    vbid,
                    key,
                    delta,
                    initial,
                    expiry_raw: expiry,
                    cas: req.header.cas,
                    durability: durability(d),
                });
                match result {
                    Ok(_) if quiet => {}
                    Ok((value, info)) => {
                        let (extras, n) = self.mutation_extras(&info);
                        put_success(
                            out,
                            to,
                            info.cas,
                            Datatype::RAW,
                            &extras[..n],
                            &[],
                            &value.to_be_bytes(),
                        );
                    }
                    Err(e) => put_status(out, to, engine_status_to_wire(e), &[]),
                }
            }
            Command::Quit { quiet } => {
                if !quiet {
                    put_status(out, to, Status::Success, &[]);
                }
                return Flow::Close;
            }
            Command::Flush { quiet } => match engine.flush() {
                Ok(()) if quiet => {}
                Ok(()) => put_status(out, to, Status::Success, &[]),
                Err(e) => put_status(out, to, engine_status_to_wire(e), &[]),
            },
            Command::Noop | Command::Verbosity { .. } => put_status(out, to, Status::Success, &[]),
            Command::Version => {
                put_success(
                    out,
                    to,
                    Cas::ANY,
                    Datatype::RAW,
                    &[],
                    &[],
                    shared.config.version.as_bytes(),
                );
            }
            Command::Stat { group } => stats(shared, out, to, group),
            Command::Touch { key, expiry, .. } => match engine.touch(vbid, key, expiry) {
                Ok(info) => put_success(out, to, info.cas, Datatype::RAW, &[], &[], &[]),
                Err(e) => put_status(out, to, engine_status_to_wire(e), &[]),
            },
            Command::Gat {
                key, expiry, quiet, ..
            } => match engine.get_and_touch(vbid, key, expiry) {
                Ok(item) => self.put_item(out, to, &item, false),
                Err(EngineStatus::KeyNotFound) if quiet => {}
                Err(e) => put_status(out, to, engine_status_to_wire(e), &[]),
            },
            Command::Hello { agent, features } => {
                self.vbucket_aware = true;
                self.mutation_seqno = false;
                self.json = false;
                let mut agreed: Vec<Feature> = Vec::with_capacity(features.len());
                for f in features.known() {
                    if !f.is_implemented() || agreed.contains(&f) {
                        continue;
                    }
                    match f {
                        Feature::TcpNoDelay => self.nodelay_change = Some(true),
                        Feature::TcpDelay => self.nodelay_change = Some(false),
                        Feature::MutationSeqno => self.mutation_seqno = true,
                        Feature::Json => self.json = true,
                        // AltRequestSupport and PreserveTtl are informational: magic
                        // 0x08 and the PreserveTtl frame are accepted either way.
                        _ => {}
                    }
                    agreed.push(f);
                }
                let value: Vec<u8> = agreed
                    .iter()
                    .flat_map(|f| f.as_u16().to_be_bytes())
                    .collect();
                let agent = String::from_utf8_lossy(agent).into_owned();
                tracing::debug!(
                    agent = %agent,
                    agreed = ?agreed.iter().map(|f| f.name()).collect::<Vec<_>>(),
                    "HELLO"
                );
                self.agent = Some(agent);
                put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &value);
            }
            Command::GetLocked {
                key,
                lock_timeout_secs,
            } => match engine.get_locked(vbid, key, lock_timeout_secs) {
                Ok(item) => self.put_item(out, to, &item, false),
                Err(e) => put_status(out, to, engine_status_to_wire(e), &[]),
            },
            Command::UnlockKey { key, cas } => match engine.unlock(vbid, key, cas) {
                Ok(()) => put_status(out, to, Status::Success, &[]),
                Err(e) => put_status(out, to, engine_status_to_wire(e), &[]),
            },
            Command::SetVbucket { state } => match engine.set_vbucket_state(vbid, state) {
                Ok(()) => put_status(out, to, Status::Success, &[]),
                Err(e) => put_status(out, to, engine_status_to_wire(e), &[]),
            },
            Command::GetVbucket => match engine.vbucket_state(vbid) {
                Some(state) => {
                    let value = u32::from(state as u8).to_be_bytes();
                    put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &value);
                }
                None => put_status(out, to, Status::NotMyVbucket, &[]),
            },
            Command::AdjustTimeofday { offset_secs } => {
                if shared.config.testing {
                    match engine.adjust_time(offset_secs) {
                        Ok(()) => put_status(out, to, Status::Success, &[]),
                        Err(e) => put_status(out, to, engine_status_to_wire(e), &[]),
                    }
                } else {
                    put_error_text(out, to, Status::NotSupported);
                }
            }
            // `Command` is non-exhaustive: a command the codec learns to decode before the
            // front end learns to execute it is unknown to this server.
            _ => put_error_text(out, to, Status::UnknownCommand),
        }
        Flow::Continue
    }

    /// The datatype bits this connection may see.
    fn datatype_out(&self, dt: Datatype) -> Datatype {
        if self.json {
            dt.intersect(Datatype::JSON)
        } else {
            Datatype::RAW
        }
    }

    fn mutation_extras(&self, info: &MutationInfo) -> ([u8; 16], usize) {
        let mut extras = [0u8; 16];
        if !self.mutation_seqno {
            return (extras, 0);
        }
        extras[..8].copy_from_slice(&info.vbucket_uuid.to_be_bytes());
        extras[8..].copy_from_slice(&info.seqno.0.to_be_bytes());
        (extras, 16)
    }

    fn put_item(&self, out: &mut BytesMut, to: ReplyTo, item: &Item, with_key: bool) {
        let key: &[u8] = if with_key { &item.key } else { &[] };
        put_success(
            out,
            to,
            item.cas,
            self.datatype_out(item.datatype),
            &item.flags.to_be_bytes(),
            key,
            &item.value,
        );
    }

    fn put_mutation(
        &self,
        out: &mut BytesMut,
        to: ReplyTo,
        result: Result<MutationInfo, EngineStatus>,
        quiet: bool,
    ) {
        match result {
            Ok(_) if quiet => {}
            Ok(info) => {
                let (extras, n) = self.mutation_extras(&info);
                put_success(out, to, info.cas, Datatype::RAW, &extras[..n], &[], &[]);
            }
            Err(e) => put_status(out, to, engine_status_to_wire(e), &[]),
        }
    }
}

/// STAT: one reply per stat, then an empty-key terminator; on error, only the error.
fn stats(shared: &Shared, out: &mut BytesMut, to: ReplyTo, group: &[u8]) {
    let Ok(group) = std::str::from_utf8(group) else {
        put_error_text(out, to, Status::Einval);
        return;
    };
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
    let result = match group {
        "" => {
            default_stats(shared, &mut sink);
            shared.engine.stats("", &mut sink)
        }
        "timings" => {
            timings::emit(&shared.timings, &mut sink);
            Ok(())
        }
        other => shared.engine.stats(other, &mut sink),
    };
    match result {
        Ok(()) => put_status(out, to, Status::Success, &[]),
        Err(e) => {
            out.truncate(mark);
            put_status(out, to, engine_status_to_wire(e), &[]);
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
    sink("threads", &shared.config.threads.to_string());
}
