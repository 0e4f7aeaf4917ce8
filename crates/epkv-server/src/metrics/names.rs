//! How an engine stat becomes a Prometheus metric: the name, the type and the scale, all
//! derived from the stat's [`StatDefinition`] (its name, unit and description), so the
//! engine's one stats table stays the only place a stat is declared.
//!
//! The rules (KV-Engine's names, with Prometheus's conventions where the text format
//! and `promtool check metrics` require them):
//!
//! | unit | type | name | value |
//! |---|---|---|---|
//! | count (events since start) | counter | `kv_<stat>_total` | as is |
//! | byte count (bytes since start) | counter | `kv_<stat>[_bytes]_total` | as is |
//! | items (a current number) | gauge | `kv_<stat>` | as is |
//! | bytes | gauge | `kv_<stat>[_bytes]` | as is |
//! | seconds | gauge | `kv_<stat>_seconds` | as is |
//! | microseconds | gauge | `kv_<stat>_seconds` | / 1,000,000 |
//! | percent | gauge | `kv_<stat>_ratio` | / 100 |
//! | flag (`true`/`false`) | gauge | `kv_<stat>` | 1 or 0 |
//! | text | not exported | | |
//!
//! `[_bytes]` is left out when the stat's name already has the word `bytes`. So
//! `curr_items` is `kv_curr_items`, `mem_used` is `kv_mem_used_bytes`, `ep_bg_fetched` is
//! `kv_ep_bg_fetched_total` and `ep_bg_wait_avg` (µs) is `kv_ep_bg_wait_avg_seconds`.

use epkv_engine::{STATS, StatDefinition, StatGroup, StatUnit};
use std::sync::LazyLock;

/// The Prometheus type of an exported stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Only goes up (resets when the server restarts).
    Counter,
    /// Goes up and down.
    Gauge,
}

/// How one engine stat is exported.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Exported {
    /// The STAT group that emits it.
    pub(crate) group: StatGroup,
    /// The stat key in that group.
    pub(crate) stat: &'static str,
    /// The metric name.
    pub(crate) name: String,
    /// The HELP text: the stat's description and where it comes from.
    pub(crate) help: String,
    /// Counter or gauge.
    pub(crate) kind: Kind,
    /// What the stat's value is multiplied by (to seconds, to a ratio).
    pub(crate) scale: f64,
    /// The value is `true`/`false` (exported as 1/0).
    pub(crate) flag: bool,
}

impl Exported {
    /// The metric value of the stat's text value, or `None` if it does not parse.
    pub(crate) fn value(&self, text: &str) -> Option<f64> {
        if self.flag {
            return match text {
                "true" => Some(1.0),
                "false" => Some(0.0),
                _ => None,
            };
        }
        text.parse::<f64>().ok().map(|v| v * self.scale)
    }
}

/// Whether `stat` already names its unit (`ep_io_bytes_written`, `ep_journal_bytes`).
fn has_word(stat: &str, word: &str) -> bool {
    stat.split('_').any(|w| w == word)
}

/// The metric for an engine stat, or `None` for a stat that is not a number.
pub(crate) fn metric_for(def: &StatDefinition) -> Option<Exported> {
    let stat = def.name;
    let bytes = if has_word(stat, "bytes") {
        ""
    } else {
        "_bytes"
    };
    let (kind, name, scale, flag) = match def.unit {
        StatUnit::Count => (Kind::Counter, format!("kv_{stat}_total"), 1.0, false),
        StatUnit::ByteCount => (Kind::Counter, format!("kv_{stat}{bytes}_total"), 1.0, false),
        StatUnit::Items => (Kind::Gauge, format!("kv_{stat}"), 1.0, false),
        StatUnit::Bytes => (Kind::Gauge, format!("kv_{stat}{bytes}"), 1.0, false),
        StatUnit::Seconds => (Kind::Gauge, format!("kv_{stat}_seconds"), 1.0, false),
        StatUnit::Micros => (Kind::Gauge, format!("kv_{stat}_seconds"), 1e-6, false),
        StatUnit::MicrosCount => (
            Kind::Counter,
            format!("kv_{stat}_seconds_total"),
            1e-6,
            false,
        ),
        StatUnit::Percent => (Kind::Gauge, format!("kv_{stat}_ratio"), 0.01, false),
        StatUnit::Flag => (Kind::Gauge, format!("kv_{stat}"), 1.0, true),
        StatUnit::Text => return None,
    };
    let group = match def.group {
        StatGroup::Default => String::new(),
        StatGroup::Memory => "memory ".to_owned(),
        StatGroup::Persistence => "persistence ".to_owned(),
    };
    let unit_note = match def.unit {
        StatUnit::Micros | StatUnit::MicrosCount => {
            " (reported in microseconds, exported in seconds)"
        }
        StatUnit::Percent => " (reported as a percentage, exported as a ratio)",
        StatUnit::Flag => " (1 for true)",
        _ => "",
    };
    Some(Exported {
        group: def.group,
        stat,
        help: format!("{}{unit_note}; STAT {group}{stat}", def.description),
        name,
        kind,
        scale,
        flag,
    })
}

/// The STAT groups a scrape reads, with the group key [`epkv_engine_api::Engine::stats`]
/// takes.
pub(crate) const GROUPS: [(StatGroup, &str); 3] = [
    (StatGroup::Default, ""),
    (StatGroup::Memory, "memory"),
    (StatGroup::Persistence, "persistence"),
];

/// Every exported stat, in table order; a stat in several groups (`mem_used` is in the
/// default and `memory` groups) is exported once, from the first.
pub(crate) static EXPORTED: LazyLock<Vec<Exported>> = LazyLock::new(|| {
    let mut out: Vec<Exported> = Vec::new();
    for def in STATS.iter() {
        if let Some(e) = metric_for(def)
            && !out.iter().any(|o| o.name == e.name)
        {
            out.push(e);
        }
    }
    out
});

#[cfg(test)]
mod tests {
    use super::*;

    fn def(name: &'static str, unit: StatUnit) -> StatDefinition {
        StatDefinition {
            name,
            group: StatGroup::Default,
            unit,
            description: "d",
        }
    }

    #[test]
    fn names_follow_kv_engine_with_unit_suffixes() {
        let m = |n, u| metric_for(&def(n, u)).map(|e| (e.name, e.kind));
        assert_eq!(
            m("curr_items", StatUnit::Items),
            Some(("kv_curr_items".into(), Kind::Gauge))
        );
        assert_eq!(
            m("mem_used", StatUnit::Bytes),
            Some(("kv_mem_used_bytes".into(), Kind::Gauge))
        );
        assert_eq!(
            m("ep_item_overhead_bytes", StatUnit::Bytes),
            Some(("kv_ep_item_overhead_bytes".into(), Kind::Gauge))
        );
        assert_eq!(
            m("ep_num_value_ejects", StatUnit::Count),
            Some(("kv_ep_num_value_ejects_total".into(), Kind::Counter))
        );
        assert_eq!(
            m("ep_io_bytes_written", StatUnit::ByteCount),
            Some(("kv_ep_io_bytes_written_total".into(), Kind::Counter))
        );
        assert_eq!(
            m("ep_bg_wait_avg", StatUnit::Micros),
            Some(("kv_ep_bg_wait_avg_seconds".into(), Kind::Gauge))
        );
        assert_eq!(
            m("vb_active_perc_mem_resident", StatUnit::Percent),
            Some(("kv_vb_active_perc_mem_resident_ratio".into(), Kind::Gauge))
        );
        assert_eq!(m("ep_bucket_name", StatUnit::Text), None);
    }

    #[test]
    fn values_are_scaled_to_base_units() {
        let us = metric_for(&def("ep_bg_max_wait", StatUnit::Micros)).unwrap();
        assert_eq!(us.value("2500000"), Some(2.5));
        let pct = metric_for(&def("p", StatUnit::Percent)).unwrap();
        assert_eq!(pct.value("75"), Some(0.75));
        let flag = metric_for(&def("ep_disk_full", StatUnit::Flag)).unwrap();
        assert_eq!(
            (flag.value("true"), flag.value("false")),
            (Some(1.0), Some(0.0))
        );
        assert_eq!(flag.value("maybe"), None);
        let n = metric_for(&def("curr_items", StatUnit::Items)).unwrap();
        assert_eq!(n.value("12"), Some(12.0));
        assert_eq!(n.value("twelve"), None);
    }

    #[test]
    fn the_exported_table_has_unique_valid_names_and_help() {
        let mut seen = std::collections::HashSet::new();
        for e in EXPORTED.iter() {
            assert!(seen.insert(e.name.clone()), "duplicate {}", e.name);
            assert!(
                e.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{}",
                e.name
            );
            assert!(e.name.starts_with("kv_"));
            assert_eq!(
                e.name.ends_with("_total"),
                e.kind == Kind::Counter,
                "{}",
                e.name
            );
            assert!(e.help.contains(e.stat), "{}", e.help);
        }
        for name in [
            "kv_curr_items",
            "kv_mem_used_bytes",
            "kv_ep_num_value_ejects_total",
            "kv_ep_bg_fetched_total",
            "kv_ep_queue_size",
            "kv_ep_total_persisted_total",
            "kv_ep_disk_full",
        ] {
            assert!(EXPORTED.iter().any(|e| e.name == name), "{name} missing");
        }
        assert!(!EXPORTED.iter().any(|e| e.stat == "ep_bucket_name"));
    }
}
