//! `epkv-scan`: times a full range scan of a bucket with the raw client, as the SDKs scan
//! (RANGE_SCAN_CREATE then RANGE_SCAN_CONTINUE on each of the 1024 vBuckets in turn),
//! keys only and with documents, and prints one JSON line per mode with items per
//! second. With `--load N` it first writes N documents (`scan-0000000`...).

use clap::Parser;
use epkv_client::{Client, ClientConfig};
use epkv_protocol::range_scan::{self as wire, ContinueRequest};
use epkv_protocol::{Feature, Opcode, RequestBuilder, Status};
use epkv_types::{NUM_VBUCKETS, Vbid};
use std::process::ExitCode;
use std::time::Duration;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "epkv-scan",
    about = "Times a full range scan over every vBucket"
)]
struct Cli {
    /// The server.
    #[arg(long, default_value = "127.0.0.1:11210")]
    addr: String,
    /// User (SASL PLAIN); none for the open mode.
    #[arg(long)]
    user: Option<String>,
    /// Password of `user`.
    #[arg(long, default_value = "")]
    password: String,
    /// Bucket to scan.
    #[arg(long, default_value = "default")]
    bucket: String,
    /// Documents to write first (0: scan what is there).
    #[arg(long, default_value_t = 0)]
    load: usize,
    /// Bytes of each loaded value.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// Items per continue (the SDKs default to 50).
    #[arg(long, default_value_t = 50)]
    item_limit: u32,
    /// Bytes per continue (the SDKs default to 15000).
    #[arg(long, default_value_t = 15_000)]
    byte_limit: u32,
}

/// SETs pipelined per round trip when loading.
const LOAD_BATCH: usize = 256;

async fn connect(cli: &Cli) -> Result<Client> {
    let config = ClientConfig {
        timeout: Some(Duration::from_secs(60)),
        ..ClientConfig::default()
    };
    let mut c = Client::connect_with(cli.addr.as_str(), config).await?;
    c.hello("epkv-scan", &[Feature::Xerror, Feature::Json])
        .await?;
    if let Some(user) = &cli.user {
        c.auth_plain(user, &cli.password).await?;
    }
    if !c.select_bucket(&cli.bucket).await?.is_success() {
        return Err(format!("cannot select bucket {}", cli.bucket).into());
    }
    Ok(c)
}

async fn load(c: &mut Client, n: usize, value_bytes: usize) -> Result<()> {
    let value = vec![b'v'; value_bytes];
    let extras = [0u8; 8];
    let keys: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("scan-{i:07}").into_bytes())
        .collect();
    for chunk in keys.chunks(LOAD_BATCH) {
        for k in chunk {
            let vb = c.vbucket_for(k);
            c.queue(
                RequestBuilder::new(Opcode::Set)
                    .vbucket(vb)
                    .key(k)
                    .value(&value)
                    .extras(&extras),
            )?;
        }
        for r in c.flush_and_recv(chunk.len()).await? {
            if !r.is_success() {
                return Err(format!("SET answered {:?}", r.status()).into());
            }
        }
    }
    Ok(())
}

/// Scans every vBucket; returns the items and the bytes of keys and values returned.
async fn scan_all(c: &mut Client, cli: &Cli, key_only: bool) -> Result<(u64, u64)> {
    let spec = format!(r#"{{"key_only":{key_only},"range":{{"start":"AA==","end":"/w=="}}}}"#);
    let (mut items, mut bytes) = (0u64, 0u64);
    for vb in 0..NUM_VBUCKETS {
        let vb = Vbid(vb);
        let r = c.range_scan_create(vb, spec.as_bytes()).await?;
        match r.status() {
            Some(Status::Success) => {}
            Some(Status::KeyEnoent) => continue,
            other => return Err(format!("create on {vb:?} answered {other:?}").into()),
        }
        let id: [u8; 16] = r.value[..].try_into()?;
        let req = ContinueRequest {
            id,
            item_limit: cli.item_limit,
            time_limit_ms: 0,
            byte_limit: cli.byte_limit,
        };
        let mut done = false;
        while !done {
            let responses = c.range_scan_continue(vb, req).await?;
            for r in &responses {
                bytes += r.value.len() as u64;
                items += if key_only {
                    wire::keys(&r.value).count() as u64
                } else {
                    wire::documents(&r.value).count() as u64
                };
                match r.status() {
                    Some(Status::Success | Status::RangeScanMore) => {}
                    Some(Status::RangeScanComplete) => done = true,
                    other => return Err(format!("continue on {vb:?} answered {other:?}").into()),
                }
            }
        }
    }
    Ok((items, bytes))
}

async fn run(cli: &Cli) -> Result<()> {
    let mut c = connect(cli).await?;
    if cli.load > 0 {
        load(&mut c, cli.load, cli.value_bytes).await?;
    }
    let clock = epkv_executor::SystemClock;
    for key_only in [true, false] {
        let started = epkv_executor::Clock::now(&clock);
        let (items, bytes) = scan_all(&mut c, cli, key_only).await?;
        let secs = epkv_executor::Clock::now(&clock)
            .duration_since(started)
            .as_secs_f64();
        println!(
            "{}",
            serde_json::json!({
                "bench": "range_scan",
                "mode": if key_only { "ids_only" } else { "documents" },
                "client": "epkv-client",
                "items": items,
                "bytes": bytes,
                "secs": secs,
                "items_per_sec": items as f64 / secs,
                "item_limit": cli.item_limit,
                "byte_limit": cli.byte_limit,
            })
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("epkv-scan: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(&cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("epkv-scan: {e}");
            ExitCode::FAILURE
        }
    }
}
