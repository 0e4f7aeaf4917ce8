//! Per-call options of the store commands.

use epkv_protocol::DurabilityRequirement;
use epkv_types::{Cas, Datatype, Vbid};

/// Options for SET / ADD / REPLACE / APPEND / PREPEND. `Default` is: flags 0, never
/// expires, no CAS check, raw datatype, no durability, routed by key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// Client flags (ignored by APPEND/PREPEND).
    pub flags: u32,
    /// Raw expiry in memcached form (ignored by APPEND/PREPEND).
    pub expiry: u32,
    /// CAS to match, or [`Cas::ANY`].
    pub cas: Cas,
    /// Datatype of the value.
    pub datatype: Datatype,
    /// Durability requirements (sent as frame info id 1 with magic 0x08).
    pub durability: Option<DurabilityRequirement>,
    /// Send the PreserveTtl frame info.
    pub preserve_ttl: bool,
    /// Send to this vBucket instead of the key's.
    pub vbucket: Option<Vbid>,
}

impl StoreOptions {
    /// Returns the defaults.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the flags.
    #[must_use]
    pub fn flags(mut self, flags: u32) -> Self {
        self.flags = flags;
        self
    }

    /// Sets the raw expiry.
    #[must_use]
    pub fn expiry(mut self, expiry: u32) -> Self {
        self.expiry = expiry;
        self
    }

    /// Sets the CAS to match.
    #[must_use]
    pub fn cas(mut self, cas: Cas) -> Self {
        self.cas = cas;
        self
    }

    /// Sets the datatype.
    #[must_use]
    pub fn datatype(mut self, datatype: Datatype) -> Self {
        self.datatype = datatype;
        self
    }

    /// Asks for a SyncWrite.
    #[must_use]
    pub fn durability(mut self, durability: DurabilityRequirement) -> Self {
        self.durability = Some(durability);
        self
    }

    /// Keeps the existing expiry.
    #[must_use]
    pub fn preserve_ttl(mut self) -> Self {
        self.preserve_ttl = true;
        self
    }

    /// Overrides the vBucket.
    #[must_use]
    pub fn vbucket(mut self, vbucket: Vbid) -> Self {
        self.vbucket = Some(vbucket);
        self
    }
}
