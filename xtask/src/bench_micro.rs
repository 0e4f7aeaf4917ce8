//! `cargo xtask bench <component>`: the epkv-bench component benchmarks, which write
//! `target/bench/<component>.json` and `.md` themselves (see docs/benchmarks.md).

use anyhow::{Result, bail};

use crate::util;

/// Runs `cargo bench -p epkv-bench --bench <args[0]> -- <args[1..]>`.
pub(crate) fn bench_micro(args: &[String]) -> Result<()> {
    let Some((name, rest)) = args.split_first() else {
        bail!("name a benchmark: frontend, or a file of crates/epkv-bench/benches/");
    };
    let benches = util::repo_root()
        .join("crates")
        .join("epkv-bench")
        .join("benches");
    if !benches.join(format!("{name}.rs")).is_file() && !benches.join(name).is_dir() {
        let mut known: Vec<String> = std::fs::read_dir(&benches)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter_map(|e| {
                        e.path()
                            .file_stem()
                            .map(|s| s.to_string_lossy().into_owned())
                    })
                    .collect()
            })
            .unwrap_or_default();
        known.push("frontend".to_owned());
        known.sort();
        bail!("no benchmark `{name}`; known: {}", known.join(", "));
    }
    util::run(
        util::cargo()
            .args(["bench", "-p", "epkv-bench", "--bench", name, "--"])
            .args(rest),
    )
}
