//! The DCP family: the messages a consumer sends a producer connection (DCP_OPEN,
//! DCP_CONTROL, GET_FAILOVER_LOG, STREAM_REQ, CLOSE_STREAM, NOOP, BUFFER_ACKNOWLEDGEMENT,
//! SEQNO_ACKNOWLEDGED). Each is decoded here with `epkv_protocol::dcp`, not
//! [`epkv_protocol::Command::decode`]; the producer itself is [`crate::dcp::Producer`].
//!
//! Every DCP message needs a selected bucket (NoBucket otherwise), and all but DCP_OPEN,
//! GET_FAILOVER_LOG and NOOP need the connection to be a producer (Einval otherwise):
//! the opcode table's checks. The DCP messages only a consumer takes have no row; they
//! are answered by [`unregistered`], with the same checks.

use crate::dcp::{Producer, StreamFilter, answer, apply_stream_flags, collection_filter};
use crate::dispatch::Call;
use crate::dispatch::table::Needs;
use crate::response::{ReplyTo, put_error_text, put_success};
use crate::session::{SelectedBucket, Session};
use bytes::BytesMut;
use epkv_auth::Privilege;
use epkv_engine_api::DcpStreamRequest;
use epkv_protocol::Status;
use epkv_protocol::dcp as wire;
use epkv_types::{Cas, Datatype};

/// Answers a DCP request that needs an open producer on a connection without one.
pub(crate) fn not_a_producer(out: &mut BytesMut, to: ReplyTo) {
    put_error_text(out, to, Status::Einval);
}

/// DCP_OPEN: makes the connection a producer (epkv has no consumer yet).
pub(crate) fn open(s: &mut Session, c: Call<'_>, bucket: &SelectedBucket) {
    let Call {
        shared,
        req,
        out,
        to,
    } = c;
    let Ok(open) = wire::DcpOpen::decode(req.extras) else {
        return answer(out, to, Status::Einval);
    };
    // As KV-Engine: a producer needs DcpProducer, anything else (a consumer) DcpConsumer.
    let needed = if open.flags & wire::OPEN_PRODUCER != 0 {
        Privilege::DcpProducer
    } else {
        Privilege::DcpConsumer
    };
    if !s.access.has(needed) {
        return s.deny(out, to, needed);
    }
    if open.flags & wire::OPEN_PRODUCER == 0 {
        // Consumers and notifiers: epkv has no DCP consumer yet.
        return answer(out, to, Status::NotSupported);
    }
    if s.dcp.is_some() {
        return answer(out, to, Status::Einval);
    }
    let Ok(name) = std::str::from_utf8(req.key) else {
        return answer(out, to, Status::Einval);
    };
    tracing::info!(name, bucket = %bucket.name, flags = open.flags, "DCP producer opened");
    s.dcp = Some(Producer::new(
        &shared.dcp,
        &bucket.name,
        bucket.engine.clone(),
        name,
        open.flags,
        s.collections,
    ));
    answer(out, to, Status::Success);
}

/// DCP_GET_FAILOVER_LOG: the header's vBucket's failover log.
pub(crate) fn get_failover_log(s: &mut Session, c: Call<'_>, bucket: &SelectedBucket) {
    let Call {
        shared,
        req,
        out,
        to,
    } = c;
    let vbid = req.header.vbucket;
    match bucket.engine.vbucket_seqnos(vbid) {
        Ok(_) => {
            let body = crate::dcp::failover_log_body(&*bucket.engine, vbid);
            put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &body);
        }
        Err(e) => s.fail(shared, out, to, e, &[]),
    }
}

/// DCP_NOOP from the consumer.
pub(crate) fn noop(_: &mut Session, c: Call<'_>, _: &SelectedBucket) {
    answer(c.out, c.to, Status::Success);
}

/// DCP_CONTROL: sets a producer option.
pub(crate) fn control(s: &mut Session, c: Call<'_>, _: &SelectedBucket) {
    let Some(p) = s.dcp.as_mut() else {
        return not_a_producer(c.out, c.to);
    };
    let status = p.control(c.req.key, c.req.value);
    answer(c.out, c.to, status);
}

/// DCP_STREAM_REQ: opens a stream of the header's vBucket, filtered by collection when
/// the connection negotiated collections.
pub(crate) fn stream_req(s: &mut Session, c: Call<'_>, bucket: &SelectedBucket) {
    let Call { req, out, to, .. } = c;
    let vbid = req.header.vbucket;
    let collections = s.collections;
    if s.dcp.is_none() {
        return not_a_producer(out, to);
    }
    let Ok(r) = wire::StreamReq::decode(req.extras) else {
        return answer(out, to, Status::Einval);
    };
    let r = match apply_stream_flags(&*bucket.engine, vbid, r) {
        Ok(r) => r,
        Err(s) => return answer(out, to, s),
    };
    let filter = if collections {
        match collection_filter(&*bucket.engine, req.value) {
            Ok(f) => f,
            Err(s) => return answer(out, to, s),
        }
    } else if req.value.is_empty() {
        StreamFilter::default()
    } else {
        return answer(out, to, Status::Einval);
    };
    if let Err(missing) = may_stream(s, bucket, &filter, collections) {
        return s.deny(out, to, missing);
    }
    let Some(p) = s.dcp.as_mut() else {
        return not_a_producer(out, to);
    };
    let request = DcpStreamRequest {
        start_seqno: r.start_seqno,
        end_seqno: r.end_seqno,
        vbucket_uuid: r.vbucket_uuid,
        snap_start_seqno: r.snap_start_seqno,
        snap_end_seqno: r.snap_end_seqno,
        sync_replication: false,
        // A consumer without collections sees the default collection.
        collections: filter.collections.or((!collections).then(|| vec![0])),
        scope: filter.scope,
    };
    if let Err(s) = p.stream_req(out, to, vbid, request) {
        answer(out, to, s);
    }
}

/// Whether the connection's user may stream what `filter` selects: DcpStream on the whole
/// bucket or, for a user whose roles name scopes or collections, on every collection the
/// stream carries (a connection without collections streams the default collection).
fn may_stream(
    s: &Session,
    bucket: &SelectedBucket,
    filter: &StreamFilter,
    collections: bool,
) -> Result<(), Privilege> {
    let needs = Needs::One(Privilege::DcpStream);
    let Err(missing) = s.access.check(needs) else {
        return Ok(());
    };
    let default_only = [0u32];
    let streamed: &[u32] = match (&filter.collections, filter.scope) {
        (Some(list), _) => list,
        (None, Some(_)) => &filter.scope_collections,
        (None, None) if !collections => &default_only,
        (None, None) => return Err(missing),
    };
    // An empty scope streams nothing; it still needs a grant naming a scope or collection.
    let held_on_each = s.access.has_narrow_grants()
        && streamed.iter().all(|cid| {
            matches!(
                s.access.check_narrow(needs, missing, &*bucket.engine, *cid),
                Ok(Ok(()))
            )
        });
    if held_on_each { Ok(()) } else { Err(missing) }
}

/// DCP_CLOSE_STREAM: closes the header's vBucket's stream.
pub(crate) fn close_stream(s: &mut Session, c: Call<'_>, _: &SelectedBucket) {
    let Some(p) = s.dcp.as_mut() else {
        return not_a_producer(c.out, c.to);
    };
    let status = p.close_stream(c.req.header.vbucket);
    answer(c.out, c.to, status);
}

/// DCP_BUFFER_ACKNOWLEDGEMENT: flow control; not answered when it succeeds, as
/// KV-Engine.
pub(crate) fn buffer_ack(s: &mut Session, c: Call<'_>, _: &SelectedBucket) {
    let Some(p) = s.dcp.as_mut() else {
        return not_a_producer(c.out, c.to);
    };
    match wire::BufferAck::decode(c.req.extras) {
        Ok(ack) => p.buffer_ack(ack.bytes),
        Err(_) => answer(c.out, c.to, Status::Einval),
    }
}

/// DCP_SEQNO_ACKNOWLEDGED: a replica's prepared seqno; not answered when it succeeds, as
/// KV-Engine.
pub(crate) fn seqno_acknowledged(s: &mut Session, c: Call<'_>, _: &SelectedBucket) {
    let Some(p) = s.dcp.as_mut() else {
        return not_a_producer(c.out, c.to);
    };
    match wire::SeqnoAck::decode(c.req.extras) {
        Ok(ack) => match p.seqno_acknowledged(c.req.header.vbucket, ack.prepared_seqno) {
            Status::Success => {}
            s => answer(c.out, c.to, s),
        },
        Err(_) => answer(c.out, c.to, Status::Einval),
    }
}

/// A DCP message epkv does not implement (those only a consumer takes): NoBucket without
/// a bucket, Einval on a connection that is not a producer, NotSupported on a producer.
pub(crate) fn unregistered(s: &mut Session, c: Call<'_>) {
    if s.bucket.is_none() {
        return s.fail_wire(c.out, c.to, Status::NoBucket, &[]);
    }
    if s.dcp.is_none() {
        return not_a_producer(c.out, c.to);
    }
    answer(c.out, c.to, Status::NotSupported);
}
