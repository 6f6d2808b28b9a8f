//! A request's body: the DATA the connection received for its stream, handed to the
//! service as an `http_body::Body`. Flow control follows what the service consumes: the
//! connection reopens a window only for bytes the body has handed out.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures::task::AtomicWaker;
use http_body::Frame;
use prost::bytes::Bytes;
use tonic::Status;

/// What the connection and a stream's body share.
pub struct Inbox {
    state: Mutex<State>,
    /// The connection's task, woken when enough was consumed to reopen the window.
    connection: Arc<AtomicWaker>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Bytes>,
    /// `Some` once the request ended: cleanly, or with why not.
    end: Option<Result<(), Status>>,
    body: Option<Waker>,
    /// Bytes the body handed out and the connection has not yet counted.
    consumed: usize,
}

/// Consumed bytes past which the body wakes the connection to reopen the window.
const WAKE_AT: usize = 256 * 1024;

impl Inbox {
    pub fn new(connection: Arc<AtomicWaker>) -> Arc<Inbox> {
        Arc::new(Inbox {
            state: Mutex::new(State::default()),
            connection,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// DATA for the body.
    pub fn push(&self, data: Bytes) {
        let waker = {
            let mut s = self.state();
            s.queue.push_back(data);
            s.body.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The request ended (`Ok`) or broke.
    pub fn end(&self, end: Result<(), Status>) {
        let waker = {
            let mut s = self.state();
            if s.end.is_none() {
                s.end = Some(end);
            }
            s.body.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Bytes consumed since the last call.
    pub fn take_consumed(&self) -> usize {
        std::mem::take(&mut self.state().consumed)
    }
}

/// A request body fed by the connection.
pub struct RecvBody {
    inbox: Arc<Inbox>,
}

impl RecvBody {
    pub fn new(inbox: Arc<Inbox>) -> RecvBody {
        RecvBody { inbox }
    }
}

impl http_body::Body for RecvBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let mut s = self.inbox.state();
        if let Some(data) = s.queue.pop_front() {
            s.consumed += data.len();
            let wake = s.consumed >= WAKE_AT;
            if s.queue.is_empty() && s.queue.capacity() > 8 {
                s.queue = VecDeque::new();
            }
            drop(s);
            if wake {
                self.inbox.connection.wake();
            }
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match &s.end {
            Some(Ok(())) => Poll::Ready(None),
            Some(Err(status)) => {
                let status = status.clone();
                s.end = Some(Ok(()));
                Poll::Ready(Some(Err(status)))
            }
            None => {
                s.body = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
