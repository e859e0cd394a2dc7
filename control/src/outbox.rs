//! An agent stream's outgoing queue: one sender (the node's session), one
//! receiver (the stream's response body).
//!
//! `tokio::sync::mpsc` does this job for many senders: its channel pads
//! its halves to cache lines and allocates a first block of 32 slots, about
//! 800 bytes for every stream whether it ever carries a command or not. A
//! server holds one per agent for the agent's life, and most of them stay
//! empty, so this queue is a mutex over a `VecDeque`, which allocates
//! nothing until a message waits, and a waker: about 100 bytes.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// A queue of at most `capacity` messages; see the module's note.
pub(crate) fn outbox<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        capacity,
        state: Mutex::new(State {
            items: VecDeque::new(),
            waker: None,
            sender_gone: false,
            receiver_gone: false,
        }),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Receiver { shared },
    )
}

#[derive(Debug)]
struct Shared<T> {
    capacity: usize,
    state: Mutex<State<T>>,
}

#[derive(Debug)]
struct State<T> {
    items: VecDeque<T>,
    waker: Option<Waker>,
    sender_gone: bool,
    receiver_gone: bool,
}

impl<T> Shared<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Why a message was not queued; it is handed back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused<T> {
    /// `capacity` messages wait already.
    Full(T),
    /// The receiver is gone: the stream has ended.
    Closed(T),
}

/// The sending half; dropping it ends the stream once what it queued has
/// been read.
#[derive(Debug)]
pub(crate) struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    /// Queues `item` unless the queue is full or its stream has ended.
    pub(crate) fn try_send(&self, item: T) -> Result<(), Refused<T>> {
        let mut state = self.shared.lock();
        if state.receiver_gone {
            return Err(Refused::Closed(item));
        }
        if state.items.len() >= self.shared.capacity {
            return Err(Refused::Full(item));
        }
        state.items.push_back(item);
        let waker = state.waker.take();
        drop(state);
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.sender_gone = true;
        let waker = state.waker.take();
        drop(state);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// The receiving half, a stream of what was queued.
#[derive(Debug)]
pub(crate) struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

impl<T> tokio_stream::Stream for Receiver<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut state = self.shared.lock();
        if let Some(item) = state.items.pop_front() {
            if state.items.is_empty() {
                // A burst (a start of many shards) grew it: let it go.
                state.items = VecDeque::new();
            }
            return Poll::Ready(Some(item));
        }
        if state.sender_gone {
            return Poll::Ready(None);
        }
        match &mut state.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.receiver_gone = true;
        // Nobody will read them.
        state.items.clear();
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;

    #[tokio::test]
    async fn messages_arrive_in_order_and_the_stream_ends_after_the_sender() {
        let (tx, mut rx) = outbox(4);
        tx.try_send(1).unwrap();
        tx.try_send(2).unwrap();
        drop(tx);
        assert_eq!(rx.next().await, Some(1));
        assert_eq!(rx.next().await, Some(2));
        assert_eq!(rx.next().await, None);
    }

    #[tokio::test]
    async fn a_waiting_receiver_wakes_for_a_message_and_for_the_end() {
        let (tx, mut rx) = outbox(4);
        let reader = tokio::spawn(async move {
            let first = rx.next().await;
            let end = rx.next().await;
            (first, end)
        });
        tokio::task::yield_now().await;
        tx.try_send("start").unwrap();
        tokio::task::yield_now().await;
        drop(tx);
        assert_eq!(reader.await.unwrap(), (Some("start"), None));
    }

    #[test]
    fn a_full_queue_and_an_ended_stream_refuse_and_hand_the_message_back() {
        let (tx, rx) = outbox(2);
        tx.try_send(1).unwrap();
        tx.try_send(2).unwrap();
        assert_eq!(tx.try_send(3), Err(Refused::Full(3)));
        drop(rx);
        assert_eq!(tx.try_send(4), Err(Refused::Closed(4)));
    }
}
