//! Test fixtures for the front end: an in-memory [`FakeEngine`], a [`TestServer`] that
//! runs a real [`Frontend`] on 127.0.0.1:0 in a thread, and a blocking raw [`Client`].
#![allow(dead_code, unreachable_pub, missing_docs)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixture: a failure here is a test failure"
)]

use bytes::Bytes;
use epkv_engine_api::{
    ArithmeticOp, ArithmeticRequest, Engine, EngineResult, EngineStatus, Item, MutationInfo,
    RemoveRequest, StatSink, StoreOp, StoreRequest,
};
use epkv_frontend::{Frontend, FrontendConfig};
use epkv_protocol::{Limits, RequestBuilder, Response, response_frame_len};
use epkv_types::{Cas, Datatype, NUM_VBUCKETS, Seqno, VBucketState, Vbid, vbucket_for_key};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// The vBucket UUID the fake engine reports in every MutationInfo.
pub const FAKE_VBUCKET_UUID: u64 = 0xfeed_f00d;

#[derive(Debug, Clone)]
struct FakeItem {
    value: Bytes,
    flags: u32,
    cas: u64,
    datatype: Datatype,
    seqno: u64,
    locked_cas: Option<u64>,
}

/// A small in-memory engine with memcached semantics, enough to drive the front end.
#[derive(Debug)]
pub struct FakeEngine {
    items: Mutex<HashMap<Vec<u8>, FakeItem>>,
    states: Mutex<Vec<VBucketState>>,
    next_cas: AtomicU64,
    next_seqno: AtomicU64,
    pub flush_enabled: AtomicBool,
    pub shutdown_called: AtomicBool,
    pub time_offset: AtomicI64,
    /// Every (operation, vbid) the engine was called with.
    pub calls: Mutex<Vec<(&'static str, Vbid)>>,
    /// Every prefetch hint: the vBucket, and the key (`None` for a vBucket-only hint).
    pub prefetched: Mutex<Vec<(Vbid, Option<Vec<u8>>)>>,
}

impl Default for FakeEngine {
    fn default() -> Self {
        Self {
            items: Mutex::default(),
            states: Mutex::new(vec![VBucketState::Active; usize::from(NUM_VBUCKETS)]),
            next_cas: AtomicU64::new(1000),
            next_seqno: AtomicU64::new(1),
            flush_enabled: AtomicBool::new(false),
            shutdown_called: AtomicBool::new(false),
            time_offset: AtomicI64::new(0),
            calls: Mutex::default(),
            prefetched: Mutex::default(),
        }
    }
}

impl FakeEngine {
    fn check(&self, op: &'static str, vbid: Vbid, key: &[u8]) -> EngineResult<()> {
        self.calls.lock().push((op, vbid));
        if vbid.0 >= NUM_VBUCKETS || vbucket_for_key(key, NUM_VBUCKETS) != vbid {
            return Err(EngineStatus::NotMyVbucket);
        }
        match self.states.lock()[usize::from(vbid.0)] {
            VBucketState::Active => Ok(()),
            _ => Err(EngineStatus::NotMyVbucket),
        }
    }

    fn cas(&self) -> u64 {
        self.next_cas.fetch_add(1, Ordering::Relaxed)
    }

    fn info(&self, cas: u64, seqno: u64) -> MutationInfo {
        MutationInfo {
            cas: Cas(cas),
            vbucket_uuid: FAKE_VBUCKET_UUID,
            seqno: Seqno(seqno),
        }
    }

    fn item(key: &[u8], vbid: Vbid, it: &FakeItem, cas: u64) -> Item {
        Item {
            key: Bytes::copy_from_slice(key),
            value: it.value.clone(),
            flags: it.flags,
            expiry_unix_secs: 0,
            datatype: it.datatype,
            cas: Cas(cas),
            vbid,
            seqno: Seqno(it.seqno),
        }
    }

    pub fn vbids_for(&self, op: &str) -> Vec<Vbid> {
        self.calls
            .lock()
            .iter()
            .filter(|(o, _)| *o == op)
            .map(|(_, v)| *v)
            .collect()
    }
}

impl Engine for FakeEngine {
    fn prefetch(&self, vbid: Vbid, key: &[u8]) {
        self.prefetched.lock().push((vbid, Some(key.to_vec())));
    }

    fn prefetch_vbucket(&self, vbid: Vbid) {
        self.prefetched.lock().push((vbid, None));
    }

    fn get(&self, vbid: Vbid, key: &[u8]) -> EngineResult<Item> {
        self.check("get", vbid, key)?;
        let items = self.items.lock();
        let it = items.get(key).ok_or(EngineStatus::KeyNotFound)?;
        let cas = if it.locked_cas.is_some() {
            u64::MAX
        } else {
            it.cas
        };
        Ok(Self::item(key, vbid, it, cas))
    }

    fn get_and_touch(&self, vbid: Vbid, key: &[u8], _expiry_raw: u32) -> EngineResult<Item> {
        self.check("gat", vbid, key)?;
        let items = self.items.lock();
        let it = items.get(key).ok_or(EngineStatus::KeyNotFound)?;
        if it.locked_cas.is_some() {
            return Err(EngineStatus::Locked);
        }
        Ok(Self::item(key, vbid, it, it.cas))
    }

    fn touch(&self, vbid: Vbid, key: &[u8], _expiry_raw: u32) -> EngineResult<MutationInfo> {
        self.check("touch", vbid, key)?;
        let mut items = self.items.lock();
        let it = items.get_mut(key).ok_or(EngineStatus::KeyNotFound)?;
        if it.locked_cas.is_some() {
            return Err(EngineStatus::Locked);
        }
        it.cas = self.cas();
        Ok(self.info(it.cas, it.seqno))
    }

    fn get_locked(&self, vbid: Vbid, key: &[u8], _secs: u32) -> EngineResult<Item> {
        self.check("get_locked", vbid, key)?;
        let mut items = self.items.lock();
        let it = items.get_mut(key).ok_or(EngineStatus::KeyNotFound)?;
        if it.locked_cas.is_some() {
            return Err(EngineStatus::Locked);
        }
        let cas = self.cas();
        it.locked_cas = Some(cas);
        Ok(Self::item(key, vbid, it, cas))
    }

    fn unlock(&self, vbid: Vbid, key: &[u8], cas: Cas) -> EngineResult<()> {
        self.check("unlock", vbid, key)?;
        let mut items = self.items.lock();
        let it = items.get_mut(key).ok_or(EngineStatus::KeyNotFound)?;
        match it.locked_cas {
            None => Err(EngineStatus::NotLocked),
            Some(c) if c != cas.0 => Err(EngineStatus::Locked),
            Some(_) => {
                it.locked_cas = None;
                Ok(())
            }
        }
    }

    fn store(&self, req: StoreRequest<'_>) -> EngineResult<MutationInfo> {
        self.check("store", req.vbid, req.key)?;
        let mut items = self.items.lock();
        let existing = items.get(req.key);
        if let Some(it) = existing
            && let Some(lc) = it.locked_cas
            && lc != req.cas.0
        {
            return Err(EngineStatus::Locked);
        }
        let cas_ok = |it: &FakeItem| {
            req.cas.is_any() || it.cas == req.cas.0 || it.locked_cas == Some(req.cas.0)
        };
        let (value, flags, datatype) = match (req.op, existing) {
            (StoreOp::Add, Some(_)) => return Err(EngineStatus::KeyExists),
            (StoreOp::Set, None) if !req.cas.is_any() => return Err(EngineStatus::KeyNotFound),
            (StoreOp::Replace, None) => return Err(EngineStatus::KeyNotFound),
            (StoreOp::Append | StoreOp::Prepend, None) => return Err(EngineStatus::NotStored),
            (_, Some(it)) if !cas_ok(it) => return Err(EngineStatus::KeyExists),
            (StoreOp::Append, Some(it)) => (
                Bytes::from([&it.value[..], req.value].concat()),
                it.flags,
                it.datatype,
            ),
            (StoreOp::Prepend, Some(it)) => (
                Bytes::from([req.value, &it.value[..]].concat()),
                it.flags,
                it.datatype,
            ),
            _ => (Bytes::copy_from_slice(req.value), req.flags, req.datatype),
        };
        let cas = self.cas();
        let seqno = self.next_seqno.fetch_add(1, Ordering::Relaxed);
        items.insert(
            req.key.to_vec(),
            FakeItem {
                value,
                flags,
                cas,
                datatype,
                seqno,
                locked_cas: None,
            },
        );
        Ok(self.info(cas, seqno))
    }

    fn remove(&self, req: RemoveRequest<'_>) -> EngineResult<MutationInfo> {
        self.check("remove", req.vbid, req.key)?;
        let mut items = self.items.lock();
        let it = items.get(req.key).ok_or(EngineStatus::KeyNotFound)?;
        if it.locked_cas.is_some_and(|c| c != req.cas.0) {
            return Err(EngineStatus::Locked);
        }
        if !req.cas.is_any() && it.cas != req.cas.0 && it.locked_cas != Some(req.cas.0) {
            return Err(EngineStatus::KeyExists);
        }
        items.remove(req.key);
        let seqno = self.next_seqno.fetch_add(1, Ordering::Relaxed);
        Ok(self.info(self.cas(), seqno))
    }

    fn arithmetic(&self, req: ArithmeticRequest<'_>) -> EngineResult<(u64, MutationInfo)> {
        self.check("arithmetic", req.vbid, req.key)?;
        let mut items = self.items.lock();
        let new = match items.get(req.key) {
            None if req.expiry_raw == u32::MAX => return Err(EngineStatus::KeyNotFound),
            None => req.initial,
            Some(it) => {
                let current: u64 = std::str::from_utf8(&it.value)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or(EngineStatus::DeltaBadValue)?;
                match req.op {
                    ArithmeticOp::Increment => current.wrapping_add(req.delta),
                    ArithmeticOp::Decrement => current.saturating_sub(req.delta),
                }
            }
        };
        let cas = self.cas();
        let seqno = self.next_seqno.fetch_add(1, Ordering::Relaxed);
        items.insert(
            req.key.to_vec(),
            FakeItem {
                value: Bytes::from(new.to_string()),
                flags: 0,
                cas,
                datatype: Datatype::RAW,
                seqno,
                locked_cas: None,
            },
        );
        Ok((new, self.info(cas, seqno)))
    }

    fn flush(&self) -> EngineResult<()> {
        if !self.flush_enabled.load(Ordering::Relaxed) {
            return Err(EngineStatus::NotSupported);
        }
        self.items.lock().clear();
        Ok(())
    }

    /// Scope `s1` holds collections 8 (`c1`) and 9 (`c2`), besides the default one.
    fn collection_names(&self, cid: u32) -> EngineResult<(String, String)> {
        let (scope, collection) = match cid {
            0 => ("_default", "_default"),
            8 => ("s1", "c1"),
            9 => ("s1", "c2"),
            _ => return Err(EngineStatus::UnknownCollection),
        };
        Ok((scope.to_owned(), collection.to_owned()))
    }

    fn stats(&self, group: &str, sink: StatSink<'_>) -> EngineResult<()> {
        match group {
            "" => {
                sink("fake_curr_items", &self.items.lock().len().to_string());
                Ok(())
            }
            "vbucket" => {
                for (i, s) in self.states.lock().iter().enumerate().take(4) {
                    sink(&format!("vb_{i}"), s.as_str());
                }
                Ok(())
            }
            _ => Err(EngineStatus::UnknownStatGroup),
        }
    }

    fn vbucket_state(&self, vbid: Vbid) -> Option<VBucketState> {
        self.states.lock().get(usize::from(vbid.0)).copied()
    }

    fn set_vbucket_state(&self, vbid: Vbid, state: VBucketState) -> EngineResult<()> {
        let mut states = self.states.lock();
        let slot = states
            .get_mut(usize::from(vbid.0))
            .ok_or(EngineStatus::NotMyVbucket)?;
        *slot = state;
        Ok(())
    }

    fn adjust_time(&self, offset_secs: i64) -> EngineResult<()> {
        self.time_offset.store(offset_secs, Ordering::Relaxed);
        Ok(())
    }

    fn shutdown(&self) {
        self.shutdown_called.store(true, Ordering::Relaxed);
    }
}

/// Runs `frontend` on a thread of its own (a current-thread runtime) until the returned
/// sender fires or is dropped; the handle gives `run_until`'s result.
pub fn run_in_background(
    frontend: Frontend,
) -> (
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<epkv_frontend::Result<()>>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(frontend.run_until(async {
            let _ = rx.await;
        }))
    });
    (tx, thread)
}

/// A front end serving a [`FakeEngine`] on a background thread.
pub struct TestServer {
    pub addr: SocketAddr,
    pub engine: Arc<FakeEngine>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<epkv_frontend::Result<()>>>,
}

impl TestServer {
    pub fn start() -> Self {
        Self::with_config(FrontendConfig::default())
    }

    pub fn with_config(config: FrontendConfig) -> Self {
        let engine = Arc::new(FakeEngine::default());
        let frontend = Frontend::bind(config, engine.clone()).unwrap();
        let addr = frontend.local_addr();
        let (tx, thread) = run_in_background(frontend);
        Self {
            addr,
            engine,
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr)
    }

    /// Signals shutdown and waits for `run_until` to return.
    pub fn stop(mut self) -> epkv_frontend::Result<()> {
        self.stop_inner().unwrap()
    }

    fn stop_inner(&mut self) -> Option<epkv_frontend::Result<()>> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.thread.take().map(|t| t.join().unwrap())
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

/// A decoded response with owned sections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resp {
    pub opcode: u8,
    pub status: u16,
    pub opaque: u32,
    pub cas: u64,
    pub datatype: u8,
    pub extras: Vec<u8>,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// One packet of any magic, classic header (no framing extras), sections owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub magic: u8,
    pub opcode: u8,
    pub datatype: u8,
    /// The vbucket of a request, the status of a response.
    pub specific: u16,
    pub opaque: u32,
    pub extras: Vec<u8>,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// How long any single read in a test may wait before the test fails.
pub const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// A blocking raw protocol client.
pub struct Client {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Self {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    pub fn send_req(&mut self, b: RequestBuilder<'_>) {
        self.send(&b.to_vec().unwrap());
    }

    pub fn request(&mut self, b: RequestBuilder<'_>) -> Resp {
        self.send_req(b);
        self.recv()
    }

    /// Reads one response; panics if the connection closes or nothing comes in time.
    pub fn recv(&mut self) -> Resp {
        self.try_recv()
            .expect("connection closed while a response was expected")
    }

    /// Reads one response, or `None` if the server closed the connection first.
    pub fn try_recv(&mut self) -> Option<Resp> {
        let limits = Limits {
            max_packet_bytes: u32::MAX,
        };
        loop {
            if let Some(n) = response_frame_len(&self.buf, &limits).unwrap() {
                let r = Response::parse(&self.buf[..n], &limits).unwrap();
                let resp = Resp {
                    opcode: r.opcode,
                    status: r.status,
                    opaque: r.opaque,
                    cas: r.cas.0,
                    datatype: r.datatype.0,
                    extras: r.extras.to_vec(),
                    key: r.key.to_vec(),
                    value: r.value.to_vec(),
                };
                self.buf.drain(..n);
                return Some(resp);
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("read failed: {e}"),
            }
        }
    }

    /// Reads one packet of any magic (a response, or a server request in duplex mode)
    /// with its header fields raw; panics if the connection closes or nothing comes in
    /// time.
    pub fn recv_packet(&mut self) -> Packet {
        loop {
            if self.buf.len() >= 24 {
                let h = &self.buf[..24];
                let key_len = usize::from(u16::from_be_bytes([h[2], h[3]]));
                let extras_len = usize::from(h[4]);
                let body = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
                if self.buf.len() >= 24 + body {
                    let b = &self.buf[24..24 + body];
                    let p = Packet {
                        magic: h[0],
                        opcode: h[1],
                        datatype: h[5],
                        specific: u16::from_be_bytes([h[6], h[7]]),
                        opaque: u32::from_be_bytes([h[12], h[13], h[14], h[15]]),
                        extras: b[..extras_len].to_vec(),
                        key: b[extras_len..extras_len + key_len].to_vec(),
                        value: b[extras_len + key_len..].to_vec(),
                    };
                    self.buf.drain(..24 + body);
                    return p;
                }
            }
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => panic!("connection closed while a packet was expected"),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => panic!("read failed: {e}"),
            }
        }
    }

    /// Waits for the server to close the connection; returns the responses that came
    /// first. Panics if it does not close within the read timeout.
    pub fn until_closed(&mut self) -> Vec<Resp> {
        let mut got = Vec::new();
        while let Some(r) = self.try_recv() {
            got.push(r);
            assert!(got.len() < 1_000_000, "too many responses");
        }
        got
    }
}

/// A SET request with the given flags and no expiry.
pub fn set_req(key: &[u8], value: &[u8], flags: u32) -> Vec<u8> {
    let mut extras = [0u8; 8];
    extras[..4].copy_from_slice(&flags.to_be_bytes());
    RequestBuilder::new(epkv_protocol::Opcode::Set)
        .extras(&extras)
        .key(key)
        .value(value)
        .to_vec()
        .unwrap()
}
