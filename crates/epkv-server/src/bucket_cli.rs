//! `epkv-server bucket create|drop NAME` and `epkv-server collection create|drop
//! BUCKET SCOPE.COLLECTION` (and `scope create|drop BUCKET SCOPE`): call the management
//! REST API of a running server (`/pools/default/buckets[/NAME]`,
//! `/pools/default/buckets/NAME/scopes[/...]`) with a small blocking HTTP/1.1 client (one
//! request per connection).

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long a request may take (creating a bucket warms it up).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the server is and who asks.
#[derive(Debug, clap::Args)]
pub(crate) struct Target {
    /// The server's host (its --bind address)
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The server's management port (--mgmt-port)
    #[arg(long, default_value_t = 8091)]
    port: u16,
    /// An administrator's name (a user with access to every bucket); also EPKV_ADMIN_USER
    #[arg(long, env = "EPKV_ADMIN_USER", default_value = "")]
    user: String,
    /// Their password; also EPKV_ADMIN_PASSWORD
    #[arg(
        long,
        env = "EPKV_ADMIN_PASSWORD",
        hide_env_values = true,
        default_value = ""
    )]
    password: String,
}

/// `epkv-server bucket ...`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum BucketCommand {
    /// Create a bucket (persistent unless --bucket-type ephemeral)
    Create {
        /// The bucket name
        name: String,
        /// Memory quota in MiB (default: the server's memory-quota)
        #[arg(long, value_name = "MIB")]
        quota: Option<u64>,
        /// valueOnly or fullEviction (persistent), noEviction or nruEviction (ephemeral)
        #[arg(long)]
        eviction_policy: Option<String>,
        /// couchbase (persistent) or ephemeral
        #[arg(long, default_value = "couchbase")]
        bucket_type: String,
        /// Allow FLUSH on the bucket
        #[arg(long)]
        flush_enabled: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Drop a bucket created at run time, with its data
    Drop {
        /// The bucket name
        name: String,
        #[command(flatten)]
        target: Target,
    },
}

/// `epkv-server collection ...`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum CollectionCommand {
    /// Create a collection in an existing scope
    Create {
        /// The bucket
        bucket: String,
        /// The collection, as SCOPE.COLLECTION
        path: String,
        /// Seconds of life of documents written without an expiry (0: none)
        #[arg(long, default_value_t = 0)]
        max_ttl: u32,
        #[command(flatten)]
        target: Target,
    },
    /// Drop a collection and its documents
    Drop {
        /// The bucket
        bucket: String,
        /// The collection, as SCOPE.COLLECTION
        path: String,
        #[command(flatten)]
        target: Target,
    },
}

/// `epkv-server scope ...`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum ScopeCommand {
    /// Create a scope
    Create {
        /// The bucket
        bucket: String,
        /// The scope's name
        name: String,
        #[command(flatten)]
        target: Target,
    },
    /// Drop a scope with its collections and their documents
    Drop {
        /// The bucket
        bucket: String,
        /// The scope's name
        name: String,
        #[command(flatten)]
        target: Target,
    },
}

/// Sends a management request and fails with the server's answer unless it succeeded.
fn call(target: &Target, method: &str, path: &str, form: &str, what: &str) -> Result<()> {
    let (status, body) = request(target, method, path, form)?;
    if !(200..300).contains(&status) {
        bail!("the server refused to {what} ({status}): {body}");
    }
    println!("{what}: done ({body})");
    Ok(())
}

/// Runs a `collection` subcommand.
pub(crate) fn run_collection(cmd: &CollectionCommand) -> Result<()> {
    let (bucket, path, target) = match cmd {
        CollectionCommand::Create {
            bucket,
            path,
            target,
            ..
        }
        | CollectionCommand::Drop {
            bucket,
            path,
            target,
        } => (bucket, path, target),
    };
    let Some((scope, name)) = path.split_once('.') else {
        bail!("the collection must be written SCOPE.COLLECTION, not {path:?}");
    };
    let base = format!(
        "/pools/default/buckets/{}/scopes/{}/collections",
        encode(bucket),
        encode(scope)
    );
    match cmd {
        CollectionCommand::Create { max_ttl, .. } => call(
            target,
            "POST",
            &base,
            &format!("name={}&maxTTL={max_ttl}", encode(name)),
            &format!("create collection {path:?} in bucket {bucket:?}"),
        ),
        CollectionCommand::Drop { .. } => call(
            target,
            "DELETE",
            &format!("{base}/{}", encode(name)),
            "",
            &format!("drop collection {path:?} of bucket {bucket:?}"),
        ),
    }
}

/// Runs a `scope` subcommand.
pub(crate) fn run_scope(cmd: &ScopeCommand) -> Result<()> {
    match cmd {
        ScopeCommand::Create {
            bucket,
            name,
            target,
        } => call(
            target,
            "POST",
            &format!("/pools/default/buckets/{}/scopes", encode(bucket)),
            &format!("name={}", encode(name)),
            &format!("create scope {name:?} in bucket {bucket:?}"),
        ),
        ScopeCommand::Drop {
            bucket,
            name,
            target,
        } => call(
            target,
            "DELETE",
            &format!(
                "/pools/default/buckets/{}/scopes/{}",
                encode(bucket),
                encode(name)
            ),
            "",
            &format!("drop scope {name:?} of bucket {bucket:?}"),
        ),
    }
}

/// Percent-encodes a form value or path segment (unreserved characters stay).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Runs a `bucket` subcommand.
pub(crate) fn run(cmd: &BucketCommand) -> Result<()> {
    match cmd {
        BucketCommand::Create {
            name,
            quota,
            eviction_policy,
            bucket_type,
            flush_enabled,
            target,
        } => {
            let mut form = format!(
                "name={}&bucketType={}&replicaNumber=0&flushEnabled={}",
                encode(name),
                encode(bucket_type),
                u8::from(*flush_enabled)
            );
            if let Some(q) = quota {
                form.push_str(&format!("&ramQuotaMB={q}"));
            }
            if let Some(e) = eviction_policy {
                form.push_str(&format!("&evictionPolicy={}", encode(e)));
            }
            let (status, body) = request(target, "POST", "/pools/default/buckets", &form)?;
            if !(200..300).contains(&status) {
                bail!("the server refused to create bucket {name:?} ({status}): {body}");
            }
            println!("bucket {name:?} created");
        }
        BucketCommand::Drop { name, target } => {
            let path = format!("/pools/default/buckets/{}", encode(name));
            let (status, body) = request(target, "DELETE", &path, "")?;
            if !(200..300).contains(&status) {
                bail!("the server refused to drop bucket {name:?} ({status}): {body}");
            }
            println!("bucket {name:?} dropped");
        }
    }
    Ok(())
}

/// Sends one request and returns the status and body.
fn request(t: &Target, method: &str, path: &str, form: &str) -> Result<(u16, String)> {
    let addr = (t.host.as_str(), t.port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {}", t.host))?
        .next()
        .with_context(|| format!("no address for {}", t.host))?;
    let mut stream =
        TcpStream::connect_timeout(&addr, Duration::from_secs(10)).with_context(|| {
            format!(
                "cannot connect to {addr}; is epkv-server running with --mgmt-port {}?",
                t.port
            )
        })?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let auth = if t.user.is_empty() {
        String::new()
    } else {
        format!(
            "Authorization: Basic {}\r\n",
            B64.encode(format!("{}:{}", t.user, t.password))
        )
    };
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: \
         application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{form}",
        form.len()
    )
    .context("cannot send the request")?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .context("cannot read the reply")?;
    parse_reply(&raw)
}

/// Splits an HTTP/1.1 reply (read to the end of the connection) into status and body.
fn parse_reply(raw: &[u8]) -> Result<(u16, String)> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").context("not an HTTP reply")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no status in the HTTP reply")?;
    Ok((status, body.trim().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_percent_encoded() {
        assert_eq!(encode("travel-1.x_~"), "travel-1.x_~");
        assert_eq!(encode("a b%&="), "a%20b%25%26%3D");
    }

    #[test]
    fn replies_parse() {
        let (s, b) = parse_reply(b"HTTP/1.1 400 Bad Request\r\nA: b\r\n\r\n{\"x\":1}\n").unwrap();
        assert_eq!((s, b.as_str()), (400, "{\"x\":1}"));
        assert!(parse_reply(b"garbage").is_err());
    }
}
