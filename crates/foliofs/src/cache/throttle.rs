//! Pacing of buffered writers by the device's write bandwidth, after the
//! kernel's `balance_dirty_pages`: between the freerun ceiling (halfway from
//! the background threshold to the dirty limit) and the limit, writers
//! together may dirty data at the measured writeback bandwidth times a
//! position ratio: twice it at the freerun ceiling, once at the setpoint
//! (halfway from there to the limit), nothing at the limit, cubic between.
//! So the dirty count settles near the setpoint with every writer sleeping a
//! little after each write, instead of writers racing to the limit and then
//! stalling for a whole writeback batch.
//!
//! Writers share one pacing clock: each reserves the time its bytes take at
//! the paced rate after the reservations before it and sleeps until then.
//! However many writers there are, together they go at the paced rate, with
//! no count of writers to keep. Memory and time only: the caller sleeps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The longest one write is paused (the kernel's MAX_PAUSE): debt beyond
/// it is forgiven, so a writer never sleeps long on a stale estimate.
pub(crate) const PAUSE_MAX: Duration = Duration::from_millis(200);

/// Pauses shorter than this are not slept but left owing: the next write
/// sleeps for both (a sleep costs tens of microseconds of its own).
const PAUSE_MIN: Duration = Duration::from_millis(1);

/// Bytes writeback completes between two bandwidth samples at most, and at
/// least (see [`DirtyThrottle::new`]): enough that a sample is the device's
/// bandwidth, not one request's latency (a 4 KiB fsync alone would read as
/// a slow disk).
const SAMPLE_BYTES_MAX: u64 = 64 << 20;
const SAMPLE_BYTES_MIN: u64 = 1 << 20;

/// Below this position ratio the rate is held here (the hard limit, not
/// the pacing, stops writers at the limit itself).
const POSITION_RATIO_MIN: f64 = 1.0 / 64.0;

/// The dirty counts at which pacing starts and stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirtyLimits {
    pub background_bytes: u64,
    pub limit_bytes: u64,
}

impl DirtyLimits {
    /// Below this writers are never paced (the kernel's freerun ceiling).
    pub fn freerun_bytes(&self) -> u64 {
        let background = self.background_bytes.min(self.limit_bytes);
        let freerun = background + (self.limit_bytes - background) / 2;
        debug_assert!(freerun <= self.limit_bytes, "freerun {freerun} past the limit");
        freerun
    }

    /// Where pacing holds the dirty count: writers go at the bandwidth.
    pub fn setpoint_bytes(&self) -> u64 {
        let freerun = self.freerun_bytes();
        let setpoint = freerun + (self.limit_bytes - freerun) / 2;
        debug_assert!(freerun <= setpoint && setpoint <= self.limit_bytes);
        setpoint
    }

    /// The paced rate as a fraction of the write bandwidth, for `dirty`
    /// bytes dirty: 2 at the freerun ceiling, 1 at the setpoint, 0 at the
    /// limit, `1 + x^3` between (x: the distance below the setpoint over
    /// half the paced range), so it barely moves near the setpoint and
    /// falls fast near the ends.
    pub fn position_ratio(&self, dirty: u64) -> f64 {
        let setpoint = self.setpoint_bytes() as f64;
        let half_range = (self.limit_bytes as f64 - setpoint).max(1.0);
        let below = ((setpoint - dirty as f64) / half_range).clamp(-1.0, 1.0);
        let ratio = 1.0 + below * below * below;
        debug_assert!((0.0..=2.0).contains(&ratio), "position ratio {ratio}");
        ratio
    }
}

/// Bytes written back over the time writeback was busy: the union of the
/// batches' times, so batches in flight together (the flusher and an
/// fsync) count their time once and idle time between them not at all.
#[derive(Default)]
struct BandwidthMeter {
    batches_in_flight: u32,
    /// Busy time counted up to here.
    counted_until: Option<Instant>,
    busy: Duration,
    bytes: u64,
}

#[derive(Default)]
struct Pacing {
    meter: BandwidthMeter,
    /// Bytes per second writeback reached while busy, smoothed; None until
    /// the first sample (no pacing before).
    write_bytes_per_s: Option<f64>,
    /// The end of the last reservation on the pacing clock.
    paced_until: Option<Instant>,
}

impl Pacing {
    fn batch_started(&mut self, now: Instant) {
        let meter = &mut self.meter;
        if meter.batches_in_flight == 0 {
            meter.counted_until = Some(now);
        }
        meter.batches_in_flight += 1;
    }

    /// Once `sample_bytes` completed, at the next moment no batch is in
    /// flight, the bytes over the busy time are a sample; the estimate is
    /// the mean of it and the one before.
    fn batch_finished(&mut self, bytes: u64, sample_bytes: u64, now: Instant) {
        let meter = &mut self.meter;
        if let Some(counted_until) = meter.counted_until {
            meter.busy += now.saturating_duration_since(counted_until);
        }
        meter.counted_until = Some(now);
        meter.batches_in_flight = meter.batches_in_flight.saturating_sub(1);
        meter.bytes += bytes;
        // A sample only while no batch is in flight: a batch's bytes count
        // when it completes, so one cut in two would put all its bytes in
        // the later sample and only part of its time.
        if meter.batches_in_flight > 0 || meter.bytes < sample_bytes || meter.busy.is_zero() {
            return;
        }
        let sample = meter.bytes as f64 / meter.busy.as_secs_f64();
        meter.bytes = 0;
        meter.busy = Duration::ZERO;
        self.write_bytes_per_s = Some(match self.write_bytes_per_s {
            None => sample,
            Some(estimate) => (estimate + sample) / 2.0,
        });
    }
}

/// The write bandwidth estimate, the pacing clock and what pacing did.
pub struct DirtyThrottle {
    pacing: Mutex<Pacing>,
    /// Bytes completed per bandwidth sample.
    sample_bytes: u64,
    pauses: AtomicU64,
    pause_ns_total: AtomicU64,
}

impl DirtyThrottle {
    /// Samples every dirty limit's worth of writeback (pacing starts below
    /// it, so a sample must come sooner), within 1 and 64 MiB.
    pub fn new(limits: DirtyLimits) -> Self {
        Self {
            pacing: Mutex::default(),
            sample_bytes: limits.limit_bytes.clamp(SAMPLE_BYTES_MIN, SAMPLE_BYTES_MAX),
            pauses: AtomicU64::new(0),
            pause_ns_total: AtomicU64::new(0),
        }
    }

    /// A writeback batch issues its requests now.
    pub fn writeback_started(&self) {
        let mut pacing = self.pacing.lock();
        // The time is read under the lock, so the meter's clock never runs
        // backwards between threads.
        pacing.batch_started(Instant::now());
    }

    /// A batch's requests completed now, `bytes` of them written.
    pub fn writeback_finished(&self, bytes: u64) {
        let mut pacing = self.pacing.lock();
        pacing.batch_finished(bytes, self.sample_bytes, Instant::now());
    }

    /// The smoothed writeback bandwidth, once measured.
    pub fn write_bytes_per_s(&self) -> Option<u64> {
        self.pacing.lock().write_bytes_per_s.map(|rate| rate as u64)
    }

    /// How long a writer that just dirtied `bytes`, leaving `dirty` bytes
    /// dirty, sleeps at `now`; zero below the freerun ceiling, before the
    /// bandwidth is known, and while the writers owe less than
    /// [`PAUSE_MIN`]. Reserves the time on the pacing clock.
    pub fn pause_for(&self, limits: DirtyLimits, dirty: u64, bytes: u64, now: Instant) -> Duration {
        if dirty <= limits.freerun_bytes() || bytes == 0 {
            return Duration::ZERO;
        }
        let mut pacing = self.pacing.lock();
        let Some(bandwidth) = pacing.write_bytes_per_s else { return Duration::ZERO };
        let rate = bandwidth * limits.position_ratio(dirty).max(POSITION_RATIO_MIN);
        // Samples are bytes over a busy time that is not zero.
        debug_assert!(rate > 0.0 && rate.is_finite(), "a paced rate of {rate} bytes/s");
        let slot = Duration::from_secs_f64(bytes as f64 / rate);
        let start = pacing.paced_until.filter(|&until| until > now).unwrap_or(now);
        let until = (start + slot).min(now + PAUSE_MAX);
        pacing.paced_until = Some(until);
        let pause = until - now;
        debug_assert!(pause <= PAUSE_MAX, "a pause of {pause:?}");
        if pause < PAUSE_MIN {
            Duration::ZERO
        } else {
            pause
        }
    }

    /// A writer slept `pause` (counted for [`Self::pauses`]).
    pub fn note_pause(&self, pause: Duration) {
        self.pauses.fetch_add(1, Ordering::Relaxed);
        self.pause_ns_total.fetch_add(pause.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Pauses slept, and their total time, since the volume opened.
    pub fn pauses(&self) -> (u64, u64) {
        (self.pauses.load(Ordering::Relaxed), self.pause_ns_total.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn limits() -> DirtyLimits {
        // Freerun at 150 MiB, setpoint at 175 MiB.
        DirtyLimits { background_bytes: 100 * MIB, limit_bytes: 200 * MIB }
    }

    fn throttle_at(bytes_per_s: u64) -> DirtyThrottle {
        let throttle = DirtyThrottle::new(limits());
        let start = Instant::now();
        let elapsed = Duration::from_secs_f64(SAMPLE_BYTES_MAX as f64 / bytes_per_s as f64);
        let mut pacing = throttle.pacing.lock();
        pacing.batch_started(start);
        pacing.batch_finished(SAMPLE_BYTES_MAX, throttle.sample_bytes, start + elapsed);
        drop(pacing);
        throttle
    }

    #[test]
    fn the_position_ratio_runs_from_two_at_freerun_to_zero_at_the_limit() {
        let limits = limits();
        assert_eq!(limits.freerun_bytes(), 150 * MIB);
        assert_eq!(limits.setpoint_bytes(), 175 * MIB);
        assert_eq!(limits.position_ratio(150 * MIB), 2.0);
        assert_eq!(limits.position_ratio(175 * MIB), 1.0);
        assert_eq!(limits.position_ratio(200 * MIB), 0.0);
        assert_eq!(limits.position_ratio(10 * MIB), 2.0, "clamped below freerun");
        assert_eq!(limits.position_ratio(900 * MIB), 0.0, "clamped above the limit");
        let near = limits.position_ratio(170 * MIB);
        assert!(near > 1.0 && near < 1.01, "flat near the setpoint: {near}");
        let mut last = f64::MAX;
        for dirty in (150..=200).map(|mib| mib * MIB) {
            let ratio = limits.position_ratio(dirty);
            assert!(ratio <= last, "falls as dirty data grows");
            last = ratio;
        }
    }

    #[test]
    fn writers_below_freerun_or_before_a_measurement_are_not_paced() {
        let now = Instant::now();
        let measured = throttle_at(100 * MIB);
        assert_eq!(measured.pause_for(limits(), 150 * MIB, 64 * MIB, now), Duration::ZERO);
        let unmeasured = DirtyThrottle::new(limits());
        assert_eq!(unmeasured.pause_for(limits(), 199 * MIB, 64 * MIB, now), Duration::ZERO);
    }

    #[test]
    fn writers_together_go_at_the_bandwidth_at_the_setpoint() {
        // 100 MiB/s at the setpoint: four writers each dirtying 1 MiB
        // reserve 10 ms apiece, one after another on the shared clock.
        let throttle = throttle_at(100 * MIB);
        let now = Instant::now();
        let pauses: Vec<Duration> = (0..4)
            .map(|_| throttle.pause_for(limits(), limits().setpoint_bytes(), MIB, now))
            .collect();
        for (writer, pause) in pauses.iter().enumerate() {
            let expected = Duration::from_millis(10 * (writer as u64 + 1));
            let error = pause.abs_diff(expected);
            assert!(error < Duration::from_micros(10), "writer {writer}: {pause:?}");
        }
        // Twice the rate at the freerun ceiling (just above it).
        let fast = throttle_at(100 * MIB);
        let pause = fast.pause_for(limits(), limits().freerun_bytes() + 1, MIB, now);
        assert!(pause.abs_diff(Duration::from_millis(5)) < Duration::from_micros(10), "{pause:?}");
    }

    #[test]
    fn small_debts_wait_for_the_next_write_and_large_ones_are_capped() {
        let throttle = throttle_at(100 * MIB);
        let now = Instant::now();
        let setpoint = limits().setpoint_bytes();
        // 4 KiB at 100 MiB/s is 39 us: owed, not slept.
        assert_eq!(throttle.pause_for(limits(), setpoint, 4096, now), Duration::ZERO);
        // The debt carries: 1 MiB more sleeps 10 ms plus the 39 us.
        let pause = throttle.pause_for(limits(), setpoint, MIB, now);
        assert!(pause > Duration::from_millis(10), "{pause:?}");
        // Near the limit the rate is tiny, but no pause exceeds PAUSE_MAX,
        // and the debt is forgiven beyond it.
        let capped = throttle.pause_for(limits(), 200 * MIB - 1, 64 * MIB, now);
        assert_eq!(capped, PAUSE_MAX);
        let later = now + PAUSE_MAX;
        let after = throttle.pause_for(limits(), setpoint, MIB, later);
        assert!(after.abs_diff(Duration::from_millis(10)) < Duration::from_micros(10), "{after:?}");
    }

    #[test]
    fn the_estimate_counts_busy_time_once_and_idle_time_not_at_all() {
        // Limits of 200 MiB: a sample every 64 MiB.
        let throttle = DirtyThrottle::new(limits());
        let sample_bytes = throttle.sample_bytes;
        assert_eq!(sample_bytes, 64 * MIB);
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut pacing = throttle.pacing.lock();
        // Two batches of 16 MiB overlapping by half: 32 MiB in 30 ms busy.
        pacing.batch_started(at(0));
        pacing.batch_started(at(10));
        pacing.batch_finished(16 * MIB, sample_bytes, at(20));
        pacing.batch_finished(16 * MIB, sample_bytes, at(30));
        assert_eq!(pacing.write_bytes_per_s, None, "no sample before 64 MiB");
        // 64 MiB completed, but with a batch in flight: no sample yet.
        pacing.batch_started(at(40));
        pacing.batch_started(at(45));
        pacing.batch_finished(32 * MIB, sample_bytes, at(50));
        assert_eq!(pacing.write_bytes_per_s, None, "a batch in flight");
        // Quiet at 60 ms: 80 MiB in 50 ms of busy time, 1600 MiB/s.
        pacing.batch_finished(16 * MIB, sample_bytes, at(60));
        drop(pacing);
        assert_near(throttle.write_bytes_per_s(), 1600 * MIB);
        let mut pacing = throttle.pacing.lock();
        // A second of idle time, then 64 MiB in 80 ms (800 MiB/s): the
        // idle time does not count, and the sample is averaged in.
        pacing.batch_started(at(1060));
        pacing.batch_finished(64 * MIB, sample_bytes, at(1140));
        drop(pacing);
        assert_near(throttle.write_bytes_per_s(), 1200 * MIB);
        // A small cache samples sooner: every dirty limit's worth.
        let small = DirtyLimits { background_bytes: 2 * MIB, limit_bytes: 4 * MIB };
        assert_eq!(DirtyThrottle::new(small).sample_bytes, 4 * MIB);
    }

    fn assert_near(estimate: Option<u64>, expected: u64) {
        let estimate = estimate.expect("measured");
        assert!(estimate.abs_diff(expected) <= expected / 1000, "{estimate} against {expected}");
    }
}
