//! The connection: buffered, pipelining-friendly request/response I/O and the
//! convenience commands built on it.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use epkv_protocol::{
    ArithmeticOp, Command, Feature, HEADER_LEN, HelloFeatures, Limits, RequestBuilder,
    ResponseHeader, StoreOp, response_frame_len,
};
use epkv_types::{Cas, NUM_VBUCKETS, VBucketState, Vbid, vbucket_for_key};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, ToSocketAddrs};

use crate::error::{Error, Result};
use crate::options::StoreOptions;
use crate::response::Response;

/// Smallest read the client asks the socket for.
const MIN_READ_BYTES: usize = 16 * 1024;

/// Client settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientConfig {
    /// Limits for responses. The default allows 32 MiB packets: a 20 MiB document plus
    /// its header and extras.
    pub limits: Limits,
    /// vBuckets in the bucket, for key routing.
    pub num_vbuckets: u16,
    /// How long a receive may wait; `None` waits forever.
    pub timeout: Option<Duration>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            limits: Limits {
                max_packet_bytes: 32 * 1024 * 1024,
            },
            num_vbuckets: NUM_VBUCKETS,
            timeout: Some(Duration::from_secs(60)),
        }
    }
}

/// A connection to a memcached binary protocol server.
///
/// Requests are encoded into a write buffer ([`Client::queue`]) and written by
/// [`Client::flush`], so a test can pipeline any number of requests in one write and then
/// [`Client::recv`] the responses. [`Client::request`] does one round trip. Document
/// commands go to the key's vBucket (`epkv_types::vbucket_for_key`) unless an override
/// is set.
///
/// The stream is a [`TcpStream`] by default; any `AsyncRead + AsyncWrite` stream works
/// through [`Client::from_stream`], a TLS session for instance.
#[derive(Debug)]
pub struct Client<S = TcpStream> {
    stream: S,
    config: ClientConfig,
    rbuf: BytesMut,
    wbuf: BytesMut,
    next_opaque: u32,
    vbucket_override: Option<Vbid>,
}

impl Client<TcpStream> {
    /// Connects with the default [`ClientConfig`].
    ///
    /// # Errors
    /// [`Error::Io`] when the connection fails.
    pub async fn connect(addr: impl ToSocketAddrs) -> Result<Client> {
        Client::connect_with(addr, ClientConfig::default()).await
    }

    /// Connects with `config`.
    ///
    /// # Errors
    /// [`Error::Io`] when the connection fails.
    pub async fn connect_with(addr: impl ToSocketAddrs, config: ClientConfig) -> Result<Client> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Client::from_stream(stream, config))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    /// Wraps a connected stream.
    #[must_use]
    pub fn from_stream(stream: S, config: ClientConfig) -> Client<S> {
        Client {
            stream,
            config,
            rbuf: BytesMut::new(),
            wbuf: BytesMut::new(),
            next_opaque: 1,
            vbucket_override: None,
        }
    }

    /// Returns the underlying stream (for tests that need socket-level control).
    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// Sends every later document command to `vbucket` instead of the key's vBucket
    /// (`None` restores key routing).
    pub fn set_vbucket_override(&mut self, vbucket: Option<Vbid>) {
        self.vbucket_override = vbucket;
    }

    /// Returns the vBucket a document command for `key` is sent to.
    #[must_use]
    pub fn vbucket_for(&self, key: &[u8]) -> Vbid {
        self.vbucket_override
            .unwrap_or_else(|| vbucket_for_key(key, self.config.num_vbuckets))
    }

    /// Returns a fresh opaque.
    pub fn next_opaque(&mut self) -> u32 {
        let o = self.next_opaque;
        self.next_opaque = self.next_opaque.wrapping_add(1);
        o
    }

    /// Encodes `req` with a fresh opaque into the write buffer and returns the opaque.
    /// Nothing is sent until [`Client::flush`].
    ///
    /// # Errors
    /// [`Error::Encode`] when the request does not fit the header.
    pub fn queue(&mut self, req: RequestBuilder<'_>) -> Result<u32> {
        let opaque = self.next_opaque();
        req.opaque(opaque).encode(&mut self.wbuf)?;
        Ok(opaque)
    }

    /// Appends raw bytes to the write buffer.
    pub fn queue_raw(&mut self, bytes: &[u8]) {
        self.wbuf.extend_from_slice(bytes);
    }

    /// Writes the write buffer to the socket.
    ///
    /// # Errors
    /// [`Error::Io`] on a socket error.
    pub async fn flush(&mut self) -> Result<()> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
        }
        Ok(())
    }

    /// Queues and flushes one request; returns its opaque.
    ///
    /// # Errors
    /// As [`Client::queue`] and [`Client::flush`].
    pub async fn send(&mut self, req: RequestBuilder<'_>) -> Result<u32> {
        let opaque = self.queue(req)?;
        self.flush().await?;
        Ok(opaque)
    }

    /// Writes raw bytes (after anything already queued).
    ///
    /// # Errors
    /// [`Error::Io`] on a socket error.
    pub async fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.queue_raw(bytes);
        self.flush().await
    }

    /// Reads the next response.
    ///
    /// # Errors
    /// [`Error::Header`] for an untrusted header, [`Error::Closed`] at end of stream,
    /// [`Error::Timeout`], [`Error::Io`].
    pub async fn recv(&mut self) -> Result<Response> {
        read_response(&mut self.stream, &mut self.rbuf, &self.config).await
    }

    /// Writes the write buffer while concurrently reading `count` responses, so a
    /// pipeline of any size cannot deadlock against a server that stops reading until
    /// its replies are consumed. Returns the responses in arrival order.
    ///
    /// # Errors
    /// As [`Client::flush`] and [`Client::recv`].
    pub async fn flush_and_recv(&mut self, count: usize) -> Result<Vec<Response>> {
        let (mut rd, mut wr) = tokio::io::split(&mut self.stream);
        let (wbuf, rbuf, config) = (&mut self.wbuf, &mut self.rbuf, &self.config);
        let write = async {
            wr.write_all(wbuf).await?;
            wbuf.clear();
            Ok::<(), Error>(())
        };
        let read = async {
            // Capacity is not sized from `count` alone: it is the caller's number, but
            // keep the up-front allocation modest.
            let mut out = Vec::with_capacity(count.min(4096));
            for _ in 0..count {
                out.push(read_response(&mut rd, rbuf, config).await?);
            }
            Ok::<Vec<Response>, Error>(out)
        };
        let ((), responses) = tokio::try_join!(write, read)?;
        Ok(responses)
    }

    /// Sends one request and returns its response.
    ///
    /// # Errors
    /// As [`Client::send`] and [`Client::recv`], and [`Error::UnexpectedOpaque`] when the
    /// next response answers something else.
    pub async fn request(&mut self, req: RequestBuilder<'_>) -> Result<Response> {
        let opaque = self.send(req).await?;
        let resp = self.recv().await?;
        if resp.opaque != opaque {
            return Err(Error::UnexpectedOpaque {
                expected: opaque,
                got: resp.opaque,
            });
        }
        Ok(resp)
    }

    /// Reads until the server closes the connection.
    ///
    /// # Errors
    /// [`Error::Malformed`] when data arrives instead, plus read errors.
    pub async fn wait_closed(&mut self) -> Result<()> {
        if !self.rbuf.is_empty() {
            return Err(Error::Malformed(
                "data received where the connection should close",
            ));
        }
        match read_more(&mut self.stream, &mut self.rbuf, &self.config).await {
            Ok(0) => Ok(()),
            Ok(_) => Err(Error::Malformed(
                "data received where the connection should close",
            )),
            // A reset after QUIT is also a close.
            Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Closes the write half of the connection.
    ///
    /// # Errors
    /// [`Error::Io`] on a socket error.
    pub async fn shutdown_write(&mut self) -> Result<()> {
        self.flush().await?;
        self.stream.shutdown().await?;
        Ok(())
    }

    fn cmd<'a>(&self, cmd: &Command<'a>) -> RequestBuilder<'a> {
        let b = RequestBuilder::from_command(cmd);
        match cmd.document_key() {
            Some(key) => b.vbucket(self.vbucket_for(key)),
            None => b,
        }
    }

    async fn run(&mut self, cmd: &Command<'_>) -> Result<Response> {
        let b = self.cmd(cmd);
        self.request(b).await
    }

    /// HELLO: announces `agent` and asks for `features`; returns the feature codes the
    /// server agreed to.
    ///
    /// # Errors
    /// [`Error::Status`] on a non-success status, [`Error::Malformed`] for an odd-length
    /// reply, plus I/O errors.
    pub async fn hello(&mut self, agent: &str, features: &[Feature]) -> Result<Vec<u16>> {
        let raw: Vec<u8> = features
            .iter()
            .flat_map(|f| f.as_u16().to_be_bytes())
            .collect();
        let cmd = Command::Hello {
            agent: agent.as_bytes(),
            features: HelloFeatures::new(&raw),
        };
        let resp = self.run(&cmd).await?.into_result()?;
        if resp.value.len() % 2 != 0 {
            return Err(Error::Malformed("HELLO reply has an odd length"));
        }
        Ok(HelloFeatures::new(&resp.value).codes().collect())
    }

    /// GET.
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn get(&mut self, key: &[u8]) -> Result<Response> {
        self.run(&Command::Get {
            key,
            with_key: false,
            quiet: false,
        })
        .await
    }

    /// GETK (the response carries the key).
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn getk(&mut self, key: &[u8]) -> Result<Response> {
        self.run(&Command::Get {
            key,
            with_key: true,
            quiet: false,
        })
        .await
    }

    /// Any store: SET, ADD, REPLACE, APPEND or PREPEND.
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn store(
        &mut self,
        op: StoreOp,
        key: &[u8],
        value: &[u8],
        opts: StoreOptions,
    ) -> Result<Response> {
        let (flags, expiry) = match op {
            StoreOp::Append | StoreOp::Prepend => (0, 0),
            _ => (opts.flags, opts.expiry),
        };
        let cmd = Command::Store {
            op,
            key,
            value,
            flags,
            expiry,
            datatype: opts.datatype,
            cas: opts.cas,
            durability: opts.durability,
            preserve_ttl: opts.preserve_ttl,
            quiet: false,
        };
        let mut b = self.cmd(&cmd);
        if let Some(vb) = opts.vbucket {
            b = b.vbucket(vb);
        }
        self.request(b).await
    }

    /// SET.
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn set(&mut self, key: &[u8], value: &[u8], opts: StoreOptions) -> Result<Response> {
        self.store(StoreOp::Set, key, value, opts).await
    }

    /// ADD.
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn add(&mut self, key: &[u8], value: &[u8], opts: StoreOptions) -> Result<Response> {
        self.store(StoreOp::Add, key, value, opts).await
    }

    /// REPLACE.
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn replace(
        &mut self,
        key: &[u8],
        value: &[u8],
        opts: StoreOptions,
    ) -> Result<Response> {
        self.store(StoreOp::Replace, key, value, opts).await
    }

    /// APPEND (flags and expiry of `opts` are not sent).
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn append(
        &mut self,
        key: &[u8],
        value: &[u8],
        opts: StoreOptions,
    ) -> Result<Response> {
        self.store(StoreOp::Append, key, value, opts).await
    }

    /// PREPEND (flags and expiry of `opts` are not sent).
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn prepend(
        &mut self,
        key: &[u8],
        value: &[u8],
        opts: StoreOptions,
    ) -> Result<Response> {
        self.store(StoreOp::Prepend, key, value, opts).await
    }

    /// DELETE, with a CAS to match or [`Cas::ANY`].
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn delete(&mut self, key: &[u8], cas: Cas) -> Result<Response> {
        self.run(&Command::Delete {
            key,
            cas,
            durability: None,
            quiet: false,
        })
        .await
    }

    /// INCREMENT; the new value is [`Response::counter`]. `expiry` 0xffffffff means "do
    /// not create a missing key".
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn incr(
        &mut self,
        key: &[u8],
        delta: u64,
        initial: u64,
        expiry: u32,
    ) -> Result<Response> {
        self.arithmetic(ArithmeticOp::Increment, key, delta, initial, expiry)
            .await
    }

    /// DECREMENT; the new value is [`Response::counter`].
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn decr(
        &mut self,
        key: &[u8],
        delta: u64,
        initial: u64,
        expiry: u32,
    ) -> Result<Response> {
        self.arithmetic(ArithmeticOp::Decrement, key, delta, initial, expiry)
            .await
    }

    async fn arithmetic(
        &mut self,
        op: ArithmeticOp,
        key: &[u8],
        delta: u64,
        initial: u64,
        expiry: u32,
    ) -> Result<Response> {
        let cmd = Command::Arithmetic {
            op,
            key,
            delta,
            initial,
            expiry,
            durability: None,
            preserve_ttl: false,
            quiet: false,
        };
        self.run(&cmd).await
    }

    /// TOUCH.
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn touch(&mut self, key: &[u8], expiry: u32) -> Result<Response> {
        self.run(&Command::Touch {
            key,
            expiry,
            durability: None,
        })
        .await
    }

    /// GAT (get and touch).
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn gat(&mut self, key: &[u8], expiry: u32) -> Result<Response> {
        self.run(&Command::Gat {
            key,
            expiry,
            durability: None,
            quiet: false,
        })
        .await
    }

    /// GET_LOCKED with a lock timeout in seconds (0 = server default).
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn get_locked(&mut self, key: &[u8], lock_timeout_secs: u32) -> Result<Response> {
        self.run(&Command::GetLocked {
            key,
            lock_timeout_secs,
        })
        .await
    }

    /// UNLOCK_KEY with the CAS GET_LOCKED returned.
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn unlock(&mut self, key: &[u8], cas: Cas) -> Result<Response> {
        self.run(&Command::UnlockKey { key, cas }).await
    }

    /// NOOP.
    ///
    /// # Errors
    /// [`Error::Status`] on a non-success status, plus I/O errors.
    pub async fn noop(&mut self) -> Result<()> {
        self.run(&Command::Noop).await?.into_result().map(drop)
    }

    /// VERSION.
    ///
    /// # Errors
    /// [`Error::Status`] on a non-success status, plus I/O errors.
    pub async fn version(&mut self) -> Result<String> {
        let resp = self.run(&Command::Version).await?.into_result()?;
        Ok(String::from_utf8_lossy(&resp.value).into_owned())
    }

    /// STAT for a group ("" for the default group); returns the (name, value) pairs in the
    /// order the server sent them.
    ///
    /// # Errors
    /// [`Error::Status`] on a non-success status, [`Error::UnexpectedOpaque`], plus I/O
    /// errors.
    pub async fn stat(&mut self, group: &str) -> Result<Vec<(String, String)>> {
        let opaque = self
            .send(self.cmd(&Command::Stat {
                group: group.as_bytes(),
            }))
            .await?;
        let mut stats = Vec::new();
        loop {
            let resp = self.recv().await?;
            if resp.opaque != opaque {
                return Err(Error::UnexpectedOpaque {
                    expected: opaque,
                    got: resp.opaque,
                });
            }
            let resp = resp.into_result()?;
            if resp.key.is_empty() {
                return Ok(stats);
            }
            stats.push((
                String::from_utf8_lossy(&resp.key).into_owned(),
                String::from_utf8_lossy(&resp.value).into_owned(),
            ));
        }
    }

    /// FLUSH.
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn flush_all(&mut self) -> Result<Response> {
        self.run(&Command::Flush { quiet: false }).await
    }

    /// SET_VBUCKET.
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn set_vbucket(&mut self, vbucket: Vbid, state: VBucketState) -> Result<Response> {
        let b = self.cmd(&Command::SetVbucket { state }).vbucket(vbucket);
        self.request(b).await
    }

    /// GET_VBUCKET; the state is [`Response::vbucket_state`].
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn get_vbucket(&mut self, vbucket: Vbid) -> Result<Response> {
        let b = self.cmd(&Command::GetVbucket).vbucket(vbucket);
        self.request(b).await
    }

    /// ADJUST_TIMEOFDAY: sets the server clock's offset from real time (test servers only).
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn adjust_timeofday(&mut self, offset_secs: i64) -> Result<Response> {
        self.run(&Command::AdjustTimeofday { offset_secs }).await
    }

    /// SASL_LIST_MECHS: the mechanisms the server offers, as it lists them.
    ///
    /// # Errors
    /// [`Error::Status`] on a non-success status, plus I/O errors.
    pub async fn sasl_list_mechs(&mut self) -> Result<String> {
        let r = self.run(&Command::SaslListMechs).await?.into_result()?;
        Ok(String::from_utf8_lossy(&r.value).into_owned())
    }

    /// SASL_AUTH with `mechanism` and the client's first message.
    ///
    /// # Errors
    /// I/O and protocol errors; the status (0x00, 0x21 AuthContinue, 0x20 AuthError) is in
    /// the response.
    pub async fn sasl_auth(&mut self, mechanism: &str, data: &[u8]) -> Result<Response> {
        self.run(&Command::SaslAuth {
            mechanism: mechanism.as_bytes(),
            data,
        })
        .await
    }

    /// SASL_STEP with `mechanism` and the client's next message.
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn sasl_step(&mut self, mechanism: &str, data: &[u8]) -> Result<Response> {
        self.run(&Command::SaslStep {
            mechanism: mechanism.as_bytes(),
            data,
        })
        .await
    }

    /// Authenticates with SASL PLAIN (`\0user\0password`).
    ///
    /// # Errors
    /// [`Error::Status`] with 0x20 AuthError when the server refuses, plus I/O errors.
    pub async fn auth_plain(&mut self, user: &str, password: &str) -> Result<()> {
        let mut data = Vec::with_capacity(2 + user.len() + password.len());
        data.push(0);
        data.extend_from_slice(user.as_bytes());
        data.push(0);
        data.extend_from_slice(password.as_bytes());
        self.sasl_auth("PLAIN", &data).await?.into_result()?;
        Ok(())
    }

    /// SELECT_BUCKET.
    ///
    /// # Errors
    /// I/O and protocol errors; the status (0x24 Eaccess when refused) is in the response.
    pub async fn select_bucket(&mut self, name: &str) -> Result<Response> {
        self.run(&Command::SelectBucket {
            name: name.as_bytes(),
        })
        .await
    }

    /// GET_ERROR_MAP for `version`.
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn get_error_map(&mut self, version: u16) -> Result<Response> {
        self.run(&Command::GetErrorMap { version }).await
    }

    /// GET_CLUSTER_CONFIG, optionally naming the `(epoch, revision)` already known.
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn get_cluster_config(
        &mut self,
        known_version: Option<(i64, i64)>,
    ) -> Result<Response> {
        self.run(&Command::GetClusterConfig { known_version }).await
    }

    /// OBSERVE_SEQNO for `vbucket`, naming the vBucket UUID of a mutation token.
    ///
    /// # Errors
    /// I/O and protocol errors; the status is in the response.
    pub async fn observe_seqno(&mut self, vbucket: Vbid, vbucket_uuid: u64) -> Result<Response> {
        let b =
            RequestBuilder::from_command(&Command::ObserveSeqno { vbucket_uuid }).vbucket(vbucket);
        self.request(b).await
    }

    /// QUIT: waits for the reply and for the server to close the connection.
    ///
    /// # Errors
    /// [`Error::Status`] on a non-success status, [`Error::Malformed`] when the server
    /// keeps the connection open and sends more, plus I/O errors.
    pub async fn quit(mut self) -> Result<()> {
        self.run(&Command::Quit { quiet: false })
            .await?
            .into_result()?;
        self.wait_closed().await
    }

    /// Returns the client's settings.
    #[must_use]
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }
}

/// Reads the next response from `rd`, buffering in `rbuf`.
async fn read_response<R: AsyncRead + Unpin>(
    rd: &mut R,
    rbuf: &mut BytesMut,
    config: &ClientConfig,
) -> Result<Response> {
    loop {
        if let Some(n) = response_frame_len(rbuf, &config.limits)? {
            let packet = rbuf.split_to(n).freeze();
            return to_response(packet, &config.limits);
        }
        if read_more(rd, rbuf, config).await? == 0 {
            return Err(Error::Closed {
                buffered: rbuf.len(),
            });
        }
    }
}

/// Reads more bytes into `rbuf`, reserving only what a trusted header announces (bounded
/// by the limits); returns the bytes read (0 at end of stream).
async fn read_more<R: AsyncRead + Unpin>(
    rd: &mut R,
    rbuf: &mut BytesMut,
    config: &ClientConfig,
) -> Result<usize> {
    let needed = match rbuf.first_chunk::<HEADER_LEN>() {
        Some(head) => ResponseHeader::decode(head, &config.limits)?.packet_len(),
        None => HEADER_LEN,
    };
    rbuf.reserve(needed.saturating_sub(rbuf.len()).max(MIN_READ_BYTES));
    let read = rd.read_buf(rbuf);
    let n = match config.timeout {
        Some(t) => tokio::time::timeout(t, read)
            .await
            .map_err(|_| Error::Timeout)??,
        None => read.await?,
    };
    Ok(n)
}

/// Splits a whole response packet into an owned [`Response`] without copying.
fn to_response(packet: Bytes, limits: &Limits) -> Result<Response> {
    let view = epkv_protocol::Response::parse(&packet, limits)?;
    let mut at = HEADER_LEN;
    let mut take = |len: usize| {
        let s = packet.slice(at..at + len);
        at += len;
        s
    };
    let framing_extras = take(view.framing_extras.len());
    let extras = take(view.extras.len());
    let key = take(view.key.len());
    let value = take(view.value.len());
    Ok(Response {
        opcode: view.opcode,
        status_raw: view.status,
        opaque: view.opaque,
        cas: view.cas,
        datatype: view.datatype,
        framing_extras,
        extras,
        key,
        value,
    })
}
