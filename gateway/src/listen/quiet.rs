//! A connection's task polls its connection under a waker of its own, so
//! that the connection waking itself while it is being polled costs
//! nothing.
//!
//! hyper wakes the task polling a body's channel whenever the body is read
//! (the sender is told there is room), and the task reading a request's
//! body, or an engine's answer on the hop's connection (`proxy::upstream`),
//! is the very task that sends it. tokio takes a wake of a task from
//! inside its own poll for a yield: it puts the task at the back of the
//! queue and wakes another worker thread to steal it. At 1,000 requests a
//! second that was two such wakes a request, each a sleeping thread woken
//! to find nothing, and a request moved between threads mid-way.
//!
//! Here a wake that comes while the connection is being polled is only
//! noted, and the connection is polled again at once if it then says
//! Pending; a wake that comes between polls wakes the task as before. A
//! connection that keeps waking itself (hyper yields after a run of work,
//! tokio's budget runs out) gets a real yield after [`REPOLLS`] polls.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// Polls in a row within one poll of the task before a real yield.
const REPOLLS: usize = 4;

const IDLE: u8 = 0;
const POLLING: u8 = 1;
const WOKEN: u8 = 2;

struct Shared {
    state: AtomicU8,
    task: AtomicWaker,
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // During a poll: noted, and that poll repeats. Otherwise: the task.
        if let Err(IDLE) =
            self.state
                .compare_exchange(POLLING, WOKEN, Ordering::AcqRel, Ordering::Acquire)
        {
            self.task.wake();
        }
    }
}

/// `F`, polled so that its wakes during its own poll are not the task's.
pub(crate) struct Quiet<F> {
    inner: Pin<Box<F>>,
    shared: Arc<Shared>,
    waker: Waker,
}

impl<F: Future> Quiet<F> {
    pub(crate) fn new(inner: F) -> Self {
        let shared = Arc::new(Shared {
            state: AtomicU8::new(IDLE),
            task: AtomicWaker::new(),
        });
        Quiet {
            inner: Box::pin(inner),
            waker: Waker::from(shared.clone()),
            shared,
        }
    }

    /// The future itself, for what must be done to it between polls.
    pub(crate) fn inner(&mut self) -> Pin<&mut F> {
        self.inner.as_mut()
    }
}

impl<F: Future> Future for Quiet<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.shared.task.register(cx.waker());
        for _ in 0..REPOLLS {
            this.shared.state.store(POLLING, Ordering::Release);
            let polled = this
                .inner
                .as_mut()
                .poll(&mut Context::from_waker(&this.waker));
            let woken = this.shared.state.swap(IDLE, Ordering::AcqRel) == WOKEN;
            if polled.is_ready() || !woken {
                return polled;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wakes itself on each of its first `n` polls, as hyper does when a
    /// body it sends is read.
    struct SelfWaking {
        n: usize,
        polls: usize,
    }

    impl Future for SelfWaking {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.polls > self.n {
                return Poll::Ready(self.polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    /// Counts the task's wakes.
    struct Count(std::sync::atomic::AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_wake_during_the_poll_repolls_at_once_and_a_run_of_them_yields() {
        let count = Arc::new(Count(Default::default()));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut once = std::pin::pin!(Quiet::new(SelfWaking { n: 1, polls: 0 }));
        assert_eq!(once.as_mut().poll(&mut cx), Poll::Ready(2));
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "no wake of the task");

        let mut many = std::pin::pin!(Quiet::new(SelfWaking { n: 10, polls: 0 }));
        assert!(many.as_mut().poll(&mut cx).is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "a yield after REPOLLS");
    }

    #[test]
    fn a_wake_between_polls_wakes_the_task() {
        let count = Arc::new(Count(Default::default()));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let (send, receive) = tokio::sync::oneshot::channel::<u8>();
        let mut quiet = std::pin::pin!(Quiet::new(receive));
        assert!(quiet.as_mut().poll(&mut cx).is_pending());
        send.send(7).unwrap();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(matches!(quiet.as_mut().poll(&mut cx), Poll::Ready(Ok(7))));
    }
}
