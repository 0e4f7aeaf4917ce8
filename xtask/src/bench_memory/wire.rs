//! Two small blocking clients for the memory benches: the memcached binary protocol (epkv
//! and memcached) and RESP (Redis). They pipeline: requests are queued in a buffer, sent
//! with one write, and the replies read back in order.
//!
//! The connections are written here rather than taken from `epkv-client` (async, tokio)
//! so that the benches drive servers from plain threads; the binary protocol's encoding,
//! header checks and vBucket mapping are `epkv-protocol`'s and `epkv-types`'. Every read
//! has a timeout, so a silent server fails the bench instead of hanging it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use epkv_protocol::{HEADER_LEN, Limits, Opcode, RequestBuilder, ResponseHeader, Status};
use epkv_types::Vbid;

/// Longest wait for any one reply (a background fetch from a cold disk is milliseconds).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Couchbase's vBucket count.
const NUM_VBUCKETS: u16 = epkv_types::NUM_VBUCKETS;

/// One binary protocol reply (extras left out).
#[derive(Debug, Clone)]
pub(crate) struct Response {
    pub(crate) opcode: u8,
    pub(crate) status: u16,
    pub(crate) opaque: u32,
    pub(crate) cas: epkv_types::Cas,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Vec<u8>,
}

/// One TCP connection, pipelined: requests are queued in `out` and sent with one write.
#[derive(Debug)]
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    out: Vec<u8>,
}

impl Conn {
    /// Connects to `addr`, with the reply timeout on every read and write.
    fn connect(addr: &str) -> Result<Self> {
        let stream = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        stream.set_write_timeout(Some(READ_TIMEOUT))?;
        Ok(Self {
            reader: BufReader::with_capacity(1 << 16, stream.try_clone()?),
            writer: stream,
            out: Vec::with_capacity(1 << 16),
        })
    }

    /// Wraps a connected stream (its timeouts as they are).
    fn from_stream(stream: TcpStream) -> Result<Self> {
        Ok(Self {
            reader: BufReader::with_capacity(1 << 16, stream.try_clone()?),
            writer: stream,
            out: Vec::with_capacity(1 << 16),
        })
    }

    /// Sends everything queued.
    fn flush(&mut self) -> Result<()> {
        self.writer.write_all(&self.out)?;
        self.out.clear();
        Ok(())
    }
}

/// A blocking memcached binary protocol connection.
#[derive(Debug)]
pub(crate) struct BinClient {
    conn: Conn,
    /// Put the key's vBucket in each request's header (epkv); memcached gets 0.
    vbuckets: bool,
    /// Keys start with a LEB128 collection id (HELLO Collections): the vBucket is the
    /// key's without it.
    collections: bool,
}

impl BinClient {
    /// Connects to `addr`. With `vbuckets`, document requests carry the key's vBucket.
    pub(crate) fn connect(addr: &str, vbuckets: bool) -> Result<Self> {
        Ok(Self {
            conn: Conn::connect(addr)?,
            vbuckets,
            collections: false,
        })
    }

    /// Wraps a connected stream (no vBuckets in headers; its timeouts as they are).
    ///
    /// # Panics
    /// Never; a stream that cannot be cloned gives an error.
    pub(crate) fn from_stream(stream: TcpStream) -> Self {
        match Conn::from_stream(stream) {
            Ok(conn) => Self {
                conn,
                vbuckets: false,
                collections: false,
            },
            Err(e) => panic!("cannot clone a connected stream: {e:#}"),
        }
    }

    /// Queues one request (sent by [`BinClient::flush`]).
    pub(crate) fn queue(
        &mut self,
        opcode: Opcode,
        key: &[u8],
        extras: &[u8],
        value: &[u8],
        opaque: u32,
    ) -> Result<()> {
        let b = RequestBuilder::new(opcode)
            .key(key)
            .extras(extras)
            .value(value)
            .opaque(opaque);
        self.push(opcode, key, b)
    }

    /// Queues a SET (or SETQ) with flags 0, no expiry, datatype `datatype` and the CAS
    /// it must match (`Cas::ANY` for none).
    pub(crate) fn queue_set_datatype(
        &mut self,
        opcode: Opcode,
        key: &[u8],
        value: &[u8],
        datatype: epkv_types::Datatype,
        cas: epkv_types::Cas,
        opaque: u32,
    ) -> Result<()> {
        let b = RequestBuilder::new(opcode)
            .key(key)
            .extras(&[0; 8])
            .value(value)
            .datatype(datatype)
            .cas(cas)
            .opaque(opaque);
        self.push(opcode, key, b)
    }

    /// Encodes `b` into the output buffer, with the key's vBucket when asked for.
    fn push(&mut self, opcode: Opcode, key: &[u8], b: RequestBuilder<'_>) -> Result<()> {
        let vbucket = if self.vbuckets && !key.is_empty() && opcode != Opcode::Stat {
            let raw = match epkv_types::doc_key::leb128_decode(key) {
                Some((_, n)) if self.collections => &key[n..],
                _ => key,
            };
            epkv_types::vbucket_for_key(raw, NUM_VBUCKETS)
        } else {
            Vbid(0)
        };
        b.vbucket(vbucket)
            .encode(&mut self.conn.out)
            .with_context(|| format!("encode {}", opcode.name()))
    }

    /// HELLO with Collections (and XERROR): from now on keys carry their collection id.
    ///
    /// # Errors
    /// I/O, or a server that does not agree to collections.
    pub(crate) fn negotiate_collections(&mut self) -> Result<()> {
        let mut features = Vec::new();
        for f in [
            epkv_protocol::Feature::Xerror,
            epkv_protocol::Feature::Collections,
        ] {
            features.extend_from_slice(&f.as_u16().to_be_bytes());
        }
        self.queue(Opcode::Hello, b"xtask-bench", b"", &features, 0)?;
        self.flush()?;
        let r = self.recv()?;
        let agreed = r
            .value
            .chunks(2)
            .any(|c| c == epkv_protocol::Feature::Collections.as_u16().to_be_bytes());
        if r.status != 0 || !agreed {
            anyhow::bail!("the server did not agree to collections");
        }
        self.collections = true;
        Ok(())
    }

    /// Queues a SET (or SETQ) with flags 0 and no expiry.
    pub(crate) fn queue_set(
        &mut self,
        opcode: Opcode,
        key: &[u8],
        value: &[u8],
        opaque: u32,
    ) -> Result<()> {
        self.queue(opcode, key, &[0; 8], value, opaque)
    }

    /// Sends everything queued.
    pub(crate) fn flush(&mut self) -> Result<()> {
        self.conn.flush()
    }

    /// Reads the next reply.
    pub(crate) fn recv(&mut self) -> Result<Response> {
        let mut h = [0u8; HEADER_LEN];
        self.conn
            .reader
            .read_exact(&mut h)
            .context("read reply header")?;
        decode_response(&h, &mut self.conn.reader)
    }

    /// Sends what is queued plus a NOOP and reads up to the NOOP's reply. Returns the
    /// replies before it: the failures of quiet requests, or every reply of loud ones.
    pub(crate) fn fence(&mut self) -> Result<Vec<Response>> {
        self.queue(Opcode::Noop, b"", b"", b"", u32::MAX)?;
        self.flush()?;
        let mut replies = Vec::new();
        loop {
            let r = self.recv()?;
            if r.opcode == Opcode::Noop.as_u8() && r.opaque == u32::MAX {
                return Ok(replies);
            }
            replies.push(r);
        }
    }

    /// One GET, waiting for its reply.
    pub(crate) fn get(&mut self, key: &[u8]) -> Result<Response> {
        self.queue(Opcode::Get, key, b"", b"", 0)?;
        self.flush()?;
        self.recv()
    }

    /// The STAT group `group` ("" for the default group) as name → value.
    pub(crate) fn stats(&mut self, group: &str) -> Result<BTreeMap<String, String>> {
        self.queue(Opcode::Stat, group.as_bytes(), b"", b"", 0)?;
        self.flush()?;
        let mut out = BTreeMap::new();
        // A stat group ends with an empty key; bound the loop all the same.
        for _ in 0..1_000_000 {
            let r = self.recv()?;
            if r.status != Status::Success.as_u16() {
                bail!("STAT {group:?} answered status {:#x}", r.status);
            }
            if r.key.is_empty() {
                return Ok(out);
            }
            out.insert(
                String::from_utf8_lossy(&r.key).into_owned(),
                String::from_utf8_lossy(&r.value).into_owned(),
            );
        }
        bail!("STAT {group:?} did not end")
    }
}

/// Decodes a reply from its 24-byte header, reading its body from `r`.
/// Checks the header (magic, lengths, packet size) with the protocol crate's decoder.
fn decode_response(h: &[u8; HEADER_LEN], r: &mut impl Read) -> Result<Response> {
    let h = ResponseHeader::decode(h, &Limits::default())
        .map_err(|e| anyhow::anyhow!("bad reply header: {e}"))?;
    let mut body = vec![0u8; h.body_len as usize];
    r.read_exact(&mut body).context("read reply body")?;
    let key_at = usize::from(h.framing_extras_len) + usize::from(h.extras_len);
    let value_at = key_at + usize::from(h.key_len);
    Ok(Response {
        opcode: h.opcode,
        status: h.status,
        opaque: h.opaque,
        cas: h.cas,
        key: body[key_at..value_at].to_vec(),
        value: body[value_at..].to_vec(),
    })
}

/// One RESP reply (arrays are not needed here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// `+OK`
    Simple(String),
    /// `-ERR ...`
    Error(String),
    /// `:42`
    Int(i64),
    /// `$n` followed by n bytes, or `$-1` (none).
    Bulk(Option<Vec<u8>>),
}

/// A blocking RESP (Redis) connection.
#[derive(Debug)]
pub(crate) struct RespClient {
    conn: Conn,
}

impl RespClient {
    /// Connects to `addr`.
    pub(crate) fn connect(addr: &str) -> Result<Self> {
        Ok(Self {
            conn: Conn::connect(addr)?,
        })
    }

    /// Queues one command (sent by [`RespClient::flush`]).
    pub(crate) fn queue(&mut self, args: &[&[u8]]) {
        encode_command(&mut self.conn.out, args);
    }

    /// Sends everything queued.
    pub(crate) fn flush(&mut self) -> Result<()> {
        self.conn.flush()
    }

    /// Reads the next reply.
    pub(crate) fn recv(&mut self) -> Result<Reply> {
        read_reply(&mut self.conn.reader)
    }

    /// Sends one command and reads its reply.
    pub(crate) fn command(&mut self, args: &[&[u8]]) -> Result<Reply> {
        self.queue(args);
        self.flush()?;
        self.recv()
    }

    /// `INFO section` as name → value.
    pub(crate) fn info(&mut self, section: &str) -> Result<BTreeMap<String, String>> {
        match self.command(&[b"INFO", section.as_bytes()])? {
            Reply::Bulk(Some(text)) => Ok(String::from_utf8_lossy(&text)
                .lines()
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
                .collect()),
            other => bail!("INFO {section} answered {other:?}"),
        }
    }
}

/// Appends one command as a RESP array of bulk strings.
pub(crate) fn encode_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Reads one RESP reply.
pub(crate) fn read_reply(r: &mut impl BufRead) -> Result<Reply> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line).context("read RESP reply")?;
    if !line.ends_with(b"\r\n") {
        bail!(
            "RESP reply line not ended by CRLF: {:?}",
            String::from_utf8_lossy(&line)
        );
    }
    let text = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
    match line[0] {
        b'+' => Ok(Reply::Simple(text)),
        b'-' => Ok(Reply::Error(text)),
        b':' => Ok(Reply::Int(text.parse().context("RESP integer")?)),
        b'$' => {
            let n: i64 = text.parse().context("RESP bulk length")?;
            let Ok(n) = usize::try_from(n) else {
                return Ok(Reply::Bulk(None));
            };
            let mut body = vec![0u8; n + 2];
            r.read_exact(&mut body).context("read RESP bulk string")?;
            body.truncate(n);
            Ok(Reply::Bulk(Some(body)))
        }
        other => bail!("unexpected RESP reply type {:?}", char::from(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_splits_extras_key_and_value() {
        let mut h = [0u8; 24];
        h[0] = 0x81;
        h[1] = Opcode::Stat.as_u8();
        h[3] = 2; // key length
        h[4] = 1; // extras length
        h[7] = 0x86; // status
        h[11] = 6; // body length
        h[15] = 5; // opaque
        let body = [9u8, b'k', b'y', b'v', b'a', b'l'];
        let r = decode_response(&h, &mut &body[..]).unwrap();
        assert_eq!(
            (r.opcode, r.status, r.opaque),
            (Opcode::Stat.as_u8(), Status::Etmpfail.as_u16(), 5)
        );
        assert_eq!(
            (r.key.as_slice(), r.value.as_slice()),
            (&b"ky"[..], &b"val"[..])
        );
        h[0] = 0x80;
        assert!(decode_response(&h, &mut &body[..]).is_err());
    }

    #[test]
    fn resp_round_trips() {
        let mut out = Vec::new();
        encode_command(&mut out, &[b"SET", b"k", b"v1"]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv1\r\n");
        let mut input: &[u8] = b"+OK\r\n-ERR no\r\n:12\r\n$3\r\na\r\n\r\n$-1\r\n";
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Simple("OK".into()));
        assert_eq!(
            read_reply(&mut input).unwrap(),
            Reply::Error("ERR no".into())
        );
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Int(12));
        assert_eq!(
            read_reply(&mut input).unwrap(),
            Reply::Bulk(Some(b"a\r\n".to_vec()))
        );
        assert_eq!(read_reply(&mut input).unwrap(), Reply::Bulk(None));
        assert!(read_reply(&mut input).is_err());
    }
}
