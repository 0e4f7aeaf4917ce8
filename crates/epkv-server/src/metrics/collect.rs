//! One scrape: reads every source and encodes the text exposition.
//!
//! Sources, read fresh at each scrape (nothing is kept between scrapes):
//! - each bucket's STAT groups `""`, `memory` and `persistence`, exported as
//!   [`names`](super::names) says, with a `bucket` label;
//! - each bucket's executor tasks: `kv_task_duration_seconds` (run time) and
//!   `kv_task_wait_duration_seconds` (from ready to running) histograms with `bucket` and
//!   `task` labels (tasks of the same name are merged);
//! - the front end: `kv_curr_connections`, `kv_total_connections_total`,
//!   `kv_rejected_connections_total` and the `kv_cmd_duration_seconds` histogram per
//!   `opcode` (the front end times commands per worker thread, not per bucket, so it has
//!   no `bucket` label).
//!
//! Nothing is per vBucket: a scrape costs the same whatever the number of documents, and a
//! few walks over the 1024 vBuckets inside the STAT groups.

use super::names::{EXPORTED, GROUPS, Kind};
use crate::http_limits::HttpCounters;
use epkv_engine_api::Engine;
use epkv_executor::{HISTOGRAM_BUCKETS, Histogram as TaskHistogram, TaskInfo};
use epkv_frontend::{CommandTiming, ConnectionCounts, FrontendStats};
use prometheus::proto::{
    Bucket as HistBucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Upper bounds of `kv_cmd_duration_seconds`: 1 µs to about 33.6 s, doubling.
pub(crate) fn command_bounds() -> Vec<Duration> {
    (0..26).map(|i| Duration::from_micros(1 << i)).collect()
}

/// Upper bounds of the task histograms: every second boundary of the executor's
/// power-of-two buckets (1.024 µs, 4.096 µs, ... 2^40 ns ≈ 18 min), so each bound is an
/// exact boundary and the counts below it are exact.
fn task_bounds() -> impl Iterator<Item = Duration> {
    (0..HISTOGRAM_BUCKETS / 2).map(|k| Duration::from_nanos(1u64 << (10 + 2 * k)))
}

/// What a scrape reads.
pub(crate) struct Sources {
    /// The buckets, as they are at each scrape (they change at run time).
    pub(crate) buckets: Arc<crate::bucket_manager::BucketManager>,
    /// The front end's counters and timings.
    pub(crate) frontend: FrontendStats,
    /// The HTTP listeners' connection counters, by listener name.
    pub(crate) http: Vec<(&'static str, Arc<HttpCounters>)>,
    /// The cluster (its `kv_cluster_*` series exist on etcd cluster nodes only).
    pub(crate) cluster: Arc<epkv_cluster::Cluster>,
}

impl Sources {
    /// The exposition of the buckets `may_see` accepts, plus the node-wide series
    /// (connections, authentication, command timings) when `node_wide`.
    pub(crate) fn exposition(&self, may_see: &dyn Fn(&str) -> bool, node_wide: bool) -> String {
        let mut f = Families::default();
        let buckets: Vec<_> = self
            .buckets
            .snapshot()
            .into_iter()
            .filter(|(p, _)| may_see(&p.name))
            .collect();
        for (p, bucket) in &buckets {
            bucket_stats(&mut f, &p.name, bucket.as_ref());
        }
        for (p, bucket) in &buckets {
            bucket_tasks(&mut f, &p.name, &bucket.tasks());
        }
        if node_wide {
            connections(&mut f, self.frontend.connections());
            auth(&mut f, self.frontend.auth());
            for (listener, counters) in &self.http {
                http_connections(&mut f, listener, counters);
            }
            if let Some(coord) = self.cluster.coordinator() {
                cluster(&mut f, coord);
                rebalance(&mut f, coord, self.cluster.rebalance_progress());
            }
            command_timings(
                &mut f,
                &self.frontend.command_timings(&command_bounds()),
                &command_bounds(),
            );
        }
        f.encode()
    }
}

/// Metric families in first-use order, each holding every labelled series of one name.
#[derive(Default)]
pub(crate) struct Families {
    list: Vec<MetricFamily>,
    index: HashMap<String, usize>,
}

impl Families {
    /// The family `name`, created with `help` and `ty` on first use.
    fn family(&mut self, name: &str, help: &str, ty: MetricType) -> &mut MetricFamily {
        let i = match self.index.get(name) {
            Some(&i) => i,
            None => {
                let mut mf = MetricFamily::default();
                mf.set_name(name.to_owned());
                mf.set_help(help.to_owned());
                mf.set_field_type(ty);
                self.list.push(mf);
                self.index.insert(name.to_owned(), self.list.len() - 1);
                self.list.len() - 1
            }
        };
        &mut self.list[i]
    }

    /// Adds one counter or gauge sample.
    fn sample(&mut self, name: &str, help: &str, kind: Kind, labels: &[(&str, &str)], v: f64) {
        let mut m = Metric::from_label(label_pairs(labels));
        let ty = match kind {
            Kind::Counter => {
                let mut c = Counter::default();
                c.set_value(v);
                m.set_counter(c);
                MetricType::COUNTER
            }
            Kind::Gauge => {
                let mut g = Gauge::default();
                g.set_value(v);
                m.set_gauge(g);
                MetricType::GAUGE
            }
        };
        self.family(name, help, ty).mut_metric().push(m);
    }

    /// Adds one histogram: `buckets` holds each upper bound with the number of
    /// observations at most that bound; `(count, sum)` are the totals (the `+Inf` bucket
    /// is `count`).
    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        buckets: impl Iterator<Item = (Duration, u64)>,
        (count, sum): (u64, Duration),
    ) {
        let mut h = Histogram::default();
        h.set_sample_count(count);
        h.set_sample_sum(sum.as_secs_f64());
        h.set_bucket(
            buckets
                .map(|(b, c)| {
                    let mut hb = HistBucket::default();
                    hb.set_upper_bound(b.as_secs_f64());
                    hb.set_cumulative_count(c);
                    hb
                })
                .collect(),
        );
        let mut m = Metric::from_label(label_pairs(labels));
        m.set_histogram(h);
        self.family(name, help, MetricType::HISTOGRAM)
            .mut_metric()
            .push(m);
    }

    /// The text exposition (format 0.0.4).
    pub(crate) fn encode(self) -> String {
        let mut out = String::with_capacity(64 * 1024);
        if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&self.list, &mut out) {
            // Only an empty family or name fails, which `Families` never builds.
            tracing::error!(error = %e, "cannot encode the metrics");
        }
        out
    }
}

fn label_pairs(labels: &[(&str, &str)]) -> Vec<LabelPair> {
    labels
        .iter()
        .map(|(k, v)| {
            let mut l = LabelPair::default();
            l.set_name((*k).to_owned());
            l.set_value((*v).to_owned());
            l
        })
        .collect()
}

/// One bucket's STAT groups.
pub(crate) fn bucket_stats(f: &mut Families, bucket: &str, engine: &dyn Engine) {
    let labels = [("bucket", bucket)];
    for (group, key) in GROUPS {
        let mut values: HashMap<String, String> = HashMap::new();
        let read = engine.stats(key, &mut |k, v| {
            values.insert(k.to_owned(), v.to_owned());
        });
        if let Err(status) = read {
            tracing::debug!(
                bucket,
                group = key,
                ?status,
                "stat group not read for metrics"
            );
            continue;
        }
        for e in EXPORTED.iter().filter(|e| e.group == group) {
            if let Some(v) = values.get(e.stat).and_then(|t| e.value(t)) {
                f.sample(&e.name, &e.help, e.kind, &labels, v);
            }
        }
    }
}

/// One bucket's tasks, merged by name.
pub(crate) fn bucket_tasks(f: &mut Families, bucket: &str, tasks: &[TaskInfo]) {
    let mut by_name: Vec<(&str, TaskHistogram, Duration, TaskHistogram, Duration)> = Vec::new();
    for t in tasks {
        let s = &t.stats;
        match by_name.iter_mut().find(|(n, ..)| *n == t.name) {
            Some((_, run, run_sum, wait, wait_sum)) => {
                run.merge(&s.run_time);
                *run_sum += s.total_run_time;
                wait.merge(&s.lateness);
                *wait_sum += s.total_lateness;
            }
            None => by_name.push((
                &t.name,
                s.run_time.clone(),
                s.total_run_time,
                s.lateness.clone(),
                s.total_lateness,
            )),
        }
    }
    for (task, run, run_sum, wait, wait_sum) in &by_name {
        let labels = [("bucket", bucket), ("task", *task)];
        f.histogram(
            "kv_task_duration_seconds",
            "Time each run of a background task took (executor run-time histogram)",
            &labels,
            task_bounds().zip(task_cumulative(run)),
            (run.count(), *run_sum),
        );
        f.histogram(
            "kv_task_wait_duration_seconds",
            "Time from a background task becoming ready (due or woken) to its run starting",
            &labels,
            task_bounds().zip(task_cumulative(wait)),
            (wait.count(), *wait_sum),
        );
    }
}

/// The cumulative counts of an executor histogram at [`task_bounds`].
fn task_cumulative(h: &TaskHistogram) -> impl Iterator<Item = u64> + '_ {
    task_bounds().map(move |bound| {
        h.buckets()
            .filter(|(_, upper, _)| *upper <= bound)
            .map(|(_, _, c)| c)
            .sum()
    })
}

/// The front end's connection counters.
pub(crate) fn connections(f: &mut Families, c: ConnectionCounts) {
    #[expect(
        clippy::cast_precision_loss,
        reason = "connection counts are far below 2^53"
    )]
    for (name, help, kind, v) in [
        (
            "kv_curr_connections",
            "Client connections open now (STAT curr_connections)",
            Kind::Gauge,
            c.current as f64,
        ),
        (
            "kv_total_connections_total",
            "Client connections accepted since start, rejected ones included (STAT total_connections)",
            Kind::Counter,
            c.total as f64,
        ),
        (
            "kv_rejected_connections_total",
            "Connections closed at once because max-connections were open (STAT rejected_conns)",
            Kind::Counter,
            c.rejected as f64,
        ),
    ] {
        f.sample(name, help, kind, &[], v);
    }
}

/// An etcd cluster node's decisions and standing: failovers, leadership, its lease.
pub(crate) fn cluster(f: &mut Families, c: &epkv_cluster::Coordinator) {
    let s = &c.stats;
    let read = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^53")]
    for (name, help, kind, v) in [
        (
            "kv_cluster_auto_failovers_total",
            "Nodes this node failed over automatically as the orchestrator",
            Kind::Counter,
            read(&s.auto_failovers) as f64,
        ),
        (
            "kv_cluster_manual_failovers_total",
            "Failovers asked of this node by an operator (/controller/failOver)",
            Kind::Counter,
            read(&s.manual_failovers) as f64,
        ),
        (
            "kv_cluster_failovers_refused_total",
            "Automatic failovers this orchestrator did not make (disabled, maxCount reached, or the last copy of a vBucket)",
            Kind::Counter,
            read(&s.failovers_refused) as f64,
        ),
        (
            "kv_cluster_promotions_reordered_total",
            "vBuckets a failover by this node promoted a replica other than the first in the chain for, because it held more (durability-aware failover)",
            Kind::Counter,
            read(&s.promotions_reordered) as f64,
        ),
        (
            "kv_cluster_leader_terms_total",
            "Times this node became the cluster's orchestrator",
            Kind::Counter,
            read(&s.leader_terms) as f64,
        ),
        (
            "kv_cluster_lease_losses_total",
            "Times this node's etcd lease expired and it registered again",
            Kind::Counter,
            c.lease_losses() as f64,
        ),
        (
            "kv_cluster_documents_installed_total",
            "Versions of the cluster's document (members, maps) this node applied",
            Kind::Counter,
            read(&s.docs_installed) as f64,
        ),
        (
            "kv_cluster_fences_total",
            "Times this node fenced itself off (lease not renewable, no peer reachable)",
            Kind::Counter,
            read(&s.fences) as f64,
        ),
        (
            "kv_cluster_is_orchestrator",
            "1 while this node is the cluster's orchestrator",
            Kind::Gauge,
            flag(c.is_leader()),
        ),
        (
            "kv_cluster_etcd_reachable",
            "1 while this node's etcd lease renewals are answered",
            Kind::Gauge,
            flag(c.etcd_reachable()),
        ),
        (
            "kv_cluster_fenced",
            "1 while this node holds its active vBuckets as replicas because it is cut off",
            Kind::Gauge,
            flag(c.is_fenced()),
        ),
    ] {
        f.sample(name, help, kind, &[], v);
    }
}

/// Rebalances: the one running (from the cluster's document, the same on every node)
/// and what this node did as their orchestrator.
pub(crate) fn rebalance(
    f: &mut Families,
    c: &epkv_cluster::Coordinator,
    p: Option<epkv_cluster::RebalanceProgress>,
) {
    let s = &c.stats;
    let read = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let p = p.unwrap_or_default();
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^53")]
    for (name, help, kind, v) in [
        (
            "kv_rebalance_running",
            "1 while a rebalance runs in the cluster",
            Kind::Gauge,
            if p.running { 1.0 } else { 0.0 },
        ),
        (
            "kv_rebalance_vbuckets_left",
            "vBucket moves the running rebalance has still to make",
            Kind::Gauge,
            p.total.saturating_sub(p.done) as f64,
        ),
        (
            "kv_rebalance_moves_in_flight",
            "vBucket moves in flight (backfill, synced or takeover)",
            Kind::Gauge,
            p.in_flight as f64,
        ),
        (
            "kv_rebalance_moves_total",
            "vBucket moves this node made as the orchestrator",
            Kind::Counter,
            read(&s.rebalance_moves) as f64,
        ),
        (
            "kv_rebalance_completed_total",
            "Rebalances this node completed as the orchestrator",
            Kind::Counter,
            read(&s.rebalances_completed) as f64,
        ),
        (
            "kv_rebalance_stopped_total",
            "Rebalances stopped through this node (operator, failover, failure)",
            Kind::Counter,
            read(&s.rebalances_stopped) as f64,
        ),
        (
            "kv_rebalance_takeovers_total",
            "Takeovers this orchestrator timed",
            Kind::Counter,
            read(&s.takeovers) as f64,
        ),
        (
            "kv_rebalance_takeover_seconds_total",
            "Their total time: from the map that parks the old active's clients to the one that makes the new copy active",
            Kind::Counter,
            read(&s.takeover_micros) as f64 / 1e6,
        ),
        (
            "kv_rebalance_takeover_seconds_max",
            "The longest of them",
            Kind::Gauge,
            read(&s.takeover_micros_max) as f64 / 1e6,
        ),
    ] {
        f.sample(name, help, kind, &[], v);
    }
}

/// One HTTP listener's connection counters, labelled `listener`.
pub(crate) fn http_connections(f: &mut Families, listener: &str, c: &HttpCounters) {
    let read = HttpCounters::read;
    let l = [("listener", listener)];
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^53")]
    for (name, help, kind, labels, v) in [
        (
            "kv_http_curr_connections",
            "HTTP connections open now",
            Kind::Gauge,
            &l[..],
            read(&c.current),
        ),
        (
            "kv_http_total_connections_total",
            "HTTP connections accepted since start, rejected ones included",
            Kind::Counter,
            &l[..],
            read(&c.accepted),
        ),
        (
            "kv_http_rejected_connections_total",
            "HTTP connections closed at once: reason per_address (http-max-connections-per-address from its address were open) or full (every slot held by a trusted or busy connection)",
            Kind::Counter,
            &[("listener", listener), ("reason", "per_address")][..],
            read(&c.rejected_per_address),
        ),
        (
            "kv_http_rejected_connections_total",
            "",
            Kind::Counter,
            &[("listener", listener), ("reason", "full")][..],
            read(&c.rejected_full),
        ),
        (
            "kv_http_evicted_connections_total",
            "Idle or half-open HTTP connections closed to make room for a new one (http-max-connections were open)",
            Kind::Counter,
            &l[..],
            read(&c.evicted),
        ),
        (
            "kv_http_timed_out_connections_total",
            "HTTP connections closed by a timeout: reason header (http-header-timeout) or idle (http-idle-timeout)",
            Kind::Counter,
            &[("listener", listener), ("reason", "header")][..],
            read(&c.header_timeouts),
        ),
        (
            "kv_http_timed_out_connections_total",
            "",
            Kind::Counter,
            &[("listener", listener), ("reason", "idle")][..],
            read(&c.idle_timeouts),
        ),
    ] {
        f.sample(name, help, kind, labels, v as f64);
    }
}

/// The front end's authentication counters.
pub(crate) fn auth(f: &mut Families, a: epkv_frontend::AuthCounts) {
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^53")]
    for (name, help, v) in [
        (
            "kv_auth_cmds_total",
            "SASL_AUTH requests (STAT auth_cmds)",
            a.attempts,
        ),
        (
            "kv_auth_errors_total",
            "Authentication attempts refused (STAT auth_errors)",
            a.failures,
        ),
        (
            "kv_auth_throttled_total",
            "Authentication attempts made to wait because their source address had failed too often (STAT auth_throttled)",
            a.throttled,
        ),
        (
            "kv_auth_throttle_closes_total",
            "Connections closed after too many failed authentications in a row (STAT auth_throttle_closes)",
            a.closes,
        ),
        (
            "kv_auth_busy_total",
            "Authentication attempts answered TMPFAIL because the password-check queue was full (STAT auth_busy)",
            a.busy,
        ),
    ] {
        f.sample(name, help, Kind::Counter, &[], v as f64);
    }
}

/// The per-opcode command latency histograms.
pub(crate) fn command_timings(f: &mut Families, timings: &[CommandTiming], bounds: &[Duration]) {
    for t in timings {
        f.histogram(
            "kv_cmd_duration_seconds",
            "Per-opcode histogram of the time from a command's decoding to its reply being queued",
            &[("opcode", &t.name)],
            bounds.iter().copied().zip(t.cumulative.iter().copied()),
            (t.count, t.sum),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use epkv_engine::Bucket;
    use epkv_engine::{BucketConfig, EngineClock};
    use epkv_engine_api::{Expiry, StoreOp, StoreRequest};
    use epkv_types::{Cas, Datatype, NUM_VBUCKETS, vbucket_for_key};

    fn bucket_with(docs: usize) -> Arc<Bucket> {
        let b = Bucket::new(
            BucketConfig {
                expiry_pager_interval: Duration::ZERO,
                ..BucketConfig::default()
            },
            EngineClock::System,
        )
        .unwrap();
        for i in 0..docs {
            let key = format!("key{i}");
            b.store(StoreRequest {
                op: StoreOp::Set,
                vbid: vbucket_for_key(key.as_bytes(), NUM_VBUCKETS),
                key: key.as_bytes(),
                value: b"value",
                flags: 0,
                expiry: Expiry::Never,
                preserve_ttl: false,
                datatype: Datatype::RAW,
                cas: Cas::ANY,
                durability: None,
            })
            .unwrap();
        }
        b
    }

    fn line_value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }

    #[test]
    fn bucket_stats_are_labelled_typed_and_described() {
        let b = bucket_with(7);
        let mut f = Families::default();
        bucket_stats(&mut f, "default", b.as_ref());
        bucket_stats(&mut f, "travel", bucket_with(2).as_ref());
        let text = f.encode();
        assert_eq!(
            line_value(&text, r#"kv_curr_items{bucket="default"}"#),
            Some(7.0)
        );
        assert_eq!(
            line_value(&text, r#"kv_curr_items{bucket="travel"}"#),
            Some(2.0)
        );
        assert!(text.contains("# TYPE kv_curr_items gauge\n"));
        assert!(text.contains("# TYPE kv_cmd_set_total counter\n"));
        assert_eq!(
            line_value(&text, r#"kv_cmd_set_total{bucket="default"}"#),
            Some(7.0)
        );
        assert!(text.contains("# HELP kv_mem_used_bytes item memory in use"));
        let used = line_value(&text, r#"kv_mem_used_bytes{bucket="default"}"#).unwrap();
        assert!(used > 0.0);
        assert_eq!(
            line_value(&text, r#"kv_ep_persistence_enabled{bucket="default"}"#),
            Some(0.0),
            "memory-only"
        );
        assert_eq!(
            text.matches("# TYPE kv_curr_items ").count(),
            1,
            "one family for every bucket"
        );
        assert!(
            !text.contains("ep_bucket_name"),
            "text stats are not exported"
        );
        b.shutdown();
    }

    #[test]
    fn histograms_are_cumulative_with_an_inf_bucket() {
        let mut f = Families::default();
        let bounds = [Duration::from_micros(1), Duration::from_micros(2)];
        command_timings(
            &mut f,
            &[CommandTiming {
                opcode: 0,
                name: "GET".into(),
                count: 5,
                sum: Duration::from_micros(20),
                cumulative: vec![1, 3],
            }],
            &bounds,
        );
        connections(
            &mut f,
            ConnectionCounts {
                current: 3,
                total: 10,
                rejected: 1,
            },
        );
        let text = f.encode();
        assert!(text.contains("# TYPE kv_cmd_duration_seconds histogram\n"));
        let get = |le: &str| {
            line_value(
                &text,
                &format!("kv_cmd_duration_seconds_bucket{{opcode=\"GET\",le=\"{le}\"}}"),
            )
        };
        assert_eq!(get("0.000001"), Some(1.0));
        assert_eq!(get("0.000002"), Some(3.0));
        assert_eq!(get("+Inf"), Some(5.0));
        assert_eq!(
            line_value(&text, r#"kv_cmd_duration_seconds_sum{opcode="GET"}"#),
            Some(0.00002)
        );
        assert_eq!(line_value(&text, "kv_curr_connections"), Some(3.0));
        assert_eq!(line_value(&text, "kv_total_connections_total"), Some(10.0));
        assert_eq!(
            line_value(&text, "kv_rejected_connections_total"),
            Some(1.0)
        );
    }

    #[test]
    fn tasks_give_run_and_wait_histograms_per_name() {
        let b = bucket_with(0);
        let tasks = b.tasks();
        assert!(!tasks.is_empty(), "a bucket has at least its item pager");
        let mut f = Families::default();
        bucket_tasks(&mut f, "default", &tasks);
        let text = f.encode();
        let name = &tasks[0].name;
        for family in ["kv_task_duration_seconds", "kv_task_wait_duration_seconds"] {
            let inf = format!("{family}_bucket{{bucket=\"default\",task=\"{name}\",le=\"+Inf\"}}");
            let count = format!("{family}_count{{bucket=\"default\",task=\"{name}\"}}");
            assert_eq!(line_value(&text, &inf), line_value(&text, &count), "{text}");
            assert_eq!(
                text.lines()
                    .filter(|l| l.starts_with(&format!(
                        "{family}_bucket{{bucket=\"default\",task=\"{name}\""
                    )))
                    .count(),
                task_bounds().count() + 1
            );
        }
        b.shutdown();
    }

    #[test]
    fn task_bounds_are_exact_executor_boundaries() {
        let h = TaskHistogram::default();
        let bounds: Vec<_> = task_bounds().collect();
        assert_eq!(bounds[0], Duration::from_nanos(1024));
        assert_eq!(bounds[1], Duration::from_nanos(4096));
        assert_eq!(*bounds.last().unwrap(), Duration::from_nanos(1 << 40));
        assert!(task_cumulative(&h).all(|c| c == 0));
    }
}
