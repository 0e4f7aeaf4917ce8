//! `cargo xtask fuzz-smoke`: a short cargo-fuzz run of each decoder target, so that a crash
//! the fuzzer finds quickly fails CI. Longer runs: `--secs 600`, or `EPKV_SOAK=1` in ci.

use std::process::Command;

use anyhow::{Result, bail};

use crate::util;

/// The cargo-fuzz targets the smoke runs (`fuzz/fuzz_targets/<name>.rs`), each with the
/// divisor of `--secs` it gets: the request decoder gets the full time, the storage record
/// decoder, the client's response decoder, the SASL server, the sub-document
/// operations, the extended-attribute checks, the DCP codecs and the range-scan payloads a
/// third each (at least
/// 5 s), so CI stays short.
pub(crate) const TARGETS: &[(&str, u64)] = &[
    ("decode_request", 1),
    ("storage_decode", 3),
    ("decode_response", 3),
    ("sasl_server", 3),
    ("subdoc", 3),
    ("xattr", 3),
    ("dcp_decode", 3),
    ("range_scan", 3),
];

/// Seconds a target with `divisor` runs when the smoke is given `secs`.
pub(crate) fn target_secs(secs: u64, divisor: u64) -> u64 {
    (secs / divisor.max(1)).max(5.min(secs))
}

/// Runs each target for its share of `secs` seconds with nightly cargo-fuzz.
pub(crate) fn fuzz_smoke(secs: u64) -> Result<()> {
    let fuzz_dir = util::repo_root().join("fuzz");
    for &(target, divisor) in TARGETS {
        let secs = target_secs(secs, divisor);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secondary_targets_get_a_share_of_at_least_five_seconds() {
        assert_eq!(target_secs(30, 1), 30);
        assert_eq!(target_secs(30, 3), 10);
        assert_eq!(target_secs(5, 3), 5);
        assert_eq!(target_secs(2, 3), 2);
        assert_eq!(target_secs(600, 3), 200);
    }
}
