//! [`BucketList`]: the `buckets` setting, the buckets the server creates besides
//! `default`.

use crate::byte_size::ByteSize;
use std::fmt;
use std::str::FromStr;

/// One configured bucket: a name and, optionally, its own memory quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BucketSpec {
    /// The bucket name (Couchbase's rule: see `epkv_frontend::is_valid_bucket_name`).
    pub(crate) name: String,
    /// The bucket's memory quota; `None` uses the `memory-quota` setting.
    pub(crate) quota: Option<ByteSize>,
    /// The bucket's eviction policy; `None` uses the `eviction-policy` setting.
    pub(crate) eviction: Option<crate::settings::Eviction>,
}

/// The buckets to create, written `NAME[=QUOTA][/EVICTION],...` (for example
/// `travel,beer=256MiB,logs/full`). `default` always exists whether listed or not; listing it only
/// gives it a quota. Names must be valid and distinct.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct BucketList(pub(crate) Vec<BucketSpec>);

impl FromStr for BucketList {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut specs: Vec<BucketSpec> = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (part, eviction) = match part.split_once('/') {
                Some((p, e)) => (p.trim(), Some(e.trim().parse()?)),
                None => (part, None),
            };
            let (name, quota) = match part.split_once('=') {
                Some((n, q)) => (
                    n.trim(),
                    Some(q.trim().parse::<ByteSize>().map_err(|e| e.to_string())?),
                ),
                None => (part, None),
            };
            if !epkv_frontend::is_valid_bucket_name(name) {
                return Err(format!(
                    "invalid bucket name {name:?}: use 1-100 letters, digits, '.', '_', '-' \
                     or '%', not starting with '.'"
                ));
            }
            if specs.iter().any(|b| b.name == name) {
                return Err(format!("bucket {name:?} is listed twice"));
            }
            specs.push(BucketSpec {
                name: name.to_owned(),
                quota,
                eviction,
            });
        }
        Ok(Self(specs))
    }
}

impl fmt::Display for BucketList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&b.name)?;
            if let Some(q) = b.quota {
                write!(f, "={}", q.bytes())?;
            }
            if let Some(e) = b.eviction {
                let name = match e.0 {
                    epkv_engine::EvictionPolicy::Value => "value",
                    epkv_engine::EvictionPolicy::Full => "full",
                };
                write!(f, "/{name}")?;
            }
        }
        Ok(())
    }
}

impl<'de> serde::Deserialize<'de> for BucketList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A setting whose value must not be shown: `Debug` and `Display` print `<redacted>`.
#[derive(Clone, PartialEq, Eq, Default)]
pub(crate) struct Secret(String);

impl Secret {
    /// The secret text.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "<redacted>"
        })
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_owned()))
    }
}

impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_lists_parse_names_and_quotas() {
        let l: BucketList = "travel, beer=256MiB,, logs/Full".parse().unwrap();
        let full = Some(crate::settings::Eviction(epkv_engine::EvictionPolicy::Full));
        assert_eq!(
            l.0,
            vec![
                BucketSpec {
                    name: "travel".into(),
                    quota: None,
                    eviction: None,
                },
                BucketSpec {
                    name: "beer".into(),
                    quota: Some(ByteSize(256 << 20)),
                    eviction: None,
                },
                BucketSpec {
                    name: "logs".into(),
                    quota: None,
                    eviction: full,
                },
            ]
        );
        assert_eq!(l.to_string(), "travel,beer=268435456,logs/full");
        let l: BucketList = "x=1MiB/value".parse().unwrap();
        assert_eq!(l.to_string(), "x=1048576/value");
        assert_eq!("".parse::<BucketList>().unwrap(), BucketList::default());
        assert!("a,a".parse::<BucketList>().unwrap_err().contains("twice"));
        assert!(
            "a/b"
                .parse::<BucketList>()
                .unwrap_err()
                .contains("eviction")
        );
        assert!("a=lots".parse::<BucketList>().is_err());
    }

    #[test]
    fn secrets_are_not_printed() {
        let s: Secret = "hunter2".parse().unwrap();
        assert_eq!(format!("{s:?}"), "<redacted>");
        assert_eq!(s.expose(), "hunter2");
    }
}

/// One configured collection: `BUCKET:SCOPE.COLLECTION[=MAXTTL]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CollectionSpec {
    /// The bucket.
    pub(crate) bucket: String,
    /// The scope (created if missing).
    pub(crate) scope: String,
    /// The collection.
    pub(crate) name: String,
    /// Its maxTTL in seconds (0: none).
    pub(crate) max_ttl: u32,
}

/// The collections to create at startup if missing, written
/// `BUCKET:SCOPE.COLLECTION[=MAXTTL],...` (for example
/// `travel:inventory.airline,travel:inventory.hotel=3600`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct CollectionList(pub(crate) Vec<CollectionSpec>);

impl FromStr for CollectionList {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (path, ttl) = match part.split_once('=') {
                Some((p, t)) => (
                    p.trim(),
                    t.trim()
                        .parse::<u32>()
                        .map_err(|_| format!("{part:?}: the maxTTL must be whole seconds"))?,
                ),
                None => (part, 0),
            };
            let (bucket, rest) = path
                .split_once(':')
                .ok_or_else(|| format!("{part:?}: write BUCKET:SCOPE.COLLECTION"))?;
            let (scope, name) = rest
                .split_once('.')
                .ok_or_else(|| format!("{part:?}: write BUCKET:SCOPE.COLLECTION"))?;
            let valid = |n: &str| n == "_default" || epkv_engine::collections::valid_name(n);
            if !valid(scope) || !epkv_engine::collections::valid_name(name) {
                return Err(format!(
                    "{part:?}: scope and collection names are 1-251 characters of A-Z, a-z, \
                     0-9, _, - and %, not starting with _ or %"
                ));
            }
            out.push(CollectionSpec {
                bucket: bucket.trim().to_owned(),
                scope: scope.to_owned(),
                name: name.to_owned(),
                max_ttl: ttl,
            });
        }
        Ok(Self(out))
    }
}

impl fmt::Display for CollectionList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}:{}.{}", c.bucket, c.scope, c.name)?;
            if c.max_ttl > 0 {
                write!(f, "={}", c.max_ttl)?;
            }
        }
        Ok(())
    }
}

impl<'de> serde::Deserialize<'de> for CollectionList {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod collection_list_tests {
    use super::*;

    #[test]
    fn collection_lists_parse_and_print_back() {
        let l: CollectionList = "travel:inventory.airline, travel:inventory.hotel=3600"
            .parse()
            .unwrap();
        assert_eq!(l.0.len(), 2);
        assert_eq!(l.0[1].max_ttl, 3600);
        assert_eq!(
            l.to_string(),
            "travel:inventory.airline,travel:inventory.hotel=3600"
        );
        assert!("nocolon.x".parse::<CollectionList>().is_err());
        assert!("b:nodot".parse::<CollectionList>().is_err());
        assert!("b:s._bad".parse::<CollectionList>().is_err());
        assert!("b:s.c=soon".parse::<CollectionList>().is_err());
        assert!("b:_default.c".parse::<CollectionList>().is_ok());
    }
}
