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
    fn names_follow_the_opcode_table() {
        assert_eq!(opcode_stat_name(0x3d), "cmd_set_vbucket");
        assert_eq!(opcode_stat_name(0x11), "cmd_setq");
        assert_eq!(opcode_stat_name(0xee), "cmd_0xee");
    }
}
