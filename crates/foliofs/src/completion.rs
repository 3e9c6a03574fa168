//! Futures completed by the engine. A request's completion (on a device
//! completion thread, or inline) fills the slot and wakes whatever task polls
//! the future, so any executor can drive the asynchronous API; `block_on`
//! drives one future on the calling thread.
//!
//! A thread that submitted to an io_uring ring of its own registers that ring
//! as a [`Driver`]; `block_on` then waits for completions inside the ring and
//! runs them on the waiting thread, as fio does, instead of sleeping until
//! another thread hands them over.

use std::cell::RefCell;
use std::future::Future;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};

use parking_lot::{Condvar, Mutex};

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
}

/// The receiving end: resolves to the value given to its [`Completer`].
pub struct IoFuture<T> {
    slot: Arc<Mutex<Slot<T>>>,
}

/// The sending end: completes the future exactly once.
pub struct Completer<T> {
    slot: Arc<Mutex<Slot<T>>>,
}

/// A connected future and completer.
pub fn pair<T>() -> (IoFuture<T>, Completer<T>) {
    let slot = Arc::new(Mutex::new(Slot { value: None, waker: None }));
    (IoFuture { slot: Arc::clone(&slot) }, Completer { slot })
}

/// A future that is already complete.
pub fn ready<T>(value: T) -> IoFuture<T> {
    IoFuture { slot: Arc::new(Mutex::new(Slot { value: Some(value), waker: None })) }
}

impl<T> Completer<T> {
    pub fn complete(self, value: T) {
        let waker = {
            let mut slot = self.slot.lock();
            debug_assert!(slot.value.is_none());
            slot.value = Some(value);
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Future for IoFuture<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<T> {
        let mut slot = self.slot.lock();
        match slot.value.take() {
            Some(value) => Poll::Ready(value),
            None => {
                slot.waker = Some(context.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Wakes a thread parked in `block_on`.
struct ThreadWaker {
    woken: Mutex<bool>,
    signal: Condvar,
}

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        *self.woken.lock() = true;
        self.signal.notify_one();
    }
}

/// A source of completions the calling thread can wait on and run itself.
/// Its completions must also run when its thread is not waiting in it (the
/// io_uring sweeper does that): a thread blocked elsewhere, as on an inode
/// lock that drains in-flight direct I/O, may never drive it again.
pub trait Driver: Send + Sync {
    /// Whether requests are in flight that `drive` would wait for.
    fn has_work(&self) -> bool;
    /// Waits for at least one completion and runs the callbacks of all
    /// completions available.
    fn drive(&self);
    /// Runs the callbacks of the completions already available, without
    /// waiting; returns how many ran.
    fn reap_ready(&self) -> usize;
    /// The owning thread is about to sleep in an event loop of its own that
    /// also wakes when the returned descriptor is readable: runs what
    /// completed, and leaves later completions to that thread until
    /// [`Driver::end_owner_wait`] (the sweeper still runs them whenever the
    /// thread is not asleep there). None: no such descriptor.
    fn begin_owner_wait(&self) -> Option<RawFd> {
        self.reap_ready();
        None
    }
    /// The owning thread woke from the wait `begin_owner_wait` began: runs
    /// what completed, and leaves later completions to the sweeper again.
    fn end_owner_wait(&self) {}
}

thread_local! {
    static DRIVERS: RefCell<Vec<Weak<dyn Driver>>> = const { RefCell::new(Vec::new()) };
}

/// Makes `driver` one that `block_on` on this thread waits through.
pub fn register_thread_driver(driver: Weak<dyn Driver>) {
    DRIVERS.with(|drivers| {
        let mut drivers = drivers.borrow_mut();
        drivers.retain(|known| known.strong_count() > 0);
        debug_assert!(driver.strong_count() > 0, "a driver registered after it was dropped");
        drivers.push(driver);
    });
}

/// A driver of this thread with requests in flight, if any.
fn busy_driver() -> Option<Arc<dyn Driver>> {
    DRIVERS.with(|drivers| {
        drivers.borrow().iter().filter_map(Weak::upgrade).find(|driver| driver.has_work())
    })
}

/// Runs the completions this thread's rings already hold, on this thread,
/// without waiting: a server thread about to wait for its next request
/// answers the requests whose I/O ended meanwhile itself, instead of the
/// sweeper thread doing it and waking this one to send the replies.
pub fn run_ready_completions() -> usize {
    let mut ran = 0;
    for_each_driver(|driver| ran += driver.reap_ready());
    ran
}

/// Calls `visit` with each live driver of this thread, one at a time, the
/// list not borrowed meanwhile: callbacks the visit runs may submit, and so
/// register a driver.
fn for_each_driver(mut visit: impl FnMut(Arc<dyn Driver>)) {
    for index in 0.. {
        match DRIVERS.with(|drivers| drivers.borrow().get(index).map(Weak::upgrade)) {
            None => break,
            Some(Some(driver)) => visit(driver),
            Some(None) => {}
        }
    }
}

/// As [`run_ready_completions`], for a thread about to sleep in an event
/// loop of its own (a FUSE ring thread): returns a descriptor that becomes
/// readable when more of this thread's I/O completes, if it has one. Until
/// [`woke`], those completions are left to this thread, which runs them
/// when the descriptor wakes it (calling this again), so its replies go out
/// with no hand-off through the sweeper thread. While it is not asleep
/// there, the sweeper runs them as before.
pub fn prepare_to_wait() -> Option<RawFd> {
    let mut descriptor = None;
    for_each_driver(|driver| {
        // One descriptor to wait on: the first driver's; the others are
        // left to the sweeper.
        if descriptor.is_none() {
            descriptor = driver.begin_owner_wait();
        } else {
            driver.reap_ready();
        }
    });
    descriptor
}

/// The thread that called [`prepare_to_wait`] woke: runs what completed
/// meanwhile, and the sweeper runs its completions again until it next
/// sleeps. Call it before anything that may block.
pub fn woke() {
    for_each_driver(|driver| driver.end_owner_wait());
}

/// Runs `future` to completion on the calling thread. While it waits, it
/// runs this thread's rings' completions itself when it has any in flight.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let parker = Arc::new(ThreadWaker { woken: Mutex::new(false), signal: Condvar::new() });
    let waker = Waker::from(Arc::clone(&parker));
    let mut context = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(value) = future.as_mut().poll(&mut context) {
            return value;
        }
        let mut woken = parker.woken.lock();
        while !*woken {
            match busy_driver() {
                Some(driver) => {
                    drop(woken);
                    driver.drive();
                    woken = parker.woken.lock();
                }
                None => parker.signal.wait(&mut woken),
            }
        }
        debug_assert!(*woken);
        *woken = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver holding `ready` completions; running one registers a new
    /// driver, as a callback that submits on a fresh thread ring does.
    struct Ready {
        ready: Mutex<usize>,
    }

    impl Driver for Ready {
        fn has_work(&self) -> bool {
            *self.ready.lock() > 0
        }

        fn drive(&self) {
            self.reap_ready();
        }

        fn reap_ready(&self) -> usize {
            let ran = std::mem::take(&mut *self.ready.lock());
            if ran > 0 {
                let late: Arc<dyn Driver> = Arc::new(Ready { ready: Mutex::new(0) });
                register_thread_driver(Arc::downgrade(&late));
            }
            ran
        }
    }

    #[test]
    fn ready_completions_run_on_this_thread_without_waiting() {
        assert_eq!(run_ready_completions(), 0, "no driver on this thread yet");
        let driver: Arc<dyn Driver> = Arc::new(Ready { ready: Mutex::new(3) });
        register_thread_driver(Arc::downgrade(&driver));
        assert_eq!(run_ready_completions(), 3);
        assert_eq!(run_ready_completions(), 0, "nothing ready: nothing waited for");
        assert!(!driver.has_work());
    }

    #[test]
    fn completes_from_another_thread() {
        let (future, completer) = pair::<u32>();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            completer.complete(7);
        });
        assert_eq!(block_on(future), 7);
        assert_eq!(block_on(ready(3)), 3);
    }
}
