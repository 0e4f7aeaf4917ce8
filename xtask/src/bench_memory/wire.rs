//! Two small blocking clients for the memory benches: the memcached binary protocol (epkv
//! and memcached) and RESP (Redis). They pipeline: requests are queued in a buffer, sent
//! with one write, and the replies read back in order.
//!
//! Written here rather than taken from `epkv-client` so that xtask talks to all three
//! servers with the same few lines of code, without an async runtime. Every read has a
//! timeout, so a silent server fails the bench instead of hanging it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// Longest wait for any one reply (a background fetch from a cold disk is milliseconds).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Binary protocol opcodes used here.
pub(crate) mod opcode {
    /// GET.
    pub(crate) const GET: u8 = 0x00;
    /// SET.
    pub(crate) const SET: u8 = 0x01;
    /// NOOP (answered after everything sent before it).
    pub(crate) const NOOP: u8 = 0x0a;
    /// STAT.
    pub(crate) const STAT: u8 = 0x10;
    /// SETQ: SET answered only on failure.
    pub(crate) const SETQ: u8 = 0x11;
}

/// Binary protocol statuses used here.
pub(crate) mod status {
    /// Success.
    pub(crate) const SUCCESS: u16 = 0x00;
    /// Temporary failure: retry later (epkv, no room under the quota yet).
    pub(crate) const TMPFAIL: u16 = 0x86;
}

/// Couchbase's vBucket count, as `epkv_types::NUM_VBUCKETS`.
const NUM_VBUCKETS: u32 = 1024;

/// The key's vBucket as Couchbase clients compute it (`epkv_types::vbucket_for_key`).
pub(crate) fn vbucket_of(key: &[u8]) -> u16 {
    let crc = crc32fast::hash(key);
    // `% 1024` fits in a u16.
    (((crc >> 16) & 0x7fff) % NUM_VBUCKETS) as u16
}

/// One binary protocol reply (extras left out).
#[derive(Debug, Clone)]
pub(crate) struct Response {
    pub(crate) opcode: u8,
    pub(crate) status: u16,
    pub(crate) opaque: u32,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Vec<u8>,
}

/// A blocking memcached binary protocol connection.
#[derive(Debug)]
pub(crate) struct BinClient {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    out: Vec<u8>,
    /// Put the key's vBucket in each request's header (epkv); memcached gets 0.
    vbuckets: bool,
}

impl BinClient {
    /// Connects to `addr`. With `vbuckets`, document requests carry the key's vBucket.
    pub(crate) fn connect(addr: &str, vbuckets: bool) -> Result<Self> {
        let stream = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        stream.set_write_timeout(Some(READ_TIMEOUT))?;
        Ok(Self {
            reader: BufReader::with_capacity(1 << 16, stream.try_clone()?),
            writer: stream,
            out: Vec::with_capacity(1 << 16),
            vbuckets,
        })
    }

    /// Queues one request (sent by [`BinClient::flush`]).
    pub(crate) fn queue(
        &mut self,
        opcode: u8,
        key: &[u8],
        extras: &[u8],
        value: &[u8],
        opaque: u32,
    ) {
        let vbucket = if self.vbuckets && !key.is_empty() && opcode != opcode::STAT {
            vbucket_of(key)
        } else {
            0
        };
        encode_request(&mut self.out, opcode, key, extras, value, vbucket, opaque);
    }

    /// Queues a SET (or SETQ) with flags 0 and no expiry.
    pub(crate) fn queue_set(&mut self, opcode: u8, key: &[u8], value: &[u8], opaque: u32) {
        self.queue(opcode, key, &[0; 8], value, opaque);
    }

    /// Sends everything queued.
    pub(crate) fn flush(&mut self) -> Result<()> {
        self.writer.write_all(&self.out)?;
        self.out.clear();
        Ok(())
    }

    /// Reads the next reply.
    pub(crate) fn recv(&mut self) -> Result<Response> {
        let mut h = [0u8; 24];
        self.reader
            .read_exact(&mut h)
            .context("read reply header")?;
        decode_response(&h, &mut self.reader)
    }

    /// Sends what is queued plus a NOOP and reads up to the NOOP's reply. Returns the
    /// replies before it: the failures of quiet requests, or every reply of loud ones.
    pub(crate) fn fence(&mut self) -> Result<Vec<Response>> {
        self.queue(opcode::NOOP, b"", b"", b"", u32::MAX);
        self.flush()?;
        let mut replies = Vec::new();
        loop {
            let r = self.recv()?;
            if r.opcode == opcode::NOOP && r.opaque == u32::MAX {
                return Ok(replies);
            }
            replies.push(r);
        }
    }

    /// One GET, waiting for its reply.
    pub(crate) fn get(&mut self, key: &[u8]) -> Result<Response> {
        self.queue(opcode::GET, key, b"", b"", 0);
        self.flush()?;
        self.recv()
    }

    /// The STAT group `group` ("" for the default group) as name → value.
    pub(crate) fn stats(&mut self, group: &str) -> Result<BTreeMap<String, String>> {
        self.queue(opcode::STAT, group.as_bytes(), b"", b"", 0);
        self.flush()?;
        let mut out = BTreeMap::new();
        // A stat group ends with an empty key; bound the loop all the same.
        for _ in 0..1_000_000 {
            let r = self.recv()?;
            if r.status != status::SUCCESS {
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

/// Appends one request to `out`.
pub(crate) fn encode_request(
    out: &mut Vec<u8>,
    opcode: u8,
    key: &[u8],
    extras: &[u8],
    value: &[u8],
    vbucket: u16,
    opaque: u32,
) {
    let body = extras.len() + key.len() + value.len();
    out.push(0x80);
    out.push(opcode);
    out.extend_from_slice(&u16::try_from(key.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.push(u8::try_from(extras.len()).unwrap_or(u8::MAX));
    out.push(0); // datatype
    out.extend_from_slice(&vbucket.to_be_bytes());
    out.extend_from_slice(&u32::try_from(body).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&[0; 8]); // CAS
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// Decodes a reply from its 24-byte header, reading its body from `r`.
fn decode_response(h: &[u8; 24], r: &mut impl Read) -> Result<Response> {
    if h[0] != 0x81 {
        bail!("not a binary protocol reply (magic {:#04x})", h[0]);
    }
    let key_len = usize::from(u16::from_be_bytes([h[2], h[3]]));
    let extras_len = usize::from(h[4]);
    let body_len = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
    if body_len < key_len + extras_len {
        bail!("reply body of {body_len} bytes is shorter than its key and extras");
    }
    let mut body = vec![0u8; body_len];
    r.read_exact(&mut body).context("read reply body")?;
    Ok(Response {
        opcode: h[1],
        status: u16::from_be_bytes([h[6], h[7]]),
        opaque: u32::from_be_bytes([h[12], h[13], h[14], h[15]]),
        key: body[extras_len..extras_len + key_len].to_vec(),
        value: body[extras_len + key_len..].to_vec(),
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
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    out: Vec<u8>,
}

impl RespClient {
    /// Connects to `addr`.
    pub(crate) fn connect(addr: &str) -> Result<Self> {
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

    /// Queues one command (sent by [`RespClient::flush`]).
    pub(crate) fn queue(&mut self, args: &[&[u8]]) {
        encode_command(&mut self.out, args);
    }

    /// Sends everything queued.
    pub(crate) fn flush(&mut self) -> Result<()> {
        self.writer.write_all(&self.out)?;
        self.out.clear();
        Ok(())
    }

    /// Reads the next reply.
    pub(crate) fn recv(&mut self) -> Result<Reply> {
        read_reply(&mut self.reader)
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
    fn vbuckets_match_couchbase_clients() {
        // The values epkv_types' own test pins.
        assert_eq!(vbucket_of(b"k1"), 526);
        assert_eq!(vbucket_of(b"k3"), 0);
    }

    #[test]
    fn request_header_is_laid_out_as_the_protocol_says() {
        let mut out = Vec::new();
        encode_request(&mut out, opcode::SETQ, b"key", &[0; 8], b"value", 7, 9);
        assert_eq!(out.len(), 24 + 8 + 3 + 5);
        assert_eq!(&out[..8], &[0x80, 0x11, 0, 3, 8, 0, 0, 7]);
        assert_eq!(&out[8..16], &[0, 0, 0, 16, 0, 0, 0, 9]);
        assert_eq!(&out[32..35], b"key");
        assert_eq!(&out[35..], b"value");
    }

    #[test]
    fn response_splits_extras_key_and_value() {
        let mut h = [0u8; 24];
        h[0] = 0x81;
        h[1] = opcode::STAT;
        h[3] = 2; // key length
        h[4] = 1; // extras length
        h[7] = 0x86; // status
        h[11] = 6; // body length
        h[15] = 5; // opaque
        let body = [9u8, b'k', b'y', b'v', b'a', b'l'];
        let r = decode_response(&h, &mut &body[..]).unwrap();
        assert_eq!(
            (r.opcode, r.status, r.opaque),
            (opcode::STAT, status::TMPFAIL, 5)
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
