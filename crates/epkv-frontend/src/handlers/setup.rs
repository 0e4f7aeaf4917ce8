//! The session-setup family: HELLO (feature negotiation), SASL authentication (the
//! exchange itself is [`crate::sasl`]'s) and SELECT_BUCKET.

use crate::access::Access;
use crate::dispatch::{Call, Flow, unexpected};
use crate::frontend::Shared;
use crate::response::{ReplyTo, put_error_text, put_status, put_success};
use crate::session::{MapNotifications, SelectedBucket, Session};
use bytes::BytesMut;
use epkv_protocol::{Command, Feature, HelloFeatures, Status};
use epkv_types::{Cas, Datatype};
use std::sync::Arc;

/// HELLO: the features the client asked for that epkv implements.
pub(crate) fn hello(s: &mut Session, c: Call<'_>, cmd: Command<'_>) -> Flow {
    match cmd {
        Command::Hello { agent, features } => s.hello(agent, features, c.out, c.to),
        _ => unexpected(c.out, c.to),
    }
    Flow::Continue
}

/// SASL_LIST_MECHS: the mechanisms epkv offers.
pub(crate) fn sasl_list_mechs(s: &mut Session, c: Call<'_>, cmd: Command<'_>) -> Flow {
    match cmd {
        Command::SaslListMechs => s.sasl_list_mechs(c.shared, c.out, c.to),
        _ => unexpected(c.out, c.to),
    }
    Flow::Continue
}

/// SASL_AUTH: starts an authentication (possibly left pending, see
/// [`crate::sasl::PendingAuth`]).
pub(crate) fn sasl_auth(s: &mut Session, c: Call<'_>, cmd: Command<'_>) -> Flow {
    match cmd {
        Command::SaslAuth { mechanism, data } => {
            s.sasl_auth(c.shared, mechanism, data, c.out, c.to)
        }
        _ => {
            unexpected(c.out, c.to);
            Flow::Continue
        }
    }
}

/// SASL_STEP: continues a multi-step authentication.
pub(crate) fn sasl_step(s: &mut Session, c: Call<'_>, cmd: Command<'_>) -> Flow {
    match cmd {
        Command::SaslStep { mechanism, data } => {
            s.sasl_step(c.shared, mechanism, data, c.out, c.to)
        }
        _ => {
            unexpected(c.out, c.to);
            Flow::Continue
        }
    }
}

/// SELECT_BUCKET: the bucket the connection's data requests go to from now on.
pub(crate) fn select_bucket(s: &mut Session, c: Call<'_>, cmd: Command<'_>) -> Flow {
    match cmd {
        Command::SelectBucket { name } => s.select_bucket(c.shared, name, c.out, c.to),
        _ => unexpected(c.out, c.to),
    }
    Flow::Continue
}

impl Session {
    /// HELLO: agrees to the requested features epkv implements, in the client's order.
    fn hello(
        &mut self,
        agent: &[u8],
        features: HelloFeatures<'_>,
        out: &mut BytesMut,
        to: ReplyTo,
    ) {
        // As kv_engine: the notifications need Duplex (asked for in the same HELLO), else
        // the whole HELLO is refused and nothing changes.
        if let Some(f) = features.known().find(|f| {
            matches!(
                f,
                Feature::ClustermapChangeNotification | Feature::ClustermapChangeNotificationBrief
            )
        }) && !features.known().any(|f| f == Feature::Duplex)
        {
            let context = format!("{} needs {}", f.name(), Feature::Duplex.name());
            self.put_error_context(out, to, Status::Einval, &context);
            return;
        }
        // The brief form wins when both are asked for (kv_engine drops the full one).
        let brief = features
            .known()
            .any(|f| f == Feature::ClustermapChangeNotificationBrief);
        let was_notified = self.map_notifications != MapNotifications::None;
        self.vbucket_aware = true;
        self.duplex = false;
        self.map_notifications = MapNotifications::None;
        self.dedupe_nmvb = false;
        self.mutation_seqno = false;
        self.json = false;
        self.xerror = false;
        self.snappy = false;
        self.xattr = false;
        self.collections = false;
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
                Feature::Xerror => self.xerror = true,
                Feature::Snappy => self.snappy = true,
                Feature::Xattr => self.xattr = true,
                Feature::Collections => self.collections = true,
                Feature::Duplex => self.duplex = true,
                Feature::DedupeNotMyVbucketClustermap => self.dedupe_nmvb = true,
                Feature::ClustermapChangeNotification if brief => continue,
                Feature::ClustermapChangeNotification => {
                    self.map_notifications = MapNotifications::Full;
                }
                Feature::ClustermapChangeNotificationBrief => {
                    self.map_notifications = MapNotifications::Brief;
                }
                // AltRequestSupport, SyncReplication, SelectBucket and PreserveTtl are
                // informational (as in kv_engine): magic 0x08, durability and PreserveTtl
                // frames and SELECT_BUCKET are accepted either way.
                _ => {}
            }
            agreed.push(f);
        }
        if !was_notified && self.map_notifications != MapNotifications::None {
            // Only changes from now on are notified.
            self.map_changes.mark_unchanged();
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

    /// SELECT_BUCKET. As KV-Engine, so bucket names cannot be probed: an authenticated
    /// user gets 0x01 KeyEnoent both for a bucket that does not exist and for one none of
    /// its roles names; a connection that has not authenticated gets 0x24 Eaccess, except
    /// in the open loopback mode, where every bucket may be selected. On success the connection's
    /// privileges become the user's on the new bucket.
    fn select_bucket(&mut self, shared: &Shared, name: &[u8], out: &mut BytesMut, to: ReplyTo) {
        let absent = if self.user.is_some() {
            Status::KeyEnoent
        } else {
            Status::Eaccess
        };
        let found = std::str::from_utf8(name)
            .ok()
            .and_then(|n| shared.buckets.live(n).map(|e| (n, e)));
        let Some((name, live)) = found else {
            tracing::debug!(bucket = %String::from_utf8_lossy(name), user = self.user.as_deref().unwrap_or(""), "SELECT_BUCKET: no such bucket");
            put_error_text(out, to, absent);
            return;
        };
        let access = Access::compute(shared, self.user.as_deref(), Some(name));
        let usable = match &self.user {
            Some(_) => access.usable(),
            None => shared.open_default,
        };
        if !usable {
            tracing::info!(
                bucket = name,
                user = self.user.as_deref().unwrap_or(""),
                "SELECT_BUCKET refused: no access"
            );
            put_error_text(out, to, absent);
            return;
        }
        self.access = access;
        self.bucket = Some(SelectedBucket {
            name: Arc::from(name),
            engine: live.engine,
            dropped: live.dropped,
        });
        // Nothing of the new bucket's map was sent yet (kv_engine resets the pushed
        // revision too).
        self.map_sent.set(None);
        put_status(out, to, Status::Success, &[]);
    }
}
