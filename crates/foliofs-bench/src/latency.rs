//! Latency histograms and the one-line summary benchmarks print.

use std::time::Duration;

use hdrhistogram::Histogram;

/// The longest latency tracked; longer ones are recorded as this.
const LATENCY_NS_MAX: u64 = 3_600_000_000_000;

/// Completion latencies in nanoseconds, 3 significant digits (as fio's
/// percentiles are usable at), from 1 ns to an hour.
pub struct Latencies {
    histogram: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Self {
        Self::new()
    }
}

impl Latencies {
    pub fn new() -> Self {
        let histogram = Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("valid bounds");
        Self { histogram }
    }

    pub fn record(&mut self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.histogram.saturating_record(nanos);
    }

    pub fn merge(&mut self, other: &Latencies) {
        self.histogram.add(&other.histogram).expect("histograms of the same shape");
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    pub fn min_ns(&self) -> u64 {
        if self.count() == 0 {
            0
        } else {
            self.histogram.min()
        }
    }

    pub fn max_ns(&self) -> u64 {
        self.histogram.max()
    }

    pub fn mean_ns(&self) -> f64 {
        self.histogram.mean()
    }

    pub fn stdev_ns(&self) -> f64 {
        self.histogram.stdev()
    }

    pub fn percentile_ns(&self, percentile: f64) -> u64 {
        self.histogram.value_at_percentile(percentile)
    }

    pub fn percentile_us(&self, percentile: f64) -> f64 {
        self.histogram.value_at_percentile(percentile) as f64 / 1000.0
    }

    /// `min, avg, p50, p99, p99.9, max` in microseconds.
    pub fn summary(&self) -> String {
        if self.count() == 0 {
            return "no completions".into();
        }
        format!(
            "lat (us): min={:.1} avg={:.1} p50={:.1} p99={:.1} p99.9={:.1} max={:.1}",
            self.histogram.min() as f64 / 1000.0,
            self.histogram.mean() / 1000.0,
            self.percentile_us(50.0),
            self.percentile_us(99.0),
            self.percentile_us(99.9),
            self.histogram.max() as f64 / 1000.0
        )
    }
}

/// The metadata lock waits between two readings, as one line: how many
/// waits and how long, in all and per operation, for the shard locks, free
/// space and the journal. Contention shows here even where the rates are
/// too noisy to show it (2 CPUs).
pub fn lock_waits_line(
    before: &foliofs::vfs::LockWaits,
    after: &foliofs::vfs::LockWaits,
    operations: f64,
) -> String {
    let part = |name: &str, waits: u64, wait_ns: u64| {
        format!(
            "{name} {waits} ({:.1} ms, {:.0} ns/op)",
            wait_ns as f64 / 1e6,
            wait_ns as f64 / operations.max(1.0)
        )
    };
    format!(
        "lock waits: {}; {}; {}",
        part(
            "shards",
            after.shard_waits - before.shard_waits,
            after.shard_wait_ns - before.shard_wait_ns
        ),
        part(
            "space",
            after.space_waits - before.space_waits,
            after.space_wait_ns - before.space_wait_ns
        ),
        part(
            "journal",
            after.journal_waits - before.journal_waits,
            after.journal_wait_ns - before.journal_wait_ns
        ),
    )
}
