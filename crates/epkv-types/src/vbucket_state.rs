//! vBucket states and durability levels.

/// The state of one vBucket on this node (kv_engine `include/memcached/vbucket.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum VBucketState {
    /// Serves reads and writes; generates seqnos and CAS; expires items.
    Active = 1,
    /// Receives replication; clients may only use GET_REPLICA; never expires items.
    Replica = 2,
    /// Being taken over: client operations are parked until the state changes (then
    /// they run again: on an active vBucket, or answered NOT_MY_VBUCKET), at most a few
    /// seconds before TMPFAIL; it still streams over DCP to the node taking it over.
    Pending = 3,
    /// Awaiting deletion: every client operation gets NOT_MY_VBUCKET.
    Dead = 4,
}

impl VBucketState {
    /// Returns the state for its wire/on-disk code, or `None` for an unknown code.
    #[must_use]
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Active),
            2 => Some(Self::Replica),
            3 => Some(Self::Pending),
            4 => Some(Self::Dead),
            _ => None,
        }
    }

    /// Returns the name Couchbase uses in stats (`active`, `replica`, `pending`, `dead`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Replica => "replica",
            Self::Pending => "pending",
            Self::Dead => "dead",
        }
    }
}

/// The durability level a SyncWrite asks for (frame info id 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DurabilityLevel {
    /// Committed in memory on a majority of the chain.
    Majority = 1,
    /// Majority, and persisted on the active.
    MajorityAndPersistOnMaster = 2,
    /// Persisted on a majority of the chain.
    PersistToMajority = 3,
}

impl DurabilityLevel {
    /// Returns the level for its wire code, or `None` for 0 or an unknown code.
    #[must_use]
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Majority),
            2 => Some(Self::MajorityAndPersistOnMaster),
            3 => Some(Self::PersistToMajority),
            _ => None,
        }
    }
}
