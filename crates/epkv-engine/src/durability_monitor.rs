//! [`Monitor`]: a vBucket's SyncWrites in flight, in seqno order (KV-Engine's active
//! durability monitor), and as a replica the prepares it holds (its passive one); plus
//! the on-disk namespace of prepares ([`PREPARE_PREFIX`], [`prepare_key`]) and what an
//! abort's tombstone records ([`abort_value`]).
//!
//! The monitor only keeps the bookkeeping: which prepares are tracked, which are resolved
//! (a majority of the chain holds them, and this node's disk when their level says so),
//! the timeouts' deadlines and the waiters of their outcomes. Applying a commit or an
//! abort to the hash table is [`crate::durability`]'s work.
//!
//! Level: a leaf, below the vBucket that owns one. It imports no module of this crate.

use std::collections::{HashMap, VecDeque};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use epkv_engine_api::{EngineResult, EngineStatus, SyncWriteCallback};
use parking_lot::Mutex;

/// The durability timeout of a SyncWrite whose client gave none (KV-Engine's 30 s).
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The prefix of a prepare's key on disk: a zero byte and the LEB128 id 2, a collection
/// id reserved by Couchbase and never given to a collection (see `epkv_types::doc_key`),
/// so no document key starts with it.
pub(crate) const PREPARE_PREFIX: [u8; 2] = [0, 2];

/// Datatype bit of a prepare document on disk that deletes its key (not a client bit).
pub(crate) const PREPARE_DELETES: u8 = 0x80;

/// Outcomes kept for a front end that has not asked yet; past this many the oldest go
/// (a caller that never asks, such as a test driving the engine directly).
const MAX_UNCLAIMED: usize = 1 << 16;

/// The key under which the prepare of `key` is stored.
pub(crate) fn prepare_key(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(PREPARE_PREFIX.len() + key.len());
    k.extend_from_slice(&PREPARE_PREFIX);
    k.extend_from_slice(key);
    k
}

/// The document key of a stored prepare, or `None` for any other stored key.
pub(crate) fn prepared_key_of(stored: &[u8]) -> Option<&[u8]> {
    stored.strip_prefix(&PREPARE_PREFIX[..])
}

/// The value of the tombstone an abort leaves under the prepare's key: the aborted
/// prepare's seqno (8 bytes, big-endian), as KV-Engine keeps an abort's prepare seqno
/// with it on disk, so that a backfill sends the abort naming its prepare (DCP_ABORT).
pub(crate) fn abort_value(prepared_seqno: u64) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(&prepared_seqno.to_be_bytes())
}

/// The prepare seqno an abort's tombstone value records ([`abort_value`]); 0 for a
/// tombstone written without one.
pub(crate) fn aborted_prepare_seqno(value: &[u8]) -> u64 {
    value.try_into().map_or(0, u64::from_be_bytes)
}

/// One prepare in flight.
pub(crate) struct Tracked {
    pub(crate) seqno: u64,
    pub(crate) key: Vec<u8>,
    /// Its level needs this node's persistence (not Majority).
    pub(crate) persist: bool,
    /// When it is aborted if not committed; `None` for prepares warmup restored.
    pub(crate) deadline: Option<Instant>,
    pub(crate) waiter: Option<SyncWriteCallback>,
    /// It needs the replicas' acknowledgements (false for prepares warmup restored or a
    /// promoted replica held: they are committed once this node has them on disk).
    pub(crate) needs_acks: bool,
}

/// A prepare a replica vBucket holds, until its commit or abort arrives.
#[derive(Debug, Clone)]
pub(crate) struct Passive {
    pub(crate) seqno: u64,
    pub(crate) key: Vec<u8>,
    /// Its level needs persistence (the replica acknowledges it only once persisted).
    pub(crate) persist: bool,
}

/// The prepares of a replica vBucket and what it has acknowledged.
#[derive(Debug, Default)]
struct PassiveState {
    /// In seqno order.
    prepares: VecDeque<Passive>,
    /// The highest prepare seqno received.
    high_prepared: u64,
    /// The highest prepared seqno acknowledgeable (see [`Monitor::replica_hps`]).
    acked: u64,
    /// The disk snapshot being received, until its end ([`Monitor::passive_marker`]).
    disk_snapshot: Option<DiskSnapshot>,
}

/// A disk snapshot a replica is receiving: its last seqno, and the high completed seqno
/// of the active's data it was read from (its marker's).
#[derive(Debug, Clone, Copy)]
struct DiskSnapshot {
    end: u64,
    high_completed: u64,
}

/// A replica reached the end of a disk snapshot: the prepares it held at or below the
/// snapshot's high completed seqno are completed ([`Monitor::passive_marker`]).
#[derive(Debug)]
pub(crate) struct SnapshotEnd {
    /// The snapshot's high completed seqno.
    pub(crate) high_completed: u64,
    /// The prepares it completes, no longer held, in seqno order.
    pub(crate) completed: Vec<Passive>,
}

impl PassiveState {
    /// Completes the prepares held at or below `high_completed`.
    fn complete_upto(&mut self, high_completed: u64) -> SnapshotEnd {
        let (completed, kept): (VecDeque<Passive>, _) = std::mem::take(&mut self.prepares)
            .into_iter()
            .partition(|p| p.seqno <= high_completed);
        self.prepares = kept;
        SnapshotEnd {
            high_completed,
            completed: completed.into(),
        }
    }
}

#[derive(Default)]
struct State {
    /// In seqno order.
    tracked: VecDeque<Tracked>,
    /// Prepares taken off `tracked` whose completion is being applied, with their
    /// waiter if one asked: a waiter that asks meanwhile is attached here, so it hears
    /// the outcome only once the commit or abort is in the hash table.
    resolving: HashMap<u64, Option<SyncWriteCallback>>,
    /// Failures (aborts) of completed prepares nobody has asked for yet, by prepare
    /// seqno. A commit is not kept: a completed prepare found nowhere was committed.
    unclaimed: HashMap<u64, EngineResult<()>>,
    /// The highest seqno `unclaimed` dropped for room: an outcome asked for at or below
    /// it may have been a failure, so it reads as ambiguous.
    forgotten_upto: u64,
    /// The deadline the timeout task was last armed for.
    armed: Option<Instant>,
    /// The highest prepare seqno tracked (HPS) and the highest completed (HCS).
    high_prepared: u64,
    high_completed: u64,
    /// Who must hold a prepare before it commits.
    chains: Chains,
    /// Each replica's acknowledged high prepared seqno, by its DCP connection name.
    acks: Vec<(String, u64)>,
}

/// The replication topology of an active vBucket, as the monitor counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Chains {
    /// One chain known by its counts ([`Monitor::set_chain`]): any replica's
    /// acknowledgement counts.
    Counted {
        /// Replica slots of the chain (0: this node alone is the majority).
        replicas: usize,
        /// Of those, the slots a node holds (a failed-over node leaves an empty slot).
        live: usize,
    },
    /// One or two chains of named slots ([`Monitor::set_topology`]): only the
    /// acknowledgements of the nodes in them count, and each chain needs its majority.
    Named {
        /// This node's name in the chains.
        me: String,
        /// The first chain, and during a move the second; `None` is an empty slot.
        chains: Vec<Vec<Option<String>>>,
    },
}

impl Default for Chains {
    fn default() -> Self {
        Self::Counted {
            replicas: 0,
            live: 0,
        }
    }
}

/// The majority of a chain of `slots` slots.
fn majority(slots: usize) -> usize {
    slots / 2 + 1
}

impl State {
    /// Whether every chain has a majority holding `seqno`, this node (which holds it
    /// already) included where it counts.
    fn majority_holds(&self, seqno: u64) -> bool {
        let acked = |name: &str| self.acks.iter().any(|(n, a)| n == name && *a >= seqno);
        match &self.chains {
            Chains::Counted { replicas, .. } => {
                // A majority of the `1 + replicas` nodes, minus this node.
                let needed = replicas.div_ceil(2);
                self.acks.iter().filter(|(_, a)| *a >= seqno).count() >= needed
            }
            Chains::Named { me, chains } => chains.iter().all(|chain| {
                let holding = chain
                    .iter()
                    .flatten()
                    .filter(|n| *n == me || acked(n))
                    .count();
                holding >= majority(chain.len())
            }),
        }
    }

    /// Whether this node alone is a majority of every chain (a prepare needs nobody's
    /// acknowledgement).
    fn alone(&self) -> bool {
        match &self.chains {
            Chains::Counted { replicas, .. } => *replicas == 0,
            Chains::Named { me, chains } => chains
                .iter()
                .all(|chain| matches!(chain.as_slice(), [Some(n)] if n == me)),
        }
    }

    /// Whether `name`'s acknowledgements count.
    fn counts_acks_of(&self, name: &str) -> bool {
        match &self.chains {
            Chains::Counted { replicas, .. } => *replicas > 0,
            Chains::Named { me, chains } => {
                name != me && chains.iter().flatten().flatten().any(|n| n == name)
            }
        }
    }
}

/// A vBucket's SyncWrites in flight (KV-Engine's ActiveDurabilityMonitor), and as a
/// replica the prepares it holds (its PassiveDurabilityMonitor).
#[derive(Default)]
pub(crate) struct Monitor {
    state: Mutex<State>,
    /// Held while completions are applied, so that they are applied in seqno order.
    pub(crate) completing: Mutex<()>,
    /// The timeout task, once the vBucket has had a SyncWrite with a deadline.
    pub(crate) task: OnceLock<epkv_executor::TaskHandle>,
    /// As a replica: the prepares received and not completed.
    passive: Mutex<PassiveState>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("tracked", &self.len())
            .finish_non_exhaustive()
    }
}

impl Monitor {
    /// SyncWrites in flight (not counting completions being applied).
    pub(crate) fn len(&self) -> usize {
        self.state.lock().tracked.len()
    }

    pub(crate) fn track(&self, t: Tracked) {
        let mut s = self.state.lock();
        s.high_prepared = s.high_prepared.max(t.seqno);
        s.tracked.push_back(t);
    }

    /// Tracks a prepare, unless it is a Majority one with nothing in flight before it:
    /// that one is resolved already (this node is its own majority, and no persist-level
    /// prepare fences it), so it is recorded as completed and the caller commits it in
    /// place. Returns whether it did so.
    pub(crate) fn track_or_complete(&self, t: Tracked, majority: bool) -> bool {
        let mut s = self.state.lock();
        s.high_prepared = s.high_prepared.max(t.seqno);
        if majority && s.tracked.is_empty() && s.alone() {
            s.high_completed = s.high_completed.max(t.seqno);
            return true;
        }
        s.tracked.push_back(t);
        false
    }

    /// The high prepared and high completed seqnos.
    pub(crate) fn seqnos(&self) -> (u64, u64) {
        let s = self.state.lock();
        (s.high_prepared, s.high_completed)
    }

    /// Sets the high prepared and completed seqnos warmup read.
    pub(crate) fn restore_seqnos(&self, prepared: u64, completed: u64) {
        let mut s = self.state.lock();
        s.high_prepared = s.high_prepared.max(prepared);
        s.high_completed = s.high_completed.max(completed);
    }

    /// Takes the head if it is resolved: `(prepare, true)` to commit, `(prepare, false)`
    /// to abort. Only the head is ever resolved, so completions follow seqno order.
    pub(crate) fn pop_resolved(
        &self,
        persisted: u64,
        now: Option<Instant>,
    ) -> Option<(Tracked, bool)> {
        let mut s = self.state.lock();
        let head = s.tracked.front()?;
        let commit = (!head.persist || head.seqno <= persisted)
            && (!head.needs_acks || s.majority_holds(head.seqno));
        let expired = head
            .deadline
            .zip(now)
            .is_some_and(|(deadline, now)| deadline <= now);
        if !commit && !expired {
            return None;
        }
        let mut t = s.tracked.pop_front()?;
        s.high_completed = s.high_completed.max(t.seqno);
        let waiter = t.waiter.take();
        s.resolving.insert(t.seqno, waiter);
        Some((t, commit))
    }

    /// Hands the outcome of a prepare taken by [`Self::pop_resolved`] or [`Self::drain`]
    /// (its completion now applied) to its waiter, or keeps it for one. Returns the
    /// waiter to call (outside the lock).
    pub(crate) fn settle(
        &self,
        seqno: u64,
        outcome: EngineResult<()>,
    ) -> Option<(SyncWriteCallback, EngineResult<()>)> {
        let mut s = self.state.lock();
        if let Some(w) = s.resolving.remove(&seqno).flatten() {
            return Some((w, outcome));
        }
        if outcome.is_err() {
            if s.unclaimed.len() >= MAX_UNCLAIMED
                && let Some(oldest) = s.unclaimed.keys().min().copied()
            {
                s.unclaimed.remove(&oldest);
                s.forgotten_upto = s.forgotten_upto.max(oldest);
            }
            s.unclaimed.insert(seqno, outcome);
        }
        None
    }

    /// Attaches `done` to the prepare `seqno`, or returns it with the outcome to call it
    /// with at once (completed already; or unknown, which reads as ambiguous).
    pub(crate) fn claim(
        &self,
        seqno: u64,
        done: SyncWriteCallback,
    ) -> Option<(SyncWriteCallback, EngineResult<()>)> {
        let mut s = self.state.lock();
        if let Ok(i) = s.tracked.binary_search_by_key(&seqno, |t| t.seqno) {
            if let Some(t) = s.tracked.get_mut(i) {
                t.waiter = Some(done);
            }
            return None;
        }
        if let Some(slot) = s.resolving.get_mut(&seqno) {
            *slot = Some(done);
            return None;
        }
        let outcome = match s.unclaimed.remove(&seqno) {
            Some(failed) => failed,
            None if seqno > s.forgotten_upto && seqno <= s.high_completed => Ok(()),
            None => Err(EngineStatus::SyncWriteAmbiguous),
        };
        Some((done, outcome))
    }

    /// The head's deadline when the timeout task must be re-armed for it (and records
    /// it as armed): only when the task is armed for nothing or for later. A task armed
    /// earlier than the head needs (the previous head's deadline) is left alone: it runs
    /// once, spuriously, and re-arms itself. So a stream of SyncWrites with one timeout,
    /// whose deadlines only grow, re-arms the task about once per timeout period, not
    /// once per write.
    pub(crate) fn rearm(&self) -> Option<Instant> {
        let mut s = self.state.lock();
        let head = s.tracked.front().and_then(|t| t.deadline)?;
        if s.armed.is_some_and(|armed| armed <= head) {
            return None;
        }
        s.armed = Some(head);
        Some(head)
    }

    /// After a run of the timeout task: the deadline it must sleep until (recorded as
    /// armed), or `None` to sleep until a SyncWrite arms it.
    pub(crate) fn armed_after_run(&self) -> Option<Instant> {
        let mut s = self.state.lock();
        s.armed = s.tracked.front().and_then(|t| t.deadline);
        s.armed
    }

    /// Sets the chain this active vBucket replicates to: `replicas` slots, `live` of them
    /// held by a node; any replica's acknowledgement counts. When that changes (or the
    /// chains were named), acknowledgements so far are forgotten (new replicas start
    /// over).
    pub(crate) fn set_chain(&self, replicas: usize, live: usize) {
        let mut s = self.state.lock();
        let chains = Chains::Counted {
            replicas,
            live: live.min(replicas),
        };
        if s.chains != chains {
            s.acks.clear();
        }
        s.chains = chains;
    }

    /// Sets this active vBucket's replication topology: one or two chains of named slots
    /// (`None`: an empty slot), `me` naming this node, every other name a replica's DCP
    /// connection name. A prepare then needs a majority of each chain (see
    /// [`epkv_engine_api::Engine::set_replication_topology`]). The acknowledgements of the
    /// names still in a chain are kept, the others forgotten. Returns whether the
    /// topology changed; the caller then completes what the new one resolves.
    ///
    /// # Errors
    /// `Invalid` for no chain, more than two, an empty chain or a name twice in a chain.
    pub(crate) fn set_topology(
        &self,
        me: &str,
        chains: &[Vec<Option<String>>],
    ) -> EngineResult<bool> {
        if chains.is_empty() || chains.len() > 2 {
            return Err(EngineStatus::Invalid);
        }
        for chain in chains {
            let named: Vec<&String> = chain.iter().flatten().collect();
            let twice = named
                .iter()
                .enumerate()
                .any(|(i, n)| named[..i].contains(n));
            if chain.is_empty() || twice {
                return Err(EngineStatus::Invalid);
            }
        }
        let mut s = self.state.lock();
        if let Chains::Named { me: m, chains: c } = &s.chains
            && m == me
            && c.as_slice() == chains
        {
            // The cluster sets every active vBucket's topology on each map it installs:
            // an unchanged one costs a comparison, not a re-evaluation.
            return Ok(false);
        }
        s.chains = Chains::Named {
            me: me.to_owned(),
            chains: chains.to_vec(),
        };
        let mut acks = std::mem::take(&mut s.acks);
        acks.retain(|(name, _)| s.counts_acks_of(name));
        s.acks = acks;
        Ok(true)
    }

    /// True when a chain has too few nodes for a majority (DurabilityImpossible).
    pub(crate) fn impossible(&self) -> bool {
        let s = self.state.lock();
        match &s.chains {
            Chains::Counted { replicas, live } => *live < replicas.div_ceil(2),
            Chains::Named { chains, .. } => chains
                .iter()
                .any(|chain| chain.iter().flatten().count() < majority(chain.len())),
        }
    }

    /// Records replica `name`'s acknowledged high prepared seqno (ignored when `name` is
    /// in no chain). Returns whether it moved.
    pub(crate) fn ack(&self, name: &str, seqno: u64) -> bool {
        let mut s = self.state.lock();
        if !s.counts_acks_of(name) {
            return false;
        }
        match s.acks.iter_mut().find(|(n, _)| n == name) {
            Some((_, a)) if *a >= seqno => false,
            Some((_, a)) => {
                *a = seqno;
                true
            }
            None => {
                s.acks.push((name.to_owned(), seqno));
                true
            }
        }
    }

    /// As a replica: a prepare received.
    pub(crate) fn passive_prepare(&self, p: Passive) {
        let mut s = self.passive.lock();
        s.high_prepared = s.high_prepared.max(p.seqno);
        s.prepares.push_back(p);
    }

    /// As a replica: the prepare `seqno` completed (committed or aborted). Returns it.
    pub(crate) fn passive_complete(&self, seqno: u64) -> Option<Passive> {
        let mut s = self.passive.lock();
        let i = s.prepares.iter().position(|p| p.seqno == seqno)?;
        s.prepares.remove(i)
    }

    /// As a replica at high seqno `high`: a snapshot marker of `start..=end`, with the
    /// high completed seqno `high_completed` of a disk snapshot (KV-Engine's HCS rule).
    /// Every prepare at or below a disk snapshot's high completed seqno was committed or
    /// aborted on the active, but the snapshot may not say so: the disk keeps only the
    /// newest version of each key, so a commit a later write replaced is not in it. The
    /// replica completes those prepares once it has the whole snapshot:
    /// - at the change at its end ([`Self::passive_applied`]);
    /// - at once when it ends at or below `high` (nothing of it is to come);
    /// - at the next marker, when that one starts right after its end: the stream sent
    ///   all of it even though the change at its end never came. A marker starting lower
    ///   is a new stream's (the previous one dropped within the snapshot): the snapshot
    ///   is forgotten, its prepares kept, since the rest of it (the commits the replica
    ///   lacks, perhaps) did not arrive.
    ///
    /// Returns the snapshot ended, if one did.
    pub(crate) fn passive_marker(
        &self,
        start: u64,
        end: u64,
        high_completed: Option<u64>,
        high: u64,
    ) -> Option<SnapshotEnd> {
        let mut s = self.passive.lock();
        let mut upto = s
            .disk_snapshot
            .take()
            .filter(|d| start == d.end.saturating_add(1))
            .map(|d| d.high_completed);
        if let Some(high_completed) = high_completed {
            if end <= high {
                upto = upto.max(Some(high_completed));
            } else {
                s.disk_snapshot = Some(DiskSnapshot {
                    end,
                    high_completed,
                });
            }
        }
        upto.map(|hcs| s.complete_upto(hcs))
    }

    /// As a replica: the change at `seqno` was applied. Returns the disk snapshot it ends
    /// (see [`Self::passive_marker`]), if it is that snapshot's last.
    pub(crate) fn passive_applied(&self, seqno: u64) -> Option<SnapshotEnd> {
        let mut s = self.passive.lock();
        let d = s.disk_snapshot.filter(|d| seqno >= d.end)?;
        s.disk_snapshot = None;
        Some(s.complete_upto(d.high_completed))
    }

    /// As a replica: the high prepared seqno it may acknowledge with the vBucket
    /// persisted up to `persisted`: past every prepare received, except that it stops
    /// before the first persist-level prepare not yet on disk. Never goes back.
    pub(crate) fn replica_hps(&self, persisted: u64) -> u64 {
        let mut s = self.passive.lock();
        let blocked = s
            .prepares
            .iter()
            .find(|p| p.persist && p.seqno > persisted)
            .map(|p| p.seqno);
        let hps = match blocked {
            None => s.high_prepared,
            Some(b) => s
                .prepares
                .iter()
                .map(|p| p.seqno)
                .filter(|&q| q < b)
                .max()
                .unwrap_or(0)
                .max(s.acked),
        };
        s.acked = s.acked.max(hps);
        s.acked
    }

    /// As a replica becoming active, or starting over: takes the prepares it held (the
    /// disk snapshot it was receiving is forgotten).
    pub(crate) fn take_passive(&self) -> Vec<Passive> {
        let mut s = self.passive.lock();
        s.acked = 0;
        s.high_prepared = 0;
        s.disk_snapshot = None;
        s.prepares.drain(..).collect()
    }

    /// The vBucket stops being active but keeps its prepares (it goes pending: a takeover
    /// is in progress). Every prepare in flight leaves the tracked ones, uncompleted, for
    /// the held ones, as a replica holds the prepares it receives: the node taking the
    /// vBucket over commits or aborts them (this one then hears it as a replica), or this
    /// one does should the vBucket become active again ([`Self::take_passive`]). Nothing
    /// is written. Returns the waiters, which hear SyncWriteAmbiguous: whether their
    /// writes complete is no longer this node's to say. An outcome asked for later reads
    /// as ambiguous too, until the prepare completes here.
    pub(crate) fn hold_tracked(&self) -> Vec<SyncWriteCallback> {
        let taken: Vec<Tracked> = self.state.lock().tracked.drain(..).collect();
        let mut waiters = Vec::new();
        let mut p = self.passive.lock();
        for t in taken {
            waiters.extend(t.waiter);
            p.high_prepared = p.high_prepared.max(t.seqno);
            p.prepares.push_back(Passive {
                seqno: t.seqno,
                key: t.key,
                persist: t.persist,
            });
        }
        waiters
    }

    /// Takes every prepare in flight (FLUSH, a state change): their waiters hear
    /// SyncWriteAmbiguous.
    pub(crate) fn drain(&self) -> Vec<Tracked> {
        let mut s = self.state.lock();
        if let Some(last) = s.tracked.back() {
            s.high_completed = s.high_completed.max(last.seqno);
        }
        let taken: Vec<Tracked> = s.tracked.drain(..).collect();
        let mut out = Vec::with_capacity(taken.len());
        for mut t in taken {
            let waiter = t.waiter.take();
            s.resolving.insert(t.seqno, waiter);
            out.push(t);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use epkv_executor::Clock as _;

    fn t0() -> Instant {
        epkv_executor::ManualClock::new(Duration::ZERO).now()
    }

    fn tracked(seqno: u64, persist: bool, deadline: Option<Instant>) -> Tracked {
        Tracked {
            needs_acks: true,
            seqno,
            key: format!("k{seqno}").into_bytes(),
            persist,
            deadline,
            waiter: None,
        }
    }

    #[test]
    fn prepares_are_stored_in_the_storage_prepare_namespace() {
        let k = prepare_key(b"\0\x08k");
        assert_eq!(
            epkv_types::doc_key::collection_of(&k),
            epkv_storage::PREPARE_NAMESPACE
        );
        assert_eq!(prepared_key_of(&k), Some(&b"\0\x08k"[..]));
        assert_eq!(prepared_key_of(b"k"), None);
        assert_eq!(prepared_key_of(b"\0\x08k"), None);
        assert_eq!(
            aborted_prepare_seqno(&abort_value(0x0102_0304_0506)),
            0x0102_0304_0506
        );
        assert_eq!(aborted_prepare_seqno(b""), 0);
    }

    #[test]
    fn only_the_head_resolves_and_a_persist_level_head_fences_the_rest() {
        let m = Monitor::default();
        m.track(tracked(1, false, None));
        m.track(tracked(2, true, None));
        m.track(tracked(3, false, None));
        // Majority at the head commits; the unpersisted persist-level one stops the rest.
        assert!(matches!(m.pop_resolved(0, None), Some((t, true)) if t.seqno == 1));
        assert!(m.pop_resolved(1, None).is_none());
        // Persisted: it commits, and the Majority one behind it follows.
        assert!(matches!(m.pop_resolved(2, None), Some((t, true)) if t.seqno == 2));
        assert!(matches!(m.pop_resolved(2, None), Some((t, true)) if t.seqno == 3));
        assert!(m.pop_resolved(u64::MAX, None).is_none());
        assert_eq!(m.seqnos(), (3, 3));
    }

    #[test]
    fn an_expired_head_aborts_but_a_persisted_one_commits_first() {
        let t0 = t0();
        let m = Monitor::default();
        m.track(tracked(5, true, Some(t0)));
        m.track(tracked(6, true, Some(t0 + Duration::from_secs(9))));
        let later = Some(t0 + Duration::from_secs(1));
        // Persisted and expired: the commit wins.
        assert!(matches!(m.pop_resolved(5, later), Some((t, true)) if t.seqno == 5));
        // Not persisted, not expired.
        assert!(m.pop_resolved(5, later).is_none());
        // Expired: aborted.
        let much_later = Some(t0 + Duration::from_secs(10));
        assert!(matches!(m.pop_resolved(5, much_later), Some((t, false)) if t.seqno == 6));
    }

    #[test]
    fn the_timeout_task_is_rearmed_only_for_an_earlier_head() {
        let t0 = t0();
        let s = |n| Some(t0 + Duration::from_secs(n));
        let m = Monitor::default();
        assert_eq!(m.rearm(), None, "nothing to arm for");
        m.track(tracked(1, true, s(30)));
        assert_eq!(m.rearm(), s(30));
        assert_eq!(m.rearm(), None, "armed already");
        m.track(tracked(2, true, s(40)));
        assert!(m.pop_resolved(1, None).is_some());
        // The head is due later than the task: it is left to run once and re-arm itself.
        assert_eq!(m.rearm(), None);
        assert_eq!(m.armed_after_run(), s(40));
        assert!(m.pop_resolved(2, None).is_some());
        assert_eq!(m.armed_after_run(), None);
        m.track(tracked(3, true, s(5)));
        assert_eq!(m.rearm(), s(5), "a sleeping task is armed");
    }

    #[test]
    fn an_outcome_reaches_its_waiter_whenever_it_asks() {
        use std::sync::{Arc, Mutex};
        let m = Monitor::default();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let waiter = |seen: &Arc<Mutex<Vec<EngineResult<()>>>>| -> SyncWriteCallback {
            let seen = Arc::clone(seen);
            Box::new(move |r| seen.lock().unwrap_or_else(|e| e.into_inner()).push(r))
        };
        // Asked before completion: attached, then called by settle's caller.
        m.track(tracked(1, false, None));
        assert!(m.claim(1, waiter(&seen)).is_none());
        let Some((t, _)) = m.pop_resolved(0, None) else {
            panic!("the head resolves")
        };
        if let Some((done, r)) = m.settle(t.seqno, Ok(())) {
            done(r);
        }
        // Completed before anyone asked: kept, and handed over on the ask.
        m.track(tracked(2, false, None));
        let Some((t, _)) = m.pop_resolved(0, None) else {
            panic!("the head resolves")
        };
        assert!(
            m.settle(t.seqno, Err(EngineStatus::SyncWriteAmbiguous))
                .is_none()
        );
        if let Some((done, r)) = m.claim(2, waiter(&seen)) {
            done(r);
        }
        // Asked while the completion is being applied (taken off the monitor, not yet
        // settled): told at the settle, not before and not as unknown.
        m.track(tracked(3, false, None));
        let Some((t, _)) = m.pop_resolved(0, None) else {
            panic!("the head resolves")
        };
        assert!(
            m.claim(3, waiter(&seen)).is_none(),
            "attached, not answered"
        );
        assert_eq!(seen.lock().unwrap_or_else(|e| e.into_inner()).len(), 2);
        if let Some((done, r)) = m.settle(t.seqno, Ok(())) {
            done(r);
        }
        // Committed before anyone asked: nothing kept, and it reads as committed.
        m.track(tracked(4, false, None));
        let Some((t, _)) = m.pop_resolved(0, None) else {
            panic!("the head resolves")
        };
        assert!(m.settle(t.seqno, Ok(())).is_none());
        if let Some((done, r)) = m.claim(4, waiter(&seen)) {
            done(r);
        }
        // A Majority prepare with nothing before it completes at once.
        assert!(m.track_or_complete(tracked(5, false, None), true));
        if let Some((done, r)) = m.claim(5, waiter(&seen)) {
            done(r);
        }
        // Unknown: ambiguous, never success.
        if let Some((done, r)) = m.claim(99, waiter(&seen)) {
            done(r);
        }
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(
            seen,
            vec![
                Ok(()),
                Err(EngineStatus::SyncWriteAmbiguous),
                Ok(()),
                Ok(()),
                Ok(()),
                Err(EngineStatus::SyncWriteAmbiguous)
            ]
        );
    }

    fn named(slots: &[Option<&str>]) -> Vec<Option<String>> {
        slots.iter().map(|s| s.map(str::to_owned)).collect()
    }

    /// A monitor of active A moving to B: chains [A, C] and [B, C].
    fn moving() -> Monitor {
        let m = Monitor::default();
        m.set_topology(
            "a",
            &[
                named(&[Some("a"), Some("c")]),
                named(&[Some("b"), Some("c")]),
            ],
        )
        .unwrap();
        m
    }

    #[test]
    fn each_chain_needs_its_own_majority() {
        let m = moving();
        m.track(tracked(1, false, None));
        // C holds it: the first chain has its majority (A and C), the second not (C of B, C).
        assert!(m.ack("c", 1));
        assert!(m.pop_resolved(u64::MAX, None).is_none());
        // B too: both chains.
        assert!(m.ack("b", 1));
        assert!(matches!(m.pop_resolved(u64::MAX, None), Some((t, true)) if t.seqno == 1));
    }

    #[test]
    fn this_node_counts_only_in_a_chain_it_is_in_and_its_disk_is_needed_anyway() {
        let m = moving();
        m.track(tracked(1, true, None));
        // A persist level waits for this node's disk whatever the acks.
        m.ack("b", 1);
        m.ack("c", 1);
        assert!(m.pop_resolved(0, None).is_none());
        assert!(matches!(m.pop_resolved(1, None), Some((_, true))));
        // Second chain [B, C] without this node: B's ack alone is not its majority.
        let m = moving();
        m.track(tracked(2, false, None));
        m.ack("b", 2);
        assert!(m.pop_resolved(u64::MAX, None).is_none());
    }

    #[test]
    fn acks_of_names_in_no_chain_are_ignored() {
        let m = moving();
        m.track(tracked(1, false, None));
        assert!(!m.ack("stranger", 1), "ignored");
        assert!(!m.ack("a", 1), "this node does not acknowledge itself");
        assert!(m.ack("c", 1));
        assert!(m.pop_resolved(u64::MAX, None).is_none());
    }

    #[test]
    fn removing_the_second_chain_resolves_and_keeps_the_acks_of_names_that_stay() {
        let m = moving();
        m.track(tracked(1, false, None));
        m.ack("c", 1);
        m.ack("d", 1);
        assert!(m.pop_resolved(u64::MAX, None).is_none());
        // The move is done on this side's view: first chain only. C's ack is kept.
        m.set_topology("a", &[named(&[Some("a"), Some("c")])])
            .unwrap();
        assert!(matches!(m.pop_resolved(u64::MAX, None), Some((t, true)) if t.seqno == 1));
        // A name dropped from the chains loses its ack: C goes, then comes back.
        m.track(tracked(2, false, None));
        m.ack("c", 2);
        m.set_topology("a", &[named(&[Some("a"), Some("d")])])
            .unwrap();
        m.set_topology("a", &[named(&[Some("a"), Some("c")])])
            .unwrap();
        assert!(
            m.pop_resolved(u64::MAX, None).is_none(),
            "C's ack was forgotten"
        );
    }

    #[test]
    fn a_chain_without_enough_named_slots_is_impossible() {
        let m = moving();
        assert!(!m.impossible());
        // [A, C] and [B, empty]: the second chain cannot have 2 of 2.
        m.set_topology(
            "a",
            &[named(&[Some("a"), Some("c")]), named(&[Some("b"), None])],
        )
        .unwrap();
        assert!(m.impossible());
        // Three slots, two named: 2 of 3 is possible.
        m.set_topology("a", &[named(&[Some("a"), None, Some("c")])])
            .unwrap();
        assert!(!m.impossible());
    }

    #[test]
    fn a_single_node_chain_completes_majority_at_once_and_malformed_topologies_are_refused() {
        let m = Monitor::default();
        m.set_topology("a", &[named(&[Some("a")])]).unwrap();
        assert!(m.track_or_complete(tracked(1, false, None), true));
        m.set_topology("a", &[named(&[Some("a")]), named(&[Some("b")])])
            .unwrap();
        assert!(
            !m.track_or_complete(tracked(2, false, None), true),
            "B must hold it"
        );
        for bad in [
            vec![],
            vec![vec![]],
            vec![named(&[Some("a")]); 3],
            vec![named(&[Some("a"), Some("a")])],
        ] {
            assert_eq!(m.set_topology("a", &bad), Err(EngineStatus::Invalid));
        }
    }

    #[test]
    fn counted_chains_work_as_before_and_a_switch_forgets_named_acks() {
        let m = moving();
        m.ack("c", 5);
        m.set_chain(1, 1);
        m.track(tracked(5, false, None));
        assert!(
            m.pop_resolved(u64::MAX, None).is_none(),
            "C's ack was forgotten"
        );
        // In counted mode any replica's acknowledgement counts.
        assert!(m.ack("anyone", 5));
        assert!(matches!(m.pop_resolved(u64::MAX, None), Some((_, true))));
    }

    #[test]
    fn held_prepares_leave_the_tracked_ones_uncompleted() {
        let m = moving();
        m.track(tracked(1, false, None));
        m.track(tracked(2, true, None));
        assert!(m.claim(2, Box::new(|_| {})).is_none(), "attached");
        // The waiter is handed back for the caller to answer; nothing is tracked.
        let waiters = m.hold_tracked();
        assert_eq!((waiters.len(), m.len()), (1, 0));
        // Not completed: an outcome asked for now is ambiguous, never committed.
        assert_eq!(m.seqnos().1, 0);
        let Some((_, outcome)) = m.claim(1, Box::new(|_| {})) else {
            panic!("answered at once")
        };
        assert_eq!(outcome, Err(EngineStatus::SyncWriteAmbiguous));
        // Held as a replica holds them, for a later promotion to take.
        let held = m.take_passive();
        assert_eq!(
            held.iter()
                .map(|p| (p.seqno, p.persist))
                .collect::<Vec<_>>(),
            vec![(1, false), (2, true)]
        );
    }

    /// A replica holding Majority prepares `seqnos`.
    fn holding(seqnos: &[u64]) -> Monitor {
        let m = Monitor::default();
        for &seqno in seqnos {
            m.passive_prepare(Passive {
                seqno,
                key: format!("k{seqno}").into_bytes(),
                persist: false,
            });
        }
        m
    }

    fn ended(e: Option<SnapshotEnd>) -> Option<(u64, Vec<u64>)> {
        e.map(|e| {
            (
                e.high_completed,
                e.completed.iter().map(|p| p.seqno).collect(),
            )
        })
    }

    fn held(m: &Monitor) -> Vec<u64> {
        m.take_passive().iter().map(|p| p.seqno).collect()
    }

    #[test]
    fn a_disk_snapshot_completes_the_prepares_up_to_its_hcs_once_received_whole() {
        // At the change at its end, not before; prepares above its HCS stay.
        let m = holding(&[2, 4, 9]);
        assert!(ended(m.passive_marker(5, 12, Some(4), 4)).is_none());
        assert!(ended(m.passive_applied(11)).is_none());
        assert_eq!(ended(m.passive_applied(12)), Some((4, vec![2, 4])));
        assert!(ended(m.passive_applied(13)).is_none(), "ended once");
        assert_eq!(held(&m), [9]);
        // A memory snapshot completes nothing.
        let m = holding(&[2]);
        assert!(ended(m.passive_marker(3, 5, None, 2)).is_none());
        assert!(ended(m.passive_applied(5)).is_none());
        assert_eq!(held(&m), [2]);
        // A snapshot with nothing above the replica's high seqno ends at its marker.
        let m = holding(&[2]);
        assert_eq!(
            ended(m.passive_marker(1, 6, Some(3), 6)),
            Some((3, vec![2]))
        );
        assert!(held(&m).is_empty());
        // One whose last change never came ends at the marker right after it.
        let m = holding(&[2]);
        assert!(ended(m.passive_marker(3, 8, Some(2), 2)).is_none());
        assert!(ended(m.passive_applied(7)).is_none());
        assert_eq!(ended(m.passive_marker(9, 9, None, 7)), Some((2, vec![2])));
    }

    #[test]
    fn a_disk_snapshot_cut_short_by_a_new_stream_completes_nothing() {
        let m = holding(&[2]);
        assert!(ended(m.passive_marker(3, 8, Some(2), 2)).is_none());
        assert!(ended(m.passive_applied(5)).is_none());
        // The stream dropped; the next one starts after the replica's high seqno, within
        // the snapshot: the changes after 5 (the commit of 2, perhaps) are still to come.
        assert!(ended(m.passive_marker(6, 7, None, 5)).is_none());
        assert!(ended(m.passive_applied(8)).is_none());
        assert_eq!(held(&m), [2]);
        // Starting over forgets the snapshot too.
        let m = holding(&[2]);
        assert!(ended(m.passive_marker(3, 8, Some(2), 2)).is_none());
        assert_eq!(held(&m), [2]);
        assert!(ended(m.passive_applied(8)).is_none());
    }
}
