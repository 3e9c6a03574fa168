//! Futures completed by the engine. A request's completion (on a device
//! completion thread, or inline) fills the slot and wakes whatever task polls
//! the future, so any executor can drive the asynchronous API; `block_on`
//! drives one future on the calling thread.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
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

/// Runs `future` to completion on the calling thread.
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
            parker.signal.wait(&mut woken);
        }
        *woken = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
