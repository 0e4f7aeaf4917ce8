//! `epkv-fight`: durable-write latency under concurrency, pillowfight-style. See
//! [`epkv_bench::fight`] and docs/benchmarks.md ("Persistence and durability").

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use epkv_bench::fight::{self, FightOptions};

fn main() -> ExitCode {
    let opts = FightOptions::parse();
    if let Some(limit) = fight::nofile_limit()
        && opts.connections as u64 + 64 > limit
    {
        eprintln!(
            "epkv-fight: {} connections need more open files than the limit {limit}; \
                 raise it with `ulimit -n`",
            opts.connections
        );
        return ExitCode::FAILURE;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("epkv-fight: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    let pool = Arc::new(fight::value_pool(opts.value_bytes, opts.seed));
    let result = rt.block_on(async {
        if !opts.no_populate {
            eprintln!("epkv-fight: populating {} keys", opts.keys);
            fight::populate(&opts, Arc::clone(&pool)).await?;
        }
        eprintln!(
            "epkv-fight: {} connections, 100% SET of {} bytes, durability {}, {} s",
            opts.connections,
            opts.value_bytes,
            opts.durability.name(),
            opts.secs
        );
        fight::run(&opts, pool).await
    });
    match result {
        Ok(r) => {
            print!("{}", fight::format_histogram(&r.hist, 50));
            print!("{}", fight::format_summary(&r));
            println!("fight-result: {}", r.to_json(&opts));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("epkv-fight: {e}");
            ExitCode::FAILURE
        }
    }
}
