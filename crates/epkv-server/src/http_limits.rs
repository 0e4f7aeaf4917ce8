//! Connection limits of the HTTP listeners (management and metrics): a cap per source
//! address, a cap per listener with eviction, and the counters of what they refused.
//!
//! The per-listener cap never simply turns a new client away while connections that have
//! proved nothing hold the slots: when the listener is full, the new connection takes the
//! slot of an *untrusted* connection that is not inside a request (idle, or still sending
//! its headers). Among those, the victim is the oldest connection of the address group
//! holding the most connections, so a flood from many addresses is trimmed before a lone
//! client, and the newcomer itself is the last to go. A connection becomes *trusted* once a
//! request on it was answered to valid credentials; trusted connections are never evicted
//! (only the idle timeout closes them). When every connection is trusted or busy, the new
//! one is closed at once. This follows the "drop the oldest half-open" defence of
//! SYN-flood-protected stacks and nginx's `limit_conn`, adapted to connection slots.
//!
//! IPv6 clients are grouped by their /64 prefix (one host usually owns a whole /64);
//! IPv4 clients by their address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The limits one HTTP listener enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HttpLimits {
    /// Most connections open at once on the listener.
    pub(crate) max_connections: usize,
    /// Most connections open at once from one address group.
    pub(crate) max_per_address: usize,
    /// How long a connection may take to send complete request headers, from its accept
    /// or from the first byte of its next request.
    pub(crate) header_timeout: Duration,
    /// How long a keep-alive connection may stay idle between requests.
    pub(crate) idle_timeout: Duration,
}

impl Default for HttpLimits {
    /// The defaults of the `http-*` settings.
    fn default() -> Self {
        Self {
            max_connections: 256,
            max_per_address: 16,
            header_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// What the limits did on one listener since start. Relaxed atomics: each is an
/// independent counter read by a scrape.
#[derive(Debug, Default)]
pub(crate) struct HttpCounters {
    /// Connections accepted, refused ones included.
    pub(crate) accepted: AtomicU64,
    /// Connections open now.
    pub(crate) current: AtomicU64,
    /// Closed at once: their address group already had `max_per_address`.
    pub(crate) rejected_per_address: AtomicU64,
    /// Closed at once: the listener was full of trusted or busy connections.
    pub(crate) rejected_full: AtomicU64,
    /// Untrusted connections closed to make room for a new one.
    pub(crate) evicted: AtomicU64,
    /// Closed because their request headers did not arrive within the header timeout.
    pub(crate) header_timeouts: AtomicU64,
    /// Keep-alive connections closed after the idle timeout.
    pub(crate) idle_timeouts: AtomicU64,
}

impl HttpCounters {
    /// Adds one to `counter`.
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads `counter`.
    pub(crate) fn read(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The address group a connection counts against: the IPv4 address, or the /64 of an IPv6
/// address (an IPv4-mapped IPv6 address counts as its IPv4 address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum AddrGroup {
    /// One IPv4 address.
    V4(u32),
    /// One IPv6 /64 prefix.
    V6(u64),
}

impl From<IpAddr> for AddrGroup {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(a) => Self::V4(a.into()),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Self::V4(v4.into()),
                None => Self::V6((u128::from(a) >> 64) as u64),
            },
        }
    }
}

/// What the table asks of a connection's payload when the listener is full.
pub(crate) trait Evictable {
    /// Whether the connection may give its slot to a newcomer now: it is untrusted (no
    /// request on it was answered to valid credentials) and not inside a request. Called
    /// with the table locked.
    fn evictable(&self) -> bool;
}

/// The answer to a new connection.
#[derive(Debug)]
pub(crate) enum Admission<T> {
    /// Serve it; `id` names it to [`ConnTable::remove`]. `victim` is the payload of the
    /// connection evicted to make room, to be told to close.
    Admitted {
        /// Its id in the table.
        id: u64,
        /// The evicted connection's payload, if one was evicted.
        victim: Option<T>,
    },
    /// Close it: its address group is at `max_per_address`.
    RejectedPerAddress,
    /// Close it: the listener is full and nothing can be evicted.
    RejectedFull,
}

struct Entry<T> {
    group: AddrGroup,
    payload: T,
}

/// The open connections of one listener, by id (ids grow with accept order, so a smaller
/// id is an older connection). `T` is what the serving task needs to be told to close.
pub(crate) struct ConnTable<T> {
    limits: HttpLimits,
    next_id: u64,
    conns: HashMap<u64, Entry<T>>,
    per_group: HashMap<AddrGroup, usize>,
}

impl<T: Evictable> ConnTable<T> {
    /// An empty table enforcing `limits`.
    pub(crate) fn new(limits: HttpLimits) -> Self {
        Self {
            limits,
            next_id: 0,
            conns: HashMap::new(),
            per_group: HashMap::new(),
        }
    }

    /// Connections in the table.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.conns.len()
    }

    /// Decides on a new connection from `ip`, evicting an untrusted idle one when the
    /// listener is full. The evicted one leaves the table at once.
    pub(crate) fn admit(&mut self, ip: IpAddr, payload: T) -> Admission<T> {
        let group = AddrGroup::from(ip);
        if self.per_group.get(&group).copied().unwrap_or(0) >= self.limits.max_per_address {
            return Admission::RejectedPerAddress;
        }
        let mut victim = None;
        if self.conns.len() >= self.limits.max_connections {
            let Some(id) = self.pick_victim() else {
                return Admission::RejectedFull;
            };
            victim = self.remove(id);
        }
        let id = self.next_id;
        self.next_id += 1;
        *self.per_group.entry(group).or_insert(0) += 1;
        self.conns.insert(id, Entry { group, payload });
        Admission::Admitted { id, victim }
    }

    /// Removes connection `id` (a no-op when it was evicted already); returns its payload.
    pub(crate) fn remove(&mut self, id: u64) -> Option<T> {
        let e = self.conns.remove(&id)?;
        if let Some(n) = self.per_group.get_mut(&e.group) {
            *n -= 1;
            if *n == 0 {
                self.per_group.remove(&e.group);
            }
        }
        Some(e.payload)
    }

    /// The untrusted, not busy connection of the most crowded address group, oldest first.
    fn pick_victim(&self) -> Option<u64> {
        self.conns
            .iter()
            .filter(|(_, e)| e.payload.evictable())
            .max_by_key(|(id, e)| {
                let crowd = self.per_group.get(&e.group).copied().unwrap_or(0);
                (crowd, std::cmp::Reverse(**id))
            })
            .map(|(id, _)| *id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    /// A connection's state as its serving task would set it.
    #[derive(Debug, Default)]
    struct Flags {
        trusted: AtomicBool,
        busy: AtomicBool,
    }

    /// A tagged test connection.
    #[derive(Debug)]
    struct Conn(u64, Arc<Flags>);

    impl Evictable for Conn {
        fn evictable(&self) -> bool {
            !self.1.trusted.load(Ordering::Relaxed) && !self.1.busy.load(Ordering::Relaxed)
        }
    }

    fn conn(tag: u64) -> Conn {
        Conn(tag, Arc::default())
    }

    fn limits(max_connections: usize, max_per_address: usize) -> HttpLimits {
        HttpLimits {
            max_connections,
            max_per_address,
            ..HttpLimits::default()
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn must_admit(t: &mut ConnTable<Conn>, from: IpAddr, tag: u64) -> (u64, Arc<Flags>) {
        let flags = Arc::new(Flags::default());
        match t.admit(from, Conn(tag, Arc::clone(&flags))) {
            Admission::Admitted { id, victim: None } => (id, flags),
            other => panic!("expected a plain admission, got {other:?}"),
        }
    }

    #[test]
    fn one_address_is_held_to_its_limit_and_others_are_not() {
        let mut t = ConnTable::new(limits(100, 2));
        must_admit(&mut t, ip(2), 0);
        let (second, _) = must_admit(&mut t, ip(2), 1);
        assert!(matches!(
            t.admit(ip(2), conn(2)),
            Admission::RejectedPerAddress
        ));
        must_admit(&mut t, ip(3), 3);
        t.remove(second);
        must_admit(&mut t, ip(2), 4);
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn ipv6_addresses_of_one_prefix_share_a_limit() {
        let mut t = ConnTable::new(limits(100, 1));
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::2".parse().unwrap();
        let other: IpAddr = "2001:db8:0:1::1".parse().unwrap();
        must_admit(&mut t, a, 0);
        assert!(matches!(t.admit(b, conn(1)), Admission::RejectedPerAddress));
        must_admit(&mut t, other, 2);
        let mapped: IpAddr = "::ffff:127.0.0.9".parse().unwrap();
        must_admit(&mut t, mapped, 3);
        assert!(matches!(
            t.admit(ip(9), conn(4)),
            Admission::RejectedPerAddress
        ));
    }

    #[test]
    fn a_full_listener_evicts_the_oldest_of_the_most_crowded_address() {
        let mut t = ConnTable::new(limits(4, 3));
        must_admit(&mut t, ip(5), 50);
        must_admit(&mut t, ip(2), 20);
        must_admit(&mut t, ip(2), 21);
        must_admit(&mut t, ip(3), 30);
        match t.admit(ip(9), conn(90)) {
            Admission::Admitted {
                victim: Some(v), ..
            } => assert_eq!(v.0, 20, "the oldest of 127.0.0.2, which holds two"),
            other => panic!("{other:?}"),
        }
        assert_eq!(t.len(), 4);
        // Every group holds one now: the oldest of all goes next.
        match t.admit(ip(10), conn(100)) {
            Admission::Admitted {
                victim: Some(v), ..
            } => assert_eq!(v.0, 50),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn trusted_and_busy_connections_are_never_evicted() {
        let mut t = ConnTable::new(limits(2, 2));
        let (_, trusted) = must_admit(&mut t, ip(2), 0);
        let (busy_id, busy) = must_admit(&mut t, ip(2), 1);
        trusted.trusted.store(true, Ordering::Relaxed);
        busy.busy.store(true, Ordering::Relaxed);
        assert!(matches!(t.admit(ip(3), conn(2)), Admission::RejectedFull));
        busy.busy.store(false, Ordering::Relaxed);
        match t.admit(ip(3), conn(3)) {
            Admission::Admitted {
                victim: Some(v), ..
            } => assert_eq!(v.0, 1),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            t.remove(busy_id).map(|v| v.0),
            None,
            "an evicted connection left already"
        );
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn a_flood_from_many_addresses_leaves_room_for_a_newcomer() {
        let mut t = ConnTable::new(limits(64, 16));
        let mut evicted = 0;
        for n in 0..2000_u64 {
            let from = ip(2 + u8::try_from(n % 200).unwrap());
            match t.admit(from, conn(n)) {
                Admission::Admitted { victim, .. } => evicted += u64::from(victim.is_some()),
                Admission::RejectedPerAddress => {}
                Admission::RejectedFull => panic!("untrusted idle connections are evictable"),
            }
        }
        assert_eq!(t.len(), 64);
        assert_eq!(evicted, 2000 - 64);
        assert!(matches!(
            t.admit(ip(250), conn(9999)),
            Admission::Admitted {
                victim: Some(_),
                ..
            }
        ));
    }
}
