//! A one-way signal to every open connection (stop accepting requests;
//! the grace period is over) that costs a request nothing until it fires.
//!
//! A `watch` or `Notify` wait takes the channel's shared lock on every
//! poll while it waits, and every connection and request of the server
//! waited on the same two: measured at several microseconds a request on
//! two cores (docs/benchmarks.md). Here a connection registers its task
//! once, when it opens; a request only reads the flag, because the
//! connection's task (which polls the request and its answer's body) is
//! woken when the signal fires.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use futures_util::task::AtomicWaker;

/// Fires once; clones share it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Signal(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    fired: AtomicBool,
    /// The connections' tasks; a closed connection's entry is dead and
    /// pruned when the list would grow.
    waiting: Mutex<Vec<Weak<AtomicWaker>>>,
}

impl Signal {
    pub(crate) fn fired(&self) -> bool {
        self.0.fired.load(Ordering::Acquire)
    }

    /// Wakes every registered task; later registrations are woken at once.
    pub(crate) fn fire(&self) {
        self.0.fired.store(true, Ordering::Release);
        let waiting = std::mem::take(&mut *self.lock());
        for task in waiting.iter().filter_map(Weak::upgrade) {
            task.wake();
        }
    }

    /// `task` is woken when the signal fires, for as long as the caller
    /// holds it (a connection, for its life).
    pub(crate) fn wakes(&self, task: &Arc<AtomicWaker>) {
        if self.fired() {
            task.wake();
            return;
        }
        let mut waiting = self.lock();
        if waiting.len() == waiting.capacity() {
            waiting.retain(|t| t.strong_count() > 0);
            // Room for as many again: a prune that freed a few slots would
            // otherwise run again on the next connection, and at a full
            // listener on every one.
            let live = waiting.len();
            waiting.reserve(live);
        }
        waiting.push(Arc::downgrade(task));
        drop(waiting);
        // Fired between the check and the push: its list was taken
        // before this entry was in it.
        if self.fired() {
            task.wake();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<AtomicWaker>>> {
        // The list stays valid whatever a panicking holder did.
        self.0.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::task::Poll;

    use super::*;

    /// A task registered before or after the signal fires is woken, and
    /// one that has gone is not kept.
    #[tokio::test]
    async fn every_registered_task_sees_the_signal() {
        let signal = Signal::default();
        let before = Arc::new(AtomicWaker::new());
        signal.wakes(&before);
        let waiting = {
            let (signal, before) = (signal.clone(), before.clone());
            tokio::spawn(async move {
                poll_fn(|cx| {
                    before.register(cx.waker());
                    if signal.fired() {
                        Poll::Ready(())
                    } else {
                        Poll::Pending
                    }
                })
                .await
            })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        signal.fire();
        waiting.await.unwrap();

        let after = Arc::new(AtomicWaker::new());
        signal.wakes(&after);
        assert!(signal.fired());
    }

    #[test]
    fn closed_connections_are_pruned() {
        let signal = Signal::default();
        for _ in 0..1000 {
            signal.wakes(&Arc::new(AtomicWaker::new()));
        }
        let kept = Arc::new(AtomicWaker::new());
        signal.wakes(&kept);
        assert!(signal.lock().len() < 100, "{}", signal.lock().len());
    }
}
