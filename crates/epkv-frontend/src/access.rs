//! [`Access`]: a connection's privilege context (KV-Engine's `PrivilegeContext`): what its
//! user may do on the bucket it selected, precomputed so that the check every request
//! makes before its handler runs is one bit test.
//!
//! The context is computed when the connection authenticates (SASL or a TLS client
//! certificate), when it selects a bucket, and again whenever the users changed since:
//! [`Access::is_stale`] compares the user directory's generation
//! ([`epkv_auth::UserDirectory::generation`], one atomic load) with the one the context
//! was computed at. A role removed or a user deleted therefore takes effect at each live
//! connection's next request; a deleted user's connection holds no privilege at all.
//!
//! A request on a collection is checked on the whole bucket first
//! ([`epkv_auth::BucketPrivileges::has`]). Only when that fails and the user's roles name
//! a scope or a collection (`data_reader[b:s:c]`) is the collection id resolved to its
//! names ([`epkv_engine_api::Engine::collection_names`]) and checked against those grants;
//! the answer is kept for the last collection asked about (collection ids are never
//! reused), so a collection-qualified user's requests on one collection resolve it once.

use crate::dispatch::table::Needs;
use crate::frontend::Shared;
use epkv_auth::rbac::Level;
use epkv_auth::{BucketPrivileges, Privilege, Privileges};
use epkv_engine_api::{Engine, EngineStatus};
use std::cell::Cell;

/// A connection's privileges on its selected bucket (or, with none, node-wide).
#[derive(Debug, Default)]
pub(crate) struct Access {
    /// The user directory's generation the privileges were computed at.
    generation: u64,
    /// Whether the privileges are those of a selected bucket.
    on_bucket: bool,
    /// The privileges on the selected bucket (nothing without one).
    bucket: BucketPrivileges,
    /// The node-wide privileges: what is checked while no bucket is selected.
    global: Privileges,
    /// The last collection a narrow grant was resolved for: its id and every
    /// collection-level privilege held on it.
    narrow: Cell<Option<(u32, Privileges)>>,
}

impl Access {
    /// Computes the privileges of `user` (`None`: not authenticated) on `bucket` (`None`:
    /// none selected). In the open loopback mode an unauthenticated connection holds
    /// every privilege; otherwise it holds none, and so does a user who no longer exists.
    pub(crate) fn compute(shared: &Shared, user: Option<&str>, bucket: Option<&str>) -> Access {
        // Read before the store: a store taken afterwards is at least this new.
        let generation = shared.users.generation();
        let (global, privileges) = match user {
            None if shared.open_default => (Privileges::ALL, BucketPrivileges::all()),
            None => (Privileges::NONE, BucketPrivileges::default()),
            Some(user) => {
                let store = shared.users.current();
                match store.roles(user) {
                    Some(roles) => (
                        roles.global(),
                        bucket
                            .map_or_else(BucketPrivileges::default, |b| roles.bucket_privileges(b)),
                    ),
                    None => (Privileges::NONE, BucketPrivileges::default()),
                }
            }
        };
        Access {
            generation,
            on_bucket: bucket.is_some(),
            bucket: privileges,
            global,
            narrow: Cell::new(None),
        }
    }

    /// Whether the users changed since the privileges were computed.
    #[inline]
    pub(crate) fn is_stale(&self, shared: &Shared) -> bool {
        shared.users.generation() != self.generation
    }

    /// Whether the user may select the bucket the privileges were computed for.
    pub(crate) fn usable(&self) -> bool {
        self.on_bucket && self.bucket.usable()
    }

    /// Whether the user holds `p` on the whole selected bucket. With no bucket selected
    /// only node-wide privileges are checked: a request that needs more also needs a
    /// bucket, and its handler answers NoBucket.
    #[inline]
    pub(crate) fn has(&self, p: Privilege) -> bool {
        if self.on_bucket {
            self.bucket.has(p)
        } else {
            p.level() != Level::Global || self.global.contains(p)
        }
    }

    /// Checks `needs` on the whole selected bucket: `Err` names the missing privilege.
    #[inline]
    pub(crate) fn check(&self, needs: Needs) -> Result<(), Privilege> {
        needs.check(|p| self.has(p))
    }

    /// Checks `needs` on collection `cid` of the selected bucket: the whole-bucket check,
    /// then, for a user whose roles name scopes or collections, the grants on `cid`.
    ///
    /// # Errors
    /// The engine's answer when the collection must be resolved and cannot be
    /// (`UnknownCollection`); otherwise `Ok` with the check's outcome.
    pub(crate) fn check_in(
        &self,
        needs: Needs,
        engine: &dyn Engine,
        cid: u32,
    ) -> Result<Result<(), Privilege>, EngineStatus> {
        match self.check(needs) {
            Ok(()) => Ok(Ok(())),
            Err(missing) => self.check_narrow(needs, missing, engine, cid),
        }
    }

    /// The second half of [`Self::check_in`], for a caller whose whole-bucket check
    /// already failed with `missing`: the grants that name scopes or collections, on
    /// collection `cid` (the request's collection is resolved only here).
    ///
    /// # Errors
    /// As [`Self::check_in`].
    pub(crate) fn check_narrow(
        &self,
        needs: Needs,
        missing: Privilege,
        engine: &dyn Engine,
        cid: u32,
    ) -> Result<Result<(), Privilege>, EngineStatus> {
        if !self.has_narrow_grants() {
            return Ok(Err(missing));
        }
        let held = self.in_collection(engine, cid)?;
        Ok(needs.check(|p| held.contains(p)))
    }

    /// Whether some grant names a scope or a collection of the bucket.
    pub(crate) fn has_narrow_grants(&self) -> bool {
        self.on_bucket && self.bucket.has_narrow_grants()
    }

    /// Every privilege held on collection `cid` (resolved once per collection in a row).
    ///
    /// # Errors
    /// `UnknownCollection` for an id the bucket does not have.
    pub(crate) fn in_collection(
        &self,
        engine: &dyn Engine,
        cid: u32,
    ) -> Result<Privileges, EngineStatus> {
        if let Some((known, held)) = self.narrow.get()
            && known == cid
        {
            return Ok(held);
        }
        let (scope, collection) = engine.collection_names(cid)?;
        let held = Privilege::ALL
            .iter()
            .filter(|p| self.bucket.has_in(**p, &scope, &collection))
            .fold(Privileges::NONE, |acc, p| acc.union(Privileges(p.bit())));
        self.narrow.set(Some((cid, held)));
        Ok(held)
    }
}
