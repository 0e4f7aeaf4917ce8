//! The administration family: the cluster map (GET_CLUSTER_CONFIG, and the map a
//! NOT_MY_VBUCKET reply carries), vBucket states (SET_VBUCKET, GET_VBUCKET), the error
//! map, VERSION, NOOP and VERBOSITY, QUIT, and the test-only ADJUST_TIMEOFDAY.
//!
//! The cluster map itself comes from the [`epkv_engine_api::ClusterView`] the front end
//! was given (`epkv-cluster` builds it); the calls into it stay here, thin.

use crate::dispatch::{Call, DataCall, Flow, unexpected};
use crate::frontend::Shared;
use crate::response::{put_error_text, put_status, put_success};
use crate::session::{MapNotifications, SelectedBucket, Session};
use crate::status_map::engine_status_to_wire;
use bytes::BytesMut;
use epkv_engine_api::EngineStatus;
use epkv_protocol::{
    Command, Status, clustermap_change_notification_len, error_map_json,
    put_clustermap_change_notification,
};
use epkv_types::{Cas, Datatype};

/// QUIT, QUITQ: closes the connection after the replies queued so far (QUITQ without
/// its own).
pub(crate) fn quit(_: &mut Session, c: Call<'_>, cmd: Command<'_>) -> Flow {
    let Command::Quit { quiet } = cmd else {
        unexpected(c.out, c.to);
        return Flow::Continue;
    };
    if !quiet {
        put_status(c.out, c.to, Status::Success, &[]);
    }
    Flow::Close
}

/// NOOP, and VERBOSITY (accepted and ignored, as memcached does).
pub(crate) fn noop(_: &mut Session, c: Call<'_>, cmd: Command<'_>) -> Flow {
    match cmd {
        Command::Noop | Command::Verbosity { .. } => put_status(c.out, c.to, Status::Success, &[]),
        _ => unexpected(c.out, c.to),
    }
    Flow::Continue
}

/// VERSION: the server's version string.
pub(crate) fn version(_: &mut Session, c: Call<'_>, cmd: Command<'_>) -> Flow {
    let Command::Version = cmd else {
        unexpected(c.out, c.to);
        return Flow::Continue;
    };
    put_success(
        c.out,
        c.to,
        Cas::ANY,
        Datatype::RAW,
        &[],
        &[],
        c.shared.config.version.as_bytes(),
    );
    Flow::Continue
}

/// GET_ERROR_MAP: the error map, at the highest version both sides know.
pub(crate) fn get_error_map(s: &mut Session, c: Call<'_>, cmd: Command<'_>) -> Flow {
    let Command::GetErrorMap { version } = cmd else {
        unexpected(c.out, c.to);
        return Flow::Continue;
    };
    let (_, map) = error_map_json(version);
    put_success(
        c.out,
        c.to,
        Cas::ANY,
        s.datatype_out(Datatype::JSON),
        &[],
        &[],
        map.as_bytes(),
    );
    Flow::Continue
}

/// GET_CLUSTER_CONFIG: the selected bucket's config, or the global config when no
/// bucket is selected; an empty value when the client already has this version, and
/// KeyNotFound when the front end serves no map (as KV-Engine before ns_server sets one).
pub(crate) fn get_cluster_config(s: &mut Session, c: Call<'_>, cmd: Command<'_>) -> Flow {
    let Call {
        shared, out, to, ..
    } = c;
    let Command::GetClusterConfig { known_version } = cmd else {
        unexpected(out, to);
        return Flow::Continue;
    };
    let Some(version) = shared.cluster_version() else {
        s.fail_wire(out, to, Status::KeyEnoent, &[]);
        return Flow::Continue;
    };
    // As kv_engine: the client has this version now, or told us it has a newer one.
    s.map_sent
        .set(Some(known_version.map_or(version, |k| k.max(version))));
    if let Some(known) = known_version
        && known >= version
    {
        put_status(out, to, Status::Success, &[]);
        return Flow::Continue;
    }
    let config = match &s.bucket {
        Some(b) => bucket_map(s, shared, b),
        None => shared.global_config(s.local),
    };
    put_success(
        out,
        to,
        Cas::ANY,
        s.datatype_out(Datatype::JSON),
        &[],
        &[],
        config.unwrap_or_default().as_bytes(),
    );
    Flow::Continue
}

/// The cluster map of bucket `b`, naming this node by the address the client connected
/// to: what GET_CLUSTER_CONFIG answers and a NOT_MY_VBUCKET reply carries; `None` when
/// the front end serves no map.
pub(crate) fn bucket_map(s: &Session, shared: &Shared, b: &SelectedBucket) -> Option<String> {
    shared.bucket_config(&b.name, &*b.engine, s.local)
}

impl Session {
    /// The cluster map moved on: appends the ClustermapChangeNotification server request
    /// this connection asked for (HELLO 0x0d or 0x1f) to `out`, between two whole
    /// replies. A connection with a bucket is sent that bucket's map (key: its name),
    /// unless it was already sent this version; one without a bucket the global config
    /// (empty key), as kv_engine pushes it to every subscribed connection. The brief
    /// form carries no value.
    pub(crate) fn notify_map_change(&self, shared: &Shared, out: &mut BytesMut) {
        if self.map_notifications == MapNotifications::None {
            return;
        }
        let Some(version) = shared.cluster_version() else {
            return;
        };
        let full = self.map_notifications == MapNotifications::Full;
        let (bucket, map): (&[u8], Option<String>) = match &self.bucket {
            Some(b) => {
                if b.dropped.load(std::sync::atomic::Ordering::Relaxed)
                    || self.map_sent.get().is_some_and(|sent| sent >= version)
                {
                    return;
                }
                self.map_sent.set(Some(version));
                let map = if full {
                    bucket_map(self, shared, b)
                } else {
                    None
                };
                (b.name.as_bytes(), map)
            }
            None => {
                let map = if full {
                    shared.global_config(self.local)
                } else {
                    None
                };
                (&[], map)
            }
        };
        let map = map.unwrap_or_default();
        let datatype = if map.is_empty() {
            Datatype::RAW
        } else {
            self.datatype_out(Datatype::JSON)
        };
        out.reserve(clustermap_change_notification_len(bucket.len(), map.len()));
        if let Err(e) =
            put_clustermap_change_notification(out, version, bucket, datatype, map.as_bytes())
        {
            tracing::warn!(error = %e, "cluster map notification does not encode");
        }
    }
}

/// ADJUST_TIMEOFDAY: shifts the clock of every bucket (testing mode only).
pub(crate) fn adjust_timeofday(_: &mut Session, c: Call<'_>, cmd: Command<'_>) -> Flow {
    let Call {
        shared, out, to, ..
    } = c;
    let Command::AdjustTimeofday { offset_secs } = cmd else {
        unexpected(out, to);
        return Flow::Continue;
    };
    if !shared.config.testing {
        put_error_text(out, to, Status::NotSupported);
        return Flow::Continue;
    }
    let result = shared
        .buckets
        .iter()
        .try_for_each(|(_, engine)| engine.adjust_time(offset_secs));
    match result {
        Ok(()) => put_status(out, to, Status::Success, &[]),
        Err(e) => put_status(out, to, engine_status_to_wire(e), &[]),
    }
    Flow::Continue
}

/// SET_VBUCKET: a vBucket's new state; the cluster map revision grows.
pub(crate) fn set_vbucket(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::SetVbucket { state } = cmd else {
        return unexpected(out, to);
    };
    match engine.set_vbucket_state(vbid, state) {
        Ok(()) => {
            // The map changed: clients must see a newer revision.
            shared.bump_cluster_rev();
            put_status(out, to, Status::Success, &[]);
        }
        Err(e) => s.fail(shared, out, to, e, &[]),
    }
}

/// GET_VBUCKET: a vBucket's state.
pub(crate) fn get_vbucket(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        vbid,
        out,
        to,
        ..
    } = c;
    let Command::GetVbucket = cmd else {
        return unexpected(out, to);
    };
    match engine.vbucket_state(vbid) {
        Some(state) => {
            let value = u32::from(state as u8).to_be_bytes();
            put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &value);
        }
        None => s.fail(shared, out, to, EngineStatus::NotMyVbucket, &[]),
    }
}
