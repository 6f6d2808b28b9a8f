//! The responses a stream's serving task hands to its HTTP/2 body: a bounded queue with
//! one sender and one receiver. tokio's `mpsc` channel costs ~1 KB per stream (its
//! cache-padded state and a first block of 32 slots); this one is a lock, a queue that
//! grows with what is waiting, and two wakers.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures::Stream;

/// A queue holding at most `capacity` values.
pub fn channel<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            receiver: None,
            sender: None,
            sender_gone: false,
            receiver_gone: false,
        }),
        capacity: capacity.max(1),
    });
    (Sender(shared.clone()), Receiver(shared))
}

struct Shared<T> {
    state: Mutex<State<T>>,
    capacity: usize,
}

struct State<T> {
    queue: VecDeque<T>,
    /// Who waits for a value, and who for room.
    receiver: Option<Waker>,
    sender: Option<Waker>,
    sender_gone: bool,
    receiver_gone: bool,
}

impl<T> Shared<T> {
    fn state(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Why [`Sender::try_send`] could not queue its value (handed back).
#[derive(Debug, PartialEq, Eq)]
pub enum TrySendError<T> {
    Full(T),
    Closed(T),
}

pub struct Sender<T>(Arc<Shared<T>>);

impl<T> Sender<T> {
    /// Queues `value` if there is room.
    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        let mut s = self.0.state();
        if s.receiver_gone {
            return Err(TrySendError::Closed(value));
        }
        if s.queue.len() >= self.0.capacity {
            return Err(TrySendError::Full(value));
        }
        s.queue.push_back(value);
        let waker = s.receiver.take();
        drop(s);
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Queues `value` once there is room; hands it back if the receiver is gone. Dropping
    /// the future drops the value.
    pub async fn send(&self, value: T) -> Result<(), T> {
        let mut value = Some(value);
        std::future::poll_fn(|cx| {
            let v = value.take().expect("polled after completion");
            match self.try_send(v) {
                Ok(()) => Poll::Ready(Ok(())),
                Err(TrySendError::Closed(v)) => Poll::Ready(Err(v)),
                Err(TrySendError::Full(v)) => {
                    let mut s = self.0.state();
                    if s.queue.len() < self.0.capacity || s.receiver_gone {
                        // Room was made (or the receiver went) since: try again at once.
                        cx.waker().wake_by_ref();
                    } else {
                        s.sender = Some(cx.waker().clone());
                    }
                    value = Some(v);
                    Poll::Pending
                }
            }
        })
        .await
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut s = self.0.state();
            s.sender_gone = true;
            s.receiver.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

pub struct Receiver<T>(Arc<Shared<T>>);

impl<T> Receiver<T> {
    /// The next value, or `None` once the sender is gone and the queue empty.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut s = self.0.state();
        if let Some(value) = s.queue.pop_front() {
            let waker = s.sender.take();
            drop(s);
            if let Some(w) = waker {
                w.wake();
            }
            return Poll::Ready(Some(value));
        }
        if s.sender_gone {
            return Poll::Ready(None);
        }
        s.receiver = Some(cx.waker().clone());
        Poll::Pending
    }

    /// A value already queued.
    pub fn try_recv(&mut self) -> Option<T> {
        let mut s = self.0.state();
        let value = s.queue.pop_front();
        let waker = value.is_some().then(|| s.sender.take()).flatten();
        drop(s);
        if let Some(w) = waker {
            w.wake();
        }
        value
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let (waker, queued) = {
            let mut s = self.0.state();
            s.receiver_gone = true;
            (s.sender.take(), std::mem::take(&mut s.queue))
        };
        drop(queued); // outside the lock
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Stream for Receiver<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.get_mut().poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::time::Duration;

    #[tokio::test]
    async fn holds_at_most_its_capacity_and_a_waiting_send_goes_through_when_room_is_made() {
        let (tx, mut rx) = channel(2);
        tx.try_send(1).unwrap();
        tx.try_send(2).unwrap();
        assert_eq!(tx.try_send(3), Err(TrySendError::Full(3)));
        let waiting = tokio::spawn(async move {
            tx.send(3).await.unwrap();
            tx // dropped after the test reads everything
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "the send waits for room");
        assert_eq!(rx.next().await, Some(1));
        let tx = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the send was woken")
            .unwrap();
        assert_eq!(rx.try_recv(), Some(2));
        assert_eq!(rx.try_recv(), Some(3));
        assert_eq!(rx.try_recv(), None);
        drop(tx);
        assert_eq!(rx.next().await, None, "the sender is gone");
    }

    #[tokio::test]
    async fn a_gone_receiver_refuses_and_wakes_a_waiting_send() {
        let (tx, rx) = channel(1);
        tx.try_send(1).unwrap();
        let waiting = tokio::spawn(async move { tx.send(2).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(rx);
        let sent = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the send was woken")
            .unwrap();
        assert_eq!(sent, Err(2));
    }

    #[tokio::test]
    async fn a_receiver_waiting_is_woken_by_a_value_and_by_the_sender_going() {
        let (tx, mut rx) = channel::<u8>(1);
        let (first_tx, first) = tokio::sync::oneshot::channel();
        let reader = tokio::spawn(async move {
            let _ = first_tx.send(rx.next().await);
            rx.next().await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        tx.try_send(7).unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), first)
            .await
            .expect("the value woke the reader");
        assert_eq!(got.unwrap(), Some(7));
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(tx);
        let end = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("the sender's going woke the reader")
            .unwrap();
        assert_eq!(end, None);
    }
}
