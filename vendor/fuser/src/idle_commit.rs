//! SCHED_IDLE while a ring thread commits its replies, so that the callers it
//! wakes stay on its CPU.
//!
//! A synchronous request is a hand-off between two threads: the caller
//! blocks, the ring thread (pinned to the caller's CPU) serves it, and its
//! commit wakes the caller. At that wake-up the ring thread is still running,
//! so the scheduler sees the caller's CPU busy and sends the caller to an idle
//! CPU (`select_idle_sibling`); the caller's next request then goes to that
//! CPU's queue, and so on: every round trip wakes a halted CPU. On a guest
//! without halt polling that is a VM exit and tens of microseconds (35-40 us
//! against 6 us per round trip on the 2-vCPU VM of docs/BENCHMARKS.md). A CPU
//! whose runnable threads are all SCHED_IDLE counts as idle for that choice
//! (`sched_idle_cpu`, Linux 5.4+), so a ring thread with one reply to commit
//! switches to SCHED_IDLE for the system call that submits it: the caller is
//! woken where it was and preempts the ring thread at once. (A batch of
//! replies is asynchronous I/O at depth: its submitter waits on no single
//! reply, and the first caller woken would preempt the rest of the batch, so
//! batches are committed at SCHED_OTHER.)
//!
//! Two ways back, by what the reply answered:
//!
//! - **A hand-off** (the reply answers the one request that woke the thread,
//!   served at once: a cached read, a lookup, a getattr): the thread commits
//!   and waits for the next request in one system call and stays at
//!   SCHED_IDLE while it waits and serves, for as long as hand-offs go on.
//!   The caller's next request wakes it on a CPU the caller has just left for
//!   its wait, so nothing normal competes with it there, and a round trip is
//!   one `io_uring_enter` on this side, with no change of policy: each
//!   `sched_setscheduler` costs as much as the enter itself (about 15 -> 12
//!   us per round trip on r32's VM, docs/BENCHMARKS.md). Any other commit
//!   goes back to SCHED_OTHER first. Replies to releases, which the kernel
//!   sends in the background, wake nobody and count for neither way.
//! - **Any other single reply** (one that a device completion or an earlier
//!   request produced): the thread commits at SCHED_IDLE and goes back to
//!   SCHED_OTHER when it next runs, before it waits.
//!
//! A SCHED_IDLE thread may wait long for a CPU where normal threads keep it
//! busy (its weight is 3 against 1024), and requests delivered to it wait
//! too. Both ways are watched:
//!
//! - after a single commit, the time from the switch to SCHED_IDLE to the
//!   return to SCHED_OTHER: past a millisecond with requests arrived
//!   meanwhile (they wait in its ring), the thread is starved;
//! - while it hands off, the time the kernel says it waited on a run queue
//!   (`run_delay` in /proc/thread-self/schedstat, read when a millisecond
//!   passed between two wake-ups and at least every 10 ms, about 2 us a
//!   read): more than a millisecond beyond a little per run, and the
//!   thread is starved.
//!
//! A starved thread commits at SCHED_OTHER for a second, then twice as long
//! each time that repeats (up to a minute), before it tries again. A long
//! stay with nothing waiting is the woken caller busy with its own work,
//! which costs nobody anything. Where schedstat cannot be read, hand-offs
//! are committed as other single replies are, and the thread never waits
//! for requests at SCHED_IDLE.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use log::{debug, info};

/// The longest a thread may spend at SCHED_IDLE around one commit, or wait
/// on a run queue while it hands off, before it stops using SCHED_IDLE for
/// a while.
const IDLE_SPAN_MAX: Duration = Duration::from_millis(1);
/// The wait on a run queue taken as normal for each run of a thread that
/// hands off: its caller wakes it and then still has its own way to its
/// wait to go (1-3 us measured).
const RUN_DELAY_PER_RUN: Duration = Duration::from_micros(10);
/// How old the last schedstat reading may be at a wake-up while handing off
/// (so that the allowance per run above covers at most this much time).
const RUN_DELAY_SAMPLE_MAX_AGE: Duration = Duration::from_millis(10);
/// Back-off after the first long span, doubled each time one repeats.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// The back-off after `demotions` long spans (1 for the first).
pub(crate) fn backoff(demotions: u32) -> Duration {
    let doublings = demotions.saturating_sub(1).min(6);
    (BACKOFF_MIN * 2u32.pow(doublings)).min(BACKOFF_MAX)
}

/// Why SCHED_IDLE cannot be used here, if it cannot: a thread must be able to
/// return to SCHED_OTHER, which unprivileged threads may not under the
/// default RLIMIT_NICE of 0. Probed once, on a scratch thread, so that no
/// serving thread is ever left at SCHED_IDLE.
pub(crate) fn unavailable() -> Option<&'static str> {
    static PROBE: OnceLock<Option<String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            std::thread::spawn(|| {
                set_policy(libc::SCHED_IDLE).map_err(|e| format!("SCHED_IDLE: {e}"))?;
                set_policy(libc::SCHED_OTHER)
                    .map_err(|e| format!("returning from SCHED_IDLE to SCHED_OTHER: {e}"))
            })
            .join()
            .unwrap_or_else(|_| Err("the probe thread panicked".to_string()))
            .err()
        })
        .as_deref()
}

/// Sets the calling thread's policy (priority 0, as both policies need).
fn set_policy(policy: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` outlives the call.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// What the kernel says of a thread's waits on run queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RunDelay {
    /// Time spent runnable but not running, in total.
    pub(crate) delay_ns: u64,
    /// Times the thread was given a CPU.
    pub(crate) runs: u64,
}

impl RunDelay {
    /// Parses /proc/.../schedstat: run time, run delay (both ns), runs.
    pub(crate) fn parse(text: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(text).ok()?;
        let mut fields = text.split_ascii_whitespace().skip(1);
        let delay_ns = fields.next()?.parse().ok()?;
        let runs = fields.next()?.parse().ok()?;
        Some(Self { delay_ns, runs })
    }

    /// Whether the waits between `self` and the later reading `now` hold
    /// one past what the runs between them explain: a thread starved.
    pub(crate) fn starved_by(&self, now: RunDelay) -> bool {
        let delay = Duration::from_nanos(now.delay_ns.saturating_sub(self.delay_ns));
        let runs = u32::try_from(now.runs.saturating_sub(self.runs)).unwrap_or(u32::MAX);
        delay > IDLE_SPAN_MAX + RUN_DELAY_PER_RUN.saturating_mul(runs)
    }
}

/// The calling thread's run queue waits, read on demand.
#[derive(Debug)]
struct RunDelayWatch {
    /// /proc/thread-self/schedstat of the ring thread (opened on it).
    schedstat: File,
    /// The last reading and when it was taken.
    sample: Option<(Instant, RunDelay)>,
    /// The thread's last wake-up while handing off.
    last_woke: Instant,
}

impl RunDelayWatch {
    fn open() -> Option<Self> {
        let mut watch = Self {
            schedstat: File::open("/proc/thread-self/schedstat").ok()?,
            sample: None,
            last_woke: Instant::now(),
        };
        // A kernel without schedstats (CONFIG_SCHED_INFO) answers "0 0 0"
        // for ever: nothing to watch with.
        let reading = watch.read()?;
        (reading.runs > 0).then_some(watch)
    }

    fn read(&mut self) -> Option<RunDelay> {
        let mut buffer = [0u8; 96];
        let length = self.schedstat.read_at(&mut buffer, 0).ok()?;
        RunDelay::parse(&buffer[..length])
    }

    /// Whether the last reading is older than the allowance per run covers.
    fn stale_at(&self, now: Instant) -> bool {
        self.sample
            .is_none_or(|(at, _)| now.duration_since(at) >= RUN_DELAY_SAMPLE_MAX_AGE)
    }

    /// Starts watching from now: a stale reading is taken again (a fresh
    /// one is kept: one read per switch to SCHED_IDLE would cost as much as
    /// the switch).
    fn restart(&mut self) {
        let now = Instant::now();
        self.last_woke = now;
        if self.stale_at(now) {
            self.sample = self.read().map(|reading| (now, reading));
        }
    }

    /// At a wake-up: whether the thread was starved since the last reading.
    fn woke(&mut self) -> bool {
        let now = Instant::now();
        let gap = now.duration_since(self.last_woke);
        self.last_woke = now;
        if gap <= IDLE_SPAN_MAX && !self.stale_at(now) {
            return false;
        }
        let Some(reading) = self.read() else {
            return false;
        };
        let before = self.sample.replace((now, reading));
        gap > IDLE_SPAN_MAX && before.is_some_and(|(_, before)| before.starved_by(reading))
    }
}

/// One ring thread's use of SCHED_IDLE around its commits.
#[derive(Debug)]
pub(crate) struct IdleCommit {
    name: String,
    /// The thread runs at SCHED_IDLE now.
    idle: bool,
    /// When the last single commit (not a hand-off) went out at SCHED_IDLE,
    /// until the thread is back at SCHED_OTHER.
    commit_since: Option<Instant>,
    /// While backing off: when to use SCHED_IDLE again.
    retry_at: Option<Instant>,
    demotions: u32,
    /// For hand-offs; `None` where schedstat cannot be read.
    run_delay: Option<RunDelayWatch>,
}

impl IdleCommit {
    /// `None` where SCHED_IDLE cannot be used (see [`unavailable`]). Called
    /// on the ring thread itself (the schedstat it opens is its own).
    pub(crate) fn new(name: &str) -> Option<Self> {
        if let Some(why) = unavailable() {
            debug!("{name}: commits at SCHED_OTHER: {why}");
            return None;
        }
        // SAFETY: pid 0 is the calling thread.
        let policy = unsafe { libc::sched_getscheduler(0) };
        if policy != libc::SCHED_OTHER {
            // A policy the user chose (chrt) is left as it is.
            debug!("{name}: scheduling policy {policy} kept, SCHED_IDLE not used");
            return None;
        }
        let run_delay = RunDelayWatch::open();
        if run_delay.is_none() {
            debug!("{name}: no schedstat to watch, hand-offs wait at SCHED_OTHER");
        }
        Some(Self {
            name: name.to_string(),
            idle: false,
            commit_since: None,
            retry_at: None,
            demotions: 0,
            run_delay,
        })
    }

    fn backing_off_at(&mut self, now: Instant) -> bool {
        if self.retry_at.is_some_and(|retry_at| now < retry_at) {
            return true;
        }
        self.retry_at = None;
        false
    }

    fn set_idle(&mut self, idle: bool) {
        if self.idle == idle {
            return;
        }
        if idle {
            self.idle = set_policy(libc::SCHED_IDLE).is_ok();
        } else if let Err(error) = set_policy(libc::SCHED_OTHER) {
            // The probe said this works; never serve on at SCHED_IDLE.
            panic!("{}: cannot return to SCHED_OTHER: {error}", self.name);
        } else {
            self.idle = false;
        }
    }

    /// Switches to SCHED_IDLE for the single commit about to be submitted,
    /// unless backing off.
    pub(crate) fn enter(&mut self) {
        let now = Instant::now();
        if self.backing_off_at(now) {
            return;
        }
        self.set_idle(true);
        if self.idle {
            self.commit_since = Some(now);
        }
    }

    /// Back to SCHED_OTHER once the single commit is submitted (and the
    /// thread runs again); a long stay at SCHED_IDLE while `work_waited`
    /// (requests or replies arrived for the thread meanwhile) starts a
    /// back-off.
    pub(crate) fn leave(&mut self, work_waited: bool) {
        let Some(since) = self.commit_since.take() else {
            return;
        };
        self.set_idle(false);
        let span = since.elapsed();
        if span > IDLE_SPAN_MAX && work_waited {
            self.back_off(&format!(
                "waited {} us for a CPU after committing at SCHED_IDLE, with work waiting",
                span.as_micros()
            ));
        }
    }

    /// Before a hand-off is committed together with the wait for the next
    /// request: whether the thread is (now) at SCHED_IDLE for both. False
    /// while backing off or where schedstat cannot be read; the caller then
    /// commits it as another single reply.
    pub(crate) fn hand_off(&mut self) -> bool {
        if self.run_delay.is_none() || self.backing_off_at(Instant::now()) {
            return false;
        }
        if !self.idle {
            self.set_idle(true);
            if let (true, Some(watch)) = (self.idle, &mut self.run_delay) {
                watch.restart();
            }
        }
        self.idle
    }

    /// Before anything but a single commit: back to SCHED_OTHER.
    pub(crate) fn other(&mut self) {
        self.commit_since = None;
        self.set_idle(false);
    }

    /// After every wait: a thread handing off that waited too long on a run
    /// queue goes back to SCHED_OTHER and backs off.
    pub(crate) fn woke(&mut self) {
        if !self.idle || self.commit_since.is_some() {
            return;
        }
        let Some(watch) = &mut self.run_delay else {
            return;
        };
        if watch.woke() {
            self.set_idle(false);
            self.back_off("waited over a millisecond for a CPU while handing off at SCHED_IDLE");
        }
    }

    fn back_off(&mut self, what: &str) {
        self.demotions = self.demotions.saturating_add(1);
        let pause = backoff(self.demotions);
        self.retry_at = Some(Instant::now() + pause);
        let message = format!(
            "{}: {what}: commits at SCHED_OTHER for {} s",
            self.name,
            pause.as_secs()
        );
        if self.demotions == 1 {
            info!("{message}");
        } else {
            debug!("{message}");
        }
    }

    /// Whether the thread is backing off from SCHED_IDLE now.
    #[cfg(test)]
    fn backing_off(&self) -> bool {
        self.retry_at
            .is_some_and(|retry_at| Instant::now() < retry_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> libc::c_int {
        // SAFETY: pid 0 is the calling thread.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn a_policy_other_than_sched_other_is_left_alone() {
        std::thread::spawn(|| {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: pid 0 is this thread; `param` outlives the call.
            assert_eq!(
                unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) },
                0
            );
            assert!(IdleCommit::new("batch").is_none());
            assert_eq!(policy(), libc::SCHED_BATCH);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_back_off_doubles_up_to_a_minute() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(4), Duration::from_secs(8));
        assert_eq!(backoff(7), Duration::from_secs(60));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn schedstat_is_parsed_and_a_wait_beyond_the_allowance_per_run_is_starvation() {
        let before = RunDelay::parse(b"1000 5000000 100\n").unwrap();
        assert_eq!(
            before,
            RunDelay {
                delay_ns: 5_000_000,
                runs: 100
            }
        );
        assert_eq!(RunDelay::parse(b"0 0\n"), None);
        assert_eq!(RunDelay::parse(b"1 x 3\n"), None);
        // A thousand quick hand-offs, each woken 2 us before its caller
        // left the CPU: normal.
        let quick = RunDelay {
            delay_ns: before.delay_ns + 2_000_000,
            runs: before.runs + 1000,
        };
        assert!(!before.starved_by(quick));
        // One run after 5 ms on a run queue.
        let starved = RunDelay {
            delay_ns: before.delay_ns + 5_000_000,
            runs: before.runs + 1,
        };
        assert!(before.starved_by(starved));
        // A counter that went backwards (never seen) is not starvation.
        assert!(!starved.starved_by(before));
    }

    /// Pins the calling thread to `cpu`.
    fn pin(cpu: usize) {
        // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` is below CPU_SETSIZE (it is a CPU this thread ran on).
        unsafe { libc::CPU_SET(cpu, &mut set) };
        // SAFETY: pid 0 is the calling thread; `set` outlives the call.
        let pinned = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
        assert_eq!(pinned, 0, "{}", io::Error::last_os_error());
    }

    #[test]
    fn a_hand_off_waits_at_sched_idle_and_a_starved_one_backs_off() {
        if unavailable().is_some() {
            // The refusal is checked by the test below.
            return;
        }
        std::thread::spawn(|| {
            let mut commit = IdleCommit::new("test-ring").expect("the probe said available");
            if commit.run_delay.is_none() {
                eprintln!("no schedstat here: hand-offs are refused");
                assert!(!commit.hand_off());
                assert_eq!(policy(), libc::SCHED_OTHER);
                return;
            }
            assert!(commit.hand_off());
            assert_eq!(policy(), libc::SCHED_IDLE);
            // Woken at once: still handing off, at SCHED_IDLE.
            commit.woke();
            assert_eq!(policy(), libc::SCHED_IDLE);
            assert!(commit.hand_off());
            // Anything but a single commit goes back to SCHED_OTHER.
            commit.other();
            assert_eq!(policy(), libc::SCHED_OTHER);
            assert!(!commit.backing_off());

            // Starved: a real-time thread spins on this thread's CPU, so
            // this one waits on the run queue until the spinner ends. (A
            // normal spinner starves a SCHED_IDLE thread only sometimes:
            // EEVDF may pick the woken thread first.)
            // SAFETY: sched_getcpu has no preconditions.
            let cpu = usize::try_from(unsafe { libc::sched_getcpu() }).unwrap();
            pin(cpu);
            assert!(commit.hand_off());
            let (spinning, spins) = std::sync::mpsc::channel();
            let spinner = std::thread::spawn(move || {
                pin(cpu);
                let param = libc::sched_param { sched_priority: 1 };
                // SAFETY: pid 0 is this thread; `param` outlives the call.
                let fifo = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
                assert_eq!(fifo, 0, "SCHED_FIFO: {}", io::Error::last_os_error());
                spinning.send(()).unwrap();
                let end = Instant::now() + Duration::from_millis(60);
                while Instant::now() < end {
                    std::hint::spin_loop();
                }
            });
            spins.recv().unwrap();
            std::thread::sleep(Duration::from_millis(5));
            commit.woke();
            spinner.join().unwrap();
            assert_eq!(policy(), libc::SCHED_OTHER);
            assert!(commit.backing_off());
            assert!(!commit.hand_off(), "no hand-off at SCHED_IDLE while backing off");
            assert_eq!(policy(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_is_idle_only_between_enter_and_leave_and_backs_off_when_work_waited_long() {
        if let Some(why) = unavailable() {
            eprintln!("SCHED_IDLE unavailable here ({why}): only the refusal is checked");
            assert!(
                std::thread::spawn(|| IdleCommit::new("t").is_none())
                    .join()
                    .unwrap()
            );
            return;
        }
        std::thread::spawn(|| {
            let mut commit = IdleCommit::new("test-ring").expect("the probe said available");
            assert_eq!(policy(), libc::SCHED_OTHER);
            commit.enter();
            assert_eq!(policy(), libc::SCHED_IDLE);
            commit.leave(false);
            assert_eq!(policy(), libc::SCHED_OTHER);
            assert!(!commit.backing_off());
            // A span past the limit with nothing waiting: the woken caller
            // was busy, nobody starved.
            commit.enter();
            std::thread::sleep(IDLE_SPAN_MAX * 2);
            commit.leave(false);
            assert!(!commit.backing_off());
            // The same with requests waiting (slept here; a starved thread
            // waits).
            commit.enter();
            std::thread::sleep(IDLE_SPAN_MAX * 2);
            commit.leave(true);
            assert_eq!(policy(), libc::SCHED_OTHER);
            assert!(commit.backing_off());
            commit.enter();
            assert_eq!(
                policy(),
                libc::SCHED_OTHER,
                "no SCHED_IDLE while backing off"
            );
            commit.leave(false);
            // Once the back-off has passed, SCHED_IDLE again.
            commit.retry_at = Some(Instant::now());
            commit.enter();
            assert_eq!(policy(), libc::SCHED_IDLE);
            commit.leave(false);
            assert_eq!(policy(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }
}
