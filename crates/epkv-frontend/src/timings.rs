//! Per-opcode latency histograms (the `timings` STAT group).
//!
//! Each worker thread owns one [`WorkerTimings`]; its connections record into it, so the
//! lock is only ever contended by a STAT reader, which locks each worker's set in turn
//! and merges them.
//!
//! Reported format (one stat per line, for every opcode with at least one sample, in
//! opcode order; `<name>` is the lower-case opcode name, e.g. `cmd_get`, `cmd_setq`,
//! `cmd_set_vbucket`):
//!
//! | stat | meaning |
//! |---|---|
//! | `<name>_count` | commands timed |
//! | `<name>_mean_us` | mean latency |
//! | `<name>_p50_us`, `_p90_us`, `_p99_us`, `_p999_us` | percentiles |
//! | `<name>_max_us` | largest latency |
//!
//! Latencies are microseconds written with three decimals (nanosecond resolution), with
//! about 1% relative precision (HDR histograms with two significant digits), measured
//! from the start of a command's decoding to its reply being queued.

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use std::time::Duration;

/// The largest latency tracked exactly; longer ones are recorded as this (60 s).
const MAX_TRACKED_NANOS: u64 = 60_000_000_000;
/// Significant decimal digits kept by each histogram.
const SIGFIGS: u8 = 2;

/// One histogram slot per opcode byte, created on first use.
pub(crate) struct OpHistograms {
    by_opcode: Vec<Option<Histogram<u64>>>,
}

impl OpHistograms {
    fn new() -> Self {
        Self {
            by_opcode: (0..256).map(|_| None).collect(),
        }
    }

    fn record(&mut self, opcode: u8, elapsed: Duration) {
        let slot = &mut self.by_opcode[usize::from(opcode)];
        if slot.is_none() {
            *slot = Histogram::new_with_bounds(1, MAX_TRACKED_NANOS, SIGFIGS).ok();
        }
        if let Some(h) = slot {
            let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX).max(1);
            h.saturating_record(nanos);
        }
    }
}

/// The histograms of one worker thread.
pub(crate) struct WorkerTimings {
    inner: Mutex<OpHistograms>,
}

impl WorkerTimings {
    pub(crate) fn new() -> Self {
        Self {
            inner: Mutex::new(OpHistograms::new()),
        }
    }

    /// Records one command's latency.
    pub(crate) fn record(&self, opcode: u8, elapsed: Duration) {
        self.inner.lock().record(opcode, elapsed);
    }
}

/// Merges every worker's histograms and emits the `timings` stats.
pub(crate) fn emit(workers: &[std::sync::Arc<WorkerTimings>], mut sink: impl FnMut(&str, &str)) {
    let mut merged = OpHistograms::new();
    for w in workers {
        let theirs = w.inner.lock();
        for (op, h) in theirs.by_opcode.iter().enumerate() {
            let Some(h) = h else { continue };
            match &mut merged.by_opcode[op] {
                Some(m) => {
                    // Same bounds everywhere, so adding cannot fail.
                    let _ = m.add(h);
                }
                slot @ None => *slot = Some(h.clone()),
            }
        }
    }
    let us = |nanos: f64| format!("{:.3}", nanos / 1000.0);
    for (op, h) in merged.by_opcode.iter().enumerate() {
        let Some(h) = h else { continue };
        if h.is_empty() {
            continue;
        }
        let name = opcode_stat_name(op as u8);
        sink(&format!("{name}_count"), &h.len().to_string());
        sink(&format!("{name}_mean_us"), &us(h.mean()));
        for (label, q) in [("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("p999", 0.999)] {
            sink(
                &format!("{name}_{label}_us"),
                &us(h.value_at_quantile(q) as f64),
            );
        }
        sink(&format!("{name}_max_us"), &us(h.max() as f64));
    }
}

/// One opcode's latencies, merged over every worker, counted into caller-chosen buckets
/// (what a Prometheus histogram needs; see [`crate::FrontendStats::command_timings`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CommandTiming {
    /// The opcode byte.
    pub opcode: u8,
    /// The opcode's name in the opcode table (`GET`, `SET_VBUCKET`), or `0xNN` for a byte
    /// not in it.
    pub name: String,
    /// Commands timed.
    pub count: u64,
    /// Sum of their latencies (mean times count: exact to the histograms' 1% precision).
    pub sum: Duration,
    /// `cumulative[i]`: commands that took at most `bounds[i]` (the bounds asked for).
    pub cumulative: Vec<u64>,
}

/// Merges every worker's histograms into one [`CommandTiming`] per opcode with samples,
/// in opcode order, counting each recorded latency into the first bound that is at least
/// it (`bounds` ascending). Each worker's lock is held only while its histograms are read.
pub(crate) fn bucketed(
    workers: &[std::sync::Arc<WorkerTimings>],
    bounds: &[Duration],
) -> Vec<CommandTiming> {
    let bounds_ns: Vec<u64> = bounds
        .iter()
        .map(|b| u64::try_from(b.as_nanos()).unwrap_or(u64::MAX))
        .collect();
    // Per opcode: count, sum of nanoseconds, count per bucket (the last one past every bound).
    let mut acc: Vec<Option<(u64, f64, Vec<u64>)>> = (0..256).map(|_| None).collect();
    for w in workers {
        let theirs = w.inner.lock();
        for (op, h) in theirs.by_opcode.iter().enumerate() {
            let Some(h) = h else { continue };
            if h.is_empty() {
                continue;
            }
            let (count, sum, per) =
                acc[op].get_or_insert_with(|| (0, 0.0, vec![0; bounds_ns.len() + 1]));
            *count += h.len();
            #[expect(
                clippy::cast_precision_loss,
                reason = "a sum of latencies in f64: 53 bits are plenty for a histogram sum"
            )]
            {
                *sum += h.mean() * h.len() as f64;
            }
            for v in h.iter_recorded() {
                let value = h.highest_equivalent(v.value_iterated_to());
                let i = bounds_ns.partition_point(|&b| b < value);
                per[i] += v.count_at_value();
            }
        }
    }
    acc.into_iter()
        .enumerate()
        .filter_map(|(op, a)| {
            let (count, sum, per) = a?;
            let mut running = 0;
            let cumulative = per[..bounds_ns.len()]
                .iter()
                .map(|c| {
                    running += c;
                    running
                })
                .collect();
            let op = u8::try_from(op).ok()?;
            Some(CommandTiming {
                opcode: op,
                name: match epkv_protocol::Opcode::from_u8(op) {
                    Some(o) => o.name().to_owned(),
                    None => format!("{op:#04x}"),
                },
                count,
                #[expect(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    reason = "a non-negative sum of nanoseconds far below 2^64"
                )]
                sum: Duration::from_nanos(sum as u64),
                cumulative,
            })
        })
        .collect()
}

/// `cmd_<lower-case opcode name>`, or `cmd_0x<hex>` for a byte not in the opcode table.
fn opcode_stat_name(op: u8) -> String {
    match epkv_protocol::Opcode::from_u8(op) {
        Some(o) => format!("cmd_{}", o.name().to_ascii_lowercase()),
        None => format!("cmd_{op:#04x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn merges_workers_and_reports_counts_and_percentiles() {
        let a = Arc::new(WorkerTimings::new());
        let b = Arc::new(WorkerTimings::new());
        for i in 1..=100u64 {
            a.record(0x00, Duration::from_micros(i));
        }
        b.record(0x00, Duration::from_millis(5));
        b.record(0x01, Duration::from_nanos(1500));
        let mut stats = std::collections::BTreeMap::new();
        emit(&[a, b], |k, v| {
            stats.insert(k.to_owned(), v.to_owned());
        });
        assert_eq!(stats["cmd_get_count"], "101");
        assert_eq!(stats["cmd_set_count"], "1");
        let p50: f64 = stats["cmd_get_p50_us"].parse().unwrap();
        assert!((49.0..=52.0).contains(&p50), "p50 {p50}");
        let max: f64 = stats["cmd_get_max_us"].parse().unwrap();
        assert!((4950.0..=5050.0).contains(&max), "max {max}");
        assert!(!stats.contains_key("cmd_delete_count"));
    }

    #[test]
    fn bucketed_counts_cumulatively_per_opcode_over_workers() {
        let a = Arc::new(WorkerTimings::new());
        let b = Arc::new(WorkerTimings::new());
        for _ in 0..3 {
            a.record(0x00, Duration::from_micros(5));
        }
        b.record(0x00, Duration::from_micros(500));
        b.record(0x00, Duration::from_secs(2));
        b.record(0xee, Duration::from_micros(1));
        let bounds = [
            Duration::from_micros(10),
            Duration::from_millis(1),
            Duration::from_secs(1),
        ];
        let t = bucketed(&[a, b], &bounds);
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].opcode, t[0].name.as_str()), (0x00, "GET"));
        assert_eq!(t[0].count, 5);
        assert_eq!(t[0].cumulative, vec![3, 4, 4], "2 s is past every bound");
        let sum = t[0].sum.as_secs_f64();
        assert!((2.0..2.03).contains(&sum), "sum {sum}");
        assert_eq!(
            (t[1].name.as_str(), t[1].cumulative.clone()),
            ("0xee", vec![1, 1, 1])
        );
    }

    #[test]
    fn names_follow_the_opcode_table() {
        assert_eq!(opcode_stat_name(0x3d), "cmd_set_vbucket");
        assert_eq!(opcode_stat_name(0x11), "cmd_setq");
        assert_eq!(opcode_stat_name(0xee), "cmd_0xee");
    }
}
