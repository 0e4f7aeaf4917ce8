//! `epkv-pipeload`: pipelined GET/SET load over plain TCP or TLS (`cargo xtask bench
//! tls`). See [`epkv_bench::pipeload`].

use std::process::ExitCode;

use clap::Parser;
use epkv_bench::pipeload::{self, PipeloadCli, PipeloadCommand};

fn main() -> ExitCode {
    let cli = PipeloadCli::parse();
    let opts = match cli.command {
        PipeloadCommand::Certs { dir } => {
            return match pipeload::write_certs(&dir) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("epkv-pipeload: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        PipeloadCommand::Run(opts) => opts,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("epkv-pipeload: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(pipeload::run(&opts)) {
        Ok(r) => {
            println!(
                "epkv-pipeload: {} {} ops in {:.2} s: {:.0} ops/s, {} errors",
                opts.mode.name(),
                r.ops,
                r.secs,
                r.ops as f64 / r.secs,
                r.errors
            );
            println!("pipeload-result: {}", r.to_json(&opts));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("epkv-pipeload: {e}");
            ExitCode::FAILURE
        }
    }
}
