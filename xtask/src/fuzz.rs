//! `cargo xtask fuzz-smoke`: a short cargo-fuzz run of each decoder target, so that a crash
//! the fuzzer finds quickly fails CI. Longer runs: `--secs 600`, or `EPKV_SOAK=1` in ci.

use std::process::Command;

use anyhow::{Result, bail};

use crate::util;

/// The cargo-fuzz targets the smoke runs (`fuzz/fuzz_targets/<name>.rs`).
pub(crate) const TARGETS: &[&str] = &["decode_request"];

/// Runs each target for `secs` seconds with nightly cargo-fuzz.
pub(crate) fn fuzz_smoke(secs: u64) -> Result<()> {
    let fuzz_dir = util::repo_root().join("fuzz");
    for target in TARGETS {
        let src = fuzz_dir.join("fuzz_targets").join(format!("{target}.rs"));
        if !src.is_file() {
            bail!("fuzz target {} is missing", src.display());
        }
        let mut cmd = Command::new("cargo");
        // Drop what the outer `cargo xtask` (stable) exported so that +nightly applies to
        // every cargo and rustc that cargo-fuzz runs.
        for var in [
            "RUSTUP_TOOLCHAIN",
            "CARGO",
            "RUSTC",
            "RUSTDOC",
            "CARGO_TARGET_DIR",
        ] {
            cmd.env_remove(var);
        }
        cmd.current_dir(&fuzz_dir)
            .args(["+nightly", "fuzz", "run", target, "--"])
            .args([
                format!("-max_total_time={secs}"),
                "-rss_limit_mb=2048".to_owned(),
                "-timeout=10".to_owned(),
                "-print_final_stats=1".to_owned(),
            ]);
        util::run(&mut cmd)?;
        println!("fuzz-smoke: {target} ran {secs}s without a crash");
    }
    Ok(())
}
