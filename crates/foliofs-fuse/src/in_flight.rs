//! Requests whose device I/O is in flight. A serving thread submits a direct
//! read or write through the engine's asynchronous API and goes back to the
//! kernel for the next request; the reply is sent by whichever thread
//! completes the I/O (a device completion thread, or the serving thread when
//! the engine finished inline). So a handful of threads keeps as many requests
//! in flight as the applications ask for, instead of one per thread.
//!
//! There is no executor thread: a task is polled by the thread that wakes it.
//! The state word makes that safe when a wake-up arrives while the task is
//! being polled (the completion can run inside `poll`, on the same thread, or
//! on another one): the poller notices and polls again instead of two
//! threads polling at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use parking_lot::Mutex;

/// Nobody polls the task; a wake-up polls it.
const IDLE: u8 = 0;
/// A thread is polling the task.
const POLLING: u8 = 1;
/// Woken while being polled: the poller polls again.
const WOKEN_WHILE_POLLING: u8 = 2;
/// The future completed; wake-ups are ignored.
const DONE: u8 = 3;

/// A task and its future in one allocation, the only one a spawn makes.
/// The future is `Unpin` (the request's engine future and its reply, not an
/// `async` block), so it is polled in place without pinning a box.
struct Task<F> {
    state: AtomicU8,
    /// None once the future completed.
    future: Mutex<Option<F>>,
}

/// Runs `future` to completion without a thread waiting for it: polled once
/// now, then again by whoever wakes it.
pub(crate) fn spawn<F>(future: F)
where
    F: Future<Output = ()> + Unpin + Send + 'static,
{
    Arc::new(Task { state: AtomicU8::new(IDLE), future: Mutex::new(Some(future)) }).run();
}

/// `future`, then `continuation` with its output, on the thread that
/// completed it: a request's I/O, then its reply.
pub(crate) fn then<F, C>(future: F, continuation: C) -> Then<F, C>
where
    F: Future + Unpin,
    C: FnOnce(F::Output) + Unpin,
{
    Then { future, continuation: Some(continuation) }
}

pub(crate) struct Then<F, C> {
    future: F,
    continuation: Option<C>,
}

impl<F, C> Future for Then<F, C>
where
    F: Future + Unpin,
    C: FnOnce(F::Output) + Unpin,
{
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        let output = std::task::ready!(Pin::new(&mut self.future).poll(context));
        if let Some(continuation) = self.continuation.take() {
            continuation(output);
        }
        Poll::Ready(())
    }
}

impl<F: Future<Output = ()> + Unpin + Send + 'static> Task<F> {
    fn run(self: Arc<Self>) {
        // Become the poller, or leave a note for the current one.
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            let next = match state {
                IDLE => POLLING,
                POLLING => WOKEN_WHILE_POLLING,
                _ => return,
            };
            match self.state.compare_exchange_weak(state, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) if next == POLLING => break,
                Ok(_) => return,
                Err(actual) => state = actual,
            }
        }
        let waker = Waker::from(Arc::clone(&self));
        let mut context = Context::from_waker(&waker);
        loop {
            let ready = {
                let mut slot = self.future.lock();
                match slot.as_mut().map(|future| Pin::new(future).poll(&mut context)) {
                    Some(Poll::Pending) => false,
                    Some(Poll::Ready(())) | None => {
                        // Dropped here, on the completing thread: the reply
                        // was sent inside the future.
                        *slot = None;
                        true
                    }
                }
            };
            if ready {
                self.state.store(DONE, Ordering::Release);
                return;
            }
            match self.state.compare_exchange(POLLING, IDLE, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                // WOKEN_WHILE_POLLING: the wake-up may have come after the
                // future looked; look again.
                Err(_) => self.state.store(POLLING, Ordering::Release),
            }
        }
    }
}

impl<F: Future<Output = ()> + Unpin + Send + 'static> Wake for Task<F> {
    fn wake(self: Arc<Self>) {
        self.run();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_task_completed_on_another_thread_runs_its_continuation_there() {
        let (future, completer) = foliofs::completion::pair::<u32>();
        let (sender, receiver) = mpsc::channel();
        spawn(then(future, move |value| {
            sender.send((value, std::thread::current().id())).unwrap();
        }));
        assert!(receiver.try_recv().is_err(), "nothing completed yet");
        let completer_thread = std::thread::spawn(move || {
            completer.complete(42);
            std::thread::current().id()
        });
        let completer_id = completer_thread.join().unwrap();
        let (value, continued_on) = receiver.recv().unwrap();
        assert_eq!(value, 42);
        assert_eq!(continued_on, completer_id);
    }

    #[test]
    fn a_task_already_complete_runs_inline() {
        let (sender, receiver) = mpsc::channel();
        spawn(then(foliofs::completion::ready(7u32), move |value| sender.send(value).unwrap()));
        assert_eq!(receiver.try_recv().unwrap(), 7);
    }

    #[test]
    fn wake_ups_racing_with_a_poll_are_not_lost() {
        for _ in 0..2_000 {
            let (future, completer) = foliofs::completion::pair::<u32>();
            let (sender, receiver) = mpsc::channel();
            let racer = std::thread::spawn(move || completer.complete(1));
            spawn(then(future, move |value| sender.send(value).unwrap()));
            racer.join().unwrap();
            assert_eq!(receiver.recv_timeout(std::time::Duration::from_secs(10)).unwrap(), 1);
        }
    }
}
