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
//! switches to SCHED_IDLE just for the system call that submits it: the
//! caller is woken where it was, preempts the ring thread at once, and the
//! ring thread goes back to SCHED_OTHER when it next runs, before it waits
//! for requests. (A batch of replies is asynchronous I/O at depth: its
//! submitter waits on no single reply, and the first caller woken would
//! preempt the rest of the batch, so batches are committed at SCHED_OTHER.)
//!
//! A SCHED_IDLE thread may wait long for a CPU where normal threads keep it
//! busy (its weight is 3 against 1024), and requests delivered to it wait
//! too. So the time from the switch to SCHED_IDLE to the return to SCHED_OTHER
//! is watched: when it exceeds a millisecond and requests arrived meanwhile
//! (they wait in its ring), the thread commits at SCHED_OTHER for a second,
//! then twice as long each time that repeats (up to a minute), before it
//! tries again. A long stay with nothing waiting is the woken caller busy
//! with its own work, which costs nobody anything. The thread never waits for
//! requests at SCHED_IDLE, so a wake-up for a new request is never delayed
//! by it.

use std::io;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use log::{debug, info};

/// The longest a thread may spend at SCHED_IDLE around one commit before it
/// stops using SCHED_IDLE for a while.
const IDLE_SPAN_MAX: Duration = Duration::from_millis(1);
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

/// One ring thread's use of SCHED_IDLE around its commits.
#[derive(Debug)]
pub(crate) struct IdleCommit {
    name: String,
    /// When the thread went to SCHED_IDLE, while it is there.
    idle_since: Option<Instant>,
    /// While backing off: when to use SCHED_IDLE again.
    retry_at: Option<Instant>,
    demotions: u32,
}

impl IdleCommit {
    /// `None` where SCHED_IDLE cannot be used (see [`unavailable`]).
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
        Some(Self {
            name: name.to_string(),
            idle_since: None,
            retry_at: None,
            demotions: 0,
        })
    }

    /// Switches to SCHED_IDLE for the commits about to be submitted, unless
    /// backing off.
    pub(crate) fn enter(&mut self) {
        let now = Instant::now();
        if self.retry_at.is_some_and(|retry_at| now < retry_at) {
            return;
        }
        self.retry_at = None;
        if set_policy(libc::SCHED_IDLE).is_ok() {
            self.idle_since = Some(now);
        }
    }

    /// Back to SCHED_OTHER once the commits are submitted (and the thread
    /// runs again); a long stay at SCHED_IDLE while `work_waited` (requests
    /// or replies arrived for the thread meanwhile) starts a back-off.
    pub(crate) fn leave(&mut self, work_waited: bool) {
        let Some(since) = self.idle_since.take() else {
            return;
        };
        if let Err(error) = set_policy(libc::SCHED_OTHER) {
            // The probe said this works; never serve on at SCHED_IDLE.
            panic!("{}: cannot return to SCHED_OTHER: {error}", self.name);
        }
        let span = since.elapsed();
        if span > IDLE_SPAN_MAX && work_waited {
            self.demotions = self.demotions.saturating_add(1);
            let pause = backoff(self.demotions);
            self.retry_at = Some(Instant::now() + pause);
            let message = format!(
                "{}: waited {} us for a CPU after committing at SCHED_IDLE, with work \
                 waiting: commits at SCHED_OTHER for {} s",
                self.name,
                span.as_micros(),
                pause.as_secs()
            );
            if self.demotions == 1 {
                info!("{message}");
            } else {
                debug!("{message}");
            }
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
