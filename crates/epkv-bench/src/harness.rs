//! The benchmark harness: command-line options, a timed loop over N threads, and reports
//! (Google-Benchmark-like lines, `target/bench/<component>.json` and `.md`).

use epkv_executor::{Clock, SystemClock};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Barrier, Mutex};
use std::time::Duration;

/// Command-line options shared by the benchmarks.
#[derive(Debug, Clone)]
pub struct Args {
    /// Short runs (about a minute per component).
    pub quick: bool,
    /// Thread counts to run (`--threads 1,2`).
    pub threads: Vec<usize>,
    /// Only benchmarks whose name contains this (`--filter`, or a bare argument).
    pub filter: Option<String>,
    /// Other `--name value` options, for benchmark-specific lists.
    pub extra: BTreeMap<String, String>,
}

impl Args {
    /// Parses `std::env::args`, ignoring the `--bench` flag cargo adds.
    #[must_use]
    pub fn parse() -> Self {
        Self::parse_from(std::env::args().skip(1))
    }

    /// Parses the given arguments.
    #[must_use]
    pub fn parse_from(args: impl IntoIterator<Item = String>) -> Self {
        let mut out = Self {
            quick: false,
            threads: vec![1, 2],
            filter: None,
            extra: BTreeMap::new(),
        };
        let mut it = args.into_iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--quick" => out.quick = true,
                "--bench" | "--nocapture" => {}
                "--threads" => {
                    if let Some(v) = it.next() {
                        out.threads = parse_list(&v);
                    }
                }
                "--filter" => out.filter = it.next(),
                s if s.starts_with("--") => {
                    if let Some(v) = it.next() {
                        out.extra.insert(s.trim_start_matches("--").to_owned(), v);
                    }
                }
                s => out.filter = Some(s.to_owned()),
            }
        }
        out
    }

    /// A comma-separated list option, or `default`.
    #[must_use]
    pub fn list(&self, name: &str, default: &[usize]) -> Vec<usize> {
        self.extra
            .get(name)
            .map_or_else(|| default.to_vec(), |v| parse_list(v))
    }

    /// True if the benchmark called `name` should run.
    #[must_use]
    pub fn wants(&self, name: &str) -> bool {
        self.filter.as_deref().is_none_or(|f| name.contains(f))
    }

    /// True if the implementation called `name` should run: every one, or those named
    /// exactly in `--impls a,b`.
    #[must_use]
    pub fn wants_impl(&self, name: &str) -> bool {
        self.extra
            .get("impls")
            .is_none_or(|o| o.split(',').any(|x| x == name))
    }

    /// Time per measurement: 0.5 s quick, 1.5 s otherwise.
    #[must_use]
    pub fn measure_time(&self) -> Duration {
        if self.quick {
            Duration::from_millis(500)
        } else {
            Duration::from_millis(1500)
        }
    }

    /// Rounds per measurement (peers interleaved round by round; the median is kept).
    #[must_use]
    pub fn rounds(&self) -> usize {
        if self.quick { 3 } else { 5 }
    }
}

fn parse_list(v: &str) -> Vec<usize> {
    v.split(',').filter_map(|s| s.trim().parse().ok()).collect()
}

/// The outcome of one timed run.
#[derive(Debug, Clone, Copy)]
pub struct Measurement {
    /// Operations completed by all threads.
    pub ops: u64,
    /// Mean wall time of the threads' timed loops.
    pub elapsed: Duration,
}

impl Measurement {
    /// Operations per second, all threads together.
    #[must_use]
    #[expect(clippy::cast_precision_loss, reason = "op counts are far below 2^52")]
    pub fn items_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Operations per batch between looks at the stop flag.
const BATCH: u64 = 32;

/// Runs `threads` threads for `duration`. Each calls `setup(thread_index)` first (untimed),
/// then, after all are ready, calls the returned operation in a loop until told to stop.
/// The operation's own state is dropped after timing ends.
pub fn run_threads<S, F>(threads: usize, duration: Duration, setup: S) -> Measurement
where
    S: Fn(usize) -> F + Sync,
    F: FnMut(),
{
    let start = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..threads {
            let (start, stop, results, setup) = (&start, &stop, &results, &setup);
            let spawned = std::thread::Builder::new()
                .name(format!("bench-{t}"))
                .spawn_scoped(s, move || {
                    let mut op = setup(t);
                    start.wait();
                    let t0 = SystemClock.now();
                    let mut ops = 0u64;
                    while !stop.load(Relaxed) {
                        for _ in 0..BATCH {
                            op();
                        }
                        ops += BATCH;
                    }
                    let elapsed = SystemClock.now() - t0;
                    if let Ok(mut r) = results.lock() {
                        r.push((ops, elapsed));
                    }
                    drop(op);
                });
            if let Err(e) = spawned {
                eprintln!("cannot start benchmark thread: {e}");
                std::process::exit(2);
            }
        }
        start.wait();
        std::thread::sleep(duration);
        stop.store(true, Relaxed);
    });
    let results = results.into_inner().unwrap_or_default();
    let ops = results.iter().map(|r| r.0).sum();
    let n = u32::try_from(results.len().max(1)).unwrap_or(u32::MAX);
    let elapsed = results.iter().map(|r| r.1).sum::<Duration>() / n;
    Measurement { ops, elapsed }
}

/// A named peer: one timed run per call.
pub type Runner<'a> = (&'a str, Box<dyn Fn() -> Measurement + 'a>);

/// Runs every peer the arguments select `rounds` times, interleaved round by round, and
/// reports each one's median throughput as a row of `bench` with `params`.
pub fn compare(
    report: &mut Report,
    args: &Args,
    bench: &str,
    params: &[(&str, u64)],
    peers: &[Runner<'_>],
) {
    let peers: Vec<&Runner<'_>> = peers
        .iter()
        .filter(|(name, _)| args.wants_impl(name))
        .collect();
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); peers.len()];
    for _ in 0..args.rounds() {
        for (i, (_, run)) in peers.iter().enumerate() {
            results[i].push(run().items_per_sec());
        }
    }
    for ((name, _), r) in peers.iter().zip(results) {
        report.push(Row::new(bench, params, name, median(r)));
    }
}

/// The median of some throughputs.
#[must_use]
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        f64::midpoint(v[n / 2 - 1], v[n / 2])
    }
}

/// One result row, as written to the JSON file.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Benchmark name, such as `TimeoutAddCancel`.
    pub bench: String,
    /// Parameters, such as `{"timeouts": 1000, "threads": 2}`.
    pub params: BTreeMap<String, u64>,
    /// Implementation: `epkv` or a peer's name.
    #[serde(rename = "impl")]
    pub imp: String,
    /// Operations per second, all threads together.
    pub items_per_sec: f64,
    /// Nanoseconds per operation (1e9 / items_per_sec).
    pub ns_per_op: f64,
}

impl Row {
    /// A row.
    #[must_use]
    pub fn new(bench: &str, params: &[(&str, u64)], imp: &str, items_per_sec: f64) -> Self {
        Self {
            bench: bench.to_owned(),
            params: params.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            imp: imp.to_owned(),
            items_per_sec,
            ns_per_op: 1e9 / items_per_sec.max(1e-9),
        }
    }

    fn case(&self) -> String {
        self.params
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect::<Vec<_>>()
            .join("/")
    }
}

/// Formats a rate as `12.3M/s`.
#[must_use]
pub fn rate(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2}G/s", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2}M/s", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k/s", v / 1e3)
    } else {
        format!("{v:.0}/s")
    }
}

/// The rows of one component's run, printed as they come and written at the end.
#[derive(Debug)]
pub struct Report {
    component: String,
    rows: Vec<Row>,
    notes: Vec<String>,
}

impl Report {
    /// An empty report for `component` (the file name under `target/bench/`).
    #[must_use]
    pub fn new(component: &str) -> Self {
        Self {
            component: component.to_owned(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a note printed with the table.
    pub fn note(&mut self, note: &str) {
        println!("note: {note}");
        self.notes.push(note.to_owned());
    }

    /// Adds and prints a row.
    pub fn push(&mut self, row: Row) {
        println!(
            "{:<44} {:<18} {:>10.1} ns/op {:>12} items/s",
            format!("{}/{}", row.bench, row.case()),
            row.imp,
            row.ns_per_op,
            rate(row.items_per_sec)
        );
        self.rows.push(row);
    }

    /// The rows so far.
    #[must_use]
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// Markdown: one table per benchmark, one line per case, `base`'s rate and each
    /// peer's rate with the ratio `base / peer`; then the notes.
    #[must_use]
    pub fn markdown(&self, base: &str) -> String {
        let mut benches: Vec<&str> = Vec::new();
        for r in &self.rows {
            if !benches.contains(&r.bench.as_str()) {
                benches.push(&r.bench);
            }
        }
        let mut md = String::new();
        for bench in benches {
            let rows: Vec<&Row> = self.rows.iter().filter(|r| r.bench == bench).collect();
            let mut impls: Vec<&str> = Vec::new();
            let mut cases: Vec<String> = Vec::new();
            for r in &rows {
                if r.imp != base && !impls.contains(&r.imp.as_str()) {
                    impls.push(&r.imp);
                }
                if !cases.contains(&r.case()) {
                    cases.push(r.case());
                }
            }
            let _ = write!(md, "**{bench}**\n\n| params | {base} |");
            for i in &impls {
                let _ = write!(md, " {i} | {base}/{i} |");
            }
            md.push_str("\n|---|---:|");
            for _ in &impls {
                md.push_str("---:|---:|");
            }
            md.push('\n');
            for case in &cases {
                let find = |imp: &str| {
                    rows.iter()
                        .find(|r| &r.case() == case && r.imp == imp)
                        .map(|r| r.items_per_sec)
                };
                let b = find(base);
                let _ = write!(
                    md,
                    "| {case} | {} |",
                    b.map_or_else(|| "-".to_owned(), rate)
                );
                for i in &impls {
                    match (b, find(i)) {
                        (Some(b), Some(p)) => {
                            let _ = write!(md, " {} | {:.2}x |", rate(p), b / p);
                        }
                        (None, Some(p)) => {
                            let _ = write!(md, " {} | - |", rate(p));
                        }
                        _ => md.push_str(" - | - |"),
                    }
                }
                md.push('\n');
            }
            md.push('\n');
        }
        for n in &self.notes {
            let _ = writeln!(md, "{n}\n");
        }
        md
    }

    /// Prints the markdown table and writes `target/bench/<component>.json` and `.md`.
    ///
    /// # Errors
    ///
    /// If the files cannot be written.
    pub fn finish(&self, base: &str) -> std::io::Result<PathBuf> {
        let md = self.markdown(base);
        println!("\n{md}");
        let dir = target_dir().join("bench");
        std::fs::create_dir_all(&dir)?;
        let json = serde_json::to_string_pretty(&self.rows).map_err(std::io::Error::other)?;
        let path = dir.join(format!("{}.json", self.component));
        std::fs::write(&path, json)?;
        std::fs::write(dir.join(format!("{}.md", self.component)), md)?;
        println!("wrote {}", path.display());
        Ok(path)
    }
}

/// The cargo target directory: `CARGO_TARGET_DIR`, else `target` at the workspace root.
#[must_use]
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"),
        PathBuf::from,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impls_selects_exact_names_and_defaults_to_all() {
        let all = Args::parse_from(["--quick"].map(String::from));
        assert!(all.wants_impl("tokio"));
        let some = Args::parse_from(["--impls", "epkv,floor"].map(String::from));
        assert!(some.wants_impl("epkv") && some.wants_impl("floor"));
        assert!(!some.wants_impl("tokio"));
        assert!(!some.wants_impl("epk"), "names match whole");
    }

    #[test]
    fn args_parse_lists_and_ignore_cargo_flags() {
        let a = Args::parse_from(
            [
                "--bench",
                "--quick",
                "--threads",
                "1,2,4",
                "--timeouts",
                "10,20",
                "Timeout",
            ]
            .map(String::from),
        );
        assert!(a.quick);
        assert_eq!(a.threads, [1, 2, 4]);
        assert_eq!(a.list("timeouts", &[1]), [10, 20]);
        assert_eq!(a.list("other", &[7]), [7]);
        assert!(a.wants("TimeoutAddCancel") && !a.wants("OneShot"));
    }

    #[test]
    fn run_threads_counts_every_thread() {
        let m = run_threads(2, Duration::from_millis(20), |_| {
            || {
                std::hint::black_box(1 + 1);
            }
        });
        assert!(m.ops >= 2 * BATCH);
        assert!(m.items_per_sec() > 0.0);
    }

    #[test]
    fn median_of_odd_and_even() {
        assert!((median(vec![3.0, 1.0, 2.0]) - 2.0).abs() < 1e-9);
        assert!((median(vec![4.0, 1.0, 2.0, 3.0]) - 2.5).abs() < 1e-9);
        assert!((median(vec![]) - 0.0).abs() < 1e-9);
    }

    #[test]
    fn markdown_has_ratios_per_case() {
        let mut r = Report::new("t");
        r.push(Row::new("B", &[("threads", 1)], "epkv", 300.0));
        r.push(Row::new("B", &[("threads", 1)], "tokio", 100.0));
        r.push(Row::new("B", &[("threads", 2)], "epkv", 400.0));
        let md = r.markdown("epkv");
        assert!(md.contains("**B**"), "{md}");
        assert!(md.contains("| threads:1 | 300/s | 100/s | 3.00x |"), "{md}");
        assert!(md.contains("| threads:2 | 400/s | - | - |"), "{md}");
    }
}
