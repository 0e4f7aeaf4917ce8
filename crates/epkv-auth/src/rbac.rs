//! Role-based access control: Couchbase's roles, the privileges each grants, and the
//! decision whether a user may do something to a bucket, scope or collection.
//!
//! **Privileges** ([`Privilege`]) are what a request needs: KV-Engine's names for the data
//! service (`Read`, `Insert`, `Upsert`, `Delete`, `SystemXattrRead`, `DcpProducer`,
//! `SimpleStats`, `BucketManagement`, ...) plus the few the management REST API needs
//! (`SettingsRead`, `Flush`, `CollectionManagement`, `BucketCreate`, `ClusterManagement`,
//! `SecurityRead`, `SecurityManagement`). Each privilege has a **level**: a
//! collection-level privilege is granted per bucket, scope and collection; a bucket-level
//! one per bucket; a global one for the whole node.
//!
//! **Roles** ([`Role`]) are what an administrator grants: `admin`, `ro_admin`,
//! `cluster_admin`, `security_admin`, `bucket_admin[b]`, `bucket_full_access[b]`,
//! `data_reader[b:s:c]`, `data_writer[b:s:c]`, `data_dcp_reader[b:s:c]`, `data_backup[b]`
//! and `data_monitoring[b:s:c]`, written as Couchbase writes them. `*` stands for any
//! bucket, scope or collection; a collection role may name a bucket only (`[b]`, every
//! scope and collection of it), a scope (`[b:s]`) or one collection (`[b:s:c]`). What each
//! role grants is the one table [`ROLES`], derived from ns_server's role definitions and
//! its translation of permissions into KV-Engine privileges (docs/auth.md prints it).
//!
//! **Decisions.** [`Roles::allows`] answers one question from the roles directly (the
//! reference definition). For the per-request check the front end takes a
//! [`BucketPrivileges`] once per selected bucket: the privileges granted on every
//! collection of the bucket as one bit set, plus the few grants that name a scope or a
//! collection, so that the common check is one AND of two words.

use std::fmt;

/// Something a request may need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Privilege {
    /// Read documents (GET, lookups, GET_REPLICA, ...). Collection level.
    Read = 0,
    /// Create documents (ADD, insert). Collection level.
    Insert,
    /// Create or replace documents (SET, REPLACE, mutations, TOUCH). Collection level.
    Upsert,
    /// Delete documents. Collection level.
    Delete,
    /// Scan a range of keys (range scans). Collection level.
    RangeScan,
    /// Write documents with their metadata (the `*_WITH_META` commands). Collection level.
    MetaWrite,
    /// Read system extended attributes (those whose name starts with `_`). Collection level.
    SystemXattrRead,
    /// Write system extended attributes. Collection level.
    SystemXattrWrite,
    /// Stream a collection's changes over DCP. Collection level.
    DcpStream,
    /// Read the statistics of a bucket's collections (STAT). Collection level.
    SimpleStats,
    /// Open a DCP producer (stream from the bucket). Bucket level.
    DcpProducer,
    /// Open a DCP consumer (replicate into the bucket). Bucket level.
    DcpConsumer,
    /// Change a bucket's vBuckets and settings (SET_VBUCKET, bucket settings). Bucket
    /// level.
    BucketManagement,
    /// Read a bucket's settings and its collections manifest over REST. Bucket level.
    SettingsRead,
    /// Flush a bucket. Bucket level.
    Flush,
    /// Create and drop scopes and collections. Bucket level.
    CollectionManagement,
    /// Every statistic of the node (privileged STAT groups, the Prometheus endpoint).
    /// Global.
    Stats,
    /// Node-level commands (VERBOSITY, EVICT_KEY). Global.
    NodeManagement,
    /// Change the cluster: fail nodes over, add them back. Global.
    ClusterManagement,
    /// Create and drop buckets. Global.
    BucketCreate,
    /// Read users and roles. Global.
    SecurityRead,
    /// Create, change and delete users. Global.
    SecurityManagement,
    /// Read the cluster's description (`/pools`). Global.
    SystemSettings,
    /// KV-Engine's `Administrator`: memcached administration. Global.
    Administrator,
    /// Keep an idle connection open past the idle timeout. Global.
    IdleConnection,
    /// Act as another user. Global.
    Impersonate,
}

/// Where a privilege is granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Per bucket, scope and collection.
    Collection,
    /// Per bucket.
    Bucket,
    /// For the whole node.
    Global,
}

impl Privilege {
    /// Every privilege, in declaration order.
    pub const ALL: [Privilege; 26] = [
        Privilege::Read,
        Privilege::Insert,
        Privilege::Upsert,
        Privilege::Delete,
        Privilege::RangeScan,
        Privilege::MetaWrite,
        Privilege::SystemXattrRead,
        Privilege::SystemXattrWrite,
        Privilege::DcpStream,
        Privilege::SimpleStats,
        Privilege::DcpProducer,
        Privilege::DcpConsumer,
        Privilege::BucketManagement,
        Privilege::SettingsRead,
        Privilege::Flush,
        Privilege::CollectionManagement,
        Privilege::Stats,
        Privilege::NodeManagement,
        Privilege::ClusterManagement,
        Privilege::BucketCreate,
        Privilege::SecurityRead,
        Privilege::SecurityManagement,
        Privilege::SystemSettings,
        Privilege::Administrator,
        Privilege::IdleConnection,
        Privilege::Impersonate,
    ];

    /// The privilege's name, as KV-Engine names it (in EACCESS error contexts).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Privilege::Read => "Read",
            Privilege::Insert => "Insert",
            Privilege::Upsert => "Upsert",
            Privilege::Delete => "Delete",
            Privilege::RangeScan => "RangeScan",
            Privilege::MetaWrite => "MetaWrite",
            Privilege::SystemXattrRead => "SystemXattrRead",
            Privilege::SystemXattrWrite => "SystemXattrWrite",
            Privilege::DcpStream => "DcpStream",
            Privilege::SimpleStats => "SimpleStats",
            Privilege::DcpProducer => "DcpProducer",
            Privilege::DcpConsumer => "DcpConsumer",
            Privilege::BucketManagement => "BucketManagement",
            Privilege::SettingsRead => "SettingsRead",
            Privilege::Flush => "Flush",
            Privilege::CollectionManagement => "CollectionManagement",
            Privilege::Stats => "Stats",
            Privilege::NodeManagement => "NodeManagement",
            Privilege::ClusterManagement => "ClusterManagement",
            Privilege::BucketCreate => "BucketCreate",
            Privilege::SecurityRead => "SecurityRead",
            Privilege::SecurityManagement => "SecurityManagement",
            Privilege::SystemSettings => "SystemSettings",
            Privilege::Administrator => "Administrator",
            Privilege::IdleConnection => "IdleConnection",
            Privilege::Impersonate => "Impersonate",
        }
    }

    /// Where the privilege is granted.
    #[must_use]
    pub fn level(self) -> Level {
        match self as u8 {
            0..=9 => Level::Collection,
            10..=15 => Level::Bucket,
            _ => Level::Global,
        }
    }

    /// The privilege's bit in a [`Privileges`] set.
    #[must_use]
    pub const fn bit(self) -> u32 {
        1 << self as u8
    }
}

impl fmt::Display for Privilege {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of privileges (one bit each).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Privileges(pub u32);

impl Privileges {
    /// No privilege.
    pub const NONE: Privileges = Privileges(0);
    /// Every privilege.
    pub const ALL: Privileges = Privileges((1 << Privilege::ALL.len()) - 1);

    /// The set of `list`.
    #[must_use]
    pub const fn of(list: &[Privilege]) -> Privileges {
        let mut bits = 0;
        let mut i = 0;
        while i < list.len() {
            bits |= list[i].bit();
            i += 1;
        }
        Privileges(bits)
    }

    /// Whether `p` is in the set.
    #[must_use]
    #[inline]
    pub const fn contains(self, p: Privilege) -> bool {
        self.0 & p.bit() != 0
    }

    /// Whether the set is empty.
    #[must_use]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Both sets.
    #[must_use]
    pub const fn union(self, other: Privileges) -> Privileges {
        Privileges(self.0 | other.0)
    }

    /// The privileges in the set, in declaration order.
    pub fn iter(self) -> impl Iterator<Item = Privilege> {
        Privilege::ALL
            .into_iter()
            .filter(move |p| self.contains(*p))
    }
}

impl fmt::Debug for Privileges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// What a role may be qualified with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qualifier {
    /// Nothing: the role holds for the whole node (`admin`).
    None,
    /// A bucket, or `*` (`bucket_admin[travel]`).
    Bucket,
    /// A bucket, optionally a scope and a collection, each possibly `*`
    /// (`data_reader[travel:inventory:airline]`).
    Collection,
}

/// One role of the table: its name, qualifier and the privileges it grants at each level.
#[derive(Debug, Clone, Copy)]
pub struct RoleDef {
    /// The role's name (`data_reader`).
    pub name: &'static str,
    /// What it is qualified with.
    pub qualifier: Qualifier,
    /// Collection-level privileges, on the collections the role names.
    pub collection: Privileges,
    /// Bucket-level privileges, on the bucket the role names (every bucket without one).
    pub bucket: Privileges,
    /// Global privileges.
    pub global: Privileges,
}

use Privilege as P;

/// Every data privilege of a collection (what full access to a bucket's data grants).
const DATA: Privileges = Privileges::of(&[
    P::Read,
    P::Insert,
    P::Upsert,
    P::Delete,
    P::RangeScan,
    P::MetaWrite,
    P::SystemXattrRead,
    P::SystemXattrWrite,
    P::DcpStream,
    P::SimpleStats,
]);

/// What managing a bucket grants (Couchbase's `[{bucket, B}], all` without its data).
const MANAGE_BUCKET: Privileges = Privileges::of(&[
    P::BucketManagement,
    P::SettingsRead,
    P::Flush,
    P::CollectionManagement,
]);

/// What any role naming a bucket granted on it before privileges were checked: every
/// data privilege and DCP both ways (as `bucket_full_access` grants).
pub const LEGACY_BUCKET_ACCESS: Privileges =
    DATA.union(Privileges::of(&[P::DcpProducer, P::DcpConsumer]));

/// The roles epkv grants, and what each grants. From ns_server's role definitions
/// (`menelaus_roles`) and its translation of permissions into KV-Engine privileges
/// (`memcached_permissions`), with the REST privileges read off the same definitions:
/// - `admin`: everything.
/// - `ro_admin`: reads statistics, settings and users; no data.
/// - `security_admin`: `ro_admin` plus managing users; no data.
/// - `cluster_admin`: manages nodes and buckets (not security); no data.
/// - `bucket_admin[b]`: manages bucket `b` (settings, flush, collections, vBuckets) and
///   reads the node's statistics; no data.
/// - `bucket_full_access[b]`: every data privilege on `b`, DCP both ways, flush.
/// - `data_reader[b:s:c]`: reads documents.
/// - `data_writer[b:s:c]`: inserts, upserts and deletes documents (cannot read them).
/// - `data_dcp_reader[b:s:c]`: reads documents and system xattrs, streams over DCP as a
///   producer.
/// - `data_backup[b]`: every data privilege on `b` and DCP both ways (backup and
///   restore).
/// - `data_monitoring[b:s:c]`: reads statistics only.
///
/// Every role that names a bucket can read that bucket's settings (`SettingsRead`) and the
/// cluster's description (`SystemSettings`), as in Couchbase.
pub const ROLES: &[RoleDef] = &[
    RoleDef {
        name: "admin",
        qualifier: Qualifier::None,
        collection: DATA,
        bucket: Privileges::of(&[
            P::DcpProducer,
            P::DcpConsumer,
            P::BucketManagement,
            P::SettingsRead,
            P::Flush,
            P::CollectionManagement,
        ]),
        global: Privileges::of(&[
            P::Stats,
            P::NodeManagement,
            P::ClusterManagement,
            P::BucketCreate,
            P::SecurityRead,
            P::SecurityManagement,
            P::SystemSettings,
            P::Administrator,
            P::IdleConnection,
            P::Impersonate,
        ]),
    },
    RoleDef {
        name: "ro_admin",
        qualifier: Qualifier::None,
        collection: Privileges::of(&[P::SimpleStats]),
        bucket: Privileges::of(&[P::SettingsRead]),
        global: Privileges::of(&[P::Stats, P::SecurityRead, P::SystemSettings]),
    },
    RoleDef {
        name: "security_admin",
        qualifier: Qualifier::None,
        collection: Privileges::of(&[P::SimpleStats]),
        bucket: Privileges::of(&[P::SettingsRead]),
        global: Privileges::of(&[
            P::Stats,
            P::SecurityRead,
            P::SecurityManagement,
            P::SystemSettings,
        ]),
    },
    RoleDef {
        name: "cluster_admin",
        qualifier: Qualifier::None,
        collection: Privileges::of(&[P::SimpleStats]),
        bucket: MANAGE_BUCKET,
        global: Privileges::of(&[
            P::Stats,
            P::NodeManagement,
            P::ClusterManagement,
            P::BucketCreate,
            P::SystemSettings,
            P::Administrator,
            P::IdleConnection,
        ]),
    },
    RoleDef {
        name: "bucket_admin",
        qualifier: Qualifier::Bucket,
        collection: Privileges::of(&[P::SimpleStats]),
        bucket: MANAGE_BUCKET,
        global: Privileges::of(&[P::Stats, P::SystemSettings]),
    },
    RoleDef {
        name: "bucket_full_access",
        qualifier: Qualifier::Bucket,
        collection: DATA,
        bucket: Privileges::of(&[P::DcpProducer, P::DcpConsumer, P::SettingsRead, P::Flush]),
        global: Privileges::of(&[P::SystemSettings]),
    },
    RoleDef {
        name: "data_reader",
        qualifier: Qualifier::Collection,
        collection: Privileges::of(&[P::Read]),
        bucket: Privileges::of(&[P::SettingsRead]),
        global: Privileges::of(&[P::SystemSettings]),
    },
    RoleDef {
        name: "data_writer",
        qualifier: Qualifier::Collection,
        collection: Privileges::of(&[P::Insert, P::Upsert, P::Delete]),
        bucket: Privileges::of(&[P::SettingsRead]),
        global: Privileges::of(&[P::SystemSettings]),
    },
    RoleDef {
        name: "data_dcp_reader",
        qualifier: Qualifier::Collection,
        collection: Privileges::of(&[P::Read, P::DcpStream, P::SystemXattrRead]),
        bucket: Privileges::of(&[P::DcpProducer, P::SettingsRead]),
        global: Privileges::of(&[P::IdleConnection, P::SystemSettings]),
    },
    RoleDef {
        name: "data_backup",
        qualifier: Qualifier::Bucket,
        collection: DATA,
        bucket: Privileges::of(&[P::DcpProducer, P::DcpConsumer, P::SettingsRead]),
        global: Privileges::of(&[P::SystemSettings]),
    },
    RoleDef {
        name: "data_monitoring",
        qualifier: Qualifier::Collection,
        collection: Privileges::of(&[P::SimpleStats]),
        bucket: Privileges::of(&[P::SettingsRead]),
        global: Privileges::of(&[P::SystemSettings]),
    },
];

/// A bucket, scope or collection a role names: one by name, or any (`*`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// Any (`*`, or left out).
    Any,
    /// This one.
    Name(String),
}

impl Target {
    fn matches(&self, name: Option<&str>) -> bool {
        match (self, name) {
            (Target::Any, _) => true,
            (Target::Name(want), Some(name)) => want == name,
            (Target::Name(_), None) => false,
        }
    }

    fn parse(s: &str) -> Target {
        if s == "*" {
            Target::Any
        } else {
            Target::Name(s.to_owned())
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Any => f.write_str("*"),
            Target::Name(n) => f.write_str(n),
        }
    }
}

/// One granted role: its definition and what it names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Role {
    /// The role's index in [`ROLES`].
    def: usize,
    /// The bucket (`Any` for an unqualified role).
    pub bucket: Target,
    /// The scope (`Any` unless a collection role names one).
    pub scope: Target,
    /// The collection (`Any` unless a collection role names one).
    pub collection: Target,
}

/// Why a role string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoleError {
    /// No role has this name.
    #[error("unknown role {0:?}")]
    Unknown(String),
    /// The role's brackets or names are malformed.
    #[error("malformed role {role:?}: {why}")]
    Malformed {
        /// The role as written.
        role: String,
        /// What is wrong.
        why: &'static str,
    },
}

/// Whether `s` may name a bucket, scope or collection in a role: 1 to 251 characters of
/// ASCII letters, digits, `_`, `-`, `%` and `.` (the union of Couchbase's rules for
/// bucket, scope and collection names).
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 251
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'%' | b'.'))
}

impl Role {
    /// Parses one role as Couchbase writes it: `admin`, `bucket_admin[travel]`,
    /// `data_reader[*]`, `data_reader[travel:inventory]`, `data_reader[travel:inventory:airline]`.
    ///
    /// # Errors
    /// An unknown role, a qualifier the role does not take (or lacks), or a malformed name.
    pub fn parse(role: &str) -> Result<Role, RoleError> {
        let malformed = |why| RoleError::Malformed {
            role: role.to_owned(),
            why,
        };
        let (name, inner) = match role.split_once('[') {
            Some((n, rest)) => (
                n,
                Some(
                    rest.strip_suffix(']')
                        .ok_or_else(|| malformed("no closing bracket"))?,
                ),
            ),
            None => (role, None),
        };
        let def = ROLES
            .iter()
            .position(|d| d.name == name)
            .ok_or_else(|| RoleError::Unknown(role.to_owned()))?;
        let qualifier = ROLES[def].qualifier;
        let parts: Vec<&str> = match inner {
            None => Vec::new(),
            Some(i) => i.split(':').collect(),
        };
        match (qualifier, parts.len()) {
            (Qualifier::None, 0) | (Qualifier::Bucket, 1) | (Qualifier::Collection, 1..=3) => {}
            (Qualifier::None, _) => return Err(malformed("this role takes no bucket")),
            (_, 0) => return Err(malformed("this role needs a bucket, as role[bucket]")),
            (Qualifier::Bucket, _) => {
                return Err(malformed(
                    "this role takes a bucket, not a scope or collection",
                ));
            }
            (Qualifier::Collection, _) => {
                return Err(malformed("at most bucket:scope:collection"));
            }
        }
        let mut targets = [Target::Any, Target::Any, Target::Any];
        let mut any_seen = false;
        for (i, part) in parts.iter().enumerate() {
            if *part == "*" {
                any_seen = true;
                continue;
            }
            if any_seen {
                return Err(malformed("a name cannot follow *"));
            }
            if !valid_name(part) {
                return Err(malformed("invalid bucket, scope or collection name"));
            }
            targets[i] = Target::parse(part);
        }
        let [bucket, scope, collection] = targets;
        Ok(Role {
            def,
            bucket,
            scope,
            collection,
        })
    }

    /// The role's definition.
    #[must_use]
    pub fn def(&self) -> &'static RoleDef {
        &ROLES[self.def]
    }

    /// The role's name.
    #[must_use]
    pub fn name(&self) -> &'static str {
        self.def().name
    }

    /// Whether the role grants anything on `bucket`.
    fn covers_bucket(&self, bucket: &str) -> bool {
        self.bucket.matches(Some(bucket))
    }

    /// Whether the role's collection privileges hold for every collection of the buckets
    /// it names.
    fn bucket_wide(&self) -> bool {
        self.scope == Target::Any && self.collection == Target::Any
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let def = self.def();
        f.write_str(def.name)?;
        match def.qualifier {
            Qualifier::None => Ok(()),
            Qualifier::Bucket => write!(f, "[{}]", self.bucket),
            Qualifier::Collection => {
                write!(f, "[{}", self.bucket)?;
                if self.scope != Target::Any || self.collection != Target::Any {
                    write!(f, ":{}", self.scope)?;
                }
                if self.collection != Target::Any {
                    write!(f, ":{}", self.collection)?;
                }
                f.write_str("]")
            }
        }
    }
}

/// A user's roles.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Roles(Vec<Role>);

impl Roles {
    /// No role: the user can authenticate but do nothing that needs a privilege.
    #[must_use]
    pub fn none() -> Roles {
        Roles(Vec::new())
    }

    /// `admin`.
    #[must_use]
    pub fn admin() -> Roles {
        Roles(vec![Role {
            def: 0,
            bucket: Target::Any,
            scope: Target::Any,
            collection: Target::Any,
        }])
    }

    /// `bucket_full_access` on each of `buckets`: what epkv's bucket lists granted before
    /// roles existed.
    pub fn full_access<I, S>(buckets: I) -> Roles
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let def = ROLES
            .iter()
            .position(|d| d.name == "bucket_full_access")
            .unwrap_or_default();
        let mut roles: Vec<Role> = buckets
            .into_iter()
            .map(|b| Role {
                def,
                bucket: Target::Name(b.into()),
                scope: Target::Any,
                collection: Target::Any,
            })
            .collect();
        roles.sort();
        roles.dedup();
        Roles(roles)
    }

    /// Parses a comma-separated list (`admin,data_reader[travel]`); blanks are ignored,
    /// duplicates dropped.
    ///
    /// # Errors
    /// The first role that does not parse ([`Role::parse`]).
    pub fn parse_list(list: &str) -> Result<Roles, RoleError> {
        Self::from_strings(list.split(',').map(str::trim).filter(|r| !r.is_empty()))
    }

    /// Parses each of `roles`; duplicates are dropped.
    ///
    /// # Errors
    /// The first role that does not parse ([`Role::parse`]).
    pub fn from_strings<'a>(roles: impl IntoIterator<Item = &'a str>) -> Result<Roles, RoleError> {
        let mut parsed = roles
            .into_iter()
            .map(Role::parse)
            .collect::<Result<Vec<_>, _>>()?;
        parsed.sort();
        parsed.dedup();
        Ok(Roles(parsed))
    }

    /// The roles, in a stable order.
    #[must_use]
    pub fn roles(&self) -> &[Role] {
        &self.0
    }

    /// The roles as strings, as [`Role::parse`] reads them back.
    #[must_use]
    pub fn to_strings(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }

    /// Whether the user has no role.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The global privileges of these roles.
    #[must_use]
    pub fn global(&self) -> Privileges {
        self.0
            .iter()
            .fold(Privileges::NONE, |acc, r| acc.union(r.def().global))
    }

    /// The reference decision: whether these roles grant `privilege` on `bucket` (`None`
    /// for a global privilege asked without one), scope and collection (`None`: the
    /// request names none; a collection-level privilege then needs a grant on every
    /// collection of the bucket).
    #[must_use]
    pub fn allows(
        &self,
        privilege: Privilege,
        bucket: Option<&str>,
        scope: Option<&str>,
        collection: Option<&str>,
    ) -> bool {
        self.0.iter().any(|r| {
            let def = r.def();
            match privilege.level() {
                Level::Global => def.global.contains(privilege),
                Level::Bucket => {
                    def.bucket.contains(privilege) && bucket.is_some_and(|b| r.covers_bucket(b))
                }
                Level::Collection => {
                    def.collection.contains(privilege)
                        && bucket.is_some_and(|b| r.covers_bucket(b))
                        && match scope {
                            None => r.bucket_wide(),
                            Some(_) => {
                                r.scope.matches(scope)
                                    && match collection {
                                        None => r.collection == Target::Any,
                                        Some(_) => r.collection.matches(collection),
                                    }
                            }
                        }
                }
            }
        })
    }

    /// Whether these roles grant anything at all on `bucket` (who may select it: a
    /// bucket the user has no privilege on looks absent to them).
    #[must_use]
    pub fn may_use_bucket(&self, bucket: &str) -> bool {
        self.0.iter().any(|r| r.covers_bucket(bucket))
    }

    /// Whether these roles grant less than epkv granted the same user before privileges
    /// were checked: then every role that named a bucket (or `*`) gave full access to that
    /// bucket's data and DCP ([`LEGACY_BUCKET_ACCESS`]), and unqualified roles other than
    /// `admin` gave it on every bucket. The server logs such users once at start.
    #[must_use]
    pub fn narrower_than_bucket_lists(&self) -> bool {
        // A name no bucket can have stands for "any bucket" (roles on `*` cover it).
        const ANY: &str = "";
        self.0.iter().any(|r| {
            let bucket = match &r.bucket {
                Target::Any => ANY,
                Target::Name(b) => b.as_str(),
            };
            LEGACY_BUCKET_ACCESS
                .iter()
                .any(|p| !self.allows(p, Some(bucket), None, None))
        })
    }

    /// The privileges on `bucket`, precomputed for the per-request check.
    #[must_use]
    pub fn bucket_privileges(&self, bucket: &str) -> BucketPrivileges {
        let mut wide = self.global();
        let mut narrow = Vec::new();
        for r in self.0.iter().filter(|r| r.covers_bucket(bucket)) {
            let def = r.def();
            wide = wide.union(def.bucket);
            if r.bucket_wide() {
                wide = wide.union(def.collection);
            } else if !def.collection.is_empty() {
                narrow.push(NarrowGrant {
                    scope: r.scope.clone(),
                    collection: r.collection.clone(),
                    privileges: def.collection,
                });
            }
        }
        BucketPrivileges {
            usable: self.may_use_bucket(bucket),
            wide,
            narrow,
        }
    }
}

impl fmt::Display for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_strings().join(","))
    }
}

/// A grant that names a scope (and maybe a collection) of the bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NarrowGrant {
    scope: Target,
    collection: Target,
    privileges: Privileges,
}

/// A user's privileges on one bucket, precomputed when the connection selects it (and
/// again when the users change): the privileges that hold on the whole bucket as one bit
/// set, and the grants that name a scope or collection.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BucketPrivileges {
    /// Whether any role names the bucket (it may be selected).
    usable: bool,
    /// Global and bucket-level privileges, and the collection-level privileges granted on
    /// every collection of the bucket.
    wide: Privileges,
    /// Collection-level grants on a scope or a collection.
    narrow: Vec<NarrowGrant>,
}

impl BucketPrivileges {
    /// Everything, on any bucket (the open loopback mode, with no users).
    #[must_use]
    pub fn all() -> BucketPrivileges {
        BucketPrivileges {
            usable: true,
            wide: Privileges::ALL,
            narrow: Vec::new(),
        }
    }

    /// Whether the user may select the bucket.
    #[must_use]
    pub fn usable(&self) -> bool {
        self.usable
    }

    /// Whether `p` holds on the whole bucket: the check of every request that names no
    /// collection, and the fast path of those that do.
    #[must_use]
    #[inline]
    pub fn has(&self, p: Privilege) -> bool {
        self.wide.contains(p)
    }

    /// Whether some grant names a scope or collection, so a request on a collection may be
    /// allowed even when [`Self::has`] says no.
    #[must_use]
    #[inline]
    pub fn has_narrow_grants(&self) -> bool {
        !self.narrow.is_empty()
    }

    /// Whether `p` holds on collection `collection` of scope `scope`.
    #[must_use]
    pub fn has_in(&self, p: Privilege, scope: &str, collection: &str) -> bool {
        self.has(p)
            || (p.level() == Level::Collection
                && self.narrow.iter().any(|g| {
                    g.privileges.contains(p)
                        && g.scope.matches(Some(scope))
                        && g.collection.matches(Some(collection))
                }))
    }
}

fn names(set: Privileges) -> String {
    if set.is_empty() {
        "-".to_owned()
    } else {
        set.iter()
            .map(Privilege::name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The role table ([`ROLES`]) as docs/auth.md prints it: each role, how it is qualified
/// and the privileges it grants at each level.
#[must_use]
pub fn role_table() -> String {
    let mut s = String::from(
        "| role | written | on its collections | on its bucket | global |\n\
         |---|---|---|---|---|\n",
    );
    for d in ROLES {
        let written = match d.qualifier {
            Qualifier::None => format!("`{}`", d.name),
            Qualifier::Bucket => format!("`{}[b]`", d.name),
            Qualifier::Collection => format!("`{}[b:s:c]`", d.name),
        };
        s.push_str(&format!(
            "| {} | {written} | {} | {} | {} |\n",
            d.name,
            names(d.collection),
            names(d.bucket),
            names(d.global)
        ));
    }
    s
}

/// Every privilege with its level and the roles that grant it, as docs/auth.md prints it.
#[must_use]
pub fn privilege_table() -> String {
    let mut s = String::from("| privilege | level | granted by |\n|---|---|---|\n");
    for p in Privilege::ALL {
        let level = match p.level() {
            Level::Collection => "collection",
            Level::Bucket => "bucket",
            Level::Global => "global",
        };
        let by: Vec<&str> = ROLES
            .iter()
            .filter(|d| d.collection.union(d.bucket).union(d.global).contains(p))
            .map(|d| d.name)
            .collect();
        s.push_str(&format!("| {} | {level} | {} |\n", p.name(), by.join(", ")));
    }
    s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;
    use proptest::prelude::*;

    fn roles(list: &str) -> Roles {
        Roles::parse_list(list).unwrap()
    }

    #[test]
    fn the_table_has_every_role_once_and_privileges_at_their_level() {
        for (i, d) in ROLES.iter().enumerate() {
            assert!(ROLES[..i].iter().all(|o| o.name != d.name), "{}", d.name);
            assert!(d.collection.iter().all(|p| p.level() == Level::Collection));
            assert!(d.bucket.iter().all(|p| p.level() == Level::Bucket));
            assert!(d.global.iter().all(|p| p.level() == Level::Global));
        }
        assert_eq!(Privileges::ALL.iter().count(), Privilege::ALL.len());
        let admin = roles("admin");
        assert!(
            Privilege::ALL
                .iter()
                .all(|p| admin.allows(*p, Some("b"), None, None))
        );
    }

    #[test]
    fn roles_parse_and_print_as_couchbase_writes_them() {
        for r in [
            "admin",
            "ro_admin",
            "bucket_admin[travel]",
            "bucket_admin[*]",
            "data_reader[*]",
            "data_reader[travel]",
            "data_reader[travel:inventory]",
            "data_reader[travel:inventory:airline]",
            "data_writer[travel:inventory:airline]",
        ] {
            assert_eq!(Role::parse(r).unwrap().to_string(), r);
        }
        assert_eq!(
            Role::parse("data_reader[travel:*:*]").unwrap().to_string(),
            "data_reader[travel]"
        );
        for bad in [
            "root",
            "admin[travel]",
            "bucket_admin",
            "bucket_admin[a:b]",
            "data_reader[a:b:c:d]",
            "data_reader[*:s]",
            "data_reader[a b]",
            "data_reader[travel",
            "data_reader[]",
        ] {
            assert!(Role::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_reader_reads_and_a_writer_writes() {
        let reader = roles("data_reader[default]");
        assert!(reader.allows(P::Read, Some("default"), None, None));
        assert!(!reader.allows(P::Upsert, Some("default"), None, None));
        assert!(!reader.allows(P::Read, Some("travel"), None, None));
        let writer = roles("data_writer[default]");
        assert!(writer.allows(P::Upsert, Some("default"), Some("s"), Some("c")));
        assert!(!writer.allows(P::Read, Some("default"), Some("s"), Some("c")));
        let mon = roles("data_monitoring[default]");
        assert!(mon.allows(P::SimpleStats, Some("default"), None, None));
        assert!(!mon.allows(P::Read, Some("default"), None, None));
        assert!(mon.may_use_bucket("default") && !mon.may_use_bucket("travel"));
    }

    #[test]
    fn a_collection_role_holds_on_its_collection_only() {
        let r = roles("data_reader[default:s1:c1]");
        let p = r.bucket_privileges("default");
        assert!(p.usable());
        assert!(!p.has(P::Read) && p.has_narrow_grants());
        assert!(p.has_in(P::Read, "s1", "c1"));
        assert!(!p.has_in(P::Read, "s1", "c2"));
        assert!(!p.has_in(P::Read, "_default", "_default"));
        assert!(
            p.has(P::SettingsRead),
            "bucket-level privileges hold on the bucket"
        );
        let scope = roles("data_reader[default:s1]").bucket_privileges("default");
        assert!(scope.has_in(P::Read, "s1", "c9") && !scope.has_in(P::Read, "s2", "c1"));
    }

    #[test]
    fn legacy_bucket_lists_are_full_access() {
        let r = Roles::full_access(["travel", "beer", "travel"]);
        assert_eq!(
            r.to_strings(),
            ["bucket_full_access[beer]", "bucket_full_access[travel]"]
        );
        assert!(r.allows(P::Delete, Some("beer"), None, None));
        assert!(!r.allows(P::BucketCreate, None, None, None));
    }

    #[test]
    fn roles_narrower_than_the_older_full_access_are_recognised() {
        for wide in [
            "admin",
            "bucket_full_access[a]",
            "data_backup[a]",
            "bucket_full_access[*]",
            "data_reader[a],bucket_full_access[a]",
        ] {
            assert!(!roles(wide).narrower_than_bucket_lists(), "{wide}");
        }
        assert!(!Roles::full_access(["a", "b"]).narrower_than_bucket_lists());
        assert!(!Roles::none().narrower_than_bucket_lists());
        for narrow in [
            "data_reader[a]",
            "data_writer[a]",
            "data_monitoring[a]",
            "bucket_admin[a]",
            "data_dcp_reader[a]",
            "ro_admin",
            "security_admin",
            "cluster_admin",
            "bucket_full_access[a],data_reader[b]",
            "data_reader[a:s:c]",
        ] {
            assert!(roles(narrow).narrower_than_bucket_lists(), "{narrow}");
        }
    }

    fn doc_bounds(doc: &str, name: &str) -> (usize, usize) {
        let begin = format!("<!-- {name}:begin -->\n");
        let end = format!("<!-- {name}:end -->");
        let start = doc.find(&begin).map(|i| i + begin.len()).unwrap();
        let stop = doc[start..].find(&end).map(|i| start + i).unwrap();
        (start, stop)
    }

    /// Checks docs/auth.md's role and privilege tables against [`ROLES`]; with
    /// `EPKV_BLESS=1` in the environment it rewrites them instead.
    #[test]
    fn docs_auth_md_prints_the_role_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/auth.md");
        let mut doc = std::fs::read_to_string(path).unwrap();
        let tables = [
            ("role-table", role_table()),
            ("privilege-table", privilege_table()),
        ];
        if std::env::var_os("EPKV_BLESS").is_some() {
            for (name, table) in &tables {
                let (start, stop) = doc_bounds(&doc, name);
                doc.replace_range(start..stop, table);
            }
            std::fs::write(path, &doc).unwrap();
        }
        for (name, table) in &tables {
            let (start, stop) = doc_bounds(&doc, name);
            assert_eq!(
                &doc[start..stop],
                table,
                "docs/auth.md {name} is stale; run EPKV_BLESS=1 cargo test -p epkv-auth docs_auth_md"
            );
        }
    }

    const ROLE_NAMES: [&str; 11] = [
        "admin",
        "ro_admin",
        "security_admin",
        "cluster_admin",
        "bucket_admin",
        "bucket_full_access",
        "data_reader",
        "data_writer",
        "data_dcp_reader",
        "data_backup",
        "data_monitoring",
    ];

    fn name() -> impl Strategy<Value = Option<&'static str>> {
        prop_oneof![Just(None), Just(Some("a")), Just(Some("b"))]
    }

    fn role() -> impl Strategy<Value = String> {
        (0..ROLE_NAMES.len(), name(), name(), name()).prop_map(|(i, b, s, c)| {
            let def = &ROLES[ROLES.iter().position(|d| d.name == ROLE_NAMES[i]).unwrap()];
            match def.qualifier {
                Qualifier::None => def.name.to_owned(),
                Qualifier::Bucket => format!("{}[{}]", def.name, b.unwrap_or("*")),
                Qualifier::Collection => match (b, s, c) {
                    (Some(b), Some(s), Some(c)) => format!("{}[{b}:{s}:{c}]", def.name),
                    (Some(b), Some(s), None) => format!("{}[{b}:{s}]", def.name),
                    (Some(b), None, _) => format!("{}[{b}]", def.name),
                    (None, _, _) => format!("{}[*]", def.name),
                },
            }
        })
    }

    proptest! {
        /// The precomputed per-bucket check decides as the reference does, for every
        /// privilege on every collection.
        #[test]
        fn precomputed_privileges_decide_as_the_reference(
            list in proptest::collection::vec(role(), 0..4),
            bucket in prop_oneof![Just("a"), Just("b")],
            scope in prop_oneof![Just("a"), Just("b")],
            collection in prop_oneof![Just("a"), Just("b")],
        ) {
            let roles = Roles::from_strings(list.iter().map(String::as_str)).unwrap();
            let ctx = roles.bucket_privileges(bucket);
            prop_assert_eq!(ctx.usable(), roles.may_use_bucket(bucket));
            for p in Privilege::ALL {
                let (s, c) = (Some(scope), Some(collection));
                let want = match p.level() {
                    Level::Collection => roles.allows(p, Some(bucket), s, c),
                    _ => roles.allows(p, Some(bucket), None, None),
                };
                prop_assert_eq!(ctx.has_in(p, scope, collection), want, "{:?}", p);
                prop_assert_eq!(ctx.has(p), roles.allows(p, Some(bucket), None, None), "{:?}", p);
            }
            // Printing and parsing back gives the same roles.
            let again = Roles::from_strings(roles.to_strings().iter().map(String::as_str)).unwrap();
            prop_assert_eq!(again, roles);
        }
    }
}
