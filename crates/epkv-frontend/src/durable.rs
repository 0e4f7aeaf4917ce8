//! Replies that wait for a write's durability: SyncWrites (answered once the engine commits
//! or aborts them) and durable TOUCHes (answered once their seqno is persisted), and the
//! bucket minimum durability level that turns writes into SyncWrites.
//!
//! A waiting reply is a [`PendingDurable`] the session holds until the connection takes
//! it ([`Session::take_pending`]); the connection executes nothing else meanwhile, so
//! replies stay in request order.

use crate::frontend::Shared;
use crate::response::{ReplyTo, put, put_success};
use crate::session::Session;
use crate::status_map::engine_status_to_wire;
use bytes::BytesMut;
use epkv_engine_api::{DurabilityRequirements, Engine, EngineStatus, MutationInfo};
use epkv_protocol::{DurabilityRequirement, Status};
use epkv_types::{Datatype, DurabilityLevel, Vbid};
use std::time::Duration;
use tokio::sync::oneshot;

/// How long a write at a persist durability level waits for its seqno to be persisted
/// when the client gave no timeout: KV-Engine's fixed default for SyncWrites.
pub(crate) const DEFAULT_DURABILITY_TIMEOUT: Duration = Duration::from_secs(30);

/// A write answered only once its durability is settled: a SyncWrite (any write with
/// durability requirements), once the engine commits it (or, when its timeout passed
/// first, aborts it: SyncWriteAmbiguous); or a durable TOUCH, once its seqno is
/// persisted (SyncWriteAmbiguous when `timeout` passes first). While one is pending the
/// connection executes nothing else, so replies stay in request order; the worker thread
/// is free (the engine completes `outcome` from its own threads, without a thread per
/// waiter).
pub(crate) struct PendingDurable {
    /// Completed with the outcome by the engine's callback.
    pub(crate) outcome: oneshot::Receiver<Result<(), EngineStatus>>,
    /// The connection's own timeout, for a durable TOUCH only: a SyncWrite's timeout is
    /// the engine's (one task per vBucket, not a timer per connection).
    pub(crate) timeout: Option<Duration>,
    to: ReplyTo,
    info: MutationInfo,
    /// What the success reply carries.
    body: DurableReply,
    quiet: bool,
}

/// What a deferred reply waits for ([`Session::defer_reply`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Wait {
    /// The engine's outcome of a SyncWrite (its timeout is the engine's).
    SyncWrite,
    /// The persistence of the write's seqno, within this timeout (a durable TOUCH).
    Persisted(Duration),
}

/// The success reply of a write waiting for persistence, besides its CAS.
#[derive(Clone, Debug)]
pub(crate) enum DurableReply {
    /// SET family, DELETE: the mutation extras (when negotiated), no value.
    Mutation,
    /// INCREMENT/DECREMENT: the mutation extras and the new value.
    Counter(u64),
    /// TOUCH: the CAS only, as its immediate reply.
    Touch,
    /// Sub-document mutations: the mutation extras and this value (possibly empty), with
    /// Success or (the document is deleted after it) SubdocSuccessDeleted.
    Body(Vec<u8>, Status),
}

/// The timeout of a write that must be persisted before it is acknowledged, or `None` for
/// a write acknowledged at once (no durability, or Majority: a single node is its own
/// majority and commits in memory).
pub(crate) fn persist_timeout(d: Option<DurabilityRequirement>) -> Option<Duration> {
    let d = d?;
    match d.level {
        DurabilityLevel::Majority => None,
        DurabilityLevel::MajorityAndPersistOnMaster | DurabilityLevel::PersistToMajority => {
            Some(d.timeout.unwrap_or(DEFAULT_DURABILITY_TIMEOUT))
        }
    }
}

/// A write's durability under a bucket minimum level: at least `min`, with the client's
/// timeout (or none, for the default).
pub(crate) fn with_min_level(
    d: Option<DurabilityRequirement>,
    min: DurabilityLevel,
) -> Option<DurabilityRequirement> {
    Some(match d {
        Some(d) if d.level as u8 >= min as u8 => d,
        Some(d) => DurabilityRequirement { level: min, ..d },
        None => DurabilityRequirement {
            level: min,
            timeout: None,
        },
    })
}

pub(crate) fn durability(d: Option<DurabilityRequirement>) -> Option<DurabilityRequirements> {
    d.map(|d| DurabilityRequirements {
        level: d.level,
        timeout: d.timeout,
    })
}

impl Session {
    /// Answers a durable write once its wait is over: success, or the engine's status
    /// (SyncWriteAmbiguous, 0xa3, when its timeout passed first: the write may still
    /// reach the disk, as KV-Engine answers a SyncWrite it aborted). Returns true when the
    /// connection must close because the client cannot understand the reply (no XERROR).
    pub(crate) fn complete_durable(
        &self,
        out: &mut BytesMut,
        p: PendingDurable,
        outcome: Result<(), EngineStatus>,
    ) -> bool {
        if let Err(e) = outcome {
            tracing::debug!(
                seqno = p.info.seqno.0,
                status = ?e,
                "durable write not completed"
            );
            self.fail_wire(out, p.to, engine_status_to_wire(e), &[]);
            return self.disconnect.get();
        }
        if p.quiet {
            return false;
        }
        let (extras, n) = self.mutation_extras(&p.info);
        match p.body {
            DurableReply::Counter(value) => put_success(
                out,
                p.to,
                p.info.cas,
                Datatype::RAW,
                &extras[..n],
                &[],
                &value.to_be_bytes(),
            ),
            DurableReply::Mutation => {
                put_success(out, p.to, p.info.cas, Datatype::RAW, &extras[..n], &[], &[]);
            }
            DurableReply::Touch => put_success(out, p.to, p.info.cas, Datatype::RAW, &[], &[], &[]),
            DurableReply::Body(body, status) => put(
                out,
                &p.to
                    .reply(status)
                    .with_cas(p.info.cas)
                    .with_extras(&extras[..n])
                    .with_value(&body),
            ),
        }
        false
    }

    /// Answers a mutation: at once, or (a SyncWrite) once the engine has completed it.
    #[expect(clippy::too_many_arguments, reason = "the parts of one mutation reply")]
    pub(crate) fn reply_mutation(
        &self,
        shared: &Shared,
        engine: &dyn Engine,
        out: &mut BytesMut,
        to: ReplyTo,
        vbid: Vbid,
        info: MutationInfo,
        body: DurableReply,
        sync_write: bool,
    ) {
        match sync_write {
            true => {
                let wait = Wait::SyncWrite;
                self.defer_reply(shared, engine, out, to, vbid, (info, body), wait, false);
            }
            false => {
                let (extras, n) = self.mutation_extras(&info);
                let (value, status) = match &body {
                    DurableReply::Body(v, status) => (v.as_slice(), *status),
                    _ => (&[][..], Status::Success),
                };
                put(
                    out,
                    &to.reply(status)
                        .with_cas(info.cas)
                        .with_extras(&extras[..n])
                        .with_value(value),
                );
            }
        }
    }

    /// Leaves a write's reply waiting for `wait` (see [`PendingDurable`]): the engine's
    /// outcome of a SyncWrite (its prepare got `info.seqno` in `vbid`), or the persistence
    /// of a durable TOUCH's seqno within its timeout. An outcome known already (Majority
    /// on a single node, usually) is answered now, without a pass of the connection's
    /// wait; a status the client cannot understand marks the session for disconnection.
    #[expect(clippy::too_many_arguments, reason = "the parts of one deferred reply")]
    pub(crate) fn defer_reply(
        &self,
        shared: &Shared,
        engine: &dyn Engine,
        out: &mut BytesMut,
        to: ReplyTo,
        vbid: Vbid,
        (info, body): (MutationInfo, DurableReply),
        wait: Wait,
        quiet: bool,
    ) {
        let (tx, rx) = oneshot::channel();
        // The connection may have gone; then nobody waits.
        let registered = match wait {
            Wait::SyncWrite => engine.when_sync_write_completed(
                vbid,
                info.seqno,
                Box::new(move |outcome| {
                    let _ = tx.send(outcome);
                }),
            ),
            Wait::Persisted(_) => engine.when_persisted(
                vbid,
                info.seqno,
                Box::new(move |_persisted| {
                    let _ = tx.send(Ok(()));
                }),
            ),
        };
        if let Err(e) = registered {
            return self.fail(shared, out, to, e, &[]);
        }
        let mut p = PendingDurable {
            outcome: rx,
            timeout: match wait {
                Wait::SyncWrite => None,
                Wait::Persisted(timeout) => Some(timeout),
            },
            to,
            info,
            body,
            quiet,
        };
        match p.outcome.try_recv() {
            Ok(outcome) => {
                self.complete_durable(out, p, outcome);
            }
            Err(_) => self.pending.set(Some(p)),
        }
    }

    /// Answers a SET-family or DELETE result: at once, or, for a SyncWrite (the request
    /// had durability requirements), once the engine has committed or aborted it.
    #[expect(clippy::too_many_arguments, reason = "the parts of one mutation reply")]
    pub(crate) fn finish_mutation(
        &self,
        shared: &Shared,
        engine: &dyn Engine,
        out: &mut BytesMut,
        to: ReplyTo,
        vbid: Vbid,
        result: Result<MutationInfo, EngineStatus>,
        sync_write: bool,
        quiet: bool,
    ) {
        match (result, sync_write) {
            (Ok(info), true) => {
                self.defer_reply(
                    shared,
                    engine,
                    out,
                    to,
                    vbid,
                    (info, DurableReply::Mutation),
                    Wait::SyncWrite,
                    quiet,
                );
            }
            (Ok(_), false) if quiet => {}
            (Ok(info), false) => {
                let (extras, n) = self.mutation_extras(&info);
                put_success(out, to, info.cas, Datatype::RAW, &extras[..n], &[], &[]);
            }
            (Err(e), _) => self.fail(shared, out, to, e, &[]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use epkv_protocol::{Command, Request};

    #[test]
    fn a_minimum_level_raises_weaker_writes_and_keeps_the_clients_timeout() {
        use DurabilityLevel::{Majority, MajorityAndPersistOnMaster, PersistToMajority};
        let d = |level, timeout| Some(DurabilityRequirement { level, timeout });
        let t = Some(Duration::from_millis(1500));
        assert_eq!(with_min_level(None, Majority), d(Majority, None));
        assert_eq!(
            with_min_level(d(Majority, t), PersistToMajority),
            d(PersistToMajority, t)
        );
        assert_eq!(
            with_min_level(d(PersistToMajority, t), MajorityAndPersistOnMaster),
            d(PersistToMajority, t),
            "a stronger request stays"
        );
        // Only writes are raised: a GET and a sub-document lookup carry no durability.
        use epkv_protocol::Opcode;
        let req = |op: Opcode, extras: &[u8], key: &[u8], value: &[u8]| {
            epkv_protocol::RequestBuilder::new(op)
                .extras(extras)
                .key(key)
                .value(value)
                .to_vec()
                .unwrap()
        };
        let set = req(Opcode::Set, &[0; 8], b"k", b"v");
        let get = req(Opcode::Get, &[], b"k", b"");
        let lookup = req(Opcode::SubdocGet, &[0, 1, 0], b"k", b"a");
        for (raw, writes) in [(&set, true), (&get, false), (&lookup, false)] {
            let r = Request::parse(raw, &epkv_protocol::Limits::default()).unwrap();
            let mut cmd = Command::decode(&r).unwrap();
            assert_eq!(
                cmd.write_durability_mut().is_some(),
                writes,
                "{:?}",
                r.header.opcode
            );
        }
    }

    #[test]
    fn only_the_persist_levels_wait_with_the_clients_timeout_or_the_default() {
        let d = |level, timeout| Some(DurabilityRequirement { level, timeout });
        assert_eq!(persist_timeout(None), None);
        assert_eq!(persist_timeout(d(DurabilityLevel::Majority, None)), None);
        assert_eq!(
            persist_timeout(d(DurabilityLevel::PersistToMajority, None)),
            Some(DEFAULT_DURABILITY_TIMEOUT)
        );
        let t = Duration::from_millis(1500);
        assert_eq!(
            persist_timeout(d(DurabilityLevel::MajorityAndPersistOnMaster, Some(t))),
            Some(t)
        );
    }
}
